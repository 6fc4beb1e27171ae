"""Time of a FlashAttention-2-class backward pass (mma.sync): the row kernels, and the K/V-outer main kernel's step.

Three kernels run (iosim/schedules/flash2_bwd.py counts them): Delta = rowsum(dO ∘ O) with the fp32 dQ accumulator
cleared, the main kernel, and dQ's conversion to the input dtype. The two row kernels stream their bytes: each takes
its DRAM bytes (the L2 model's) or its L2 bytes, whichever is longer, plus a launch.

The main kernel runs one thread block per K/V block (Bc keys) of one head: K_j and V_j once, then a **step** per Q
block it visits (Br queries; with grouped-query heads, iosim's kernel visits every query head of the group in one
block). A step is, in sequence for the block's W warps (each phase needs the one before: P needs S, dS needs P and
dP, the three last GEMMs need P and dS from shared memory):

    ldmatrix   every GEMM's operands from shared memory, as the kernel's warp grid splits each GEMM (below), and
               the stores of P and dS and the staging of Q_i and dO_i into shared memory
    mma        5 GEMMs of 2·Br·Bc·d FLOPs (S = QKᵀ, dP = dO Vᵀ, dV += Pᵀ dO, dK += dSᵀ Q, dQ = dS K)
    elementwise  Br·Bc exp2 (P recomputed from the saved statistics), SCORE_OPS fp32 operations per score

The warp grid: a GEMM of M×N×K outputs split over W warps, wm along M and wn = W/wm along N, reads
(wn·M + wm·N)·K elements from shared memory (each warp its rows of A and its columns of B). The description gives wm
for S and dP (warps along Br), for dK and dV (along Bc), and for dQ (along Br): FlashAttention-2's AtomLayoutMSdP,
AtomLayoutNdKV and AtomLayoutMdQ, iosim's BwdLayout (kernels/flash_bwd.cu).

Beside the sequence run the step's traffic with L2, asynchronous to the warps: Q_i, dO_i, L_i, D_i loaded (cp.async,
one step ahead) and dQ_i's fp32 reductions (red.global.add, fire-and-forget) at the calibrated reduction rate
(``l2.reduce``). k blocks resident per SM overlap as the forward's do (:mod:`iosim.timing.fa2`):

    T_step = max( t_seq·(1 + OVERLAP_LOSS·(k−1)), k·t_mma, k·t_ldmatrix, k·t_elementwise, k·(t_load + t_reduce) )

A block takes prologue (K_j, V_j) + n_j·T_step + epilogue (dK_j, dV_j written), placed on the SMs' slots in launch
order, the kernel the longer of that and its DRAM bytes over DRAM bandwidth, plus a launch.

**The measured step.** How much of a phase's shared-memory traffic a kernel hides under its multiplies is its code's:
iosim's kernel and FlashAttention-2's move the same shared-memory wavefronts and run the same tensor work a step,
yet take 8,859 and 8,068 cycles (H100, d = 128; docs/timing.md). Where the profile holds the description's step,
measured on a one-wave grid (``calibration.backward.step``, :mod:`iosim.calibrate.backward_step`), T_step is that
measurement (one block an SM, the description's tiles, 16-bit inputs); the composed T_step above is kept beside it
(``step_composed``) and is the step wherever the profile lacks it. So with a block's fixed part: where the profile
holds ``calibration.backward.tile_fixed`` (what a further K/V block costs an SM beyond its steps, measured as two
blocks an SM against one), a block takes tile_fixed + n_j·T_step in place of the composed prologue and epilogue.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..blocks import cdiv, makespan
from ..counts import KernelCounts
from ..problem import STAT_BYTES, AttentionProblem
from . import overlap
from .estimate import Conditions, KernelTime
from .fa2 import SUBPARTITIONS, residency
from .kernels import KernelDesc, TileConfig
from .rates import Rates

GEMMS = 5  # S, dP, dV, dK, dQ
SCORE_OPS = 4.0  # fp32 lane operations per score: scale·S − L (FFMA), dP − D, P·(dP − D), ½ pack of P, ½ of dS
ACC_BYTES = 4  # fp32 dQ accumulator


@dataclass(frozen=True)
class BwdStep:
    ldmatrix_s: float
    mma_s: float
    elementwise_s: float
    load_s: float  # Q_i, dO_i, L_i, D_i from L2
    reduce_s: float  # dQ_i's fp32 reductions into L2
    step_s: float

    @property
    def sequence_s(self) -> float:
        return self.ldmatrix_s + self.mma_s + self.elementwise_s


def smem_step_bytes(Br: int, Bc: int, d: int, e: int, W: int, tc: TileConfig) -> float:
    """Shared-memory bytes of one step: each GEMM's operands as the warp grid reads them, P and dS stored, Q_i and
    dO_i staged."""
    s, kv, q = tc.warp_grid or (W // 4, 4, W // 4)

    def gemm(M: int, N: int, K: int, wm: int) -> float:
        return (W // wm * M + wm * N) * K * e

    return (2 * gemm(Br, Bc, d, s) + 2 * gemm(Bc, d, Br, kv) + gemm(Br, d, Bc, q)
            + 2 * Br * Bc * e + 2 * Br * d * e)


def step(p: AttentionProblem, tc: TileConfig, desc: KernelDesc, k: int, r: Rates) -> BwdStep:
    """One step (one Q block against one K/V block) of ``k`` resident blocks on one SM."""
    Br, Bc, d, e, W = tc.block_q, tc.block_kv, p.head_dim, p.elem_bytes, desc.warps
    per_sp = max(W / SUBPARTITIONS, 1.0)
    sp = r.sms * SUBPARTITIONS
    flops_warp = GEMMS * 2 * Br * Bc * d / W
    mma = per_sp * flops_warp / (r.mma_at(W) / sp)
    mma_k = per_sp * flops_warp / (r.mma_at(k * W) / sp)
    scores = Br * Bc / W
    elem = per_sp * (scores / (r.ex2 / sp) + SCORE_OPS * scores / (r.alu / sp))
    ldm = smem_step_bytes(Br, Bc, d, e, W, tc) / (r.smem / r.sms)
    load = (2 * Br * d * e + 2 * Br * STAT_BYTES) / (r.l2 / r.sms)
    lanes = tc.dq_reduce_lanes or 1
    red_rate = r.l2_reduce.get(lanes, r.l2_write)
    reduce = Br * d * ACC_BYTES / (red_rate / r.sms)
    t = max((ldm + mma + elem) * (1 + overlap.OVERLAP_LOSS * (k - 1)), k * mma_k, k * ldm, k * elem,
            k * (load + reduce))
    return BwdStep(ldm, mma, elem, load, reduce, t)


def measured(c: Conditions, tc: TileConfig, k: int, part: str = "step") -> float | None:
    """``calibration.backward.<part>`` ("step" or "tile_fixed") of the description at the problem's head dim, as
    measured, where the profile has it and the call runs as it was measured (the description's own tiles, one block
    an SM, 16-bit inputs); else None."""
    cal = getattr(c.profile.calibration, "backward", None)
    table = getattr(cal, part, None) if cal is not None else None
    entry = table.get(c.desc.name) if table else None
    d = c.problem.head_dim
    if entry is None or d not in entry.value or k != 1 or c.problem.elem_bytes != 2:
        return None
    return float(entry.value[d]) if c.desc.runs_own_tiles(d, tc) else None


def block_steps(p: AttentionProblem, tc: TileConfig, grouped: bool) -> np.ndarray:
    """Steps of each K/V block of one head (of one kv head's group where ``grouped``), in launch order."""
    Br, Bc, N, Nk = tc.block_q, tc.block_kv, p.seq_len, p.kv_len
    Tr, Tc = cdiv(N, Br), cdiv(Nk, Bc)
    j = np.arange(Tc)
    first = np.maximum(0, j * Bc - (Nk - N)) // Br if p.causal else np.zeros(Tc, dtype=int)
    visits = np.maximum(0, Tr - first)
    return visits * (p.heads // p.kv_heads if grouped else 1)


def main_kernel_time(c: Conditions, kernel: KernelCounts, dram: tuple[float, float], tc: TileConfig) -> KernelTime:
    """The time of the main kernel (``kernel``, as counted) at tiles ``tc`` on its DRAM (read, write) bytes."""
    p, desc, r, latency = c.problem, c.desc, c.rates, c.latency
    grouped = desc.gqa == "grouped"
    k = residency(tc, desc, p.head_dim, p.elem_bytes, c.profile)
    heads = p.batch * (p.kv_heads if grouped else p.heads)
    steps = block_steps(p, tc, grouped)
    grid = len(steps) * heads
    if grid < r.sms * k:
        k = max(1, math.ceil(grid / r.sms))
    st = step(p, tc, desc, k, r)
    step_m = measured(c, tc, k)
    step_s = st.step_s if step_m is None else step_m
    kv_bytes = 2 * tc.block_kv * p.head_dim * p.elem_bytes
    prologue = k * kv_bytes / (r.l2 / r.sms) + r.block_s + 2 * latency
    epilogue = k * kv_bytes / (r.l2_write / r.sms)
    fixed = measured(c, tc, k, "tile_fixed") if step_m is not None else None
    if fixed is not None and dram[0] > 0:  # measured with K_j, V_j in L2: from DRAM, slower
        fixed += kv_bytes / (r.dram_read / r.sms) - kv_bytes / (r.l2 / r.sms)
    durations = np.tile((prologue + epilogue if fixed is None else fixed) + steps * step_s, heads)
    blocks = makespan(durations, r.sms * k)
    memory = r.dram_s(*dram)
    total = max(blocks, memory) + r.next_launch_s() + latency
    busy = float(durations.sum()) / (r.sms * k * blocks) if blocks else 1.0
    parts = {"utilization": min(1.0, busy), "blocks": blocks, "dram": memory, "resident_blocks": k,
             "step_ldmatrix": st.ldmatrix_s, "step_mma": st.mma_s, "step_elementwise": st.elementwise_s,
             "step_load": st.load_s, "step_reduce": st.reduce_s, "step": step_s,
             **({"step_composed": st.step_s} if step_m is not None else {}),
             **({"tile_fixed": fixed} if fixed is not None else {})}
    smem = float(steps.sum()) * heads * smem_step_bytes(tc.block_q, tc.block_kv, p.head_dim, p.elem_bytes, desc.warps,
                                                        tc) + grid * kv_bytes  # K_j, V_j landed once a block
    bound = "dram" if memory > blocks else "step (measured)" if step_m is not None else _bound(st, k)
    return KernelTime.of(kernel.name, kernel.grid, total, {**parts, "bound": bound}, smem)


def row_kernel_time(kernel: KernelCounts, dram: tuple[float, float], r: Rates, first: bool) -> KernelTime:
    """A streaming kernel (Delta, dQ's conversion, a group sum): the longer of its DRAM and its L2 traffic."""
    memory = r.dram_s(*dram)
    l2 = kernel.global_read_bytes / r.l2 + kernel.global_write_bytes / r.l2_write
    launch = r.first_launch_s() if first else r.next_launch_s()
    return KernelTime.of(kernel.name, kernel.grid, max(memory, l2) + launch,
                         {"utilization": 1.0, "dram": memory, "l2": l2, "launch": launch,
                          "bound": "dram" if memory >= l2 else "l2"})


def _bound(st: BwdStep, k: int) -> str:
    cands = {"sequence": st.sequence_s * (1 + overlap.OVERLAP_LOSS * (k - 1)), "tensor": k * st.mma_s,
             "smem": k * st.ldmatrix_s, "elementwise": k * st.elementwise_s, "l2": k * (st.load_s + st.reduce_s)}
    return max(cands, key=cands.get)
