"""The arguments of :func:`iosim.gpu.attention_varlen` and the ``window`` of :func:`iosim.gpu.attention`, checked where
they enter, on shapes, dtype names and host copies of the integer arrays: no CuPy, so the CPU tests run every check.
Each error names the argument, the value and what was expected (:class:`~iosim.gpu.inputs.AttentionInputError` for
values, :class:`~iosim.gpu.inputs.AttentionTypeError` for types and dtypes).

Layouts: q, o (total_q, heads, head_dim); k, v (total_k, kv_heads, head_dim); cu_seqlens_q, cu_seqlens_k (batch + 1)
cumulative lengths: sequence b is rows cu_seqlens_q[b] .. cu_seqlens_q[b + 1] - 1 of q and cu_seqlens_k[b] ..
cu_seqlens_k[b + 1] - 1 of k and v; lse (heads, total_q).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from iosim.gpu.build import CUDA_TYPES
from iosim.gpu.decode_inputs import host_ints, pages_read
from iosim.gpu.inputs import AttentionInputError, AttentionTypeError
from iosim.launch import HEAD_DIMS

GRID_YZ_MAX = 65535  # CUDA's grid.y (heads) and grid.z (batch) limit
# Index sums in the kernel (row + kv_len - seq_len + window) stay inside int32 while each total is below 2^30.
MAX_TOKENS = 2**30


def _bound(x: Any, name: str, side: str) -> int | None:
    if x is None:
        return None
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, np.integer)):
        raise AttentionTypeError(f"window: {side}={x!r} ({type(x).__name__}); expected an integer >= 0, or None for "
                                 f"no bound on that side ({name})")
    if x < 0:
        raise AttentionInputError(f"window: {side}={int(x)}; expected an integer >= 0, or None for no bound on that "
                                  f"side ({name}; a negative bound would exclude the query's own diagonal key)")
    return int(x)


def check_window(window: Any, causal: bool) -> tuple[int | None, int | None] | None:
    """``window`` = (left, right) as FlashAttention's window_size: query i sees keys j with i + off - left <= j <=
    i + off + right (off = kv_len - seq_len), each bound an integer >= 0 or None (unbounded). (0, 0) is the
    smallest window: the diagonal key alone. ``causal=True`` means right = 0: a right bound other than 0 (or None)
    contradicts it. Returns the window with right = 0 where causal, or None where no window is given."""
    if window is None:
        return None
    if isinstance(window, (str, bytes)) or not hasattr(window, "__len__") or len(window) != 2:
        raise AttentionTypeError(f"window={window!r}: expected a pair (left, right) of integers >= 0 or None, as "
                                 "FlashAttention's window_size, e.g. (4095, 0) for a causal window of 4096 keys")
    left = _bound(window[0], "keys before the diagonal", "left")
    right = _bound(window[1], "keys after the diagonal", "right")
    if causal:
        if right not in (None, 0):
            raise AttentionInputError(f"window=({left}, {right}) with causal=True: causal means right = 0; pass "
                                      f"window=({left}, 0), or causal=False for a window that looks {right} keys ahead")
        right = 0
    return left, right


@dataclass(frozen=True)
class VarlenShapes:
    """The sizes of one varlen call, checked: totals, heads, head dim, dtype name."""

    total_q: int
    total_k: int
    heads: int
    kv_heads: int
    head_dim: int
    dtype: str


def _shape3(shape: Any, name: str, dims: str) -> tuple[int, int, int]:
    shape = tuple(int(s) for s in shape)
    if len(shape) != 3:
        paged = " or, for k and v, a paged cache through gpu.varlen_batch(..., block_table=..., page_size=...)" \
            if name != "q" and len(shape) == 4 else ""
        raise AttentionInputError(f"{name}: shape {shape} has {len(shape)} dims; expected 3 dims {dims} (packed "
                                  f"sequences; a (batch, seq_len, heads, head_dim) batch is iosim.gpu.attention's"
                                  f"{paged})")
    if any(s < 1 for s in shape):
        raise AttentionInputError(f"{name}: shape {shape} has an empty dimension; expected all >= 1")
    return shape  # type: ignore[return-value]


def check_shapes(q_shape: Any, k_shape: Any, v_shape: Any, dtypes: tuple[str, str, str]) -> VarlenShapes:
    """q (total_q, heads, head_dim), k and v (total_k, kv_heads, head_dim), one dtype (names: 'float16',
    'bfloat16')."""
    Tq, H, D = _shape3(q_shape, "q", "(total_q, heads, head_dim)")
    Tk, Hk, Dk = _shape3(k_shape, "k", "(total_k, kv_heads, head_dim)")
    if tuple(int(s) for s in v_shape) != (Tk, Hk, Dk):
        raise AttentionInputError(f"v: shape {tuple(v_shape)} differs from k's {(Tk, Hk, Dk)}; expected equal")
    if dtypes[0] not in CUDA_TYPES:
        raise AttentionTypeError(f"q: dtype {dtypes[0]} is not supported; expected float16 or bfloat16")
    for name, dt in (("k", dtypes[1]), ("v", dtypes[2])):
        if dt != dtypes[0]:
            raise AttentionTypeError(f"{name}: dtype {dt} differs from q's {dtypes[0]}; expected the same dtype")
    if Dk != D:
        raise AttentionInputError(f"k: head_dim {Dk} differs from q's head_dim {D}; expected equal")
    if D not in HEAD_DIMS:
        raise AttentionInputError(f"q: head_dim={D} is not supported; expected one of {list(HEAD_DIMS)}")
    if H % Hk:
        raise AttentionInputError(f"k: kv_heads={Hk} does not divide q's heads={H}; expected heads to be a multiple "
                                  "of kv_heads")
    if H > GRID_YZ_MAX:
        raise AttentionInputError(f"q: heads={H}; expected at most {GRID_YZ_MAX} (CUDA grid)")
    for name, total in (("q", Tq), ("k", Tk)):
        if total >= MAX_TOKENS:
            raise AttentionInputError(f"{name}: {total} tokens; expected fewer than 2^30 = {MAX_TOKENS} (the kernel's "
                                      "index sums are int32)")
    return VarlenShapes(Tq, Tk, H, Hk, D, dtypes[0])


def check_cu_seqlens(cu: Any, name: str) -> np.ndarray:
    """Cumulative lengths (batch + 1,) int: 0 first, never decreasing (a sequence may be empty). Returns an int32
    host copy (one small device-to-host copy where ``cu`` is on the GPU)."""
    a = host_ints(cu, name)
    if a.ndim != 1 or a.shape[0] < 2:
        raise AttentionInputError(f"{name}: shape {a.shape}; expected (batch + 1,) with batch >= 1: 0, then each "
                                  "sequence's end")
    if a.shape[0] - 1 > GRID_YZ_MAX:
        raise AttentionInputError(f"{name}: {a.shape[0] - 1} sequences; expected at most {GRID_YZ_MAX} (CUDA grid)")
    if a[0] != 0:
        raise AttentionInputError(f"{name}[0] = {int(a[0])}; expected 0 (cumulative lengths start at 0)")
    drop = np.flatnonzero(np.diff(a) < 0)
    if drop.size:
        i = int(drop[0])
        raise AttentionInputError(f"{name}[{i + 1}] = {int(a[i + 1])} < {name}[{i}] = {int(a[i])}; expected "
                                  "cumulative lengths that never decrease (sequence lengths >= 0)")
    if a[-1] >= MAX_TOKENS:
        raise AttentionInputError(f"{name}[-1] = {int(a[-1])} tokens; expected fewer than 2^30 = {MAX_TOKENS} (the "
                                  "kernel's index sums are int32)")
    return a.astype(np.int32)


def check_totals(last_q: int, last_k: int, s: VarlenShapes) -> None:
    """The cumulative lengths add up to the packed tensors' rows."""
    for name, last, total, tensor in (("cu_seqlens_q", last_q, s.total_q, "q"), ("cu_seqlens_k", last_k, s.total_k,
                                                                                 "k and v")):
        if last != total:
            raise AttentionInputError(f"{name}[-1] = {last}; expected {total}, the rows of {tensor} (the sequences' "
                                      f"lengths must add up to the packed tokens)")


