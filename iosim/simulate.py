"""Run a schedule on a problem and a profile: tiles, the fit check, counts, DRAM bytes from the L2 model, time.

    >>> from iosim import AttentionProblem, simulate
    >>> r = simulate("naive", AttentionProblem(seq_len=4096, head_dim=128))
    >>> r.traffic["global"]["read_bytes"] + r.traffic["global"]["write_bytes"]
    138412032
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import replace
from typing import Literal

from . import timing
from .blocks import cdiv
from .counts import Counts
from .hardware.gpu import Profile, get_profile
from .l2 import L2ModelError, WalkOptions, simulate_l2, unsupported
from .l2.packed import packed_dram
from .launch import decode as launch_decode
from .problem import ELEMENT_BYTES, AttentionProblem, InputWarning
from .result import Result
from .schedules import (
    PASSES,
    ScheduleError,
    ScheduleOptions,
    Tiles,
    check_fit,
    decode_layout,
    get_schedule,
    resolve_tiles,
)
from .schedules.backward import group_sum
from .schedules.decode_layout import PagedDecodingTiles
from .schedules.machine import Counter
from .timing import decode_split
from .units import fmt_bytes

MAX_HEAD_DIM = 256  # FlashAttention-2/3 and iosim.gpu take head_dim <= 256, a multiple of 8 (16-byte rows)

Method = Literal["closed", "walk"]
Pass = Literal["forward", "backward", "both"]


def closed(schedule: str, problem: AttentionProblem, tiles: Tiles, pass_: str = "forward") -> Counts:
    """Counts of the whole problem from the schedule's closed form (of one pass: forward or backward)."""
    s = get_schedule(schedule, pass_)
    per_unit = s.closed_form(problem, tiles)
    for k in per_unit.kernels:  # closed forms also run on arrays (iosim.sweep); a scalar problem gets ints
        k.sram_peak = None if k.sram_peak is None else int(k.sram_peak)
    return _whole(s, problem, tiles, per_unit.kernels)


def _whole(s, problem: AttentionProblem, tiles: Tiles, per_unit: list) -> Counts:
    """One unit's kernels for every unit of the problem, and a backward pass's group reduction where it has one."""
    n = s.units(problem, tiles)
    reduce = group_sum(problem, s.unit_of(tiles)) if s.pass_ == "backward" else []
    return Counts([k.scaled(n) for k in per_unit] + reduce)


def walk(schedule: str, problem: AttentionProblem, tiles: Tiles, pass_: str = "forward") -> Counts:
    """Counts of the whole problem from interpreting the tile program of one head (every head is alike;
    one key/value head with its query heads for a schedule whose unit is the kv head)."""
    s = get_schedule(schedule, pass_)
    x = Counter(problem)
    s.program(x, problem, tiles)
    return _whole(s, problem, tiles, x.kernels)


def options_for(schedule: str, pass_: str, passes: list[str], options: ScheduleOptions) -> ScheduleOptions:
    """The options of one of ``passes``: all of them for a single pass; for both, those its record takes (flash2's
    gqa goes to the backward alone) and those neither takes, for :func:`resolve_tiles` to refuse."""
    if len(passes) == 1:
        return options
    takes = {ps: get_schedule(schedule, ps).options for ps in passes}
    return options.only([k for k in options.given() if k in takes[pass_] or not any(k in t for t in takes.values())])


def predict_time(result: Result) -> timing.TimeEstimate:
    """The time model (:mod:`iosim.timing`) of ``result``'s kernel on its DRAM bytes; the roofline where no kernel
    description applies."""
    hbm = list(zip(result.hbm_read, result.hbm_write, strict=True))
    work = timing.Workload(result.schedule, result.pass_, result.problem, result.tiles, result.counts, hbm)
    return timing.predict(work, result.profile, result.kernel, warm=result.warm, run=result.run)


def _checked_run(run: str | float) -> str | float:
    """``run`` as the time model takes it (:func:`iosim.timing.clock.check_run`), or ScheduleError."""
    try:
        return timing.clock.check_run(run)
    except timing.clock.RunError as exc:
        raise ScheduleError(str(exc)) from None


