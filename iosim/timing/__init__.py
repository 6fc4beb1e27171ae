"""The time model: a kernel's predicted time from its per-tile work, its launch and its overlap, on measured rates.

    >>> from iosim import AttentionProblem, simulate
    >>> r = simulate("flash2", AttentionProblem(seq_len=4096, head_dim=128), "h100-sxm5-80gb", kernel="fa2")
    >>> r.time.kernel, r.time.predicted_s > r.time.roofline_s
    ('fa2', True)

What the simulator already knows (tiles, FLOPs, bytes at every boundary, DRAM bytes from the cache model) plus a
kernel description (:mod:`iosim.timing.kernels`: tiles, warps, registers, shared memory, launch order, family) and
the profile's rates (:mod:`iosim.timing.rates`: measured by ``iosim calibrate rates``, or the datasheet's) give:

* family ``fa2`` (mma.sync; iosim-flash2, FlashAttention-2): :mod:`iosim.timing.fa2`, and its split-KV decode,
  :mod:`iosim.timing.decode`;
* family ``fa3`` (wgmma ping-pong; fa3, cudnn): FlashAttention-3's pipeline, :mod:`iosim.hopper`, at the measured
  wgmma rate;
* family ``naive`` (three kernels): :mod:`iosim.timing.naive`;
* the backward pass (descriptions with ``pass: backward``: iosim-flash2-bwd, fa2-bwd, cudnn-bwd, iosim-flash3-bwd):
  the row kernels stream, the main kernel's step is :mod:`iosim.timing.fa2_bwd`'s or :mod:`iosim.timing.fa3_bwd`'s.

``warm=True`` models back-to-back calls on the same inputs: a problem whose tensors fit in L2 then moves no DRAM
bytes (the estimate's ``dram_free`` says so; the cold bytes stay the result's ``hbm``). Schedules no kernel
describes (flash1, block-sparse, naive's and flash1's backward, ``pass_="both"``) keep the peak roofline, on the cold
DRAM bytes.
"""

from __future__ import annotations

from dataclasses import replace

from .. import hopper, roofline
from ..counts import Counts
from ..hardware.gpu import Profile
from ..problem import STAT_BYTES, AttentionProblem
from ..roofline import KernelTime, TimeEstimate
from ..schedules import Tiles
from . import decode, fa2, fa2_bwd, fa3_bwd, naive, overlap, uncertainty
from .kernels import (
    DEFAULT_BACKWARD_KERNEL,
    DEFAULT_KERNEL,
    KernelDesc,
    KernelError,
    builtin_kernel_names,
    load_kernel,
)
from .rates import Rates, rates

FAMILY_SCHEDULES = {"fa2": ("flash2",), "fa3": ("flash3",), "naive": ("naive",)}
BACKWARD_SCHEDULES = {"fa2": ("flash2",), "fa3": ("flash2", "flash3")}  # a Hopper backward runs flash2's program
L2_RESIDENT_SHARE = 0.8  # a warm problem stays in L2 when its tensors take at most this share of it

__all__ = ["DEFAULT_KERNEL", "KernelDesc", "KernelError", "Rates", "builtin_kernel_names", "kernel_for",
           "load_kernel", "predict", "rates"]


def kernel_for(schedule: str, kernel: str | KernelDesc | None, pass_: str = "forward") -> KernelDesc | None:
    """The description ``kernel`` names (checked against the schedule and the pass), or the schedule's default
    for the pass; None: none (the pass "both" times each pass's default kernels)."""
    if kernel is None:
        name = (DEFAULT_BACKWARD_KERNEL if pass_ == "backward" else DEFAULT_KERNEL).get(schedule)
        return load_kernel(name) if name and pass_ != "both" else None
    desc = load_kernel(kernel)
    runs = (BACKWARD_SCHEDULES if desc.pass_ == "backward" else FAMILY_SCHEDULES).get(desc.family, ())
    if schedule not in runs:
        raise KernelError(f"kernel {desc.name!r} (family {desc.family}, {desc.pass_} pass) runs the schedules "
                          f"{', '.join(runs) or 'none'}, not {schedule!r}")
    if desc.pass_ != pass_:
        raise KernelError(f"kernel {desc.name!r} describes the {desc.pass_} pass, not the {pass_} pass; "
                          f"built-ins: {', '.join(builtin_kernel_names())}")
    return desc


def _resident(p: AttentionProblem, profile: Profile, counts: Counts, pass_: str) -> bool:
    cap = profile.l2.capacity.value
    if pass_ == "backward":  # Q, K, V, O and their gradients, the fp32 dQ accumulator, L and D
        extra = p.tensor_bytes + p.batch * p.heads * p.seq_len * (4 * p.head_dim + 2 * STAT_BYTES)
    else:
        extra = sum(k.global_write_bytes for k in counts.kernels[:-1])  # S and P of the naive path
    return bool(cap) and p.tensor_bytes + extra <= L2_RESIDENT_SHARE * cap


