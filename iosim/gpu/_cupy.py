"""Lazy CuPy import: the only place iosim touches CuPy. ``import iosim`` and ``import iosim.gpu`` never import it."""

from __future__ import annotations

from typing import Any


class GPUUnavailableError(RuntimeError):
    """CuPy or a usable NVIDIA GPU is missing; the message says which and how to get it."""


# iosim is installed from a clone (no package index serves it), so the extra is named by the path
_INSTALL_HINT = ("on a machine with an NVIDIA GPU, install the GPU extra from the iosim clone: pip install '.[gpu]' "
                 "(CuPy for CUDA 13)")


def require_cupy() -> Any:
    """Return the cupy module with at least one visible CUDA device, or raise GPUUnavailableError (one line)."""
    try:
        import cupy
    except Exception as exc:  # ImportError, or a CUDA library that fails to load
        raise GPUUnavailableError(
            f"iosim.gpu needs CuPy and an NVIDIA GPU, but CuPy is not importable ({type(exc).__name__}: {exc}); "
            f"{_INSTALL_HINT}"
        ) from None
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:
        raise GPUUnavailableError(
            f"iosim.gpu needs an NVIDIA GPU, but CUDA reports none usable ({type(exc).__name__}: {exc})"
        ) from None
    if n < 1:
        raise GPUUnavailableError("iosim.gpu needs an NVIDIA GPU, but CUDA sees no device")
    return cupy
