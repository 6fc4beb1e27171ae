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

Two options, as kernels/flash_fwd.cu runs them (:class:`Flash2Tiles`): a sliding ``window`` (left, right)
(FlashAttention's window_size: row i sees keys i + off - left .. i + off + right) visits only the K/V blocks
lo_i .. hi_i - 1 that hold a key some row of Q_i sees (:func:`iosim.blocks.kv_block_range`), so K/V bytes grow as
N·w, not N²; ``seqlens``, packed sequences (varlen): a problem of batch 1 whose seq_len and kv_len are the packed
totals, each sequence tiled on its own (a ragged last Q block and K/V block at each sequence's end, nothing read
or computed past it); ``page_size`` with ``seqlens``, chunked prefill against a paged KV cache (the kernel's Paged
mode): each sequence's keys sit in pages of that many tokens, found through a block table (a row per sequence, as
wide as the batch's most pages), K and V bytes as packed, plus the table's entries as the kernel reads them, ahead
of the copies that use them: where a tile lies in one page (:func:`page_tiles`) every warp loads the tile's one
entry; otherwise one thread a key loads its page's entry. The load instruction moves each distinct entry of a warp's
32 keys once (4 B; what Nsight Compute's SASS counter measured for these loads, docs/validation.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..blocks import Rows, VisitSums, block_rows, cdiv, kv_block_range, kv_block_ranges, visit_sums
from ..counts import Counts, KernelCounts
from ..problem import STAT_BYTES, AttentionProblem
from .base import Schedule, ScheduleError, Tiles
from .fit import shrink_to_fit

NAME = "flash2"
SUMMARY = "FlashAttention-2: Q outer loop, O and statistics on chip, O written once, causal block skipping"
STATS = ("lse",)
WARPS = 4  # kernels/flash_fwd.cu's warps a thread block; its varlen kernel reads the lengths once a warp
# head dims whose paged kernel has a PageTiles instantiation (kernels/flash_fwd.cu): at d = 256 (64 x 32 tiles, 2
# stages) its step measured longer than the row lists' (H200, 2026-11-28: 1.61 against 1.47 us at one block an SM)
PAGE_TILES_HEAD_DIMS = (32, 64, 128)


def page_tiles(page_size: int, block_kv: int, head_dim: int) -> bool:
    """Whether the paged kernel runs its PageTiles instantiation: pages a multiple of the K/V tile's Bc keys, so a
    tile never crosses a page (FlashAttention-2's paged KV cache asks this of every page size), at a head dim of
    :data:`PAGE_TILES_HEAD_DIMS`; otherwise its row lists (each key's row looked up)."""
    return head_dim in PAGE_TILES_HEAD_DIMS and page_size % block_kv == 0

# FlashAttention-2's forward tiles (Br, Bc) by head dim: csrc/flash_attn/src/flash_fwd_launch_template.h,
# run_mha_fwd_hdim* for sm80/sm90 without dropout. The largest head dim <= the key is used.
FA2_TILES = {32: (128, 128), 64: (128, 128), 96: (128, 64), 128: (128, 64), 160: (128, 32),
             192: (128, 64), 224: (128, 32), 256: (128, 64)}


def default_tiles(p: AttentionProblem, profile) -> Tiles:
    """FA2's tiles for the head dim; on a GPU with less shared memory, halve Bc, then Br, until they fit."""
    Br, Bc = next((FA2_TILES[k] for k in sorted(FA2_TILES) if p.head_dim <= k), (64, 32))
    return shrink_to_fit(SCHEDULE, p, Br, Bc, profile)


@dataclass(frozen=True)
class Flash2Tiles(Tiles):
    """flash2's tiles with its options: ``window`` (left, right), None on a side for no bound (a causal problem's
    right is 0); ``seqlens``, packed sequences: ((queries, keys), ...) adding up to the problem's seq_len and kv_len
    (batch 1)."""

    window: tuple[int | None, int | None] | None = None
    seqlens: tuple[tuple[int, int], ...] = ()
    page_size: int | None = None  # with seqlens: keys in a paged cache (chunked prefill)

    def describe_options(self) -> dict:
        out = {"window": list(self.window)} if self.window is not None else {}
        out |= {"page_size": self.page_size} if self.page_size is not None else {}
        return out | ({"seqlens": [list(s) for s in self.seqlens]} if self.seqlens else {})

    @property
    def table_width(self) -> int:
        """Entries of a block-table row: the most pages any sequence holds (at least 1)."""
        return max(1, max(cdiv(nk, self.page_size) for _, nk in self.seqlens)) if self.page_size else 0


def _window(window, causal: bool) -> tuple[int | None, int | None]:
    if not (isinstance(window, (tuple, list)) and len(window) == 2 and all(
            w is None or (isinstance(w, (int, np.integer)) and not isinstance(w, bool) and w >= 0) for w in window)):
        raise ScheduleError(f"window={window!r}: expected (left, right), each an integer >= 0 or None (no bound)")
    left, right = (None if w is None else int(w) for w in window)
    if causal and right not in (None, 0):
        raise ScheduleError(f"window=({left}, {right}) on a causal problem: causal means right = 0")
    return left, 0 if causal else right


def _seqlens(seqlens, p: AttentionProblem) -> tuple[tuple[int, int], ...]:
    """((queries, keys), ...) from pairs or from one length per sequence (self-attention: as many keys)."""
    try:
        pairs = tuple((int(s), int(s)) if np.ndim(s) == 0 else (int(s[0]), int(s[1])) for s in seqlens)
    except (TypeError, ValueError, IndexError):
        raise ScheduleError(f"seqlens={seqlens!r}: expected one length per sequence, or (queries, keys) pairs") from None
    if not pairs or any(a < 0 or b < 0 for a, b in pairs):
        raise ScheduleError(f"seqlens={seqlens!r}: expected at least one sequence, lengths >= 0")
    tq, tk = sum(a for a, _ in pairs), sum(b for _, b in pairs)
    if p.batch != 1 or (tq, tk) != (p.seq_len, p.kv_len):
        raise ScheduleError(f"seqlens: {len(pairs)} sequences of {tq} queries and {tk} keys in all; expected a "
                            f"problem of batch 1 with seq_len={tq} and kv_len={tk}, the packed totals (given batch="
                            f"{p.batch}, seq_len={p.seq_len}, kv_len={p.kv_len})")
    return pairs


def _page_size(page_size, seqlens) -> int | None:
    if page_size is None:
        return None
    if seqlens is None:
        raise ScheduleError(f"page_size={page_size!r} without seqlens: flash2 reads a paged cache in its varlen "
                            "(chunked prefill) mode; give seqlens, each sequence's (queries, keys)")
    if isinstance(page_size, bool) or not isinstance(page_size, (int, np.integer)) or page_size < 1:
        raise ScheduleError(f"page_size={page_size!r}: expected an integer >= 1, tokens per page of the cache")
    return int(page_size)


def make_tiles(p: AttentionProblem, profile, block_q=None, block_kv=None, window=None, seqlens=None,
               page_size=None) -> Tiles:
    """The tiles (given, or FA2's default) with the window, the packed sequences and the paged cache checked; plain
    Tiles where none is given (the counts are then the dense schedule's)."""
    base = default_tiles(p, profile) if block_q is None or block_kv is None else None
    Br = block_q if block_q is not None else base.block_q
    Bc = block_kv if block_kv is not None else base.block_kv
    if window is None and seqlens is None and page_size is None:
        return base if block_q is None and block_kv is None else Tiles(Br, Bc)
    return Flash2Tiles(Br, Bc, window=None if window is None else _window(window, p.causal),
                       seqlens=() if seqlens is None else _seqlens(seqlens, p),
                       page_size=_page_size(page_size, seqlens))


def sequences(p: AttentionProblem, t: Tiles) -> tuple[tuple[int, int], ...]:
    """(queries, keys) of each sequence one program covers: the packed ones, or the problem's one."""
    return getattr(t, "seqlens", ()) or ((p.seq_len, p.kv_len),)


def program(x, p: AttentionProblem, t: Tiles) -> None:
    """One head (of every packed sequence, with ``seqlens``: the varlen grid, see :func:`_packed_block`)."""
    Br, Bc, window = t.block_q, t.block_kv, getattr(t, "window", None)
    if getattr(t, "seqlens", ()):
        seqs = t.seqlens
        q0 = np.cumsum([0] + [n for n, _ in seqs])  # each sequence's first row in the packed Q, O and lse
        k0 = np.cumsum([0] + [n for _, n in seqs])
        tr = cdiv(max(1, max(n for n, _ in seqs)), Br)
        ps = getattr(t, "page_size", None)
        with x.kernel("flash2_fwd", grid=tr * len(seqs)):
            for s, (N, Nk) in enumerate(seqs):
                # sequence s's block-table row, and whether PageTiles runs
                pages = (ps, s * t.table_width, page_tiles(ps, Bc, p.head_dim)) if ps else None
                for i in range(tr):
                    _packed_block(x, p, (Br, Bc, window, pages), (N, Nk, int(q0[s]), int(k0[s])), s, i)
        return
    with x.kernel("flash2_fwd", grid=cdiv(p.seq_len, Br)):
        for i in range(cdiv(p.seq_len, Br)):  # line 3: one thread block per Q block
            with x.thread_block():
                _q_block(x, p, (Br, Bc, window, None), (p.seq_len, p.kv_len, 0, 0), i)


def _packed_block(x, p: AttentionProblem, tiles: tuple, seq: tuple[int, int, int, int], s: int, i: int) -> None:
    """Block i of sequence s in the varlen grid (ceil(longest / Br), heads, sequences): every warp reads the
    sequence's first and next-first query and key rows (cu_seqlens); a block past the sequence's last Q tile exits
    there; the others run Q block i and read the first query row again where they write O and lse."""
    with x.thread_block():
        x.broadcast("cu_seqlens_q", Rows(s, s + 2), WARPS)
        x.broadcast("cu_seqlens_k", Rows(s, s + 2), WARPS)
        if i < cdiv(seq[0], tiles[0]):
            _q_block(x, p, tiles, seq, i)
            x.broadcast("cu_seqlens_q", Rows(s, s + 1), WARPS)


def _q_block(x, p: AttentionProblem, tiles: tuple, seq: tuple[int, int, int, int], i: int) -> None:
    """Q block i of a sequence of N queries and Nk keys whose rows start at q0 and k0 (inside its thread block)."""
    Br, Bc, window, pages = tiles
    N, Nk, q0, k0 = seq
    q = block_rows(i, Br, N).shifted(q0)
    lo, hi = kv_block_range(i, Br, Bc, N, Nk, p.causal, window)
    if hi <= lo:  # no row of this block sees a key
        O_i, L_i = x.empty_output(q)
        x.store("O", q, O_i)
        x.store("lse", q, L_i)
        return
    Q_i = x.load("Q", q)  # line 4: stays in SRAM throughout
    O_i, l_i, m_i = x.init_state(q)  # line 5
    for j in x.order(range(lo, hi)):  # line 6
        k = block_rows(j, Bc, Nk).shifted(k0)
        if pages:
            _table_reads(x, pages, Bc, block_rows(j, Bc, Nk))
        K_j = x.load("K", k)  # line 7 (paged: K and V rows in the pages the table names, the same bytes)
        V_j = x.load("V", k)
        S_ij = x.scores(Q_i, K_j, q, k)  # line 8
        O_i, l_i, m_i = x.online_softmax(S_ij, V_j, O_i, l_i, m_i)  # lines 9-10
    O_i, L_i = x.finalize(O_i, l_i, m_i)  # lines 12-13
    x.store("O", q, O_i)  # line 14
    x.store("lse", q, L_i)  # line 15


def _table_reads(x, pages: tuple[int, int, bool], Bc: int, k: Rows) -> None:
    """The block-table entries the paged kernel reads to load keys ``k`` (a K/V tile) of a sequence (its row of the
    table starts at entry ``pages[1]``): in the PageTiles instantiation (``pages[2]``) the tile's one entry, by every
    warp; else each warp's distinct entries (a warp finds the pages of 32 keys)."""
    ps, row0, tiles = pages
    for e in range(k.start // ps, (k.stop - 1) // ps + 1):
        lo, hi = max(k.start, e * ps), min(k.stop, (e + 1) * ps)  # keys of the tile in page e
        warps = WARPS if tiles else (hi - 1) // 32 - lo // 32 + 1  # (the tile starts at a multiple of 32)
        x.broadcast("block_table", Rows(row0 + e, row0 + e + 1), warps)


def _table_sums(p: AttentionProblem, t: Flash2Tiles, N: int, Nk: int) -> tuple[int, int]:
    """(entries loaded, entries held: one per page a tile's keys lie in) of one sequence's visited K/V tiles, as
    :func:`_table_reads` counts them."""
    lo, hi = kv_block_ranges(N, Nk, t.block_q, t.block_kv, p.causal, t.window)
    visits = np.zeros(cdiv(Nk, t.block_kv) + 1, dtype=np.int64)  # visits[j]: Q blocks that visit K/V tile j
    for a, z in zip(lo.tolist(), hi.tolist(), strict=True):
        if z > a:
            visits[a] += 1
            visits[z] -= 1
    visits = np.cumsum(visits)[:-1]
    ps, Bc = t.page_size, t.block_kv
    j = np.arange(visits.size, dtype=np.int64)
    end = np.minimum((j + 1) * Bc, Nk)  # one past tile j's last key
    pages = (end - 1) // ps - (j * Bc) // ps + 1  # the pages its keys lie in: one held each
    if page_tiles(ps, Bc, p.head_dim):  # one page a tile: its one entry, loaded by every warp
        return int(visits.sum()) * WARPS, int(visits.sum())
    loads = np.zeros_like(j)
    for w in range(cdiv(Bc, 32)):  # warp w finds keys 32 w .. 32 w + 31 of the tile: its distinct pages
        first = j * Bc + 32 * w
        last = np.minimum(first + 32, end) - 1
        loads += np.where(first < end, last // ps - first // ps + 1, 0)
    return int((visits * loads).sum()), int((visits * pages).sum())


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
    lengths = {}  # packed: the varlen grid's reads of the lengths (_packed_block)
    if isinstance(t, Flash2Tiles):  # the sums of each sequence (varlen) over its visited K/V blocks (window)
        parts = [visit_sums(n, nk, t.block_q, t.block_kv, p.causal, t.window) for n, nk in sequences(p, t)]
        v = VisitSums(*(sum(getattr(x, f) for x in parts) for f in VisitSums.__dataclass_fields__))
        grid = sum(cdiv(n, t.block_q) for n, _ in sequences(p, t))
        if t.seqlens:
            launched = cdiv(max(1, max(n for n, _ in t.seqlens)), t.block_q) * len(t.seqlens)
            lengths = {"cu_seqlens_q": (2 * launched + grid) * WARPS * 4, "cu_seqlens_k": 2 * launched * WARPS * 4}
            on_chip = (2 * 2 * launched + grid) * 4  # one copy of each length a block reads
            grid = launched
        if t.page_size:
            loads, held = (sum(x) for x in zip(*(_table_sums(p, t, n, nk) for n, nk in t.seqlens), strict=True))
            lengths["block_table"], on_chip = loads * 4, on_chip + held * 4
    else:
        v = visit_sums(N, Nk, t.block_q, t.block_kv, p.causal)
        grid = cdiv(N, t.block_q)
    rv, cv, A, Nv = v.row_visits, v.col_visits, v.area, v.q_rows

    k = KernelCounts("flash2_fwd", grid=grid)
    k.global_read.update(Q=Nv * d * b, K=cv * d * b, V=cv * d * b, **lengths)
    k.global_write.update(O=N * d * b, lse=N * s)
    k.flops.update(
        matmul=4 * A * d,
        exp=A + rv + Nv,  # P~; the rescale factor per row and step; log(l) at the end
        other=4 * A + (4 + d) * rv + Nv * (d + 2),
    )
    k.sram_write = Nv * d * b + 2 * cv * d * b + Nv * (4 * d + 8) + 8 * A + rv * (4 * d + 8) + N * (4 * d + 4)
    k.sram_read = rv * d * b + 2 * cv * d * b + 4 * A + rv * (4 * d + 8) + Nv * (4 * d + 8) + N * (4 * d + 4)
    k.sram_peak = working_set(p, t)
    if lengths:
        k.sram_write += on_chip
    return Counts([k])


SCHEDULE = Schedule(NAME, SUMMARY, program, closed_form, default_tiles, working_set, shared_memory, stats=STATS,
                    make_tiles=make_tiles, options=("window", "seqlens", "page_size"))
