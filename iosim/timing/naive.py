"""Time of standard attention (Algorithm 0) as three kernels: two tensor-core GEMMs and a memory-bound softmax.

    S = scale·QKᵀ   a GEMM of N×N_kv outputs over d: each thread block one tile of S
    P = softmax(S)  reads S once and writes P once: DRAM-bound, with one exp2 per score
    O = P·V         a GEMM of N×d outputs over N_kv: each thread block one tile of O

Each GEMM takes the longest of its FLOPs at the mma.sync rate that its resident warps reach (the calibrated table,
by warps per SM, with the last wave's idle SMs), its DRAM bytes (from the cache model) over DRAM bandwidth and its
L2 bytes over L2 bandwidth; the softmax the longest of its DRAM bytes, its exp2 and its fp32 work. Kernels run one
after another: each adds one launch interval.
"""

from __future__ import annotations

from ..blocks import cdiv
from ..counts import KernelCounts
from ..launch import NAIVE_TILES, launch_model, resident_blocks
from ..problem import AttentionProblem
from ..profile import Profile
from ..schedules import Tiles
from .rates import Rates

SOFTMAX_OPS = 6  # fp32 operations per score: max pass, subtract-scale, sum, normalize, two conversions


def _gemm(k: KernelCounts, warps: int, blocks_per_sm: int, r: Rates, dram_read: float, dram_write: float):
    waves = cdiv(k.grid, r.sms * blocks_per_sm)
    util = k.grid / (r.sms * blocks_per_sm * waves) if k.grid else 1.0
    active = min(blocks_per_sm, cdiv(k.grid, r.sms)) * warps
    compute = k.flops["matmul"] / (r.mma_at(active) * util)
    parts = {"tensor": compute, "dram": r.dram_s(dram_read, dram_write),
             "l2": (k.global_read_bytes + k.global_write_bytes) / r.l2}
    return parts


def kernel_times(p: AttentionProblem, tiles: Tiles, counts: list[KernelCounts], profile: Profile, r: Rates,
                 dram: list[tuple[float, float]]) -> list[tuple[str, float, dict]]:
    """(name, seconds, parts) of each of the three kernels."""
    lm = launch_model("naive", p, tiles)
    out = []
    for i, (k, (rd, wr)) in enumerate(zip(counts, dram, strict=True)):
        km = lm.kernels[i]
        total, _ = resident_blocks(profile, km.threads, km.smem, km.registers)
        per_sm = max(1, total // r.sms)
        if i == 1:  # softmax
            parts = {"dram": r.dram_s(rd, wr), "exp": k.flops["exp"] / r.ex2,
                     "fp32": SOFTMAX_OPS * p.n_heads_total * p.seq_len * p.kv_len / r.alu}
        else:
            parts = _gemm(k, km.threads // 32, per_sm, r, rd, wr)
        bound = max(parts, key=parts.get)
        out.append((k.name, parts[bound] + r.launch_s, {**parts, "launch": r.launch_s, "bound": bound}))
    return out


def tile_note() -> str:
    return f"qk tile {NAIVE_TILES['qk']}, pv tile {NAIVE_TILES['pv']}"
