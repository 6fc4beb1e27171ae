"""Flash-Decoding: split-KV attention for few queries against a long KV cache (Dao, Haziza, Massa, Sizov,
"Flash-Decoding for long-context inference", PyTorch blog, Oct 2023; FlashAttention-2 §3.2 and its
``flash_fwd_splitkv_kernel`` / ``flash_fwd_splitkv_combine_kernel``).

    1  split the keys/values into S chunks of whole K/V blocks (a view: nothing moves)
    2  for every (Q block i, split s), one thread block:                 kernel flash_decoding_split
           load Q_i; O = 0, l = 0, m = -inf on chip
           for the K/V blocks j of split s: load K_j, V_j; S_ij = Q_i K_jᵀ; online softmax (FA2 lines 8-10)
           write the split's normalized O_s (fp32) and its logsumexp L_s (fp32)
    3  for every block of combine_rows(d) rows, one thread block:        kernel flash_decoding_combine
           for s = 1..S: load L_s, O_s; merge (O, l, m) with weight exp(L_s - m)   (Milakov-Gimelshein ⊕)
           O = O / l; write O (problem dtype) and L = m + log l

The unit of work is one key/value head: its ``group`` query heads are packed as the rows of one Q matrix
(row r = n·group + g for query position n and head g of the group, FlashAttention-2's
``seqlenq_ngroups_swapped``), so K and V are read once per kv head and split, not once per query head.
With a causal mask row r is query position r // group. A split whose K/V blocks no row of Q_i sees writes
O_s = 0, L_s = -inf without loading anything (FA2's early exit). With one split, step 2 writes O and L
directly and step 3 does not run (as FlashAttention-2 does).

With ``kernel="iosim-decode"`` (``tiling="iosim"``) the program is iosim's decode kernel's instead, with ragged
lengths and a paged cache: :mod:`iosim.schedules.paged_decoding`, whose tiles (:class:`PagedDecodingTiles`) the
functions below hand it.

Splits: given, or FlashAttention-2's ``num_splits_heuristic`` (flash_api.cpp) on the profile's SM count:
none if the unsplit grid already fills 80% of the SMs, else the fewest splits whose wave efficiency is within
85% of the best, up to 128. The split count is then made effective: S' = ceil(Tc / ceil(Tc / S)) splits of
ceil(Tc / S) K/V blocks each, so no split is empty. A plain :class:`Tiles` (no ``splits``) means one split.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..blocks import Rows, block_rows, cdiv
from ..counts import Counts, KernelCounts
from ..problem import STAT_BYTES, AttentionProblem
from . import decode_layout, paged_decoding
from .base import Schedule, ScheduleError, Tiles
from .decode_layout import PagedDecodingTiles

NAME = "flash-decoding"
SUMMARY = "Flash-Decoding: K/V split across thread blocks, fp32 partial outputs merged by a second kernel"
STATS = ("lse",)
UNIT = "kv_head"  # the program runs one key/value head with its group of query heads packed as rows

MAX_SPLITS = 128  # FlashAttention-2 flash_api.cpp: num_splits_heuristic(..., 128)
BLOCK_Q = 64  # FlashAttention-2 split-KV kernel: kBlockM = 64
BLOCK_KV = {64: 256, 128: 128, 256: 64}  # kBlockN by head dim (run_mha_fwd_splitkv_dispatch)


def combine_rows(d: int) -> int:
    """Rows per thread block of the combine kernel: FA2's kBlockM = 4 if d % 128 == 0, 8 if d % 64 == 0, else 16
    (flash_fwd_launch_template.h, run_mha_fwd_splitkv_dispatch)."""
    return 4 if d % 128 == 0 else 8 if d % 64 == 0 else 16


@dataclass(frozen=True)
class DecodingTiles(Tiles):
    """Tiles plus the number of K/V splits (already effective: every split holds at least one block)."""

    splits: int = 1

    def describe_options(self) -> dict:
        return {"splits": self.splits}


def splits_of(t: Tiles) -> int:
    return getattr(t, "splits", 1)


def num_splits_heuristic(batch_nheads_mblocks: int, num_sms: int, num_n_blocks: int,
                         max_splits: int = MAX_SPLITS) -> int:
    """FlashAttention-2's choice of splits (flash_api.cpp), transcribed."""
    if batch_nheads_mblocks >= 0.8 * num_sms:
        return 1
    max_splits = min(max_splits, num_sms, num_n_blocks)

    def eligible(s: int) -> bool:  # a split count that changes the blocks per split
        return s == 1 or cdiv(num_n_blocks, s) != cdiv(num_n_blocks, s - 1)

    efficiency = []
    for s in range(1, max_splits + 1):
        if not eligible(s):
            efficiency.append(0.0)
            continue
        waves = batch_nheads_mblocks * s / num_sms
        efficiency.append(waves / np.ceil(waves))
    best = max(efficiency, default=0.0)
    for s in range(1, max_splits + 1):
        if eligible(s) and efficiency[s - 1] >= 0.85 * best:
            return s
    return 1


