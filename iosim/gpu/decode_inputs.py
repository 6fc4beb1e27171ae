"""The arguments of :func:`iosim.gpu.decode`, checked where they enter, on shapes, dtype names and host copies of the
integer arrays: no CuPy, so the CPU tests run every check. Each error names the argument, the value and what was
expected (:class:`~iosim.gpu.inputs.AttentionInputError` for values, :class:`~iosim.gpu.inputs.AttentionTypeError`
for types and dtypes).

Layouts: q (batch, q_len, heads, head_dim); a contiguous cache k, v (batch, max_len, kv_heads, head_dim); a paged
cache k, v (num_pages, page_size, kv_heads, head_dim) with block_table (batch, max_pages); seqlens_k (batch,). The
cache holds q's dtype, or fp8: :class:`QuantizedKV` pairs of e4m3 values (torch ``float8_e4m3fn``, or uint8 holding
e4m3 bits) and their fp32 scale per kv head (:func:`check_kv_scales`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from iosim.gpu.build import CUDA_TYPES
from iosim.gpu.inputs import AttentionInputError, AttentionTypeError, torch_of
from iosim.launch import decode as geo

GRID_Z_MAX = 65535  # CUDA's grid.z limit: batch * kv_heads blocks along it
FP8_CACHE = "e4m3"  # DecodeShapes.kv_dtype of an fp8 cache
FP8_CACHE_DTYPES = ("float8_e4m3fn", "uint8")  # the dtype names it may arrive with (uint8: e4m3 bits, e.g. CuPy)


class QuantizedKV(NamedTuple):
    """An fp8 K or V cache: ``values`` e4m3, in any layout a cache takes (torch float8_e4m3fn, or a uint8 array of
    e4m3 bits, e.g. CuPy), and ``scale``, fp32 per kv head (a number, or kv_heads of them): K = scale[h] · e4m3.
    :func:`iosim.gpu.quantize_kv_fp8` returns one; :func:`iosim.gpu.decode` takes one for k_cache and v_cache."""

    values: Any
    scale: Any


@dataclass(frozen=True)
class DecodeShapes:
    """The sizes of one decode call, checked. ``capacity``: keys a sequence may hold (max_len, or max_pages ·
    page_size); ``page_size`` is max_len for a contiguous cache, whose "page" b is sequence b."""

    batch: int
    q_len: int
    heads: int
    kv_heads: int
    head_dim: int
    dtype: str
    paged: bool
    page_size: int
    num_pages: int
    max_pages: int  # the block table's row stride (1 for a contiguous cache)
    kv_dtype: str = ""  # the cache's: q's dtype, or FP8_CACHE ("" = q's, for shapes made before the cache is seen)

    @property
    def fp8_cache(self) -> bool:
        return self.kv_dtype == FP8_CACHE

    @property
    def group(self) -> int:
        return self.heads // self.kv_heads

    @property
    def rows(self) -> int:
        """M: packed query rows of one kv head (its G query heads x the q_len tokens)."""
        return self.group * self.q_len

    @property
    def capacity(self) -> int:
        return self.max_pages * self.page_size

    @property
    def stripes(self) -> int:
        return geo.decode_stripes(self.rows, self.head_dim)


def _shape4(shape: Any, name: str, dims: str) -> tuple[int, int, int, int]:
    shape = tuple(int(s) for s in shape)
    if len(shape) != 4:
        raise AttentionInputError(f"{name}: shape {shape} has {len(shape)} dims; expected 4 dims {dims}")
    if any(s < 1 for s in shape):
        raise AttentionInputError(f"{name}: shape {shape} has an empty dimension; expected all >= 1")
    return shape  # type: ignore[return-value]


def check_shapes(q_shape: Any, k_shape: Any, v_shape: Any, dtypes: tuple[str, str, str],
                 table_shape: Any = None) -> DecodeShapes:
    """q, k, v (and the block table's shape where the cache is paged) against each other and what the kernel
    takes; ``dtypes``: the dtype names of q, k, v ('float16', 'bfloat16'; the cache's may be an fp8 one,
    :data:`FP8_CACHE_DTYPES`)."""
    paged = table_shape is not None
    kv_dims = "(num_pages, page_size, kv_heads, head_dim)" if paged else "(batch, max_len, kv_heads, head_dim)"
    B, L, H, D = _shape4(q_shape, "q", "(batch, q_len, heads, head_dim)")
    n0, n1, Hk, Dk = _shape4(k_shape, "k_cache", kv_dims)
    if tuple(int(s) for s in v_shape) != (n0, n1, Hk, Dk):
        raise AttentionInputError(f"v_cache: shape {tuple(v_shape)} differs from k_cache's {(n0, n1, Hk, Dk)}; "
                                  "expected equal")
    if dtypes[0] not in CUDA_TYPES:
        raise AttentionTypeError(f"q: dtype {dtypes[0]} is not supported; expected float16 or bfloat16")
    fp8 = dtypes[1] in FP8_CACHE_DTYPES
    for name, dt in (("k_cache", dtypes[1]), ("v_cache", dtypes[2])):
        if fp8 and dt not in FP8_CACHE_DTYPES:
            raise AttentionTypeError(f"{name}: dtype {dt} while k_cache is fp8 ({dtypes[1]}); expected both fp8 "
                                     "(float8_e4m3fn, or uint8 holding e4m3 bits)")
        if not fp8 and dt != dtypes[0]:
            raise AttentionTypeError(f"{name}: dtype {dt} differs from q's {dtypes[0]}; expected q's dtype, or an fp8 "
                                     "cache: QuantizedKV(values, scale) pairs of e4m3 values (float8_e4m3fn or uint8)")
    kv_dtype = FP8_CACHE if fp8 else dtypes[0]
    if not 1 <= L <= geo.MAX_QUERY_TOKENS:
        raise AttentionInputError(f"q: q_len={L} new tokens per sequence; expected 1 to {geo.MAX_QUERY_TOKENS} "
                                  "(longer chunks are prefill: iosim.gpu.attention)")
    if D not in geo.DECODE_HEAD_DIMS:
        raise AttentionInputError(f"q: head_dim={D} is not supported by decode; expected one of "
                                  f"{list(geo.DECODE_HEAD_DIMS)}")
    if Dk != D:
        raise AttentionInputError(f"k_cache: head_dim {Dk} differs from q's head_dim {D}; expected equal")
    if H % Hk:
        raise AttentionInputError(f"k_cache: kv_heads={Hk} does not divide q's heads={H}; expected heads to be a "
                                  "multiple of kv_heads")
    if B * Hk > GRID_Z_MAX:
        raise AttentionInputError(f"q: batch * kv_heads = {B} * {Hk}; expected at most {GRID_Z_MAX} (CUDA grid)")
    if not paged:
        if n0 != B:
            raise AttentionInputError(f"k_cache: batch {n0} differs from q's batch {B}; expected equal (a "
                                      "contiguous cache is (batch, max_len, kv_heads, head_dim); a paged one needs "
                                      "block_table)")
        return DecodeShapes(B, L, H, Hk, D, dtypes[0], False, n1, B, 1, kv_dtype)
    if n1 % geo.DECODE_TILE:
        raise AttentionInputError(f"k_cache: page_size={n1} tokens; expected a multiple of {geo.DECODE_TILE} (a tile "
                                  f"of {geo.DECODE_TILE} keys never crosses a page), e.g. 16, 64 or 256")
    table_shape = tuple(int(s) for s in table_shape)
    if len(table_shape) != 2 or table_shape[0] != B or table_shape[1] < 1:
        raise AttentionInputError(f"block_table: shape {table_shape}; expected (batch, max_pages) = ({B}, >= 1)")
    return DecodeShapes(B, L, H, Hk, D, dtypes[0], True, n1, n0, table_shape[1], kv_dtype)


def check_kv_scales(k_scale: Any, v_scale: Any, s: DecodeShapes) -> tuple[np.ndarray, np.ndarray] | None:
    """An fp8 cache's scales (the ``scale`` of its :class:`QuantizedKV` pair; None where k_cache or v_cache came
    without one) as host float32 (kv_heads,) arrays: each a number (every head) or kv_heads of them, finite and > 0.
    None for a cache in q's dtype, which takes none."""
    for name, x in (("k_cache", k_scale), ("v_cache", v_scale)):
        if s.fp8_cache and x is None:
            raise AttentionInputError(f"{name}: e4m3 values without their scale; expected QuantizedKV(values, scale), "
                                      f"scale a number or ({s.kv_heads},) floats (iosim.gpu.quantize_kv_fp8 returns one)")
        if not s.fp8_cache and x is not None:
            raise AttentionInputError(f"{name}: a QuantizedKV of {s.kv_dtype} values; expected e4m3 values "
                                      "(float8_e4m3fn, or uint8 holding e4m3 bits), or a plain array without a scale")
    if not s.fp8_cache:
        return None
    return host_scales(k_scale, "k_cache.scale", s.kv_heads), host_scales(v_scale, "v_cache.scale", s.kv_heads)


