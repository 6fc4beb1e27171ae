"""Run attention on the GPU with iosim's own kernels: FlashAttention-2's forward, FlashAttention-3's (Hopper) or the
naive three-kernel path.

    >>> from iosim import gpu
    >>> o = gpu.attention(q, k, v, causal=True)          # q (B, N, H, d), k and v (B, N_kv, H_kv, d)
    >>> o, lse = gpu.attention(q, k, v, return_lse=True)  # lse (B, H, N) fp32, natural log
    >>> gpu.last_launch()                                 # kernels, grid, block, shared memory, tiles

The launch geometry and shared-memory budget are in :mod:`iosim.launch`, the checks of the arguments in
:mod:`iosim.gpu.inputs` (the kernel files hold device code only); what gets compiled, with which options, is in
:mod:`iosim.gpu.build`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from iosim import launch
from iosim.gpu import build, flash3_host
from iosim.gpu._cupy import require_cupy
from iosim.gpu.compiled import _kernel, _set_block_trace, _smem_limit
from iosim.gpu.inputs import (
    DEFAULT_OPTIONS,
    AttentionInputError,
    AttentionOptions,
    SharedMemoryError,
    dtype_name,
    torch_of,
    torch_stream,
    validate,
)
from iosim.gpu.varlen_inputs import check_window
from iosim.launch import varlen

_LOG2E = 1.4426950408889634


@dataclass(frozen=True)
class KernelLaunch:
    kernel: (
        str  # the template instantiation, e.g. "iosim::flash_fwd_kernel<128, 128, 32, __nv_bfloat16, false>"
    )
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    smem_bytes: int  # dynamic shared memory per block


@dataclass(frozen=True)
class LaunchRecord:
    """What one iosim.gpu.attention call launched, in order; for cross-checking the simulator."""

    schedule: str
    batch: int
    seq_len: int
    kv_len: int
    heads: int
    kv_heads: int
    head_dim: int
    dtype: str
    causal: bool
    tiles: dict[str, Any]  # flash2, flash3: {"block_q", "block_kv"} (flash3 also "stages"); naive: launch.NAIVE_TILES
    launches: tuple[KernelLaunch, ...] = field(default_factory=tuple)
    window: tuple[int | None, int | None] | None = None  # flash2's sliding window (left, right), None: none
    # attention_varlen: each sequence's queries and keys (seq_len, kv_len: the longest query and key sequence)
    seqlens_q: tuple[int, ...] | None = None
    seqlens_k: tuple[int, ...] | None = None
    page_size: int | None = None  # attention_varlen against a paged cache (chunked prefill): tokens per page


_last: LaunchRecord | None = None


def last_launch() -> LaunchRecord | None:
    """The LaunchRecord of the most recent attention() or attention_backward() call in this process (None before
    the first)."""
    return _last


def _record(rec: LaunchRecord) -> None:
    global _last
    _last = rec


def default_tiles(head_dim: int, dtype: Any = "bfloat16", causal: bool = False) -> tuple[int, int]:
    """(block_q, block_kv) that schedule="flash2" uses when none are given."""
    return build.default_tiles(head_dim, dtype_name(dtype), causal)


# ------------------------------------------------------------------------------------------------------------------
# the API


_NO_MASK = varlen.Mask(False, None)


@dataclass
class _Call:
    """One call's arrays and sizes, checked: q (B, N, H, D); k, v (B, Nk, Hk, D); o like q; lse (B, H, N) or None."""

    cp: Any
    q: Any
    k: Any
    v: Any
    o: Any
    lse: Any
    dtype: str
    scale: float
    causal: bool
    mask: varlen.Mask = _NO_MASK  # flash2: the causal flag and window, as the kernel takes them

    @property
    def sizes(self) -> tuple[int, int, int, int, int, int]:
        B, N, H, D = self.q.shape
        return int(B), int(N), int(H), int(D), int(self.k.shape[1]), int(self.k.shape[2])

    def need_lse(self) -> None:
        """The flash kernels always write lse (counted by their schedules): give them a buffer."""
        if self.lse is None:
            B, N, H, _, _, _ = self.sizes
            self.lse = self.cp.empty((B, H, N), dtype=self.cp.float32)


