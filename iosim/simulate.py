"""Run a schedule on a problem and a profile: tiles, the fit check, counts, DRAM bytes from the L2 model, time.

    >>> from iosim import AttentionProblem, simulate
    >>> r = simulate("naive", AttentionProblem(seq_len=4096, head_dim=128))
    >>> r.traffic["global"]["read_bytes"] + r.traffic["global"]["write_bytes"]
    138412032
"""

from __future__ import annotations

from dataclasses import replace
from typing import Literal

from . import hopper, roofline
from .counts import Counts
from .l2 import L2ModelError, simulate_l2, unsupported
from .machine import Counter
from .problem import AttentionProblem
from .profile import Profile, get_profile
from .result import Result
from .roofline import TimeEstimate
from .schedules import PASSES, ScheduleError, Tiles, check_fit, get_schedule, resolve_tiles
from .schedules.backward import group_sum

Method = Literal["closed", "walk"]
Pass = Literal["forward", "backward", "both"]


def closed(schedule: str, problem: AttentionProblem, tiles: Tiles, pass_: str = "forward") -> Counts:
    """Counts of the whole problem from the schedule's closed form (of one pass: forward or backward)."""
    s = get_schedule(schedule, pass_)
    per_unit = s.closed_form(problem, tiles)
    for k in per_unit.kernels:  # closed forms also run on arrays (iosim.sweep); a scalar problem gets ints
        k.sram_peak = None if k.sram_peak is None else int(k.sram_peak)
    n = s.units(problem)
    return Counts([k.scaled(n) for k in per_unit.kernels] + (group_sum(problem) if pass_ == "backward" else []))


def walk(schedule: str, problem: AttentionProblem, tiles: Tiles, pass_: str = "forward") -> Counts:
    """Counts of the whole problem from interpreting the tile program of one head (every head is alike;
    one key/value head with its query heads for a schedule whose unit is the kv head)."""
    s = get_schedule(schedule, pass_)
    x = Counter(problem)
    s.program(x, problem, tiles)
    n = s.units(problem)
    return Counts([k.scaled(n) for k in x.kernels] + (group_sum(problem) if pass_ == "backward" else []))


def predict_time(schedule: str, pass_: str, counts: Counts, hbm_bytes: list[int], problem: AttentionProblem,
                 tiles: Tiles, profile: Profile) -> TimeEstimate:
    """The time model the schedule's record names (flash3's forward: the Hopper pipeline), else the roofline."""
    if pass_ == "forward" and get_schedule(schedule).time_model == "hopper":
        return hopper.predict(counts, problem, tiles, profile)
    return roofline.predict(counts, hbm_bytes, problem.dtype, profile)


def with_l2(result: Result, *, strict: bool = False) -> Result:
    """A copy of ``result`` whose ``hbm`` bytes (and time) come from the L2 model (:mod:`iosim.l2`).

    Where the model does not apply (backward pass, a schedule without a known launch, a trace too long for the
    Python tracer) ``hbm`` stays equal to ``global`` and ``hbm_model`` says why (``strict``: raise instead)."""
    reason = unsupported(result.schedule, result.pass_, result.problem, result.tiles, result.counts)
    if reason:
        if strict:
            raise L2ModelError(reason)
        return replace(result, hbm_model=f"none: {reason}; hbm = global (two-level view)")
    l2 = simulate_l2(result.schedule, result.problem, result.tiles, result.profile)
    if len(l2.kernels) != len(result.counts.kernels):
        raise L2ModelError(f"{result.schedule}: the L2 model saw {len(l2.kernels)} kernels, the counts "
                           f"{len(result.counts.kernels)}")
    hbm_read = [k.dram_read for k in l2.kernels]
    hbm_write = [k.dram_write for k in l2.kernels]
    hbm = [r + w for r, w in zip(hbm_read, hbm_write, strict=True)]
    time = roofline.predict(result.counts, hbm, result.problem.dtype, result.profile)
    text = (f"l2-lru: {l2.describe()}; L2 flushed before each kernel, dirty lines left at the end not written "
            "(Nsight Compute's conditions); iosim.l2")
    return replace(result, hbm_read=hbm_read, hbm_write=hbm_write, time=time, hbm_model=text, l2=l2)


def simulate(schedule: str, problem: AttentionProblem, profile: str | Profile | None = None, *,
             block_q: int | None = None, block_kv: int | None = None, method: Method = "closed",
             pass_: Pass = "forward", l2: bool = False, **options) -> Result:
    """Count and time ``schedule`` on ``problem`` for ``profile`` (default h100-sxm5-80gb).

    ``pass_``: "forward" (default), "backward" (the backward pass, which consumes the forward's O and
    statistics) or "both" (forward kernels, then backward kernels). Each pass uses its own default tiles
    unless ``block_q``/``block_kv`` are given. ``options``: ``splits`` (flash-decoding), ``density``, ``mask``
    (a file or an array), ``seed`` (block-sparse) go to the schedules that take them. ``l2=True`` takes ``hbm``
    from the L2 model (:mod:`iosim.l2`; the CLI's default) where it applies; ``hbm_model`` says which view a
    result is."""
    prof = get_profile(profile)
    if pass_ not in PASSES:
        raise ScheduleError(f"pass={pass_!r}: expected one of {', '.join(PASSES)}")
    if method not in ("closed", "walk"):
        raise ScheduleError(f"method={method!r}: expected 'closed' or 'walk'")
    if not isinstance(l2, bool):
        raise ScheduleError(f"l2={l2!r}: expected True or False")
    passes = ["forward", "backward"] if pass_ == "both" else [pass_]
    tiles_by_pass, kernels = {}, []
    for ps in passes:
        tiles = resolve_tiles(schedule, problem, prof, block_q, block_kv, pass_=ps, **options)
        check_fit(get_schedule(schedule, ps), problem, tiles, prof)
        tiles_by_pass[ps] = tiles
        kernels += (closed if method == "closed" else walk)(schedule, problem, tiles, ps).kernels
    counts = Counts(kernels)
    hbm_read = [k.global_read_bytes for k in counts.kernels]  # no L2 model: hbm = global
    hbm_write = [k.global_write_bytes for k in counts.kernels]
    hbm = [r + w for r, w in zip(hbm_read, hbm_write, strict=True)]
    time = predict_time(schedule, pass_, counts, hbm, problem, tiles_by_pass[passes[0]], prof)
    result = Result(schedule, prof, problem, tiles_by_pass[passes[0]], counts, hbm_read, hbm_write, time, method,
                    int(prof.require("smem.per_block")), pass_, tiles_by_pass)
    return with_l2(result) if l2 else result
