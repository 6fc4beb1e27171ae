"""MLA prefill: DeepSeek's multi-head latent attention on a chunk of new tokens, counted in closed form (issue 28
item 3; no kernel of ours: torch's run of it is measured against these counts by benchmarks/mla_prefill_record.py).
DeepSeek-V2 (arXiv 2405.04434) §2.1.2-2.1.3, DeepSeek-V3 (arXiv 2412.19437) §2.1.1.

In prefill the up-projections are not absorbed (absorption pays where one query row meets many cached keys, in
decode: :mod:`iosim.schedules.mla_decode`). The cache holds per token a latent c_KV of ``latent`` = 512 values and a
rotary key k_R of ``rope`` = 64; the chunk's keys and values are expanded from it per head, and attention runs as
multi-head attention with keys of NOPE + rope = 192 values and values of VALUE = 128:

    kernel mla_kv_up     K_nope = c_KV W_UK, V = c_KV W_UV   (keys x 512) x (512 x heads*128), twice; K = [K_nope ;
                         k_R] written per head (k_R copied to every head), V written; W_UK, W_UV read once a call
    kernel mla_attention FlashAttention-2's tile program (Q tiles outer, K/V tiles streamed, causal bottom-right)
                         on queries of 192 values, keys of 192 and values of 128: Q once per Q tile that sees a key,
                         K and V once per (Q tile, K/V tile) visited, O (128 a row) and lse written once

``expansion="gemm+cat"`` is the design torch runs it with (and vLLM's MLA prefill): one GEMM c_KV · [W_UK | W_UV]
writes K_nope and V side by side, 256 values a head, a copy then writes K = [K_nope ; k_R] (k_R read once a token
and broadcast over the heads), and the attention reads V where the GEMM left it (rows of 128 values, 256 apart):

    kernel mla_kv_up     [K_nope | V] = c_KV [W_UK | W_UV]; W_UK, W_UV read once a call
    kernel mla_k_cat     K = [K_nope ; k_R] per head: K_nope read, k_R once a head at ``global`` (once at DRAM)
    kernel mla_attention as above

``kv_len`` is the keys a chunk's queries see (the cached prefix and the chunk itself: chunked prefill; equal to
``seq_len`` for a first prefill). FLOPs are the multiplies (2 per multiply-add) and one exp per visited score; DRAM
is every distinct byte once (K and V of a head stay in L2 while its Q tiles run), every byte written once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ..blocks import cdiv, visit_sums
from ..counts import Counts, KernelCounts
from ..problem import ELEMENT_BYTES, STAT_BYTES
from .base import ScheduleError
from .mla_decode import NOPE, VALUE, check_fields

EXPANSIONS = ("fused", "gemm+cat")  # one kernel writing K and V (the schedule's), or torch's GEMM then a copy


@dataclass(frozen=True)
class MlaPrefill:
    """``batch`` sequences, each a chunk of ``seq_len`` new tokens whose queries see ``kv_len`` keys (the cached
    prefix and the chunk), causal bottom-right; DeepSeek-V3's shapes by default; tiles of the attention kernel."""

    batch: int
    seq_len: int
    kv_len: int
    heads: int = 128
    latent: int = 512
    rope: int = 64
    dtype: str = "bf16"
    block_q: int = 128
    block_kv: int = 128
    causal: bool = True
    expansion: Literal["fused", "gemm+cat"] = "fused"

    def __post_init__(self):
        check_fields(self, "MLA prefill", ("batch", "seq_len", "kv_len", "heads", "latent", "rope", "block_q",
                                           "block_kv"))
        if self.kv_len < self.seq_len:
            raise ScheduleError(f"MLA prefill: kv_len={self.kv_len} < seq_len={self.seq_len}; a chunk's queries see "
                                "the cached prefix and the chunk itself (kv_len >= seq_len)")
        if not isinstance(self.causal, bool):
            raise ScheduleError(f"MLA prefill: causal={self.causal!r}; expected True or False")
        if self.expansion not in EXPANSIONS:
            raise ScheduleError(f"MLA prefill: expansion={self.expansion!r}; expected one of {list(EXPANSIONS)}")

    @property
    def key_dim(self) -> int:
        return NOPE + self.rope  # 192: a query's and a key's values per head