def check_max_seqlen(max_seqlen_q: Any, lens_q: np.ndarray) -> int:
    """The grid's longest query sequence: None (the longest of ``lens_q``) or an integer at least that."""
    longest = int(lens_q.max()) if lens_q.size else 0
    if max_seqlen_q is None:
        return longest
    if isinstance(max_seqlen_q, (bool, np.bool_)) or not isinstance(max_seqlen_q, (int, np.integer)):
        raise AttentionTypeError(f"max_seqlen_q={max_seqlen_q!r}; expected an integer or None")
    if max_seqlen_q < longest:
        b = int(np.argmax(lens_q))
        raise AttentionInputError(f"max_seqlen_q={int(max_seqlen_q)}; expected at least {longest}, the length of "
                                  f"sequence {b} (cu_seqlens_q[{b + 1}] - cu_seqlens_q[{b}])")
    return int(max_seqlen_q)


def check_batches(cu_q: np.ndarray, cu_k: np.ndarray) -> None:
    """cu_seqlens_q and cu_seqlens_k describe the same number of sequences."""
    if cu_q.shape != cu_k.shape:
        raise AttentionInputError(f"cu_seqlens_k: {cu_k.shape[0] - 1} sequences; expected {cu_q.shape[0] - 1}, as "
                                  "cu_seqlens_q (one key range per query sequence)")


