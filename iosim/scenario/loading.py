"""Reading scenario files: YAML loaded safely, validated, with errors that name the file, the field as a
dotted path (``problems[0].seq_len``) and the fix; the built-in scenarios found from any working folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .._resources import scenarios_dir
from ..hardware.gpu import ProfileError, get_profile
from ..problem import AttentionProblem, ProblemError
from ..timing import KernelError, kernel_for
from ..yaml_io import read_data, validated
from .schema import SCHEMA_VERSION, Scenario, ScenarioError


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate a scenario file (YAML or JSON; loaded safely)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such scenario file (built-in ones: {', '.join(builtin_names())})")
    data = read_data(path, ScenarioError)
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
    scn = validated(Scenario, data, where, ScenarioError, "scenario")
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
    kernels = {}  # the time model's kernels: built-in names or files relative to the scenario file
    for schedule, name in scn.kernel.items():
        p = Path(name)
        if base_dir is not None and not p.is_absolute() and (base_dir / p).is_file():
            name = str(base_dir / p)
        try:
            kernel_for(schedule, name)
        except KernelError as exc:
            raise ScenarioError(f"{where}: kernel.{schedule}: {' '.join(str(exc).split())}") from None
        kernels[schedule] = name
    scn = scn.model_copy(update={"profiles": resolved, "kernel": kernels})
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

