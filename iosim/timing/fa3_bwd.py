"""Time of a FlashAttention-3-class backward on Hopper (wgmma, TMA, warp specialization, a persistent grid).

FlashAttention-3's backward (Shah et al. 2024, §3 and its appendix) and cuDNN's run the K/V-outer loop as
FlashAttention-2's does (iosim/timing/fa2_bwd.py): one work tile per K/V block of Bc keys of one head, a **step**
per Q block of Br queries it visits: five GEMMs (S = QKᵀ, dP = dO Vᵀ, dV += Pᵀ dO, dK += dSᵀ Q, dQ = dS K) on wgmma,
Br·Bc exp2 and SCORE_OPS fp32 operations per score, a producer warp's TMA loads of Q_i, dO_i, L_i, D_i, and dQ_i
added in fp32 to the global accumulator.

The two consumer warpgroups split the K/V block's keys and run **the same phase at the same time**: dQ_i = dS K needs
both warpgroups' dS, so they meet at a barrier every step, and there is no ping-pong (the forward's,
:mod:`iosim.timing.fa3`) to hide one's exponentials under the other's GEMMs. A step is its phases in sequence, each
at the SM's rate: the GEMMs (tensor cores), the elementwise work, the shared-memory stores (dS for the dQ GEMM, dQ_i
staged for its reduction), and two wgmma round trips that no work covers (the wait for S and dP before the
exponentials, the wait for the last GEMMs before the next step's are issued), each the measured fixed cost of a
commit-and-wait (``calibration.wgmma.<dtype>.wait``, ``iosim calibrate rates``). That is the design's floor, a
simplification of a given kernel: kernels/flash3_bwd.cu runs its exponentials under the dP GEMM, and waits on wgmma
four times and at two named barriers a step. The loads and the dQ reductions run beside, with L2:

    T_step = max( t_gemm + t_elem + t_smem + 2·t_wait, t_load + t_reduce )

or, where the profile holds the description's step as measured on a one-wave grid (``calibration.backward.step``),
that measurement, as :mod:`iosim.timing.fa2_bwd` takes it (and with it ``calibration.backward.tile_fixed``, what a
further work tile costs beyond its steps, in place of the composed prologue and epilogue below).

Nsight Compute agrees with the sequence (H100, B = 4, N = 4096, d = 128): the tensor pipe 57% busy in our kernel, 65%
in cuDNN's, where a step overlapping its phases would keep it busy most of the time.

Work tiles (prologue K_j, V_j + n_j·T_step + epilogue dK_j, dV_j) are placed on one persistent block per SM, each
tile to the block that frees first, in the grid's order (cuDNN's: its kernel fetches a tile index with one global
atomic a tile, and the causal/non-causal time ratios follow the grid's order, not longest first; docs/timing.md), or
longest first (``launch_order: persistent``), or launched as a grid of one block per tile, one resident per SM
(iosim's flash3_bwd, whose causal grid runs the longest K/V blocks first). The prologue's K_j and V_j are read by
that tile only: from DRAM where the inputs do not stay in L2, at the SM's share of the DRAM read rate (the SMs start
their tiles together), after a dependent load (a grid's block also pays its start and its Q_i's first load); the
epilogue writes dK_j, dV_j into L2. The kernel takes the longer of the placement and its DRAM bytes over DRAM
bandwidth, plus a launch.
"""

from __future__ import annotations

import numpy as np

from ..blocks import makespan
from ..counts import KernelCounts
from ..problem import STAT_BYTES, AttentionProblem
from .estimate import Conditions, KernelTime
from .fa2_bwd import ACC_BYTES, GEMMS, SCORE_OPS, block_steps, measured
from .kernels import TileConfig
from .rates import Rates

WAITS = 2  # wgmma round trips a step waits out: S and dP before the exponentials, the last GEMMs before the next step


