"""Results on disk, figures from scenario specs, and the one-file HTML report.

``iosim run`` = :func:`run_scenario` + :func:`write_run` (tidy CSV + JSON + one HTML and one CSV per figure);
``iosim plot`` = :func:`load_run` + :func:`write_figures` (no simulation); ``iosim report`` =
:func:`render_report`: one self-contained HTML file with plotly's JavaScript embedded once, so it opens offline.
"""

from __future__ import annotations

import csv
import datetime as _dt
import html
import json
import re
from dataclasses import dataclass
from pathlib import Path

import plotly.graph_objects as go

from . import plots
from ._version import __version__
from ._resources import data_dir
from .scenario import (
    RECORD_FIELDS,
    CaseResult,
    FigureSpec,
    Scenario,
    ScenarioError,
    ScenarioRun,
    check_claims,
    scenario_from_dict,
    select,
)
from .units import fmt_bytes, fmt_rate, fmt_seconds

PLOTLY_CONFIG = {"displaylogo": False, "responsive": True,
                 "toImageButtonOptions": {"format": "svg"}}


# -- figures from a scenario's specs -----------------------------------------------------------------------------


@dataclass
class FigureOut:
    name: str
    spec: FigureSpec
    fig: go.Figure | None
    note: str = ""  # why there is no figure, or which files it read


def _refs(run: ScenarioRun) -> list[dict]:
    return [r.model_dump() for r in run.scenario.references]


def measurement_files(pattern: str) -> list[Path]:
    """Files matching ``pattern`` relative to the working folder, else to the source checkout."""
    roots = [Path.cwd()]
    try:
        roots.append(data_dir("scenarios").parent)
    except FileNotFoundError:
        pass
    for root in roots:
        found = sorted(p for p in root.glob(pattern) if p.is_file())
        if found:
            return found
    return []


def _short(path) -> str:
    """A path relative to the working folder or the checkout, for notes."""
    p = Path(path)
    for root in (Path.cwd(), data_dir("scenarios").parent):
        try:
            return str(p.resolve().relative_to(root.resolve()))
        except (ValueError, FileNotFoundError):
            continue
    return str(p)


def make_figure(run: ScenarioRun, spec: FigureSpec, index: int) -> FigureOut:
    scn = run.scenario
    name = spec.name or f"{scn.name}-{index + 1}-{spec.kind.replace('_', '-')}"
    recs = select(run.records, spec.where)
    kind, title = spec.kind, spec.title
    kw = {"title": title} if title else {}
    if kind == "parity":
        files = measurement_files(spec.files)
        if not files:
            return FigureOut(name, spec, None, f"No measurement files match {spec.files} yet: the parity figure "
                             "appears once the cross-check writes them (see the validation page).")
        skipped: list[str] = []
        rows = plots.read_measurements(files, skipped)
        used = sorted({_short(r["file"]) for r in rows})
        note = ("Read " + ", ".join(used) + "." if used else "No measured rows found.") + \
            (" Not measurement tables: " + "; ".join(skipped) + "." if skipped else "")
        return FigureOut(name, spec, plots.parity(rows, **kw) if rows else None, note)
    if not recs:
        raise ScenarioError(f"{scn.where}: figures[{index}]: where={spec.where} matches no case; fix 'where'")
    if kind == "traffic_vs_n":
        fig = plots.traffic_vs_n(recs, spec.boundaries, spec.compulsory, references=_refs(run), **kw)
    elif kind == "time_vs_n":
        fig = plots.time_vs_n(recs, relative_to=spec.relative_to, **kw)
    elif kind == "roofline":
        fig = plots.roofline(recs, run.profiles, **kw)
    elif kind == "traffic_vs_block":
        fig = plots.traffic_vs_block(recs, _refs(run), spec.boundaries, **kw)
    elif kind == "traffic_vs_sram":
        fig = plots.traffic_vs_sram(recs, **kw)
    elif kind == "footprint":
        fig = plots.footprint(recs, **kw)
    elif kind == "by_tensor":
        fig = plots.by_tensor(recs, **kw)
    elif kind == "bars":
        if not spec.x:
            raise ScenarioError(f"{scn.where}: figures[{index}]: kind 'bars' needs 'x' (a field such as kv_heads)")
        fig = plots.bars(recs, spec.x, spec.metric, **kw)
    else:  # pragma: no cover - the schema lists every kind
        raise ScenarioError(f"{scn.where}: figures[{index}]: unknown kind {kind!r}")
    return FigureOut(name, spec, fig)


