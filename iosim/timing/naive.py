"""Time of standard attention (Algorithm 0) as three kernels: two tensor-core GEMMs and a memory-bound softmax.

    S = scale·QKᵀ   a GEMM of N×N_kv outputs over d: each thread block one tile of S
    P = softmax(S)  reads S once and writes P once: DRAM-bound, with one exp2 per score
    O = P·V         a GEMM of N×d outputs over N_kv: each thread block one tile of O

Each GEMM's parts are its tile FLOPs (whole 128-row tiles, as the tensor cores compute them, ragged or not) at the
mma.sync rate its resident warps reach (the calibrated table, by warps per SM, with the last wave's idle SMs), its
DRAM bytes (from the cache model) over DRAM bandwidth, its L2 bytes over L2 bandwidth, and its waves of thread blocks
each waiting two memory latencies (operands in, results out); the softmax's, its DRAM bytes, its exp2 and its fp32
work. A block loads, multiplies and stores in sequence, and the blocks resident on an SM overlap one another as the
FA2 model's do, so a kernel takes its longest part plus OVERLAP_LOSS (:mod:`iosim.timing.overlap`) of the others.
Kernels run one after another: each adds one launch interval.
"""

from __future__ import annotations

from ..blocks import cdiv
from ..counts import KernelCounts
from ..launch import NAIVE_TILES, launch_model, resident_blocks
from ..problem import AttentionProblem
from ..profile import Profile
from ..schedules import Tiles
from . import overlap
from .rates import Rates

SOFTMAX_OPS = 6  # fp32 operations per score: max pass, subtract-scale, sum, normalize, two conversions


def _tile_flops(p: AttentionProblem, i: int, grid: int) -> float:
    """FLOPs the tensor cores run: every block's whole tile (128 rows even where fewer are real)."""
    if i == 0:
        t = NAIVE_TILES["qk"]
        return grid * 2.0 * t["block_m"] * t["block_n"] * p.head_dim
    t = NAIVE_TILES["pv"]
    return grid * 2.0 * t["block_m"] * cdiv(p.kv_len, t["block_k"]) * t["block_k"] * p.head_dim


def _gemm(flops: float, k: KernelCounts, warps: int, blocks_per_sm: int, r: Rates, dram_read: float,
          dram_write: float, latency: float) -> dict:
    waves = cdiv(k.grid, r.sms * blocks_per_sm)
    util = k.grid / (r.sms * blocks_per_sm * waves) if k.grid else 1.0
    active = min(blocks_per_sm, cdiv(k.grid, r.sms)) * warps
    return {"tensor": flops / (r.mma_at(active) * util), "dram": r.dram_s(dram_read, dram_write),
            "l2": (k.global_read_bytes + k.global_write_bytes) / r.l2, "latency": waves * 2 * latency}


def _overlapped(parts: dict) -> float:
    """The longest part, plus OVERLAP_LOSS of the others."""
    vals = sorted(parts.values())
    return vals[-1] + overlap.OVERLAP_LOSS * sum(vals[:-1])


def kernel_times(p: AttentionProblem, tiles: Tiles, counts: list[KernelCounts], profile: Profile, r: Rates,
                 dram: list[tuple[float, float]], latency: float = 0.0) -> list[tuple[str, float, dict]]:
    """(name, seconds, parts) of each of the three kernels; ``latency``: one dependent load (a block's operands,
    then its stores draining, are two that nothing hides in a short kernel)."""
    lm = launch_model("naive", p, tiles)
    out = []
    for i, (k, (rd, wr)) in enumerate(zip(counts, dram, strict=True)):
        km = lm.kernels[i]
        total, _ = resident_blocks(profile, km.threads, km.smem, km.registers)
        per_sm = max(1, total // r.sms)
        if i == 1:  # softmax
            parts = {"dram": r.dram_s(rd, wr), "exp": k.flops["exp"] / r.ex2,
                     "fp32": SOFTMAX_OPS * p.n_heads_total * p.seq_len * p.kv_len / r.alu,
                     "latency": cdiv(k.grid, r.sms * per_sm) * 2 * latency}
        else:
            parts = _gemm(_tile_flops(p, i, k.grid), k, km.threads // 32, per_sm, r, rd, wr, latency)
        bound = max(parts, key=parts.get)
        out.append((k.name, _overlapped(parts) + r.launch_s, {**parts, "launch": r.launch_s, "bound": bound}))
    return out


def tile_note() -> str:
    return f"qk tile {NAIVE_TILES['qk']}, pv tile {NAIVE_TILES['pv']}"
