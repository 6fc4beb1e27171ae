"""MLA decode: DeepSeek's multi-head latent attention with the up-projections absorbed, counted in closed form
(issue 28 item 3; simulated, no kernel). DeepSeek-V2 (arXiv 2405.04434) §2.1, DeepSeek-V3 (arXiv 2412.19437) §2.1.1.

Per token a layer caches a latent c_KV of ``latent`` = 512 values and a rotary key k_R of ``rope`` = 64, shared by
all ``heads`` = 128 query heads. In decode the key and value up-projections are absorbed (V2 §2.1.2): head h's query
is [q_nope,h W_UK,h ; q_rope,h] (576 values), every head's key is [c_KV ; k_R] and its value c_KV, so attention runs
on the latent as one kv head shared by 128 query heads, and each head's latent output goes through W_UV,h after:

    kernel mla_q_absorb       q_latent = q_nope W_UK        per head (rows x 128) x (128 x 512)   W_UK read once a call
    kernel mla_attention      a block per (sequence, 64 rows of heads x tokens): Q (576), then for each tile of
                              keys the latent tile (576 a key) once, S = Q K^T (576), P V (V = the tile's first 512)
                              O_latent (512) and lse written; the cache is read once per row block (``global``),
                              once in all (``hbm``: the row blocks of a sequence run side by side and share it in L2)
    kernel mla_o_absorb       o = O_latent W_UV             per head (rows x 512) x (512 x 128)   W_UV read once a call

With ``accumulator="global"`` the attention kernel is the design torch runs for these widths (its memory-efficient
kernel, xFormers' CUTLASS one, at values wider than its 128-key tile: ``fmha_cutlassF_..._gmem``): the block's
operands stream from global memory at every key tile, Q with them (its mainloop reads both operands of Q K^T), and
its output accumulator is kept in global memory in fp32, read back at every key tile after the first and written at
every one before the last (the last writes O in the input's type; no lse, which torch's inference call does not ask
for); :func:`iosim.timing.mla.reference` builds it.

Not in the schedule registry: its problem has keys of 576 and values of 512 values, which an AttentionProblem (one
head_dim) does not hold. FLOPs are the multiplies (2 per multiply-add) and one exp per score; split-KV partials are
left out (a split adds (512 + 1) fp32 values per row written and read back, as iosim's decode kernel's do).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ..blocks import cdiv
from ..counts import Counts, KernelCounts
from ..problem import ELEMENT_BYTES, STAT_BYTES
from .base import ScheduleError

NOPE = 128  # per-head query/key dims without rotary embedding (DeepSeek-V3: qk_nope_head_dim)
VALUE = 128  # per-head value dims (v_head_dim)
ACCUMULATORS = ("registers", "global")  # where the attention kernel keeps its output accumulator (MlaDecode)
ACCUMULATOR_BYTES = 4  # fp32


def check_fields(m, what: str, whole: tuple[str, ...]) -> None:
    """One error naming the field: each of ``whole`` a whole number >= 1, ``dtype`` one the counts know."""
    for name in whole:
        v = getattr(m, name)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ScheduleError(f"{what}: {name}={v!r}; expected a whole number >= 1")
    if m.dtype not in ELEMENT_BYTES:
        raise ScheduleError(f"{what}: dtype={m.dtype!r}; expected one of {list(ELEMENT_BYTES)}")


@dataclass(frozen=True)
class MlaDecode:
    """One decode step of one MLA layer: ``batch`` sequences of ``kv_len`` cached tokens, ``q_len`` new tokens each;
    DeepSeek-V3's shapes by default. ``block_q``: rows (heads x tokens) a thread block of the attention kernel takes
    (FlashMLA's 64); ``block_kv``: keys a tile; ``accumulator``: "registers" (FlashMLA's design) or "global" (the
    design torch runs: module docstring)."""

    batch: int
    kv_len: int
    q_len: int = 1
    heads: int = 128
    latent: int = 512
    rope: int = 64
    dtype: str = "bf16"
    block_q: int = 64
    block_kv: int = 64
    accumulator: Literal["registers", "global"] = "registers"

    def __post_init__(self):
        check_fields(self, "MLA decode", ("batch", "kv_len", "q_len", "heads", "latent", "rope", "block_q", "block_kv"))
        if self.accumulator not in ACCUMULATORS:
            raise ScheduleError(f"MLA decode: accumulator={self.accumulator!r}; expected one of {list(ACCUMULATORS)}")

    @property
    def key_dim(self) -> int:
        return self.latent + self.rope  # 576: what the cache holds per token, the key of every head

    @property
    def rows(self) -> int:
        return self.heads * self.q_len  # query rows of one sequence (every head shares the one latent kv head)


def counts(m: MlaDecode) -> Counts:
    """The three kernels' bytes at ``global`` and FLOPs, for the whole batch."""
    e, R, n, dk, dv = ELEMENT_BYTES[m.dtype], m.batch * m.rows, m.kv_len, m.key_dim, m.latent
    q = KernelCounts("mla_q_absorb", grid=m.heads)
    q.global_read.update(Q=R * NOPE * e, W_UK=m.heads * NOPE * m.latent * e)
    q.global_write.update(Q=R * m.latent * e)
    q.flops.update(matmul=2 * R * NOPE * m.latent)
    blocks = cdiv(m.rows, m.block_q)
    a = KernelCounts("mla_attention", grid=m.batch * blocks)
    if m.accumulator == "registers":
        a.global_read.update(Q=R * dk * e, K=m.batch * blocks * n * dk * e)  # the latent tile is K, and V is its 512
        a.global_write.update(O=R * dv * e, lse=R * STAT_BYTES)
    else:
        tiles = cdiv(n, m.block_kv)
        acc = R * dv * ACCUMULATOR_BYTES * (tiles - 1)  # fp32: written at every tile but the last, read at every but the first
        a.global_read.update(Q=R * dk * e * tiles, K=m.batch * blocks * n * dk * e, V=m.batch * blocks * n * dv * e,
                             O_accum=acc)
        a.global_write.update(O_accum=acc, O=R * dv * e)
    a.flops.update(matmul=2 * R * n * (dk + dv), exp=R * n)
    o = KernelCounts("mla_o_absorb", grid=m.heads)
    o.global_read.update(O=R * dv * e, W_UV=m.heads * m.latent * VALUE * e)
    o.global_write.update(O=R * VALUE * e)
    o.flops.update(matmul=2 * R * m.latent * VALUE)
    return Counts([q, a, o])


