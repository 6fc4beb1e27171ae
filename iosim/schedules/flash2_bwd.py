"""FlashAttention-2 backward: Algorithm 2 of Dao, "FlashAttention-2" (2023), as FlashAttention-2's kernels
run it (csrc/flash_attn/src/flash_bwd_*.h): a pre-pass, the main K/V-outer kernel, and a dQ conversion.

    4   D = rowsum(dO ∘ O) (N), write D to HBM                  kernel flash2_bwd_preprocess, which also
                                                                clears the fp32 dQ accumulator (dQacc = 0)
    5   for j = 1..Tc:                                          K/V blocks: one thread block each
    6       load K_j, V_j from HBM to on-chip SRAM
    7       on chip: dK_j = 0, dV_j = 0
    8       for i = 1..Tr (causal: only Q blocks that see a key of block j):
    9           load Q_i, dO_i, L_i, D_i from HBM to SRAM
    10          S_ij = tau Q_i K_jᵀ
    11          P_ij = exp(S_ij - L_i)                          (L = logsumexp written by the forward)
    12          dV_j += P_ijᵀ dO_i
    13          dP_ij = dO_i V_jᵀ
    14          dS_ij = P_ij ∘ (dP_ij - D_i)
    15          dQacc_i += tau dS_ij K_j                        atomic adds into the fp32 accumulator
    16          dK_j += tau dS_ijᵀ Q_i
    18      write dK_j, dV_j to HBM                             once
    20  dQ = dQacc in the problem dtype                         kernel flash2_bwd_convert_dq

Differences from the algorithm as printed, each what the kernel does: line 9 lists O_i and dQ_i, but O is
only needed for D, which line 4 precomputed, so the kernel does not load O_i; and dQ_i is not loaded and
stored by one thread block but accumulated by atomic adds of every K/V block's thread block into an fp32
buffer. **iosim counts each atomic add as a global read and a global write of the fp32 rows it updates**
(what crosses the SM <-> L2 boundary; the L2 performs the add). With a causal mask, only the Q blocks that
hold a row seeing a key of block j are visited (the same (i, j) pairs as the forward). tau is folded into dS.

Grouped-query heads (``group`` query heads per kv head), option ``gqa``, two designs:

* ``"expand"`` (default; FlashAttention-2, and so torch's SDPA flash backward): the program above runs per query
  head, each loading K_j, V_j itself and writing its own dK, dV copy; ``backward.group_sum`` sums the copies.
* ``"grouped"`` (iosim's kernel, kernels/flash_bwd.cu ``flash_bwd_kernel``): the program runs per kv head. The
  main kernel's thread block j loads K_j, V_j once, then runs lines 8-16 for each query head g of the group in
  turn, dK_j, dV_j accumulating over the whole group, and writes them once, already summed (line 18): no copies,
  no group-sum kernel. The preprocess and convert kernels stay per query head (their grids hold the group's).
  Query head g's rows of Q, O, dO, L, D, dQacc, dQ are g·N .. (g+1)·N of the program's tensors.

With group == 1 the two designs are the same program.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..blocks import Rows, block_rows, cdiv, n_kv_blocks_visible, visit_sums
from ..counts import Counts, KernelCounts
from ..problem import STAT_BYTES, AttentionProblem
from .base import Schedule, ScheduleError, Tiles
from .fit import shrink_to_fit

NAME = "flash2"
SUMMARY = "FlashAttention-2 backward (Alg. 2): D pre-pass, K/V outer, dQ by fp32 atomic adds, dK/dV written once"

# FlashAttention-2's backward tiles (Br, Bc) by head dim on sm80/sm90 (flash_bwd_launch_template.h,
# run_mha_bwd_hdim*, the configuration for GPUs with >= 144 KB of shared memory per block).
FA2_BWD_TILES = {32: (128, 128), 64: (128, 128), 96: (64, 128), 128: (64, 128), 160: (64, 64),
                 192: (64, 64), 224: (64, 64), 256: (64, 64)}


GQA = ("expand", "grouped")  # option gqa: FlashAttention-2's design (the default), iosim's kernel's


@dataclass(frozen=True)
class GroupedTiles(Tiles):
    """Tiles of the ``gqa="grouped"`` design (plain :class:`Tiles` are the default, ``"expand"``)."""

    gqa: str = "grouped"

    def describe_options(self) -> dict:
        return {"gqa": self.gqa}


def gqa_of(t: Tiles) -> str:
    return getattr(t, "gqa", "expand")


def unit_of(t: Tiles) -> str:
    """What one program run covers: a query head (expand), or a kv head with its group (grouped)."""
    return "kv_head" if gqa_of(t) == "grouped" else "head"


def default_tiles(p: AttentionProblem, profile) -> Tiles:
    """FA2's backward tiles for the head dim; where they do not fit, halve Bc, then Br, until they do."""
    Br, Bc = next((FA2_BWD_TILES[k] for k in sorted(FA2_BWD_TILES) if p.head_dim <= k), (64, 32))
    return shrink_to_fit(SCHEDULE, p, Br, Bc, profile)


