"""Energy of one call: the board's base power over the predicted time, plus the energy of the work it does.

    E = base · t + e_tensor · matmul FLOPs + e_exp · exps + e_fp32 · other FLOPs
        + e_l2 · (L2 traffic − DRAM traffic) + e_dram · DRAM traffic

every coefficient from the profile's ``calibration.power`` (``iosim calibrate rates``: NVML's energy counter over
bursts of our own rates kernels, :mod:`iosim.calibrate.power`), none fitted to an attention kernel. ``t`` is the
time model's prediction; the tensor FLOPs are priced at wgmma's energy for an fa3-family kernel, mma.sync's
otherwise (fp32 problems run on the fp32 pipes). The L2 traffic is the counts' global bytes; the DRAM traffic the
bytes the time prices (none for warm calls whose inputs stay in L2). A call as the time records time it: a short
run of back-to-back calls, which the board's power limiter does not yet slow.
"""

from __future__ import annotations

from ..counts import Counts
from ..hardware.calibration import PowerCalibration


def energy_j(counts: Counts, dram_bytes: float, seconds: float, dtype: str, family: str | None,
             power: PowerCalibration | None) -> float | None:
    """Joules of one call, or None where the profile has no power calibration."""
    if power is None:
        return None
    flops = counts.flops
    tensor = power.wgmma if family == "fa3" and power.wgmma is not None else power.mma_sync
    per_matmul = power.fp32.value if dtype == "fp32" else tensor.value
    l2_hits = max(counts.global_bytes - dram_bytes, 0)
    return (power.base.value * seconds + per_matmul * flops.get("matmul", 0) + power.exp.value * flops.get("exp", 0)
            + power.fp32.value * flops.get("other", 0) + power.l2.value * l2_hits + power.dram.value * dram_bytes)
