"""FlashAttention-1 backward: Algorithm 4 of Dao et al., "FlashAttention" (2022), without dropout, counted
literally (line numbers as the paper prints them, in its appendix).

    2   Bc = ceil(M / 4d), Br = min(ceil(M / 4d), d)
    5   initialize dQ = 0 (N×d), dK = 0, dV = 0 (N_kv×d) in HBM
    6   for j = 1..Tc:                                           K/V blocks: the outer loop
    7       load K_j, V_j from HBM to on-chip SRAM
    8       on chip: dK~_j = 0, dV~_j = 0
    9       for i = 1..Tr:                                       Q blocks: the inner loop
    10          load Q_i, O_i, dO_i, dQ_i, l_i, m_i from HBM to SRAM
    11          S_ij = tau Q_i K_jᵀ (causal: masked)
    13          P_ij = diag(l_i)^-1 exp(S_ij - m_i)              (recomputed: P was never stored)
    16          dV~_j += P_ijᵀ dO_i
    17          dP_ij = dO_i V_jᵀ
    19          D_i = rowsum(dO_i ∘ O_i)
    20          dS_ij = P_ij ∘ (dP_ij - D_i)
    21          dQ_i += tau dS_ij K_j; write dQ_i to HBM
    22          dK~_j += tau dS_ijᵀ Q_i
    24      write dK_j = dK~_j, dV_j = dV~_j to HBM

Q, K, V, O, dO, dQ, dK, dV are in the problem dtype (dQ is rounded at every write, as the algorithm stores
it); l and m are the fp32 statistics of FlashAttention-1's forward. One thread block runs the double loop
for one head. Causal: a tile entirely masked is skipped, as in the forward. tau is folded into dS.
Global elements (N = N_kv, no causal): 2Nd (line 7) + Tc·(4Nd + 2N) (line 10) + Tc·Nd (line 21) + 2Nd
(line 24) + 3Nd (line 5) = 7Nd + Tc·N·(5d + 2).
"""

from __future__ import annotations

from ..blocks import block_rows, cdiv, n_kv_blocks_visible, visit_sums
from ..counts import Counts, KernelCounts
from ..problem import STAT_BYTES, AttentionProblem
from .base import Schedule, Tiles
from .fit import largest_fitting

NAME = "flash1"
SUMMARY = "FlashAttention-1 backward (Alg. 4): K/V outer; Q, O, dO, dQ, l, m read and dQ written per step"


def program(x, p: AttentionProblem, t: Tiles) -> None:
    """One head."""
    tile_program(x, p, t, "flash1_bwd", mask=None)


def tile_program(x, p: AttentionProblem, t: Tiles, kernel: str, mask) -> None:
    """Algorithm 4; with a block ``mask`` (Tr × Tc booleans), the zero blocks are skipped (block-sparse)."""
    N, Nk = p.seq_len, p.kv_len
    Br, Bc = t.block_q, t.block_kv
    Tr, Tc = cdiv(N, Br), cdiv(Nk, Bc)

    with x.kernel(kernel, grid=1), x.thread_block():
        for i in range(Tr):  # line 5: dQ = 0 in HBM
            x.fill("dQ", block_rows(i, Br, N), 0.0)
        for j in range(Tc):  # line 5: dK = 0, dV = 0 in HBM
            x.fill("dK", block_rows(j, Bc, Nk), 0.0)
            x.fill("dV", block_rows(j, Bc, Nk), 0.0)
        for j in x.order(range(Tc)):  # line 6
            k = block_rows(j, Bc, Nk)
            K_j = x.load("K", k)  # line 7
            V_j = x.load("V", k)
            dK_j = x.zeros_grad("dK", k)  # line 8
            dV_j = x.zeros_grad("dV", k)
            for i in range(Tr):  # line 9
                if mask is not None and not mask[i, j]:
                    continue  # block-sparse: a zero block
                if j >= n_kv_blocks_visible(i, Br, Bc, N, Nk, p.causal):
                    continue  # causal: tile (i, j) entirely masked
                q = block_rows(i, Br, N)
                Q_i = x.load("Q", q)  # line 10
                O_i = x.load("O", q)
                dO_i = x.load("dO", q)
                dQ_i = x.load("dQ", q)
                l_i = x.load("l", q)
                m_i = x.load("m", q)
                S_ij = x.scores(Q_i, K_j, q, k)  # line 11
                P_ij = x.recompute_probs_ml(S_ij, m_i, l_i)  # line 13
                dV_j = x.matmul_tn_acc(dV_j, P_ij, dO_i)  # line 16
                dP_ij = x.dprobs(dO_i, V_j)  # line 17
                D_i = x.rowdot(dO_i, O_i)  # line 19
                dS_ij = x.dscores(P_ij, dP_ij, D_i)  # line 20
                dQ_i = x.matmul_nn_acc(dQ_i, dS_ij, K_j)  # line 21
                x.store("dQ", q, dQ_i)
                dK_j = x.matmul_tn_acc(dK_j, dS_ij, Q_i)  # line 22
            x.store("dK", k, dK_j)  # line 24
            x.store("dV", k, dV_j)