def _no_varlen(cp: Any) -> tuple:
    """The dense kernel's last seven arguments: no cu_seqlens (null pointers), no window, no block table."""
    return cp.uint64(0), cp.uint64(0), cp.int32(0), cp.int32(0), *_no_pages(cp)


def _no_pages(cp: Any) -> tuple:
    """The flash2 kernel's last three arguments where k and v are not a paged cache: null table, stride, page size."""
    return cp.uint64(0), cp.int32(0), cp.int32(0)


def _run_flash3(c: _Call) -> tuple[tuple[KernelLaunch, ...], dict]:
    cp, (_, _, _, D, _, _) = c.cp, c.sizes
    flash3_host.require_hopper(cp)
    block_q, block_kv = launch.FLASH3_TILES[D]
    smem = launch.flash3_smem_bytes(D, block_q, block_kv, build.ITEMSIZE[c.dtype])
    c.need_lse()
    inst = build.Flash3Instance(D, block_kv, c.dtype, c.causal, c.mask.local)
    grid, block = flash3_host.launch_kernel(cp, _kernel(cp, inst, smem), c.q, c.k, c.v, c.o, c.lse, causal=c.causal,
                                       scale_log2=c.scale * _LOG2E, dtype=c.dtype, block_q=block_q,
                                       block_kv=block_kv, smem=smem, window=c.mask.kernel_window())
    return (KernelLaunch(inst.name_expression, grid, block, smem),), \
        {"block_q": block_q, "block_kv": block_kv, "stages": launch.FLASH3_STAGES}


