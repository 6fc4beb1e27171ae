"""The benchmarks' way to time a call on the GPU: the library's CUDA-event timer (:mod:`iosim.measure.events`)
with torch's events, under the signature the benchmarks have always called.

``busy=True`` is the timer's ``BUSY`` view (the time records' convention, docs/benchmarks.md: GPU time, free of host
launch cost); ``busy=False`` its ``CALLER`` view (calls as a caller issues them, host cost included where the GPU
waits for it).
"""

from __future__ import annotations

from iosim.measure.events import BUSY, CALLER, torch_clock
from iosim.measure.events import time_ms as _time_ms


def time_ms(fn, reps: int, warmup: int = 2, busy: bool = True) -> float:
    """Median milliseconds of ``reps`` calls of ``fn`` after ``warmup`` untimed ones (compile, caches, L2)."""
    return _time_ms(fn, reps, warmup, BUSY if busy else CALLER, torch_clock())