def _rows(p: AttentionProblem) -> int:
    """Packed query rows of one kv head."""
    return p.group * p.seq_len


def make_tiles(p: AttentionProblem, profile, block_q=None, block_kv=None, splits=None, tiling=None,
               **layout) -> DecodingTiles | PagedDecodingTiles:
    """FlashAttention-2's tiles (``tiling`` None or "fa2"), or iosim's decode kernel's ("iosim": ``layout``, its
    ``kv_lens``, ``page_size`` and ``kv_dtype``, describes the batch and its cache,
    :func:`iosim.schedules.decode_layout.make_tiles`; the kernel's tiles are fixed)."""
    if tiling == "iosim":
        if block_q is not None or block_kv is not None:
            raise ScheduleError(f"flash-decoding with iosim's decode kernel: block_q={block_q!r}, "
                                f"block_kv={block_kv!r}; the kernel's tiles are its own (rows in stripes of 16, "
                                "tiles of 16 keys): give neither")
        return decode_layout.make_tiles(p, splits=splits, **layout)
    if tiling not in (None, "fa2"):
        raise ScheduleError(f"flash-decoding: tiling={tiling!r}; expected 'fa2' or 'iosim'")
    if any(v is not None for v in layout.values()):
        raise ScheduleError("flash-decoding: kv_lens, page_size and kv_dtype describe a ragged batch, a paged cache "
                            "and an fp8 cache, which iosim's decode kernel takes: give kernel='iosim-decode' "
                            "(FlashAttention-2's split-KV program, the default, takes one kv_len and a contiguous cache "
                            "in the problem's dtype)")
    Br = block_q if block_q is not None else BLOCK_Q
    Bc = block_kv if block_kv is not None else next((BLOCK_KV[k] for k in sorted(BLOCK_KV) if p.head_dim <= k), 32)
    Tiles(Br, Bc)  # validates the sizes
    Tc = cdiv(p.kv_len, Bc)
    if splits is None:
        sms = profile.sm_count.value
        if sms is None:
            raise ScheduleError(f"flash-decoding: profile {profile.name!r} has no sm_count to choose the splits "
                                "from; give splits")
        splits = num_splits_heuristic(p.batch * p.kv_heads * cdiv(_rows(p), Br), int(sms), Tc)
    if not isinstance(splits, int) or isinstance(splits, bool) or splits < 1:
        raise ScheduleError(f"splits={splits!r}: expected a positive integer")
    per_split = cdiv(Tc, min(splits, Tc))
    return DecodingTiles(Br, Bc, splits=cdiv(Tc, per_split))


def default_tiles(p: AttentionProblem, profile) -> DecodingTiles:
    return make_tiles(p, profile)


