"""Which tiles to run: every legal (Br, Bc) of a kernel ranked by the time model, with the reason each one loses.

``tune("flash2", problem, "h100-sxm5-80gb")`` simulates the schedule at each tile its kernel is compiled with (the
description's default and ``others``: for ``iosim-flash2``, :data:`iosim.launch.FLASH_TILES`) and returns them
fastest first. A schedule whose kernel has no tile list (flash1, block-sparse, a description with one tile) is
ranked over the powers of two from 16 to 256 that fit the profile's shared memory. A tile that cannot run is kept
with the reason (it does not fit SRAM, the kernel has no such instantiation); a legal one that loses says what the
model charges it for against the winner: fewer blocks resident per SM, a worse last wave, more bytes, slower steps.
``iosim tune`` prints the same ranking. benchmarks/bench_tune.py measures where the first choice lands on a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .launch import resident_blocks
from .problem import AttentionProblem
from .schedules import ScheduleError
from .simulate import Result, simulate
from .timing import fa2
from .timing.kernels import KernelDesc

POWERS = (16, 32, 64, 128, 256)
# a loss smaller than this share of the winner's time is not named as a reason (the model's own resolution)
NOTABLE = 0.01


@dataclass(frozen=True)
class TileChoice:
    """One candidate: its tiles, predicted seconds (None where it cannot run) and why it is not first."""

    block_q: int
    block_kv: int
    predicted_s: float | None
    reason: str = ""
    facts: dict = field(default_factory=dict, compare=False)  # blocks_per_sm, utilization, bytes, step_s

    @property
    def legal(self) -> bool:
        return self.predicted_s is not None


def tune(schedule: str, problem: AttentionProblem, profile=None, *, kernel: str | None = None) -> list[TileChoice]:
    """The legal tiles of ``schedule`` (as ``kernel`` runs it) on ``problem``, fastest first, then the illegal."""
    runs: list[tuple[int, int, Result | str]] = []
    for bq, bkv in candidates(schedule, problem, profile, kernel):
        try:
            runs.append((bq, bkv, simulate(schedule, problem, profile, block_q=bq, block_kv=bkv, kernel=kernel)))
        except ScheduleError as exc:
            runs.append((bq, bkv, str(exc)))
    legal = sorted((r for r in runs if isinstance(r[2], Result)), key=lambda r: r[2].time.predicted_s)
    if not legal:
        raise ScheduleError(f"{schedule}: no tile runs on this problem and profile: "
                            + "; ".join(f"{b}x{c}: {r}" for b, c, r in runs))
    best = _facts(legal[0][2])
    out = [TileChoice(b, c, r.time.predicted_s, _reason(_facts(r), best, r, legal[0][2]), _facts(r))
           for b, c, r in legal]
    return out + [TileChoice(b, c, None, r) for b, c, r in runs if isinstance(r, str)]


def candidates(schedule: str, problem: AttentionProblem, profile=None,
               kernel: str | None = None) -> list[tuple[int, int]]:
    """The kernel's compiled tiles at the problem's head dim, or the powers of two up to 256 (and the problem)."""
    probe = simulate(schedule, problem, profile, kernel=kernel, l2=False)
    desc = probe.kernel if isinstance(probe.kernel, KernelDesc) else None
    if probe.tiles.block_q is None:
        raise ScheduleError(f"{schedule} is not tiled: there is nothing to tune")
    if desc is not None and desc.tiles and problem.head_dim <= max(desc.tiles):
        tc = desc.tiles_for(problem.head_dim)  # a kernel runs the tiles it is compiled with, no others
        return [(tc.block_q, tc.block_kv), *((o.block_q, o.block_kv) for o in tc.others)]
    rows = [b for b in POWERS if b < 2 * problem.seq_len] or [POWERS[0]]
    cols = [b for b in POWERS if b < 2 * problem.kv_len] or [POWERS[0]]
    return [(bq, bkv) for bq in rows for bkv in cols]


def _facts(r: Result) -> dict:
    k = r.time.kernels[0] if r.time.kernels else None
    facts = {"utilization": k.utilization if k else None, "global_bytes": r.counts.global_bytes,
             "dram_bytes": sum(r.hbm_read) + sum(r.hbm_write), "bound": r.time.bound,
             "step_s": (k.resources or {}).get("step") if k else None, "blocks_per_sm": None, "limit": None}
    desc = r.kernel if isinstance(r.kernel, KernelDesc) else None
    if desc is not None and desc.family == "fa2" and desc.pass_ == "forward":
        tc = fa2.tiles_of(desc, r.problem.head_dim, r.tiles.block_q, r.tiles.block_kv)
        total, limits = resident_blocks(r.profile, desc.warps * 32, fa2.smem_bytes(tc, r.problem.head_dim,
                                                                                   r.problem.elem_bytes),
                                        tc.registers or 255)
        facts["blocks_per_sm"] = total // int(r.profile.require("sm_count"))
        facts["limit"] = min(("registers", "smem", "threads"), key=lambda x: limits[x])
        facts["registers"] = tc.registers
    return facts


def _reason(f: dict, best: dict, r: Result, winner: Result) -> str:
    """What the model charges this candidate for against the winner, largest first (empty for the winner)."""
    if r is winner:
        return ""
    why: list[tuple[float, str]] = []
    if f["blocks_per_sm"] and best["blocks_per_sm"] and f["blocks_per_sm"] < best["blocks_per_sm"]:
        cause = f"registers: {f['registers']} a thread" if f["limit"] == "registers" else f["limit"]
        why.append((best["blocks_per_sm"] / f["blocks_per_sm"] - 1,
                    f"occupancy: {f['blocks_per_sm']} blocks per SM against {best['blocks_per_sm']} ({cause})"))
    if f["utilization"] and best["utilization"] and f["utilization"] < best["utilization"] * (1 - NOTABLE):
        why.append((best["utilization"] / f["utilization"] - 1,
                    f"waves: SMs busy {f['utilization']:.0%} of the time against {best['utilization']:.0%}"))
    for key, name in (("dram_bytes", "DRAM"), ("global_bytes", "L2")):
        if best[key] and f[key] > best[key] * (1 + NOTABLE) and (key == "global_bytes") == (f["bound"] != "dram"):
            why.append((f[key] / best[key] - 1, f"bytes: {f[key] / 1e9:.3g} GB {name} traffic against "
                                                 f"{best[key] / 1e9:.3g} GB"))
    if f["step_s"] and best["step_s"]:
        per = f["step_s"] / (r.tiles.block_q * r.tiles.block_kv)
        per_best = best["step_s"] / (winner.tiles.block_q * winner.tiles.block_kv)
        if per > per_best * (1 + NOTABLE):
            why.append((per / per_best - 1, f"steps: {per * 1e12:.3g} ps a score against {per_best * 1e12:.3g} ps"))
    loss = r.time.predicted_s / winner.time.predicted_s - 1
    if not why:
        return f"{loss:+.1%}: within the model's resolution of the winner"
    return f"{loss:+.1%}: " + "; ".join(text for _, text in sorted(why, reverse=True)[:2])
