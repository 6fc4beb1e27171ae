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

A rate the profile does not publish (``value: null``) leaves its resource out of the roofline; the estimate
names it in ``unmodeled`` so nobody mistakes a partial roofline for a full one. Without an SM count the
grid's utilization is taken as 1.
"""

from __future__ import annotations

from ..counts import Counts
from ..hardware.gpu import Profile, ProfileError
from .estimate import KernelTime, TimeEstimate

RESOURCES = ("tensor", "exp", "fp32", "global", "hbm")


def utilization(grid: int, sm_count: int) -> float:
    if grid <= 0:
        return 1.0
    waves = -(-grid // sm_count)
    return grid / (sm_count * waves)


def predict(counts: Counts, hbm_bytes: list[int], dtype: str, profile: Profile) -> TimeEstimate:
    """Time of each kernel of ``counts``; ``hbm_bytes[k]`` is kernel k's DRAM read + write bytes."""
    fields = {
        "tensor": "compute.fp32" if dtype == "fp32" else f"compute.tensor.{dtype}",
        "exp": "compute.exp",
        "fp32": "compute.fp32",
        "global": "l2.bandwidth",
        "hbm": "dram.bandwidth",
    }
    rates, unmodeled = {}, {}
    for resource, dotted in fields.items():
        try:
            rates[resource] = profile.require(dotted)
        except ProfileError:
            unmodeled[resource] = dotted
    if not rates:
        raise ProfileError(f"profile {profile.name!r} publishes none of the rates a roofline needs")
    sms = profile.sm_count.value
    out = []
    for k, hbm in zip(counts.kernels, hbm_bytes, strict=True):
        work = {
            "tensor": k.flops["matmul"],
            "exp": k.flops["exp"],
            "fp32": k.flops["other"],
            "global": k.global_read_bytes + k.global_write_bytes,
            "hbm": hbm,
        }
        res = {r: work[r] / rate for r, rate in rates.items()}
        bound = max(res, key=res.get)
        u = utilization(k.grid, int(sms)) if sms else 1.0
        out.append(KernelTime(k.name, k.grid, u, res, res[bound] / u, bound))
    est = TimeEstimate(out, unmodeled)
    est.roofline_s = est.predicted_s
    return est