def dram(m: MlaDecode) -> list[tuple[int, int]]:
    """Each kernel's DRAM (read, write) bytes: every distinct byte once (the cache once a sequence, not once per
    row block; Q once). With the accumulator in global memory its fp32 scratch is left out: it stays in L2 where the
    resident blocks' accumulators and the cache tiles streaming past fit (one sequence: measured, 0.3-1.2 MB of its
    67 MB reach DRAM), and what spills where they do not is not modeled (docs/serving.md, MLA decode measured)."""
    c = counts(m).kernels
    e = ELEMENT_BYTES[m.dtype]
    cache = m.batch * m.kv_len * m.key_dim * e
    rows = m.batch * m.rows
    attention = (rows * m.key_dim * e + cache, rows * m.latent * e + (rows * STAT_BYTES if "lse" in c[1].global_write
                                                                       else 0))
    return [(c[0].global_read_bytes, c[0].global_write_bytes), attention,
            (c[2].global_read_bytes, c[2].global_write_bytes)]


def intensity(m: MlaDecode, attention_only: bool = True) -> float:
    """FLOPs per DRAM byte: of the attention kernel alone, or of the step's three kernels."""
    c, d = counts(m).kernels, dram(m)
    if attention_only:
        return c[1].total_flops / sum(d[1])
    return sum(k.total_flops for k in c) / sum(r + w for r, w in d)


def gqa_intensity(heads: int, kv_heads: int, head_dim: int, kv_len: int, q_len: int = 1, batch: int = 1,
                  dtype: str = "bf16") -> float:
    """The same figure for grouped-query decode (iosim's decode kernel's counts: Q, K, V once per kv head, O and
    lse written; FLOPs of QK^T and PV on every query row and key, one exp a score)."""
    e = ELEMENT_BYTES[dtype]
    rows = batch * heads * q_len
    read = rows * head_dim * e + 2 * batch * kv_heads * kv_len * head_dim * e
    write = rows * (head_dim * e + STAT_BYTES)
    flops = rows * kv_len * (4 * head_dim + 1)
    return flops / (read + write)
