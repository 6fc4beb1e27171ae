"""``iosim calibrate rates``'s power section: the board's power limit and idle power, and the energy of each unit of
work, from NVML's energy counter over bursts of the rates kernels (kernels/rates.cu).

A burst runs one kernel back to back for BURST_S after REST_S of rest (so the board's power limiter starts from the
same state each time: a burst is as long as the time records' runs, not a steady state). NVML's energy counter
(``nvmlDeviceGetTotalEnergyConsumption``, millijoules) advances in steps, so a burst starts on a step and ends on the
first step after the GPU has finished; the idle power times the tail after the last kernel is taken off. Then

* ``power.base``: watts of every SM spinning on a timer (the clock up, almost no work): the part of a kernel's power
  that its duration costs, whatever it does;
* ``power.<unit>``: joules of one unit of work beyond the base: a tensor-core FLOP (``mma_sync``: mma.sync
  m16n8k16; ``wgmma``: m64n256k16 on Hopper), an ``exp`` (ex2.approx), an ``fp32`` FLOP (FMA = 2), a byte of ``l2``
  traffic (reads of an L2-resident buffer), a byte of ``dram`` traffic (a copy; its passage through L2 included), a
  byte of ``smem`` traffic (ldmatrix.x4: operands from shared memory into registers, as mma.sync kernels feed them).

Every burst moves random data (the rates kernels' ``random`` operands, kernels/rates.cu rates_uniform; random buffers
here), as attention's inputs are: a unit's energy grows with the bits its operands toggle, so constant operands
would price a fraction of it. (The rates of :mod:`iosim.calibrate.rates` keep their fixed operands.)

:mod:`iosim.timing.energy` predicts a kernel's joules from them. NVML comes from ``nvidia-ml-py`` (``pynvml``),
which the gpu extra installs; without it, the power section is skipped with a message.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from iosim.calibrate import rates_kernels as shape  # the rates kernels' shapes (chains, warps, ...)
from iosim.calibrate.rates_kernels import Bench, Measured, RatesError, fmt_value
from iosim.calibrate.rates_wgmma import WGMMA_PER_TRIP
from iosim.gpu._cupy import require_cupy
from iosim.gpu.build_rates import rates_mma_names, rates_wgmma_names

BURST_S = 0.25  # one burst: about the time records' 20 calls of a long kernel
REST_S = 0.4  # rest before a burst
IDLE_S = 1.0  # the idle measurement
MMA_WARPS = 8  # resident warps per SM of the mma.sync burst
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
    alu, n_alu = b.fn("rates_alu"), 4 * b.sms
    for op, path, per_op in ((3, "exp", 1), (0, "fp32", 2)):
        per_unit(path, lambda n, op=op: lambda: alu((n_alu,), (256,), (i32(op), i32(n), b.out, b.stamps)),
                 lambda n, per_op=per_op: per_op * shape.ALU_UNROLL * shape.CHAINS * n_alu * 256 * n,
                 "ex2.approx.ftz.f32" if op == 3 else "fp32 FMA (2 FLOPs), 4 blocks of 256 threads per SM")
    smem, blocks = b.fn("rates_smem"), 4 * b.sms
    per_unit("smem", lambda n: lambda: smem((blocks,), (256,), (i32(2), i32(n), i32(0), b.out, b.stamps)),
             lambda n: blocks * shape.SMEM_WARPS * shape.SMEM_PER_TRIP * 512 * n,
             "ldmatrix.x4 of random words, 4 blocks of 8 warps per SM")
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
    cp = require_cupy()
    measured: list[Measured] = []

    def report(m: Measured, note: str) -> None:
        measured.append(m)
        echo(f"{'.'.join(m.path):<28}{fmt_value(m)!s:>16}  {note}")

    try:
        measure_power(Bench(cp, repeats), cp, report)
    except RatesError:
        raise
    except Exception as exc:
        raise RatesError(f"calibration kernel failed: {type(exc).__name__}: {exc}".splitlines()[0]) from None
    return measured


UNITS = {"mma_sync": "FLOP", "wgmma": "FLOP", "exp": "op", "fp32": "FLOP", "l2": "B", "dram": "B", "smem": "B"}