def _n_visible(i, Br: int, Bc: int, p: AttentionProblem):
    """K/V blocks (from 0) that Q block ``i`` of packed rows must visit; works on arrays of ``i``."""
    Tc = cdiv(p.kv_len, Bc)
    if not p.causal:
        return Tc + 0 * i
    last_pos = (np.minimum((i + 1) * Br, _rows(p)) - 1) // p.group  # query position of the block's last row
    return cdiv(np.clip(last_pos + 1 + p.causal_offset, 0, p.kv_len), Bc)


def program(x, p: AttentionProblem, t: Tiles) -> None:
    """One kv head: its query heads packed as rows (iosim's decode kernel: the whole call)."""
    if isinstance(t, PagedDecodingTiles):
        return paged_decoding.program(x, p, t)
    R, Nk = _rows(p), p.kv_len
    Br, Bc, S = t.block_q, t.block_kv, splits_of(t)
    Tr, Tc = cdiv(R, Br), cdiv(Nk, Bc)
    per_split = cdiv(Tc, S)
    direct = S == 1  # one split: write O and L directly, no combine kernel

    with x.kernel("flash_decoding_split", grid=Tr * S):  # step 2
        for i in range(Tr):
            q = block_rows(i, Br, R)
            n_i = int(_n_visible(i, Br, Bc, p))
            for s in range(S):
                with x.thread_block():
                    out = q if direct else Rows(s * R + q.start, s * R + q.stop)  # split s's rows of O_s, L_s
                    blocks = range(s * per_split, min((s + 1) * per_split, n_i))
                    if not blocks:  # no row of Q_i sees a key of this split: early exit
                        O_s, L_s = x.empty_output(q)
                    else:
                        Q_i = x.load("Q", q)  # stays in SRAM for the split
                        O_s, l, m = x.init_state(q)
                        for j in x.order(blocks):
                            k = block_rows(j, Bc, Nk)
                            K_j = x.load("K", k)
                            V_j = x.load("V", k)
                            S_ij = x.scores(Q_i, K_j, q, k)
                            O_s, l, m = x.online_softmax(S_ij, V_j, O_s, l, m)
                        O_s, L_s = x.finalize(O_s, l, m)
                    x.store("O" if direct else "Opart", out, O_s)
                    x.store("lse" if direct else "lsepart", out, L_s)
    if direct:
        return

    Bm = combine_rows(p.head_dim)
    with x.kernel("flash_decoding_combine", grid=cdiv(R, Bm)):  # step 3, Bm rows per thread block
        for i in range(cdiv(R, Bm)):
            with x.thread_block():
                q = block_rows(i, Bm, R)
                O, l, m = x.init_state(q)
                for s in range(S):
                    part = Rows(s * R + q.start, s * R + q.stop)
                    L_s = x.load("lsepart", part)
                    O_s = x.load("Opart", part)
                    O, l, m = x.merge_partial(O, l, m, O_s, L_s)  # weight exp(L_s - m)
                O, L = x.finalize(O, l, m)
                x.store("O", q, O)
                x.store("lse", q, L)


def _sizes(p: AttentionProblem, t: Tiles) -> tuple[int, int, int, int]:
    return p.elem_bytes, p.head_dim, min(t.block_q, _rows(p)), min(t.block_kv, p.kv_len)


def shared_memory(p: AttentionProblem, t: Tiles) -> int:
    """The split kernel's loaded tiles: Q_i, K_j, V_j."""
    if isinstance(t, PagedDecodingTiles):
        return paged_decoding.shared_memory(p, t)
    b, d, br, bc = _sizes(p, t)
    return br * d * b + 2 * bc * d * b


def working_set(p: AttentionProblem, t: Tiles) -> int:
    """The split kernel's peak (as FlashAttention-2's forward): registers hold O, l, m, the scores and L."""
    if isinstance(t, PagedDecodingTiles):
        return paged_decoding.working_set(p, t)
    _, d, br, bc = _sizes(p, t)
    return shared_memory(p, t) + br * d * 4 + 2 * br * STAT_BYTES + br * bc * 4 + br * STAT_BYTES


