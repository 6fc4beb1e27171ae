"""The arguments of :func:`iosim.gpu.attention`, checked where they enter: CuPy or DLPack arrays of the right shapes,
dtypes, layout and device, tiles the library compiles, outputs that fit. Every error names the argument, the value
and what was expected.

torch tensors are viewed without DLPack (:func:`torch_view`: a CuPy array over ``data_ptr()``, the tensor kept
alive by it): torch's ``__dlpack__`` export cost about 25 us per tensor on an H200 (torch 2.11), two thirds of
a small call's host time. A call with a torch ``q`` runs on torch's current stream and returns torch tensors
(:class:`Checked`).
"""

from __future__ import annotations

import math
import sys
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import numpy as np

from iosim import launch
from iosim.gpu import build

SCHEDULES = ("flash2", "naive", "flash3")


class AttentionInputError(ValueError):
    """An argument of iosim.gpu.attention has a wrong value (shape, layout, device, tile, ...)."""


class AttentionTypeError(TypeError):
    """An argument of iosim.gpu.attention has a wrong type or dtype."""


class SharedMemoryError(AttentionInputError):
    """A tile configuration needs more shared memory per block than the device allows."""


@dataclass(frozen=True)
class AttentionOptions:
    """What :func:`iosim.gpu.attention` takes beyond the math (q, k, v, schedule, causal, scale, return_lse), each
    None for the default.

    ``block_q``, ``block_kv``: flash2's tiles Br, Bc (both or neither; default :func:`iosim.gpu.default_tiles`).
    ``out``, ``lse_out``: preallocated outputs, CuPy arrays or CUDA torch tensors (every element is overwritten;
    returned as given). ``block_trace``: flash2 only, a CuPy uint64 array of 4 x (thread blocks) elements that the
    kernel built with -DIOSIM_BLOCK_TRACE fills with each block's ``start_ns, end_ns, sm_id, 0``. These four are
    for calls that are not differentiated. ``deterministic``: the backward's mode of a differentiable call (torch
    tensors that require grad; None: ``torch.are_deterministic_algorithms_enabled()``). ``window``: flash2's and
    flash3's (16-bit inputs) sliding window (left, right), FlashAttention's window_size: query i sees keys j with
    i + off - left <= j <= i + off + right (off = kv_len - seq_len), each bound an integer >= 0 or None (no bound);
    with causal=True, right is 0. Not differentiable (:func:`iosim.gpu.varlen_inputs.check_window` checks it)."""

    block_q: int | None = None
    block_kv: int | None = None
    out: Any = None
    lse_out: Any = None
    block_trace: Any = None
    deterministic: bool | None = None
    window: tuple[int | None, int | None] | None = None


DEFAULT_OPTIONS = AttentionOptions()


@dataclass(frozen=True)
class BackwardOptions:
    """What :func:`iosim.gpu.attention_backward` takes beyond the tensors and the causal mask.

    ``schedule``: "flash2" (kernels/flash_bwd.cu, mma.sync) or "flash3" (kernels/flash3_bwd.cu, Hopper only).
    ``scale``: the forward's (default 1/sqrt(head_dim)). ``deterministic``: no atomic reductions (a second, Q-outer
    kernel computes dQ), so repeated calls give identical bits. ``out``: preallocated (dq, dk, dv), CuPy arrays or
    CUDA torch tensors like q, k, v (every element is overwritten; returned as given)."""

    schedule: str = "flash2"
    scale: float | None = None
    deterministic: bool = False
    out: tuple[Any, Any, Any] | None = None


def options_of(options: Any, kind: type) -> Any:
    """``options`` as given, or ``kind``'s defaults for None; AttentionTypeError for anything else."""
    if options is None:
        return kind()
    if not isinstance(options, kind):
        raise AttentionTypeError(f"options: got {type(options).__name__}; expected iosim.gpu.{kind.__name__}(...) "
                                 "or None")
    return options


def dtype_name(dtype: Any) -> str:
    """'float16' / 'bfloat16' for NumPy/CuPy dtypes (bf16 is ml_dtypes.bfloat16 in CuPy 14), else str(dtype)."""
    name = getattr(dtype, "name", None)
    if name is None:
        try:
            name = np.dtype(dtype).name
        except Exception:
            name = str(dtype)
    return "bfloat16" if name in ("bfloat16", "bf16") else str(name)