def expansion_counts(m: MlaPrefill) -> list[KernelCounts]:
    """The kernels that expand the keys' and values' rows from the latent cache: ``mla_kv_up`` (fused), or
    ``mla_kv_up`` and ``mla_k_cat`` (gemm+cat); bytes at ``global`` and FLOPs, for the whole batch."""
    e, B, H, Nk = ELEMENT_BYTES[m.dtype], m.batch, m.heads, m.kv_len
    grid = B * cdiv(Nk, m.block_kv) * H  # a block per block_kv keys of one head: its 256 columns of the GEMM
    up = KernelCounts("mla_kv_up", grid=grid)
    up.global_read.update(c_KV=B * Nk * m.latent * e, W_UK=m.latent * H * NOPE * e, W_UV=m.latent * H * VALUE * e)
    up.flops.update(matmul=2 * B * Nk * m.latent * H * (NOPE + VALUE))
    if m.expansion == "fused":
        up.global_read.update(k_R=B * Nk * m.rope * e)
        up.global_write.update(K=B * Nk * H * m.key_dim * e, V=B * Nk * H * VALUE * e)
        return [up]
    up.global_write.update(K_nope=B * Nk * H * NOPE * e, V=B * Nk * H * VALUE * e)
    cat = KernelCounts("mla_k_cat", grid=grid)
    cat.global_read.update(K_nope=B * Nk * H * NOPE * e, k_R=B * Nk * H * m.rope * e)  # k_R at every head
    cat.global_write.update(K=B * Nk * H * m.key_dim * e)
    return [up, cat]


def counts(m: MlaPrefill) -> Counts:
    """The kernels' bytes at ``global`` and FLOPs, for the whole batch: the expansion's (:func:`expansion_counts`),
    then ``mla_attention``."""
    e, B, H, N, Nk, dk = ELEMENT_BYTES[m.dtype], m.batch, m.heads, m.seq_len, m.kv_len, m.key_dim
    v = visit_sums(N, Nk, m.block_q, m.block_kv, m.causal)
    heads = B * H
    a = KernelCounts("mla_attention", grid=heads * cdiv(N, m.block_q))
    a.global_read.update(Q=heads * v.q_rows * dk * e, K=heads * v.col_visits * dk * e,
                         V=heads * v.col_visits * VALUE * e)
    a.global_write.update(O=heads * N * VALUE * e, lse=heads * N * STAT_BYTES)
    a.flops.update(matmul=2 * heads * v.area * (dk + VALUE), exp=heads * v.area)
    return Counts([*expansion_counts(m), a])


def dram(m: MlaPrefill) -> list[tuple[int, int]]:
    """Each kernel's DRAM (read, write) bytes: every distinct byte once (the attention kernel's Q, K and V once, not
    once per tile; the copy's k_R once a token, not once a head), every byte written once."""
    *expand, a = counts(m).kernels
    e, rows = ELEMENT_BYTES[m.dtype], m.batch * m.heads
    out = []
    for k in expand:
        read = k.global_read_bytes
        if k.name == "mla_k_cat":
            read -= (m.heads - 1) * m.batch * m.kv_len * m.rope * e
        out.append((read, k.global_write_bytes))
    read = rows * (m.seq_len * m.key_dim + m.kv_len * (m.key_dim + VALUE)) * e
    return [*out, (read, a.global_write_bytes)]


def intensity(m: MlaPrefill, attention_only: bool = True) -> float:
    """FLOPs per DRAM byte: of the attention kernel alone, or of every kernel."""
    c, d = counts(m).kernels, dram(m)
    if attention_only:
        return c[-1].total_flops / sum(d[-1])
    return sum(k.total_flops for k in c) / sum(r + w for r, w in d)


def gqa_intensity(heads: int, kv_heads: int, head_dim: int, seq_len: int, causal: bool = True, batch: int = 1,
                  dtype: str = "bf16", block: int = 128) -> float:
    """The same figure for a grouped-query prefill of ``seq_len`` tokens: FLOPs of QK^T and PV and one exp on the
    visited tiles' scores (FA2's tile program, ``block`` x ``block``), over Q, K, V and O once and lse."""
    e, v = ELEMENT_BYTES[dtype], visit_sums(seq_len, seq_len, block, block, causal)
    flops = batch * heads * v.area * (4 * head_dim + 1)
    bytes_ = batch * (2 * seq_len * heads * head_dim * e + 2 * seq_len * kv_heads * head_dim * e
                      + seq_len * heads * STAT_BYTES)
    return flops / bytes_
