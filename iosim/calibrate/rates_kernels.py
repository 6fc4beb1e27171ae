"""What ``iosim calibrate rates`` (:mod:`iosim.calibrate.rates`) measures with: one measured number
(:class:`Measured`), the compiled kernels of kernels/rates.cu and their timing loop (:class:`Bench`), and the
memory-latency pointer chase (:func:`chase_latency`).

The chase: one thread follows a dependent chain of 8-byte pointers, one per 128-byte line, the lines linked in one
random cycle (a random permutation, so no stride for a prefetcher to follow), each load ``ld.global.cg`` (L1
bypassed). Every timed load is bracketed by clock64 reads (the load's value is stored to shared memory before the
second read, which therefore waits for it); the value written is the median of those cycles over a few thousand
loads, turned into seconds at the kernel's own clock (clock64 over %globaltimer across the timed part).

* ``latency.l2``: a buffer of 4 MiB (at most L2/8), one full untimed pass over the cycle first, so every line is in
  L2; then 4096 timed loads, per launch.
* ``latency.dram``: a 1 GiB buffer (8 Mi lines; less where free memory is short). Every launch goes on along the
  cycle where the last stopped, so no line is loaded twice: none is in L2 but by chance (lines still there since
  the buffer was written, at most L2 / 1 GiB of them: the median ignores them). Consecutive lines are random ones
  of the whole GiB, so each load lands in a random one of its 512 2-MiB pages (4 KiB pages: 256 Ki): the SM's own
  TLBs miss nearly always; what the GPU's shared TLB still covers of 1 GiB stays covered. This is the latency a
  decode kernel's first K/V loads see with warm page tables.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from iosim._resources import kernels_dir
from iosim.gpu.build import nvrtc_options
from iosim.gpu.build_rates import RATES_SOURCE, RatesSource
from iosim.measure.events import BUSY, cupy_clock, time_ms
from iosim.units import fmt_rate, fmt_seconds

CHAINS, ALU_UNROLL = 8, 16  # kernels/rates.cu kChains, kAluUnroll
MMA_FLOP = 2 * 16 * 8 * 16  # one m16n8k16
SMEM_WARPS, SMEM_PER_TRIP = 8, 4  # rates_smem: warps per block, 512-byte loads per warp per loop trip
TARGET_S = 2e-3  # each timed launch
WARMUP = 3
LINE = 128  # bytes between pointers of the chase
CHASE_LOADS = 4096  # timed loads per rates_chase launch: kernels/rates.cu kChaseMax
CHASE_LAUNCHES = 3
CHASE_L2_BYTES = 4 << 20
CHASE_DRAM_BYTES = 1 << 30


class RatesError(RuntimeError):
    """A calibration kernel failed to compile or run, or the result cannot be written; one line."""


@dataclass(frozen=True)
class Measured:
    """One measured number: ``path`` in the calibration section (a table entry ends with its int key)."""

    path: tuple
    value: float
    unit: str  # "FLOP/s", "op/s", "B/s", "Hz", "cycles", "s", "W", "J/FLOP", "J/op", "J/B"
    method: str  # how, for the source: "measured on <device>, <date>, iosim calibrate rates: <method>"


def fmt_value(m: Measured):
    """The value as the profile writes it: '612.3 TFLOP/s', '3.012 TB/s', '2.31 us', cycles as a number."""
    if m.unit == "cycles":
        return round(m.value, 2)
    if m.unit == "W":
        return round(m.value, 1)
    if m.unit.startswith("J/"):
        return float(f"{m.value:.4g}")
    return fmt_seconds(m.value) if m.unit == "s" else fmt_rate(m.value, m.unit)


class Bench:
    """The compiled kernels of kernels/rates.cu on device 0, and the timing loop."""

    def __init__(self, cp, repeats: int):
        self.cp, self.repeats = cp, repeats
        dev = cp.cuda.Device(0)
        a = dev.attributes
        self.sms = a["MultiProcessorCount"]
        self.hopper = dev.compute_capability == "90"
        self.l2_bytes = a["L2CacheSize"]
        # dynamic shared memory that leaves room for one block per SM only
        self.pad = min(a["MaxSharedMemoryPerBlockOptin"] - 48 * 1024, a["MaxSharedMemoryPerMultiprocessor"] // 2 + 1024)
        src = RatesSource(wgmma=self.hopper)
        kdir = kernels_dir()
        try:
            self.mod = cp.RawModule(code=(kdir / RATES_SOURCE).read_text(), options=nvrtc_options(kdir) + src.nvrtc_extra,
                                    name_expressions=src.name_expressions)
            self.mod.compile()
        except Exception as exc:
            raise RatesError(f"kernels/{RATES_SOURCE} did not compile: {type(exc).__name__}: {exc}") from None
        self.out = cp.zeros(4, cp.float32)
        self.stamps = cp.zeros(4 * 32 * self.sms, cp.uint64)
        self.cycles = cp.zeros(1, cp.int64)
        self.sm_clock: float | None = None  # the sm_clock measurement, once made: other kernels' rates are at it
        self.events = cp.cuda.Event(), cp.cuda.Event()

    def fn(self, name: str, pad: bool = False):
        f = self.mod.get_function(name)
        if pad and f.max_dynamic_shared_size_bytes < self.pad:
            f.max_dynamic_shared_size_bytes = self.pad
        return f

    def once(self, launch: Callable[[], None]) -> float:
        start, end = self.events
        start.record()
        launch()
        end.record()
        end.synchronize()
        return self.cp.cuda.get_elapsed_time(start, end) * 1e-3

    def time(self, launch: Callable[[], None]) -> float:
        """Median seconds of ``repeats`` launches after warm-up."""
        for _ in range(WARMUP):
            launch()
        return float(np.median([self.once(launch) for _ in range(self.repeats)]))

    def sized(self, make: Callable[[int], Callable[[], None]], iters: int = 64) -> tuple[int, float]:
        """(iters, median seconds) with ``iters`` grown until one launch takes about TARGET_S."""
        for _ in range(4):
            make(iters)()
            t = self.once(make(iters))
            if t >= 0.7 * TARGET_S:
                break
            iters = min(2**30, max(iters + 1, math.ceil(iters * TARGET_S / max(t, 1e-6))))
        return iters, self.time(make(iters))

    def clock(self, blocks: int) -> float:
        """SM clock (Hz) in the last launch: the median over its first ``blocks`` blocks of cycles / ns."""
        s = self.cp.asnumpy(self.stamps[: 4 * blocks]).astype(np.float64).reshape(blocks, 4)
        return float(np.median((s[:, 1] - s[:, 0]) / np.maximum(s[:, 3] - s[:, 2], 1) * 1e9))

    def per_sm_clk(self, blocks: int, block_bytes: float) -> float:
        """Bytes per clock64 cycle per SM in the last launch of a kernel that wrote stamps and %smid (rates_smem):
        for each SM, its blocks' bytes over the cycles from its first block's start stamp to its last block's end
        stamp (clock64 is the SM's own counter); the median over SMs."""
        s = self.cp.asnumpy(self.stamps[: 5 * blocks]).view(np.int64)  # cycles differenced as integers
        start, end, smid = s[0 : 4 * blocks : 4], s[1 : 4 * blocks : 4], s[4 * blocks :]
        rates = [np.count_nonzero(on) * block_bytes / max(int(end[on].max() - start[on].min()), 1)
                 for on in (smid == sm for sm in np.unique(smid))]
        return float(np.median(rates))

    def cycles_of(self, launch: Callable[[], None]) -> float:
        for _ in range(WARMUP):
            launch()
        got = []
        for _ in range(self.repeats):
            launch()
            got.append(float(self.cycles.get()[0]))
        return float(np.median(got))


def busy_timer(b: Bench, cp, calls: int, warmup: int, rest_s: float = 0.0) -> Callable[[Callable[[], Any]], float]:
    """Seconds of a call as the time records time theirs: the median CUDA-event time of ``calls`` calls queued behind
    a busy kernel (``rates_spin``), after ``warmup`` untimed ones and ``rest_s`` idle seconds (so tensor work starts
    from rest, before the board's power limiter acts)."""
    spin = b.fn("rates_spin")
    clock = cupy_clock(cp, spin=lambda: spin((1,), (32,), (cp.int64(10_000_000),)))

    def seconds(call: Callable[[], Any]) -> float:
        if rest_s:
            time.sleep(rest_s)
        return time_ms(call, calls, warmup=warmup, view=BUSY, clock=clock) * 1e-3

    return seconds


def measure_only(part: Callable, repeats: int = 15, echo: Callable[[str], None] = print) -> list[Measured]:
    """One part of the calibration alone (``part(bench, cp, report)``: the power section, the decode section), each
    value printed as it completes; a CUDA error is one line of :class:`RatesError`."""
    from iosim.gpu._cupy import require_cupy

    cp = require_cupy()
    measured: list[Measured] = []

    def report(m: Measured, note: str) -> None:
        measured.append(m)
        echo(f"{'.'.join(map(str, m.path)):<28}{fmt_value(m)!s:>16}  {note}")

    try:
        part(Bench(cp, repeats), cp, report)
    except RatesError:
        raise
    except Exception as exc:
        raise RatesError(f"calibration kernel failed: {type(exc).__name__}: {exc}".splitlines()[0]) from None
    return measured


def random_cycle(lines: int, seed: int = 17) -> np.ndarray:
    """next[i]: the line after line i in one random cycle through all ``lines`` lines."""
    order = np.random.default_rng(seed).permutation(lines).astype(np.uint64)
    nxt = np.empty(lines, np.uint64)
    nxt[order] = np.roll(order, -1)
    return nxt


def chase_latency(b: Bench, cp, report: Callable[[Measured, str], None]) -> None:
    """latency.l2 and latency.dram: the median time of one load in a dependent chain (module docstring)."""
    link, chase = b.fn("rates_chase_link"), b.fn("rates_chase")
    head, cyc = cp.zeros(1, cp.uint64), cp.zeros(CHASE_LOADS, cp.uint32)
    free = cp.cuda.runtime.memGetInfo()[0]
    l2_bytes = max(64 * LINE, min(CHASE_L2_BYTES, b.l2_bytes // 8)) // LINE * LINE
    dram_bytes = max(2 * b.l2_bytes, min(CHASE_DRAM_BYTES, free // 4)) // LINE * LINE
    for level, size in (("l2", l2_bytes), ("dram", dram_bytes)):
        lines = size // LINE
        buf = cp.zeros(lines * (LINE // 8), cp.uint64)
        buf[:: LINE // 8] = cp.asarray(random_cycle(lines))
        link((min(4 * b.sms, -(-lines // 256)),), (256,), (buf, cp.int64(lines), head))
        warm = lines if level == "l2" else 64
        got, clk = [], []
        for _ in range(CHASE_LAUNCHES):
            chase((1,), (32,), (head, cp.int32(warm), cp.int32(CHASE_LOADS), cyc, b.stamps))
            got.append(cp.asnumpy(cyc).astype(np.float64))
            s = cp.asnumpy(b.stamps[:4]).astype(np.float64)
            clk.append((s[1] - s[0], s[3] - s[2]))  # cycles, ns of the timed part
        cycles = float(np.median(np.concatenate(got)))
        total_c, total_ns = (sum(x) for x in zip(*clk))
        hz = total_c / max(total_ns, 1) * 1e9
        n = CHASE_LAUNCHES * CHASE_LOADS
        where = (f"a {size / 2**20:.0f} MiB buffer after one untimed pass over it (all in L2)" if level == "l2" else
                 f"a {size / 2**30:.2f} GiB buffer, each line loaded once (L2 misses)")
        report(Measured(("latency", level), cycles / hz, "s",
                        f"pointer chase, one thread, ld.global.cg through a random cycle of {lines} lines of {LINE} B "
                        f"in {where}: median of {n} loads each timed by clock64, {cycles:.0f} cycles at the kernel's "
                        f"{hz / 1e9:.3f} GHz (clock64 over %globaltimer); %globaltimer mean "
                        f"{total_ns / n:.0f} ns per load with the timing"), "")
        del buf
