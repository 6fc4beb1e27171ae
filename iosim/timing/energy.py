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
A call as the time records time it: a short run of back-to-back calls, which the board's power limiter does not
yet slow.

The calibration's bursts move random data, as attention's inputs are (iosim/calibrate/power.py): a unit's energy
grows with the bits its operands toggle.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

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
             power: PowerCalibration | None, work: KernelWork = KernelWork()) -> float | None:
    """Joules of one call, or None where the profile has no power calibration (a calibration without the
    shared-memory unit prices no shared-memory bytes)."""
    if power is None:
        return None
    flops = dict(counts.flops)
    if work.tensor_flops is not None:
        flops["matmul"] = work.tensor_flops
    tensor = power.wgmma if family == "fa3" and power.wgmma is not None else power.mma_sync
    per_matmul = power.fp32.value if dtype == "fp32" else tensor.value
    l2_hits = max((counts.global_bytes if work.l2_bytes is None else work.l2_bytes) - dram_bytes, 0)
    return (power.base.value * seconds + per_matmul * flops.get("matmul", 0) + power.exp.value * flops.get("exp", 0)
            + power.fp32.value * flops.get("other", 0) + power.l2.value * l2_hits + power.dram.value * dram_bytes
            + (power.smem.value * work.smem_bytes if power.smem is not None else 0.0))
