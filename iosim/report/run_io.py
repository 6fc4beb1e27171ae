"""Results on disk: tidy CSV and JSON per scenario, one HTML and one CSV per figure, and reading them back
(``iosim plot`` redraws from them without simulating)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from .. import plots
from .._version import __version__
from ..scenario import (
    RECORD_FIELDS,
    CaseResult,
    Scenario,
    ScenarioError,
    ScenarioRun,
    check_claims,
    scenario_from_dict,
)
from .figures import PLOTLY_CONFIG, make_figures


def _csv_value(v):
    if isinstance(v, float):
        return repr(v)
    return "" if v is None else v


def write_results(run: ScenarioRun, folder: Path) -> list[Path]:
    """results.json (everything), results.csv (one row per case), traffic.csv and by_tensor.csv (tidy)."""
    folder.mkdir(parents=True, exist_ok=True)
    scn = run.scenario
    payload = {
        "iosim_version": __version__,
        "scenario": scn.model_dump(by_alias=True, mode="json"),
        "scenario_file": scn.where,
        "profiles": run.profiles,
        "claims": [{"label": c.claim.label, "expect": c.claim.expect, "shown": c.shown, "value": c.value,
                    "ok": c.ok, "error": c.error} for c in check_claims(run, scn.claims)],
        "records": run.records,
        "results": [c.result for c in run.cases],
    }
    out = [folder / "results.json", folder / "results.csv", folder / "traffic.csv", folder / "by_tensor.csv"]
    out[0].write_text(json.dumps(payload, indent=1))
    with open(out[1], "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=RECORD_FIELDS, extrasaction="ignore")
        w.writeheader()
        for r in run.records:
            w.writerow({k: _csv_value(r.get(k)) for k in RECORD_FIELDS})
    ident = ["case", "profile", "schedule", "pass", "batch", "heads", "kv_heads", "seq_len", "kv_len", "head_dim",
             "dtype", "causal", "block_q", "block_kv", "sram_elements"]
    with open(out[2], "w", newline="") as f:
        w = csv.writer(f)
        w.writerow([*ident, "boundary", "direction", "bytes"])
        for r in run.records:
            for b in ("global", "hbm", "sram"):
                for d in ("read", "write"):
                    if r.get(f"{b}_{d}_bytes") is not None:
                        w.writerow([_csv_value(r.get(k)) for k in ident] + [b, d, r[f"{b}_{d}_bytes"]])
    with open(out[3], "w", newline="") as f:
        w = csv.writer(f)
        w.writerow([*ident, "tensor", "boundary", "direction", "bytes"])
        for r in run.records:
            for t, v in (r.get("by_tensor") or {}).items():
                for d in ("read", "write"):
                    w.writerow([_csv_value(r.get(k)) for k in ident] + [t, "global", d, v[f"global_{d}_bytes"]])
    return out


def write_figures(run: ScenarioRun, folder: Path) -> list[Path]:
    """figures/<name>.html (plotly.min.js once beside them, so they open offline) and figures/<name>.csv."""
    fdir = folder / "figures"
    fdir.mkdir(parents=True, exist_ok=True)
    out = []
    for fo in make_figures(run):
        if fo.fig is None:
            continue
        html_path = fdir / f"{fo.name}.html"
        fo.fig.write_html(html_path, include_plotlyjs="directory", config=PLOTLY_CONFIG)
        out += [html_path, plots.write_figure_csv(fo.fig, fdir / f"{fo.name}.csv")]
    return out


def write_run(run: ScenarioRun, out_dir: Path) -> list[Path]:
    folder = Path(out_dir) / run.scenario.name
    return write_results(run, folder) + write_figures(run, folder)


def load_run(folder: Path) -> ScenarioRun:
    """A run saved by ``write_results``: the scenario, the records and the profile rates (no simulation)."""
    path = Path(folder) / "results.json"
    if not path.is_file():
        raise FileNotFoundError(f"{folder}: no results.json here; write results with 'iosim run SCENARIO -o DIR'")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ScenarioError(f"{path}: not valid JSON ({exc}); run the scenario again") from None
    scn = _scenario_without_checks(data["scenario"], str(path))
    run = ScenarioRun(scn, profiles=data.get("profiles", {}))
    for rec, res in zip(data["records"], data.get("results", [None] * len(data["records"]))):
        run.cases.append(CaseResult(None, rec, res))
    return run


def _scenario_without_checks(data: dict, where: str) -> Scenario:
    """The saved scenario, validated, but without looking profile files up again (they may have moved)."""
    try:
        return Scenario.model_validate(data)
    except Exception:
        return scenario_from_dict(data, where)


def saved_runs(folder: Path) -> list[Path]:
    """Folders holding results.json: ``folder`` itself or its sub-folders."""
    folder = Path(folder)
    if (folder / "results.json").is_file():
        return [folder]
    found = sorted(p.parent for p in folder.glob("*/results.json"))
    if not found:
        raise FileNotFoundError(f"{folder}: no results.json in it or its sub-folders; "
                                "write results with 'iosim run SCENARIO -o DIR' first")
    return found
