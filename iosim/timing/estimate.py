"""What the time models take and return, written once.

Every time model (the peak roofline, FA2's and FA3's forward and backward, split-KV decode, naive's three kernels, the
CPU's call) returns a :class:`KernelTime` per kernel: its predicted seconds, the parts they are made of and what
bounds it. A GPU call's kernels make a :class:`TimeEstimate` (the ``time`` of :class:`iosim.Result`), beside the
peak roofline, the rates' origin and the records' uncertainty band; a CPU call's one kernel makes the
``time`` of :class:`iosim.simulate_cpu.CpuResult` (:class:`iosim.timing.cpu.CpuTime`).

A GPU kernel model runs under :class:`Conditions` (the problem, the kernel description, the profile and its rates,
the latency of one dependent load) on what the simulator counted, a :class:`Workload`.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..counts import Counts
from ..hardware.gpu import Profile
from ..problem import AttentionProblem
from ..schedules import Tiles
from .kernels import KernelDesc
from .rates import Rates


@dataclass
class KernelTime:
    """One kernel's predicted time (a CPU call is one kernel): ``resources`` are the parts in seconds that the
    prediction is made of (per resource for the roofline, per phase or step for the kernel models), ``bound`` names
    the one that limits it, ``grid`` is its thread blocks (a CPU's: its threads) and ``utilization`` the share of the
    chip's block slots they keep busy. What the energy model prices beside the counts: ``smem_bytes``, the bytes
    the model moves through shared memory (tiles landed, operands read into registers by ldmatrix, tiles staged; 0
    where it has none: wgmma reads its operands itself, and its energy per FLOP includes them), and
    ``tensor_flops`` and ``l2_bytes``, the FLOPs its tensor cores run and the bytes it moves between the SMs and
    L2, where the kernel runs other than the counts (None: the counts')."""

    name: str
    grid: int
    utilization: float
    resources: dict[str, float]  # seconds at full-chip rate, per resource
    predicted_s: float
    bound: str
    smem_bytes: float = 0.0
    tensor_flops: float | None = None
    l2_bytes: float | None = None

    @classmethod
    def of(cls, name: str, grid: int, seconds: float, parts: dict, smem_bytes: float = 0.0,
           tensor_flops: float | None = None, l2_bytes: float | None = None) -> KernelTime:
        """A kernel model's ``parts`` as a KernelTime: ``utilization`` and ``bound`` are taken out, the other parts
        in seconds (floats) become ``resources``; counts among them (resident blocks, rounds, splits) are not kept."""
        parts = dict(parts)
        utilization = parts.pop("utilization")
        return cls(name, grid, utilization, {k: float(v) for k, v in parts.items() if isinstance(v, float)}, seconds,
                   parts["bound"], float(smem_bytes), tensor_flops, l2_bytes)


@dataclass(frozen=True)
class Uncertainty:
    """How far the time model missed on recorded kernels like this one (:mod:`iosim.timing.uncertainty`): the
    prediction times the 10th and 90th percentiles of measured ÷ predicted over the ``rows`` rows of ``group``
    in the time records of ``device``; ``low_s``/``high_s`` None and ``group`` "no record" where none apply."""

    low_s: float | None
    high_s: float | None
    group: str  # "<kernel>, <regime>", "<kernel>, all regimes" (too few rows in the regime) or "no record"
    rows: int
    device: str  # the record's profile, "pooled: <profiles>" (the profile has no record of its own), or ""


@dataclass(frozen=True)
class ClockRun:
    """The clocks of a prediction: ``start_hz`` before the limiter acts, ``fast_hz`` from ``engage_s`` on,
    ``steady_hz`` from ``settle_s`` on (None: the call never draws the limit on average), ``shares`` the share of
    the calls ``run`` means at each of the three, ``watts`` the call's power at ``start_hz`` and ``joules`` the energy
    of the call ``run`` means."""

    run: str  # iosim.timing.clock's run: "record", "single", "steady" or "<seconds> s"
    start_hz: float
    fast_hz: float
    steady_hz: float
    engage_s: float
    settle_s: float | None
    shares: tuple[float, float, float]
    watts: float
    joules: float


@dataclass
class TimeEstimate:
    kernels: list[KernelTime]
    unmodeled: dict[str, str]  # resource -> the profile field that is not published
    roofline_s: float | None = None  # the ideal peak bound (iosim.timing.roofline), beside a kernel model's
    kernel: str = "roofline"  # whose launch and pipeline the estimate assumes (iosim.timing.kernels)
    calibration: str = "uncalibrated"  # the rates' origin: "measured on ..." or "uncalibrated" (datasheet peaks)
    dram_free: bool = False  # warm calls whose inputs stay in L2: the estimate prices no DRAM bytes (iosim.timing)
    uncertainty: Uncertainty | None = None  # the records' band around predicted_s (iosim.timing.uncertainty)
    energy_j: float | None = None  # joules of one call, where the profile has a power calibration (timing.energy)
    clock: ClockRun | None = None  # the clocks the call runs at (iosim.timing.clock), where the profile measured them

    @property
    def predicted_s(self) -> float:
        return sum(k.predicted_s for k in self.kernels)

    @property
    def bound(self) -> str:
        """The bound of the kernel that takes longest."""
        return max(self.kernels, key=lambda k: k.predicted_s).bound if self.kernels else "none"


@dataclass(frozen=True)
class Workload:
    """What the simulator counted, for the time model: ``schedule`` run as ``pass_`` ("forward", "backward" or
    "both") on ``problem`` with ``tiles``, each kernel's ``counts``, and ``hbm[k]`` = (DRAM read, DRAM write) bytes
    of kernel k (the L2 model's, or the global bytes without it); ``value_dim``: values per head where they are
    not ``problem.head_dim`` wide (MLA prefill's keys of 192 and values of 128, :mod:`iosim.timing.mla`; None: the
    same), which only the fa3 family's model takes."""

    schedule: str
    pass_: str
    problem: AttentionProblem
    tiles: Tiles
    counts: Counts
    hbm: list[tuple[float, float]]
    value_dim: int | None = None


@dataclass(frozen=True)
class Conditions:
    """What a GPU kernel model predicts under: the ``problem``, the kernel description ``desc``, the ``profile`` and
    the ``rates`` of :mod:`iosim.timing.rates` on it, and ``latency``, one dependent load's (L2's where the inputs
    stay in L2 between warm calls, else DRAM's)."""

    problem: AttentionProblem
    desc: KernelDesc
    profile: Profile
    rates: Rates
    latency: float = 0.0