def make_tiles(p: AttentionProblem, profile, block_q=None, block_kv=None, gqa=None) -> Tiles:
    """The tiles (given, or the default for what is not) in the design ``gqa`` (None: "expand")."""
    if gqa is not None and gqa not in GQA:
        raise ScheduleError(f"gqa={gqa!r}: expected 'expand' (FlashAttention-2: dK, dV per query head, summed by "
                            "a kernel) or 'grouped' (iosim's kernel: one program per kv head)")
    base = default_tiles(p, profile) if block_q is None or block_kv is None else None
    t = Tiles(block_q if block_q is not None else base.block_q, block_kv if block_kv is not None else base.block_kv)
    return GroupedTiles(t.block_q, t.block_kv) if gqa == "grouped" else t


def _heads(p: AttentionProblem, t: Tiles):
    """Query heads one program run holds: 1, or the kv head's group."""
    return p.group if gqa_of(t) == "grouped" else 1


def _head_rows(g: int, rows: Rows, N: int) -> Rows:
    """Query head g's rows ``rows`` in the program's tensors (head g at rows g·N .. (g+1)·N)."""
    return Rows(g * N + rows.start, g * N + rows.stop)


def _visiting(i_range, j, Br, Bc, N, Nk, causal):
    """Q blocks i that hold a row seeing a key of K/V block j."""
    return [i for i in i_range if j < n_kv_blocks_visible(i, Br, Bc, N, Nk, causal)]


def program(x, p: AttentionProblem, t: Tiles, main_kernel: str = "flash2_bwd") -> None:
    """One query head, or (gqa="grouped") one kv head with its group of query heads. ``main_kernel``: the name of
    the K/V-outer kernel (flash3's backward moves the same tiles in a kernel of its own)."""
    N, Nk = p.seq_len, p.kv_len
    Br, Bc = t.block_q, t.block_kv
    Tr, Tc, G = cdiv(N, Br), cdiv(Nk, Bc), _heads(p, t)

    with x.kernel("flash2_bwd_preprocess", grid=G * Tr):  # line 4
        for g in range(G):
            for i in range(Tr):
                with x.thread_block():
                    q = _head_rows(g, block_rows(i, Br, N), N)
                    dO_i = x.load("dO", q)
                    O_i = x.load("O", q)
                    x.store("D", q, x.rowdot(dO_i, O_i))  # D_i = rowsum(dO_i ∘ O_i)
                    x.fill("dQacc", q, 0.0)  # line 3: dQ = 0, here the fp32 accumulator

    with x.kernel(main_kernel, grid=Tc):  # line 5: one thread block per K/V block
        for j in range(Tc):
            with x.thread_block():
                k = block_rows(j, Bc, Nk)
                K_j = x.load("K", k)  # line 6
                V_j = x.load("V", k)
                dK_j = x.zeros_grad("dK", k)  # line 7
                dV_j = x.zeros_grad("dV", k)
                for g in range(G):  # grouped: every query head of the kv head, into the same dK_j, dV_j
                    for i in x.order(_visiting(range(Tr), j, Br, Bc, N, Nk, p.causal)):  # line 8
                        n = block_rows(i, Br, N)  # query positions (the causal mask)
                        q = _head_rows(g, n, N)  # head g's rows
                        Q_i = x.load("Q", q)  # line 9
                        dO_i = x.load("dO", q)
                        L_i = x.load("lse", q)
                        D_i = x.load("D", q)
                        S_ij = x.scores(Q_i, K_j, n, k)  # line 10
                        P_ij = x.recompute_probs(S_ij, L_i)  # line 11
                        dV_j = x.matmul_tn_acc(dV_j, P_ij, dO_i)  # line 12
                        dP_ij = x.dprobs(dO_i, V_j)  # line 13
                        dS_ij = x.dscores(P_ij, dP_ij, D_i)  # line 14
                        dQ_ij = x.matmul_nn_acc(x.zeros_grad("dQ", q), dS_ij, K_j)  # line 15: dS_ij K_j ...
                        x.atomic_add("dQacc", q, dQ_ij)  # ... added to dQ_i atomically
                        dK_j = x.matmul_tn_acc(dK_j, dS_ij, Q_i)  # line 16
                x.store("dK", k, dK_j)  # line 18
                x.store("dV", k, dV_j)

    with x.kernel("flash2_bwd_convert_dq", grid=G * Tr):  # dQ in the problem dtype
        for g in range(G):
            for i in range(Tr):
                with x.thread_block():
                    q = _head_rows(g, block_rows(i, Br, N), N)
                    x.store("dQ", q, x.load("dQacc", q))