# ------------------------------------------------------------------------------------------------------------------
# torch tensors without DLPack

_TORCH_DTYPES: dict[Any, Any] = {}  # torch dtype -> the CuPy dtype DLPack gives it (looked up once per dtype)
_STREAMS: dict[tuple[int, int], Any] = {}  # (torch stream pointer, device) -> cupy.cuda.ExternalStream


def torch_of(x: Any) -> Any:
    """The torch module where ``x`` is a torch tensor, else None (never imports torch)."""
    torch = sys.modules.get("torch")
    return torch if torch is not None and isinstance(x, torch.Tensor) else None


def byte_geometry(shape: tuple[int, ...], stride: tuple[int, ...], itemsize: int) -> tuple[tuple[int, ...], int]:
    """(strides in bytes, bytes from the first element to the end of the last) of a strided view (strides >= 0,
    as torch's are); 0 bytes when a dimension is empty."""
    strides = tuple(st * itemsize for st in stride)
    if any(n == 0 for n in shape):
        return strides, 0
    return strides, itemsize + sum((n - 1) * st for n, st in zip(shape, strides, strict=True))


def _cupy_dtype(cp: Any, x: Any) -> Any:
    dt = _TORCH_DTYPES.get(x.dtype)
    if dt is None:
        try:
            dt = cp.from_dlpack(x.new_zeros(1)).dtype
        except Exception:  # a dtype CuPy does not take: the DLPack path words the error
            return None
        _TORCH_DTYPES[x.dtype] = dt
    return dt


def torch_view(cp: Any, x: Any) -> Any:
    """A CuPy array over CUDA tensor ``x``'s memory, with its shape, strides, dtype and device, keeping ``x`` alive
    (cupy.cuda.UnownedMemory's owner); None where ``x`` is not a dense, non-empty CUDA tensor of a dtype CuPy
    takes, or requires grad (the DLPack path then imports it or words the error, as before)."""
    torch = torch_of(x)
    try:
        if (torch is None or not x.is_cuda or x.requires_grad or x.layout is not torch.strided
                or x.numel() == 0):
            return None
        dt = _cupy_dtype(cp, x)
        if dt is None:
            return None
        strides, span = byte_geometry(tuple(x.shape), tuple(x.stride()), x.element_size())
        mem = cp.cuda.UnownedMemory(x.data_ptr(), span, x, x.get_device())
        return cp.ndarray(tuple(x.shape), dt, cp.cuda.MemoryPointer(mem, 0), strides)
    except Exception:  # a tensor subclass without storage (fake, meta, ...): the DLPack path decides
        return None


def torch_stream(cp: Any, torch: Any, device: int) -> Any:
    """torch's current stream on ``device`` as a CuPy stream to enter (within ``cupy.cuda.Device(device)``), or a
    null context where CuPy's current stream is that stream already (the default stream, usually)."""
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # what Triton calls; the public call is slower
    ptr = raw(device) if raw is not None else torch.cuda.current_stream(device).cuda_stream
    if ptr == cp.cuda.get_current_stream().ptr:
        return nullcontext()
    stream = _STREAMS.get((ptr, device))
    if stream is None:
        stream = _STREAMS[(ptr, device)] = cp.cuda.ExternalStream(ptr, device)
    return stream


def _as_cupy(cp: Any, x: Any, name: str) -> Any:
    if isinstance(x, cp.ndarray):
        return x
    view = torch_view(cp, x)
    if view is not None:
        return view
    if hasattr(x, "__dlpack__"):  # torch tensors (bf16 included) torch_view left, JAX arrays, ...
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


def _check_shapes(q, k, v, schedule: str) -> None:
    """k and v alike, sharing q's batch and head dim, a whole group of query heads per kv head, a head dim and a
    grid the kernels take."""
    B, _, H, D = q.shape
    Bk, _, Hk, Dk = k.shape
    if tuple(v.shape) != tuple(k.shape):
        raise AttentionInputError(f"v: shape {tuple(v.shape)} differs from k's {tuple(k.shape)}; expected equal")
    if Bk != B:
        raise AttentionInputError(f"k: batch {Bk} differs from q's batch {B}; expected equal")
    if Dk != D:
        raise AttentionInputError(f"k: head_dim {Dk} differs from q's head_dim {D}; expected equal")
    if H % Hk:
        raise AttentionInputError(
            f"k: kv_heads={Hk} does not divide q's heads={H}; expected heads to be a multiple of kv_heads")
    if schedule == "flash3" and D not in launch.FLASH3_TILES:
        raise AttentionInputError(
            f"q: head_dim={D} is not supported by schedule='flash3'; expected one of {list(launch.FLASH3_TILES)}")
    if D not in launch.HEAD_DIMS:
        raise AttentionInputError(f"q: head_dim={D} is not supported; expected one of {list(launch.HEAD_DIMS)}")
    if H > 65535 or B > 65535:
        raise AttentionInputError(f"q: heads={H}, batch={B}; expected each <= 65535 (CUDA grid limit)")


