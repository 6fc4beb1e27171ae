"""Scenario files: declarative experiments (YAML) that ``iosim run`` and ``iosim report`` execute.

A scenario names hardware profiles, schedules, a sweep of attention problems, the tiles, and which tables,
figures and checked claims to make. Every field is validated (unknown keys are rejected); an error names the
file, the field as a dotted path (``problems[0].seq_len``) and the fix. YAML is loaded with ``yaml.safe_load``.

A sweep value is written one of four ways, and the fields of one ``problems`` entry are crossed (a product):

    seq_len: 4096                                  one value
    seq_len: [1024, 2048, 4096]                    a list
    seq_len: {start: 64, stop: 512, step: 64}      a linear range, stop included
    seq_len: {start: 128, stop: 1048576, factor: 2}   a geometric range, stop included

Several ``problems`` entries are concatenated. The Python API is quiet: :func:`run_scenario` reports progress
only through the optional ``progress`` callback (the CLI draws a progress bar with it).
"""

from __future__ import annotations

import inspect
import itertools
import math
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from ._resources import scenarios_dir
from .blocks import cdiv
from .problem import AttentionProblem, DType, ProblemError
from .profile import Profile, ProfileError, get_profile, profile_from_dict
from .schedules import SCHEDULES, ScheduleError, get_schedule, resolve_tiles
from .simulate import Result, simulate, with_l2
from .units import UnitError, parse_quantity

SCHEMA_VERSION = 1
BOUNDARIES = ("global", "hbm", "sram")


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
                 "global_over_compulsory", "hbm_over_compulsory"]


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
    kind: Literal["summary", "by_tensor", "claims", "references", "parity"]
    title: str | None = None
    caption: str = ""
    where: Where = Field(default_factory=dict)
    files: str = Field("docs/validation/*.csv", description="parity: measurement CSV files (glob)")


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
    l2_model: bool = Field(False, description="predict the hbm (DRAM) bytes with iosim's L2 model; "
                           "otherwise hbm = global")
    tables: list[TableSpec] = Field(default_factory=list)
    figures: list[FigureSpec] = Field(default_factory=list)
    claims: list[Claim] = Field(default_factory=list)
    references: list[Reference] = Field(default_factory=list)
    _where: str = PrivateAttr("<dict>")  # the file it came from, for messages

    @property
    def where(self) -> str:
        return self._where

    @field_validator("schedules")
    @classmethod
    def _known_schedules(cls, v):
        for i, s in enumerate(v):
            if s not in SCHEDULES:
                raise ValueError(f"item {i}: unknown schedule {s!r}: expected one of {', '.join(SCHEDULES)}")
        return v

    @field_validator("pass_")
    @classmethod
    def _pass_supported(cls, v):
        if v != "forward" and _pass_kwarg() is None:
            raise ValueError(f"pass={v!r} needs a simulator with a backward pass; this iosim simulates the "
                             "forward pass only: remove the field or write 'forward'")
        return v


def _pass_kwarg() -> str | None:
    """The keyword with which ``simulate`` takes the pass (forward/backward), if this iosim has one."""
    params = inspect.signature(simulate).parameters
    for name in ("pass_", "direction", "passes"):
        if name in params:
            return name
    return None


# -- loading, with errors that name the file and the field ------------------------------------------------


def _loc(parts) -> str:
    out = ""
    for p in parts:
        if isinstance(p, int):
            out += f"[{p}]"
        else:
            out += ("." if out else "") + str(p)
    return out or "(top level)"


def _model_at(loc) -> type[BaseModel] | None:
    """The model class whose field is at ``loc[:-1]``, to list the keys it accepts."""
    model: Any = Scenario
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        if not (isinstance(model, type) and issubclass(model, BaseModel)) or part not in model.model_fields:
            return None
        model = _unwrap_model(model.model_fields[part].annotation)
    return model if isinstance(model, type) and issubclass(model, BaseModel) else None


def _unwrap_model(tp):
    for arg in (tp, *typing.get_args(tp)):
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            return arg
        for sub in typing.get_args(arg):
            if isinstance(sub, type) and issubclass(sub, BaseModel):
                return sub
    return None


