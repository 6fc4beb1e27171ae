"""Standard attention: Algorithm 0 of the FlashAttention paper (Dao et al., 2022), as three kernels.

    1. load Q, K;     S = scale · Q Kᵀ;   write S          (S materialized in global memory, problem dtype)
    2. read S;        P = softmax(S);     write P          (fp32 arithmetic, problem-dtype storage)
    3. load P, V;     O = P V;            write O

Without tiles (the default) every GEMM reads each operand once, which is how the paper counts
"HBM accesses" (Theorem 2: Θ(Nd + N²)): b·(4Nd + 4N²) bytes per head when N = N_kv. With explicit tiles
(Br, Bc) the GEMMs are the tiled kernels a GPU runs: kernel 1 computes one Br×Bc tile of S per thread block
(Q re-read Tc times, K re-read Tr times), kernel 3 one Br×d tile of O per thread block (V re-read Tr times), and
S and P are stored as kernels/naive.cu stores them: each row at a pitch of N_kv rounded up to 16 bytes
(:func:`row_pitch`), its pad columns written and read with the row. The softmax kernel reads one row per thread
block. Untiled, the grids (used only by the time model) are those of 128×128 output tiles, as a GEMM library would
launch.
"""

from __future__ import annotations

import numpy as np

from ..blocks import Rows, block_rows, cdiv
from ..counts import Counts, KernelCounts
from ..problem import AttentionProblem
from .base import Schedule, Tiles

NAME = "naive"
SUMMARY = "standard attention (Alg. 0): S and P materialized in global memory"
STATS = ()


def default_tiles(p: AttentionProblem, profile) -> Tiles:
    return Tiles(None, None)


GEMM_TILE = 128  # output tile edge assumed for the grid of an untiled (library) GEMM
PITCH_BYTES = 16  # naive.cu's rows of S and P: a multiple of its 16-byte accesses


