"""FlashAttention-2 forward: Algorithm 1 of Dao, "FlashAttention-2: Faster Attention with Better
Parallelism and Work Partitioning" (2023).

    1  Tr = ceil(N / Br) blocks Q_i; Tc = ceil(N_kv / Bc) blocks K_j, V_j
    3  for i = 1..Tr:                                         Q blocks: one thread block each
    4      load Q_i from HBM to on-chip SRAM
    5      on chip: O_i = 0, l_i = 0, m_i = -inf
    6      for j = 1..Tc:                                     K/V blocks: the inner loop
    7          load K_j, V_j from HBM to SRAM
    8          S_ij = Q_i K_jᵀ
    9          m_new = max(m_i, rowmax(S_ij)); P~_ij = exp(S_ij - m_new); l_i = e^(m_i - m_new) l_i + rowsum(P~_ij)
    10         O_i = diag(e^(m_i - m_new)) O_i + P~_ij V_j
    12     O_i = diag(l_i)^-1 O_i
    13     L_i = m_i + log(l_i)
    14     write O_i to HBM
    15     write L_i (logsumexp, fp32) to HBM

O and the softmax statistics stay on chip; O is written once. With a causal mask only the K/V blocks that
hold a key visible to some row of Q_i are visited (j < n_i). A Q block that sees no key at all (causal with
seq_len > kv_len) writes O = 0 and L = -inf without loading Q_i, as FlashAttention-2's kernel exits early
(flash_fwd_kernel.h: ``if (n_block_max <= n_block_min)``).
"""

from __future__ import annotations

import numpy as np

from ..blocks import block_rows, cdiv, n_kv_blocks_visible, visit_sums
from ..counts import Counts, KernelCounts
from ..problem import STAT_BYTES, AttentionProblem
from .base import Schedule, Tiles
from .fit import shrink_to_fit

NAME = "flash2"
SUMMARY = "FlashAttention-2: Q outer loop, O and statistics on chip, O written once, causal block skipping"
STATS = ("lse",)

# FlashAttention-2's forward tiles (Br, Bc) by head dim: csrc/flash_attn/src/flash_fwd_launch_template.h,
# run_mha_fwd_hdim* for sm80/sm90 without dropout. The largest head dim <= the key is used.
FA2_TILES = {32: (128, 128), 64: (128, 128), 96: (128, 64), 128: (128, 64), 160: (128, 32),
             192: (128, 64), 224: (128, 32), 256: (128, 64)}


def default_tiles(p: AttentionProblem, profile) -> Tiles:
    """FA2's tiles for the head dim; on a GPU with less shared memory, halve Bc, then Br, until they fit."""
    Br, Bc = next((FA2_TILES[k] for k in sorted(FA2_TILES) if p.head_dim <= k), (64, 32))
    return shrink_to_fit(SCHEDULE, p, Br, Bc, profile)


def program(x, p: AttentionProblem, t: Tiles) -> None:
    """One head."""
    N, Nk = p.seq_len, p.kv_len
    Br, Bc = t.block_q, t.block_kv
    Tr = cdiv(N, Br)

    with x.kernel("flash2_fwd", grid=Tr):
        for i in range(Tr):  # line 3: one thread block per Q block
            with x.thread_block():
                q = block_rows(i, Br, N)
                n_i = n_kv_blocks_visible(i, Br, Bc, N, Nk, p.causal)
                if n_i == 0:  # causal: no row of this block sees a key
                    O_i, L_i = x.empty_output(q)
                    x.store("O", q, O_i)
                    x.store("lse", q, L_i)
                    continue
                Q_i = x.load("Q", q)  # line 4: stays in SRAM throughout
                O_i, l_i, m_i = x.init_state(q)  # line 5
                for j in x.order(range(n_i)):  # line 6
                    k = block_rows(j, Bc, Nk)
                    K_j = x.load("K", k)  # line 7
                    V_j = x.load("V", k)
                    S_ij = x.scores(Q_i, K_j, q, k)  # line 8
                    O_i, l_i, m_i = x.online_softmax(S_ij, V_j, O_i, l_i, m_i)  # lines 9-10
                O_i, L_i = x.finalize(O_i, l_i, m_i)  # lines 12-13
                x.store("O", q, O_i)  # line 14
                x.store("lse", q, L_i)  # line 15


def shared_memory(p: AttentionProblem, t: Tiles) -> int:
    """The part of the working set that lives in shared memory: the tiles loaded from global memory."""
    b, d = p.elem_bytes, p.head_dim
    br, bc = np.minimum(t.block_q, p.seq_len), np.minimum(t.block_kv, p.kv_len)
    return br * d * b + 2 * bc * d * b  # Q_i; K_j, V_j


def working_set(p: AttentionProblem, t: Tiles) -> int:
    """Bytes on chip at the end of a thread block (every buffer is live then): shared memory for Q_i, K_j,
    V_j; registers for the fp32 accumulator, the scores and the statistics."""
    b, d = p.elem_bytes, p.head_dim
    br, bc = np.minimum(t.block_q, p.seq_len), np.minimum(t.block_kv, p.kv_len)
    return (
        br * d * b  # Q_i (line 4)
        + br * d * 4  # O_i accumulator, fp32 (line 5)
        + 2 * br * STAT_BYTES  # l_i, m_i (line 5)
        + 2 * bc * d * b  # K_j, V_j (line 7)
        + br * bc * 4  # S_ij, then P~_ij in place (lines 8-9)
        + br * STAT_BYTES  # L_i (line 13)
    )


def closed_form(p: AttentionProblem, t: Tiles) -> Counts:
    """Counts for one head. rv = Σ_i br_i·n_i, cv = Σ_i Σ_{j<n_i} bc_j (key rows streamed), A = visited area,
    Nv = rows of the Q blocks that see a key; without causal rv = Tc·N, cv = Tr·N_kv, A = N·N_kv, Nv = N, so
    K and V are each read Tr times."""
    N, Nk, d, b, s = p.seq_len, p.kv_len, p.head_dim, p.elem_bytes, STAT_BYTES
    v = visit_sums(N, Nk, t.block_q, t.block_kv, p.causal)
    rv, cv, A, Nv = v.row_visits, v.col_visits, v.area, v.q_rows

    k = KernelCounts("flash2_fwd", grid=cdiv(N, t.block_q))
    k.global_read.update(Q=Nv * d * b, K=cv * d * b, V=cv * d * b)
    k.global_write.update(O=N * d * b, lse=N * s)
    k.flops.update(
        matmul=4 * A * d,
        exp=A + rv + Nv,  # P~; the rescale factor per row and step; log(l) at the end
        other=4 * A + (4 + d) * rv + Nv * (d + 2),
    )
    k.sram_write = Nv * d * b + 2 * cv * d * b + Nv * (4 * d + 8) + 8 * A + rv * (4 * d + 8) + N * (4 * d + 4)
    k.sram_read = rv * d * b + 2 * cv * d * b + 4 * A + rv * (4 * d + 8) + Nv * (4 * d + 8) + N * (4 * d + 4)
    k.sram_peak = working_set(p, t)
    return Counts([k])


SCHEDULE = Schedule(NAME, SUMMARY, program, closed_form, default_tiles, working_set, shared_memory, stats=STATS)
