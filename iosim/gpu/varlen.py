"""Packed sequences (varlen) on the GPU with iosim's FlashAttention-2 kernel (``kernels/flash_fwd.cu``, its Varlen
mode) or, on Hopper, its FlashAttention-3-design kernel (``kernels/flash3_fwd.cu``, ``schedule="flash3"``):
sequences of different lengths in one call, with no padding read, computed or written; causal (bottom-right per
sequence), sliding windows, grouped-query heads.

    >>> from iosim import gpu
    >>> batch = gpu.varlen_batch(cu_seqlens_q, cu_seqlens_k)        # check and upload the lengths once ...
    >>> o, lse = gpu.attention_varlen(q, k, v, batch, causal=True)   # ... run every layer on them
    >>> o, lse = gpu.attention_varlen(q, k, v, (cu_q, cu_k), window=(4095, 0))  # or give the lengths each call
    >>> o, lse = gpu.attention_varlen(q, k, v, batch, causal=True, schedule="flash3")  # wgmma, TMA (sm_90a)
    >>> chunk = gpu.varlen_batch(cu_seqlens_q, cu_cache_lens, block_table=bt, page_size=16)  # chunked prefill:
    >>> o, lse = gpu.attention_varlen(q, k_pages, v_pages, chunk, causal=True)  # new tokens against a paged cache

q (total_q, heads, head_dim), k and v (total_k, kv_heads, head_dim); O like q, lse (heads, total_q) fp32, natural log.
With a block table (chunked prefill), k and v are a paged cache (num_pages, page_size, kv_heads, head_dim): sequence
b's keys are the first cu_seqlens_k[b + 1] - cu_seqlens_k[b] tokens of its pages, token t in slot t % page_size of page
block_table[b, t // page_size] (FlashAttention's seqused_k and block_table), read by flash2's kernel.
A :class:`VarlenBatch` holds the checked lengths on the host (no synchronization per call) and on the device; making
one reads them on the host (one small synchronizing copy where they are on the GPU). Geometry:
:mod:`iosim.launch.varlen`; the argument checks: :mod:`iosim.gpu.varlen_inputs`.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from iosim import launch
from iosim.gpu import build, flash3_host
from iosim.gpu import varlen_inputs as vi
from iosim.gpu._cupy import require_cupy
from iosim.gpu.attention import KernelLaunch, LaunchRecord, _record, flash_smem_checked
from iosim.gpu.compiled import _kernel
from iosim.gpu.decode_inputs import host_ints
from iosim.gpu.inputs import (
    AttentionInputError,
    AttentionOptions,
    AttentionTypeError,
    _as_cupy,
    check_scale,
    dtype_name,
    options_of,
    output_array,
    torch_of,
    torch_stream,
)
from iosim.launch import varlen as geo
from iosim.schedules.flash2 import page_tiles

_LOG2E = 1.4426950408889634


class Varlen(NamedTuple):
    """What :func:`attention_varlen` returns: O like q (total_q, heads, head_dim) and lse (heads, total_q) fp32,
    natural log (-inf, with O = 0, for a row that sees no key)."""

    o: Any
    lse: Any


@dataclass(frozen=True)
class VarlenBatch:
    """The sequences of a packed batch, checked: their lengths on the host and the cumulative lengths on the device
    (int32, batch + 1 each), and the grid's longest query sequence."""

    seqlens_q: tuple[int, ...]
    seqlens_k: tuple[int, ...]
    max_seqlen_q: int
    cu_seqlens_q: Any  # CuPy int32 (batch + 1,)
    cu_seqlens_k: Any
    device: int
    block_table: Any = None  # CuPy int32 (batch, max_pages) of a paged cache, or None
    page_size: int = 0  # tokens per page of the paged cache (0: k and v packed)
    max_page: int = -1  # the largest page the table names (checked against the cache at each call)

    @property
    def paged(self) -> bool:
        return self.block_table is not None

    @property
    def batch(self) -> int:
        return len(self.seqlens_q)

    @property
    def total_q(self) -> int:
        return sum(self.seqlens_q)

    @property
    def total_k(self) -> int:
        return sum(self.seqlens_k)


