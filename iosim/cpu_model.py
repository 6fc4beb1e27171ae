"""Attention on a CPU: bytes at the cache boundaries and a time prediction, for the naive and flash2 schedules.

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

Time: where the profile carries measured rates (``iosim profiles detect``), ``predicted_s`` composes them:
GEMM rates for the shapes issued, the softmax and exp rates, the first-touch and one-core bandwidths for NumPy's
passes over S; nothing is fitted to attention timings. ``predicted_s`` is a warm call's (repeated calls: naive's
S lands on memory the previous call freed, first-touch rate ``dram.first_touch``); ``first_call_s`` is a call
on cold memory (``dram.first_touch_cold``: on a VM that backs guest memory lazily, far slower). ``bound_s`` is the ideal roofline (peak FLOPs, DRAM
bandwidth) beside it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from .hardware.cpu import CpuProfile
from .problem import AttentionProblem
from .schedules import Tiles
from .units import fmt_bytes, fmt_seconds

SCHEDULES = ("naive", "flash2")
BOUNDARIES = ("dram", "l3", "l2")
COMPUTE_BYTES = {"fp32": 4, "fp16": 4, "bf16": 4}  # fp16/bf16 are upcast: tiles and S are fp32 on a CPU
# NumPy's naive passes over S (iosim.cpu.attention._naive): (name, reads, writes) in units of S
NAIVE_PASSES = (("qk", 0, 1), ("max", 1, 0), ("subtract", 1, 1), ("exp", 1, 1), ("sum", 1, 0),
                ("divide", 1, 1), ("pv", 1, 0))
# the tiled kernel's passes over its S tile per visit: GEMM 1 writes, rowmax, exp2 (two loops), sum, GEMM 2
TILE_PASSES = (1 + 1 + 2 + 2 + 1 + 1)


class CpuModelError(ValueError):
    """A problem or tile the CPU model cannot take; the message names the field, the value and the fix."""


def default_tiles(head_dim: int, elem_bytes: int, l2_bytes: int) -> Tiles:
    """The tiled kernel's (Br, Bc) from the L2 size: square tiles, the largest power of two B with
    S (B x B) + Q_i, O_i (B x d each) + K_j, V_j (B x d each) <= half the L2 (the other half for BLAS's packed
    panels and the rest), i.e. e (B² + 4 B d) <= L2 / 2; B in [16, 512]."""
    B = 512
    while B > 16 and elem_bytes * (B * B + 4 * B * head_dim) > l2_bytes // 2:
        B //= 2
    return Tiles(B, B)


@dataclass(frozen=True)
class CpuTime:
    predicted_s: float | None  # None: the profile has no measured rates (run `iosim profiles detect`)
    bound_s: float  # ideal roofline: max(FLOPs / peak, DRAM bytes / DRAM bandwidth)
    terms: dict[str, float] = field(default_factory=dict)  # seconds per term of predicted_s
    # a call whose large allocations land on cold memory (a program's first call): predicted_s with naive's S
    # first touched at dram.first_touch_cold; None where the profile lacks that rate
    first_call_s: float | None = None


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
                             time=CpuTimeJSON(**asdict(self.time)))

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


def _elem(p: AttentionProblem) -> int:
    if p.dtype not in COMPUTE_BYTES:
        raise CpuModelError(f"dtype={p.dtype!r}: the CPU path computes fp32 (fp16/bf16 upcast); expected one of "
                            f"{', '.join(COMPUTE_BYTES)}")
    return COMPUTE_BYTES[p.dtype]


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
    e, d, heads = _elem(p), p.head_dim, p.n_heads_total
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
    e, d = _elem(p), p.head_dim
    s = p.seq_len * p.kv_len * e
    passes = sum(r + w for _, r, w in NAIVE_PASSES)
    operands = (2 * p.seq_len + 2 * p.kv_len) * d * e  # Q, K, V read, O written
    out = {}
    for boundary, inner in (("dram", "l3"), ("l3", "l2"), ("l2", "l1d")):
        out[boundary] = p.n_heads_total * (operands + (passes * s if s > _level(prof, inner) else 0))
    return out


def _rate(prof: CpuProfile, dotted: str) -> float | None:
    try:
        return prof.require(dotted)
    except ValueError:
        return None


def _naive_time(p: AttentionProblem, prof: CpuProfile) -> dict[str, float] | None:
    """Seconds per term from measured rates, or None where the profile lacks them."""
    need = ("dram.bandwidth_one_core", "dram.first_touch", "compute.numpy_exp_fp32")
    rates = {k: _rate(prof, k) for k in need}
    if None in rates.values() or not prof.compute.gemm:
        return None
    h, n_s = p.n_heads_total, p.seq_len * p.kv_len
    s = n_s * _elem(p)
    flops = 2 * n_s * p.head_dim
    bw = rates["dram.bandwidth_one_core"]
    terms = {"gemm_qk": h * flops / prof.gemm_rate("qk", p.head_dim).value,
             "gemm_pv": h * flops / prof.gemm_rate("pv", p.head_dim).value,
             "first_touch_s": h * s / rates["dram.first_touch"]}
    for name, r, w in NAIVE_PASSES:
        if name in ("qk", "pv"):
            continue
        t_mem = h * (r + w) * s / bw
        terms[name] = max(t_mem, h * n_s / rates["compute.numpy_exp_fp32"]) if name == "exp" else t_mem
    return terms


def _first_call(p: AttentionProblem, prof: CpuProfile, terms: dict[str, float]) -> float | None:
    """naive's time when its S lands on cold memory; None where the profile has no cold first-touch rate."""
    cold = _rate(prof, "dram.first_touch_cold")
    if cold is None:
        return None
    s = p.n_heads_total * p.seq_len * p.kv_len * _elem(p)
    return sum(terms.values()) - terms["first_touch_s"] + s / cold


