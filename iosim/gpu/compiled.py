"""Compilation of iosim's kernels through CuPy: one RawModule per instantiation, compiled at its first launch and
cached per process and device (CuPy caches the cubin on disk), and the device facts a launch checks against (the
shared memory a block may opt in to). Every GPU path (:mod:`iosim.gpu.attention`, ``backward``, ``varlen``, ``fp8``,
``flash_decode``) launches through it."""

from __future__ import annotations

import threading
from typing import Any

from iosim._resources import kernels_dir
from iosim.gpu import build

_modules: dict[tuple, Any] = {}
_lock = threading.Lock()


def _kernel(cp: Any, inst: Any, smem_bytes: int, trace: bool = False) -> Any:
    """The compiled kernel of ``inst``; ``trace``: the variant built with -DIOSIM_BLOCK_TRACE (then a pair
    (kernel, module), the module holding the ``iosim_block_trace`` pointer)."""
    key = (inst, cp.cuda.runtime.getDevice(), trace)
    hit = _modules.get(key)  # the common case, without the lock
    if hit is None:
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


_smem_limits: dict[int, int] = {}


def _smem_limit(cp: Any) -> int:
    """Shared memory one block may opt in to on the current device (read once per device: a query costs ~10 us)."""
    dev = cp.cuda.runtime.getDevice()
    if dev not in _smem_limits:
        _smem_limits[dev] = int(cp.cuda.Device(dev).attributes["MaxSharedMemoryPerBlockOptin"])
    return _smem_limits[dev]