def format_errors(err: ValidationError, where: str) -> str:
    lines = [f"{where}: invalid scenario"]
    for e in err.errors():
        if e["type"] == "literal_error" and isinstance(e.get("input"), dict):
            continue  # the other member of a union (tiles: 'default' or a mapping) says what is wrong
        loc = tuple(p for p in e["loc"] if not (isinstance(p, str) and ("[" in p or p in ("str", "int"))))
        path = _loc(loc)
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            model = _model_at(loc)
            known = ", ".join(f.alias or k for k, f in model.model_fields.items()) if model else ""
            msg = "unknown key: remove it or check its spelling" + (f" (accepted: {known})" if known else "")
        elif e["type"] == "missing":
            msg = "required field is missing: add it"
        elif e["type"] == "literal_error":
            msg = f"got {e.get('input')!r}: {msg}"
        lines.append(f"  {path}: {msg}")
    return "\n".join(lines)


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate a scenario file (YAML or JSON; loaded safely)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such scenario file (built-in ones: {', '.join(builtin_names())})")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ScenarioError(f"{path}: not valid YAML: {' '.join(str(exc).split())}") from None
    return scenario_from_dict(data, str(path), base_dir=path.parent)


def scenario_from_dict(data: Any, where: str = "<dict>", base_dir: Path | None = None) -> Scenario:
    if not isinstance(data, dict):
        raise ScenarioError(f"{where}: a scenario must be a mapping of fields, got {type(data).__name__}")
    if "problem" in data and "problems" not in data:  # one problem block, written without the list
        data = {**data, "problems": [data["problem"]]}
        del data["problem"]
    if data.get("schema_version") not in (None, SCHEMA_VERSION):
        raise ScenarioError(f"{where}: schema_version: got {data['schema_version']!r}; this iosim reads "
                            f"schema_version {SCHEMA_VERSION}")
    try:
        scn = Scenario.model_validate(data)
    except ValidationError as err:
        raise ScenarioError(format_errors(err, where)) from None
    # profiles: built-in names or files relative to the scenario file
    resolved = []
    for i, name in enumerate(scn.profiles):
        p = Path(name)
        if base_dir is not None and not p.is_absolute() and (base_dir / p).exists():
            name = str(base_dir / p)
        try:
            get_profile(name)
        except ProfileError as exc:
            raise ScenarioError(f"{where}: profiles[{i}]: {' '.join(str(exc).split())}") from None
        resolved.append(name)
    scn = scn.model_copy(update={"profiles": resolved})
    scn._where = where
    # every problem must be valid on its own
    for i, block in enumerate(scn.problems):
        for kw in block.expand():
            try:
                AttentionProblem.make(**kw)
            except ProblemError as exc:
                shown = {k: v for k, v in kw.items() if v is not None}
                raise ScenarioError(f"{where}: problems[{i}]: {exc} (in the combination {shown})") from None
    scn._where = where
    return scn


def builtin_paths() -> list[Path]:
    return sorted(scenarios_dir().glob("*.yaml"))


def builtin_names() -> list[str]:
    return [p.stem for p in builtin_paths()]


def resolve_scenario_arg(arg: str) -> Path:
    """A path, or the name of a built-in scenario."""
    p = Path(arg)
    if p.is_file():
        return p
    for q in builtin_paths():
        if q.stem == arg:
            return q
    raise FileNotFoundError(f"{arg}: no such scenario file or built-in scenario "
                            f"(built-in: {', '.join(builtin_names())})")


def default_scenarios() -> list[Scenario]:
    """The built-in scenarios, in report order."""
    scns = [load_scenario(p) for p in builtin_paths()]
    return sorted(scns, key=lambda s: (s.order, s.name))


# -- expansion and execution --------------------------------------------------------------------------------


@dataclass
class Case:
    """One simulation: a profile, a schedule, a problem and tiles."""

    index: int
    profile: str
    schedule: str
    problem: dict
    tiles: dict  # block_q, block_kv, sram_elements (None = the schedule's default)