def _sizes(p: AttentionProblem, t: Tiles) -> tuple[int, int, int, int]:
    return p.elem_bytes, p.head_dim, min(t.block_q, p.seq_len), min(t.block_kv, p.kv_len)


def shared_memory(p: AttentionProblem, t: Tiles) -> int:
    """The main kernel's loaded tiles: K_j, V_j (line 6); Q_i, dO_i, L_i, D_i (line 9)."""
    b, d, br, bc = _sizes(p, t)
    return 2 * bc * d * b + 2 * br * d * b + 2 * br * STAT_BYTES


def working_set(p: AttentionProblem, t: Tiles) -> int:
    """The main kernel's peak; beyond ``shared_memory``, in registers: the fp32 dK_j, dV_j accumulators,
    P (over S), dS (over dP) and the dQ increment of line 15."""
    _, d, br, bc = _sizes(p, t)
    return shared_memory(p, t) + 2 * bc * d * 4 + 2 * br * bc * 4 + br * d * 4


def closed_form(p: AttentionProblem, t: Tiles, main_kernel: str = "flash2_bwd") -> Counts:
    """Counts for one head over the visited pairs: rv = Σ br_i, cv = Σ bc_j, A = Σ br_i·bc_j (no causal:
    rv = Tc·N, cv = Tr·N_kv, A = N·N_kv). Grouped (one kv head): the G = group query heads' rows R = G·N, and
    every per-pair term G times (rv, cv, A over the group); K, V, dK, dV still once."""
    N, Nk, d, b, s = p.seq_len, p.kv_len, p.head_dim, p.elem_bytes, STAT_BYTES
    Br, Bc, G = t.block_q, t.block_kv, _heads(p, t)
    Tr, Tc = cdiv(N, Br), cdiv(Nk, Bc)
    v = visit_sums(N, Nk, Br, Bc, p.causal)
    R, rv, cv, A = G * N, G * v.row_visits, G * v.col_visits, G * v.area
    br = min(Br, N)

    k1 = KernelCounts("flash2_bwd_preprocess", grid=G * Tr)
    k1.global_read.update(dO=R * d * b, O=R * d * b)
    k1.global_write.update(D=R * s, dQacc=R * d * 4)
    k1.flops.update(other=2 * R * d)
    k1.sram_write = k1.sram_read = R * (2 * d * b + 4)
    k1.sram_peak = 2 * br * d * b + br * 4

    k2 = KernelCounts(main_kernel, grid=Tc)
    k2.global_read.update(K=Nk * d * b, V=Nk * d * b,  # line 6
                          Q=rv * d * b, dO=rv * d * b, lse=rv * s, D=rv * s,  # line 9
                          dQacc=rv * d * 4)  # line 15, the atomic's read
    k2.global_write.update(dQacc=rv * d * 4, dK=Nk * d * b, dV=Nk * d * b)  # lines 15, 18
    k2.flops.update(
        matmul=10 * A * d,  # S, dV, dP, dQ, dK
        exp=A,  # P recomputed
        other=5 * A + rv * d,  # scale, subtract L, dS (3), the atomic add
    )
    k2.sram_write = Nk * d * (8 + 2 * b) + rv * (2 * d * b + 8 + 8 * d) + 16 * A + 8 * cv * d
    k2.sram_read = rv * (4 * d * b + 8 + 8 * d) + cv * (3 * d * b + 8 * d) + 24 * A + 8 * Nk * d
    k2.sram_peak = working_set(p, t)

    k3 = KernelCounts("flash2_bwd_convert_dq", grid=G * Tr)
    k3.global_read.update(dQacc=R * d * 4)
    k3.global_write.update(dQ=R * d * b)
    k3.sram_write = k3.sram_read = R * d * 4
    k3.sram_peak = br * d * 4
    return Counts([k1, k2, k3])


SCHEDULE = Schedule(NAME, SUMMARY, program, closed_form, default_tiles, working_set, shared_memory,
                    pass_="backward", make_tiles=make_tiles, options=("gqa",), tile_unit=unit_of)
