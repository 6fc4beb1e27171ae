"""Standard attention backward: Algorithm 3 of the FlashAttention paper (Dao et al., 2022), five kernels.

    Require: Q, K, V, dO (N×d) and P (N×N, written by Algorithm 0's forward) in HBM
    1  load P, dO by blocks;  dV = Pᵀ dO;                          write dV
    2  load dO, V by blocks;  dP = dO Vᵀ;                          write dP
    3  read P, dP;            dS_ij = P_ij (dP_ij - Σ_l P_il dP_il); write dS
    4  load dS, K by blocks;  dQ = dS K;                           write dQ
    5  load dS, Q by blocks;  dK = dSᵀ Q;                          write dK

Every tensor is stored in the problem dtype (dP and dS too), as the paper counts it: untiled (the default),
each GEMM reads each operand once and the backward moves b·(7N² + 8Nd) bytes per head when N = N_kv
(reads 5N² + 5Nd, writes 2N² + 3Nd elements). With tiles (Br, Bc) the GEMMs are tiled kernels, one output
tile per thread block, and re-read their streamed operand (dO in line 1 Tc times, and so on).

The softmax scale tau (S = tau·QKᵀ) is folded into dS: line 3 stores tau·dS, so dQ = dS K and dK = dSᵀ Q.
With grouped-query heads every query head writes its own dK, dV (N_kv×d), summed over the group by a
separate kernel (see ``iosim.schedules.backward.group_sum``).
"""

from __future__ import annotations

from ..blocks import Rows, block_rows, cdiv
from ..counts import Counts, KernelCounts
from ..problem import AttentionProblem
from .base import Schedule, Tiles
from .naive import GEMM_TILE

NAME = "naive"
SUMMARY = "standard attention backward (Alg. 3): dP and dS materialized in global memory"


def default_tiles(p: AttentionProblem, profile) -> Tiles:
    return Tiles(None, None)


def _tiles(p: AttentionProblem, t: Tiles) -> tuple[int, int]:
    return (p.seq_len, p.kv_len) if t.block_q is None else (t.block_q, t.block_kv)


def _grids(p: AttentionProblem, t: Tiles) -> tuple[int, int, int, int, int]:
    """Thread blocks of the five kernels, per head (untiled: a GEMM library's 128×128 output tiles)."""
    Br, Bc = (GEMM_TILE, GEMM_TILE) if t.block_q is None else (t.block_q, t.block_kv)
    Tr, Tc = cdiv(p.seq_len, Br), cdiv(p.kv_len, Bc)
    return Tc, Tr * Tc, p.seq_len, Tr, Tc


def program(x, p: AttentionProblem, t: Tiles) -> None:
    """One head."""
    N, Nk = p.seq_len, p.kv_len
    Br, Bc = _tiles(p, t)
    Tr, Tc = cdiv(N, Br), cdiv(Nk, Bc)
    g_dv, g_dp, g_ds, g_dq, g_dk = _grids(p, t)

    with x.kernel("naive_bwd_dv", grid=g_dv):  # line 1: dV = Pᵀ dO, one dV_j per thread block
        for j in range(Tc):
            with x.thread_block():
                k = block_rows(j, Bc, Nk)
                dV_j = x.zeros_grad("dV", k)
                for i in range(Tr):
                    q = block_rows(i, Br, N)
                    P_ij = x.load("P", q, k)
                    dO_i = x.load("dO", q)
                    dV_j = x.matmul_tn_acc(dV_j, P_ij, dO_i)  # dV_j += P_ijᵀ dO_i
                x.store("dV", k, dV_j)

    with x.kernel("naive_bwd_dp", grid=g_dp):  # line 2: dP = dO Vᵀ, one dP_ij per thread block
        for i in range(Tr):
            for j in range(Tc):
                with x.thread_block():
                    q, k = block_rows(i, Br, N), block_rows(j, Bc, Nk)
                    dO_i = x.load("dO", q)
                    V_j = x.load("V", k)
                    x.store("dP", q, x.dprobs(dO_i, V_j), k)

    all_keys = Rows(0, Nk)
    with x.kernel("naive_bwd_ds", grid=g_ds):  # line 3: dS = P ∘ (dP - rowsum(P ∘ dP)), one row per block
        for r in range(N):
            with x.thread_block():
                row = Rows(r, r + 1)
                P_r = x.load("P", row, all_keys)
                dP_r = x.load("dP", row, all_keys)
                x.store("dS", row, x.softmax_grad(P_r, dP_r), all_keys)

    with x.kernel("naive_bwd_dq", grid=g_dq):  # line 4: dQ = dS K, one dQ_i per thread block
        for i in range(Tr):
            with x.thread_block():
                q = block_rows(i, Br, N)
                dQ_i = x.zeros_grad("dQ", q)
                for j in range(Tc):
                    k = block_rows(j, Bc, Nk)
                    dS_ij = x.load("dS", q, k)
                    K_j = x.load("K", k)
                    dQ_i = x.matmul_nn_acc(dQ_i, dS_ij, K_j)  # dQ_i += dS_ij K_j
                x.store("dQ", q, dQ_i)

    with x.kernel("naive_bwd_dk", grid=g_dk):  # line 5: dK = dSᵀ Q, one dK_j per thread block
        for j in range(Tc):
            with x.thread_block():
                k = block_rows(j, Bc, Nk)
                dK_j = x.zeros_grad("dK", k)
                for i in range(Tr):
                    q = block_rows(i, Br, N)
                    dS_ij = x.load("dS", q, k)
                    Q_i = x.load("Q", q)
                    dK_j = x.matmul_tn_acc(dK_j, dS_ij, Q_i)  # dK_j += dS_ijᵀ Q_i
                x.store("dK", k, dK_j)