def expand(scn: Scenario) -> list[Case]:
    """Every case of a scenario, in a stable order: profile, problem, schedule, tiles."""
    tiles = [{"block_q": None, "block_kv": None, "sram_elements": None}] if scn.tiles == "default" \
        else scn.tiles.expand()
    cases: list[Case] = []
    for prof in scn.profiles:
        for block in scn.problems:
            for kw in block.expand():
                for sched in scn.schedules:
                    for t in tiles:
                        cases.append(Case(len(cases), prof, sched, kw, dict(t)))
    return cases


def tiles_from_sram(schedule: str, M: int, d: int) -> tuple[int, int]:
    """FlashAttention-1 Algorithm 1 line 1: Bc = ceil(M/4d), Br = min(Bc, d). flash2's loop order is the other
    way round (the Q block stays on chip while K/V stream), so its roles swap: Br = ceil(M/4d), Bc = min(Br, d)."""
    big = max(1, cdiv(M, 4 * d))
    small = min(big, d)
    return (big, small) if schedule == "flash2" else (small, big)


def compulsory_bytes(p: AttentionProblem) -> int:
    """Q, K, V read once and O written once: the least any exact schedule moves (the seeds' '4.2 MB')."""
    b, d = p.elem_bytes, p.head_dim
    return b * d * (2 * p.batch * p.heads * p.seq_len + 2 * p.batch * p.kv_heads * p.kv_len)


def _with_room(profile: Profile, need: int) -> Profile:
    """The same profile with room on chip (shared memory per block and per SM, registers per SM) for ``need``
    bytes: a hypothetical GPU, for tiles or SRAM sizes the real one cannot hold."""
    data = profile.model_dump()
    note = f"hypothetical: raised by iosim to fit {need:,} B"
    smem, regs = data["memory"][2], data["memory"][3]
    smem["per_block"] = {"value": max(need, smem["per_block"]["value"] or 0), "source": note}
    smem["per_sm"] = {"value": max(need, smem["per_sm"]["value"] or 0), "source": note}
    regs["per_sm"] = {"value": max(need, regs["per_sm"]["value"] or 0), "source": note}
    return profile_from_dict(data, f"{profile.name} (hypothetical on-chip memory)")


def _working_set(schedule: str, problem: AttentionProblem, tiles, pass_: str) -> int:
    passes = ["forward", "backward"] if pass_ == "both" else [pass_]
    return max(int(get_schedule(schedule, ps).working_set(problem, tiles) or 0) for ps in passes)


@dataclass
class CaseResult:
    case: Case | None
    record: dict  # flat: what the CSV holds and the plots read
    result: dict | None  # Result.to_json(), or None where the case could not run


def run_case(case: Case, allow_overfill: bool = False, pass_: str = "forward", l2_model: bool = False) -> CaseResult:
    """Simulate one case. Tiles that do not fit the profile are an error in the record, unless overfill is
    allowed or the tiles come from a hypothetical SRAM size: then they run on a copy of the profile with room
    for them, and the record says ``fits: false``."""
    profile = get_profile(case.profile)
    problem = AttentionProblem.make(**case.problem)
    M = case.tiles["sram_elements"]
    bq, bkv = case.tiles["block_q"], case.tiles["block_kv"]
    if M is not None and case.schedule != "naive":
        bq, bkv = tiles_from_sram(case.schedule, M, problem.head_dim)
    kwargs: dict = {"block_q": bq, "block_kv": bkv}
    if pass_ != "forward":
        kwargs[_pass_kwarg()] = pass_
    fits, note = True, None
    try:
        try:
            r = simulate(case.schedule, problem, profile, **kwargs)
        except ScheduleError as exc:
            if not ((allow_overfill or M is not None) and " need " in str(exc)):
                raise
            fits, note = False, " ".join(str(exc).split())
            tiles = resolve_tiles(case.schedule, problem, profile, bq, bkv)
            r = simulate(case.schedule, problem, _with_room(profile, _working_set(case.schedule, problem, tiles,
                                                                                  pass_)), **kwargs)
        if l2_model:
            r = with_l2(r)
    except (ScheduleError, ProfileError) as exc:
        rec = _record(case, problem, None, profile)
        rec.update(fits=False, error=" ".join(str(exc).split()), **{"pass": pass_})
        return CaseResult(case, rec, None)
    rec = _record(case, problem, r, profile)
    rec.update(fits=fits, note=note, sram_elements=M if M is not None else r.tiles.sram_elements,
               hbm_model="l2" if l2_model else "none", **{"pass": pass_})
    return CaseResult(case, rec, r.to_json())


