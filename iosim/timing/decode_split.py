"""How many splits iosim's decode kernel runs: the count the time model predicts fastest.

The split count trades the grid's fill against its overheads. Too few splits leave SMs idle, or a long sequence's
blocks straggling at one block's pace (:func:`iosim.timing.flash_decode.fluid`); too many add blocks' fixed parts,
fp32 partial outputs and the combine kernel. Where the balance lies depends on the GPU's calibrated rates (a block's
pace at the blocks sharing its SM, ``decode.tile``; its fixed part, ``decode.fixed_dram``; the DRAM read rate), the
head dim, the cache's dtype and the lengths, and no rule of thumb follows all of them: the occupancy rule
(:func:`iosim.launch.decode.decode_split`, 80% of two blocks an SM) splits a 16-bit cache at d = 128 where one block
an SM already streams at the DRAM rate, and an fp8 cache too little where its warps' conversion chain needs three
blocks an SM (docs/kernels.md, "The split count from the time model").

So :func:`choose_splits` predicts the kernels' time at each candidate count (the model :func:`iosim.timing.predict`
runs, on the schedule's closed-form counts and DRAM bytes, as ``simulate`` has them, less the power limiter's
slowing over a run of calls, which does not rank the counts) and takes the fastest, the fewest splits among equals.
Candidates: 1 to 8, every one of them tried (the grid's waves make the time rise and fall there: 16 sequences of 2
fp8 kv heads at d = 256, 2 blocks an SM, are predicted 35.4 us at 4 splits, 36.1 at 6 and 30.5 at 8, measured 30.7
at 8 on an H200), then about 1.25x apart up to the cap (MAX_SPLITS, and a split a 16-key tile of the longest
sequence), where the search stops two candidates past the fastest so far. One prediction is one event walk of the
grid (compiled: :mod:`iosim.timing._fluid`), a choice 1-10 ms (up to ~0.2 s for grids of thousands of ragged
blocks).

:func:`kernel_split` is what the kernel launches, and what ``simulate("flash-decoding", ..., kernel="iosim-decode")``
counts: a forced count; else the time model's choice where the profile has the kernel's decode calibration for this
head dim and cache at every count of blocks an SM holds (the model's block pace is measured there, not
extrapolated); else the occupancy rule.
"""

from __future__ import annotations

from ..hardware.calibration import decode_keys
from ..hardware.gpu import Profile
from ..launch import decode as geo
from ..problem import ELEMENT_BYTES, AttentionProblem
from ..schedules import decode_layout, paged_decoding
from ..schedules.decode_layout import TILE_KEYS
from . import flash_decode
from .estimate import Workload
from .kernels import KernelDesc

FIRST = 8  # counts 1 .. FIRST are candidates
STEP = 1.25  # then candidates about this far apart
PATIENCE = 2  # candidates tried past the fastest so far before the search stops


