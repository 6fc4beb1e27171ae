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
* family ``fa3`` (wgmma ping-pong; fa3, cudnn): FlashAttention-3's pipeline, :mod:`iosim.timing.fa3`, at the measured
  wgmma rate;
* family ``naive`` (three kernels): :mod:`iosim.timing.naive`;
* family ``decode`` (iosim-decode: iosim's Flash-Decoding, the ``flash-decoding`` schedule with its tiling): the
  split kernel streaming the cache and the combine kernel, :mod:`iosim.timing.flash_decode`;
* the backward pass (descriptions with ``pass: backward``: iosim-flash2-bwd, fa2-bwd, cudnn-bwd, iosim-flash3-bwd):
  the row kernels stream, the main kernel's step is :mod:`iosim.timing.fa2_bwd`'s or :mod:`iosim.timing.fa3_bwd`'s;
* the peak roofline (:mod:`iosim.timing.roofline`): beside every estimate, and the estimate itself where no kernel
  description applies;
* attention on a CPU (NumPy's naive passes, the tiled kernel of :mod:`iosim.cpu`): :mod:`iosim.timing.cpu`.

Every model returns a :class:`KernelTime` per kernel (:mod:`iosim.timing.estimate`); :func:`predict` gathers a GPU
call's into a :class:`TimeEstimate`, at the clock the board's power limiter leaves the call ``run`` means
(:mod:`iosim.timing.clock`: by default the time records' median call of a run from rest), with its energy
(:mod:`iosim.timing.energy`).

``warm=True`` models back-to-back calls on the same inputs: a problem whose tensors fit in L2 then moves no DRAM
bytes (the estimate's ``dram_free`` says so; the cold bytes stay the result's ``hbm``). Schedules no kernel
describes (flash1, block-sparse, naive's and flash1's backward, ``pass_="both"``) keep the peak roofline, on the cold
DRAM bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from ..counts import Counts
from ..hardware.gpu import Profile
from ..problem import STAT_BYTES, AttentionProblem
from . import (
    clock,
    decode,
    energy,
    fa2,
    fa2_bwd,
    fa3,
    fa3_bwd,
    flash_decode,
    naive,
    overlap,
    roofline,
    uncertainty,
)
from .estimate import Conditions, KernelTime, TimeEstimate, Uncertainty, Workload
from .kernels import (
    DEFAULT_BACKWARD_KERNEL,
    DEFAULT_KERNEL,
    KernelDesc,
    KernelError,
    builtin_kernel_names,
    load_kernel,
)
from .rates import Rates, rates

FAMILY_SCHEDULES = {"fa2": ("flash2",), "fa3": ("flash3",), "naive": ("naive",), "decode": ("flash-decoding",)}
BACKWARD_SCHEDULES = {"fa2": ("flash2",), "fa3": ("flash2", "flash3")}  # a Hopper backward runs flash2's program
L2_RESIDENT_SHARE = 0.8  # a warm problem stays in L2 when its tensors take at most this share of it

__all__ = ["DEFAULT_KERNEL", "KernelDesc", "KernelError", "KernelTime", "Rates", "TimeEstimate", "Uncertainty",
           "Workload", "builtin_kernel_names", "kernel_for", "load_kernel", "predict", "rates"]


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


def predict(work: Workload, profile: Profile, kernel: str | KernelDesc | None = None,
            warm: bool = False, run: str | float = "record") -> TimeEstimate:
    """Predicted time of ``work`` (what the simulator counted) as ``kernel`` runs it, beside the peak roofline;
    ``run``: which call of a run of back-to-back calls (:mod:`iosim.timing.clock`: the records' median by
    default)."""
    problem = work.problem
    roof = roofline.predict(work.counts, [r + w for r, w in work.hbm], problem.dtype, profile)
    desc = kernel_for(work.schedule, kernel, work.pass_)
    if desc is not None and kernel is None and desc.tiles and not any(d >= problem.head_dim for d in desc.tiles):
        desc = None  # the schedule's own kernel has no instantiation for this head_dim: the roofline stands
    windowed, packed = getattr(work.tiles, "window", None) is not None, getattr(work.tiles, "seqlens", ())
    if (packed or windowed) and (desc is None or desc.family not in ("fa2", "fa3")):
        desc = None  # the roofline stands: packed sequences and windows are the fa2 model's (the varlen grid,
        # iosim.timing.fa2.packed_order; a window's K/V block ranges, iosim.timing.fa2.block_times) and the fa3
        # model's (iosim.timing.fa3.packed and block_times)
    if work.value_dim is not None and (desc is None or desc.family != "fa3" or desc.pass_ != "forward"):
        raise KernelError(f"values of {work.value_dim} per head against keys of {problem.head_dim}: only the fa3 "
                          f"family's forward model (fa3, cudnn, iosim-flash3) times them; got "
                          f"{'no kernel' if desc is None else desc.name}")
    if desc is None:
        return replace(roof, roofline_s=roof.predicted_s, kernel="roofline",
                       uncertainty=_band("roofline", profile, problem, roof.predicted_s, True),
                       energy_j=_energy(work, roof.predicted_s, None, profile))
    c, work, dram_free = conditions(work, profile, desc, warm)
    r = c.rates
    at_start = _backward_times(c, work) if desc.pass_ == "backward" else _forward_times(c, work)
    power = profile.calibration.power if profile.calibration is not None and r.calibration != "uncalibrated" else None
    if problem.dtype == "fp8" and (power is None or power.wgmma_fp8 is None):
        power = None  # fp8's energy per FLOP, so its power, is not measured in this calibration
    out, clocks = clock.limited(at_start, power, lambda f, t: _energy(work, t, desc.family, profile, at_start, f), run)
    total = sum(k.predicted_s for k in out)
    layout = uncertainty.Layout(windowed, bool(packed), bool(getattr(work.tiles, "page_size", None)))
    band = _band(desc.name if _is_builtin(desc) else "", profile, problem, total, r.calibration != "uncalibrated",
                 layout)
    joules = clocks.joules if clocks is not None else _energy(work, total, desc.family, profile, out)
    return TimeEstimate(out, roof.unmodeled, roofline_s=roof.predicted_s, kernel=desc.name,
                        calibration=r.calibration, dram_free=dram_free, uncertainty=band, energy_j=joules,
                        clock=clocks)


def conditions(work: Workload, profile: Profile, desc: KernelDesc, warm: bool) -> tuple[Conditions, Workload, bool]:
    """What ``desc``'s model predicts ``work`` under (:class:`Conditions`), the work as it prices it and whether its
    DRAM is free: with ``warm`` calls whose inputs stay in L2, no DRAM bytes and one L2 latency a dependent load."""
    r = rates(profile, work.problem.dtype)
    dram_free = warm and _resident(work.problem, profile, work.counts, work.pass_)
    if dram_free:
        work = replace(work, hbm=[(0.0, 0.0)] * len(work.hbm))
    return Conditions(work.problem, desc, profile, r, r.l2_latency_s if dram_free else r.dram_latency_s), work, dram_free


def _energy(work: Workload, seconds: float, family: str | None, profile: Profile,
            kernels: Sequence[KernelTime] = (), clock_hz: float | None = None) -> float | None:
    """Joules of one call (:mod:`iosim.timing.energy`): ``work.hbm`` is the DRAM traffic the time priced,
    ``kernels`` the kernel models' times (their shared-memory bytes and tensor FLOPs), ``clock_hz`` the SM clock
    the call runs at (None: each unit as its burst ran)."""
    cal = profile.calibration
    return energy.energy_j(work.counts, sum(r + w for r, w in work.hbm), seconds, work.problem.dtype, family,
                           cal.power if cal is not None else None, energy.KernelWork.of(kernels), clock_hz)


def _forward_times(c: Conditions, work: Workload) -> list[KernelTime]:
    """The forward's kernels, by the description's family: naive's three, FA3's pipeline, FA2's (split-KV where its
    heuristic splits)."""
    p, desc, r, kernels = c.problem, c.desc, c.rates, work.counts.kernels
    if desc.family == "naive":
        return naive.kernel_times(c, work.tiles, kernels, work.hbm)
    if desc.family == "decode":
        return flash_decode.kernel_times(c, work, L2_RESIDENT_SHARE)
    if desc.family == "fa3":
        step, tile, call = (fa3.measured(c.profile, desc, p, work.tiles, part, work.value_dim)
                            for part in fa3.MEASURED_PARTS)
        model = fa3.HopperModel(tensor_efficiency=fa3.wgmma_efficiency(r, c.profile, p.dtype),
                                overlap_loss=overlap.OVERLAP_LOSS, step_s=step, tile_fixed_s=tile if step else None)
        order = desc.order_for(p.dtype)
        placement = {"persistent-iosim": "iosim", "persistent-in-order": "in-order"}.get(order, "dynamic")
        k = fa3.kernel_time(kernels[0], p, work.tiles, c.profile, model, placement, work.value_dim)
        fixed = call if step and call is not None else r.first_launch_s() + 3 * c.latency  # Q, first K/V; drain
        return [replace(k, predicted_s=k.predicted_s + fixed)]
    dram = (sum(x[0] for x in work.hbm), sum(x[1] for x in work.hbm))
    window, seqs = getattr(work.tiles, "window", None), getattr(work.tiles, "seqlens", ())
    if window is None and not seqs and decode.applies(p, desc, r):
        return [decode.kernel_time(c, kernels[0], dram)]
    tc = fa2.tiles_of(desc, p.head_dim, work.tiles.block_q, work.tiles.block_kv)
    folded = p if window is not None or seqs else decode.folded(p, desc)
    page_size = getattr(work.tiles, "page_size", None)
    return [fa2.kernel_time(replace(c, problem=folded), kernels[0], dram, tc, window, seqs, page_size)]


def _is_builtin(desc: KernelDesc) -> bool:
    """A built-in description (the records time the built-ins: a user's file of the same name is not one)."""
    return desc.name in builtin_kernel_names() and desc == load_kernel(desc.name)


def _band(kernel: str, profile: Profile, problem: AttentionProblem, predicted_s: float,
          calibrated: bool, layout: uncertainty.Layout = uncertainty.DENSE) -> uncertainty.Uncertainty:
    """The records' band around ``predicted_s`` (:mod:`iosim.timing.uncertainty`); "no record" for a kernel the
    records do not time, or rates that were not measured; ``layout``: a sliding window's call, packed sequences,
    packed sequences on a paged cache (each its own regime)."""
    return uncertainty.band(kernel, profile.name, problem, predicted_s, calibrated=calibrated, layout=layout)


def _backward_times(c: Conditions, work: Workload) -> list[KernelTime]:
    """The backward's kernels: the main K/V-outer kernel (its family's step model), the row kernels streaming."""
    out = []
    for i, (kc, dram) in enumerate(zip(work.counts.kernels, work.hbm, strict=True)):
        if kc.name.endswith("_bwd"):
            tc = fa2.tiles_of(c.desc, c.problem.head_dim, work.tiles.block_q, work.tiles.block_kv)
            model = fa3_bwd if c.desc.family == "fa3" else fa2_bwd
            out.append(model.main_kernel_time(c, kc, dram, tc))
        else:
            out.append(fa2_bwd.row_kernel_time(kc, dram, c.rates, i == 0))
    return out
