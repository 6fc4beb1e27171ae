"""Time of attention on a CPU: NumPy's naive passes over S, or the tiled kernel of :mod:`iosim.cpu` (flash2).

Where the profile carries measured rates (``iosim profiles detect``), the time composes them: GEMM rates for the
shapes issued, the softmax and exp rates, the first-touch and one-core bandwidths for NumPy's passes over S; nothing
is fitted to attention timings. ``predicted_s`` is a warm call's (repeated calls: naive's S lands on memory the
previous call freed, first-touch rate ``dram.first_touch``); ``first_call_s`` is a call on cold memory
(``dram.first_touch_cold``: on a VM that backs guest memory lazily, far slower). ``bound_s`` is the ideal roofline
(peak FLOPs, DRAM bandwidth) beside it. The bytes the call moves are :mod:`iosim.simulate_cpu`'s.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..hardware.cpu import CpuProfile
from ..problem import AttentionProblem
from .estimate import KernelTime

COMPUTE_BYTES = {"fp32": 4, "fp16": 4, "bf16": 4}  # fp16/bf16 are upcast: tiles and S are fp32 on a CPU
# NumPy's naive passes over S (iosim.cpu.attention._naive): (name, reads, writes) in units of S
NAIVE_PASSES = (("qk", 0, 1), ("max", 1, 0), ("subtract", 1, 1), ("exp", 1, 1), ("sum", 1, 0),
                ("divide", 1, 1), ("pv", 1, 0))


class CpuModelError(ValueError):
    """A problem or tile the CPU model cannot take; the message names the field, the value and the fix."""


@dataclass(frozen=True)
class CpuTime:
    """A CPU call's time: ``kernel`` the model's (its parts in ``resources``), None where the profile has no measured
    rates (run ``iosim profiles detect``); the ideal roofline ``bound_s`` beside it; ``first_call_s``, a call whose
    large allocations land on cold memory (a program's first call: naive's S first touched at
    ``dram.first_touch_cold``), None where the profile lacks that rate."""

    kernel: KernelTime | None
    bound_s: float  # ideal roofline: max(FLOPs / peak, DRAM bytes / DRAM bandwidth)
    first_call_s: float | None = None

    @property
    def predicted_s(self) -> float | None:
        return None if self.kernel is None else self.kernel.predicted_s

    @property
    def terms(self) -> dict[str, float]:
        """Seconds per term of ``predicted_s``."""
        return {} if self.kernel is None else self.kernel.resources


def elem_bytes(p: AttentionProblem) -> int:
    """Bytes of an element as the CPU computes it (fp32; fp16 and bf16 are upcast)."""
    if p.dtype not in COMPUTE_BYTES:
        raise CpuModelError(f"dtype={p.dtype!r}: the CPU path computes fp32 (fp16/bf16 upcast); expected one of "
                            f"{', '.join(COMPUTE_BYTES)}")
    return COMPUTE_BYTES[p.dtype]


def call_time(schedule: str, problem: AttentionProblem, profile: CpuProfile, s_elems: int,
              dram_bytes: int) -> CpuTime:
    """The time of ``schedule`` ("naive" or "flash2") on ``problem``: ``s_elems`` scores computed (all heads),
    ``dram_bytes`` moved at the DRAM boundary."""
    if schedule == "naive":
        terms = _naive_time(problem, profile)
        first = _first_call(problem, profile, terms) if terms else None
        threads = 1  # NumPy's passes run on one core (its GEMMs on BLAS's threads)
    else:
        terms = _flash2_time(problem, profile, s_elems, dram_bytes)
        # flash2 allocates O(N d) (the output, a tile per core): its first touch is not modeled, first call = warm
        first = sum(terms.values()) if terms else None
        threads = int(profile.require("cores"))  # a tile per core
    matmul = 4 * s_elems * problem.head_dim
    bound = max(matmul / profile.require("compute.fp32"), dram_bytes / profile.require("dram.bandwidth"))
    if not terms:
        return CpuTime(None, bound, first)
    kernel = KernelTime(schedule, threads, 1.0, terms, sum(terms.values()), max(terms, key=terms.get))
    return CpuTime(kernel, bound, first)


def _rate(prof: CpuProfile, dotted: str) -> float | None:
    try:
        return prof.require(dotted)
    except ValueError:
        return None


def _naive_time(p: AttentionProblem, prof: CpuProfile) -> dict[str, float] | None:
    """Seconds per term from measured rates, or None where the profile lacks them."""
    need = ("dram.bandwidth_one_core", "dram.first_touch", "compute.numpy_exp_fp32")
    rates = {k: _rate(prof, k) for k in need}
    if None in rates.values() or not prof.compute.gemm:
        return None
    h, n_s = p.n_heads_total, p.seq_len * p.kv_len
    s = n_s * elem_bytes(p)
    flops = 2 * n_s * p.head_dim
    bw = rates["dram.bandwidth_one_core"]
    terms = {"gemm_qk": h * flops / prof.gemm_rate("qk", p.head_dim).value,
             "gemm_pv": h * flops / prof.gemm_rate("pv", p.head_dim).value,
             "first_touch_s": h * s / rates["dram.first_touch"]}
    for name, r, w in NAIVE_PASSES:
        if name in ("qk", "pv"):
            continue
        t_mem = h * (r + w) * s / bw
        terms[name] = max(t_mem, h * n_s / rates["compute.numpy_exp_fp32"]) if name == "exp" else t_mem
    return terms


def _first_call(p: AttentionProblem, prof: CpuProfile, terms: dict[str, float]) -> float | None:
    """naive's time when its S lands on cold memory; None where the profile has no cold first-touch rate."""
    cold = _rate(prof, "dram.first_touch_cold")
    if cold is None:
        return None
    s = p.n_heads_total * p.seq_len * p.kv_len * elem_bytes(p)
    return sum(terms.values()) - terms["first_touch_s"] + s / cold


def _flash2_time(p: AttentionProblem, prof: CpuProfile, s_elems: int, dram: int) -> dict[str, float] | None:
    tile = [g for g in prof.compute.gemm if g.kind == "tile"]
    soft = _rate(prof, "compute.softmax_fp32")
    if not tile or soft is None:
        return None
    compute = 4 * s_elems * p.head_dim / prof.gemm_rate("tile", p.head_dim).value + s_elems / soft
    return {"compute": compute, "dram": max(0.0, dram / prof.require("dram.bandwidth") - compute)}
