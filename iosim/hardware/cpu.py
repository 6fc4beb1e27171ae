"""CPU profiles: pydantic models, loadable from YAML or JSON, every number a ``{value, source}`` pair.

A CPU profile lists the cores and clock, the data caches innermost first (L1d, L2, L3: size of one instance,
line size, how many cores share an instance), DRAM (bandwidth of all cores and of one core), peak FLOP rates
and, where ``iosim profiles detect`` measured them, the rates the CPU time model uses: BLAS GEMM rates for the
shapes attention issues, the tiled kernel's softmax rate, NumPy's exp rate and the first-touch rates of fresh
memory (recycled from a recent free, and cold). ``value: null`` says a number is not published or not measured; what needs it fails naming the field.

Built-ins live in ``iosim/hardware/profiles/cpu/*.yaml`` (GPU profiles are ``iosim/hardware/profiles/*.yaml``). Quantities are
written as people write them (``1MiB``, ``460.8 GB/s``, ``3.7 GHz``). Unknown keys are rejected everywhere.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..yaml_io import DataFileError, read_data, validated
from .gpu import ProfileError, read_profile_data
from .sourced import SourcedBandwidth, SourcedBytes, SourcedCount, SourcedFlops, SourcedHz, SourcedOps

CPU_PROFILES_DIR = Path(__file__).resolve().parent / "profiles" / "cpu"
_LEVELS = ["l1d", "l2", "l3"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class CacheLevel(_Strict):
    """One data-cache level. ``capacity`` is one instance; ``shared_by`` cores share that instance."""

    level: Literal["l1d", "l2", "l3"]
    capacity: SourcedBytes = Field(description="bytes of one instance")
    line_size: SourcedBytes = Field(description="cache line, bytes")
    shared_by: SourcedCount = Field(description="cores that share one instance (1 = private)")
    bandwidth: SourcedBandwidth | None = Field(default=None, description="per core, bytes/s (optional)")


class Dram(_Strict):
    capacity: SourcedBytes = Field(description="installed memory (null for a chip sold without it)")
    bandwidth: SourcedBandwidth = Field(description="all cores streaming, bytes/s")
    bandwidth_one_core: SourcedBandwidth | None = Field(
        default=None, description="one core streaming (NumPy's elementwise passes run on one core), bytes/s")
    first_touch: SourcedBandwidth | None = Field(
        default=None, description="bytes/s of the first write to freshly mapped memory beyond a rewrite's cost "
        "(page faults, zeroing), on memory the OS recycled from a recent free: the steady state of repeated calls")
    first_touch_cold: SourcedBandwidth | None = Field(
        default=None, description="the same on memory idle for seconds: on a VM that backs guest memory lazily "
        "(free page reporting), the hypervisor maps it again; a program's first call meets this rate")


class GemmRate(_Strict):
    """A measured GEMM rate for one of the shapes attention issues (FLOP = 2 m n k)."""

    kind: Literal["qk", "pv", "tile"] = Field(
        description="qk: NumPy (M, d) @ (d, M), BLAS threads; pv: NumPy (M, M) @ (M, d); tile: the tiled "
        "kernel's two GEMMs per (Br, Bc) tile, one BLAS thread per core, all cores")
    head_dim: int = Field(ge=1)
    value: float = Field(gt=0, description="FLOP/s")
    source: str = Field(min_length=1)


class CpuCompute(_Strict):
    fp32: SourcedFlops = Field(description="peak fp32, all cores: cores x clock x FLOP/cycle")
    fp64: SourcedFlops
    gemm: list[GemmRate] = Field(default_factory=list, description="measured GEMM rates (detect)")
    softmax_fp32: SourcedOps | None = Field(
        default=None, description="the tiled kernel's online-softmax elements/s on cache-resident tiles, all cores")
    numpy_exp_fp32: SourcedOps | None = Field(default=None, description="NumPy exp elements/s, one core, in cache")


class CpuProfile(_Strict):
    """A CPU (one socket) as iosim sees it."""

    schema_version: Literal[1] = 1
    kind: Literal["cpu"] = "cpu"
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9.\-]*$", description="lower-case id, e.g. amd-epyc-9654")
    display_name: str
    vendor: str
    notes: str = ""
    cores: SourcedCount = Field(description="physical cores the kernels run on")
    threads_per_core: SourcedCount
    clock: SourcedHz = Field(description="the clock the peak FLOP rates assume")
    caches: list[CacheLevel] = Field(min_length=3, max_length=3, description="innermost first: l1d, l2, l3")
    dram: Dram
    compute: CpuCompute

    @model_validator(mode="after")
    def _levels_in_order(self):
        got = [c.level for c in self.caches]
        if got != _LEVELS:
            raise ValueError(f"caches must be listed innermost first as {_LEVELS}, got {got}")
        return self

    def cache(self, level: str) -> CacheLevel:
        return self.caches[_LEVELS.index(level)]

    def require(self, dotted: str) -> float:
        """The value at ``dotted`` (``'dram.bandwidth'``, ``'l2.capacity'``), or a ProfileError naming it."""
        parts = dotted.split(".")
        obj = self.cache(parts[0]) if parts[0] in _LEVELS else getattr(self, parts[0])
        for part in parts[1:]:
            obj = getattr(obj, part, None)
        if obj is None or obj.value is None:
            src = getattr(obj, "source", "absent from the profile")
            raise ProfileError(f"CPU profile {self.name!r}: {dotted} is not known ({src}); it is needed here; "
                               "`iosim profiles detect` measures this machine's")
        return obj.value

    def gemm_rate(self, kind: str, head_dim: int) -> GemmRate:
        """The measured ``kind`` GEMM rate at the nearest measured head dim (ProfileError where none is)."""
        rates = [g for g in self.compute.gemm if g.kind == kind]
        if not rates:
            raise ProfileError(f"CPU profile {self.name!r}: compute.gemm has no {kind!r} rate; the time model "
                               "needs it; `iosim profiles detect` measures it")
        return min(rates, key=lambda g: (abs(g.head_dim - head_dim), g.head_dim))


# -- loading ---------------------------------------------------------------------------------------------


def cpu_profile_from_dict(data: dict, where: str = "<dict>") -> CpuProfile:
    return validated(CpuProfile, data, where, ProfileError, "CPU profile")


def load_cpu_profile_file(path: str | Path) -> CpuProfile:
    """Load a CPU profile from YAML (``.yaml``/``.yml``, loaded safely) or JSON."""
    return cpu_profile_from_dict(read_profile_data(path, "CPU profile"), str(path))


def is_cpu_profile_file(path: str | Path) -> bool:
    """True when ``path`` is a YAML/JSON mapping with ``kind: cpu`` (how ``--profile`` tells CPU from GPU)."""
    try:
        data = read_data(path)
    except (OSError, DataFileError):  # not a CPU profile here; reading it as a GPU profile words the error
        return False
    return isinstance(data, dict) and data.get("kind") == "cpu"


def builtin_cpu_profile_names() -> list[str]:
    return sorted(p.stem for p in CPU_PROFILES_DIR.glob("*.yaml"))


@cache
def _builtin(name: str) -> CpuProfile:
    return load_cpu_profile_file(CPU_PROFILES_DIR / f"{name}.yaml")


def get_cpu_profile(name_or_path: str | Path | CpuProfile) -> CpuProfile:
    """A built-in CPU profile by name, a CPU profile file path, or a CpuProfile as is."""
    if isinstance(name_or_path, CpuProfile):
        return name_or_path
    s = str(name_or_path)
    if not s.strip():  # Path("") is ".", which exists: say what is wrong
        raise ProfileError(f"profile={s!r}: the name is empty; expected a built-in CPU profile name "
                           f"({', '.join(builtin_cpu_profile_names())}) or the path of a .yaml/.json profile file")
    if s in builtin_cpu_profile_names():
        return _builtin(s)
    p = Path(s)
    if p.suffix in (".yaml", ".yml", ".json") or p.exists():
        return load_cpu_profile_file(p)
    raise ProfileError(f"unknown CPU profile {s!r}: expected a built-in name "
                       f"({', '.join(builtin_cpu_profile_names())}) or the path of a .yaml/.json profile file")


def is_cpu_profile(name_or_path: str | Path | CpuProfile | object) -> bool:
    """True for a CpuProfile, a built-in CPU profile name, or a file with ``kind: cpu``."""
    if isinstance(name_or_path, CpuProfile):
        return True
    if not isinstance(name_or_path, (str, Path)):
        return False
    s = str(name_or_path)
    return s in builtin_cpu_profile_names() or (Path(s).is_file() and is_cpu_profile_file(s))
