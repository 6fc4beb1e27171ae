"""Attention on a CPU, the counterpart of :func:`iosim.simulate`: bytes at the cache boundaries, FLOPs and time, for
the naive and flash2 schedules (:func:`simulate_cpu`), and the result's JSON contract.

Boundaries, named by the level data comes from (per CPU, summed over cores):

| name | boundary | what moves there |
|---|---|---|
| ``dram`` | L3 ↔ DRAM | what misses the last-level cache |
| ``l3`` | L2 ↔ L3 | what misses a core's L2 |
| ``l2`` | L1d ↔ L2 | what misses a core's L1d |

The model is a capacity model, stated once: a tensor re-read within a working set that fits a level's capacity
(an L2 per core, an L3 instance shared by the cores working on one head) is served by that level; otherwise it
crosses the boundary below it again. BLAS GEMMs are counted as reading each operand and writing the result once
(their internal panel re-reads are not modeled). What is counted, per schedule, is what the code in
:mod:`iosim.cpu` executes: NumPy's naive passes over S, the tiled kernel's visits and passes over its S tile.

Time: :mod:`iosim.timing.cpu`, from the rates ``iosim profiles detect`` measures, beside the ideal roofline.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from .hardware.cpu import CpuProfile
from .problem import AttentionProblem
from .schedules import Tiles
from .timing.cpu import NAIVE_PASSES, CpuModelError, CpuTime, call_time, elem_bytes
from .units import fmt_bytes, fmt_seconds

SCHEDULES = ("naive", "flash2")
BOUNDARIES = ("dram", "l3", "l2")
# the tiled kernel's passes over its S tile per visit: GEMM 1 writes, rowmax, exp2 (two loops), sum, GEMM 2
TILE_PASSES = (1 + 1 + 2 + 2 + 1 + 1)


def default_tiles(head_dim: int, elem_bytes: int, l2_bytes: int) -> Tiles:
    """The tiled kernel's (Br, Bc) from the L2 size: square tiles, the largest power of two B with
    S (B x B) + Q_i, O_i (B x d each) + K_j, V_j (B x d each) <= half the L2 (the other half for BLAS's packed
    panels and the rest), i.e. e (B² + 4 B d) <= L2 / 2; B in [16, 512]."""
    B = 512
    while B > 16 and elem_bytes * (B * B + 4 * B * head_dim) > l2_bytes // 2:
        B //= 2
    return Tiles(B, B)


class _Contract(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CpuTilesJSON(_Contract):
    block_q: int | None
    block_kv: int | None


class CpuTimeJSON(_Contract):
    predicted_s: float | None = Field(description="null where the profile has no measured rates")
    bound_s: float = Field(description="ideal roofline: max(FLOPs / peak, DRAM bytes / DRAM bandwidth)")
    terms: dict[str, float] = Field(description="seconds per term of predicted_s")
    first_call_s: float | None = Field(description="a first call's time, naive's S first touched cold")


class CpuResultJSON(_Contract):
    """One CPU simulation as ``iosim simulate --json`` prints it (docs/cpu.md; ``iosim schema cpu-result``)."""

    schedule: str
    device: Literal["cpu"] = "cpu"
    profile: str
    problem: AttentionProblem
    tiles: CpuTilesJSON
    traffic: dict[str, int] = Field(description="bytes per boundary (dram, l3, l2), reads + writes")
    flops: dict[str, int] = Field(description="matmul (executed) and exp")
    footprint: int = Field(description="peak bytes allocated besides Q, K, V, O")
    time: CpuTimeJSON


@dataclass(frozen=True)
class CpuResult:
    schedule: str
    problem: AttentionProblem
    profile: str
    tiles: Tiles
    traffic: dict[str, int]  # bytes per boundary (reads + writes)
    flops: dict[str, int]  # "matmul" (executed), "exp" (exponentials)
    footprint: int  # peak bytes of memory the schedule allocates besides Q, K, V, O
    time: CpuTime

    def to_json(self) -> str:
        """``iosim simulate --json`` with a CPU profile: :class:`CpuResultJSON` as text."""
        return json.dumps(self.to_model().model_dump(), indent=2)

    def to_model(self) -> CpuResultJSON:
        return CpuResultJSON(schedule=self.schedule, profile=self.profile, problem=self.problem,
                             tiles=CpuTilesJSON(block_q=self.tiles.block_q, block_kv=self.tiles.block_kv),
                             traffic=self.traffic, flops=self.flops, footprint=self.footprint,
                             time=CpuTimeJSON(predicted_s=self.time.predicted_s, bound_s=self.time.bound_s,
                                              terms=self.time.terms, first_call_s=self.time.first_call_s))

    def describe(self) -> str:
        lines = [f"{self.schedule} on {self.profile}: {self.problem.describe()}  (1 MB = 10^6 B)"]
        lines += [f"  {b:<5} {fmt_bytes(self.traffic[b])}" for b in BOUNDARIES]
        p = self.time.predicted_s
        lines.append(f"  time  {fmt_seconds(p) if p is not None else 'n/a (no measured rates)'}"
                     f"  (roofline bound {fmt_seconds(self.time.bound_s)})")
        first = self.time.first_call_s
        if first is not None and p is not None and first > p * 1.01:
            lines.append(f"  first call {fmt_seconds(first)}  (fresh memory first touched cold)")
        return "\n".join(lines)


def _visits(p: AttentionProblem, t: Tiles) -> tuple[int, int, int]:
    """(Q blocks, keys loaded summed over Q blocks, S elements summed over Q blocks), one head."""
    N, Nk, Br, Bc = p.seq_len, p.kv_len, t.block_q, t.block_kv
    tr, keys, s_elems = 0, 0, 0
    for r0 in range(0, N, Br):
        nr = min(Br, N - r0)
        seen = min(Nk, r0 + nr + p.causal_offset) if p.causal else Nk
        loaded = min(Nk, -(-seen // Bc) * Bc) if seen > 0 else 0
        tr, keys, s_elems = tr + 1, keys + loaded, s_elems + nr * loaded
    return tr, keys, s_elems


def _level(prof: CpuProfile, name: str) -> int:
    return int(prof.require(f"{name}.capacity"))


def _flash2_traffic(p: AttentionProblem, prof: CpuProfile, t: Tiles) -> tuple[dict[str, int], int]:
    e, d, heads = elem_bytes(p), p.head_dim, p.n_heads_total
    tr, keys, s_elems = _visits(p, t)
    qo = 2 * p.seq_len * d * e  # Q read once, O written once
    kv_all = 2 * p.kv_len * d * e
    work = e * (t.block_q * t.block_kv + 2 * t.block_q * d + 2 * t.block_kv * d)  # per core, in L2
    s_spills = work > _level(prof, "l2")
    sharing = min(int(prof.require("cores")), int(prof.require("l3.shared_by")))
    kv_dram = kv_all if kv_all + sharing * work <= _level(prof, "l3") else kv_all * -(-tr // sharing)
    l3 = qo + 2 * keys * d * e + (TILE_PASSES * s_elems * e if s_spills else 0)
    l2 = qo + (TILE_PASSES * s_elems * e if t.block_q * t.block_kv * e > _level(prof, "l1d") else 0)
    l2 += 2 * keys * d * e  # K_j, V_j read by the GEMMs from L2
    return {"dram": heads * (qo + kv_dram), "l3": heads * l3, "l2": heads * l2}, heads * s_elems


def _naive_traffic(p: AttentionProblem, prof: CpuProfile) -> dict[str, int]:
    e, d = elem_bytes(p), p.head_dim
    s = p.seq_len * p.kv_len * e
    passes = sum(r + w for _, r, w in NAIVE_PASSES)
    operands = (2 * p.seq_len + 2 * p.kv_len) * d * e  # Q, K, V read, O written
    out = {}
    for boundary, inner in (("dram", "l3"), ("l3", "l2"), ("l2", "l1d")):
        out[boundary] = p.n_heads_total * (operands + (passes * s if s > _level(prof, inner) else 0))
    return out


def simulate_cpu(schedule: str, problem: AttentionProblem, profile: CpuProfile,
                 block_q: int | None = None, block_kv: int | None = None) -> CpuResult:
    """Traffic at dram/l3/l2, FLOPs and time of ``schedule`` ("naive" or "flash2") on a CPU profile."""
    if schedule not in SCHEDULES:
        raise CpuModelError(f"schedule={schedule!r}: the CPU model knows {', '.join(SCHEDULES)}")
    e = elem_bytes(problem)
    n_s = problem.n_heads_total * problem.seq_len * problem.kv_len
    if schedule == "naive":
        if block_q is not None or block_kv is not None:
            raise CpuModelError(f"block_q={block_q}, block_kv={block_kv}: the naive schedule has no tiles")
        tiles, traffic, s_elems = Tiles(None, None), _naive_traffic(problem, profile), n_s
        footprint = problem.seq_len * problem.kv_len * e
    else:
        default = default_tiles(problem.head_dim, e, _level(profile, "l2"))
        tiles = Tiles(block_q or default.block_q, block_kv or default.block_kv)
        if tiles.block_q < 1 or tiles.block_kv < 1:
            raise CpuModelError(f"block_q={tiles.block_q}, block_kv={tiles.block_kv}: expected positive tiles")
        traffic, s_elems = _flash2_traffic(problem, profile, tiles)
        cores = int(profile.require("cores"))
        footprint = cores * e * (tiles.block_q * tiles.block_kv + 2 * tiles.block_q * problem.head_dim)
    flops = {"matmul": 4 * s_elems * problem.head_dim, "exp": s_elems}
    time = call_time(schedule, problem, profile, s_elems, traffic["dram"])
    return CpuResult(schedule, problem, profile.name, tiles, traffic, flops, footprint, time)
