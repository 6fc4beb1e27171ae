"""Hardware profiles: pydantic models, loadable from YAML or JSON, every number with its source (longer than
400 lines: the optional calibration section, measured by ``iosim calibrate rates``, is made of the same types).

A profile lists memory levels outermost first (DRAM/HBM, L2, shared memory, registers), the SM count and
clock, dense peak rates per dtype for the tensor cores and for plain fp32, and the special-function (exp)
rate. Every number is a ``{value, source}`` pair; ``value: null`` says the number is not published (the
source then says so), and anything that needs it fails with a message naming the field.

Quantities are written as people write them: ``80GB``, ``50MiB``, ``3.35 TB/s``, ``228KiB``,
``989.4 TFLOP/s``, ``1.98 GHz``. Unknown keys are rejected everywhere.
"""

from __future__ import annotations

import datetime
import json
import math
import re
from decimal import Decimal
from functools import cache
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, model_validator

from .units import UnitError, parse_quantity

SCHEMA_VERSION = 1
DEFAULT_PROFILE = "h100-sxm5-80gb"
PROFILES_DIR = Path(__file__).resolve().parent / "profiles"


class ProfileError(ValueError):
    """A profile could not be found, read or validated; the message names the file and the field."""


def _positive(x: float, family: str, given) -> float:
    """A size or a rate of 0 (or less) is never right: every model divides by it or fits tiles into it."""
    if x <= 0:
        raise ValueError(f"{given!r} is not a positive quantity in {family}: a rate or a size must be > 0 "
                         "(write `value: null` and say so in the source if the number is not published)")
    return x


def _unit(family: str):
    def convert(v):
        if v is None:
            return None
        try:
            return _positive(parse_quantity(v, family), family, v)
        except UnitError as exc:
            raise ValueError(str(exc)) from None

    return BeforeValidator(convert)


def _whole_bytes(v, *, positive: bool):
    if v is None:
        return None
    try:
        x = parse_quantity(v, "bytes")
    except UnitError as exc:
        raise ValueError(str(exc)) from None
    if x != int(x):
        raise ValueError(f"{v!r} is not a whole number of bytes")
    return int(_positive(x, "bytes", v) if positive else x)


def _int_bytes(v):
    return _whole_bytes(v, positive=True)


def _int_bytes_or_zero(v):
    return _whole_bytes(v, positive=False)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SourcedBytes(_Strict):
    """A size in bytes (``value`` accepts '50MiB'), with where the number comes from."""

    value: Annotated[int | None, BeforeValidator(_int_bytes)] = Field(
        description="bytes; null = not published"
    )
    source: str = Field(min_length=1, description="datasheet, paper, or 'measured on ... with ...'")


class SourcedByteCount(_Strict):
    """A number of bytes that may be 0 (dirty lines in L2 at a kernel's start)."""

    value: Annotated[int | None, BeforeValidator(_int_bytes_or_zero)] = Field(description="bytes, >= 0")
    source: str = Field(min_length=1)


class SourcedBandwidth(_Strict):
    value: Annotated[float | None, _unit("bytes/s")] = Field(description="bytes per second")
    source: str = Field(min_length=1)


class SourcedFlops(_Strict):
    value: Annotated[float | None, _unit("flop/s")] = Field(
        description="floating-point operations per second"
    )
    source: str = Field(min_length=1)


class SourcedOps(_Strict):
    value: Annotated[float | None, _unit("op/s")] = Field(description="operations (results) per second")
    source: str = Field(min_length=1)


class SourcedHz(_Strict):
    value: Annotated[float | None, _unit("Hz")] = Field(description="cycles per second")
    source: str = Field(min_length=1)


class SourcedCount(_Strict):
    value: int | None = Field(ge=1, description="a count; null = not published")
    source: str = Field(min_length=1)


class SourcedRatio(_Strict):
    value: float | None = Field(gt=0, le=1, description="a ratio in (0, 1]; null = not measured")
    source: str = Field(min_length=1)


class DRAM(_Strict):
    """Device memory (HBM or GDDR): the outermost level."""

    level: Literal["dram"]
    name: str = Field(default="DRAM", description="HBM3, HBM3e, GDDR6X ...")
    capacity: SourcedBytes
    bandwidth: SourcedBandwidth


class L2Room(_Strict):
    """L2 bytes one byte of each kind takes in the L2 model (measured with probes; 1 = a plain LRU)."""

    private: float = Field(gt=0, description="a clean line read by the SMs of one half of the chip")
    shared: float = Field(gt=0, description="a clean line read by SMs of both halves")
    dirty: float = Field(gt=0, description="a line written during the kernel, not yet written back")
    source: str = Field(min_length=1)