def _check_dtypes(q, k, v) -> str:
    dt = dtype_name(q.dtype)
    if dt not in build.CUDA_TYPES:
        raise AttentionTypeError(f"q: dtype {q.dtype} is not supported; expected float16 or bfloat16")
    for name, x in (("k", k), ("v", v)):
        if dtype_name(x.dtype) != dt:
            raise AttentionTypeError(f"{name}: dtype {x.dtype} differs from q's {q.dtype}; expected the same dtype")
    return dt


def check_options(schedule: Any, causal: Any) -> None:
    """A schedule the library runs and a causal flag that is a bool (every call, differentiable or not)."""
    if schedule not in SCHEDULES:
        raise AttentionInputError(f"schedule={schedule!r}: expected one of {SCHEDULES}")
    if not isinstance(causal, bool):
        raise AttentionTypeError(f"causal={causal!r}: expected True or False")


def check_scale(scale, head_dim: int) -> float:
    if scale is None:
        return 1.0 / math.sqrt(head_dim)
    try:
        scale = float(scale)
    except (TypeError, ValueError):
        raise AttentionTypeError(f"scale={scale!r}: expected a positive float") from None
    if not (math.isfinite(scale) and scale > 0):
        raise AttentionInputError(f"scale={scale!r}: expected a finite positive float")
    return scale


def _check_tiles(schedule: str, head_dim: int, block_q, block_kv) -> None:
    """Tiles the library compiles for the schedule and head dim (none for naive; one per head dim for flash3)."""
    D = head_dim
    if schedule == "naive":
        if block_q is not None or block_kv is not None:
            raise AttentionInputError(f"block_q={block_q!r}, block_kv={block_kv!r}: the naive schedule has fixed "
                                      "tiles (iosim.launch.NAIVE_TILES); expected None")
    elif schedule == "flash3":
        if (block_q, block_kv) not in ((None, None), launch.FLASH3_TILES[D]):
            raise AttentionInputError(
                f"(block_q, block_kv)=({block_q!r}, {block_kv!r}): schedule='flash3' compiles one tile per head dim; "
                f"expected None or {launch.FLASH3_TILES[D]} at head_dim={D}")
    elif (block_q is None) != (block_kv is None):
        raise AttentionInputError(f"block_q={block_q!r}, block_kv={block_kv!r}: give both or neither")
    elif block_q is not None and (block_q, block_kv) not in launch.FLASH_TILES[D]:
        raise AttentionInputError(f"(block_q, block_kv)=({block_q!r}, {block_kv!r}) is not compiled for "
                                  f"head_dim={D}; expected one of {list(launch.FLASH_TILES[D])}")


def _check_outputs(cp, q, dt: str, out, lse_out, device: int) -> None:
    """Preallocated outputs: CuPy, contiguous, of the output's shape and dtype, on the inputs' device."""
    B, N, H, D = q.shape
    for name, arr, shape, want in (("out", out, (B, N, H, D), dt), ("lse_out", lse_out, (B, H, N), "float32")):
        if arr is None:
            continue
        if not isinstance(arr, cp.ndarray):
            raise AttentionTypeError(f"{name}: got {type(arr).__name__}; expected a CuPy array or a CUDA torch "
                                     "tensor that does not require grad")
        if tuple(arr.shape) != shape or dtype_name(arr.dtype) != want or not arr.flags.c_contiguous:
            raise AttentionInputError(f"{name}: {tuple(arr.shape)} {arr.dtype} (contiguous={arr.flags.c_contiguous}); "
                                      f"expected a contiguous {shape} {want} array")
        if arr.device.id != device:
            raise AttentionInputError(f"{name}: on device {arr.device.id}; expected device {device}")


