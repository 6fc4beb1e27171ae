"""Predicted time: a roofline per kernel that also accounts for how much of the chip the grid can use.

For each kernel, every resource gets a time, work over rate:

    tensor   matmul FLOPs / tensor-core rate of the dtype (fp32 problems: plain fp32 rate)
    exp      exp FLOPs    / special-function rate
    fp32     other FLOPs  / plain fp32 rate
    global   global bytes / L2 bandwidth         (SM <-> L2)
    hbm      hbm bytes    / DRAM bandwidth       (L2 <-> DRAM)

and the kernel takes the longest of them (the resource that "bounds" it), divided by the fraction of the
chip its grid keeps busy. A grid of G thread blocks on S SMs runs in ceil(G/S) rounds; if every block does
the same work, the busiest SM does ceil(G/S) blocks' worth while the chip could share G blocks' worth, so
the utilization is G / (S·ceil(G/S)): 1 for a grid that fills whole waves, 1/132 for one block on an H100,
and less than 1 for a ragged last wave. The ``sram`` bytes are reported but not timed: they lump register
and shared-memory traffic, whose bandwidths differ by an order of magnitude.
"""

from __future__ import annotations

from dataclasses import dataclass

from .counts import Counts
from .profile import Profile

RESOURCES = ("tensor", "exp", "fp32", "global", "hbm")


@dataclass
class KernelTime:
    name: str
    grid: int
    utilization: float
    resources: dict[str, float]  # seconds at full-chip rate, per resource
    predicted_s: float
    bound: str


@dataclass
class TimeEstimate:
    kernels: list[KernelTime]

    @property
    def predicted_s(self) -> float:
        return sum(k.predicted_s for k in self.kernels)

    @property
    def bound(self) -> str:
        """The bound of the kernel that takes longest."""
        return max(self.kernels, key=lambda k: k.predicted_s).bound if self.kernels else "none"


def utilization(grid: int, sm_count: int) -> float:
    if grid <= 0:
        return 1.0
    waves = -(-grid // sm_count)
    return grid / (sm_count * waves)


def predict(counts: Counts, hbm_bytes: list[int], dtype: str, profile: Profile) -> TimeEstimate:
    """Time of each kernel of ``counts``; ``hbm_bytes[k]`` is kernel k's DRAM read + write bytes."""
    sms = profile.require("sm_count")
    tensor = profile.matmul_rate(dtype)
    exp_rate = profile.require("compute.exp")
    fp32 = profile.require("compute.fp32")
    l2_bw = profile.require("l2.bandwidth")
    dram_bw = profile.require("dram.bandwidth")
    out = []
    for k, hbm in zip(counts.kernels, hbm_bytes, strict=True):
        res = {
            "tensor": k.flops["matmul"] / tensor,
            "exp": k.flops["exp"] / exp_rate,
            "fp32": k.flops["other"] / fp32,
            "global": (k.global_read_bytes + k.global_write_bytes) / l2_bw,
            "hbm": hbm / dram_bw,
        }
        bound = max(res, key=res.get)
        u = utilization(k.grid, int(sms))
        out.append(KernelTime(k.name, k.grid, u, res, res[bound] / u, bound))
    return TimeEstimate(out)