def _run_flash2(c: _Call, block_q: int | None, block_kv: int | None, block_trace: Any):
    cp, (B, N, H, D, Nk, Hk) = c.cp, c.sizes
    if c.mask.local:
        return _run_local(c, block_q, block_kv)
    if block_q is None:
        block_q, block_kv = build.default_tiles(D, c.dtype, c.causal)
    itemsize, limit = build.ITEMSIZE[c.dtype], _smem_limit(cp)
    smem = launch.flash_smem_bytes(D, block_q, block_kv, itemsize)
    if smem > limit:
        terms = ", ".join(f"{n} {b} B" for n, b in launch.flash_smem_terms(D, block_q, block_kv, itemsize).items())
        raise SharedMemoryError(f"block_q={block_q}, block_kv={block_kv}, head_dim={D}, {c.dtype}: needs {smem} B of "
                                f"shared memory per block ({terms}); this device allows {limit} B; use smaller tiles, "
                                f"e.g. {build.default_tiles(D, c.dtype, c.causal)}")
    c.need_lse()
    inst = build.FlashInstance(D, block_q, block_kv, c.dtype, c.causal)
    grid = ((N + block_q - 1) // block_q, H, B)  # Q tiles fastest: co-resident blocks share K/V in L2
    if block_trace is None:
        fn = _kernel(cp, inst, smem)
    else:
        fn, mod = _kernel(cp, inst, smem, trace=True)
        _set_block_trace(cp, mod, block_trace, grid[0] * H * B)
    block, i32 = (launch.FLASH_THREADS, 1, 1), cp.int32
    fn(grid, block, (c.q, c.k, c.v, c.o, c.lse, i32(N), i32(Nk), i32(H), i32(Hk), cp.float32(c.scale * _LOG2E),
                     *_no_varlen(cp)), shared_mem=smem)
    return (KernelLaunch(inst.name_expression, grid, block, smem),), {"block_q": block_q, "block_kv": block_kv}


def flash_smem_checked(cp: Any, head_dim: int, block_q: int, block_kv: int, dtype: str, paged: bool = False) -> int:
    """The flash2 kernel's shared memory per block (``paged``: the paged kernel's), or SharedMemoryError where the
    device allows less."""
    itemsize, limit = build.ITEMSIZE[dtype], _smem_limit(cp)
    smem = launch.flash_smem_bytes(head_dim, block_q, block_kv, itemsize, paged)
    if smem > limit:
        terms = ", ".join(f"{n} {b} B" for n, b in launch.flash_smem_terms(head_dim, block_q, block_kv,
                                                                          itemsize, paged).items())
        raise SharedMemoryError(f"block_q={block_q}, block_kv={block_kv}, head_dim={head_dim}, {dtype}: needs {smem} B "
                                f"of shared memory per block ({terms}); this device allows {limit} B")
    return smem


def local_tiles(head_dim: int, block_q: int | None, block_kv: int | None) -> tuple[int, int]:
    """The tiles of a windowed (Local) launch: those given, which must be compiled for it, or the default."""
    if block_q is None:
        return varlen.varlen_default_tiles(head_dim, True)
    if (block_q, block_kv) not in varlen.FLASH_LOCAL_TILES[head_dim]:
        raise AttentionInputError(f"(block_q, block_kv)=({block_q}, {block_kv}) is not compiled for a window at "
                                  f"head_dim={head_dim}; expected one of {list(varlen.FLASH_LOCAL_TILES[head_dim])}")
    return block_q, block_kv


def _run_local(c: _Call, block_q: int | None, block_kv: int | None):
    """A sliding window on the dense batch: the varlen kernel's Local mode without cu_seqlens."""
    cp, (B, N, H, D, Nk, Hk) = c.cp, c.sizes
    block_q, block_kv = local_tiles(D, block_q, block_kv)
    smem = flash_smem_checked(cp, D, block_q, block_kv, c.dtype)
    c.need_lse()
    inst = build.FlashInstance(D, block_q, block_kv, c.dtype, False, True, True)
    grid, block, i32 = ((N + block_q - 1) // block_q, H, B), (launch.FLASH_THREADS, 1, 1), cp.int32
    left, right = c.mask.kernel_window()
    _kernel(cp, inst, smem)(grid, block, (c.q, c.k, c.v, c.o, c.lse, i32(N), i32(Nk), i32(H), i32(Hk),
                                          cp.float32(c.scale * _LOG2E), cp.uint64(0), cp.uint64(0), i32(left),
                                          i32(right), *_no_pages(cp)), shared_mem=smem)
    return (KernelLaunch(inst.name_expression, grid, block, smem),), {"block_q": block_q, "block_kv": block_kv}


def _naive_kernels(c: _Call) -> tuple[tuple[KernelLaunch, ...], dict, tuple[Callable[[], None], ...]]:
    """naive.cu's three kernels on the call's arrays (S and P allocated here): their launches, tiles, and one
    callable per kernel that launches it alone (S = scale QK^T, P = softmax(S), O = P V, in that order)."""
    cp, (B, N, H, D, Nk, Hk) = c.cp, c.sizes
    itemsize, limit = build.ITEMSIZE[c.dtype], _smem_limit(cp)
    smem_sm = launch.naive_softmax_smem_bytes(Nk, itemsize)
    if smem_sm > limit:
        raise SharedMemoryError(f"naive softmax holds one row of S (kv_len={Nk} at its pitch, {smem_sm} B) in "
                                f"shared memory; this device allows {limit} B per block; use kv_len <= "
                                f"{limit // itemsize} or schedule='flash2'")
    t, i32 = launch.NAIVE_TILES, cp.int32
    pitch = launch.naive_row_pitch(Nk, itemsize)  # rows 16-byte aligned (naive.cu row_pitch)
    s = cp.empty((B, H, N, pitch), dtype=c.q.dtype)  # S, materialized (Alg. 0 line 1)
    p = cp.empty((B, H, N, pitch), dtype=c.q.dtype)  # P, materialized (Alg. 0 line 2)
    insts = [build.NaiveInstance("qk", c.dtype, c.causal, D),
             build.NaiveInstance("softmax", c.dtype, chunks=launch.naive_softmax_chunks(Nk, itemsize)),
             build.NaiveInstance("pv", c.dtype, head_dim=D)]
    smem = (launch.naive_qk_smem_bytes(D, itemsize), smem_sm, launch.naive_pv_smem_bytes(D, itemsize))
    fns = [_kernel(cp, i, m) for i, m in zip(insts, smem, strict=True)]
    rows, row_threads = B * H * N, launch.naive_softmax_row_threads(Nk, itemsize)
    rows_per_block = launch.naive_softmax_rows_per_block(Nk, itemsize)
    grids = [(-(-Nk // t["qk"]["block_n"]), -(-N // t["qk"]["block_m"]), B * H), (-(-rows // rows_per_block), 1, 1),
             (1, -(-N // t["pv"]["block_m"]), B * H)]  # pv: one block per 128 query rows, all head dims
    blocks = [(t[x]["threads"], 1, 1) for x in ("qk", "softmax", "pv")]
    lse_arg = c.lse if c.lse is not None else cp.uint64(0)  # a null pointer: the kernel skips lse
    args = [(c.q, c.k, s, i32(N), i32(Nk), i32(H), i32(Hk), cp.float32(c.scale)),
            (s, p, lse_arg, i32(Nk), cp.int64(rows), i32(row_threads)),
            (p, c.v, c.o, i32(N), i32(Nk), i32(H), i32(Hk), i32(c.causal))]
    runs = tuple(partial(f, g, b, a, shared_mem=m)
                 for f, g, b, a, m in zip(fns, grids, blocks, args, smem, strict=True))
    launches = tuple(KernelLaunch(i.name_expression, g, b, m)
                     for i, g, b, m in zip(insts, grids, blocks, smem, strict=True))
    return launches, {k_: dict(v_) for k_, v_ in t.items()}, runs


def _run_naive(c: _Call) -> tuple[tuple[KernelLaunch, ...], dict]:
    launches, tiles, runs = _naive_kernels(c)
    for run in runs:
        run()
    return launches, tiles


def naive_kernels(q: Any, k: Any, v: Any, *, causal: bool = False) -> tuple[tuple[Callable[[], None], ...], Any]:
    """The naive schedule's three kernels on ``q``, ``k``, ``v`` (as :func:`attention` takes them) as three calls,
    each launching one kernel on the current stream (S = scale QK^T, P = softmax(S), O = P V; S and P allocated
    once), and the CuPy array they write O into. Run in order, they compute ``attention(q, k, v,
    schedule="naive", causal=causal)``; one alone is what ``iosim calibrate rates`` times
    (:mod:`iosim.calibrate.naive_step`)."""
    cp = require_cupy()
    a = validate(cp, q, k, v, "naive", causal, None)
    with cp.cuda.Device(a.device):
        _, o = a.empty(tuple(int(x) for x in a.q.shape))
        return _naive_kernels(_Call(cp, a.q, a.k, a.v, o, None, a.dtype, a.scale, causal))[2], o


def attention(q: Any, k: Any, v: Any, *, schedule: str = "flash2", causal: bool = False, scale: float | None = None,
              return_lse: bool = False, options: AttentionOptions = DEFAULT_OPTIONS) -> Any:
    """The forward kernels behind :func:`iosim.gpu.attention` (which documents every argument), without autograd:
    tensors are read as values, gradients are never tracked. :mod:`iosim.gpu.autograd` calls it inside its op."""
    global _last
    out, lse_out, block_trace = options.out, options.lse_out, options.block_trace
    plain = schedule == "flash2" and out is None and lse_out is None and block_trace is None and options.window is None
    key = _plan_key(q, k, v, causal, options.block_q, options.block_kv, scale) if plain else None
    if key is not None and (done := _replay(key, q, k, v, return_lse)) is not None:
        return done
    cp = require_cupy()
    a = validate(cp, q, k, v, schedule, causal, scale, options)
    if block_trace is not None and schedule != "flash2":
        raise ValueError("block_trace is supported by schedule='flash2' only")
    window = check_window(options.window, causal)
    if window is not None and schedule not in ("flash2", "flash3"):
        raise AttentionInputError(f"window={options.window!r}: a sliding window is schedule='flash2''s or "
                                  f"'flash3''s; expected None with schedule={schedule!r}")
    mask = varlen.mask_of(causal, window)
    if block_trace is not None and mask.local:
        raise AttentionInputError("block_trace: the block timeline is the dense kernel's; expected None with a window")
    B, N, H, D = (int(s) for s in a.q.shape)
    with cp.cuda.Device(a.device), a.stream():
        o_ret, o = (out, a.out) if out is not None else a.empty((B, N, H, D))
        lse_ret, lse = (lse_out, a.lse_out) if lse_out is not None else \
            a.empty((B, H, N), lse=True) if return_lse else (None, None)
        c = _Call(cp, a.q, a.k, a.v, o, lse, a.dtype, a.scale, mask.causal, mask)
        if schedule == "flash3":
            launches, tiles = _run_flash3(c)
        elif schedule == "flash2":
            launches, tiles = _run_flash2(c, options.block_q, options.block_kv, block_trace)
        else:
            launches, tiles = _run_naive(c)
    _last = LaunchRecord(schedule, B, N, int(a.k.shape[1]), H, int(a.k.shape[2]), D, a.dtype, causal, tiles,
                         launches, window)
    if key is not None:
        _remember(key, c, _last, a.device)
    return (o_ret, lse_ret) if return_lse else o_ret


# ------------------------------------------------------------------------------------------------------------------
# repeat calls on torch tensors: a flash2 call validated once is launched again from a plan, without the checks and
# CuPy views that cost more host time than a small problem's kernel (benchmarks/bench_host.py)


@dataclass(frozen=True)
class _Plan:
    fn: Any  # the compiled kernel
    launch: KernelLaunch
    scalars: tuple  # N, N_kv, H, H_kv, scale * log2(e) and no cu_seqlens or window, as the kernel takes them
    lse_shape: tuple[int, int, int]
    device: int
    record: LaunchRecord


_plans: dict[tuple, _Plan] = {}
_MAX_PLANS = 256


def _plan_key(q: Any, k: Any, v: Any, causal, block_q, block_kv, scale) -> tuple | None:
    """What makes two calls launch the same kernel the same way: torch tensors' shapes, dtypes, devices and the
    options (None where q is not a torch tensor)."""
    if torch_of(q) is None or torch_of(k) is None or torch_of(v) is None:
        return None
    return (q.shape, k.shape, v.shape, q.dtype, k.dtype, v.dtype, q.device, k.device, v.device, causal, block_q,
            block_kv, scale)


def _replay(key: tuple, q: Any, k: Any, v: Any, return_lse: bool) -> Any:
    """The call launched from its plan, or None (no plan, or a tensor not contiguous, aligned or on the current
    device: the checked path then decides)."""
    global _last
    plan = _plans.get(key)
    if plan is None or not (q.is_contiguous() and k.is_contiguous() and v.is_contiguous()):
        return None
    ptrs = (q.data_ptr(), k.data_ptr(), v.data_ptr())
    cp = require_cupy()
    if any(p % 16 for p in ptrs) or cp.cuda.runtime.getDevice() != plan.device:
        return None
    torch = torch_of(q)
    o = torch.empty_like(q)
    lse = torch.empty(plan.lse_shape, dtype=torch.float32, device=q.device)
    u, L = cp.uint64, plan.launch
    with torch_stream(cp, torch, plan.device):
        plan.fn(L.grid, L.block, (*map(u, ptrs), u(o.data_ptr()), u(lse.data_ptr()), *plan.scalars),
                shared_mem=L.smem_bytes)
    _last = plan.record
    return (o, lse) if return_lse else o


def _remember(key: tuple, c: _Call, record: LaunchRecord, device: int) -> None:
    """Keep the plan of a checked flash2 call on torch tensors (the oldest plans go when there are too many)."""
    if len(_plans) >= _MAX_PLANS:
        _plans.clear()
    B, N, H, D, Nk, Hk = c.sizes
    L = record.launches[0]
    inst = build.FlashInstance(D, record.tiles["block_q"], record.tiles["block_kv"], c.dtype, c.causal)
    i32 = c.cp.int32
    _plans[key] = _Plan(_kernel(c.cp, inst, L.smem_bytes), L, (i32(N), i32(Nk), i32(H), i32(Hk),
                                                          c.cp.float32(c.scale * _LOG2E), *_no_varlen(c.cp)),
                        (B, H, N), device, record)