def _sizes(p: AttentionProblem, t: Tiles) -> tuple[int, int, int, int]:
    return p.elem_bytes, p.head_dim, min(t.block_q, p.seq_len), min(t.block_kv, p.kv_len)


def shared_memory(p: AttentionProblem, t: Tiles) -> int:
    """Tiles loaded from global memory and kept as operands: K_j, V_j (line 7), Q_i, O_i, dO_i (line 10)."""
    b, d, br, bc = _sizes(p, t)
    return 2 * bc * d * b + 3 * br * d * b


def working_set(p: AttentionProblem, t: Tiles) -> int:
    """Bytes on chip at the peak of one inner step; beyond ``shared_memory``, in registers: the fp32
    accumulators dK~_j, dV~_j, dQ_i, the tiles P (over S) and dS (over dP), and l_i, m_i, D_i."""
    _, d, br, bc = _sizes(p, t)
    return (
        shared_memory(p, t)
        + 2 * bc * d * 4  # dK~_j, dV~_j (line 8)
        + br * d * 4  # dQ_i, updated in fp32 (line 21)
        + 2 * br * STAT_BYTES + br * 4  # l_i, m_i (line 10), D_i (line 19)
        + 2 * br * bc * 4  # S_ij then P_ij; dP_ij then dS_ij (lines 11-20)
    )


def default_tiles(p: AttentionProblem, profile) -> Tiles:
    """Line 2 with the largest M (elements, at most the shared memory per block) whose tiles fit."""
    d = p.head_dim

    def tiles_for(M: int) -> Tiles:
        Bc = cdiv(M, 4 * d)
        return Tiles(block_q=min(Bc, d), block_kv=Bc, sram_elements=M)

    return largest_fitting(SCHEDULE, p, tiles_for, profile)


def closed_form(p: AttentionProblem, t: Tiles) -> Counts:
    """Counts for one head over the visited pairs: rv = Σ br_i, cv = Σ bc_j, A = Σ br_i·bc_j (no causal:
    rv = Tc·N, cv = Tr·N_kv, A = N·N_kv)."""
    v = visit_sums(p.seq_len, p.kv_len, t.block_q, t.block_kv, p.causal)
    return counts_from_visits(p, t, v.row_visits, v.col_visits, v.area, "flash1_bwd")


def counts_from_visits(p: AttentionProblem, t: Tiles, rv: int, cv: int, A: int, kernel: str) -> Counts:
    """The counts of ``tile_program`` given its visit sums over the visited (i, j) tiles."""
    N, Nk, d, b, s = p.seq_len, p.kv_len, p.head_dim, p.elem_bytes, STAT_BYTES
    k = KernelCounts(kernel, grid=1)
    k.global_read.update(
        K=Nk * d * b, V=Nk * d * b,  # line 7
        Q=rv * d * b, O=rv * d * b, dO=rv * d * b, dQ=rv * d * b, l=rv * s, m=rv * s,  # line 10
    )
    k.global_write.update(
        dQ=N * d * b + rv * d * b,  # line 5 init + line 21
        dK=2 * Nk * d * b, dV=2 * Nk * d * b,  # line 5 init + line 24
    )
    k.flops.update(
        matmul=10 * A * d,  # S, dV, dP, dQ, dK: five GEMMs of 2·br·bc·d
        exp=A,  # P recomputed
        other=6 * A + rv * (1 + 2 * d),  # scale; P: subtract, divide (+1 reciprocal per row); dS: 3; D: 2d per row
    )
    k.sram_write = 2 * Nk * d * (4 + b) + rv * (4 * d * b + 12 + 4 * d) + 16 * A + 8 * cv * d
    k.sram_read = rv * (7 * d * b + 12 + 4 * d) + cv * (3 * d * b + 8 * d) + 24 * A + 8 * Nk * d
    k.sram_peak = working_set(p, t)
    return Counts([k])


SCHEDULE = Schedule(NAME, SUMMARY, program, closed_form, default_tiles, working_set, shared_memory,
                    pass_="backward")