def host_scales(x: Any, name: str, heads: int) -> np.ndarray:
    """Scales per kv head as a host float32 (heads,) array: a number (every head) or ``heads`` of them, a list,
    NumPy, CuPy or torch array, each finite and > 0."""
    torch = torch_of(x)
    a = np.asarray(x.detach().cpu().numpy() if torch is not None else
                   x.get() if hasattr(x, "__cuda_array_interface__") else x)
    if a.dtype.kind not in "fiu" or a.ndim > 1 or a.size not in (1, heads):
        raise AttentionInputError(f"{name}: {a.dtype} of shape {a.shape}; expected a number or ({heads},) floats, "
                                  "one per kv head")
    a = np.broadcast_to(a.astype(np.float32).reshape(-1), (heads,))
    bad = np.flatnonzero(~(np.isfinite(a) & (a > 0)))
    if bad.size:
        raise AttentionInputError(f"{name}[{int(bad[0])}] = {float(a[bad[0]])}; expected a finite scale > 0")
    return np.ascontiguousarray(a)


def host_ints(x: Any, name: str) -> np.ndarray:
    """A host int64 copy of an integer array given as a list, NumPy, CuPy (``.get()``) or torch tensor; one small
    device-to-host copy where it is on the GPU."""
    torch = torch_of(x)
    if torch is not None:
        x = x.detach().cpu().numpy()
    elif hasattr(x, "__cuda_array_interface__") and hasattr(x, "get"):  # CuPy
        x = x.get()
    try:
        a = np.asarray(x)
    except Exception as exc:
        raise AttentionTypeError(f"{name}: could not read {type(x).__name__} as an integer array ({exc})") from None
    if a.dtype == object or not (np.issubdtype(a.dtype, np.integer) or (a.size == 0 and a.dtype == np.float64)):
        raise AttentionTypeError(f"{name}: dtype {a.dtype}; expected an integer array (int32)")
    return a.astype(np.int64)


