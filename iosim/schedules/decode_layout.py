"""iosim's decode kernel (``kernels/flash_decode.cu``) as the simulator tiles it, and the batch it runs on.

The kernel's tiling, written once (:mod:`iosim.launch.decode` takes its constants from here): the G = heads /
kv_heads query heads of a kv head and the L new tokens are the M = G·L rows of one Q tile (grouped-query packing,
row r = i·G + g), in stripes of 16 rows (mma.sync's M; two stripes a block where M > 16 and d <= 128); a thread
block's 4 warps split its keys in tiles of 16 (warp w takes tiles w, w + 4, ...); the keys of a sequence are cut
into ``splits`` chunks of whole tiles, a thread block per (row block, split, sequence, kv head).

The batch (:class:`PagedDecodingTiles`): ``kv_lens``, the keys of each sequence (a ragged batch; the problem's
``kv_len`` is the cache's capacity per sequence, as ``max_len`` is to :func:`iosim.gpu.decode`), ``page_size``,
the tokens of a page of a paged cache (None: contiguous), and ``kv_dtype``, the cache's dtype where it is not the
problem's ("fp8": e4m3, one fp32 scale per kv head for K and one for V; Q and O stay in the problem's dtype). Each is
checked where it enters, with one error naming it (:func:`check_layout`).

Paged or not, a 16-key tile of one kv head is 16 rows of 2·d bytes (d in fp8) at multiples of that: whole 64- or
128-byte lines at every head dim the kernel takes, and a tile never crosses a page (page sizes are multiples of 16),
so pages add no partial line or sector; keys past a sequence's end are zero-filled, not read, so a partial last page
adds nothing either. What a page costs in bytes is its block-table entry: every lane of a warp loads the entry of each tile
(:func:`dram` counts the distinct 32-byte sectors those loads touch).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..blocks import cdiv
from ..problem import ELEMENT_BYTES, STAT_BYTES, AttentionProblem
from .base import ScheduleError, Tiles

TILE_KEYS = 16  # keys per warp tile (mma n16): a page size must be a multiple of it
WARPS = 4  # warps per thread block; they split the keys of a split
THREADS = 32 * WARPS
STRIPE_ROWS = 16  # mma.sync m16n8k16: rows of one stripe
MAX_QUERY_TOKENS = 16  # new tokens per sequence (speculative decoding, small chunks)
MAX_SPLITS = 128
HEAD_DIMS: tuple[int, ...] = (64, 128, 256)
DTYPES: tuple[str, ...] = ("fp16", "bf16")
KV_DTYPES: tuple[str, ...] = ("fp8",)  # a cache's dtype besides the problem's: e4m3 with a scale per kv head
SECTOR = 32  # bytes: the DRAM and L2 access granularity
INDEX_BYTES = 4  # int32 lengths and block-table entries
ROW_SCALE_BYTES = 128  # an fp8 cache's kernel: a bf16 Q_i's row factors (up to 32 rows of fp32, one 128-byte line)


def stages(head_dim: int) -> int:
    """Depth of each warp's K/V ring (decode_stages() in kernels/flash_decode.cu): tiles of 16 keys in flight per
    warp while it computes one are ``stages - 1``; d = 256 keeps 2 so a block fits an A100's 163 KB."""
    return 2 if head_dim >= 256 else 3 if head_dim >= 128 else 4


def stripes(rows: int, head_dim: int) -> int:
    """16-row stripes per block: 2 where more than 16 rows (G·L) and d <= 128 (O stays in registers), else 1."""
    return 2 if rows > STRIPE_ROWS and head_dim <= 128 else 1


def row_blocks(rows: int, head_dim: int) -> int:
    """Thread blocks along the packed rows: each re-reads the kv head's K/V (from L2: launched side by side)."""
    return cdiv(rows, STRIPE_ROWS * stripes(rows, head_dim))


TABLE_BATCH = 32  # tiles whose block-table entries a warp reads with one load instruction, a lane a tile