class L2(_Strict):
    level: Literal["l2"]
    capacity: SourcedBytes
    bandwidth: SourcedBandwidth
    line_size: SourcedBytes = Field(description="cache line (tag granularity), bytes")
    sector_size: SourcedBytes = Field(description="sector (fill granularity), bytes")
    room: L2Room | None = Field(default=None, description="the L2 model's room per byte of each kind")
    dirty_at_start: SourcedByteCount | None = Field(
        default=None, description="dirty bytes in L2 when a profiled kernel starts (the L2 model's)"
    )


class SharedMemory(_Strict):
    """On-chip SRAM that a thread block addresses (shared memory / LDS)."""

    level: Literal["smem"]
    per_sm: SourcedBytes
    per_block: SourcedBytes = Field(description="the most one thread block may use (opt-in maximum)")
    bandwidth: SourcedBandwidth | None = Field(default=None, description="aggregate over the chip")


class Registers(_Strict):
    level: Literal["registers"]
    per_sm: SourcedBytes


MemoryLevel = Annotated[DRAM | L2 | SharedMemory | Registers, Field(discriminator="level")]
_ORDER = ["dram", "l2", "smem", "registers"]


class TensorRates(_Strict):
    """Dense (no sparsity) tensor-core peak per input dtype."""

    fp16: SourcedFlops
    bf16: SourcedFlops
    fp8: SourcedFlops | None = None
    tf32: SourcedFlops | None = None


class Compute(_Strict):
    tensor: TensorRates
    fp32: SourcedFlops = Field(description="plain (non-tensor) fp32, FMA counted as 2 FLOPs")
    exp: SourcedOps = Field(description="special-function unit: exp2 results per second over the chip")


class SMLimits(_Strict):
    """Per-SM residency limits, used to count thread blocks that run at once."""

    max_threads: SourcedCount
    max_blocks: SourcedCount
    block_share: SourcedRatio | None = Field(
        default=None,
        description="issue share of a resident thread block relative to the next older one on its SM (the L2 "
        "model's block drift; 1 or absent = all resident blocks progress alike)",
    )


# -- calibration: what code reaches on one GPU, measured by `iosim calibrate rates` (docs/profiles.md) --------------

_TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}


def _seconds(v):
    """A time: a number of seconds, or a string such as '2.5 us' (s, ms, us, ns)."""
    if isinstance(v, str):
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*(s|ms|us|µs|ns)?\s*", v)
        if m is None:
            raise ValueError(f"{v!r} is not a time such as '2.5 us' (a number of seconds, or units s, ms, us, ns)")
        v = float(Decimal(m.group(1)) * Decimal(str(_TIME_UNITS[m.group(2) or "s"])))  # exact, then one rounding
    elif isinstance(v, bool) or not isinstance(v, (int, float)):
        return v  # None is a null value; anything else fails the float check with pydantic's message
    if not math.isfinite(v):
        raise ValueError(f"{v!r} is not a finite time")
    return _positive(float(v), "seconds", v)


class SourcedSeconds(_Strict):
    value: Annotated[float | None, BeforeValidator(_seconds)] = Field(description="seconds ('2.5 us' accepted)")
    source: str = Field(min_length=1)


class SourcedCycles(_Strict):
    value: float | None = Field(gt=0, description="SM clock cycles")
    source: str = Field(min_length=1)


class SourcedFlopsTable(_Strict):
    """FLOP/s over the chip by a count per SM (resident warps, or warpgroups)."""

    value: dict[Annotated[int, Field(ge=1)], Annotated[float, _unit("flop/s")]] = Field(min_length=1)
    source: str = Field(min_length=1)


class MmaSync(_Strict):
    """mma.sync m16n8k16, fp32 accumulate, one dtype."""

    throughput: SourcedFlopsTable = Field(description="by resident warps per SM (one block per SM), each warp "
                                          "issuing 8 independent accumulators")
    latency: SourcedCycles = Field(description="one mma in a dependent chain (one warp)")


class MmaSyncRates(_Strict):
    fp16: MmaSync
    bf16: MmaSync


class WgmmaRates(_Strict):
    """wgmma m64nNk16, A and B from shared memory, fp32 accumulate, by warpgroups per SM (one block per SM)."""

    n128: SourcedFlopsTable
    n256: SourcedFlopsTable


class Wgmma(_Strict):
    fp16: WgmmaRates
    bf16: WgmmaRates


class ExpRates(_Strict):
    throughput: SourcedOps = Field(description="ex2.approx results per second over the chip (MUFU)")
    latency: SourcedCycles = Field(description="one ex2 in a dependent chain")


class Fp32Rates(_Strict):
    fma: SourcedFlops = Field(description="fp32 FMA, counted as 2 FLOPs")
    add: SourcedFlops = Field(description="fp32 add")
    max: SourcedOps = Field(description="fp32 max (FMNMX) results per second")