def varlen_batch(cu_seqlens_q: Any, cu_seqlens_k: Any, max_seqlen_q: int | None = None, *,
                 block_table: Any = None, page_size: int | None = None, device: int | None = None) -> VarlenBatch:
    """Check cumulative lengths (batch + 1 integers each: 0, then each sequence's end; a list, NumPy, CuPy or torch
    array) and upload them to ``device`` (default: the current one). ``max_seqlen_q``: the grid's longest query
    sequence, at least the longest (default: the longest).

    ``block_table`` (batch, max_pages) and ``page_size``: the keys live in a paged cache (chunked prefill); sequence
    b's keys are the first cu_seqlens_k[b + 1] - cu_seqlens_k[b] tokens of its pages, token t in slot t % page_size
    of page block_table[b, t // page_size] (pages in any order; entries past a sequence's last page never read)."""
    cp = require_cupy()
    cu_q = vi.check_cu_seqlens(cu_seqlens_q, "cu_seqlens_q")
    cu_k = vi.check_cu_seqlens(cu_seqlens_k, "cu_seqlens_k")
    vi.check_batches(cu_q, cu_k)
    lens_q, lens_k = np.diff(cu_q), np.diff(cu_k)
    longest = vi.check_max_seqlen(max_seqlen_q, lens_q)
    if (block_table is None) != (page_size is None):
        raise AttentionInputError(f"block_table={'given' if block_table is not None else None}, page_size="
                                  f"{page_size!r}: give both (a paged cache) or neither")
    table, max_page = None, -1
    if block_table is not None:
        table, max_page = vi.check_page_table(host_ints(block_table, "block_table"), lens_k, page_size)
    device = cp.cuda.runtime.getDevice() if device is None else int(device)
    with cp.cuda.Device(device):
        dq, dk = cp.asarray(cu_q), cp.asarray(cu_k)
        dt = cp.asarray(table) if table is not None else None
        cp.cuda.get_current_stream().synchronize()  # uploaded before a call on another stream (torch's) reads them
    return VarlenBatch(tuple(int(n) for n in lens_q), tuple(int(n) for n in lens_k), longest, dq, dk, device, dt,
                       int(page_size or 0), max_page)