def make_figures(run: ScenarioRun) -> list[FigureOut]:
    return [make_figure(run, spec, i) for i, spec in enumerate(run.scenario.figures)]


# -- results on disk ----------------------------------------------------------------------------------------------


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


# -- the HTML report ----------------------------------------------------------------------------------------------


def _md(text: str) -> str:
    """A small, safe subset of Markdown for scenario descriptions: paragraphs, '- ' lists, `code`, **bold**,
    *italic*, [links](url). Everything is HTML-escaped first."""
    out = []
    for block in re.split(r"\n\s*\n", text.strip()):
        lines = [ln.rstrip() for ln in block.splitlines()]
        if lines and all(ln.lstrip().startswith("- ") for ln in lines if ln.strip()):
            items = "".join(f"<li>{_inline(ln.lstrip()[2:])}</li>" for ln in lines if ln.strip())
            out.append(f"<ul>{items}</ul>")
        elif lines:
            out.append(f"<p>{_inline(' '.join(ln.strip() for ln in lines))}</p>")
    return "\n".join(out)


def _inline(s: str) -> str:
    s = html.escape(s, quote=False)
    s = re.sub(r"`([^`]+)`", r"<code>\1</code>", s)
    s = re.sub(r"\*\*([^*]+)\*\*", r"<strong>\1</strong>", s)
    s = re.sub(r"(?<![*\w])\*([^*\s][^*]*)\*(?!\w)", r"<em>\1</em>", s)
    s = re.sub(r"\[([^\]]+)\]\((https?://[^)\s]+)\)", r'<a href="\2">\1</a>', s)
    return s


def _b(n) -> str:
    """Human bytes with the exact integer as a tooltip."""
    if n is None:
        return "n/a"
    return f'<span title="{int(n):,} B">{fmt_bytes(n)}</span>'


def _problem(r: dict) -> str:
    return html.escape(plots._problem_line(r))


def table_summary(records: list[dict]) -> str:
    head = ("<tr><th>profile</th><th>schedule</th><th>problem</th><th>tiles</th><th>global read</th>"
            "<th>global write</th><th>global total</th><th>hbm total</th><th>compulsory</th>"
            "<th>global ÷ compulsory</th><th>FLOPs</th><th>predicted</th><th>bound</th></tr>")
    rows = []
    for r in records:
        if r.get("global_bytes") is None:
            rows.append(f"<tr><td>{r['profile']}</td><td>{r['schedule']}</td><td>{_problem(r)}</td>"
                        f"<td colspan=10 class=bad>{html.escape(r.get('error') or 'not simulated')}</td></tr>")
            continue
        fit = "" if r.get("fits", True) else \
            f' <span class=warn title="{html.escape(r.get("note") or "", quote=True)}">(does not fit: hypothetical)</span>'
        rows.append(
            f"<tr><td>{r['profile']}</td><td><b>{r['schedule']}</b></td><td>{_problem(r)}</td>"
            f"<td>{html.escape(plots._tiles_line(r))}{fit}</td><td>{_b(r['global_read_bytes'])}</td>"
            f"<td>{_b(r['global_write_bytes'])}</td><td><b>{_b(r['global_bytes'])}</b></td><td>{_b(r['hbm_bytes'])}</td>"
            f"<td>{_b(r['compulsory_bytes'])}</td><td>{r['global_bytes'] / r['compulsory_bytes']:.3g}×</td>"
            f"<td title=\"{r['flops_total']:,}\">{fmt_rate(r['flops_total'], 'FLOP')}</td>"
            f"<td title=\"{r['predicted_s']:.6g} s\">{fmt_seconds(r['predicted_s'])}</td><td>{r['bound']}</td></tr>")
    return f"<table>{head}{''.join(rows)}</table>"


