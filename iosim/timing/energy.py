"""Energy of one call: the board's base power over the predicted time, plus the energy of the work it does.

    E = base · t + e_tensor · matmul FLOPs + e_exp · exps + e_fp32 · other FLOPs + e_smem · shared-memory traffic
        + e_l2 · (L2 traffic − DRAM traffic) + e_dram · DRAM traffic

every coefficient from the profile's ``calibration.power`` (``iosim calibrate rates``: NVML's energy counter over
bursts of our own rates kernels, :mod:`iosim.calibrate.power`), none fitted to an attention kernel. ``t`` is the
time model's prediction; the tensor FLOPs are priced at wgmma's energy for an fa3-family kernel, mma.sync's
otherwise (fp32 problems run on the fp32 pipes), at the FLOPs the kernels run (``KernelTime.tensor_flops``:
standard attention's kernels skip the tiles the causal mask empties; else the counts'). The shared-memory traffic
is what the kernel model moves through shared memory (``KernelTime.smem_bytes``: tiles landed, operands read by
ldmatrix, tiles staged; none for wgmma kernels, whose operand reads are in wgmma's energy per FLOP, nor for the
roofline). The L2 traffic is the counts' global bytes, or the kernels' where their model says
(``KernelTime.l2_bytes``: standard attention's GEMMs re-read Q, K and V from L2 at their tiles, where the paper's
count reads each once); the DRAM traffic the bytes the time prices (none for warm calls whose inputs stay in L2).
The tensor units are priced at the clock the call runs at (:func:`clock_factor`; which clock, under the board's
power limiter, :mod:`iosim.timing.clock` says), the others as their bursts measured them.

The calibration's bursts move random data, as attention's inputs are (iosim/calibrate/power.py): a unit's energy
grows with the bits its operands toggle.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..counts import Counts
from ..hardware.calibration import PowerCalibration

if TYPE_CHECKING:
    from .estimate import KernelTime


@dataclass(frozen=True)
class KernelWork:
    """What the kernel models say the kernels do beside the counts: bytes through shared memory, and the tensor
    FLOPs and L2 bytes where the kernels run other than the counts (None: the counts')."""

    smem_bytes: float = 0.0
    tensor_flops: float | None = None
    l2_bytes: float | None = None

    @classmethod
    def of(cls, kernels: Sequence[KernelTime]) -> KernelWork:
        """The sums over ``kernels``; a figure only where every kernel model gives one (none: the roofline's
        estimate, which prices no shared memory and the counts' FLOPs and bytes)."""
        def total(field: str) -> float | None:
            values = [getattr(k, field) for k in kernels]
            return sum(values) if values and None not in values else None

        return cls(sum(k.smem_bytes for k in kernels), total("tensor_flops"), total("l2_bytes"))


def energy_j(counts: Counts, dram_bytes: float, seconds: float, dtype: str, family: str | None,
             power: PowerCalibration | None, work: KernelWork = KernelWork(),
             clock_hz: float | None = None) -> float | None:
    """Joules of one call, or None where the profile has no power calibration (a calibration without the
    shared-memory unit prices no shared-memory bytes). ``clock_hz``: the SM clock the call runs at, where the
    calibration says what each unit's burst ran at (``power.at``) and how the SM's power grows with its clock
    (``power.limiter``): the units on the SM's clock are priced at it (:func:`clock_factor`); else as measured."""
    if power is None:
        return None
    flops = dict(counts.flops)
    if work.tensor_flops is not None:
        flops["matmul"] = work.tensor_flops
    unit = "fp32" if dtype == "fp32" else tensor_unit(power, dtype, family)

    def at(name: str) -> float:
        return getattr(power, name).value * clock_factor(power, name, clock_hz)

    l2_hits = max((counts.global_bytes if work.l2_bytes is None else work.l2_bytes) - dram_bytes, 0)
    return (power.base.value * seconds + at(unit) * flops.get("matmul", 0) + at("exp") * flops.get("exp", 0)
            + at("fp32") * flops.get("other", 0) + power.l2.value * l2_hits + power.dram.value * dram_bytes
            + (at("smem") * work.smem_bytes if power.smem is not None else 0.0))


def tensor_unit(power: PowerCalibration, dtype: str, family: str | None) -> str:
    """The unit a call's tensor FLOPs are priced at: wgmma for an fa3-family kernel (its e4m3 burst for fp8,
    where measured), mma.sync otherwise."""
    if family != "fa3" or power.wgmma is None:
        return "mma_sync"
    return "wgmma_fp8" if dtype == "fp8" and power.wgmma_fp8 is not None else "wgmma"


def clock_factor(power: PowerCalibration, unit: str, clock_hz: float | None) -> float:
    """How much more ``unit``'s work costs at ``clock_hz`` than at the clock its burst ran at: the SM's energy per
    cycle at the two clocks (:func:`energy_per_cycle`). 1 where the calibration lacks either, no clock is given,
    or the unit's burst ran above the clocks the limiter's bursts measured (exp, fp32 and shared memory run alone
    at 1.98 GHz, above any tensor burst's clock: how the SM's power grows up there is not measured); a clock above
    them counts as the highest one measured."""
    at = (power.at or {}).get(unit)
    if clock_hz is None or power.limiter is None or at is None:
        return 1.0
    f, _ = sm_watts_curve(power)
    if at.value > f[-1]:
        return 1.0
    return energy_per_cycle(power, min(clock_hz, f[-1])) / energy_per_cycle(power, at.value)


def energy_per_cycle(power: PowerCalibration, clock_hz: float) -> float:
    """Joules per cycle of one busy SM at ``clock_hz`` (at most the highest clock measured), from the limiter's
    bursts (``power.limiter``: the watts above idle per busy SM at the clock each burst held, over that clock): the
    watts interpolated between the measured clocks on log-log axes, and below the lowest along its segment (the
    voltage keeps falling with the clock)."""
    f, w = sm_watts_curve(power)
    lf, lw, x = np.log(f), np.log(w), math.log(clock_hz)
    if x < lf[0] and len(f) > 1:
        return math.exp(lw[0] + (x - lf[0]) * (lw[1] - lw[0]) / (lf[1] - lf[0])) / clock_hz
    return math.exp(float(np.interp(x, lf, lw))) / clock_hz


def sm_watts_curve(power: PowerCalibration) -> tuple[np.ndarray, np.ndarray]:
    """(clocks, watts above idle per busy SM) of the limiter's bursts on each share of the SMs, each held by the fast
    loop at one clock, by clock, the watts never falling as the clock rises (a lower reading is the measurement's
    noise). The averaged loop's ``steady`` is not a point of it: the clock swings there, and the watts average
    over the swing, more than the power at the average clock."""
    lim, idle = power.limiter, power.idle.value
    pts = sorted((lim.clocks.value[n], (lim.watts.value[n] - idle) / n) for n in lim.clocks.value)
    f, w = [], []
    for clock, watts in pts:
        if f and clock <= f[-1] * 1.002:
            w[-1] = max(w[-1], watts)
        else:
            f.append(clock)
            w.append(max(watts, w[-1]) if w else watts)
    return np.array(f), np.array(w)