RECORD_FIELDS = [
    "case", "profile", "schedule", "pass", "batch", "heads", "kv_heads", "seq_len", "kv_len", "head_dim", "dtype",
    "causal", "block_q", "block_kv", "sram_elements", "fits", "hbm_model",
    "global_read_bytes", "global_write_bytes", "global_bytes", "hbm_read_bytes", "hbm_write_bytes", "hbm_bytes",
    "sram_read_bytes", "sram_write_bytes", "sram_bytes", "compulsory_bytes", "global_over_compulsory",
    "hbm_over_compulsory", "matrix_bytes", "linear_bytes",
    "flops_matmul", "flops_exp", "flops_other", "flops_total", "conventional_flops", "predicted_s", "bound",
    "arithmetic_intensity", "attained_flops_per_s", "sram_peak_bytes", "note", "error",
]


def _record(case: Case, p: AttentionProblem, r: Result | None, profile: Profile) -> dict:
    rec: dict = {k: None for k in RECORD_FIELDS}
    rec.update(case=case.index, profile=profile.name, schedule=case.schedule, **{"pass": "forward"})
    rec.update({k: getattr(p, k) for k in ("batch", "heads", "kv_heads", "seq_len", "kv_len", "head_dim",
                                            "dtype", "causal")})
    rec["compulsory_bytes"] = compulsory_bytes(p)
    rec["matrix_bytes"] = p.seq_len * p.kv_len * p.elem_bytes  # one N x N_kv matrix (S or P) of one head
    rec["linear_bytes"] = p.elem_bytes * p.head_dim * 2 * (p.seq_len + p.kv_len)  # Q, K, V, O of one head
    if r is None:
        return rec
    j = r.to_json()
    rec.update(block_q=r.tiles.block_q, block_kv=r.tiles.block_kv, sram_elements=r.tiles.sram_elements)
    for b in BOUNDARIES:
        rd, wr = j["traffic"][b]["read_bytes"], j["traffic"][b]["write_bytes"]
        rec.update({f"{b}_read_bytes": rd, f"{b}_write_bytes": wr, f"{b}_bytes": rd + wr})
    rec["global_over_compulsory"] = rec["global_bytes"] / rec["compulsory_bytes"]
    rec["hbm_over_compulsory"] = rec["hbm_bytes"] / rec["compulsory_bytes"]
    for k, v in j["flops"].items():
        rec[f"flops_{k}"] = v
    rec["conventional_flops"] = j.get("conventional_flops")
    rec["predicted_s"] = j["time"]["predicted_s"]
    rec["bound"] = j["time"]["bound"]
    rec["arithmetic_intensity"] = j["time"]["arithmetic_intensity"]
    if rec["predicted_s"]:
        rec["attained_flops_per_s"] = rec["flops_total"] / rec["predicted_s"]
    rec["sram_peak_bytes"] = j.get("sram_peak_bytes")
    rec["by_tensor"] = j["by_tensor"]  # not a CSV column: written long-form to by_tensor.csv
    return rec


@dataclass
class ScenarioRun:
    scenario: Scenario
    cases: list[CaseResult] = field(default_factory=list)
    profiles: dict = field(default_factory=dict)  # name -> the rates the roofline needs

    @property
    def records(self) -> list[dict]:
        return [c.record for c in self.cases]