def step_parts(p: AttentionProblem, tc: TileConfig, r: Rates) -> dict[str, float]:
    """Seconds of one step's GEMMs, elementwise work, shared-memory stores, wgmma waits, loads and dQ reductions at
    one SM's rates, and the step."""
    Br, Bc, d, e = tc.block_q, tc.block_kv, p.head_dim, p.elem_bytes
    per_sm = r.sms
    gemm = GEMMS * 2 * Br * Bc * d / (r.wgmma / per_sm)
    elem = Br * Bc / (r.ex2 / per_sm) + SCORE_OPS * Br * Bc / (r.alu / per_sm)
    load = (2 * Br * d * e + 2 * Br * STAT_BYTES) / (r.l2 / per_sm)
    red_rate = r.l2_reduce.get(tc.dq_reduce_lanes or 2, r.l2_write)
    reduce = Br * d * ACC_BYTES / (red_rate / per_sm)
    smem = (Br * Bc * e + Br * d * ACC_BYTES) / (r.smem / per_sm)  # dS for the dQ GEMM, dQ_i staged in fp32
    waits = WAITS * r.wgmma_wait_s
    compute = gemm + elem + smem + waits
    return {"step_gemm": gemm, "step_elementwise": elem, "step_smem": smem, "step_waits": waits,
            "step_compute": compute, "step_load": load, "step_reduce": reduce, "step": max(compute, load + reduce)}


def main_kernel_time(c: Conditions, kernel: KernelCounts, dram: tuple[float, float], tc: TileConfig) -> KernelTime:
    """The time of the main kernel (``kernel``, as counted) at tiles ``tc`` on its DRAM (read, write) bytes."""
    p, desc, r, latency = c.problem, c.desc, c.rates, c.latency
    grouped = desc.gqa == "grouped"
    heads = p.batch * (p.kv_heads if grouped else p.heads)
    parts = step_parts(p, tc, r)
    step_m = measured(c, tc, 1)
    if step_m is not None:  # the description's step as measured (iosim.timing.fa2_bwd, the measured step)
        parts["step_composed"], parts["step"] = parts["step"], step_m
    fixed = measured(c, tc, 1, "tile_fixed") if step_m is not None else None
    kv_bytes = 2 * tc.block_kv * p.head_dim * p.elem_bytes
    steps = block_steps(p, tc, grouped)
    # K_j, V_j: read by this work tile only, so from DRAM where the inputs do not stay in L2, at the SM's share of
    # the rate (the SMs start their tiles together), after one dependent load; dK_j, dV_j written into L2. A grid of
    # one block per tile also pays each block's start and the first Q_i load's latency.
    persistent = desc.launch_order in ("persistent", "persistent-in-order")
    load_rate = (r.dram_read if dram[0] > 0 else r.l2) / r.sms
    parts["tile_load"] = kv_bytes / load_rate
    composed = parts["tile_load"] + kv_bytes / (r.l2_write / r.sms) + (latency if persistent else r.block_s + 2 * latency)
    if fixed is not None:  # what a further tile costs beyond its steps, as measured (calibration.backward.tile_fixed)
        fixed += parts["tile_load"] - kv_bytes / (r.l2 / r.sms)  # measured with K_j, V_j in L2: from DRAM, slower
        parts["tile_fixed"] = fixed
    per_tile = (composed if fixed is None else fixed) + steps * parts["step"]
    longest_first = desc.launch_order == "persistent" or (desc.launch_order == "causal-longest-first" and p.causal)
    blocks = makespan(np.tile(per_tile, heads), r.sms, longest_first=longest_first)  # grid order unless longest first
    if persistent:
        blocks += r.block_s + latency  # the grid's start, Q_i's first load
    memory = r.dram_s(*dram)
    total = max(blocks, memory) + r.next_launch_s() + latency
    busy = float(per_tile.sum()) * heads / (r.sms * blocks) if blocks else 1.0
    if memory > blocks:
        bound = "dram"
    elif step_m is not None:
        bound = "step (measured)"
    elif parts["step_load"] + parts["step_reduce"] > parts["step_compute"]:
        bound = "l2"
    else:
        bound = "sequence"  # the step's phases one after another (the largest: parts' step_gemm, step_elementwise)
    return KernelTime.of(kernel.name, kernel.grid, total,
                         {"utilization": min(1.0, busy), "blocks": blocks, "dram": memory, **parts, "bound": bound})
