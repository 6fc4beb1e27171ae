"""The one CUDA-event timer of the library and the benchmarks: CUDA events around each call, the median.

Which calls an interval covers is the timer's ``view``, one of three named conventions:

* ``BUSY`` (the time records' convention, docs/benchmarks.md): a spin kernel (~10 ms) is queued first, so the host
  enqueues every timed call while the GPU is still busy, and an interval is GPU time, free of host launch cost;
* ``CALLER`` (the caller's view): the calls are issued back to back as a caller issues them, host cost included
  where the GPU waits for it;
* ``ISOLATED``: each call waits for the one before to finish (the event after it is synchronized), so each starts
  on an idle GPU and its launch latency is in its interval (:mod:`iosim.measure.worker`'s ``--time`` runs).

The events come from a :class:`Clock`: :func:`torch_clock` (the benchmarks, which run torch) or :func:`cupy_clock`
(the library's execute layer, which runs CuPy). Both libraries' events have ``record()`` and ``synchronize()`` and
time the current stream; only making an event, reading an interval, waiting for the device and spinning differ, and
a Clock names those four. Nothing here imports torch or CuPy until a clock is made.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

BUSY, CALLER, ISOLATED = "busy", "caller", "isolated"
VIEWS = (BUSY, CALLER, ISOLATED)
TORCH_SPIN_CYCLES = 20_000_000  # torch.cuda._sleep's cycles: ~10 ms at the H100's and H200's clocks


@dataclass(frozen=True)
class Clock:
    """What the timer needs of a GPU library: a new timing event (with ``record()`` and ``synchronize()``), the
    milliseconds between two recorded events, a wait for the device, and (for ``BUSY``) a spin kernel queued on the
    stream the events time."""

    event: Callable[[], Any]
    elapsed_ms: Callable[[Any, Any], float]
    synchronize: Callable[[], None]
    spin: Callable[[], None] | None = None


def torch_clock(torch=None) -> Clock:
    """torch's CUDA events, spinning with ``torch.cuda._sleep(TORCH_SPIN_CYCLES)``."""
    if torch is None:
        import torch
    return Clock(event=lambda: torch.cuda.Event(enable_timing=True), elapsed_ms=lambda a, b: a.elapsed_time(b),
                 synchronize=torch.cuda.synchronize, spin=lambda: torch.cuda._sleep(TORCH_SPIN_CYCLES))


def cupy_clock(cp=None, spin: Callable[[], None] | None = None) -> Clock:
    """CuPy's CUDA events (timing on by default); CuPy has no spin of its own: ``BUSY`` needs ``spin``, a launch of
    a kernel that spins ~10 ms (calibration's ``rates_spin``)."""
    if cp is None:
        import cupy as cp
    return Clock(event=cp.cuda.Event, elapsed_ms=cp.cuda.get_elapsed_time,
                 synchronize=cp.cuda.runtime.deviceSynchronize, spin=spin)


def time_ms(fn: Callable[[], Any], reps: int, warmup: int = 2, view: str = BUSY, clock: Clock | None = None) -> float:
    """Median milliseconds of ``reps`` calls of ``fn`` after ``warmup`` untimed ones (compile, caches, L2), timed
    in ``view`` (module docstring) with ``clock``'s events (default: torch's)."""
    if view not in VIEWS:
        raise ValueError(f"view={view!r}: expected one of {', '.join(VIEWS)}")
    if reps < 1:
        raise ValueError(f"reps={reps}: expected at least one timed call")
    clock = clock if clock is not None else torch_clock()
    if view == BUSY and clock.spin is None:
        raise ValueError("view='busy' needs a clock with a spin kernel (cupy_clock(spin=...))")
    for _ in range(warmup):
        fn()
    if view == ISOLATED:
        ts = []
        for _ in range(reps):
            a, b = clock.event(), clock.event()
            a.record()
            fn()
            b.record()
            b.synchronize()
            ts.append(clock.elapsed_ms(a, b))
        return statistics.median(ts)
    clock.synchronize()
    starts = [clock.event() for _ in range(reps)]
    ends = [clock.event() for _ in range(reps)]
    if view == BUSY:
        clock.spin()
    for s, e in zip(starts, ends):
        s.record()
        fn()
        e.record()
    clock.synchronize()
    return statistics.median(clock.elapsed_ms(s, e) for s, e in zip(starts, ends))
