"""Attention on the CPU: iosim's numba kernels (FlashAttention-2's tiled forward) and NumPy's naive three steps.

Importing this package compiles nothing until the first call (numba caches the compiled kernels on disk).
:mod:`iosim.cpu.detect` measures this machine into a CPU profile; :mod:`iosim.cpu.compare` measures the tiled
kernel against naive and puts the CPU model's prediction beside it.
"""

from iosim.cpu._blas import BLAS
from iosim.cpu.attention import (
    SCHEDULES,
    AttentionInputError,
    AttentionTypeError,
    NaiveMemoryError,
    Run,
    attention,
    available_memory,
    last_run,
    naive_bytes,
)

__all__ = [
    "BLAS",
    "SCHEDULES",
    "AttentionInputError",
    "AttentionTypeError",
    "NaiveMemoryError",
    "Run",
    "attention",
    "available_memory",
    "last_run",
    "naive_bytes",
]
