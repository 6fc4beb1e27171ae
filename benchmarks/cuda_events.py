"""The benchmarks' one way to time a call on the GPU: CUDA events around each call, the median.

``busy=True`` (the time records' convention, docs/benchmarks.md) first queues ~10 ms of spinning on the GPU, so the
host enqueues every timed call while the GPU is still busy and an interval is GPU time, free of host launch cost;
``busy=False`` times calls as a caller issues them, host cost included where the GPU waits for it.
"""

from __future__ import annotations

import statistics


def time_ms(fn, reps: int, warmup: int = 2, busy: bool = True) -> float:
    """Median milliseconds of ``reps`` calls of ``fn`` after ``warmup`` untimed ones (compile, caches, L2)."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    if busy:
        torch.cuda._sleep(20_000_000)
    for s, e in zip(starts, ends):
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))