def table_entries(k0: int, k1: int, warp: int, page: int) -> list[list[int]]:
    """The block-table entries (page indices within the sequence) warp ``warp`` of a split of keys k0..k1 loads,
    instruction by instruction: its tiles w, w + 4, ... (``TILE_KEYS`` keys each, ``WARPS`` · 16 keys apart) in
    batches of 32, a lane a tile, and the distinct entries of each batch (lanes that read one address count once,
    as Nsight Compute's global-load bytes do)."""
    tiles = list(range(warp, cdiv(k1 - k0, TILE_KEYS), WARPS))
    return [sorted({(k0 + i * TILE_KEYS) // page for i in tiles[j:j + TABLE_BATCH]})
            for j in range(0, len(tiles), TABLE_BATCH)]


def table_bytes(k0: int, k1: int, page: int) -> int:
    """Global bytes of the block-table loads of a split of keys k0..k1 (every warp's :func:`table_entries`), in
    closed form per batch: a batch's tiles are ``WARPS`` · 16 keys apart, so where that is at least a page each tile
    is a page of its own, and where a page holds more every page between the batch's first and last is read."""
    step, total = WARPS * TILE_KEYS, 0
    for w in range(WARPS):
        n_w = len(range(w, cdiv(k1 - k0, TILE_KEYS), WARPS))
        first = np.arange(0, n_w, TABLE_BATCH)
        last = np.minimum(first + TABLE_BATCH, n_w) - 1
        tok0, tok1 = k0 + w * TILE_KEYS + step * first, k0 + w * TILE_KEYS + step * last
        total += int((last - first + 1).sum()) if page <= step else int((tok1 // page - tok0 // page + 1).sum())
    return INDEX_BYTES * total


def even_split(longest: int, splits: int) -> tuple[int, int]:
    """(splits, chunk): ``splits`` cut to the longest sequence's tiles of 16 keys, then the chunk evened out over
    it in whole tiles, so its splits are equal; the count is what that chunk needs (no split is empty)."""
    if longest <= 0:
        return 1, TILE_KEYS
    splits = min(splits, cdiv(longest, TILE_KEYS))
    chunk = cdiv(cdiv(longest, splits), TILE_KEYS) * TILE_KEYS
    return cdiv(longest, chunk), chunk


@dataclass(frozen=True)
class PagedDecodingTiles(Tiles):
    """iosim's decode kernel on one batch: ``block_q`` = 16·stripes packed rows a block, ``block_kv`` = 16 keys a
    warp tile; ``splits`` chunks of ``chunk`` keys; ``kv_lens`` per sequence; ``page_size`` tokens a page (None:
    contiguous); ``max_pages`` the block table's row stride (1 for a contiguous cache); ``kv_dtype`` the cache's
    dtype (None: the problem's; "fp8": e4m3, with k_scale and v_scale per kv head)."""

    splits: int = 1
    chunk: int = TILE_KEYS
    kv_lens: tuple[int, ...] = ()
    page_size: int | None = None
    max_pages: int = 1
    kv_dtype: str | None = None

    def kv_bytes(self, p: AttentionProblem) -> int:
        """Bytes of one element of the cache."""
        return ELEMENT_BYTES[self.kv_dtype] if self.kv_dtype else p.elem_bytes

    @property
    def paged(self) -> bool:
        return self.page_size is not None

    def active_splits(self, kv_len: int) -> int:
        """Splits that hold keys of a sequence of ``kv_len`` keys (the rest of the grid's splits exit at once)."""
        return min(self.splits, cdiv(kv_len, self.chunk))

    def describe_options(self) -> dict:
        return {"splits": self.splits, "chunk": self.chunk, "page_size": self.page_size,
                "kv_lens": list(self.kv_lens)} | ({"kv_dtype": self.kv_dtype} if self.kv_dtype else {})


def _whole(value, name: str) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise ScheduleError(f"{name}={value!r}: expected a whole number")
    return int(value)


def check_problem(p: AttentionProblem) -> None:
    """The problem against what the kernel takes (one error naming the field)."""
    where = "flash-decoding with iosim's decode kernel (kernel='iosim-decode')"
    if not 1 <= p.seq_len <= MAX_QUERY_TOKENS:
        raise ScheduleError(f"{where}: seq_len={p.seq_len} new tokens per sequence; expected 1 to "
                            f"{MAX_QUERY_TOKENS} (longer chunks are prefill: flash2)")
    if p.head_dim not in HEAD_DIMS:
        raise ScheduleError(f"{where}: head_dim={p.head_dim}; expected one of {list(HEAD_DIMS)}")
    if p.dtype not in DTYPES:
        raise ScheduleError(f"{where}: dtype={p.dtype!r}; expected one of {list(DTYPES)}")
    if p.seq_len > 1 and not p.causal:
        raise ScheduleError(f"{where}: causal=False with seq_len={p.seq_len}; the kernel masks the new tokens "
                            "bottom-right causal (token i sees keys 0 .. n_b - seq_len + i: the cache holds their "
                            "keys), so set causal=True")


def check_layout(p: AttentionProblem, kv_lens, page_size) -> tuple[tuple[int, ...], int | None]:
    """(keys per sequence, page size), checked: ``kv_lens`` one whole number 0 .. kv_len per sequence (None:
    every sequence kv_len long), a list, tuple or 1-d integer array; ``page_size`` None or a multiple of 16."""
    if page_size is not None:
        page_size = _whole(page_size, "page_size")
        if page_size < TILE_KEYS or page_size % TILE_KEYS:
            raise ScheduleError(f"page_size={page_size}: expected a multiple of {TILE_KEYS} tokens (a tile of "
                                f"{TILE_KEYS} keys never crosses a page), e.g. 16, 64 or 256; None: a contiguous cache")
    if kv_lens is None:
        return (p.kv_len,) * p.batch, page_size
    if isinstance(kv_lens, (str, bytes)) or not isinstance(kv_lens, (Sequence, np.ndarray)):
        raise ScheduleError(f"kv_lens={kv_lens!r:.80}: expected the keys of each sequence, a list or 1-d array of "
                            f"{p.batch} whole numbers")
    arr = np.asarray(kv_lens, dtype=object) if not isinstance(kv_lens, np.ndarray) else kv_lens
    if arr.ndim != 1 or len(arr) != p.batch:
        raise ScheduleError(f"kv_lens: shape {tuple(np.shape(kv_lens))}; expected one length per sequence, "
                            f"({p.batch},) for batch={p.batch}")
    lens = tuple(_whole(n, f"kv_lens[{i}]") for i, n in enumerate(arr.tolist()))
    for i, n in enumerate(lens):
        if not 0 <= n <= p.kv_len:
            raise ScheduleError(f"kv_lens[{i}]={n}: expected 0 to kv_len={p.kv_len} (kv_len is the cache's capacity "
                                "per sequence: at least the longest sequence)")
    return lens, page_size


def check_kv_dtype(kv_dtype) -> str | None:
    """The cache's dtype: None (the problem's) or one of :data:`KV_DTYPES`."""
    if kv_dtype is not None and kv_dtype not in KV_DTYPES:
        raise ScheduleError(f"kv_dtype={kv_dtype!r}: expected None (the cache in the problem's dtype) or one of "
                            f"{list(KV_DTYPES)} (e4m3 with a scale per kv head, as iosim.gpu.decode takes it)")
    return kv_dtype


def make_tiles(p: AttentionProblem, kv_lens=None, page_size=None, splits: int | None = None,
               kv_dtype: str | None = None) -> PagedDecodingTiles:
    """The kernel's tiles on ``p`` with ``splits`` splits (1 to 128; None: 1) made effective by
    :func:`even_split`; the split heuristic, which needs the GPU's residency, is :func:`iosim.launch.decode
    .decode_split` (``simulate`` calls it)."""
    check_problem(p)
    lens, page = check_layout(p, kv_lens, page_size)
    kv_dtype = check_kv_dtype(kv_dtype)
    if splits is None:
        splits = 1
    if _whole(splits, "splits") < 1 or splits > MAX_SPLITS:
        raise ScheduleError(f"splits={splits}: expected 1 to {MAX_SPLITS}")
    n_splits, chunk = even_split(max(lens, default=0), int(splits))
    rows = p.group * p.seq_len
    return PagedDecodingTiles(STRIPE_ROWS * stripes(rows, p.head_dim), TILE_KEYS, splits=n_splits, chunk=chunk,
                              kv_lens=lens, page_size=page, max_pages=cdiv(p.kv_len, page) if page else 1,
                              kv_dtype=kv_dtype)


def _sectors(start: np.ndarray, nbytes: np.ndarray) -> int:
    """Bytes of the 32-byte sectors that spans of ``nbytes`` bytes from ``start`` touch (0 for empty spans)."""
    first, last = start // SECTOR, (start + nbytes - 1) // SECTOR
    return int(np.where(nbytes > 0, last - first + 1, 0).sum()) * SECTOR


DRAM_MODEL = ("closed form (iosim.schedules.decode_layout.dram): every distinct byte read crosses DRAM once, at 32-byte "
              "sectors (a kv head's row blocks share its K/V in L2); bytes written stay in L2 up to its dirty room "
              "(written back after the kernel, as the L2 model counts them)")


def dram(p: AttentionProblem, t: PagedDecodingTiles, dirty_room: float | None = None) -> list[tuple[int, int]]:
    """DRAM (read, write) bytes of each kernel, a closed form (not the L2 walk), L2 flushed before each kernel (as
    Nsight Compute and the L2 model have it): every distinct byte read crosses once, at 32-byte sectors (the row
    blocks of a kv head run side by side and share its K/V in L2; the cache does not stay in L2 between calls).
    Split kernel: Q of the sequences that hold keys, their K and V (in the cache's dtype; fp8: and the sectors of the
    two scale vectors), the sectors of the block-table entries they read and of the lengths; it writes O and lse, or
    the fp32 partials the combine kernel reads back (with the lengths) before it writes O and lse. Writes: the bytes
    past ``dirty_room`` (the bytes of dirty lines L2 holds; None: none, every byte written crosses): what fits stays
    in L2 when the kernel ends and is written back after it, which the L2 model does not count either
    (docs/validation.md; measured: most decode kernels' DRAM writes are 0-43 kB where they write 2 kB-3.4 MB,
    ``benchmarks/decode_bytes_record.py``)."""
    d, e, L, H = p.head_dim, p.elem_bytes, p.seq_len, p.heads
    lens = np.asarray(t.kv_lens, dtype=np.int64)
    live = lens > 0
    lengths = _sectors(np.zeros(1, np.int64), np.array([INDEX_BYTES * p.batch]))
    read = int(live.sum()) * L * H * d * e + 2 * int(lens.sum()) * p.kv_heads * d * t.kv_bytes(p) + lengths
    if t.kv_dtype and live.any():  # k_scale and v_scale: kv_heads fp32 each
        read += 2 * _sectors(np.zeros(1, np.int64), np.array([STAT_BYTES * p.kv_heads]))
    if t.paged:  # row b's first ceil(n_b / page) entries, one int32 each
        start = np.arange(p.batch, dtype=np.int64) * t.max_pages * INDEX_BYTES
        read += _sectors(start, cdiv(lens, t.page_size) * INDEX_BYTES)
    def crossing(written: int) -> int:
        return written if dirty_room is None else max(0, int(written - dirty_room))

    out_bytes = p.batch * L * H * (d * e + STAT_BYTES)
    if t.splits == 1:
        return [(read, crossing(out_bytes))]
    active = np.minimum(t.splits, cdiv(lens, t.chunk))
    partial = int(active.sum()) * L * H * (d + 1) * STAT_BYTES
    # the combine reads lse_s and O_s of the rows that see a key (token i sees one iff i >= L - n_b)
    seen = int((active * np.minimum(L, lens)).sum()) * H * (d + 1) * STAT_BYTES
    return [(read, crossing(partial)), (seen + lengths, crossing(out_bytes))]


def dirty_room(profile) -> float:
    """Bytes of dirty lines L2 holds: its capacity over a dirty line's room per byte (``l2.room.dirty``)."""
    return float(profile.l2.capacity.value) / profile.l2_room()[2]