def table_by_tensor(records: list[dict]) -> str:
    tensors: list[str] = []
    for r in records:
        for t in r.get("by_tensor") or {}:
            if t not in tensors:
                tensors.append(t)
    cols = "".join(f"<th colspan=2>{r['schedule']}, {r['batch'] * r['heads']} head(s)</th>" for r in records)
    sub = "".join("<th>load</th><th>store</th>" for _ in records)
    rows = []
    for t in tensors:
        cells = ""
        for r in records:
            v = (r.get("by_tensor") or {}).get(t, {})
            rd, wr = v.get("global_read_bytes", 0), v.get("global_write_bytes", 0)
            cells += f"<td>{_b(rd) if rd else '–'}</td><td>{_b(wr) if wr else '–'}</td>"
        rows.append(f"<tr><td><b>{t}</b></td>{cells}</tr>")
    total = "".join(f"<td>{_b(r['global_read_bytes'])}</td><td>{_b(r['global_write_bytes'])}</td>" for r in records)
    grand = "".join(f"<td colspan=2><b>{_b(r['global_bytes'])}</b></td>" for r in records)
    comp = "".join(f"<td colspan=2>{_b(r['compulsory_bytes'])}</td>" for r in records)
    return (f"<table><tr><th rowspan=2>tensor</th>{cols}</tr><tr>{sub}</tr>{''.join(rows)}"
            f"<tr class=total><td>reads, writes</td>{total}</tr><tr class=total><td>total (global)</td>{grand}</tr>"
            f"<tr><td>compulsory: Q, K, V read once, O written once</td>{comp}</tr></table>")


def table_claims(run: ScenarioRun) -> str:
    rows = []
    for c in check_claims(run, run.scenario.claims):
        mark = '<span class=ok>✓ matches</span>' if c.ok else \
            f'<span class=bad>✗ {html.escape(c.error or "differs")}</span>'
        exact = "" if c.value is None else (f"{c.value:,.6g}" if isinstance(c.value, float) and c.value < 1e6
                                            else f"{int(c.value):,} B" if c.claim.units in ("decimal", "binary")
                                            else f"{c.value:,.6g}")
        rows.append(f"<tr><td>{html.escape(c.claim.label)}</td><td class=num><b>{html.escape(c.shown)}</b></td>"
                    f"<td class=num>{exact}</td><td>{html.escape(c.claim.expect)}</td><td>{mark}</td>"
                    f"<td class=src>{html.escape(c.claim.source)}</td></tr>")
    return ("<table><tr><th>claim</th><th>simulated, rounded</th><th>exact</th><th>published</th><th></th>"
            f"<th>source</th></tr>{''.join(rows)}</table>")


def table_references(run: ScenarioRun) -> str:
    rows = []
    for r in run.scenario.references:
        v = _b(r.value) if r.unit == "bytes" else f"{fmt_seconds(r.value)}"
        tag = "measured" if r.tag == "measured" else f"{r.tag}: {plots._TAGS.get(r.tag, '')}"
        rows.append(f"<tr><td>{html.escape(r.label)}</td><td class=num>{v}</td><td>{tag}</td>"
                    f"<td class=src>{html.escape(r.source)}</td></tr>")
    return f"<table><tr><th>number</th><th>value</th><th>provenance</th><th>source</th></tr>{''.join(rows)}</table>"


