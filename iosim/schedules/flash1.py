"""FlashAttention-1 forward: Algorithm 1 of Dao et al., "FlashAttention: Fast and Memory-Efficient Exact
Attention with IO-Awareness" (NeurIPS 2022), counted literally, line by line.

    1  Bc = ceil(M / 4d), Br = min(ceil(M / 4d), d)
    2  initialize O = 0 (N×d), l = 0 (N), m = -inf (N) in HBM
    5  for j = 1..Tc:                                   K/V blocks: the outer loop
    6      load K_j, V_j from HBM to on-chip SRAM
    7      for i = 1..Tr:                               Q blocks: the inner loop
    8          load Q_i, O_i, l_i, m_i from HBM to SRAM
    9          S_ij = Q_i K_jᵀ
    10         m~_ij = rowmax(S_ij); P~_ij = exp(S_ij - m~_ij); l~_ij = rowsum(P~_ij)
    11         m_new = max(m_i, m~_ij); l_new = e^(m_i - m_new) l_i + e^(m~_ij - m_new) l~_ij
    12         O_i = diag(l_new)^-1 (diag(l_i) e^(m_i - m_new) O_i + e^(m~_ij - m_new) P~_ij V_j); write O_i
    13         l_i = l_new, m_i = m_new; write l_i, m_i

O is in the problem dtype; l and m are fp32. As in the paper's implementation, one thread block runs the
whole double loop for one head (the grid is batch × heads). With a causal mask, a (i, j) pair whose tile is
entirely masked is skipped (nothing loaded, nothing computed), as Algorithm 5 skips zero blocks; K_j, V_j are
still loaded once each (line 6), and every K/V block is visible to the last Q block anyway.

Default tiles (line 1): the paper leaves M's unit open. iosim takes M = the profile's shared memory per
thread block, in elements of the problem dtype, or the largest smaller M whose tiles fit (the tiles loaded
from global memory in shared memory, the fp32 O_i, statistics and scores in registers; see ``check_fit``);
that M is reported with the tiles.
"""

from __future__ import annotations

import numpy as np

from ..blocks import block_rows, cdiv, n_kv_blocks_visible, visit_sums
from ..counts import Counts, KernelCounts
from ..problem import STAT_BYTES, AttentionProblem
from .base import Schedule, Tiles
from .fit import largest_fitting

NAME = "flash1"
SUMMARY = "FlashAttention-1 (Alg. 1): K/V outer loop, O, l, m read and written at every inner step"
STATS = ("m", "l")


def program(x, p: AttentionProblem, t: Tiles) -> None:
    """One head."""
    N, Nk = p.seq_len, p.kv_len
    Br, Bc = t.block_q, t.block_kv
    Tr, Tc = cdiv(N, Br), cdiv(Nk, Bc)

    with x.kernel("flash1_fwd", grid=1), x.thread_block():
        for i in range(Tr):  # line 2: O = 0, l = 0, m = -inf in HBM
            q = block_rows(i, Br, N)
            x.fill("O", q, 0.0)
            x.fill("l", q, 0.0)
            x.fill("m", q, float("-inf"))
        for j in x.order(range(Tc)):  # line 5
            k = block_rows(j, Bc, Nk)
            K_j = x.load("K", k)  # line 6
            V_j = x.load("V", k)
            for i in range(Tr):  # line 7
                if j >= n_kv_blocks_visible(i, Br, Bc, N, Nk, p.causal):
                    continue  # causal: tile (i, j) entirely masked
                q = block_rows(i, Br, N)
                Q_i = x.load("Q", q)  # line 8
                O_i = x.load("O", q)
                l_i = x.load("l", q)
                m_i = x.load("m", q)
                S_ij = x.scores(Q_i, K_j, q, k)  # line 9
                m_ij, P_ij, l_ij = x.block_stats(S_ij)  # line 10
                O_i, l_i, m_i = x.flash1_update(O_i, l_i, m_i, m_ij, P_ij, l_ij, V_j)  # lines 11-12
                x.store("O", q, O_i)  # line 12
                x.store("l", q, l_i)  # line 13
                x.store("m", q, m_i)


def shared_memory(p: AttentionProblem, t: Tiles) -> int:
    """The part of the working set in shared memory: K_j, V_j and Q_i (line 6, 8)."""
    b, d = p.elem_bytes, p.head_dim
    br, bc = np.minimum(t.block_q, p.seq_len), np.minimum(t.block_kv, p.kv_len)
    return 2 * bc * d * b + br * d * b


def working_set(p: AttentionProblem, t: Tiles) -> int:
    """Bytes on chip at the peak of one inner step (after line 12's update); O_i, the statistics and the
    scores are in registers, the rest in shared memory."""
    b, d = p.elem_bytes, p.head_dim
    br, bc = np.minimum(t.block_q, p.seq_len), np.minimum(t.block_kv, p.kv_len)
    return (
        2 * bc * d * b  # K_j, V_j (line 6)
        + br * d * b  # Q_i (line 8)
        + br * d * 4  # O_i being updated, fp32 (line 12)
        + 2 * br * STAT_BYTES  # l_i, m_i (lines 8, 11)
        + br * bc * 4  # S_ij, then P~_ij in place (lines 9-10)
        + 2 * br * 4  # m~_ij, l~_ij (line 10)
    )


def default_tiles(p: AttentionProblem, profile) -> Tiles:
    """Line 1 with the largest M (elements) whose tiles fit the profile's shared memory per block."""
    d = p.head_dim

    def tiles_for(M: int) -> Tiles:
        Bc = cdiv(M, 4 * d)
        return Tiles(block_q=min(Bc, d), block_kv=Bc, sram_elements=M)

    return largest_fitting(SCHEDULE, p, tiles_for, profile)


def closed_form(p: AttentionProblem, t: Tiles) -> Counts:
    """Counts for one head. rv = Σ_i br_i·n_i (query rows × visited K/V blocks), A = visited score area,
    cv = Σ_i Σ_{j<n_i} bc_j; without causal rv = Tc·N, A = N·N_kv, cv = Tr·N_kv."""
    N, Nk, d, b, s = p.seq_len, p.kv_len, p.head_dim, p.elem_bytes, STAT_BYTES
    v = visit_sums(N, Nk, t.block_q, t.block_kv, p.causal)
    rv, cv, A = v.row_visits, v.col_visits, v.area

    k = KernelCounts("flash1_fwd", grid=1)
    k.global_read.update(
        K=Nk * d * b, V=Nk * d * b,  # line 6: once each
        Q=rv * d * b, O=rv * d * b, l=rv * s, m=rv * s,  # line 8: every visited (i, j)
    )
    k.global_write.update(
        O=N * d * b + rv * d * b,  # line 2 init + line 12
        l=N * s + rv * s, m=N * s + rv * s,  # line 2 init + line 13
    )
    k.flops.update(
        matmul=4 * A * d,  # Q_i K_jᵀ and P~_ij V_j
        exp=A + 2 * rv,  # P~ (line 10); two rescale factors per row (line 11)
        other=4 * A + (8 + 4 * d) * rv,  # scale, rowmax, subtract, rowsum; lines 11-12 per row/element
    )
    k.sram_write = 2 * Nk * d * b + rv * (2 * d * b + 4 * d + 24) + 8 * A
    k.sram_read = 2 * rv * d * b + 2 * cv * d * b + 8 * A + rv * (4 * d + 24)
    k.sram_peak = working_set(p, t)
    return Counts([k])


SCHEDULE = Schedule(NAME, SUMMARY, program, closed_form, default_tiles, working_set, shared_memory, stats=STATS)