def profile_summary(p: Profile) -> dict:
    """What a figure needs from a profile, saved with the results so ``iosim plot`` needs no profile files."""

    def val(path):
        try:
            return p.require(path)
        except ProfileError:
            return None

    return {
        "name": p.name, "display_name": p.display_name,
        "dram_bandwidth": val("dram.bandwidth"), "l2_bandwidth": val("l2.bandwidth"),
        "matmul": {dt: (val("compute.fp32") if dt == "fp32" else val(f"compute.tensor.{dt}"))
                   for dt in ("fp16", "bf16", "fp32")},
        "fp32": val("compute.fp32"), "smem_per_block": p.smem.per_block.value,
    }


def run_scenario(scn: Scenario, progress: Callable[[int, int], None] | None = None) -> ScenarioRun:
    """Simulate every case of ``scn`` (closed forms). Quiet; ``progress(done, total)`` is called per case."""
    cases = expand(scn)
    run = ScenarioRun(scn)
    allow = scn.tiles != "default" and scn.tiles.allow_overfill
    for n, case in enumerate(cases, 1):
        run.cases.append(run_case(case, allow, scn.pass_, scn.l2_model))
        if progress is not None:
            progress(n, len(cases))
    for name in scn.profiles:
        p = get_profile(name)
        run.profiles[p.name] = profile_summary(p)
    return run


# -- selecting records and checking claims ------------------------------------------------------------------


def select(records: list[dict], where: dict) -> list[dict]:
    def ok(rec):
        for k, want in where.items():
            have = rec.get(k)
            if isinstance(want, list):
                if have not in want:
                    return False
            elif have != want:
                return False
        return True

    return [r for r in records if ok(r)]


def claim_value(records: list[dict], claim: Claim) -> float:
    rows = select(records, claim.where)
    if not rows:
        raise ScenarioError(f"claim {claim.label!r}: no case matches where={claim.where}; fix its 'where'")
    values = set()
    for r in rows:
        q = claim.quantity
        if q == "one_plus_n_over_d":
            v = 1 + r["kv_len"] / r["head_dim"]
        else:
            v = r[q]
        if v is None:
            raise ScenarioError(f"claim {claim.label!r}: {q} is not known for case {r['case']} ({r.get('error')})")
        values.add(round(v, 9) if isinstance(v, float) else v)
    if len(values) != 1:
        raise ScenarioError(f"claim {claim.label!r}: the {len(rows)} cases matching where={claim.where} give "
                            f"different values {sorted(values)}; narrow its 'where'")
    return values.pop()


def round_sig(x: float, digits: int) -> float:
    if x == 0:
        return 0.0
    return round(x, digits - 1 - math.floor(math.log10(abs(x))))


def format_sig(x: float, digits: int, units: str) -> str:
    """``format_sig(4429185024, 3, 'decimal') == '4.43 GB'``; binary: '256 MiB'; ratio: '33x'."""
    if units == "ratio":
        return f"{_trim(round_sig(x, digits), digits)}x"
    if units == "plain":
        return _trim(round_sig(x, digits), digits)
    steps = ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")) if units == "decimal" else \
        ((2**40, "Ti"), (2**30, "Gi"), (2**20, "Mi"), (2**10, "Ki"))
    for factor, prefix in steps:
        if abs(x) >= factor:
            return f"{_trim(round_sig(x / factor, digits), digits)} {prefix}B"
    return f"{_trim(round_sig(x, digits), digits)} B"


def _trim(v: float, digits: int) -> str:
    """Print with no more decimals than the significant digits need (no trailing '.0')."""
    if v == 0:
        return "0"
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(v))))
    s = f"{v:.{decimals}f}"
    return s.rstrip("0").rstrip(".") if "." in s else s


@dataclass
class ClaimCheck:
    claim: Claim
    value: float | None
    shown: str
    ok: bool
    error: str | None = None


def check_claims(run_or_records, claims: list[Claim]) -> list[ClaimCheck]:
    records = run_or_records.records if isinstance(run_or_records, ScenarioRun) else run_or_records
    out = []
    for c in claims:
        try:
            v = claim_value(records, c)
        except ScenarioError as exc:
            out.append(ClaimCheck(c, None, "n/a", False, str(exc)))
            continue
        shown = format_sig(v, c.digits, c.units)
        out.append(ClaimCheck(c, v, shown, shown == c.expect))
    return out