def candidates(longest: int) -> list[int]:
    """Split counts to try for a longest sequence of ``longest`` keys: 1 to 8, then ~1.25x apart, as far as the
    cap (MAX_SPLITS, and a split per 16-key tile of the longest sequence)."""
    cap = min(geo.MAX_SPLITS, max(1, -(-longest // TILE_KEYS)))
    out = list(range(1, min(FIRST, cap) + 1))
    s = out[-1]
    while s < cap:
        s = min(cap, max(s + 1, round(s * STEP)))
        out.append(s)
    return out


def predicted_s(problem: AttentionProblem, profile: Profile, desc: KernelDesc, tiles, warm: bool = False) -> float:
    """The decode kernels' seconds on ``tiles`` as the time model has them at a run's first call, on the schedule's
    closed-form counts and DRAM bytes."""
    from . import L2_RESIDENT_SHARE, conditions  # the package, which imports this module's siblings first

    counts = paged_decoding.closed_form(problem, tiles)
    hbm = decode_layout.dram(problem, tiles, decode_layout.dirty_room(profile))
    c, work, _ = conditions(Workload("flash-decoding", "forward", problem, tiles, counts, hbm), profile, desc, warm)
    return sum(k.predicted_s for k in flash_decode.kernel_times(c, work, L2_RESIDENT_SHARE))


def choose_splits(problem: AttentionProblem, profile: Profile, desc: KernelDesc, kv_lens=None,
                  page_size: int | None = None, kv_dtype: str | None = None, warm: bool = False) -> int:
    """The split count with the least predicted time for this decode call (module docstring); ``warm``: the cache
    stays in L2 between calls where it fits (default False: each call finds it in DRAM, as a model's layers do)."""
    lens, _ = decode_layout.check_layout(problem, kv_lens, page_size)
    if max(lens, default=0) <= 0:  # no key in the batch: one split, which writes O = 0 and lse = -inf
        return 1
    best, best_s, since, seen = 1, float("inf"), 0, set()
    for s in candidates(max(lens, default=0)):
        tiles = decode_layout.make_tiles(problem, lens, page_size, s, kv_dtype)
        if tiles.splits in seen:  # even_split made it a count already tried
            continue
        seen.add(tiles.splits)
        t = predicted_s(problem, profile, desc, tiles, warm)
        if t < best_s:
            best, best_s, since = tiles.splits, t, 0
        elif s > FIRST:  # every count up to FIRST is tried: waves make the times there rise and fall
            since += 1
            if since >= PATIENCE:
                break
    return best


def calibrated(profile: Profile, head_dim: int, stripes: int, fp8: bool, per_sm: int = 1) -> bool:
    """Whether ``profile`` has the decode kernel's measured block pace (``calibration.decode.tile``) for this
    instantiation at every count of blocks an SM from 1 to ``per_sm`` (the most it holds): the time model's split
    choice stands on it, and a count it would extrapolate to is not one to choose by (the H100's profile measured
    one and two an SM before the choice existed; an fp8 cache's blocks fit three there)."""
    cal = getattr(profile.calibration, "decode", None) if profile.calibration is not None else None
    cache, key = decode_keys(head_dim, stripes, fp8)
    entry = cal.tile.get(cache, {}).get(key) if cal is not None else None
    return entry is not None and all(k in entry.value for k in range(1, per_sm + 1))


def kernel_split(problem: AttentionProblem, profile: Profile, desc: KernelDesc, slots: int, kv_lens=None,
                 page_size: int | None = None, kv_dtype: str | None = None,
                 splits: int | None = None) -> tuple[geo.SplitChoice, str]:
    """(the split iosim's decode kernel launches, how it was chosen: "forced", "time model" or "occupancy"):
    ``splits`` where given (cut to what the longest sequence can use); else :func:`choose_splits` where the
    profile is :func:`calibrated` for the call's instantiation at every count of blocks an SM holds; else :func:`iosim.launch.decode.decode_split` on
    ``slots`` (the blocks its fill counts: :func:`iosim.launch.decode.split_slots`). DecodeGeometryError for a
    forced count out of range."""
    lens, _ = decode_layout.check_layout(problem, kv_lens, page_size)
    blocks = problem.kv_heads * decode_layout.row_blocks(problem.group * problem.seq_len, problem.head_dim)
    if splits is not None:
        return geo.decode_split(lens, blocks, slots, splits), "forced"
    stripes = decode_layout.stripes(problem.group * problem.seq_len, problem.head_dim)
    kv_itemsize = ELEMENT_BYTES[kv_dtype] if kv_dtype else None
    per_sm = geo.decode_slots(profile, problem.head_dim, stripes, problem.elem_bytes,
                              desc.decode_registers(problem.head_dim, stripes), kv_itemsize,
                              problem.kv_heads) // profile.sm_count.value
    if calibrated(profile, problem.head_dim, stripes, kv_dtype is not None, per_sm):
        chosen = choose_splits(problem, profile, desc, lens, page_size, kv_dtype)
        return geo.decode_split(lens, blocks, slots, chosen), "time model"
    return geo.decode_split(lens, blocks, slots), "occupancy"
