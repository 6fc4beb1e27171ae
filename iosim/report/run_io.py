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
    ClaimOutcome,
    SavedRun,
    ScenarioError,
    ScenarioRun,
    check_claims,
)
from ..yaml_io import read_data, validated
from .figures import PLOTLY_CONFIG, make_figures


def _csv_value(v):
    if isinstance(v, float):
        return repr(v)
    return "" if v is None else v


def write_results(run: ScenarioRun, folder: Path) -> list[Path]:
    """results.json (everything), results.csv (one row per case), traffic.csv and by_tensor.csv (tidy)."""
    folder.mkdir(parents=True, exist_ok=True)
    scn = run.scenario
    saved = SavedRun(
        iosim_version=__version__, scenario=scn, scenario_file=scn.where, profiles=run.profiles,
        claims=[ClaimOutcome(label=c.claim.label, expect=c.claim.expect, shown=c.shown, value=c.value, ok=c.ok,
                             error=c.error) for c in check_claims(run, scn.claims)],
        records=run.records, results=[c.result for c in run.cases])
    out = [folder / "results.json", folder / "results.csv", folder / "traffic.csv", folder / "by_tensor.csv"]
    out[0].write_text(json.dumps(saved.to_json(), indent=1))
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
    """A run saved by ``write_results``: the scenario, the records and the profile rates (no simulation),
    validated against :class:`~iosim.scenario.SavedRun`; a bad file is a ScenarioError naming it and each bad
    field (``records[3].seq_len: ...``)."""
    path = Path(folder) / "results.json"
    if not path.is_file():
        raise FileNotFoundError(f"{folder}: no results.json here; write results with 'iosim run SCENARIO -o DIR'")
    data = read_data(path, ScenarioError)
    saved = validated(SavedRun, data, str(path), ScenarioError, "results file")
    if len(saved.results) != len(saved.records):
        raise ScenarioError(f"{path}: {len(saved.records)} records but {len(saved.results)} results: one result "
                            "per record (null where the case could not run); write it again with 'iosim run'")
    run = ScenarioRun(saved.scenario, profiles={k: v.model_dump() for k, v in saved.profiles.items()})
    for rec, res in zip(saved.records, saved.results, strict=True):
        run.cases.append(CaseResult(None, rec.model_dump(by_alias=True), None if res is None else res.to_json()))
    return run


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