def exceeds_memory(problem: AttentionProblem, profile: Profile) -> str | None:
    """Why ``problem`` cannot sit in the memory of one GPU of ``profile`` (None if it fits or the size is unknown)."""
    cap = profile.dram.capacity.value
    if cap is None or problem.tensor_bytes <= cap:
        return None
    return (f"the problem's Q, K, V and O take {fmt_bytes(problem.tensor_bytes)}, more than the "
            f"{fmt_bytes(cap)} of GPU memory of {profile.display_name}")


def questionable(schedule: str, problem: AttentionProblem, profile: Profile, pass_: str, tiles: Tiles,
                 splits: int | None = None) -> list[str]:
    """What about this simulation is legal but probably not what was meant: one sentence each, with the fix.
    ``simulate`` issues each as an :class:`~iosim.problem.InputWarning`."""
    out, d = [], problem.head_dim
    if schedule == "flash3" and pass_ != "backward" and not profile.is_hopper():
        out.append(f"flash3's time model is FlashAttention-3's Hopper pipeline (wgmma, TMA: sm_90), and "
                   f"{profile.display_name} is not a Hopper GPU: its time is a what-if (the counts hold); use an "
                   "H100/H200 profile, or write `architecture: hopper` in a profile of your own")
    if problem.dtype == "fp8" and pass_ != "forward":
        out.append("dtype=fp8 with the backward pass: FlashAttention-3's fp8 is forward-only, no fp8 backward "
                   "kernel exists, so these backward counts (1-byte elements) are a what-if; use bf16 or fp16")
    effective = getattr(tiles, "splits", None)
    if splits is not None and isinstance(tiles, PagedDecodingTiles) and effective != splits:
        out.append(f"splits={splits}: the longest sequence's {max(tiles.kv_lens, default=0)} keys, cut in chunks of "
                   f"whole tiles of 16 keys evened out over it, make {effective} splits of {tiles.chunk} keys (none "
                   "is empty); give fewer splits")
    elif splits is not None and effective is not None and effective != splits:
        tc = cdiv(problem.kv_len, tiles.block_kv)
        out.append(f"splits={splits}: kv_len={problem.kv_len} makes {tc} K/V blocks of {tiles.block_kv} keys and "
                   f"no split may be empty, so {effective} splits of at most {cdiv(tc, effective)} K/V blocks are used; "
                   f"give at most {tc} splits, or a smaller block_kv")
    if d % 8 or d > MAX_HEAD_DIM:
        out.append(f"head_dim={d}: FlashAttention's kernels and iosim.gpu take a multiple of 8 up to "
                   f"{MAX_HEAD_DIM}; these counts are of the schedule as written, for a shape no real kernel runs")
    too_big = exceeds_memory(problem, profile)
    if too_big:
        out.append(f"{too_big}: no single GPU of this profile holds it (the counts hold; the time is that of a GPU "
                   "with enough memory, and the L2 model is not applied); use a smaller batch or fewer heads")
    return out


