"""``iosim calibrate rates``'s power section: the board's power limit and idle power, and the energy of each unit of
work, from NVML's energy counter over bursts of the rates kernels (kernels/rates.cu).

A burst runs one kernel back to back for BURST_S after REST_S of rest (so the board's power limiter starts from the
same state each time: a burst is as long as the time records' runs, not a steady state). NVML's energy counter
(``nvmlDeviceGetTotalEnergyConsumption``, millijoules) advances in steps, so a burst starts on a step and ends on the
first step after the GPU has finished; the idle power times the tail after the last kernel is taken off. Then

* ``power.base``: watts of every SM spinning on a timer (the clock up, almost no work): the part of a kernel's power
  that its duration costs, whatever it does;
* ``power.<unit>``: joules of one unit of work beyond the base: a tensor-core FLOP (``mma_sync``: mma.sync
  m16n8k16; ``wgmma``: m64n256k16 on Hopper, ``wgmma_fp8`` its e4m3 m64n256k32), an ``exp`` (ex2.approx), an
  ``fp32`` FLOP (FMA = 2), a byte of ``l2`` traffic (reads of an L2-resident buffer), a byte of ``dram`` traffic (a
  copy; its passage through L2 included), a byte of ``smem`` traffic (ldmatrix.x4: operands from shared memory into
  registers, as mma.sync kernels feed them); ``power.at.<unit>``: the clock the unit's burst ran at;
* ``power.limiter``: what the board's power limiter does to tensor work over a run (:func:`measure_limiter`).

Every burst moves random data (the rates kernels' ``random`` operands, kernels/rates.cu rates_uniform; random buffers
here), as attention's inputs are: a unit's energy grows with the bits its operands toggle, so constant operands
would price a fraction of it. (The rates of :mod:`iosim.calibrate.rates` keep their fixed operands.)

:mod:`iosim.timing.energy` predicts a kernel's joules from them. NVML comes from ``nvidia-ml-py`` (``pynvml``),
which the gpu extra installs; without it, the power section is skipped with a message.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import numpy as np

from iosim.calibrate import rates_kernels as shape  # the rates kernels' shapes (chains, warps, ...)
from iosim.calibrate.rates_kernels import Bench, Measured, RatesError, measure_only
from iosim.calibrate.rates_wgmma import WGMMA_PER_TRIP
from iosim.gpu.build_rates import rates_mma_names, rates_wgmma_names

BURST_S = 0.25  # one burst: about the time records' 20 calls of a long kernel
REST_S = 0.4  # rest before a burst
IDLE_S = 1.0  # the idle measurement
MMA_WARPS = 8  # resident warps per SM of the mma.sync burst
CLOCKED = ("mma_sync", "wgmma", "wgmma_fp8", "exp", "fp32", "smem")  # on the SM's clock: each burst's clock recorded
LIMITER_SHARES = (1.0, 0.75, 0.5, 0.25)  # shares of the SMs a limiter burst runs on
LIMITER_S = 0.8  # a limiter burst: past the fast loop's action (~50 ms), short of the averaged loop's (~0.9 s)
LIMITER_LONG_S = 3.3  # the burst on every SM: two of the averaged loop's periods (~1 s each) after it acted
LIMITER_REST_S = 1.5  # rest before a limiter burst: the board's averaged power back at idle
FAST_WINDOW = (0.35, 0.75)  # seconds into a burst: the fast loop's clock and watts
ENGAGE_BURSTS, ENGAGE_S = 5, 0.25  # short bursts on every SM for the clock before the limiter and when it acts:
# one burst's engage is noise (an H100, 2026-11-27: 36 to 84 ms over 9 bursts on one board, median 50 ms)
ENGAGE_HELD = (0.15, 0.25)  # seconds into a short burst: the clock the fast loop then holds
STEADY_WINDOW = (1.2, 3.2)  # seconds into the burst on every SM: the averaged loop's (about two periods)
LAUNCH_S = 0.5e-3  # one launch of a limiter burst (each launch stamps its own clock)
COUNTER_READ_S = 2e-3  # the energy counter read this often during a limiter burst (it steps every ~100 ms)
WGMMA_N, WGMMA_GROUPS = 256, 2  # wgmma m64n256k16, two warpgroups per SM


class Nvml:
    """The NVML calls the power section needs, on device 0."""

    def __init__(self):
        try:
            import pynvml
        except ImportError:
            raise RatesError("the power section needs NVML's Python binding: pip install nvidia-ml-py") from None
        pynvml.nvmlInit()
        self.nv, self.handle = pynvml, pynvml.nvmlDeviceGetHandleByIndex(0)

    def joules(self) -> float:
        return self.nv.nvmlDeviceGetTotalEnergyConsumption(self.handle) / 1e3

    def limit_w(self) -> float:
        return self.nv.nvmlDeviceGetEnforcedPowerLimit(self.handle) / 1e3

    def step(self) -> tuple[float, float]:
        """(joules, perf_counter) at the counter's next step."""
        first = self.joules()
        while (now := self.joules()) == first:
            pass
        return now, time.perf_counter()