def row_pitch(kv_len: int, elem_bytes: int) -> int:
    """Elements a row of S and P takes in global memory in kernels/naive.cu (its ``row_pitch``): kv_len rounded up
    to a multiple of 16 bytes, so every row is aligned for 16-byte accesses."""
    per = max(1, PITCH_BYTES // elem_bytes)
    return cdiv(kv_len, per) * per


def pitch_of(p: AttentionProblem, t: Tiles) -> int:
    """The row pitch the counts use: naive.cu's with tiles, the paper's N_kv without."""
    return p.kv_len if t.block_q is None else row_pitch(p.kv_len, p.elem_bytes)


def _tiles(p: AttentionProblem, t: Tiles) -> tuple[int, int]:
    return (p.seq_len, p.kv_len) if t.block_q is None else (t.block_q, t.block_kv)


def _grids(p: AttentionProblem, t: Tiles) -> tuple[int, int, int]:
    """Thread blocks of the three kernels, per head."""
    Br, Bc = (GEMM_TILE, GEMM_TILE) if t.block_q is None else (t.block_q, t.block_kv)
    Tr, Tc = cdiv(p.seq_len, Br), cdiv(p.kv_len, Bc)
    return Tr * Tc, p.seq_len, Tr


def program(x, p: AttentionProblem, t: Tiles) -> None:
    """One head."""
    N, Nk = p.seq_len, p.kv_len
    Br, Bc = _tiles(p, t)
    Tr, Tc = cdiv(N, Br), cdiv(Nk, Bc)
    grid_scores, grid_softmax, grid_pv = _grids(p, t)
    pitch = pitch_of(p, t)

    def pad(cols: Rows) -> int:
        """Pad columns an access of S or P moves past ``cols``: a row's, with its last columns."""
        return pitch - Nk if cols.stop == Nk else 0

    with x.kernel("naive_scores", grid=grid_scores):  # Alg. 0 line 1
        for i in range(Tr):
            for j in range(Tc):
                with x.thread_block():
                    q, k = block_rows(i, Br, N), block_rows(j, Bc, Nk)
                    Q_i = x.load("Q", q)
                    K_j = x.load("K", k)
                    S_ij = x.scores(Q_i, K_j, q, k)  # scale · Q_i K_jᵀ, causal mask applied
                    x.store("S", q, S_ij, k, pad=pad(k))

    all_keys = Rows(0, Nk)
    with x.kernel("naive_softmax", grid=grid_softmax):  # Alg. 0 line 2
        for r in range(N):
            with x.thread_block():
                row = Rows(r, r + 1)
                S_r = x.load("S", row, all_keys, pad=pad(all_keys))
                P_r = x.row_softmax(S_r, row)
                x.store("P", row, P_r, all_keys, pad=pad(all_keys))

    with x.kernel("naive_pv", grid=grid_pv):  # Alg. 0 line 3
        for i in range(Tr):
            with x.thread_block():
                q = block_rows(i, Br, N)
                O_i = x.zeros_acc(q)
                for j in range(Tc):
                    k = block_rows(j, Bc, Nk)
                    P_ij = x.load("P", q, k, pad=pad(k))
                    V_j = x.load("V", k)
                    O_i = x.matmul_acc(O_i, P_ij, V_j)  # O_i += P_ij V_j
                x.store("O", q, O_i)


def shared_memory(p: AttentionProblem, t: Tiles) -> int | None:
    """Shared-memory part of the tiled GEMMs' working set: the operand tiles (None when not tiled)."""
    if t.block_q is None:
        return None
    b, d = p.elem_bytes, p.head_dim
    br, bc = np.minimum(t.block_q, p.seq_len), np.minimum(t.block_kv, p.kv_len)
    return np.maximum((br + bc) * d * b, br * bc * b + bc * d * b)  # Q_i, K_j | P_ij, V_j


def working_set(p: AttentionProblem, t: Tiles) -> int | None:
    """On-chip bytes one thread block of the tiled GEMM kernels needs (None when not tiled)."""
    if t.block_q is None:
        return None
    b, d = p.elem_bytes, p.head_dim
    br, bc = np.minimum(t.block_q, p.seq_len), np.minimum(t.block_kv, p.kv_len)
    scores_kernel = (
        br * d * b  # Q_i
        + bc * d * b  # K_j
        + br * bc * 4  # S_ij, fp32
    )
    pv_kernel = (
        br * d * 4  # O_i accumulator, fp32
        + br * bc * b  # P_ij
        + bc * d * b  # V_j
    )
    return np.maximum(scores_kernel, pv_kernel)


def closed_form(p: AttentionProblem, t: Tiles) -> Counts:
    """Counts for one head, derived from the three kernels above."""
    N, Nk, d, b = p.seq_len, p.kv_len, p.head_dim, p.elem_bytes
    Br, Bc = _tiles(p, t)
    Tr, Tc = cdiv(N, Br), cdiv(Nk, Bc)
    NN, stored = N * Nk, N * pitch_of(p, t)  # scores; elements of S (and of P) in global memory
    br, bc = np.minimum(Br, N), np.minimum(Bc, Nk)
    grid_scores, grid_softmax, grid_pv = _grids(p, t)

    k1 = KernelCounts("naive_scores", grid=grid_scores)
    k1.global_read.update(Q=Tc * N * d * b, K=Tr * Nk * d * b)
    k1.global_write.update(S=stored * b)
    k1.flops.update(matmul=2 * NN * d, other=NN)
    k1.sram_write = Tc * N * d * b + Tr * Nk * d * b + NN * 4
    k1.sram_read = Tc * N * d * b + Tr * Nk * d * b + NN * 4
    k1.sram_peak = (br + bc) * d * b + 4 * br * bc

    k2 = KernelCounts("naive_softmax", grid=grid_softmax)
    k2.global_read.update(S=stored * b)
    k2.global_write.update(P=stored * b)
    k2.flops.update(exp=NN, other=4 * NN)
    k2.sram_write = NN * b + NN * 4
    k2.sram_read = NN * b + NN * 4
    k2.sram_peak = Nk * (b + 4)

    k3 = KernelCounts("naive_pv", grid=grid_pv)
    k3.global_read.update(P=stored * b, V=Tr * Nk * d * b)
    k3.global_write.update(O=N * d * b)
    k3.flops.update(matmul=2 * NN * d)
    k3.sram_write = N * d * 4 + NN * b + Tr * Nk * d * b + Tc * N * d * 4
    k3.sram_read = Tc * N * d * 4 + NN * b + Tr * Nk * d * b + N * d * 4
    k3.sram_peak = br * d * 4 + br * bc * b + bc * d * b
    return Counts([k1, k2, k3])


SCHEDULE = Schedule(NAME, SUMMARY, program, closed_form, default_tiles, working_set, shared_memory, stats=STATS)
