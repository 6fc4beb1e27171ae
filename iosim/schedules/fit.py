"""The tile-fit rule every schedule shares: a thread block's tiles must fit one block's shared memory, and their
register-resident part (fp32 accumulator, scores, statistics) the register file of one SM.

A schedule's default tiles are chosen with it, and explicit tiles are checked by it, so the two never disagree.
"""

from __future__ import annotations

from ..problem import AttentionProblem
from .base import Schedule, ScheduleError, Tiles


def check_fit(schedule: Schedule, problem: AttentionProblem, tiles: Tiles, profile) -> int | None:
    """Raise ScheduleError, saying how much is needed and how much there is, if ``tiles`` do not fit ``profile``
    (one block may use all of an SM's registers). Returns the whole on-chip working set in bytes (None: untiled)."""
    need = schedule.on_chip(problem, tiles)
    if need is None:
        return None
    smem, regs = need
    where = (f"{schedule.label}: tiles block_q={tiles.block_q}, block_kv={tiles.block_kv} at head_dim="
             f"{problem.head_dim}, {problem.dtype}")
    have_smem = int(profile.require("smem.per_block"))
    if smem > have_smem:
        raise ScheduleError(f"{where} need {smem:,} B of shared memory per thread block, but {profile.name} has "
                            f"{have_smem:,} B; use smaller tiles")
    have_regs = profile.registers.per_sm.value
    if have_regs is not None and regs > have_regs:
        raise ScheduleError(f"{where} need {regs:,} B of registers per thread block (fp32 accumulator, scores "
                            f"and statistics), but {profile.name} has {have_regs:,} B per SM; use smaller tiles")
    return smem + regs


def fits(schedule: Schedule, problem: AttentionProblem, tiles: Tiles, profile) -> bool:
    try:
        check_fit(schedule, problem, tiles, profile)
    except ScheduleError:
        return False
    return True


def shrink_to_fit(schedule: Schedule, problem: AttentionProblem, block_q: int, block_kv: int, profile) -> Tiles:
    """A kernel's preferred tiles, halved until they fit the profile: Bc first while it is at least half of
    Br, then Br, down to 16 (what FlashAttention's launchers do across GPUs with less shared memory)."""
    Br, Bc = block_q, block_kv
    while not fits(schedule, problem, Tiles(Br, Bc), profile) and (Bc > 16 or Br > 16):
        if Bc > 16 and Bc >= Br // 2:
            Bc //= 2
        else:
            Br //= 2
    return Tiles(Br, Bc)


def largest_fitting(schedule: Schedule, problem: AttentionProblem, tiles_for, profile) -> Tiles:
    """``tiles_for(M)`` with the largest M (SRAM elements, at most the shared memory per block) whose tiles fit:
    FlashAttention-1's line-2 rule. Raises, with what is needed, when not even M = 1 fits."""
    lo, hi = 1, int(profile.require("smem.per_block")) // problem.elem_bytes
    check_fit(schedule, problem, tiles_for(lo), profile)
    while lo < hi:  # the working set grows with M
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(schedule, problem, tiles_for(mid), profile) else (lo, mid - 1)
    return tiles_for(lo)
