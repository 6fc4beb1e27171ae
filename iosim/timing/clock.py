"""The clock a kernel runs at over a run of back-to-back calls: the board's power limiter.

What the limiter does, measured (``iosim calibrate rates``' limiter bursts, :mod:`iosim.calibrate.power`; H100,
2026-11-27: random-operand wgmma on n SMs from rest, every launch stamping its own clock, NVML's energy counter):

1. before it acts, tensor work runs at one clock (``power.limiter.clock``: 1.78-1.79 GHz on every SM, within 2% of
   the clock the rates of :mod:`iosim.timing.rates` were measured at);
2. about 50 ms in (``limiter.engage``, the median over bursts: one burst's is 36-84 ms) a fast loop acts: a burst that draws more than it allows falls
   to the clock where it draws that much (1.66 GHz and 766 W on 132 SMs, 1.83 GHz and 782 W on 99; an H200 holds
   706 W), above the board's enforced limit (700 W). Attention kernels held 790-811 W there on an H100 (cuDNN's
   forward, FlashAttention-2's, ours);
3. once the board's power averaged over about a second reaches the limit (``limiter.settle``, 0.79 s for the
   burst on every SM), the clock dips for about 0.3 s and comes back; the loop repeats about once a second, the
   power averaging the limit. Long runs of cuDNN's forward took 14.3 ms a call in phase 2 and 14.4-14.7 ms from
   1.2 s to 4 s on.

So a call's clock depends on the power it draws and on how long the GPU has been drawing it. The model prices the
call's power at clock f as

    P(f) = E(f) / t(f)

t(f) its predicted time (each kernel's scaled by f0/f, f0 the clock before the limiter acts; a kernel bound by
DRAM keeps its time), E(f) its energy (:mod:`iosim.timing.energy`, the SM's units priced at f). Each phase holds
the highest clock up to f0 at which P(f) is at most the phase's cap: no cap before ``engage``; the fast loop's (the
all-SM burst's watts in phase 2) until the call's averaged power reaches the limit; the limit after, as an average
over the loop's swings. A call's average reaches the limit ``(limit - idle) / (P - idle)`` of the averaging
window after the fast loop acts, the window taken from the all-SM burst's ``settle``.

Bursts drawing well under the fast loop's cap (66 or 33 SMs, 600 W and less) rose 3-5% above f0 after 80-170 ms;
the attention kernels above, at the cap, by 1% or less. The model keeps f0 as the ceiling: its energies price
FlashAttention-2-class kernels low, up to 17% (docs/timing.md, energy), and a rise priced from them would move
kernels that do not rise.

``run`` says which call a prediction means:

* ``"record"`` (the default): what the time records measure, the median of 20 calls after 2 warm-up calls, back to
  back from rest (benchmarks/time_record.py), each call at the clock of the phase it starts in;
* ``"single"``: one call from rest, before the limiter acts;
* ``"steady"``: a call of a long run, at the limit;
* a number of seconds: the mean call of a run that long, from rest.

When the fast loop acts is noise from burst to burst (an H200, 2026-11-28: 46-90 ms over five bursts): a run whose
median call falls inside that spread runs it at one clock or the other. Where the calibration keeps each burst's
engage (``limiter.engage_bursts``) a run is priced as the average over them, each as likely; else at their median.

Not modelled: the loop's swings as such (a run of one or two seconds sees one dip of 10-20% for about 0.3 s), and
the board's warming over minutes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import replace

from ..hardware.calibration import PowerCalibration, PowerLimiter
from .estimate import ClockRun, KernelTime

RECORD_WARMUP, RECORD_REPS = 2, 20  # the time records' run (benchmarks/cuda_events.py: 2 warm-up calls, 20 timed)
RUNS = ("record", "single", "steady")
FLOOR = 0.5  # the lowest clock the limiter is searched down to, as a share of the lowest clock a burst held


class RunError(ValueError):
    """A run that is neither one of RUNS nor a positive number of seconds."""


def check_run(run: str | float) -> str | float:
    """``run`` as the model takes it, or RunError with the choices."""
    if isinstance(run, str) and run not in RUNS:
        try:
            run = float(run.removesuffix("s"))
        except ValueError:
            raise RunError(f"run {run!r}: one of {', '.join(RUNS)}, or a run's length in seconds") from None
    if not isinstance(run, str) and not (run > 0 and math.isfinite(run)):
        raise RunError(f"run {run!r}: a run's length must be a positive number of seconds")
    return run


def limited(kernels: Sequence[KernelTime], power: PowerCalibration | None,
            energy_at: Callable[[float, float], float], run: str | float = "record",
            ) -> tuple[list[KernelTime], ClockRun | None]:
    """``kernels`` (predicted at the clock before the limiter acts) as ``run`` sees them, and the clocks; the
    kernels unchanged and None where the calibration has no limiter or its bursts never met it. ``energy_at(clock,
    seconds)``: joules of one call at that clock taking that long."""
    lim = power.limiter if power is not None else None
    if lim is None or lim.engage is None or lim.settle is None:
        return list(kernels), None
    f0, idle, limit = lim.clock.value, power.idle.value, power.limit.value
    clocks = lim.clocks.value
    low = FLOOR * min(lim.steady.value, *clocks.values())
    fast_cap = max(lim.watts.value[max(clocks)], limit)  # the all-SM burst's watts once the fast loop acted

    def seconds(f: float) -> float:
        return sum(k.predicted_s * (1.0 if k.bound == "dram" else f0 / f) for k in kernels)

    def watts(f: float) -> float:
        t = seconds(f)
        return energy_at(f, t) / t

    fast, steady = _held(watts, fast_cap, f0, low), _held(watts, limit, f0, low)
    p_fast = watts(fast)
    after = window_s(power) * (limit - idle) / (p_fast - idle) if p_fast > limit else None  # engage to settle
    settle = lim.engage.value + after if after is not None else None
    phases = ((f0, lim.engage.value), (fast, settle if settle is not None else math.inf), (steady, math.inf))
    times = [seconds(f) for f, _ in phases]
    run = check_run(run)
    per_burst = [run_shares(run, times, [e, e + after if after is not None else math.inf, math.inf])
                 for e in engages(lim)]
    shares = tuple(sum(s[i] for s in per_burst) / len(per_burst) for i in range(3))
    out = [replace(k, predicted_s=sum(s * k.predicted_s * (1.0 if k.bound == "dram" else f0 / f)
                                      for s, (f, _) in zip(shares, phases, strict=True))) for k in kernels]
    joules = sum(s * energy_at(f, t) for s, (f, _), t in zip(shares, phases, times, strict=True))
    return out, ClockRun(_name(run), f0, fast, steady if settle is not None else fast, lim.engage.value,
                         None if settle is None else float(settle), shares, watts(f0), float(joules))


def engages(lim: PowerLimiter) -> list[float]:
    """When the fast loop acts, each as likely: every short burst's engage where the calibration has them, else
    their median."""
    return list(lim.engage_bursts.value.values()) if lim.engage_bursts is not None else [lim.engage.value]


def window_s(power: PowerCalibration) -> float:
    """The board's averaging window, from the all-SM burst: its average reached the limit ``settle - engage``
    after the fast loop acted, drawing the fast loop's watts."""
    lim = power.limiter
    drawn = lim.watts.value[max(lim.clocks.value)] - power.idle.value
    return (lim.settle.value - lim.engage.value) * drawn / (power.limit.value - power.idle.value)