def table_parity(pattern: str) -> str:
    """Measured ÷ simulated bytes per kernel, boundary and direction: median, min and max over the files' rows."""
    rows = plots.read_measurements(measurement_files(pattern))
    if not rows:
        return f"<p class=note>No measurement rows match {html.escape(pattern)} yet.</p>"
    groups: dict = {}
    for r in rows:
        if r["simulated_bytes"] > 0:
            groups.setdefault((r["kernel"], r["boundary"], r.get("direction", "")), []).append(
                r["measured_bytes"] / r["simulated_bytes"])
    out = []
    for (kernel, boundary, direction), ratios in sorted(groups.items()):
        ratios.sort()
        med = ratios[len(ratios) // 2] if len(ratios) % 2 else (ratios[len(ratios) // 2 - 1] + ratios[len(ratios) // 2]) / 2
        out.append(f"<tr><td>{html.escape(kernel)}</td><td>{html.escape(boundary)}</td><td>{html.escape(direction)}</td>"
                   f"<td class=num>{len(ratios)}</td><td class=num><b>{med:.3f}</b></td>"
                   f"<td class=num>{ratios[0]:.3f}</td><td class=num>{ratios[-1]:.3f}</td></tr>")
    return ("<table><tr><th>kernel</th><th>boundary</th><th>direction</th><th>rows</th><th>measured ÷ simulated, "
            f"median</th><th>min</th><th>max</th></tr>{''.join(out)}</table>")


def make_tables(run: ScenarioRun) -> list[tuple[str, str, str]]:
    """(title, caption, html) per table spec of the scenario."""
    out = []
    for spec in run.scenario.tables:
        recs = select(run.records, spec.where)
        if spec.kind == "summary":
            t = table_summary(recs)
        elif spec.kind == "by_tensor":
            t = table_by_tensor(recs)
        elif spec.kind == "claims":
            t = table_claims(run)
        elif spec.kind == "parity":
            t = table_parity(spec.files)
        else:
            t = table_references(run)
        default = {"summary": "Simulated traffic", "by_tensor": "Global traffic per tensor",
                   "claims": "Published numbers, recomputed", "references": "Numbers from outside the simulator",
                   "parity": "Measured ÷ simulated"}
        out.append((spec.title or default[spec.kind], spec.caption, t))
    return out


CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;color:#222;background:#fafafa}
main{max-width:1180px;margin:0 auto;padding:24px 32px 64px;background:#fff}
h1{font-size:1.8em;margin-bottom:.2em} h2{margin-top:2.2em;border-bottom:2px solid #eee;padding-bottom:.2em}
h3{margin-top:1.4em;font-size:1.1em}
.meta{color:#666;font-size:.9em} code{background:#f2f2f2;padding:1px 4px;border-radius:3px}
table{border-collapse:collapse;margin:.6em 0 1em;font-size:.86em} th,td{border:1px solid #ddd;padding:4px 8px}
th{background:#f5f5f5;text-align:left} td.num{text-align:right;font-variant-numeric:tabular-nums}
tr.total td{background:#fbfbf3} .ok{color:#1a7f37;font-weight:600} .bad{color:#c62828;font-weight:600}
.warn{color:#b26a00} .src{color:#555;font-size:.92em;max-width:380px}
figure{margin:1em 0 2em} figcaption{color:#555;font-size:.9em;margin-top:.3em}
nav ol{columns:2;column-gap:3em;font-size:.95em} nav li{break-inside:avoid;margin-bottom:.2em} .note{background:#fff8e1;border-left:4px solid #f0c36d;padding:6px 12px}
"""


def render_report(runs: list[ScenarioRun], title: str = "iosim report: attention I/O, simulated",
                   elapsed_s: float | None = None) -> str:
    """One self-contained HTML page: every scenario's text, claims, tables and figures; plotly's JavaScript
    is embedded once in the head (no CDN), so the file opens offline."""
    from plotly.offline import get_plotlyjs

    toc, body, n_fig = [], [], 0
    for run in runs:
        scn = run.scenario
        toc.append(f'<li><a href="#{scn.name}">{html.escape(scn.title)}</a></li>')
        parts = [f'<section id="{scn.name}"><h2>{html.escape(scn.title)}</h2>', _md(scn.description)]
        profiles = ", ".join(p.get("display_name", n) for n, p in run.profiles.items())
        parts.append(f'<p class=meta>Scenario <code>{scn.name}</code> · {len(run.records)} simulated cases · '
                     f'profiles: {html.escape(profiles)} · schedules: {", ".join(scn.schedules)}</p>')
        for t_title, caption, t_html in make_tables(run):
            parts.append(f"<h3>{html.escape(t_title)}</h3>{t_html}")
            if caption:
                parts.append(f"<p class=meta>{_inline(caption)}</p>")
        for fo in make_figures(run):
            if fo.fig is None:
                parts.append(f"<p class=note>{html.escape(fo.note)}</p>")
                continue
            div = fo.fig.to_html(full_html=False, include_plotlyjs=False, div_id=f"fig-{fo.name}",
                                 config=PLOTLY_CONFIG)
            cap = _inline(fo.spec.caption) + (f" {html.escape(fo.note)}" if fo.note else "")
            parts.append(f"<figure>{div}<figcaption>{cap}</figcaption></figure>")
            n_fig += 1
        parts.append("</section>")
        body.append("\n".join(parts))
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    took = f" in {elapsed_s:.1f} s" if elapsed_s is not None else ""
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>{html.escape(title)}</title><style>{CSS}</style>
<script type="text/javascript">{get_plotlyjs()}</script>
</head><body><main>
<h1>{html.escape(title)}</h1>
<p class=meta>iosim {__version__} · generated {stamp}{took} · {len(runs)} scenarios · {n_fig} figures ·
bytes in decimal units (1 MB = 10<sup>6</sup> B) unless marked MiB/GiB; hover over a number for the exact bytes.</p>
<p>Boundaries: <b>global</b> = every load and store the schedule issues (SM ↔ L2; the papers' "HBM accesses"),
<b>hbm</b> = what reaches DRAM (equal to global until the L2 model is applied), <b>sram</b> = bytes written into and
read out of on-chip memory. Counts are exact integers for the whole problem (all batches and heads).</p>
<nav><ol>{''.join(toc)}</ol></nav>
{''.join(body)}
</main></body></html>
"""
