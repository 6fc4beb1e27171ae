"""The report's tables: simulated traffic, bytes per tensor, published numbers recomputed, outside numbers,
and (from :mod:`.measured`) measured ÷ simulated."""

from __future__ import annotations

import html

from .. import plots
from ..plots.style import si
from ..scenario import ScenarioRun, check_claims, select
from ..units import fmt_bytes, fmt_rate, fmt_seconds
from .measured import parity_table, time_parity_table


def _b(n) -> str:
    """Human bytes with the exact integer as a tooltip."""
    if n is None:
        return "n/a"
    return f'<span title="{int(n):,} B">{fmt_bytes(n)}</span>'


def _problem(r: dict) -> str:
    return html.escape(plots.problem_line(r))


def table_summary(records: list[dict]) -> str:
    head = ("<tr><th>profile</th><th>schedule</th><th>problem</th><th>tiles</th><th>global read</th>"
            "<th>global write</th><th>global total</th><th>hbm total</th><th>compulsory</th>"
            "<th>global ÷ compulsory</th><th>FLOPs</th><th>predicted</th><th>bound</th><th>energy a call</th></tr>")
    rows = []
    for r in records:
        if r.get("global_bytes") is None:
            rows.append(f"<tr><td>{r['profile']}</td><td>{r['schedule']}</td><td>{_problem(r)}</td>"
                        f"<td colspan=11 class=bad>{html.escape(r.get('error') or 'not simulated')}</td></tr>")
            continue
        fit = "" if r.get("fits", True) else \
            f' <span class=warn title="{html.escape(r.get("note") or "", quote=True)}">(does not fit: hypothetical)</span>'
        rows.append(
            f"<tr><td>{r['profile']}</td><td><b>{r['schedule']}</b></td><td>{_problem(r)}</td>"
            f"<td>{html.escape(plots.tiles_line(r))}{fit}</td><td>{_b(r['global_read_bytes'])}</td>"
            f"<td>{_b(r['global_write_bytes'])}</td><td><b>{_b(r['global_bytes'])}</b></td><td>{_b(r['hbm_bytes'])}</td>"
            f"<td>{_b(r['compulsory_bytes'])}</td><td>{r['global_bytes'] / r['compulsory_bytes']:.3g}×</td>"
            f"<td title=\"{r['flops_total']:,}\">{fmt_rate(r['flops_total'], 'FLOP')}</td>"
            f"<td title=\"{r['predicted_s']:.6g} s; {html.escape(plots.time_hover(r), quote=True)}\">"
            f"{fmt_seconds(r['predicted_s'])}</td><td>{r['bound']}</td><td>{_energy(r)}</td></tr>")
    source = plots.time_source(records)
    said = source[0].upper() + source[1:] if source.startswith("predicted") else f"Predicted times: {source}"
    note = f"<p class=meta>{html.escape(said)}.</p>" if source else ""
    return f"<table>{head}{''.join(rows)}</table>{note}"


def _energy(r: dict) -> str:
    """A call's predicted joules and its average watts, or n/a (a profile without a power calibration)."""
    e = r.get("energy_j")
    if not e or not r.get("predicted_s"):
        return "n/a"
    return f'<span title="{e:.6g} J">{si(e, "J")} ({e / r["predicted_s"]:.0f} W)</span>'


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
        tag = "measured" if r.tag == "measured" else f"{r.tag}: {plots.TAGS.get(r.tag, '')}"
        rows.append(f"<tr><td>{html.escape(r.label)}</td><td class=num>{v}</td><td>{tag}</td>"
                    f"<td class=src>{html.escape(r.source)}</td></tr>")
    return f"<table><tr><th>number</th><th>value</th><th>provenance</th><th>source</th></tr>{''.join(rows)}</table>"


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
            t = parity_table(spec.files, run.scenario.where)
        elif spec.kind == "measured_time":
            t = time_parity_table(spec.files, run.scenario.where, recs)
        else:
            t = table_references(run)
        default = {"summary": "Simulated traffic", "by_tensor": "Global traffic per tensor",
                   "claims": "Published numbers, recomputed", "references": "Numbers from outside the simulator",
                   "parity": "Measured ÷ simulated", "measured_time": "Predicted against measured time"}
        out.append((spec.title or default[spec.kind], spec.caption, t))
    return out