def check_seqlens(seqlens: np.ndarray | None, s: DecodeShapes) -> np.ndarray:
    """Keys per sequence, (batch,) int32: each 0 to the cache's capacity (a length of 0 gives O = 0, lse = -inf).
    None: every sequence fills a contiguous cache (max_len)."""
    if seqlens is None:
        if s.paged:
            raise AttentionInputError("seqlens_k: None; expected the keys of each sequence, (batch,) int32, with "
                                      "a block_table")
        return np.full(s.batch, s.capacity, dtype=np.int32)
    if seqlens.shape != (s.batch,):
        raise AttentionInputError(f"seqlens_k: shape {seqlens.shape}; expected ({s.batch},), one length per sequence")
    bad = np.flatnonzero((seqlens < 0) | (seqlens > s.capacity))
    if bad.size:
        i = int(bad[0])
        where = f"max_pages * page_size = {s.max_pages} * {s.page_size}" if s.paged else "max_len"
        raise AttentionInputError(f"seqlens_k[{i}] = {int(seqlens[i])}; expected 0 to {s.capacity} (the cache "
                                  f"holds {where} keys per sequence)")
    return seqlens.astype(np.int32)


def check_block_table(table: np.ndarray, seqlens: np.ndarray, s: DecodeShapes) -> np.ndarray:
    """Each sequence's pages, (batch, max_pages) int32: the first ceil(n_b / page_size) entries of row b must name
    pages of the cache (0 to num_pages - 1, any order, shared or not); the rest are never read."""
    return pages_read(table, seqlens, s.page_size, s.num_pages)


def pages_read(table: np.ndarray, seqlens: np.ndarray, page_size: int, num_pages: int | None) -> np.ndarray:
    """The block table (batch, max_pages) as int32 with the entries no key is read through set to 0, after checking
    the others: the first ceil(n_b / page_size) of row b, each 0 to num_pages - 1 (None: >= 0, the cache's size is
    checked where the cache is seen, and each must fit int32). Shared by decode and attention_varlen's paged cache."""
    used = -(-seqlens.astype(np.int64) // page_size)  # pages each sequence reads
    live = np.arange(table.shape[1])[None, :] < used[:, None]
    bad = np.argwhere(live & ((table < 0) | (table >= (num_pages if num_pages is not None else 2**31))))
    if bad.size:
        b, p = (int(x) for x in bad[0])
        which = f"of k_cache, 0 to {num_pages - 1}" if num_pages is not None else "of the cache, 0 to 2^31 - 1"
        raise AttentionInputError(f"block_table[{b}, {p}] = {int(table[b, p])}; expected a page {which} (sequence {b} "
                                  f"holds {int(seqlens[b])} keys in {int(used[b])} pages of {page_size})")
    return np.ascontiguousarray(np.where(live, table, 0), dtype=np.int32)
