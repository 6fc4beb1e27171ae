"""The rates the time model works from: what code reaches on the GPU (``iosim calibrate rates``), or the datasheet.

A calibrated profile carries measured rates (``calibration``: mma.sync and wgmma throughput, exp2 on the
special-function unit, fp32 FMA, shared memory through ldmatrix, L2 and DRAM bandwidth, launch costs), each with the
device, date and commit it was measured on. A profile without them falls back to its datasheet peaks, and every
estimate made from it says ``uncalibrated``: peaks are what no kernel reaches.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

from ..hardware.gpu import Profile

WARP_LANES = 32  # lanes a warp instruction issues: what a warp instruction costs at the ``alu`` lane rate


@dataclass(frozen=True)
class Rates:
    """Chip-wide rates per second (divide by ``sms`` for one SM)."""

    sms: int
    mma: float  # mma.sync FLOP/s at full issue, this dtype (fp32 problems: plain fp32)
    mma_by_warps: dict[int, float] = field(default_factory=dict)  # warps per SM -> mma.sync FLOP/s
    wgmma: float = math.nan  # Hopper warpgroup MMA FLOP/s (nan: not measured, not Hopper)
    wgmma_dtype: str = ""  # the input type whose wgmma rate ``wgmma`` is (fp8 falls back to fp16's where unmeasured)
    wgmma_wait_s: float = 0.0  # committing a chain of wgmma and waiting for its result, beyond its tensor time (0: not measured)
    ex2: float = math.nan  # exp2 results/s (special-function unit)
    alu: float = math.nan  # fp32 lane operations/s (an FMA is one operation here; a warp instruction is WARP_LANES)
    smem: float = math.inf  # shared memory bytes/s (ldmatrix)
    l2: float = math.inf  # L2 -> SM bytes/s
    l2_write: float = math.inf  # SM -> L2 bytes/s (stores)
    l2_reduce: dict[int, float] = field(default_factory=dict)  # lanes per red (1: .f32, 2: .v2.f32) -> fp32 bytes/s
    dram_read: float = math.inf
    dram_write: float = math.inf
    dram_copy: float = math.nan  # bytes read + bytes written per second, copying (nan: not measured)
    launch_s: float = 0.0  # back-to-back launch interval of a kernel on one stream
    call_s: float = 0.0  # one call of a one-wave kernel of one L2 load per thread, CUDA events around it (0: unknown)
    dependent_s: float = 0.0  # what a second such launch adds to the call (0: unknown)
    block_s: float = 0.0  # cost of starting one thread block on an SM
    l2_latency_s: float = 0.0  # one dependent load that hits L2 (0: not measured)
    dram_latency_s: float = 0.0  # one dependent load that misses L2
    calibration: str = "uncalibrated"

    def mma_at(self, warps_per_sm: float) -> float:
        """mma.sync FLOP/s with ``warps_per_sm`` warps issuing (interpolated in the measured table)."""
        if not self.mma_by_warps:
            return self.mma
        pts = sorted(self.mma_by_warps.items())
        if warps_per_sm <= pts[0][0]:
            return pts[0][1] * warps_per_sm / pts[0][0]
        for (w0, r0), (w1, r1) in itertools.pairwise(pts):
            if warps_per_sm <= w1:
                return r0 + (r1 - r0) * (warps_per_sm - w0) / (w1 - w0)
        return pts[-1][1]

    def first_launch_s(self) -> float:
        """The fixed cost of a call's first kernel: the launch interval, and what a call of a tiny kernel measures
        beyond that interval and its one L2 load (event recording, the blocks' start and drain)."""
        return self.launch_s + max(0.0, self.call_s - self.launch_s - self.l2_latency_s) if self.call_s else self.launch_s

    def next_launch_s(self) -> float:
        """The fixed cost of each further kernel of the call: what a second tiny launch adds, less its L2 load."""
        return max(self.launch_s, self.dependent_s - self.l2_latency_s) if self.dependent_s else self.launch_s

    def dram_s(self, read: float, write: float) -> float:
        """Seconds of DRAM traffic: reads and writes at their own measured rates, and where both flow, the cost of
        mixing them that the measured copy shows (its rate below what reads and writes reach alone), in
        proportion to the bytes that pair up (min of read and write): a pure stream pays nothing, a copy pays all."""
        t = read / self.dram_read + write / self.dram_write
        if self.dram_copy == self.dram_copy:
            mixing = 1 / self.dram_copy - (1 / self.dram_read + 1 / self.dram_write) / 2
            t += 2 * min(read, write) * max(0.0, mixing)
        return t


def _value(obj) -> float | None:
    return None if obj is None or getattr(obj, "value", None) is None else float(obj.value)


def _datasheet(profile: Profile, dtype: str) -> Rates:
    bw = _value(profile.dram.bandwidth) or math.inf
    wg = profile.matmul_rate(dtype) if profile.is_hopper() and dtype != "fp32" else math.nan
    return Rates(
        sms=int(profile.require("sm_count")),
        mma=profile.matmul_rate(dtype),
        wgmma=wg,
        ex2=profile.require("compute.exp"),
        alu=profile.require("compute.fp32") / 2,
        smem=_value(profile.smem.bandwidth) or math.inf,
        l2=_value(profile.l2.bandwidth) or math.inf,
        l2_write=_value(profile.l2.bandwidth) or math.inf,
        dram_read=bw,
        dram_write=bw,
    )


def rates(profile: Profile, dtype: str) -> Rates:
    """The profile's measured rates for ``dtype`` where it has them (``calibration``), else its datasheet's."""
    base = _datasheet(profile, dtype)
    cal = profile.calibration
    if cal is None:
        return base
    key = "bf16" if dtype == "bf16" else "fp16"
    table = {int(w): float(v) for w, v in getattr(cal.mma_sync, key).throughput.value.items()} if dtype != "fp32" else {}
    wgmma, wgmma_dtype, label = base.wgmma, "", profile.calibration_label()
    if cal.wgmma is not None and dtype != "fp32":
        wkey = "fp8" if dtype == "fp8" and cal.wgmma.fp8 is not None else key
        wgmma, wgmma_dtype = max(getattr(cal.wgmma, wkey).n128.value.values()), wkey  # FA3's GEMMs: N = Bc or d = 128
        if dtype == "fp8" and wkey != "fp8":
            label += "; fp8 wgmma not measured: the fp16 wgmma's share of its peak, applied to the fp8 peak"
    return Rates(
        sms=base.sms,
        mma=max(table.values()) if table else base.mma,
        mma_by_warps=table,
        wgmma=wgmma,
        wgmma_dtype=wgmma_dtype,
        wgmma_wait_s=_wgmma_wait(cal, key),
        ex2=float(cal.exp.throughput.value),
        alu=float(cal.fp32.fma.value) / 2,
        smem=float(cal.smem.ldmatrix.value),
        l2=float(cal.l2.read.value),
        l2_write=float(cal.l2.write.value),
        l2_reduce=_reduce(cal),
        dram_read=float(cal.dram.read.value),
        dram_write=float(cal.dram.write.value),
        dram_copy=float(cal.dram.read_write.value),
        launch_s=float(cal.launch.interval.value),
        call_s=float(_value(cal.launch.call) or 0.0),
        dependent_s=float(_value(cal.launch.dependent) or 0.0),
        block_s=float(cal.launch.per_block.value),
        l2_latency_s=_latency(cal, "l2"),
        dram_latency_s=_latency(cal, "dram"),
        calibration=label,
    )


def _wgmma_wait(cal, key: str) -> float:
    """The measured wgmma round trip (``calibration.wgmma.<dtype>.wait``, cycles) in seconds at the calibrated SM
    clock; 0 where it was not measured."""
    wait = getattr(cal.wgmma, key).wait if cal.wgmma is not None else None
    return float(wait.value) / float(cal.sm_clock.value) if wait is not None else 0.0


def _reduce(cal) -> dict[int, float]:
    """fp32 bytes per second that reductions into L2 reach, by lanes per instruction (calibration.l2.reduce)."""
    red = getattr(cal.l2, "reduce", None)
    return {} if red is None else {1: float(red.f32.value), 2: float(red.f32x2.value)}


def _latency(cal, level: str) -> float:
    """Seconds of one dependent load at ``level`` (calibration.latency, measured since 2026-11-24), or 0."""
    group = getattr(cal, "latency", None)
    return float(_value(getattr(group, level, None)) or 0.0) if group is not None else 0.0