class SmemRates(_Strict):
    ldmatrix: SourcedBandwidth = Field(description="ldmatrix.x4 bytes per second over the chip")
    ld128: SourcedBandwidth = Field(description="128-bit ld.shared bytes per second over the chip")


class ReadWrite(_Strict):
    read: SourcedBandwidth
    write: SourcedBandwidth


class DramRates(ReadWrite):
    read_write: SourcedBandwidth = Field(description="bytes read + bytes written per second, copying one buffer "
                                         "to another")


class LaunchCosts(_Strict):
    interval: SourcedSeconds = Field(description="back-to-back empty kernels on one stream, queued ahead")
    host_interval: SourcedSeconds = Field(description="the same, launched one by one from Python (CuPy)")
    per_block: SourcedSeconds = Field(description="each further tiny thread block, per block per SM")


class MemoryLatency(_Strict):
    """One load in a dependent chain (pointer chase, one thread, ld.global.cg): seconds, not SM cycles, since L2
    and DRAM run on clocks of their own; the cycles are in the source."""

    l2: SourcedSeconds = Field(description="a load that hits L2 (a 4 MiB buffer, warm)")
    dram: SourcedSeconds = Field(description="a load that misses L2 (random lines of a 1 GiB buffer, each once)")


class MeasuredOn(_Strict):
    device: str = Field(min_length=1)
    driver: str = Field(min_length=1)
    cuda: str = Field(min_length=1)
    date: datetime.date
    commit: str = Field(min_length=1)
    command: str = Field(min_length=1)


class Calibration(_Strict):
    """Rates code reaches on one GPU, chip-wide unless a field says: ``iosim calibrate rates`` measures them."""

    measured_on: MeasuredOn
    sm_clock: SourcedHz = Field(description="SM clock under load (clock64 over %globaltimer)")
    mma_sync: MmaSyncRates
    wgmma: Wgmma | None = Field(default=None, description="Hopper (sm_90a) only; null elsewhere")
    exp: ExpRates
    fp32: Fp32Rates
    smem: SmemRates
    l2: ReadWrite
    dram: DramRates
    launch: LaunchCosts
    latency: MemoryLatency | None = Field(default=None, description="memory latency of one dependent load; absent "
                                          "in files calibrated before it was measured (iosim calibrate rates writes it)")


class Profile(_Strict):
    """A GPU (or accelerator) as iosim sees it."""

    schema_version: Literal[1] = 1
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9.\-]*$", description="lower-case id, e.g. h100-sxm5-80gb")
    display_name: str
    vendor: str
    notes: str = ""
    architecture: str | None = Field(
        default=None,
        description="hopper, ampere, ada, blackwell, cdna3 ...: a model written for one architecture (flash3's "
        "Hopper pipeline) warns on another; absent: read from display_name (H100, H200, H800, H20, GH200 = hopper)",
    )
    sm_count: SourcedCount
    clock: SourcedHz = Field(description="boost clock the peak rates assume")
    memory: list[MemoryLevel] = Field(min_length=4, max_length=4, description="outermost first")
    sm: SMLimits
    compute: Compute
    calibration: Calibration | None = Field(default=None, description="measured rates; absent = uncalibrated")

    @model_validator(mode="after")
    def _levels_in_order(self):
        got = [m.level for m in self.memory]
        if got != _ORDER:
            raise ValueError(f"memory levels must be listed outermost first as {_ORDER}, got {got}")
        return self

    # -- accessors -----------------------------------------------------------------------------------
    @property
    def dram(self) -> DRAM:
        return self.memory[0]  # type: ignore[return-value]

    @property
    def l2(self) -> L2:
        return self.memory[1]  # type: ignore[return-value]

    @property
    def smem(self) -> SharedMemory:
        return self.memory[2]  # type: ignore[return-value]

    @property
    def registers(self) -> Registers:
        return self.memory[3]  # type: ignore[return-value]

    def require(self, dotted: str) -> float:
        """The value at ``dotted`` (e.g. ``'l2.bandwidth'``), or a ProfileError saying it is not published."""
        obj = self
        for part in dotted.split("."):
            obj = (
                getattr(obj, part) if part not in ("dram", "l2", "smem", "registers") else getattr(self, part)
            )
        if obj is None or obj.value is None:
            src = getattr(obj, "source", "absent from the profile")
            raise ProfileError(f"profile {self.name!r}: {dotted} is not known ({src}); it is needed here")
        return obj.value

    def is_hopper(self) -> bool:
        """Whether this is a Hopper GPU (sm_90: wgmma, TMA), the GPU FlashAttention-3's time model describes."""
        if self.architecture is not None:
            return self.architecture.strip().lower() == "hopper"
        return re.search(r"\bG?H(100|200|800|20)\b", self.display_name) is not None

    def l2_room(self) -> tuple[float, float, float]:
        """``l2.room`` as (private, shared, dirty); (1, 1, 1) where the profile does not give it."""
        r = self.l2.room
        return (1.0, 1.0, 1.0) if r is None else (r.private, r.shared, r.dirty)

    def l2_dirty_at_start(self) -> int:
        d = self.l2.dirty_at_start
        return 0 if d is None or d.value is None else int(d.value)

    def block_share(self) -> float:
        """``sm.block_share`` (the L2 model's block drift), 1.0 where the profile does not give it."""
        bs = self.sm.block_share if self.sm else None
        return 1.0 if bs is None or bs.value is None else float(bs.value)

    def calibration_label(self) -> str:
        """Where the calibration section was measured ("measured on <device>, driver ..., <date>, commit ..."), or
        "uncalibrated" (datasheet numbers only)."""
        c = self.calibration
        if c is None:
            return "uncalibrated"
        m = c.measured_on
        return f"measured on {m.device}, driver {m.driver}, CUDA {m.cuda}, {m.date.isoformat()}, commit {m.commit}"

    def measured(self, dotted: str):
        """The measured value at ``dotted`` in the calibration section (``'dram.read'``, ``'mma_sync.bf16.throughput'``
        a dict by warps per SM), or None where the profile is uncalibrated or the value is null."""
        obj = self.calibration
        for part in dotted.split("."):
            if obj is None:
                return None
            obj = getattr(obj, part)
        return None if obj is None else obj.value

    def matmul_rate(self, dtype: str) -> float:
        """Tensor-core FLOP/s for ``dtype`` operands (fp32 problems use the plain fp32 rate: no TF32)."""
        if dtype == "fp32":
            return self.require("compute.fp32")
        return self.require(f"compute.tensor.{dtype}")


