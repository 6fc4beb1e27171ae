"""Flash-Decoding as iosim's decode kernel runs it (``kernels/flash_decode.cu``): the tile program of a whole call
and its closed form, counted load by load as the kernel issues them. The tiling and the batch's layout (ragged
lengths, a paged cache) are :mod:`iosim.schedules.decode_layout`'s; ``simulate("flash-decoding", ...,
kernel="iosim-decode")`` runs this program instead of FlashAttention-2's (:mod:`iosim.schedules.flash_decoding`).

    kernel flash_decode_split, grid (row blocks, splits, batch · kv_heads), 4 warps a block:
        every thread loads n_b = seqlens_k[b]; a split with no key of its sequence exits
            (one split and n_b = 0: it writes O = 0, lse = -inf)
        (fp8 cache) every thread loads its kv head's k_scale and v_scale
        load Q_i: the block's packed rows (rows past M are zero-filled, not read)
        warp w, for the 16-key tiles w, w + 4, ... of the split:
            (paged) the tile's physical page, from the block table read 32 tiles at a time (lane l reads tile
                32 m + l's entry, a batch ahead of its use; lanes that read one entry count once)
            load K_j, V_j: the tile's keys below n_b (the rest zero-filled, not read), in the cache's dtype
            (fp8: converted to fp16 on chip, K's fragments from the ring and V through a warp's fp16 tile; the
            descaling is folded into the softmax scale and the output: no FLOP counted, as flash3's fp8 program)
            S = Q_i K_jᵀ on whole stripes of 16 rows x 16 keys; online softmax (FA2 lines 8-10); O += P V_j
        the 4 warps' (O, l, m) merge by the log-sum-exp rule; O /= l
        one split: write O (dtype) and lse; several: this split's O_s (fp32) and lse_s
    kernel flash_decode_combine (splits > 1), a warp per output row (b, token, head), 4 rows a block:
        every lane loads n_b
        a row that sees a key: for each of the ns = ceil(n_b / chunk) splits every lane loads lse_s, and O_s
            (d / 32 floats a lane); the online merge (a running maximum)
        write O (dtype) and lse

**What `global` counts** is what the load and store instructions move, thread by thread, as Nsight Compute's
``smsp__sass_data_bytes_mem_global`` counters do (docs/validation.md): Q, K, V, O and the partials are 16-, 8- or
4-byte vectors of distinct elements, so their bytes are the elements'; a value every lane of a warp loads from one
address (the length, the fp8 scales, a split's lse in the combine) counts once per warp: the
counter counts a warp's load of one address once (measured: ``benchmarks/decode_bytes_record.py``, every kernel
exact on the H100 and the H200). At L2 each of those is one 32-byte sector (``hbm``:
:func:`iosim.schedules.decode_layout.dram`).

FLOPs are those executed: the matrix multiplies on whole 16-row stripes and 16-key tiles (padding rows and keys
past n_b included); the softmax per tile as FA2's; the warps' merge; the combine as the online merge of the splits.
"""

from __future__ import annotations

import numpy as np

from ..blocks import Rows, block_rows, cdiv
from ..counts import Counts, KernelCounts
from ..problem import STAT_BYTES, AttentionProblem
from .decode_layout import (
    ROW_SCALE_BYTES,
    TABLE_BATCH,
    TILE_KEYS,
    WARPS,
    PagedDecodingTiles,
    stages,
    table_bytes,
    table_entries,
)

SPLIT, COMBINE = "flash_decode_split", "flash_decode_combine"


