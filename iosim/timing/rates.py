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

from ..profile import Profile


@dataclass(frozen=True)
class Rates:
    """Chip-wide rates per second (divide by ``sms`` for one SM)."""

    sms: int
    mma: float  # mma.sync FLOP/s at full issue, this dtype (fp32 problems: plain fp32)
    mma_by_warps: dict[int, float] = field(default_factory=dict)  # warps per SM -> mma.sync FLOP/s
    wgmma: float = math.nan  # Hopper warpgroup MMA FLOP/s (nan: not measured, not Hopper)
    ex2: float = math.nan  # exp2 results/s (special-function unit)
    alu: float = math.nan  # fp32 lane operations/s (an FMA is one operation here)
    smem: float = math.inf  # shared memory bytes/s (ldmatrix)
    l2: float = math.inf  # L2 -> SM bytes/s
    dram_read: float = math.inf
    dram_write: float = math.inf
    launch_s: float = 0.0  # back-to-back launch interval of a kernel on one stream
    block_s: float = 0.0  # cost of starting one thread block on an SM
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

    def dram_s(self, read: float, write: float) -> float:
        return read / self.dram_read + write / self.dram_write


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
        dram_read=bw,
        dram_write=bw,
    )


def rates(profile: Profile, dtype: str) -> Rates:
    """The profile's measured rates for ``dtype`` where it has them, else its datasheet's."""
    base = _datasheet(profile, dtype)
    cal = getattr(profile, "calibration", None)
    if cal is None:
        return base
    return from_calibration(cal, base, dtype)


def from_calibration(cal, base: Rates, dtype: str) -> Rates:
    """``base`` with every rate ``cal`` measured put in its place."""
    key = "bf16" if dtype == "bf16" else "fp16"
    table = cal.mma_sync_table(key) if dtype != "fp32" else {}
    mma = max(table.values()) if table else base.mma
    wg = cal.rate(f"wgmma.{key}") if dtype != "fp32" else None
    return Rates(
        sms=base.sms,
        mma=mma,
        mma_by_warps=table,
        wgmma=wg if wg else base.wgmma,
        ex2=cal.rate("mufu_ex2") or base.ex2,
        alu=(cal.rate("fp32_fma") or 2 * base.alu) / 2,
        smem=cal.rate("smem_ldmatrix") or base.smem,
        l2=cal.rate("l2_read") or base.l2,
        dram_read=cal.rate("dram_read") or base.dram_read,
        dram_write=cal.rate("dram_write") or base.dram_write,
        launch_s=cal.rate("launch_interval") or 0.0,
        block_s=cal.rate("block_start") or 0.0,
        calibration=cal.label(),
    )