def with_l2(result: Result, *, strict: bool = False, l2_exact: bool = False, l2_progress=None) -> Result:
    """A copy of ``result`` whose ``hbm`` bytes (and time) come from the L2 model (:mod:`iosim.l2`).

    Where the model does not apply (the backward pass of a schedule other than flash2, a schedule without a known
    launch, a trace too long for the Python tracer) ``hbm`` stays equal to ``global`` and ``hbm_model`` says why
    (``strict``: raise instead). Each pass runs on its own tiles and launch: the backward's is iosim's kernel for
    ``gqa="grouped"``, FlashAttention-2's for ``"expand"`` (:func:`iosim.l2.model.own_variant`).
    ``l2_exact``: walk every access (no heads extrapolated, no steady windows skipped: :mod:`iosim.l2`);
    ``l2_progress``: a ``progress(done, total)`` callback for long runs (``iosim simulate``
    passes :class:`iosim.cli.progress.ProgressBar`)."""
    too_big = exceeds_memory(result.problem, result.profile)  # the model simulates a launch that fits
    s = get_schedule(result.schedule, result.pass_) if result.pass_ != "both" else None
    closed_dram = s.dram(result.problem, result.tiles, result.profile) if s and s.dram is not None and not too_big else None
    if closed_dram is not None:  # the schedule knows its DRAM bytes in closed form (iosim's decode and fp8 kernels)
        out = replace(result, hbm_read=[r for r, _ in closed_dram], hbm_write=[w for _, w in closed_dram],
                      hbm_model=s.dram_model)
        return replace(out, time=predict_time(out))
    if not too_big and result.pass_ == "forward" and getattr(result.tiles, "seqlens", ()):
        packed = packed_dram(result.problem, result.tiles, result.profile,
                             WalkOptions(exact=l2_exact, progress=l2_progress))
        out = replace(result, hbm_read=[packed.read_bytes], hbm_write=[packed.write_bytes], hbm_model=packed.text)
        return replace(out, time=predict_time(out))
    reason = too_big or unsupported(result.schedule, result.pass_, result.problem, result.tiles, result.counts)
    if reason:
        if strict:
            raise L2ModelError(reason)
        return replace(result, hbm_model=f"none: {reason}; hbm = global (two-level view)")
    passes = ["forward", "backward"] if result.pass_ == "both" else [result.pass_]
    walk = WalkOptions(exact=l2_exact, progress=l2_progress)
    runs = [simulate_l2(result.schedule, result.problem, result.tiles_by_pass.get(ps, result.tiles), result.profile,
                        pass_=ps, walk=walk) for ps in passes]
    l2 = runs[0] if len(runs) == 1 else replace(
        runs[0], kernels=[k for r in runs for k in r.kernels], seconds=sum(r.seconds for r in runs),
        launch=replace(runs[0].launch, kernels=tuple(k for r in runs for k in r.launch.kernels),
                       note="; ".join(r.launch.note for r in runs)))
    if len(l2.kernels) != len(result.counts.kernels):
        raise L2ModelError(f"{result.schedule}: the L2 model saw {len(l2.kernels)} kernels, the counts "
                           f"{len(result.counts.kernels)}")
    hbm_read = [k.dram_read for k in l2.kernels]
    hbm_write = [k.dram_write for k in l2.kernels]
    text = (f"l2-lru: {l2.describe()}; L2 flushed before each kernel, dirty lines left at the end not written "
            "(Nsight Compute's conditions); iosim.l2")
    out = replace(result, hbm_read=hbm_read, hbm_write=hbm_write, hbm_model=text, l2=l2)
    return replace(out, time=predict_time(out))


def as_problem(problem: AttentionProblem | Mapping) -> AttentionProblem:
    """``problem`` as is, or a dict of its fields validated (ProblemError); TypeError for anything else."""
    if isinstance(problem, AttentionProblem):
        return problem
    if isinstance(problem, Mapping):
        return AttentionProblem(**problem)
    raise TypeError(f"problem: expected an AttentionProblem (or a dict of its fields), got "
                    f"{type(problem).__name__} {problem!r:.80}; e.g. AttentionProblem(seq_len=4096)")


