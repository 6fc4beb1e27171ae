"""The scenario file format: pydantic models, every field validated and unknown keys rejected.

A sweep value is written one of four ways, and the fields of one ``problems`` entry are crossed (a product):

    seq_len: 4096                                  one value
    seq_len: [1024, 2048, 4096]                    a list
    seq_len: {start: 64, stop: 512, step: 64}      a linear range, stop included
    seq_len: {start: 128, stop: 1048576, factor: 2}   a geometric range, stop included
"""

from __future__ import annotations

import itertools
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    field_validator,
    model_validator,
)

from ..problem import DType
from ..schedules import SCHEDULES
from ..units import UnitError, parse_quantity

SCHEMA_VERSION = 1


class ScenarioError(ValueError):
    """A scenario file is invalid or cannot run; the message names the file, the field and the fix."""


# -- sweep values ----------------------------------------------------------------------------------------


def _expand_sweep(v: Any) -> list:
    """One value, a list, {start, stop, step} or {start, stop, factor} -> the list of values."""
    if isinstance(v, list):
        if not v:
            raise ValueError("an empty list sweeps nothing: give at least one value")
        return v
    if isinstance(v, dict):
        keys = set(v)
        if keys == {"start", "stop", "step"}:
            start, stop, step = v["start"], v["stop"], v["step"]
            if not all(isinstance(x, int) and not isinstance(x, bool) for x in (start, stop, step)) or step <= 0:
                raise ValueError("a linear range {start, stop, step} takes integers with step > 0")
            if stop < start:
                raise ValueError(f"range stop={stop} is below start={start}")
            return list(range(start, stop + 1, step))
        if keys == {"start", "stop", "factor"}:
            start, stop, factor = v["start"], v["stop"], v["factor"]
            if not (isinstance(start, int) and isinstance(stop, int)) or start < 1:
                raise ValueError("a geometric range {start, stop, factor} takes integers start >= 1 and stop")
            if not isinstance(factor, (int, float)) or factor <= 1:
                raise ValueError(f"factor={factor!r}: a geometric range needs a factor > 1")
            if stop < start:
                raise ValueError(f"range stop={stop} is below start={start}")
            out, x = [], float(start)
            while round(x) <= stop:
                if not out or round(x) != out[-1]:
                    out.append(round(x))
                x *= factor
            return out
        raise ValueError(
            f"a sweep mapping has keys {sorted(keys)}: write {{start, stop, step}} (linear) or "
            "{start, stop, factor} (geometric), or a list of values"
        )
    return [v]


