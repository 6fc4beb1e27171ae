"""The CUDA driver entry points CuPy does not wrap, called through :mod:`ctypes` on ``libcuda.so.1``: TMA tensor-map
encoding (:mod:`iosim.gpu.flash3_host`) and launches with attributes (a programmatic dependent launch).

Why ctypes: CuPy (our only GPU dependency) wraps neither, and ``cuda-python``/``cuda-bindings`` would be a second CUDA
binding to install and keep in step with CuPy's CUDA major; ``libcuda.so.1`` is always present where a kernel can run
at all (it is the driver), and the C ABI of these entry points has been stable since CUDA 12.0. A launch here runs in
the context CuPy made current (the device's primary context) on the stream CuPy calls current, as CuPy's own launches
do.

Nothing here imports CuPy.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

# CUlaunchAttributeID (cuda.h, CUDA 12.0+): the launched grid may start before the previous kernel on its stream has
# completed, once every block of that kernel has executed griddepcontrol.launch_dependents or exited; it must then
# execute griddepcontrol.wait before reading what that kernel writes (kernels/common.cuh wait_prerequisite_grids).
_PROGRAMMATIC_STREAM_SERIALIZATION = 6


class _Attribute(ctypes.Structure):  # CUlaunchAttribute: the id, padding to 8 bytes, a 64-byte value union
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_int * 16)]


class _LaunchConfig(ctypes.Structure):  # CUlaunchConfig
    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3), ("shared_mem", ctypes.c_uint),
                ("stream", ctypes.c_void_p), ("attrs", ctypes.POINTER(_Attribute)), ("num_attrs", ctypes.c_uint)]


_SIGNATURES = {
    "cuTensorMapEncodeTiled": [
        ctypes.c_void_p,  # CUtensorMap* (128 bytes, 64-byte aligned)
        ctypes.c_int,  # CUtensorMapDataType
        ctypes.c_uint32,  # rank
        ctypes.c_void_p,  # global address
        ctypes.POINTER(ctypes.c_uint64),  # globalDim[rank]
        ctypes.POINTER(ctypes.c_uint64),  # globalStrides[rank - 1], bytes
        ctypes.POINTER(ctypes.c_uint32),  # boxDim[rank]
        ctypes.POINTER(ctypes.c_uint32),  # elementStrides[rank]
        ctypes.c_int,  # interleave
        ctypes.c_int,  # swizzle
        ctypes.c_int,  # L2 promotion
        ctypes.c_int,  # OOB fill
    ],
    "cuLaunchKernelEx": [ctypes.POINTER(_LaunchConfig), ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p),
                         ctypes.c_void_p],
}
_libcuda: Any = None


def libcuda() -> Any:
    """``libcuda.so.1`` with the signatures of the entry points iosim calls (each returns a CUresult, 0 = success)."""
    global _libcuda
    if _libcuda is None:
        lib = ctypes.CDLL("libcuda.so.1")
        for name, argtypes in _SIGNATURES.items():
            fn = getattr(lib, name)
            fn.restype, fn.argtypes = ctypes.c_int, argtypes
        _libcuda = lib
    return _libcuda


def _argument(a: Any) -> ctypes._SimpleCData:
    """A kernel argument as its C value: a device array by its pointer, a NumPy scalar by its type."""
    data = getattr(a, "data", None)
    if hasattr(data, "ptr"):  # a CuPy array
        return ctypes.c_uint64(data.ptr)
    kind = {np.dtype(np.int32): ctypes.c_int32, np.dtype(np.uint64): ctypes.c_uint64,
            np.dtype(np.float32): ctypes.c_float}.get(getattr(a, "dtype", None))
    if kind is None:
        raise TypeError(f"a kernel argument must be a CuPy array or an int32, uint64 or float32 scalar, got {a!r}")
    return kind(a.item())


def launch_dependent(fn: Any, grid: tuple[int, int, int], block: tuple[int, int, int], args: tuple,
                     stream: int, shared_mem: int = 0) -> None:
    """Launch CuPy kernel ``fn`` (a RawModule function) on ``stream`` (a CUstream handle) as a programmatic dependent
    of the kernel launched before it there (see :data:`_PROGRAMMATIC_STREAM_SERIALIZATION`); for sm_90 and later
    (callers launch plainly before it)."""
    values = [_argument(a) for a in args]
    params = (ctypes.c_void_p * len(values))(*[ctypes.cast(ctypes.pointer(v), ctypes.c_void_p) for v in values])
    attr = _Attribute(id=_PROGRAMMATIC_STREAM_SERIALIZATION)
    attr.value[0] = 1  # programmaticStreamSerializationAllowed
    config = _LaunchConfig((ctypes.c_uint * 3)(*grid), (ctypes.c_uint * 3)(*block), shared_mem,
                           ctypes.c_void_p(stream), ctypes.pointer(attr), 1)
    function = getattr(fn, "kernel", fn).ptr  # CuPy's CUfunction handle
    rc = libcuda().cuLaunchKernelEx(ctypes.byref(config), ctypes.c_void_p(function), params, None)
    if rc != 0:
        raise RuntimeError(f"cuLaunchKernelEx (a programmatic dependent launch, grid {grid}, block {block}) failed "
                           f"with CUresult {rc}")