def closed_form(p: AttentionProblem, t: Tiles) -> Counts:
    """Counts for one kv head. Over the Q blocks i of packed rows: n_i visible K/V blocks, E_i = ceil(n_i / per_split)
    splits that visit any (the rest exit early); rv = Σ br_i·n_i, cv = Σ min(n_i·Bc, N_kv), A = Σ br_i·cols_i,
    NE = Σ br_i·E_i (rows of the thread blocks that load Q and finalize). Without causal E_i = S."""
    if not isinstance(p, AttentionProblem):
        raise ScheduleError("flash-decoding: its closed form runs one problem at a time (no array sweeps); "
                            "use simulate() per point")
    if isinstance(t, PagedDecodingTiles):
        return paged_decoding.closed_form(p, t)
    R, Nk, d, b, st = _rows(p), p.kv_len, p.head_dim, p.elem_bytes, STAT_BYTES
    Br, Bc, S = t.block_q, t.block_kv, splits_of(t)
    Tr, Tc = cdiv(R, Br), cdiv(Nk, Bc)
    per_split = cdiv(Tc, S)
    i = np.arange(Tr, dtype=np.int64)
    br = np.minimum((i + 1) * Br, R) - i * Br
    n = np.asarray(_n_visible(i, Br, Bc, p), dtype=np.int64)
    cols = np.minimum(n * Bc, Nk)
    E = cdiv(n, per_split)
    rv, cv, A, NE = (int(x.sum()) for x in (br * n, cols, br * cols, br * E))
    SR = S * R  # rows of O_s, L_s over all splits

    k1 = KernelCounts("flash_decoding_split", grid=Tr * S)
    k1.global_read.update(Q=NE * d * b, K=cv * d * b, V=cv * d * b)
    if S == 1:
        k1.global_write.update(O=R * d * b, lse=R * st)
    else:
        k1.global_write.update(Opart=SR * d * 4, lsepart=SR * st)
    k1.flops.update(matmul=4 * A * d, exp=A + rv + NE, other=4 * A + (4 + d) * rv + NE * (d + 2))
    k1.sram_write = NE * d * b + 2 * cv * d * b + NE * (4 * d + 8) + 8 * A + rv * (4 * d + 8) + SR * (4 * d + 4)
    k1.sram_read = rv * d * b + 2 * cv * d * b + 4 * A + rv * (4 * d + 8) + NE * (4 * d + 8) + SR * (4 * d + 4)
    k1.sram_peak = working_set(p, t)
    if S == 1:
        return Counts([k1])

    Bm = combine_rows(d)
    k2 = KernelCounts("flash_decoding_combine", grid=cdiv(R, Bm))
    k2.global_read.update(Opart=SR * d * 4, lsepart=SR * st)
    k2.global_write.update(O=R * d * b, lse=R * st)
    k2.flops.update(exp=2 * SR + R, other=SR * (5 + 3 * d) + R * (d + 2))
    k2.sram_write = (R + SR) * (8 * d + 12)
    k2.sram_read = (R + SR) * (8 * d + 12)
    k2.sram_peak = min(Bm, R) * (8 * d + 16)
    return Counts([k1, k2])


def _unit(t: Tiles) -> str:
    return "call" if isinstance(t, PagedDecodingTiles) else UNIT


def _dram(p: AttentionProblem, t: Tiles, profile) -> list[tuple[int, int]] | None:
    if not isinstance(t, PagedDecodingTiles):
        return None
    return decode_layout.dram(p, t, decode_layout.dirty_room(profile))


SCHEDULE = Schedule(NAME, SUMMARY, program, closed_form, default_tiles, working_set, shared_memory, stats=STATS,
                    unit=UNIT, make_tiles=make_tiles, options=("splits", "kv_lens", "page_size", "kv_dtype", "tiling"),
                    tile_unit=_unit, dram=_dram, dram_model=decode_layout.DRAM_MODEL)