def Sweep(item):
    """A field that takes one value, a list or a range, and holds the list of values."""
    return Annotated[list[item], BeforeValidator(_expand_sweep)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


Scalar = int | float | bool | str | None
Where = dict[str, Scalar | list[Scalar]]


class ProblemSweep(_Strict):
    """Attention problems: the product of every field's values (see iosim.AttentionProblem)."""

    batch: Sweep(int) = [1]
    heads: Sweep(int) = [1]
    kv_heads: Sweep(int | None) = Field([None], description="grouped-query key/value heads; null = heads")
    seq_len: Sweep(int) = Field(description="query length N (required)")
    kv_len: Sweep(int | None) = Field([None], description="key/value length; null = seq_len")
    head_dim: Sweep(int) = [128]
    dtype: Sweep(DType) = ["fp16"]
    causal: Sweep(bool) = [False]
    scale: float | None = None

    def expand(self) -> list[dict]:
        keys = ["batch", "heads", "kv_heads", "seq_len", "kv_len", "head_dim", "dtype", "causal"]
        out = []
        for combo in itertools.product(*(getattr(self, k) for k in keys)):
            kw = dict(zip(keys, combo))
            kw["scale"] = self.scale
            out.append(kw)
        return out


class TilesSpec(_Strict):
    """Which tiles each case uses. Give one of: ``block`` (Br = Bc), ``block_q`` and ``block_kv`` (crossed),
    or ``sram_elements`` (M, tiles derived from it: FlashAttention-1 line 1, Bc = ceil(M/4d), Br = min(Bc, d);
    for flash2 the roles swap, Br = ceil(M/4d), Bc = min(Br, d), since its Q block is the one that stays)."""

    block: Sweep(int) | None = None
    block_q: Sweep(int) | None = None
    block_kv: Sweep(int) | None = None
    sram_elements: Sweep(int) | None = Field(None, description="on-chip SRAM size M in elements")
    allow_overfill: bool = Field(
        False, description="count tiles whose working set exceeds the profile's shared memory per thread block "
        "(marked 'fits: false'; their time is for a hypothetical GPU with enough shared memory)")

    @model_validator(mode="after")
    def _one_mode(self):
        modes = [self.block is not None, self.block_q is not None or self.block_kv is not None,
                 self.sram_elements is not None]
        if sum(modes) != 1:
            raise ValueError("give exactly one of: block, (block_q and block_kv), sram_elements")
        if (self.block_q is None) != (self.block_kv is None):
            raise ValueError("block_q and block_kv go together: give both")
        return self

    def expand(self) -> list[dict]:
        if self.block is not None:
            return [{"block_q": b, "block_kv": b, "sram_elements": None} for b in self.block]
        if self.block_q is not None:
            return [{"block_q": q, "block_kv": k, "sram_elements": None}
                    for q, k in itertools.product(self.block_q, self.block_kv)]
        return [{"block_q": None, "block_kv": None, "sram_elements": m} for m in self.sram_elements]


FigureKind = Literal["traffic_vs_n", "time_vs_n", "roofline", "traffic_vs_block", "traffic_vs_sram",
                     "footprint", "by_tensor", "bars", "parity"]
Metric = Literal["global_bytes", "hbm_bytes", "sram_bytes", "predicted_s", "compulsory_bytes", "flops_total",
                 "global_over_compulsory", "hbm_over_compulsory", "energy_j"]


class FigureSpec(_Strict):
    kind: FigureKind
    title: str | None = None
    name: str | None = Field(None, pattern=r"^[a-z0-9][a-z0-9_\-]*$", description="file stem of the figure")
    caption: str = ""
    where: Where = Field(default_factory=dict, description="keep only cases whose fields match")
    boundaries: list[Literal["global", "hbm", "sram"]] = ["global"]
    x: str | None = Field(None, description="bars: the field along the x axis")
    metric: Metric = Field("global_bytes", description="bars: what the bars show")
    compulsory: bool = Field(False, description="add the compulsory traffic (Q, K, V read once, O written once)")
    relative_to: str | None = Field(None, description="time_vs_n: divide each time by this schedule's")
    files: str = Field("docs/validation/*.csv", description="parity: measurement CSV files (glob)")


class TableSpec(_Strict):
    kind: Literal["summary", "by_tensor", "claims", "references", "parity", "measured_time"]
    title: str | None = None
    caption: str = ""
    where: Where = Field(default_factory=dict)
    files: str = Field("docs/validation/*.csv", description="parity: measurement CSV files (glob); measured_time: "
                       "time records (docs/validation/*-time.csv), matched to the cases by profile, shape and kernel")


ClaimQuantity = Literal["global_bytes", "hbm_bytes", "sram_bytes", "compulsory_bytes", "global_over_compulsory",
                        "hbm_over_compulsory", "one_plus_n_over_d", "matrix_bytes", "linear_bytes",
                        "predicted_s"]


class Claim(_Strict):
    """A published number, checked against the simulator: the computed value, rounded to ``digits``
    significant digits in ``units``, must read exactly ``expect``."""

    label: str
    quantity: ClaimQuantity
    where: Where = Field(default_factory=dict, description="selects the case(s); all must give one value")
    units: Literal["decimal", "binary", "ratio", "plain"] = "decimal"
    digits: int = Field(3, ge=1, le=12, description="significant digits")
    expect: str = Field(description="the published text, e.g. '4.43 GB'")
    source: str = ""


class Reference(_Strict):
    """A number from outside the simulator (a paper, a transcription, a measurement), shown beside it."""

    label: str
    value: float | str = Field(description="bytes ('6.6 GB') or seconds")
    unit: Literal["bytes", "seconds"] = "bytes"
    x: float | None = Field(None, description="where it sits on a figure's x axis (block size, N ...)")
    tag: Literal["V", "F", "T", "D", "measured"] = Field(
        description="V verbatim, F read off a figure, T third-party transcription, D derived, measured")
    source: str

    @field_validator("value")
    @classmethod
    def _quantity(cls, v):
        try:
            return parse_quantity(v, "bytes") if isinstance(v, str) else float(v)
        except UnitError as exc:
            raise ValueError(str(exc)) from None


class Scenario(_Strict):
    """One experiment: what to simulate and what to show."""

    schema_version: Literal[1] = Field(description="always 1 for this format")
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_\-]*$", description="id, used for folder and file names")
    title: str
    description: str = ""
    order: int = Field(100, description="position in the default report (lower first)")
    profiles: list[str] = Field(["h100-sxm5-80gb"], min_length=1, description="built-in names or file paths")
    schedules: list[str] = Field(min_length=1)
    pass_: Literal["forward", "backward", "both"] = Field("forward", alias="pass")
    problems: list[ProblemSweep] = Field(min_length=1)
    tiles: Literal["default"] | TilesSpec = "default"
    l2_model: bool = Field(False, description="predict the hbm (DRAM) bytes with iosim's L2 model (simulate()'s "
                           "and iosim simulate's default); otherwise hbm = global, the two-level view, the scenario "
                           "default (sweeps stay fast): the built-in scenarios state which they use")
    kernel: dict[str, str] = Field(default_factory=dict, description="the time model's kernel per schedule "
                                   "(iosim.timing: a built-in name or a YAML file), e.g. {flash2: fa2}; "
                                   "default: each schedule's own")
    warm: bool = Field(False, description="time back-to-back calls on the same inputs (inputs that fit in L2 "
                       "stay there), as the measured time records do")
    tables: list[TableSpec] = Field(default_factory=list)
    figures: list[FigureSpec] = Field(default_factory=list)
    claims: list[Claim] = Field(default_factory=list)
    references: list[Reference] = Field(default_factory=list)
    _where: str = PrivateAttr("<dict>")  # the file it came from, for messages

    @property
    def where(self) -> str:
        return self._where

    @model_validator(mode="after")
    def _kernels_name_schedules(self):
        for s in self.kernel:
            if s not in self.schedules:
                raise ValueError(f"kernel: {s!r} is not one of this scenario's schedules ({', '.join(self.schedules)})")
        return self

    @field_validator("schedules")
    @classmethod
    def _known_schedules(cls, v):
        for i, s in enumerate(v):
            if s not in SCHEDULES:
                raise ValueError(f"item {i}: unknown schedule {s!r}: expected one of {', '.join(SCHEDULES)}")
        return v