def _held(watts: Callable[[float], float], cap: float, top: float, low: float) -> float:
    """The highest clock in [low, top] at which the call draws at most ``cap`` (bisection; power grows with the
    clock)."""
    if watts(top) <= cap:
        return top
    if watts(low) > cap:
        return low
    lo, hi = low, top
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if watts(mid) <= cap else (lo, mid)
    return lo


def run_shares(run: str | float, times: Sequence[float], ends: Sequence[float]) -> tuple[float, float, float]:
    """The share of the calls ``run`` means in each phase (the median's two middle calls for "record"; every
    call of a run of seconds): a call takes ``times[i]`` in phase i, which ends ``ends[i]`` seconds into the run,
    and runs at the clock of the phase it starts in."""
    if run == "single":
        return 1.0, 0.0, 0.0
    if run == "steady":
        return 0.0, 0.0, 1.0
    if run == "record":
        t, phase_of = 0.0, []
        for _ in range(RECORD_WARMUP + RECORD_REPS):
            i = _phase(t, ends)
            phase_of.append(i)
            t += times[i]
        timed = sorted(phase_of[RECORD_WARMUP:], key=lambda i: times[i])
        mid = (timed[RECORD_REPS // 2 - 1], timed[RECORD_REPS // 2])  # the median of 20: the two middle calls
        return tuple(0.5 * mid.count(i) for i in range(3))
    calls, t = [0, 0, 0], 0.0
    for i in range(3):  # whole calls while the run lasts, each phase's calls at once
        n = max(0, math.ceil((min(ends[i], run) - t) / times[i])) if t < run else 0
        calls[i], t = n, t + n * times[i]
    return tuple(c / sum(calls) for c in calls)


def _phase(t: float, ends: Sequence[float]) -> int:
    return next(i for i, end in enumerate(ends) if t < end)


def _name(run: str | float) -> str:
    return run if isinstance(run, str) else f"{float(run):g} s"