def _flash2_time(p: AttentionProblem, prof: CpuProfile, s_elems: int, dram: int) -> dict[str, float] | None:
    tile = [g for g in prof.compute.gemm if g.kind == "tile"]
    soft = _rate(prof, "compute.softmax_fp32")
    if not tile or soft is None:
        return None
    compute = 4 * s_elems * p.head_dim / prof.gemm_rate("tile", p.head_dim).value + s_elems / soft
    return {"compute": compute, "dram": max(0.0, dram / prof.require("dram.bandwidth") - compute)}


def simulate_cpu(schedule: str, problem: AttentionProblem, profile: CpuProfile,
                 block_q: int | None = None, block_kv: int | None = None) -> CpuResult:
    """Traffic at dram/l3/l2, FLOPs and time of ``schedule`` ("naive" or "flash2") on a CPU profile."""
    if schedule not in SCHEDULES:
        raise CpuModelError(f"schedule={schedule!r}: the CPU model knows {', '.join(SCHEDULES)}")
    e = _elem(problem)
    n_s = problem.n_heads_total * problem.seq_len * problem.kv_len
    if schedule == "naive":
        if block_q is not None or block_kv is not None:
            raise CpuModelError(f"block_q={block_q}, block_kv={block_kv}: the naive schedule has no tiles")
        tiles, traffic, s_elems = Tiles(None, None), _naive_traffic(problem, profile), n_s
        terms, footprint = _naive_time(problem, profile), problem.seq_len * problem.kv_len * e
    else:
        default = default_tiles(problem.head_dim, e, _level(profile, "l2"))
        tiles = Tiles(block_q or default.block_q, block_kv or default.block_kv)
        if tiles.block_q < 1 or tiles.block_kv < 1:
            raise CpuModelError(f"block_q={tiles.block_q}, block_kv={tiles.block_kv}: expected positive tiles")
        traffic, s_elems = _flash2_traffic(problem, profile, tiles)
        terms = _flash2_time(problem, profile, s_elems, traffic["dram"])
        cores = int(profile.require("cores"))
        footprint = cores * e * (tiles.block_q * tiles.block_kv + 2 * tiles.block_q * problem.head_dim)
    flops = {"matmul": 4 * s_elems * problem.head_dim, "exp": s_elems}
    bound = max(flops["matmul"] / profile.require("compute.fp32"), traffic["dram"] / profile.require("dram.bandwidth"))
    predicted = sum(terms.values()) if terms else None
    # flash2 allocates O(N d) (the output, a tile per core): its first touch is not modeled, first call = warm
    first = (_first_call(problem, profile, terms) if schedule == "naive" else predicted) if terms else None
    time = CpuTime(predicted, bound, terms or {}, first)
    return CpuResult(schedule, problem, profile.name, tiles, traffic, flops, footprint, time)