def decode_kernel_options(problem: AttentionProblem, profile: Profile, desc, options: ScheduleOptions) -> ScheduleOptions:
    """flash-decoding's options as a decode-family kernel (iosim-decode) runs it: its own tiling, and the splits it
    launches on ``profile`` (:func:`iosim.timing.decode_split.kernel_split`: ``options.splits`` where given, cut to
    what the longest sequence can use; else the time model's choice, or the occupancy rule where the profile lacks
    the kernel's calibration)."""
    decode_layout.check_problem(problem)
    lens, _ = decode_layout.check_layout(problem, options.kv_lens, options.page_size)
    rows = problem.group * problem.seq_len
    stripes = decode_layout.stripes(rows, problem.head_dim)
    registers = desc.decode_registers(problem.head_dim, stripes)
    kv_dtype = decode_layout.check_kv_dtype(options.kv_dtype)
    kv_itemsize = ELEMENT_BYTES[kv_dtype] if kv_dtype else None
    slots = launch_decode.decode_slots(profile, problem.head_dim, stripes, problem.elem_bytes, registers, kv_itemsize,
                                       problem.kv_heads)
    slots = launch_decode.split_slots(profile.sm_count.value, slots // profile.sm_count.value)
    try:
        split, _ = decode_split.kernel_split(problem, profile, desc, slots, lens, options.page_size, kv_dtype,
                                             options.splits)
    except launch_decode.DecodeGeometryError as exc:
        raise ScheduleError(str(exc)) from None
    return replace(options, splits=split.splits, tiling="iosim")


def simulate(schedule: str, problem: AttentionProblem | Mapping, profile: str | Profile | None = None, *,
             block_q: int | None = None, block_kv: int | None = None, method: Method = "closed",
             pass_: Pass = "forward", l2: bool = True, l2_exact: bool = False, l2_progress=None,
             kernel: str | None = None, warm: bool = False, splits: int | None = None, density: float | None = None,
             mask=None, seed: int | None = None, gqa: Literal["expand", "grouped"] | None = None, kv_lens=None,
             page_size: int | None = None, kv_dtype: str | None = None, window: tuple | None = None,
             seqlens=None, incoherent: bool | None = None, run: str | float = "record") -> Result:
    """Count and time ``schedule`` on ``problem`` for ``profile`` (default h100-sxm5-80gb).

    ``pass_``: "forward" (default), "backward" (the backward pass, which consumes the forward's O and
    statistics) or "both" (forward kernels, then backward kernels). Each pass uses its own default tiles
    unless ``block_q``/``block_kv`` are given. The schedules' own options (None = not given; a schedule given
    one it does not take raises ScheduleError; a misspelled one is Python's TypeError): ``splits``
    (flash-decoding), ``kv_lens`` (keys of each sequence, a list or 1-d array, each 0 to ``kv_len``: a ragged
    batch), ``page_size`` (tokens per page of a paged cache, a multiple of 16; None: contiguous) and ``kv_dtype``
    ("fp8": the cache in e4m3, a scale per kv head), all three of flash-decoding with ``kernel="iosim-decode"``,
    whose tile program is iosim's decode kernel's (docs/serving.md), ``density``, ``mask`` (a file or an array),
    ``seed`` (block-sparse), ``gqa`` (flash2's backward pass: "expand", the default, as FlashAttention-2; "grouped",
    as iosim's kernel: docs/schedules/backward.md), ``window`` (flash2's and flash3's forward: a sliding window (left, right), None for no
    bound on a side) and ``seqlens`` (flash2's forward: packed sequences, one length or a (queries, keys) pair each,
    adding up to a batch-1 problem's seq_len and kv_len: ``hbm`` from the L2 model walking the varlen grid as one
    program (:mod:`iosim.l2.packed`), the time from the fa2 model on the varlen grid, :func:`iosim.timing.fa2.packed_order`),
    ``incoherent`` (``"fp8-quantize"``, the kernels that write iosim's
    fp8 layout, docs/schedules/flash3.md: Q and K rotated by a Hadamard transform first). ``l2`` (default True, as the CLI's ``--l2``): ``hbm`` from the L2 model
    (:mod:`iosim.l2`) where it applies (the forward pass of naive, flash1, flash2, flash3; flash2's backward); ``l2=False``
    (``--no-l2``): ``hbm`` = ``global``, the papers' two-level view, without running the model (fast for huge
    sweeps); ``hbm_model`` says which view a result is. Legal but questionable input (:func:`questionable`:
    flash3 off Hopper, fp8 backward, splits cut to the K/V blocks, head_dim off 8..256, a problem larger than the
    GPU's memory, to which the L2 model is not applied) runs and issues an :class:`~iosim.problem.InputWarning`
    that says why and what to change. ``l2_exact`` and ``l2_progress`` go to :func:`with_l2`. ``kernel``: whose launch and pipeline the time
    model assumes (a built-in name of :mod:`iosim.timing.kernels` or a YAML file; default: the schedule's own
    kernel, e.g. iosim-flash2); its tiles are used where ``block_q``/``block_kv`` are not given. ``warm``: time of
    back-to-back calls on the same inputs (tensors that fit in L2 stay there: the time prices no DRAM bytes,
    ``Result.time_hbm``, while ``hbm`` stays the cold-L2 bytes). ``run``: which call of a run of back-to-back calls
    the time means under the power limiter (:mod:`iosim.timing.clock`: "record", the default, "single", "steady"
    or seconds). ``problem`` may also be a dict of
    AttentionProblem's fields (validated: ProblemError); anything else is a TypeError."""
    problem = as_problem(problem)
    run = _checked_run(run)
    if pass_ not in PASSES:
        raise ScheduleError(f"pass={pass_!r}: expected one of {', '.join(PASSES)}")
    prof = get_profile(profile)
    desc = timing.kernel_for(schedule, kernel, pass_) if kernel is not None else None
    if desc is not None and desc.tiles and block_q is None and block_kv is None:
        tc = desc.tiles_for(problem.head_dim, problem.dtype)
        block_q, block_kv = tc.block_q, tc.block_kv
    if (desc is not None and desc.pass_ == "backward" and gqa is None and problem.heads != problem.kv_heads
            and "gqa" in get_schedule(schedule, "backward").options):
        gqa = desc.gqa  # the kernel's design of grouped-query heads, counted as it runs
    options = ScheduleOptions(splits=splits, density=density, mask=mask, seed=seed, gqa=gqa, kv_lens=kv_lens, window=window,
                              page_size=page_size, kv_dtype=kv_dtype, seqlens=seqlens, incoherent=incoherent)
    if desc is not None and desc.family == "decode":
        options = decode_kernel_options(problem, prof, desc, options)
    if desc is not None and schedule == "flash3" and desc.fp8_layout == "iosim" and problem.dtype == "fp8":
        options = replace(options, tiling="iosim")  # the kernel's fp8 layout (iosim.schedules.flash3_fp8)
    if (window is not None or seqlens is not None) and pass_ != "forward":
        raise ScheduleError(f"window, seqlens with pass={pass_!r}: windows and packed sequences are counted "
                            "for the forward pass only (iosim's kernels have no such backward); use pass_='forward'")
    if method not in ("closed", "walk"):
        raise ScheduleError(f"method={method!r}: expected 'closed' or 'walk'")
    if not isinstance(l2, bool):  # l2="no" is a true value: never read a string as a switch
        raise ScheduleError(f"l2={l2!r}: expected True or False (a bool, not a string)")
    passes = ["forward", "backward"] if pass_ == "both" else [pass_]
    tiles_by_pass, kernels = {}, []
    for ps in passes:
        tiles = resolve_tiles(schedule, problem, prof, block_q, block_kv, pass_=ps,
                              options=options_for(schedule, ps, passes, options))
        check_fit(get_schedule(schedule, ps), problem, tiles, prof)
        tiles_by_pass[ps] = tiles
        kernels += (closed if method == "closed" else walk)(schedule, problem, tiles, ps).kernels
    for msg in questionable(schedule, problem, prof, pass_, tiles_by_pass[passes[0]], splits):
        warnings.warn(msg, InputWarning, stacklevel=2)
    counts = Counts(kernels)
    hbm_read = [k.global_read_bytes for k in counts.kernels]  # no L2 model: hbm = global
    hbm_write = [k.global_write_bytes for k in counts.kernels]
    result = Result(schedule, prof, problem, tiles_by_pass[passes[0]], counts, hbm_read, hbm_write, None, method,
                    int(prof.require("smem.per_block")), pass_, tiles_by_pass, kernel=desc, warm=warm,
                    run=run)
    result = replace(result, time=predict_time(result))
    return with_l2(result, l2_exact=l2_exact, l2_progress=l2_progress) if l2 else result