def paged_kv(k: Any, v: Any, cu_seqlens_k: Any, page_size: int, *, seed: int | None = None) -> tuple[Any, Any, Any]:
    """Copy packed keys and values (total_k, kv_heads, head_dim) into a paged cache: returns (k_pages, v_pages,
    block_table), the pages (num_pages, page_size, kv_heads, head_dim) as k's array type (CuPy, torch or NumPy)
    and the table (batch, max_pages) int32 on the host, each sequence in ceil(n / page_size) pages of its own (the
    rest of its last page zero). ``seed``: pages in a random order drawn from it (as a serving engine's allocator leaves
    them); None: in sequence order. For tests and benchmarks of :func:`varlen_batch`'s paged mode."""
    cu = vi.check_cu_seqlens(cu_seqlens_k, "cu_seqlens_k")
    if isinstance(page_size, bool) or not isinstance(page_size, (int, np.integer)) or page_size < 1:
        raise AttentionInputError(f"page_size={page_size!r}; expected an integer >= 1")
    if int(cu[-1]) != int(k.shape[0]) or tuple(v.shape) != tuple(k.shape):
        raise AttentionInputError(f"k, v: shapes {tuple(k.shape)}, {tuple(v.shape)}; expected equal, with "
                                  f"cu_seqlens_k[-1] = {int(cu[-1])} rows")
    lens = np.diff(cu)
    used = -(-lens // page_size)
    first = np.concatenate([[0], np.cumsum(used)])  # each sequence's first page, in sequence order
    where = np.arange(first[-1]) if seed is None else np.random.default_rng(seed).permutation(int(first[-1]))
    table = np.zeros((len(lens), max(1, int(used.max(initial=0)))), dtype=np.int32)
    src = np.full(max(1, int(first[-1])) * page_size, -1, dtype=np.int64)  # cache slot -> packed row, -1: none
    for b, n in enumerate(lens):
        pages = where[first[b]:first[b + 1]]
        table[b, :len(pages)] = pages
        t = np.arange(n)
        src[pages[t // page_size] * page_size + t % page_size] = cu[b] + t
    torch = torch_of(k)
    if torch is not None:
        xp_index = lambda a: torch.as_tensor(a, device=k.device)  # noqa: E731
    else:
        xp_index = np.asarray if isinstance(k, np.ndarray) else require_cupy().asarray
    idx, empty = xp_index(np.maximum(src, 0)), xp_index(src < 0)
    out = []
    for x in (k, v):
        pages = x[idx]  # a gather: every cache slot from its packed row (row 0 for an empty slot, zeroed next)
        pages[empty] = 0
        out.append(pages.reshape(len(src) // page_size, page_size, *x.shape[1:]))
    return out[0], out[1], table


def _batch_of(seqlens: Any, device: int) -> VarlenBatch:
    if isinstance(seqlens, VarlenBatch):
        if seqlens.device != device:
            raise AttentionInputError(f"seqlens: a VarlenBatch on device {seqlens.device}; expected device {device}, "
                                      "q's (gpu.varlen_batch(..., device=...))")
        return seqlens
    if isinstance(seqlens, (tuple, list)) and len(seqlens) in (2, 3):
        return varlen_batch(*seqlens, device=device)
    raise AttentionTypeError(f"seqlens: got {type(seqlens).__name__}; expected gpu.varlen_batch(cu_seqlens_q, "
                             "cu_seqlens_k[, max_seqlen_q]) or the tuple (cu_seqlens_q, cu_seqlens_k[, max_seqlen_q])")


def _check_options(options: AttentionOptions) -> None:
    taken = {"block_trace": options.block_trace, "deterministic": options.deterministic, "window": options.window}
    given = [k for k, v in taken.items() if v is not None]
    if given:
        raise AttentionInputError(f"options: {', '.join(given)} not taken by attention_varlen (the window is its own "
                                  "argument, window=(left, right); no backward); expected None")


def _tiles(s: vi.VarlenShapes, mask: geo.Mask, options: AttentionOptions, schedule: str,
           paged: bool) -> tuple[int, int]:
    bq, bkv = options.block_q, options.block_kv
    if (bq is None) != (bkv is None):
        raise AttentionInputError(f"block_q={bq!r}, block_kv={bkv!r}: give both or neither")
    if schedule == "flash3":
        if s.head_dim not in launch.FLASH3_TILES:
            raise AttentionInputError(f"head_dim={s.head_dim} with schedule='flash3': expected one of "
                                      f"{list(launch.FLASH3_TILES)} (or schedule='flash2')")
        tiles = launch.FLASH3_TILES[s.head_dim]
        if bq is not None and (bq, bkv) != tiles:
            raise AttentionInputError(f"(block_q, block_kv)=({bq!r}, {bkv!r}) with schedule='flash3': its tiles are "
                                      f"fixed, {tiles} at head_dim={s.head_dim}; expected None")
        return tiles
    if bq is None:
        return geo.FLASH_PAGED_TILES[s.head_dim] if paged else geo.varlen_default_tiles(s.head_dim, mask.local)
    tiles = (geo.FLASH_PAGED_TILES[s.head_dim],) if paged else geo.varlen_tiles(s.head_dim, mask.local)
    if (bq, bkv) not in tiles:
        raise AttentionInputError(f"(block_q, block_kv)=({bq!r}, {bkv!r}) is not compiled for attention_varlen at "
                                  f"head_dim={s.head_dim}{' with a window' if mask.local else ''}"
                                  f"{' on a paged cache' if paged else ''}; expected one of "
                                  f"{list(tiles)}")
    return bq, bkv


def _refuse_grad(*xs: Any) -> None:
    torch = torch_of(xs[0])
    if torch is not None and torch.is_grad_enabled() and any(getattr(x, "requires_grad", False) for x in xs):
        raise AttentionInputError("q, k, v: torch tensors that require grad; attention_varlen has no backward pass "
                                  "(run it under torch.no_grad(), or detach the inputs)")


def attention_varlen(q: Any, k: Any, v: Any, seqlens: Any, *, causal: bool = False, window: Any = None,
                     scale: float | None = None, options: AttentionOptions | None = None,
                     schedule: str = "flash2") -> Varlen:
    """softmax(scale Q K^T) V for each of a batch of packed sequences, on the GPU; returns ``Varlen(o, lse)``.

    q: (total_q, heads, head_dim); k, v: (total_k, kv_heads, head_dim), heads a multiple of kv_heads (query head h
    reads kv head h // (heads // kv_heads)); contiguous float16 or bfloat16, head_dim 32, 64, 128 or 256; CuPy arrays
    or CUDA torch tensors (torch in, torch out, on torch's current stream).
    seqlens: :func:`varlen_batch` (cu_seqlens_q, cu_seqlens_k[, max_seqlen_q]), or that tuple (checked and uploaded
    on every call then): sequence b is rows cu_seqlens_q[b] .. cu_seqlens_q[b + 1] - 1 of q and cu_seqlens_k[b] ..
    cu_seqlens_k[b + 1] - 1 of k and v; lengths may be 0. A batch made with a block table (chunked prefill): k and v
    are its paged cache, (num_pages, page_size, kv_heads, head_dim), and sequence b's keys are the first
    cu_seqlens_k[b + 1] - cu_seqlens_k[b] tokens of its pages; causal puts its queries at the end of them (a chunk
    of new tokens whose keys the cache already holds). schedule "flash2" only, one tile per head dim
    (:data:`iosim.launch.varlen.FLASH_PAGED_TILES`).
    causal: query i of a sequence (n queries, n_k keys) sees keys j <= i + n_k - n (bottom-right). window: (left,
    right), FlashAttention's window_size: query i sees keys i + n_k - n - left .. i + n_k - n + right, each bound an
    integer >= 0 or None (no bound); causal means right = 0. A row that sees no key: O = 0, lse = -inf.
    scale: default 1/sqrt(head_dim). options: :class:`AttentionOptions`' tiles (block_q, block_kv:
    :func:`iosim.launch.varlen.varlen_tiles`) and preallocated outputs (out (total_q, heads, head_dim), lse_out
    (heads, total_q)).
    schedule: "flash2" (kernels/flash_fwd.cu, mma.sync, any sm_80+ GPU) or "flash3" (kernels/flash3_fwd.cu: TMA,
    wgmma, warp specialization; Hopper only, head_dim 64, 128 or 256, its tiles fixed). flash3's TMA boxes start
    at each sequence's first row, so a tile that ends past its sequence reads the next sequence's rows: their keys
    are masked and their values weighted by zero, so a non-finite value there (never the case for real data in
    another sequence) would reach this sequence's output as NaN.
    """
    if schedule not in ("flash2", "flash3"):
        raise AttentionInputError(f"schedule={schedule!r}: attention_varlen runs 'flash2' or 'flash3'")
    options = options_of(options, AttentionOptions)
    _check_options(options)
    if not isinstance(causal, bool):
        raise AttentionTypeError(f"causal={causal!r}: expected True or False")
    mask = geo.mask_of(causal, vi.check_window(window, causal))
    _refuse_grad(q, k, v)
    cp = require_cupy()
    torch = torch_of(q)
    qc, kc, vc = (_as_cupy(cp, x, n) for x, n in ((q, "q"), (k, "k"), (v, "v")))
    devs = {x.device.id for x in (qc, kc, vc)}
    if len(devs) != 1:
        raise AttentionInputError(f"q, k, v are on devices {sorted(devs)}; expected all on one device")
    device = devs.pop()
    batch = _batch_of(seqlens, device)
    k_shape = kc.shape
    if batch.paged:
        if schedule != "flash2":
            raise AttentionInputError(f"schedule={schedule!r} with a paged cache (the batch has a block_table): "
                                      "chunked prefill runs schedule='flash2' (flash3's TMA boxes read whole "
                                      "contiguous tiles)")
        k_shape = vi.check_paged_cache(kc.shape, vc.shape, batch.page_size, batch.max_page)
    s = vi.check_shapes(qc.shape, k_shape, k_shape if batch.paged else vc.shape,
                        tuple(dtype_name(x.dtype) for x in (qc, kc, vc)))
    for x, name in ((qc, "q"), (kc, "k"), (vc, "v")):
        if not x.flags.c_contiguous or x.data.ptr % 16:
            raise AttentionInputError(f"{name}: expected a contiguous array with a 16-byte aligned data pointer")
    vi.check_totals(batch.total_q, s.total_k if batch.paged else batch.total_k, s)
    scale = check_scale(scale, s.head_dim)
    block_q, block_kv = _tiles(s, mask, options, schedule, batch.paged)
    with cp.cuda.Device(device), (torch_stream(cp, torch, device) if torch is not None else nullcontext()):
        if schedule == "flash3":
            flash3_host.require_hopper(cp)
        o_ret, o = output_array(cp, torch, options.out, (s.total_q, s.heads, s.head_dim),
                                (qc.dtype, q.dtype if torch is not None else None), "out:", device)
        lse_ret, lse = output_array(cp, torch, options.lse_out, (s.heads, s.total_q),
                                    (cp.float32, torch.float32 if torch is not None else None), "lse_out:", device)
        run = _launch_flash3 if schedule == "flash3" else _launch
        rec = run(cp, (qc, kc, vc, o, lse), batch, s, mask, (block_q, block_kv, scale))
    _record(rec)
    return Varlen(o_ret, lse_ret)


def _launch(cp: Any, arrays: tuple, batch: VarlenBatch, s: vi.VarlenShapes, mask: geo.Mask,
            tiles: tuple[int, int, float]) -> LaunchRecord:
    """The varlen kernel on (q, k, v, o, lse); returns what it launched."""
    block_q, block_kv, scale = tiles
    tiles_in_pages = batch.paged and page_tiles(batch.page_size, block_kv, s.head_dim)  # no row lists then
    smem = flash_smem_checked(cp, s.head_dim, block_q, block_kv, s.dtype, batch.paged and not tiles_in_pages)
    inst = build.FlashInstance(s.head_dim, block_q, block_kv, s.dtype, mask.causal, mask.local, True, batch.paged,
                               tiles_in_pages)
    grid = geo.varlen_grid(batch.max_seqlen_q, s.heads, batch.batch, block_q)
    block, i32 = (launch.FLASH_THREADS, 1, 1), cp.int32
    left, right = mask.kernel_window()
    table = batch.block_table if batch.paged else cp.uint64(0)  # null: k and v packed
    stride = int(batch.block_table.shape[1]) if batch.paged else 0
    _kernel(cp, inst, smem)(grid, block, (*arrays, i32(s.total_q), i32(s.total_k), i32(s.heads),
                                          i32(s.kv_heads), cp.float32(scale * _LOG2E), batch.cu_seqlens_q,
                                          batch.cu_seqlens_k, i32(left), i32(right), table, i32(stride),
                                          i32(batch.page_size)), shared_mem=smem)
    return LaunchRecord("flash2", batch.batch, batch.max_seqlen_q, max(batch.seqlens_k), s.heads, s.kv_heads,
                        s.head_dim, s.dtype, mask.causal, {"block_q": block_q, "block_kv": block_kv},
                        (KernelLaunch(inst.name_expression, grid, block, smem),), mask.window,
                        batch.seqlens_q, batch.seqlens_k, batch.page_size or None)


def _launch_flash3(cp: Any, arrays: tuple, batch: VarlenBatch, s: vi.VarlenShapes, mask: geo.Mask,
                   tiles: tuple[int, int, float]) -> LaunchRecord:
    """The flash3 varlen kernel on (q, k, v, o, lse) (:func:`iosim.gpu.flash3_host.launch_varlen`)."""
    block_q, block_kv, scale = tiles
    smem = launch.flash3_smem_bytes(s.head_dim, block_q, block_kv, build.ITEMSIZE[s.dtype])
    inst = build.Flash3Instance(s.head_dim, block_kv, s.dtype, mask.causal, mask.local, True)
    call = flash3_host.VarlenCall(tuple(zip(batch.seqlens_q, batch.seqlens_k, strict=True)),
                                  (batch.cu_seqlens_q, batch.cu_seqlens_k), mask, s.dtype, block_q, block_kv,
                                  scale * _LOG2E, smem)
    grid, block = flash3_host.launch_varlen(cp, _kernel(cp, inst, smem), arrays, call)
    return LaunchRecord("flash3", batch.batch, batch.max_seqlen_q, max(batch.seqlens_k), s.heads, s.kv_heads,
                        s.head_dim, s.dtype, mask.causal,
                        {"block_q": block_q, "block_kv": block_kv, "stages": launch.FLASH3_STAGES},
                        (KernelLaunch(inst.name_expression, grid, block, smem),), mask.window, batch.seqlens_q,
                        batch.seqlens_k)