def program(x, p: AttentionProblem, t: PagedDecodingTiles) -> None:
    """The whole call (unit "call": sequences differ), blocks in the kernel's launch order."""
    M, Br = p.group * p.seq_len, t.block_q
    RB, S = cdiv(M, Br), t.splits
    with x.kernel(SPLIT, grid=RB * S * p.batch * p.kv_heads):
        for b in range(p.batch):
            for hk in range(p.kv_heads):
                for s in range(S):
                    for rb in range(RB):
                        with x.thread_block():
                            _split_block(x, p, t, (b, hk, s, rb))
    if S == 1:
        return
    rows = p.batch * p.seq_len * p.heads
    with x.kernel(COMBINE, grid=cdiv(rows, WARPS)):
        for blk in range(cdiv(rows, WARPS)):
            with x.thread_block():
                for row in range(blk * WARPS, min(rows, (blk + 1) * WARPS)):
                    _combine_row(x, p, t, row)


def _split_block(x, p: AttentionProblem, t: PagedDecodingTiles, where: tuple[int, int, int, int]) -> None:
    """One thread block of the split kernel: split s of sequence b, kv head hk, row block rb."""
    b, hk, s, rb = where
    n, M, Br, S = t.kv_lens[b], p.group * p.seq_len, t.block_q, t.splits
    x.broadcast("seqlens_k", Rows(b, b + 1), WARPS)  # every thread reads its sequence's length: once a warp
    r = block_rows(rb, Br, M)
    q = Rows((b * p.kv_heads + hk) * M + r.start, (b * p.kv_heads + hk) * M + r.stop)  # rows of Q, O, lse
    k0, k1 = s * t.chunk, min(n, (s + 1) * t.chunk)
    if k0 >= k1:  # no key of this sequence in the split: exit (a lone split writes O = 0, lse = -inf)
        if S == 1:
            O, L = x.empty_output(q)
            x.store("O", q, O)
            x.store("lse", q, L)
        return
    if t.kv_dtype:  # every thread loads its kv head's two scales
        x.broadcast("k_scale", Rows(hk, hk + 1), WARPS)
        x.broadcast("v_scale", Rows(hk, hk + 1), WARPS)
    Q_i = x.load("Q", q)
    pad = Rows(0, Br)  # the multiplies run on whole stripes of 16 rows
    page = t.page_size if t.paged else p.kv_len  # a contiguous cache is one page per sequence
    states = []
    for w in range(WARPS):  # warp w: tiles w, w + 4, ... of the split, its own (O, l, m)
        O, l, m = x.init_state(pad)
        batches = table_entries(k0, k1, w, page) if t.paged else []
        for i in x.order(list(range(w, cdiv(k1 - k0, TILE_KEYS), WARPS))):
            tok = k0 + i * TILE_KEYS
            if t.paged and (i // WARPS) % TABLE_BATCH == 0:  # a batch's pages: a lane a tile, one load each address
                for e in batches[(i // WARPS) // TABLE_BATCH]:
                    x.load("block_table", Rows(b * t.max_pages + e, b * t.max_pages + e + 1))
            first = ((hk * p.batch + b) * cdiv(p.kv_len, page) + tok // page) * page + tok % page
            kv = Rows(first, first + min(TILE_KEYS, n - tok))  # keys past n_b: zero-filled, not read
            K_j, V_j = x.load("K", kv, dtype=t.kv_dtype), x.load("V", kv, dtype=t.kv_dtype)
            S_ij = x.scores(Q_i, K_j, pad, Rows(0, TILE_KEYS))
            O, l, m = x.online_softmax(S_ij, V_j, O, l, m)
        states.append((O, l, m))
    O, l, m = states[0]
    for state in states[1:]:  # the warps' states meet in shared memory
        O, l, m = x.merge_state(O, l, m, *state)
    O, L = x.finalize(O, l, m)
    if S == 1:
        x.store("O", q, O)
        x.store("lse", q, L)
    else:  # split-major rows here; the kernel's (row, split) layout moves the same bytes
        part = Rows(s * p.batch * p.kv_heads * M + q.start, s * p.batch * p.kv_heads * M + q.stop)
        x.store("Opart", part, O)
        x.store("lsepart", part, L)


def _combine_row(x, p: AttentionProblem, t: PagedDecodingTiles, row: int) -> None:
    """One warp of the combine kernel: output row (b, token i, head h)."""
    L, H, G = p.seq_len, p.heads, p.group
    b, i, h = row // (L * H), (row // H) % L, row % H
    n = t.kv_lens[b]
    x.broadcast("seqlens_k", Rows(b, b + 1), 1)
    ns = t.active_splits(n)
    pr = (b * p.kv_heads + h // G) * G * L + i * G + h % G  # its packed row
    R = p.batch * p.kv_heads * G * L
    O, l, m = x.init_state(Rows(0, 1))
    if ns and i >= L - n:  # the row sees a key (else every lse_s is -inf: O = 0, lse = -inf)
        for s in range(ns):
            L_s = x.broadcast("lsepart", Rows(s * R + pr, s * R + pr + 1), 1)  # every lane reads lse_s
            O_s = x.load("Opart", Rows(s * R + pr, s * R + pr + 1))
            O, l, m = x.merge_partial(O, l, m, O_s, L_s)
    O, lse = x.finalize(O, l, m)
    x.store("O", Rows(pr, pr + 1), O)
    x.store("lse", Rows(pr, pr + 1), lse)


# -- the closed form ------------------------------------------------------------------------------------------------


def shared_memory(p: AttentionProblem, t: PagedDecodingTiles) -> int:
    """The split kernel's shared memory: Q_i and each warp's ring of stages(d) K and V tiles (fp8: and the warp's
    fp16 V tile, and 128 bytes of Q_i's row factors)."""
    d, e, kv = p.head_dim, p.elem_bytes, t.kv_bytes(p)
    fp8 = WARPS * TILE_KEYS * d * e + ROW_SCALE_BYTES if kv != e else 0  # the fp16 V tiles, Q_i's row factors
    return t.block_q * d * e + WARPS * stages(d) * 2 * TILE_KEYS * d * kv + fp8


def working_set(p: AttentionProblem, t: PagedDecodingTiles) -> int:
    """Shared memory, and the registers of the 4 warps' (O, l, m), a tile of scores each and the lse."""
    Br, d = t.block_q, p.head_dim
    return shared_memory(p, t) + WARPS * (Br * d * 4 + 2 * Br * STAT_BYTES + Br * TILE_KEYS * 4) + Br * STAT_BYTES + 8


def closed_form(p: AttentionProblem, t: PagedDecodingTiles) -> Counts:
    """The program's counts as formulas, once per distinct sequence length (docs/schedules/flash-decoding.md)."""
    k1 = KernelCounts(SPLIT, grid=cdiv(p.group * p.seq_len, t.block_q) * t.splits * p.batch * p.kv_heads)
    k2 = KernelCounts(COMBINE, grid=cdiv(p.batch * p.seq_len * p.heads, WARPS))
    lens, mult = np.unique(np.asarray(t.kv_lens, dtype=np.int64), return_counts=True)
    for n, c in zip(lens.tolist(), mult.tolist(), strict=True):
        _add(k1, _split_counts(p, t, n), c * p.kv_heads)
        if t.splits > 1:
            _add(k2, _combine_counts(p, t, n), c)
    k1.sram_peak = working_set(p, t)
    k2.sram_peak = WARPS * (8 * p.head_dim + 20)
    return Counts([k1, k2] if t.splits > 1 else [k1])


def _add(k: KernelCounts, part: dict, times: int) -> None:
    for key, v in part.items():
        if key in ("sram_read", "sram_write"):
            setattr(k, key, getattr(k, key) + times * v)
        else:
            group, tensor = key.split(":")
            getattr(k, group)[tensor] += times * v


def _split_counts(p: AttentionProblem, t: PagedDecodingTiles, n: int) -> dict:
    """The split kernel's counts for one kv head of a sequence of n keys."""
    d, e, M, Br, S = p.head_dim, p.elem_bytes, p.group * p.seq_len, t.block_q, t.splits
    kv = t.kv_bytes(p)
    RB = cdiv(M, Br)
    A = t.active_splits(n) if n else 0  # blocks per row block that hold keys
    T = cdiv(n, TILE_KEYS)  # tiles over the splits (chunks are whole tiles)
    st = STAT_BYTES
    O, lm = Br * d * 4, 2 * Br * st  # a state's O and its l, m
    c = {"global_read:seqlens_k": 4 * WARPS * RB * S, "global_read:Q": A * M * d * e,
         "global_read:K": RB * n * d * kv, "global_read:V": RB * n * d * kv}
    if t.paged:  # each split's warps' batches of 32 tiles, a load an address (table_bytes)
        c["global_read:block_table"] = RB * sum(table_bytes(s * t.chunk, min(n, (s + 1) * t.chunk), t.page_size)
                                                for s in range(A))
    if t.kv_dtype:
        c["global_read:k_scale"] = c["global_read:v_scale"] = 4 * WARPS * RB * A
    # per tile: scores (S tile 16 x Br), online softmax (FA2 lines 8-10 on the padded tile)
    c["flops:matmul"] = RB * T * 4 * Br * TILE_KEYS * d
    c["flops:exp"] = RB * T * (TILE_KEYS * Br + Br) + RB * A * ((WARPS - 1) * 2 * Br + Br)
    c["flops:other"] = (RB * T * (4 * TILE_KEYS * Br + 4 * Br + Br * d)
                        + RB * A * ((WARPS - 1) * (6 * Br + 3 * Br * d) + 2 * Br + Br * d))
    tiles_w = RB * (T * (2 * 64 * Br + O + lm) + 2 * n * d * kv) + c.get("global_read:block_table", 0)
    blocks_w = (4 * RB * S + A * M * d * e + RB * A * (WARPS * (O + lm) + (WARPS - 1) * (O + lm) + O + Br * st)
                + (2 * st * RB * A if t.kv_dtype else 0))  # the scales, one copy each on chip
    tiles_r = T * M * d * e + RB * (2 * n * d * kv + T * (64 * Br + O + lm))
    blocks_r = RB * A * ((WARPS - 1) * 2 * (O + lm) + (O + lm) + O + Br * st)
    if S == 1:
        c["global_write:O"], c["global_write:lse"] = M * d * e, M * st
        if A == 0:  # every block exits, writing O = 0 and lse = -inf for its rows
            blocks_w += M * (d * 4 + st)
            blocks_r += M * (d * 4 + st)
    else:
        c["global_write:Opart"], c["global_write:lsepart"] = A * M * d * 4, A * M * st
    c["sram_write"], c["sram_read"] = tiles_w + blocks_w, tiles_r + blocks_r
    return c


def _combine_counts(p: AttentionProblem, t: PagedDecodingTiles, n: int) -> dict:
    """The combine kernel's counts for the L·H output rows of a sequence of n keys."""
    d, e, L, H, st = p.head_dim, p.elem_bytes, p.seq_len, p.heads, STAT_BYTES
    rows, ns = L * H, t.active_splits(n)
    seen = H * min(L, n) * ns  # (row, split) pairs of rows that see a key: the pairs the merge reads
    return {"global_read:seqlens_k": 4 * rows, "global_read:lsepart": 4 * seen,
            "global_read:Opart": 4 * d * seen, "global_write:O": rows * d * e, "global_write:lse": rows * st,
            "flops:exp": 2 * seen + rows, "flops:other": (5 + 3 * d) * seen + (2 + d) * rows,
            "sram_write": rows * (4 + (4 * d + 8) + (4 * d + 4)) + seen * (4 + 4 * d + 4 * d + 8),
            "sram_read": rows * ((4 * d + 8) + 4 * d + 4) + seen * (8 * d + 12)}