@dataclass
class Checked:
    """validate()'s result: CuPy views of q, k, v and of the outputs given (None where not given), the dtype name,
    the scale and the device; ``torch`` (the module) where q is a torch tensor: the call then runs on torch's
    current stream and the outputs it makes are torch tensors (torch in, torch out)."""

    cp: Any
    q: Any
    k: Any
    v: Any
    out: Any
    lse_out: Any
    dtype: str
    scale: float
    device: int
    torch: Any = None
    torch_dtype: Any = None

    def stream(self) -> Any:
        """The stream context to launch in (entered within ``cupy.cuda.Device(self.device)``)."""
        return nullcontext() if self.torch is None else torch_stream(self.cp, self.torch, self.device)

    def empty(self, shape: tuple[int, ...], lse: bool = False) -> tuple[Any, Any]:
        """A new output, q's dtype or fp32 (``lse``): (what the caller gets, the CuPy array the kernel writes)."""
        if self.torch is None:
            x = self.cp.empty(shape, dtype=self.cp.float32 if lse else self.q.dtype)
            return x, x
        t = self.torch.empty(shape, dtype=self.torch.float32 if lse else self.torch_dtype, device=self.device)
        return t, torch_view(self.cp, t)


def _output_view(cp: Any, x: Any) -> Any:
    """A given output as CuPy (a torch tensor viewed without copying); anything else as is, for the checks."""
    if x is None or isinstance(x, cp.ndarray):
        return x
    view = torch_view(cp, x)
    return x if view is None else view


def output_array(cp: Any, torch: Any, given: Any, shape: tuple[int, ...], dtypes: tuple[Any, Any], label: str,
                 device: int) -> tuple[Any, Any]:
    """(what the caller gets, the CuPy array the kernel writes) for one output of a call that makes its own: ``given``
    checked (``label`` starts its errors, e.g. "out:"), or a new array of ``dtypes`` = (CuPy dtype, torch dtype), a
    torch tensor where the call is on torch tensors (``torch`` the module, else None)."""
    if given is None:
        if torch is not None:
            t = torch.empty(shape, dtype=dtypes[1], device=device)
            return t, torch_view(cp, t)
        x = cp.empty(shape, dtype=dtypes[0])
        return x, x
    view = given if isinstance(given, cp.ndarray) else torch_view(cp, given)
    if view is None:
        raise AttentionTypeError(f"{label} got {type(given).__name__}; expected a CuPy array or a CUDA torch tensor "
                                 "that does not require grad")
    want = dtype_name(cp.dtype(dtypes[0]))
    if (tuple(view.shape) != shape or dtype_name(view.dtype) != want or not view.flags.c_contiguous
            or view.device.id != device):
        raise AttentionInputError(f"{label} {tuple(view.shape)} {dtype_name(view.dtype)} (contiguous="
                                  f"{view.flags.c_contiguous}, device {view.device.id}); expected a contiguous "
                                  f"{shape} {want} array on device {device}")
    return given, view


def validate(cp, q, k, v, schedule, causal, scale, options: AttentionOptions = DEFAULT_OPTIONS) -> Checked:
    """Every argument of :func:`iosim.gpu.attention` checked (of ``options``: the tiles and the outputs); returns
    CuPy views of them and how to make outputs."""
    check_options(schedule, causal)
    torch, torch_dtype = torch_of(q), getattr(q, "dtype", None)
    q, k, v = _as_cupy(cp, q, "q"), _as_cupy(cp, k, "k"), _as_cupy(cp, v, "v")
    _check_array(q, "q", "(batch, seq_len, heads, head_dim)")
    _check_array(k, "k", "(batch, kv_len, kv_heads, head_dim)")
    _check_array(v, "v", "(batch, kv_len, kv_heads, head_dim)")
    dt = _check_dtypes(q, k, v)
    _check_shapes(q, k, v, schedule)
    devs = {x.device.id for x in (q, k, v)}
    if len(devs) != 1:
        raise AttentionInputError(f"q, k, v are on devices {sorted(devs)}; expected all on one device")
    scale = check_scale(scale, int(q.shape[3]))
    _check_tiles(schedule, int(q.shape[3]), options.block_q, options.block_kv)
    out, lse_out = _output_view(cp, options.out), _output_view(cp, options.lse_out)
    device = devs.pop()
    _check_outputs(cp, q, dt, out, lse_out, device)
    return Checked(cp, q, k, v, out, lse_out, dt, scale, device, torch, torch_dtype if torch else None)