def check_page_table(table: np.ndarray, lens_k: np.ndarray, page_size: Any) -> tuple[np.ndarray, int]:
    """A paged cache's block table (batch, max_pages) for sequences of ``lens_k`` keys in pages of ``page_size``
    tokens: the first ceil(n_b / page_size) entries of row b name pages (>= 0, any order, shared or not; the cache's
    page count is checked where the cache is seen, :func:`check_paged_cache`), the rest are never read. Returns the
    table as int32 (unread entries 0) and its largest page."""
    if isinstance(page_size, (bool, np.bool_)) or not isinstance(page_size, (int, np.integer)) or page_size < 1:
        raise AttentionInputError(f"page_size={page_size!r}; expected an integer >= 1, the tokens of one page of the "
                                  "cache (k and v: (num_pages, page_size, kv_heads, head_dim))")
    page_size = int(page_size)
    if table.ndim != 2 or table.shape[0] != lens_k.shape[0] or table.shape[1] < 1:
        raise AttentionInputError(f"block_table: shape {table.shape}; expected (batch, max_pages) = "
                                  f"({lens_k.shape[0]}, >= 1), one row of pages per sequence")
    capacity = table.shape[1] * page_size
    over = np.flatnonzero(lens_k > capacity)
    if over.size:
        b = int(over[0])
        raise AttentionInputError(f"cu_seqlens_k: sequence {b} holds {int(lens_k[b])} keys; expected at most "
                                  f"max_pages * page_size = {table.shape[1]} * {page_size} = {capacity}, what its "
                                  "block_table row can name")
    table = pages_read(table, lens_k, page_size, None)
    return table, int(table.max())


def check_paged_cache(k_shape: Any, v_shape: Any, page_size: int, max_page: int) -> tuple[int, int, int]:
    """k and v of a paged cache, (num_pages, page_size, kv_heads, head_dim), the batch's page size, holding every
    page its block table names. Returns k's shape as packed rows (num_pages * page_size, kv_heads, head_dim), what
    :func:`check_shapes` checks next."""
    shape = tuple(int(s) for s in k_shape)
    if len(shape) != 4:
        raise AttentionInputError(f"k: shape {shape} has {len(shape)} dims; expected 4 dims (num_pages, page_size, "
                                  "kv_heads, head_dim), a paged cache (the batch has a block_table)")
    if tuple(int(s) for s in v_shape) != shape:
        raise AttentionInputError(f"v: shape {tuple(v_shape)} differs from k's {shape}; expected equal")
    num_pages, ps, hk, d = shape
    if ps != page_size:
        raise AttentionInputError(f"k: pages of {ps} tokens (shape {shape}); expected {page_size}, the batch's "
                                  "page_size (gpu.varlen_batch(..., page_size=...))")
    if max_page >= num_pages:
        raise AttentionInputError(f"block_table names page {max_page}; expected pages 0 to {num_pages - 1}, the "
                                  f"cache's (k: shape {shape})")
    if num_pages * ps >= MAX_TOKENS:
        raise AttentionInputError(f"k: {num_pages * ps} cache rows; expected fewer than 2^30 = {MAX_TOKENS}")
    return num_pages * ps, hk, d