# -- loading ---------------------------------------------------------------------------------------------


def format_validation(err: ValidationError, where: str, kind: str = "profile") -> str:
    """One line per bad field: its path, the value given, what is wrong (pydantic's words, or ours)."""
    lines = [f"{where}: invalid {kind}"]
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"]) or "(top level)"
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown key (remove it or check its spelling)"
        elif e["type"] == "missing":
            msg = "required field is missing"
        elif "input" in e and not isinstance(e["input"], (dict, list)) and repr(e["input"]) not in msg:
            msg = f"{e['input']!r}: {msg}"  # the value given, where the message does not already say it
        lines.append(f"  {loc}: {msg}")
    return "\n".join(lines)


def profile_from_dict(data: dict, where: str = "<dict>") -> Profile:
    if not isinstance(data, dict):
        raise ProfileError(f"{where}: a profile must be a mapping, got {type(data).__name__}")
    try:
        return Profile.model_validate(data)
    except ValidationError as err:
        raise ProfileError(format_validation(err, where)) from None


def read_profile_data(path: str | Path, kind: str = "profile"):
    """The contents of a YAML (``.yaml``/``.yml``, loaded safely) or JSON (``.json``) profile file."""
    path = Path(path)
    if not path.is_file():
        raise ProfileError(f"{path}: no such {kind} file")
    text = path.read_text()
    try:
        return json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (yaml.YAMLError, json.JSONDecodeError) as exc:
        raise ProfileError(f"{path}: not valid {'JSON' if path.suffix == '.json' else 'YAML'}: {exc}") from None


def load_profile_file(path: str | Path) -> Profile:
    """Load a profile from a YAML (``.yaml``/``.yml``) or JSON (``.json``) file. YAML is loaded safely."""
    return profile_from_dict(read_profile_data(path), str(path))


def builtin_profile_names() -> list[str]:
    return sorted(p.stem for p in PROFILES_DIR.glob("*.yaml"))


@cache
def _builtin(name: str) -> Profile:
    return load_profile_file(PROFILES_DIR / f"{name}.yaml")


def get_profile(name_or_path: str | Path | Profile | None = None) -> Profile:
    """A built-in profile by name (default ``h100-sxm5-80gb``), a profile file path, or a Profile as is."""
    if isinstance(name_or_path, Profile):
        return name_or_path
    if name_or_path is None:
        name_or_path = DEFAULT_PROFILE
    s = str(name_or_path)
    if s in builtin_profile_names():
        return _builtin(s)
    p = Path(s)
    if p.suffix in (".yaml", ".yml", ".json") or p.exists():
        return load_profile_file(p)
    raise ProfileError(
        f"unknown profile {s!r}: expected a built-in name ({', '.join(builtin_profile_names())}) "
        "or the path of a .yaml/.json profile file"
    )