def predict(schedule: str, pass_: str, problem: AttentionProblem, tiles: Tiles, counts: Counts,
            hbm: list[tuple[float, float]], profile: Profile, kernel: str | KernelDesc | None = None,
            warm: bool = False) -> TimeEstimate:
    """Predicted time of ``schedule`` as ``kernel`` runs it; ``hbm[k]`` = (DRAM read, DRAM write) bytes of kernel k."""
    roof = roofline.predict(counts, [r + w for r, w in hbm], problem.dtype, profile)
    desc = kernel_for(schedule, kernel, pass_)
    if desc is not None and kernel is None and desc.tiles and not any(d >= problem.head_dim for d in desc.tiles):
        desc = None  # the schedule's own kernel has no instantiation for this head_dim: the roofline stands
    if desc is None:
        return replace(roof, roofline_s=roof.predicted_s, kernel="roofline",
                       uncertainty=_band("roofline", profile, problem, roof.predicted_s, True))
    r = rates(profile, problem.dtype)
    latency = r.dram_latency_s
    dram_free = warm and _resident(problem, profile, counts, pass_)
    if dram_free:
        hbm, latency = [(0.0, 0.0)] * len(hbm), r.l2_latency_s
    out = []
    if desc.pass_ == "backward":
        out = _backward_times(problem, tiles, counts, hbm, profile, desc, r, latency)
    elif desc.family == "naive":
        for name, t, parts in naive.kernel_times(problem, tiles, counts.kernels, profile, r, hbm, latency):
            out.append(KernelTime(name, _grid(counts, name), 1.0, _seconds(parts), t, parts["bound"]))
    elif desc.family == "fa3":
        model = hopper.HopperModel(tensor_efficiency=_wgmma_efficiency(r, profile, problem.dtype),
                                   overlap_loss=overlap.OVERLAP_LOSS)
        est = hopper.predict(counts, problem, tiles, profile, model)
        k = est.kernels[0]
        out.append(replace(k, predicted_s=k.predicted_s + r.first_launch_s() + 3 * latency))  # Q, first K/V; drain
    else:
        mod = decode if decode.applies(problem, desc, r) else fa2
        (rd, wr) = (sum(x[0] for x in hbm), sum(x[1] for x in hbm))
        if mod is fa2:
            tc = fa2.tiles_of(desc, problem.head_dim, tiles.block_q, tiles.block_kv)
            t, parts = fa2.kernel_time(problem, desc, profile, r, rd, wr, tc, latency)
        else:
            t, parts = decode.kernel_time(problem, desc, profile, r, rd, wr, latency)
        out.append(KernelTime(counts.kernels[0].name, counts.kernels[0].grid, parts.pop("utilization"),
                              _seconds(parts), t, parts["bound"]))
    band = _band(desc.name if _is_builtin(desc) else "", profile, problem, sum(k.predicted_s for k in out),
                 r.calibration != "uncalibrated")
    return TimeEstimate(out, roof.unmodeled, roofline_s=roof.predicted_s, kernel=desc.name,
                        calibration=r.calibration, dram_free=dram_free, uncertainty=band)


def _is_builtin(desc: KernelDesc) -> bool:
    """A built-in description (the records time the built-ins: a user's file of the same name is not one)."""
    return desc.name in builtin_kernel_names() and desc == load_kernel(desc.name)


def _band(kernel: str, profile: Profile, problem: AttentionProblem, predicted_s: float,
          calibrated: bool) -> uncertainty.Uncertainty:
    """The records' band around ``predicted_s`` (:mod:`iosim.timing.uncertainty`); "no record" for a kernel the
    records do not time, or rates that were not measured."""
    return uncertainty.band(kernel, profile.name, problem, predicted_s, calibrated=calibrated)


def _backward_times(problem: AttentionProblem, tiles: Tiles, counts: Counts, hbm: list[tuple[float, float]],
                    profile: Profile, desc: KernelDesc, r: Rates, latency: float) -> list[KernelTime]:
    """The backward's kernels: the main K/V-outer kernel (its family's step model), the row kernels streaming."""
    out = []
    for i, (kc, dram) in enumerate(zip(counts.kernels, hbm, strict=True)):
        if kc.name.endswith("_bwd"):
            tc = fa2.tiles_of(desc, problem.head_dim, tiles.block_q, tiles.block_kv)
            if desc.family == "fa3":
                t, parts = fa3_bwd.main_kernel_time(problem, desc, tc, r, dram, latency)
            else:
                t, parts = fa2_bwd.main_kernel_time(problem, desc, tc, profile, r, dram, latency)
        else:
            t, parts = fa2_bwd.row_kernel_time((kc.global_read_bytes, kc.global_write_bytes), dram, r, i == 0)
        out.append(KernelTime(kc.name, kc.grid, parts.pop("utilization"), _seconds(parts), t, parts["bound"]))
    return out


def _grid(counts: Counts, name: str) -> int:
    return next((k.grid for k in counts.kernels if k.name == name), 0)


def _seconds(parts: dict) -> dict[str, float]:
    return {k: float(v) for k, v in parts.items() if isinstance(v, float)}


def _wgmma_efficiency(r: Rates, profile: Profile, dtype: str) -> float:
    """The measured wgmma rate as a share of the datasheet peak (the Hopper model's tensor_efficiency); fp8 takes
    the fp16 measurement's share of the fp16 peak."""
    if r.wgmma == r.wgmma and r.calibration != "uncalibrated":  # measured (not nan)
        return min(1.0, r.wgmma / profile.matmul_rate("bf16" if dtype == "bf16" else "fp16"))
    return hopper.HopperModel().tensor_efficiency
