"""FlashAttention-3-design backward: FlashAttention-2's Algorithm 2 as iosim's Hopper kernel runs it
(kernels/flash3_bwd.cu; FlashAttention-3, Shah et al. 2024, its backward: hopper/mainloop_bwd_sm90_tma_gmma_ws.hpp).

    preprocess      D = rowsum(dO ∘ O), dQacc = 0                      flash2's kernel (flash2_bwd_preprocess)
    flash3_bwd      one thread block per K/V block j of one kv head:
        producer warp (TMA):   K_j, V_j once; per visit Q_i, dO_i (and L_i, D_i) into a 2-stage ring
        consumers (2 x wgmma): S^T = K_j Q_i^T, dP^T = V_j dO_i^T, P^T, dS^T, dV_j += P^T dO_i, dK_j += dS^T Q_i,
                               dQ_ij = dS_ij K_j into shared memory
        dQ warp:               dQacc_i += dQ_ij by TMA bulk reduce-add (cp.reduce.async.bulk .add.f32)
        dK_j, dV_j written once, summed over the kv head's group of query heads
    convert         dQ = dQacc in the problem dtype                    flash2's kernel (flash2_bwd_convert_dq)

What moves is flash2's backward in its ``gqa="grouped"`` design (:mod:`iosim.schedules.flash2_bwd`): the program is
one kv head with its group, K_j and V_j are loaded once per block, Q_i, dO_i, L_i, D_i once per visit, and each
bulk reduce-add of a dQ_i partial is counted, like flash2's atomics, as a global read and a global write of its fp32
rows (the L2 performs the add). FA3 changes where the work runs (TMA, wgmma, warp roles), not the tiles' traffic.
Tiles: the kernel's (:data:`iosim.launch.FLASH3_BWD_TILES`: Br = 128 query rows per visit at d = 64, 64
at d = 128; Bc = 128 keys per block; d <= 128); its time: the kernel description ``iosim-flash3-bwd``
(:mod:`iosim.timing.fa3_bwd`).
"""

from __future__ import annotations

from ..counts import Counts
from ..problem import STAT_BYTES, AttentionProblem
from . import flash2_bwd
from .base import Schedule, Tiles
from .fit import shrink_to_fit

NAME = "flash3"
SUMMARY = "FlashAttention-3-design backward: FA2's grouped K/V-outer traffic, TMA + wgmma, dQ by TMA bulk reduce-add"
MAIN_KERNEL = "flash3_bwd"
TILES = (64, 128)  # (Br, Bc) of kernels/flash3_bwd.cu at d = 128 (iosim.launch.FLASH3_BWD_TILES)
TILES_BY_HEAD_DIM = {64: (128, 128), 128: TILES}  # the kernel's per head dim (iosim.launch.FLASH3_BWD_TILES)
DQ_PAD = 8  # fp32 padding of a dQ staging row (iosim.launch.FLASH3_BWD_DQ_PAD)


def _grouped(t: Tiles) -> flash2_bwd.GroupedTiles:
    return flash2_bwd.GroupedTiles(t.block_q, t.block_kv)


def default_tiles(p: AttentionProblem, profile) -> Tiles:
    """The kernel's tiles; where they do not fit the profile, halve Bc, then Br, until they do."""
    return shrink_to_fit(SCHEDULE, p, *TILES_BY_HEAD_DIM.get(p.head_dim, TILES), profile)


def program(x, p: AttentionProblem, t: Tiles) -> None:
    """One kv head with its group of query heads (flash2's grouped program, the main kernel named flash3_bwd)."""
    flash2_bwd.program(x, p, _grouped(t), main_kernel=MAIN_KERNEL)


def shared_memory(p: AttentionProblem, t: Tiles) -> int:
    """K_j, V_j; Q_i, dO_i in 2 stages each; dS^T in 2 buffers; the fp32 dQ staging rows; L_i, D_i in 2 stages."""
    b, d = p.elem_bytes, p.head_dim
    br, bc = min(t.block_q, p.seq_len), min(t.block_kv, p.kv_len)
    return 2 * bc * d * b + 4 * br * d * b + 2 * bc * br * b + br * (d + DQ_PAD) * 4 + 4 * br * STAT_BYTES


def working_set(p: AttentionProblem, t: Tiles) -> int:
    """Shared memory plus registers: fp32 dK_j, dV_j, S^T and dP^T, and the fp32 dQ_ij of a visit."""
    d = p.head_dim
    br, bc = min(t.block_q, p.seq_len), min(t.block_kv, p.kv_len)
    return shared_memory(p, t) + 2 * bc * d * 4 + 2 * br * bc * 4 + br * d * 4


def closed_form(p: AttentionProblem, t: Tiles) -> Counts:
    """flash2's grouped closed form, the main kernel named flash3_bwd (its peak: the tile program's, as the
    forward flash3 counts it; ``working_set`` is what the kernel allocates)."""
    return flash2_bwd.closed_form(p, _grouped(t), main_kernel=MAIN_KERNEL)


SCHEDULE = Schedule(NAME, SUMMARY, program, closed_form, default_tiles, working_set, shared_memory,
                    pass_="backward", unit="kv_head")
