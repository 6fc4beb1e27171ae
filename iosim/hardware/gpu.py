"""Hardware profiles: a GPU as iosim sees it (memory levels outermost first, SM count and clock, dense peak rates
per dtype, the exp rate, and the optional measured ``calibration`` section of :mod:`iosim.hardware.calibration`), every
number a sourced value (:mod:`iosim.hardware.sourced`), and the loading of built-ins and YAML/JSON files, with errors that
name the file and the field.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, model_validator

from ..yaml_io import read_data, validated
from .calibration import Calibration
from .sourced import (
    SourcedBandwidth,
    SourcedByteCount,
    SourcedBytes,
    SourcedCount,
    SourcedFlops,
    SourcedHz,
    SourcedOps,
    SourcedRatio,
    _Strict,
)

SCHEMA_VERSION = 1
DEFAULT_PROFILE = "h100-sxm5-80gb"
PROFILES_DIR = Path(__file__).resolve().parent / "profiles"


class ProfileError(ValueError):
    """A profile could not be found, read or validated; the message names the file and the field."""


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

    @model_validator(mode="after")
    def _block_within_sm(self):
        block, sm = self.per_block.value, self.per_sm.value
        if block is not None and sm is not None and block > sm:
            raise ValueError(f"per_block = {block:,} B is more than per_sm = {sm:,} B: one thread block cannot "
                             "use more shared memory than its SM has")
        return self


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


def profile_from_dict(data: dict, where: str = "<dict>") -> Profile:
    return validated(Profile, data, where, ProfileError, "profile")


def read_profile_data(path: str | Path, kind: str = "profile"):
    """The contents of a YAML (``.yaml``/``.yml``, loaded safely) or JSON (``.json``) profile file."""
    path = Path(path)
    if not path.is_file():
        raise ProfileError(f"{path}: no such {kind} file")
    return read_data(path, ProfileError)


def load_profile_file(path: str | Path) -> Profile:
    """Load a profile from a YAML (``.yaml``/``.yml``) or JSON (``.json``) file. YAML is loaded safely."""
    return profile_from_dict(read_profile_data(path), str(path))


def builtin_profile_names() -> list[str]:
    return sorted(p.stem for p in PROFILES_DIR.glob("*.yaml"))


@cache
def _builtin(name: str) -> Profile:
    return load_profile_file(PROFILES_DIR / f"{name}.yaml")


def profiles_fitting(device: str) -> list[str]:
    """The built-in profiles whose display names share the most model tokens (H100, SXM5, 80GB ...: the tokens with
    a digit) with a CUDA device name; empty where none shares one. One name: the profile of that GPU."""
    have = set(re.findall(r"[a-z0-9]+", device.lower()))
    score = {}
    for name in builtin_profile_names():
        toks = {t for t in re.findall(r"[a-z0-9]+", get_profile(name).display_name.lower()) if re.search(r"\d", t)}
        score[name] = len(toks & have)
    best = max(score.values(), default=0)
    return [n for n, s in score.items() if s == best] if best else []


def get_profile(name_or_path: str | Path | Profile | None = None) -> Profile:
    """A built-in profile by name (default ``h100-sxm5-80gb``), a profile file path, or a Profile as is."""
    if isinstance(name_or_path, Profile):
        return name_or_path
    if name_or_path is None:
        name_or_path = DEFAULT_PROFILE
    s = str(name_or_path)
    if not s.strip():  # Path("") is ".", which exists: say what is wrong
        raise ProfileError(f"profile={s!r}: the name is empty; expected a built-in name "
                           f"({', '.join(builtin_profile_names())}) or the path of a .yaml/.json profile file")
    if s in builtin_profile_names():
        return _builtin(s)
    p = Path(s)
    if p.suffix in (".yaml", ".yml", ".json") or p.exists():
        return load_profile_file(p)
    raise ProfileError(
        f"unknown profile {s!r}: expected a built-in name ({', '.join(builtin_profile_names())}) "
        "or the path of a .yaml/.json profile file"
    )
