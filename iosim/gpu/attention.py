"""Run attention on the GPU with iosim's own kernels: the FlashAttention-2 forward or the naive three-kernel path.

    >>> from iosim import gpu
    >>> o = gpu.attention(q, k, v, causal=True)          # q (B, N, H, d), k and v (B, N_kv, H_kv, d)
    >>> o, lse = gpu.attention(q, k, v, return_lse=True)  # lse (B, H, N) fp32, natural log
    >>> gpu.last_launch()                                 # kernels, grid, block, shared memory, tiles

Launch geometry and the shared-memory budget live here (the kernel files hold device code only); what gets
compiled, with which options, is in :mod:`iosim.gpu.build`.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field
from typing import Any

from iosim import launch
from iosim._resources import kernels_dir
from iosim.gpu import build, flash3
from iosim.gpu._cupy import require_cupy

SCHEDULES = ("flash2", "naive", "flash3")
_LOG2E = 1.4426950408889634


class AttentionInputError(ValueError):
    """An argument of iosim.gpu.attention has a wrong value (shape, layout, device, tile, ...)."""


class AttentionTypeError(TypeError):
    """An argument of iosim.gpu.attention has a wrong type or dtype."""


class SharedMemoryError(AttentionInputError):
    """A tile configuration needs more shared memory per block than the device allows."""


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


_last: LaunchRecord | None = None
_modules: dict[tuple, Any] = {}
_lock = threading.Lock()


def last_launch() -> LaunchRecord | None:
    """The LaunchRecord of the most recent attention() call in this process (None before the first)."""
    return _last


def default_tiles(head_dim: int, dtype: Any = "bfloat16", causal: bool = False) -> tuple[int, int]:
    """(block_q, block_kv) that schedule="flash2" uses when none are given."""
    return build.default_tiles(head_dim, _dtype_name(dtype), causal)


# ------------------------------------------------------------------------------------------------------------------
# inputs


def _dtype_name(dtype: Any) -> str:
    """'float16' / 'bfloat16' for NumPy/CuPy dtypes (bf16 is ml_dtypes.bfloat16 in CuPy 14), else str(dtype)."""
    name = getattr(dtype, "name", None)
    if name is None:
        try:
            import numpy as np

            name = np.dtype(dtype).name
        except Exception:
            name = str(dtype)
    return "bfloat16" if name in ("bfloat16", "bf16") else str(name)


def _as_cupy(cp: Any, x: Any, name: str) -> Any:
    if isinstance(x, cp.ndarray):
        return x
    if hasattr(x, "__dlpack__"):  # torch tensors (bf16 included), JAX arrays, ...
        dev = getattr(x, "device", None)
        if getattr(dev, "type", "cuda") == "cpu":
            raise AttentionInputError(
                f"{name}: tensor is on the CPU ({dev}); expected a tensor on a CUDA device"
            )
        try:
            return cp.from_dlpack(x)
        except Exception as exc:
            raise AttentionTypeError(
                f"{name}: could not import {type(x).__name__} through DLPack ({type(exc).__name__}: {exc}); "
                "expected a CUDA tensor of float16 or bfloat16"
            ) from None
    if hasattr(x, "__cuda_array_interface__"):
        try:
            return cp.asarray(x)
        except Exception as exc:
            raise AttentionTypeError(
                f"{name}: could not import {type(x).__name__} through __cuda_array_interface__ "
                f"({type(exc).__name__}: {exc})"
            ) from None
    raise AttentionTypeError(
        f"{name}: got {type(x).__name__}; expected a CuPy array or a GPU array exposing __dlpack__ or "
        "__cuda_array_interface__ (e.g. a CUDA torch tensor), shape (batch, seq_len, heads, head_dim)"
    )


def _check_array(x: Any, name: str, dims: str) -> None:
    if x.ndim != 4:
        raise AttentionInputError(f"{name}: shape {tuple(x.shape)} has {x.ndim} dims; expected 4 dims {dims}")
    if any(s < 1 for s in x.shape):
        raise AttentionInputError(f"{name}: shape {tuple(x.shape)} has an empty dimension; expected all >= 1")
    if not x.flags.c_contiguous:
        raise AttentionInputError(
            f"{name}: strides {x.strides} are not C-contiguous; expected a contiguous {dims} array "
            "(for a (B, H, N, d) torch tensor pass t.transpose(1, 2).contiguous())"
        )
    if x.data.ptr % 16:
        raise AttentionInputError(
            f"{name}: data pointer {x.data.ptr:#x} is not 16-byte aligned; expected aligned"
        )


def _validate(cp, q, k, v, schedule, causal, block_q, block_kv, scale, out, lse_out):
    if schedule not in SCHEDULES:
        raise AttentionInputError(f"schedule={schedule!r}: expected one of {SCHEDULES}")
    if not isinstance(causal, bool):
        raise AttentionTypeError(f"causal={causal!r}: expected True or False")
    q, k, v = _as_cupy(cp, q, "q"), _as_cupy(cp, k, "k"), _as_cupy(cp, v, "v")
    _check_array(q, "q", "(batch, seq_len, heads, head_dim)")
    _check_array(k, "k", "(batch, kv_len, kv_heads, head_dim)")
    _check_array(v, "v", "(batch, kv_len, kv_heads, head_dim)")
    dt = _dtype_name(q.dtype)
    if dt not in build.CUDA_TYPES:
        raise AttentionTypeError(f"q: dtype {q.dtype} is not supported; expected float16 or bfloat16")
    for name, x in (("k", k), ("v", v)):
        if _dtype_name(x.dtype) != dt:
            raise AttentionTypeError(
                f"{name}: dtype {x.dtype} differs from q's {q.dtype}; expected the same dtype"
            )
    B, N, H, D = q.shape
    Bk, _, Hk, Dk = k.shape
    if tuple(v.shape) != tuple(k.shape):
        raise AttentionInputError(
            f"v: shape {tuple(v.shape)} differs from k's {tuple(k.shape)}; expected equal"
        )
    if Bk != B:
        raise AttentionInputError(f"k: batch {Bk} differs from q's batch {B}; expected equal")
    if Dk != D:
        raise AttentionInputError(f"k: head_dim {Dk} differs from q's head_dim {D}; expected equal")
    if H % Hk:
        raise AttentionInputError(
            f"k: kv_heads={Hk} does not divide q's heads={H}; expected heads to be a multiple of kv_heads"
        )
    if schedule == "flash3" and D not in launch.FLASH3_TILES:
        raise AttentionInputError(
            f"q: head_dim={D} is not supported by schedule='flash3'; expected one of {list(launch.FLASH3_TILES)}"
        )
    if D not in launch.HEAD_DIMS:
        raise AttentionInputError(
            f"q: head_dim={D} is not supported; expected one of {list(launch.HEAD_DIMS)}"
        )
    if H > 65535 or B > 65535:
        raise AttentionInputError(f"q: heads={H}, batch={B}; expected each <= 65535 (CUDA grid limit)")
    devs = {x.device.id for x in (q, k, v)}
    if len(devs) != 1:
        raise AttentionInputError(f"q, k, v are on devices {sorted(devs)}; expected all on one device")
    if scale is None:
        scale = 1.0 / math.sqrt(D)
    try:
        scale = float(scale)
    except (TypeError, ValueError):
        raise AttentionTypeError(f"scale={scale!r}: expected a positive float") from None
    if not (math.isfinite(scale) and scale > 0):
        raise AttentionInputError(f"scale={scale!r}: expected a finite positive float")
    if schedule == "naive":
        if block_q is not None or block_kv is not None:
            raise AttentionInputError(
                f"block_q={block_q!r}, block_kv={block_kv!r}: the naive schedule has fixed tiles "
                f"(iosim.launch.NAIVE_TILES); expected None"
            )
    elif schedule == "flash3":
        if (block_q, block_kv) not in ((None, None), launch.FLASH3_TILES[D]):
            raise AttentionInputError(
                f"(block_q, block_kv)=({block_q!r}, {block_kv!r}): schedule='flash3' compiles one tile per head dim; "
                f"expected None or {launch.FLASH3_TILES[D]} at head_dim={D}"
            )
    elif (block_q is None) != (block_kv is None):
        raise AttentionInputError(f"block_q={block_q!r}, block_kv={block_kv!r}: give both or neither")
    elif block_q is not None and (block_q, block_kv) not in launch.FLASH_TILES[D]:
        raise AttentionInputError(
            f"(block_q, block_kv)=({block_q!r}, {block_kv!r}) is not compiled for head_dim={D}; "
            f"expected one of {list(launch.FLASH_TILES[D])}"
        )
    for name, arr, shape, want in (
        ("out", out, (B, N, H, D), dt),
        ("lse_out", lse_out, (B, H, N), "float32"),
    ):
        if arr is None:
            continue
        if not isinstance(arr, cp.ndarray):
            raise AttentionTypeError(f"{name}: got {type(arr).__name__}; expected a CuPy array")
        if tuple(arr.shape) != shape or _dtype_name(arr.dtype) != want or not arr.flags.c_contiguous:
            raise AttentionInputError(
                f"{name}: {tuple(arr.shape)} {arr.dtype} (contiguous={arr.flags.c_contiguous}); "
                f"expected a contiguous {shape} {want} array"
            )
        if arr.device.id not in devs:
            raise AttentionInputError(f"{name}: on device {arr.device.id}; expected device {q.device.id}")
    return q, k, v, dt, scale


# ------------------------------------------------------------------------------------------------------------------
# compilation (one module per instantiation, cached per process; CuPy caches the cubin on disk)


def _kernel(cp: Any, inst: Any, smem_bytes: int, trace: bool = False) -> Any:
    """The compiled kernel of ``inst``; ``trace``: the variant built with -DIOSIM_BLOCK_TRACE (then a pair
    (kernel, module), the module holding the ``iosim_block_trace`` pointer)."""
    dev = cp.cuda.Device()
    key = (inst, dev.id, trace)
    with _lock:
        hit = _modules.get(key)
        if hit is None:
            kdir = kernels_dir()
            code = (kdir / inst.source).read_text()
            opts = build.nvrtc_options(kdir) + getattr(inst, "nvrtc_extra", ())
            opts += ("-DIOSIM_BLOCK_TRACE",) if trace else ()
            mod = cp.RawModule(code=code, options=opts, name_expressions=[inst.name_expression])
            hit = (mod.get_function(inst.name_expression), mod)
            _modules[key] = hit
    fn, mod = hit
    if smem_bytes > 48 * 1024 and fn.max_dynamic_shared_size_bytes < smem_bytes:
        fn.max_dynamic_shared_size_bytes = smem_bytes  # opt in to more than 48 KB of dynamic shared memory
    return (fn, mod) if trace else fn


def _set_block_trace(cp: Any, mod: Any, buf: Any, n_blocks: int) -> None:
    if not (isinstance(buf, cp.ndarray) and buf.dtype == cp.uint64 and buf.size >= 4 * n_blocks):
        raise ValueError(
            f"block_trace: expected a CuPy uint64 array of at least 4 x {n_blocks} elements (one record per "
            f"thread block), got {type(buf).__name__} {getattr(buf, 'dtype', '')} size {getattr(buf, 'size', '?')}"
        )
    sym = mod.get_global("iosim_block_trace")
    cp.ndarray((1,), cp.uint64, memptr=sym)[0] = buf.data.ptr


def _smem_limit(cp: Any) -> int:
    return int(cp.cuda.Device().attributes["MaxSharedMemoryPerBlockOptin"])


# ------------------------------------------------------------------------------------------------------------------
# the API


def attention(
    q: Any,
    k: Any,
    v: Any,
    *,
    schedule: str = "flash2",
    causal: bool = False,
    block_q: int | None = None,
    block_kv: int | None = None,
    scale: float | None = None,
    return_lse: bool = False,
    out: Any = None,
    lse_out: Any = None,
    block_trace: Any = None,
) -> Any:
    """softmax(scale * Q K^T) V on the GPU with iosim's kernels.

    q: (batch, seq_len, heads, head_dim); k, v: (batch, kv_len, kv_heads, head_dim), heads a multiple of kv_heads
    (query head h uses kv head h // (heads // kv_heads)); contiguous, float16 or bfloat16, one device. CuPy arrays or
    anything with ``__dlpack__`` / ``__cuda_array_interface__`` (torch tensors).
    schedule: "flash2" (FlashAttention-2 forward, one kernel), "naive" (S and P materialized, three kernels) or
    "flash3" (FlashAttention-3-style forward: TMA, wgmma, warp specialization; Hopper (sm_90) only, head_dim 64,
    128 or 256, tiles :data:`iosim.launch.FLASH3_TILES`; raises :class:`iosim.gpu.HopperRequiredError` elsewhere).
    causal: query row i sees key j iff j <= i + kv_len - seq_len (bottom-right aligned); a row that sees no key
    gets O = 0 and lse = -inf.
    block_q, block_kv: flash2 tiles Br, Bc (both or neither; default :func:`default_tiles`).
    scale: default 1/sqrt(head_dim). return_lse: also return lse (batch, heads, seq_len) fp32, natural log.
    out, lse_out: optional preallocated CuPy outputs (every element is overwritten).
    block_trace: flash2 only: a CuPy uint64 array of 4 x (number of thread blocks) elements; the kernel (built with
    -DIOSIM_BLOCK_TRACE) writes each block's ``start_ns, end_ns, sm_id, 0`` at 4 x its linear block id
    (``blockIdx.x + Tr * (blockIdx.y + H * blockIdx.z)``), the timeline the L2 model's drift input is read from.
    Returns a CuPy array like q (and lse when asked).
    """
    global _last
    cp = require_cupy()
    q, k, v, dt, scale = _validate(cp, q, k, v, schedule, causal, block_q, block_kv, scale, out, lse_out)
    B, N, H, D = (int(s) for s in q.shape)
    Nk, Hk = int(k.shape[1]), int(k.shape[2])
    itemsize = build.ITEMSIZE[dt]
    i32 = cp.int32
    with cp.cuda.Device(q.device.id):
        o = out if out is not None else cp.empty((B, N, H, D), dtype=q.dtype)
        want_lse = return_lse or lse_out is not None
        lse = (
            lse_out if lse_out is not None else (cp.empty((B, H, N), dtype=cp.float32) if want_lse else None)
        )
        limit = _smem_limit(cp)
        if schedule == "flash3":
            if block_trace is not None:
                raise ValueError("block_trace is supported by schedule='flash2' only")
            flash3.require_hopper(cp)
            block_q, block_kv = launch.FLASH3_TILES[D]
            smem = launch.flash3_smem_bytes(D, block_q, block_kv, itemsize)
            if lse is None:  # the kernel always writes lse, as flash2's does
                lse = cp.empty((B, H, N), dtype=cp.float32)
            inst = build.Flash3Instance(D, block_kv, dt, causal)
            grid, block = flash3.launch_kernel(
                cp, _kernel(cp, inst, smem), q, k, v, o, lse, causal=causal, scale_log2=scale * _LOG2E,
                dtype=dt, block_q=block_q, block_kv=block_kv, smem=smem,
            )
            launches = (KernelLaunch(inst.name_expression, grid, block, smem),)
            tiles = {"block_q": block_q, "block_kv": block_kv, "stages": launch.FLASH3_STAGES}
        elif schedule == "flash2":
            if block_q is None:
                block_q, block_kv = build.default_tiles(D, dt, causal)
            smem = launch.flash_smem_bytes(D, block_q, block_kv, itemsize)
            if smem > limit:
                terms = ", ".join(
                    f"{n} {b} B" for n, b in launch.flash_smem_terms(D, block_q, block_kv, itemsize).items()
                )
                raise SharedMemoryError(
                    f"block_q={block_q}, block_kv={block_kv}, head_dim={D}, {dt}: needs {smem} B of shared memory "
                    f"per block ({terms}); this device allows {limit} B; use smaller tiles, e.g. "
                    f"{build.default_tiles(D, dt, causal)}"
                )
            if lse is None:  # the kernel always writes lse (B*H*N*4 bytes, counted by the flash2 schedule)
                lse = cp.empty((B, H, N), dtype=cp.float32)
            inst = build.FlashInstance(D, block_q, block_kv, dt, causal)
            grid = ((N + block_q - 1) // block_q, H, B)  # Q tiles fastest: co-resident blocks share K/V in L2
            if block_trace is None:
                fn = _kernel(cp, inst, smem)
            else:
                fn, mod = _kernel(cp, inst, smem, trace=True)
                _set_block_trace(cp, mod, block_trace, grid[0] * H * B)
            block = (launch.FLASH_THREADS, 1, 1)
            fn(
                grid,
                block,
                (q, k, v, o, lse, i32(N), i32(Nk), i32(H), i32(Hk), cp.float32(scale * _LOG2E)),
                shared_mem=smem,
            )
            launches = (KernelLaunch(inst.name_expression, grid, block, smem),)
            tiles: dict[str, Any] = {"block_q": block_q, "block_kv": block_kv}
        else:
            if block_trace is not None:
                raise ValueError("block_trace is supported by schedule='flash2' only")
            smem = launch.naive_softmax_smem_bytes(Nk, itemsize)
            if smem > limit:
                raise SharedMemoryError(
                    f"naive softmax holds one row of S (kv_len={Nk} x {itemsize} B = {smem} B) in shared memory; "
                    f"this device allows {limit} B per block; use kv_len <= {limit // itemsize} or schedule='flash2'"
                )
            t = launch.NAIVE_TILES
            s = cp.empty((B, H, N, Nk), dtype=q.dtype)  # S, materialized (Alg. 0 line 1)
            p = cp.empty((B, H, N, Nk), dtype=q.dtype)  # P, materialized (Alg. 0 line 2)
            i_qk = build.NaiveInstance("qk", dt, causal)
            i_sm = build.NaiveInstance("softmax", dt)
            i_pv = build.NaiveInstance("pv", dt)
            f_qk, f_sm, f_pv = _kernel(cp, i_qk, 0), _kernel(cp, i_sm, smem), _kernel(cp, i_pv, 0)
            g_qk = (-(-Nk // t["qk"]["block_n"]), -(-N // t["qk"]["block_m"]), B * H)
            g_sm = (B * H * N, 1, 1)
            g_pv = (1, -(-N // t["pv"]["block_m"]), B * H)  # one block per 64 query rows, all head dims
            b_qk, b_sm, b_pv = ((t[x]["threads"], 1, 1) for x in ("qk", "softmax", "pv"))
            f_qk(g_qk, b_qk, (q, k, s, i32(N), i32(Nk), i32(H), i32(Hk), i32(D), cp.float32(scale)))
            lse_arg = lse if lse is not None else cp.uint64(0)  # a null pointer: the kernel skips lse
            f_sm(g_sm, b_sm, (s, p, lse_arg, i32(Nk)), shared_mem=smem)
            f_pv(g_pv, b_pv, (p, v, o, i32(N), i32(Nk), i32(H), i32(Hk), i32(D)))
            launches = (
                KernelLaunch(i_qk.name_expression, g_qk, b_qk, 0),
                KernelLaunch(i_sm.name_expression, g_sm, b_sm, smem),
                KernelLaunch(i_pv.name_expression, g_pv, b_pv, 0),
            )
            tiles = {k_: dict(v_) for k_, v_ in t.items()}
    _last = LaunchRecord(schedule, B, N, Nk, H, Hk, D, dt, causal, tiles, launches)
    return (o, lse) if return_lse else o