def shared_memory(p: AttentionProblem, t: Tiles) -> int | None:
    """Operand tiles of the tiled GEMMs (None when untiled)."""
    if t.block_q is None:
        return None
    b, d = p.elem_bytes, p.head_dim
    br, bc = min(t.block_q, p.seq_len), min(t.block_kv, p.kv_len)
    return max(br * bc * b + br * d * b,  # P_ij or dS_ij, and dO_i or Q_i (lines 1, 5)
               (br + bc) * d * b,  # dO_i, V_j (line 2)
               br * bc * b + bc * d * b)  # dS_ij, K_j (line 4)


def working_set(p: AttentionProblem, t: Tiles) -> int | None:
    """On-chip bytes of the largest tiled kernel (None when untiled): operands plus the fp32 result."""
    if t.block_q is None:
        return None
    b, d = p.elem_bytes, p.head_dim
    br, bc = min(t.block_q, p.seq_len), min(t.block_kv, p.kv_len)
    return max(
        bc * d * 4 + br * bc * b + br * d * b,  # lines 1, 5: dV_j / dK_j accumulator, P_ij / dS_ij, dO_i / Q_i
        (br + bc) * d * b + br * bc * 4,  # line 2: dO_i, V_j, dP_ij
        br * d * 4 + br * bc * b + bc * d * b,  # line 4: dQ_i accumulator, dS_ij, K_j
    )


def closed_form(p: AttentionProblem, t: Tiles) -> Counts:
    """Counts for one head. Untiled (Tr = Tc = 1) and N = N_kv the global bytes are b·(7N² + 8Nd)."""
    N, Nk, d, b = p.seq_len, p.kv_len, p.head_dim, p.elem_bytes
    Br, Bc = _tiles(p, t)
    Tr, Tc = cdiv(N, Br), cdiv(Nk, Bc)
    NN = N * Nk
    br, bc = min(Br, N), min(Bc, Nk)
    g_dv, g_dp, g_ds, g_dq, g_dk = _grids(p, t)

    k1 = KernelCounts("naive_bwd_dv", grid=g_dv)  # line 1
    k1.global_read.update(P=NN * b, dO=Tc * N * d * b)
    k1.global_write.update(dV=Nk * d * b)
    k1.flops.update(matmul=2 * NN * d)
    k1.sram_write = Nk * d * 4 + NN * b + Tc * N * d * b + Tr * Nk * d * 4
    k1.sram_read = Tr * Nk * d * 4 + NN * b + Tc * N * d * b + Nk * d * 4
    k1.sram_peak = bc * d * 4 + br * bc * b + br * d * b

    k2 = KernelCounts("naive_bwd_dp", grid=g_dp)  # line 2
    k2.global_read.update(dO=Tc * N * d * b, V=Tr * Nk * d * b)
    k2.global_write.update(dP=NN * b)
    k2.flops.update(matmul=2 * NN * d)
    k2.sram_write = Tc * N * d * b + Tr * Nk * d * b + NN * 4
    k2.sram_read = Tc * N * d * b + Tr * Nk * d * b + NN * 4
    k2.sram_peak = (br + bc) * d * b + br * bc * 4

    k3 = KernelCounts("naive_bwd_ds", grid=g_ds)  # line 3
    k3.global_read.update(P=NN * b, dP=NN * b)
    k3.global_write.update(dS=NN * b)
    k3.flops.update(other=5 * NN)
    k3.sram_write = 2 * NN * b + NN * 4
    k3.sram_read = 2 * NN * b + NN * 4
    k3.sram_peak = Nk * (2 * b + 4)

    k4 = KernelCounts("naive_bwd_dq", grid=g_dq)  # line 4
    k4.global_read.update(dS=NN * b, K=Tr * Nk * d * b)
    k4.global_write.update(dQ=N * d * b)
    k4.flops.update(matmul=2 * NN * d)
    k4.sram_write = N * d * 4 + NN * b + Tr * Nk * d * b + Tc * N * d * 4
    k4.sram_read = Tc * N * d * 4 + NN * b + Tr * Nk * d * b + N * d * 4
    k4.sram_peak = br * d * 4 + br * bc * b + bc * d * b

    k5 = KernelCounts("naive_bwd_dk", grid=g_dk)  # line 5
    k5.global_read.update(dS=NN * b, Q=Tc * N * d * b)
    k5.global_write.update(dK=Nk * d * b)
    k5.flops.update(matmul=2 * NN * d)
    k5.sram_write = Nk * d * 4 + NN * b + Tc * N * d * b + Tr * Nk * d * 4
    k5.sram_read = Tr * Nk * d * 4 + NN * b + Tc * N * d * b + Nk * d * 4
    k5.sram_peak = bc * d * 4 + br * bc * b + br * d * b
    return Counts([k1, k2, k3, k4, k5])


SCHEDULE = Schedule(NAME, SUMMARY, program, closed_form, default_tiles, working_set, shared_memory,
                    pass_="backward")