def burst(nvml: Nvml, cp, launch: Callable[[], None] | None, seconds: float, idle_w: float) -> tuple[float, float, int]:
    """(joules, seconds, launches) of ``launch`` back to back for about ``seconds`` after REST_S of rest; ``launch``
    None: the GPU idle."""
    cp.cuda.runtime.deviceSynchronize()
    time.sleep(REST_S)
    e0, t0 = nvml.step()
    n = 0
    while time.perf_counter() - t0 < seconds:
        if launch is not None:
            launch()
            n += 1
            if n % 8 == 0:
                cp.cuda.runtime.deviceSynchronize()  # never more than a few ms queued ahead of the clock
    cp.cuda.runtime.deviceSynchronize()
    busy_end = time.perf_counter()
    e1, t1 = nvml.step()
    return (e1 - e0) - idle_w * (t1 - busy_end), busy_end - t0, n


def measure_power(b: Bench, cp, report: Callable[[Measured, str], None]) -> None:
    """Power limit, idle and base watts, and the joules of each unit of work (module docstring)."""
    nvml = Nvml()
    i32 = cp.int32
    how = f"NVML energy counter over {BURST_S} s bursts after {REST_S} s of rest, less the base power x time"
    report(Measured(("power", "limit"), nvml.limit_w(), "W", "NVML enforced power limit"), "")
    j, s, _ = burst(nvml, cp, None, IDLE_S, 0.0)
    idle = j / s
    report(Measured(("power", "idle"), idle, "W", f"NVML energy counter over {IDLE_S} s with no kernel"), "")
    spin = b.fn("rates_spin")
    j, s, _ = burst(nvml, cp, lambda: spin((4 * b.sms,), (32,), (cp.int64(2_000_000),)), BURST_S, idle)
    base = j / s
    report(Measured(("power", "base"), base, "W", f"4 blocks per SM spinning on %globaltimer, 2 ms launches, {how}"),
           "")

    def per_unit(path: str, make: Callable[[int], Callable[[], None]], units: Callable[[int], float], what: str,
                 iters: int = 64) -> None:
        iters, _ = b.sized(make, iters)
        j, s, n = burst(nvml, cp, make(iters), BURST_S, idle)
        clock = b.clock(b.sms)
        report(Measured(("power", path), (j - base * s) / (units(iters) * n), f"J/{UNITS[path]}",
                        f"{what}; {how}"), f"{(j - base * s) / s:.0f} W above base, SM clock {clock / 1e9:.2f} GHz")
        if path in CLOCKED:
            report(Measured(("power", "at", path), clock, "Hz", f"the {path} burst's last launch: clock64 cycles over "
                            "%globaltimer ns, median over blocks"), "")

    mma = b.fn(rates_mma_names()[("mma", "bfloat16")], pad=True)
    per_unit("mma_sync", lambda n: lambda: mma((b.sms,), (32 * MMA_WARPS,), (i32(n), i32(1), b.out, b.stamps),
                                                 shared_mem=b.pad),
             lambda n: shape.MMA_FLOP * shape.CHAINS * MMA_WARPS * b.sms * n, "mma.sync m16n8k16 bf16, 8 warps per SM")
    if b.hopper:
        wg = b.fn(rates_wgmma_names()[(WGMMA_N, "bfloat16", WGMMA_GROUPS)], pad=True)
        per_unit("wgmma", lambda n: lambda: wg((b.sms,), (128 * WGMMA_GROUPS,), (i32(n), i32(1), b.out, b.stamps),
                                                shared_mem=b.pad),
                 lambda n: 2 * 64 * WGMMA_N * 16 * WGMMA_PER_TRIP * WGMMA_GROUPS * b.sms * n,
                 f"wgmma m64n{WGMMA_N}k16 bf16, {WGMMA_GROUPS} warpgroups per SM", iters=16)
        fp8 = b.fn(rates_wgmma_names()[(WGMMA_N, "e4m3", WGMMA_GROUPS)], pad=True)
        per_unit("wgmma_fp8", lambda n: lambda: fp8((b.sms,), (128 * WGMMA_GROUPS,), (i32(n), i32(1), b.out, b.stamps),
                                                     shared_mem=b.pad),
                 lambda n: 2 * 64 * WGMMA_N * 32 * WGMMA_PER_TRIP * WGMMA_GROUPS * b.sms * n,
                 f"wgmma m64n{WGMMA_N}k32 e4m3, {WGMMA_GROUPS} warpgroups per SM", iters=16)
    alu, n_alu = b.fn("rates_alu"), 4 * b.sms
    for op, path, per_op in ((3, "exp", 1), (0, "fp32", 2)):
        per_unit(path, lambda n, op=op: lambda: alu((n_alu,), (256,), (i32(op), i32(n), b.out, b.stamps)),
                 lambda n, per_op=per_op: per_op * shape.ALU_UNROLL * shape.CHAINS * n_alu * 256 * n,
                 "ex2.approx.ftz.f32" if op == 3 else "fp32 FMA (2 FLOPs), 4 blocks of 256 threads per SM")
    smem, blocks = b.fn("rates_smem"), 4 * b.sms
    per_unit("smem", lambda n: lambda: smem((blocks,), (256,), (i32(2), i32(n), i32(0), b.out, b.stamps)),
             lambda n: blocks * shape.SMEM_WARPS * shape.SMEM_PER_TRIP * 512 * n,
             "ldmatrix.x4 of random words, 4 blocks of 8 warps per SM")
    measure_limiter(b, cp, nvml, report)
    read, copy = b.fn("rates_read"), b.fn("rates_copy")
    n_l2 = max(1, b.l2_bytes // 64)
    rng = cp.random.RandomState(0)
    l2buf = rng.uniform(-1, 1, 4 * n_l2, dtype=cp.float32)  # random bits (module docstring)
    per_unit("l2", lambda r: lambda: read((4 * b.sms,), (256,), (l2buf, cp.int64(n_l2), i32(r), b.out)),
             lambda r: 16 * n_l2 * r, f"reads of a {16 * n_l2 / 1e6:.1f} MB buffer resident in L2", iters=8)
    half = min(1 << 30, cp.cuda.runtime.memGetInfo()[0] // 4) // 16
    src, dst = rng.uniform(-1, 1, 4 * half, dtype=cp.float32), cp.empty(4 * half, cp.float32)
    j, s, n = burst(nvml, cp, lambda: copy((4 * b.sms,), (256,), (src, dst, cp.int64(half))), BURST_S, idle)
    report(Measured(("power", "dram"), (j - base * s) / (2 * 16 * half * n), "J/B",
                    f"a copy of {16 * half / 1e6:.0f} MB (bytes read + written); {how}"),
           f"{(j - base * s) / s:.0f} W above base")


def power_part(b: Bench, cp, report: Callable[[Measured, str], None]) -> None:
    """The power section (:mod:`iosim.calibrate.power`), skipped with a line where NVML's binding is missing."""
    try:
        measure_power(b, cp, report)
    except RatesError as exc:
        if "nvidia-ml-py" not in str(exc):
            raise
        print(f"power: skipped ({exc})", flush=True)


def measure_power_only(repeats: int = 15, echo: Callable[[str], None] = print) -> list[Measured]:
    """The power section alone, printed as it completes (``iosim calibrate rates --power-only``)."""
    return measure_only(measure_power, repeats, echo)


UNITS = {"mma_sync": "FLOP", "wgmma": "FLOP", "wgmma_fp8": "FLOP", "exp": "op", "fp32": "FLOP", "l2": "B", "dram": "B",
         "smem": "B"}


def measure_limiter(b: Bench, cp, nvml: Nvml, report: Callable[[Measured, str], None]) -> None:
    """The power limiter (``power.limiter``, :mod:`iosim.timing.clock`): random-operand tensor bursts (wgmma on
    Hopper, else mma.sync), one block per SM, after LIMITER_REST_S of rest: on every SM for LIMITER_LONG_S, on
    the other shares of the SMs for LIMITER_S, and ENGAGE_BURSTS short ones on every SM. Every launch stamps the
    clock its blocks ran at, so the clock is known launch by launch: what each burst holds over FAST_WINDOW with
    the board's watts from the energy counter; on every SM, when the clock falls again (the board's averaged
    power at its limit) and its average over STEADY_WINDOW; and from the short bursts, the clock before the
    limiter acts (their first 20 ms) and when its fast loop acts (their first launch below half-way to the clock
    then held), each the median over the bursts."""
    if b.hopper:
        k = b.fn(rates_wgmma_names()[(WGMMA_N, "bfloat16", WGMMA_GROUPS)], pad=True)
        threads, what = 128 * WGMMA_GROUPS, f"wgmma m64n{WGMMA_N}k16 bf16, {WGMMA_GROUPS} warpgroups"
    else:
        k = b.fn(rates_mma_names()[("mma", "bfloat16")], pad=True)
        threads, what = 32 * MMA_WARPS, f"mma.sync m16n8k16 bf16, {MMA_WARPS} warps"
    what += " of random operands, one block per SM"
    stamps = cp.zeros(4 * b.sms * int(LIMITER_LONG_S / LAUNCH_S * 2), cp.uint64)
    fast, span = FAST_WINDOW, f"from {FAST_WINDOW[0]} to {FAST_WINDOW[1]} s"
    for share in LIMITER_SHARES:
        n = max(1, round(share * b.sms))
        t, clock, samples = _limiter_burst(nvml, cp, _launcher(b, cp, k, threads, n, stamps), stamps, b.sms, n,
                                           LIMITER_LONG_S if share == 1.0 else LIMITER_S)
        held = _median_in(t, clock, fast)
        report(Measured(("power", "limiter", "clocks", n), held, "Hz", f"{what} on n SMs (key), {LIMITER_S} s "
                        f"(every SM: {LIMITER_LONG_S} s) after {LIMITER_REST_S} s of rest: the median of each "
                        f"launch's clock (clock64 over %globaltimer) {span}"), f"{n} SMs")
        report(Measured(("power", "limiter", "watts", n), _counter_watts(samples, *fast), "W", "the same bursts: "
                        f"NVML energy counter between its first and last steps {span}"), f"{n} SMs")
        if share == 1.0:
            _every_sm(t, clock, samples, held, what, report)
    _engage(nvml, cp, _launcher(b, cp, k, threads, b.sms, stamps), stamps, b.sms, what, report)


def _engage(nvml: Nvml, cp, launch: Callable[[int], None], stamps, sms: int, what: str,
            report: Callable[[Measured, str], None]) -> None:
    """The clock before the limiter acts and when its fast loop acts, each the median over ENGAGE_BURSTS short
    bursts on every SM (each burst's engage: the start of its first launch below half-way from its first 20 ms'
    clock to the clock it holds over ENGAGE_HELD)."""
    starts, engages = [], []
    for _ in range(ENGAGE_BURSTS):
        t, clock, _ = _limiter_burst(nvml, cp, launch, stamps, sms, sms, ENGAGE_S)
        start, held = _median_in(t, clock, (0.0, 0.02)), _median_in(t, clock, ENGAGE_HELD)
        starts.append(start)
        engage = _first_below(t, clock, 0.0, start - max((start - held) / 2, 0.01 * start))
        if engage is not None:
            engages.append(engage)
    bursts = f"{ENGAGE_BURSTS} bursts of {ENGAGE_S} s on every SM after {LIMITER_REST_S} s of rest each"
    how = f"{bursts}, the median over bursts"
    report(Measured(("power", "limiter", "clock"), float(np.median(starts)), "Hz", f"{what}, {how} of the median "
                    "clock of each burst's launches in its first 20 ms"), "")
    if len(engages) > ENGAGE_BURSTS // 2:  # else the fast loop did not act in most: this board's limit is above them
        report(Measured(("power", "limiter", "engage"), float(np.median(engages)), "s", f"{how} of the start of "
                        "each burst's first launch below half-way from its first 20 ms' clock to the clock it holds "
                        f"from {ENGAGE_HELD[0]} to {ENGAGE_HELD[1]} s"),
               f"bursts: {', '.join(f'{e * 1e3:.0f}' for e in engages)} ms")
        for i, e in enumerate(engages, 1):  # the spread: a burst's engage is noise (ENGAGE_BURSTS' comment)
            report(Measured(("power", "limiter", "engage_bursts", i), e, "s", f"{bursts}: the start of each "
                            "burst's first launch below half-way, as for engage, by burst (those whose loop "
                            "acted)"), "")


def _every_sm(t: np.ndarray, clock: np.ndarray, samples: list[tuple[float, float]], held: float, what: str,
              report: Callable[[Measured, str], None]) -> None:
    """What the burst on every SM says beside its held clock: when the averaged loop acted and what it holds."""
    steady = _mean_in(t, clock, STEADY_WINDOW)
    report(Measured(("power", "limiter", "steady"), steady, "Hz", f"the burst on every SM: the average clock of its "
                    f"launches from {STEADY_WINDOW[0]} to {STEADY_WINDOW[1]} s (cycles over time: the loop "
                    "swings the clock down and back about once a second)"), "")
    report(Measured(("power", "limiter", "steady_watts"), _counter_watts(samples, *STEADY_WINDOW), "W",
                    f"the same burst: NVML energy counter between its first and last steps from {STEADY_WINDOW[0]} "
                    f"to {STEADY_WINDOW[1]} s"), "")
    settle = _first_below(t, clock, FAST_WINDOW[1], held - max((held - steady) / 2, 0.01 * held))
    if settle is not None:
        report(Measured(("power", "limiter", "settle"), settle, "s", f"the same burst: the start of its first "
                        f"launch after {FAST_WINDOW[1]} s below half-way from the clock it held to the clock it "
                        "holds at the end"), "")


def _launcher(b: Bench, cp, k, threads: int, n: int, stamps) -> Callable[[int], None]:
    """Launch i of a limiter burst on ``n`` SMs, sized to about LAUNCH_S, its stamps at slot i."""
    i32 = cp.int32

    def launch(it: int, at: int) -> None:
        k((n,), (threads,), (i32(it), i32(1), b.out, stamps[4 * b.sms * at:]), shared_mem=b.pad)

    iters = 16
    for _ in range(4):
        seconds = b.once(lambda: launch(iters, 0))  # noqa: B023 (called at once)
        iters = max(1, round(iters * LAUNCH_S / max(seconds, 1e-7)))
    return lambda at: launch(iters, at)


def _launches_in(t: np.ndarray, span: tuple[float, float]) -> np.ndarray:
    """Which launches of a burst start from ``span[0]`` to ``span[1]`` s (RatesError where none does)."""
    on = (t >= span[0]) & (t < span[1])
    if not on.any():
        raise RatesError(f"a limiter burst had no launch from {span[0]} to {span[1]} s")
    return on


def _median_in(t: np.ndarray, x: np.ndarray, span: tuple[float, float]) -> float:
    return float(np.median(x[_launches_in(t, span)]))


def _mean_in(t: np.ndarray, clock: np.ndarray, span: tuple[float, float]) -> float:
    """The clock averaged over time from ``span[0]`` to ``span[1]`` s (launches of equal work: the harmonic mean)."""
    return float(1.0 / np.mean(1.0 / clock[_launches_in(t, span)]))


def _first_below(t: np.ndarray, clock: np.ndarray, after: float, level: float) -> float | None:
    below = np.nonzero((t >= after) & (clock < level))[0]
    return float(t[below[0]]) if len(below) else None


def _limiter_burst(nvml: Nvml, cp, launch: Callable[[int], None], stamps, sms: int, blocks: int,
                   seconds: float) -> tuple[np.ndarray, np.ndarray, list[tuple[float, float]]]:
    """(start seconds, clock Hz) of each launch of a burst of ``seconds`` after LIMITER_REST_S of rest, and the
    energy counter as a thread read it meanwhile (an NVML read takes long enough to starve the GPU if the
    launching thread made it): (seconds from the start, joules)."""
    cp.cuda.runtime.deviceSynchronize()
    time.sleep(LIMITER_REST_S)
    most = stamps.size // (4 * sms)
    samples: list[tuple[float, float]] = []
    done = threading.Event()
    t0 = time.perf_counter()

    def read() -> None:
        while not done.is_set():
            samples.append((time.perf_counter() - t0, nvml.joules()))
            time.sleep(COUNTER_READ_S)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    n = 0
    while n < most and (n == 0 or time.perf_counter() - t0 < seconds):  # one launch at least, however slow the host
        launch(n)
        n += 1
        if n % 8 == 0:
            cp.cuda.runtime.deviceSynchronize()
    cp.cuda.runtime.deviceSynchronize()
    done.set()
    reader.join()
    s = cp.asnumpy(stamps[: 4 * sms * n]).astype(np.float64).reshape(n, sms, 4)[:, :blocks]
    clock = np.median((s[:, :, 1] - s[:, :, 0]) / np.maximum(s[:, :, 3] - s[:, :, 2], 1), axis=1) * 1e9
    begin = s[:, :, 2].min(axis=1)
    return (begin - begin[0]) * 1e-9, clock, samples


def _counter_watts(samples: list[tuple[float, float]], start: float, end: float) -> float:
    """Watts between the energy counter's first and last steps from ``start`` to ``end`` seconds."""
    steps = [(t, j) for (t, j), (_, before) in zip(samples[1:], samples) if j != before and start <= t <= end]
    if len(steps) < 2:
        raise RatesError(f"the energy counter did not step twice from {start} to {end} s of a limiter burst")
    (t0, j0), (t1, j1) = steps[0], steps[-1]
    return (j1 - j0) / (t1 - t0)
