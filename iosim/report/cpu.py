"""The report's section "Attention on a CPU": naive ÷ tiled time measured against N, beside the CPU model's
predicted ratio and the seeds' ~2× claim, as one figure and one table, naming the machine that measured it.

The data is ``iosim.cpu.compare.scenario_data``'s dict: measured now by ``iosim report --cpu`` (the command
line measures and hands it over; this layer never imports ``iosim.cpu``), or, by default, the committed record
``docs/benchmarks/cpu-<machine>.json`` that ``python benchmarks/bench_cpu.py --record`` wrote (the same keys, plus
when and with which command), found wherever iosim is installed (:func:`iosim._resources.benchmarks_dir`).
"""

from __future__ import annotations

import html
import json
from dataclasses import dataclass
from pathlib import Path

from .. import plots
from .._resources import benchmarks_dir
from ..scenario import ScenarioError
from ..units import fmt_bytes
from .figures import PLOTLY_CONFIG

RECORDS = "docs/benchmarks/"  # how the committed records are named in the report
ROW_FIELDS = ("seq_len", "head_dim", "naive_ms", "tiled_ms", "ratio", "naive_pred_ms", "tiled_pred_ms")
SECTION_ID = "attention-on-a-cpu"
TITLE = "Attention on a CPU"


@dataclass(frozen=True)
class CpuMeasurement:
    data: dict  # scenario_data's keys: machine, logical_cpus, gemm, profile, seeds_claim, rows
    file: str | None = None  # the committed record, as named in the report; None: measured now, on this machine


def check_cpu_data(data: dict, where: str) -> dict:
    """``data`` if it has the keys the section reads, else a ScenarioError naming ``where`` and what is missing."""
    missing = [k for k in ("machine", "rows") if k not in data]
    missing += sorted({f"rows[{i}].{k}" for i, r in enumerate(data.get("rows") or []) for k in ROW_FIELDS
                       if k not in r})
    if missing or not data.get("rows"):
        raise ScenarioError(f"{where}: not a CPU measurement record (missing {', '.join(missing) or 'rows'}); "
                            "write one with 'python benchmarks/bench_cpu.py --record'")
    return data


def read_cpu_record(path: Path, shown: str | None = None) -> CpuMeasurement:
    """One committed record, checked; ``shown`` is its name in the report (default: the path)."""
    shown = shown or str(path)
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ScenarioError(f"{shown}: cannot read the CPU record ({exc})") from None
    return CpuMeasurement(check_cpu_data(data, shown), shown)


def committed_cpu_record(folder: Path | None = None) -> CpuMeasurement | None:
    """The newest committed record ``cpu-*.json`` (by its measured_at, then name), from the repository's
    docs/benchmarks or the installed package's copy; None where there is none."""
    try:
        folder = folder or benchmarks_dir()
    except FileNotFoundError:
        return None
    found = [read_cpu_record(p, RECORDS + p.name) for p in sorted(folder.glob("cpu-*.json"))]
    return max(found, key=lambda m: (m.data.get("measured_at", ""), m.file), default=None)


def _ms(v) -> str:
    return "—" if v is None else f"{v:,.1f}" if v >= 10 else f"{v:.2f}"


def _x(v) -> str:
    return "—" if v is None else f"{v:.2f}×"


def cpu_table(rows: list[dict]) -> str:
    """N, d, measured times and ratio, the median of the per-pair ratios, predicted times and ratio."""
    head = ("<tr><th>N</th><th>d</th><th>naive ms</th><th>tiled ms</th><th>measured naive ÷ tiled</th>"
            "<th>median of pairs</th><th>predicted naive ms</th><th>predicted tiled ms</th>"
            "<th>predicted naive ÷ tiled</th><th>naive's N×N matrix</th></tr>")
    body = []
    for r in sorted(rows, key=lambda r: (r["head_dim"], r["seq_len"])):
        naive = _ms(r["naive_ms"]) if r.get("naive_fits", True) else "<span class=warn>does not fit</span>"
        gb = fmt_bytes(r["naive_gb"] * 1e9) if r.get("naive_gb") is not None else "—"
        body.append(f"<tr><td class=num>{r['seq_len']:,}</td><td class=num>{r['head_dim']}</td>"
                    f"<td class=num>{naive}</td><td class=num>{_ms(r['tiled_ms'])}</td>"
                    f"<td class=num><b>{_x(r['ratio'])}</b></td><td class=num>{_x(r.get('ratio_median'))}</td>"
                    f"<td class=num>{_ms(r['naive_pred_ms'])}</td><td class=num>{_ms(r['tiled_pred_ms'])}</td>"
                    f"<td class=num>{_x(plots.predicted_ratio(r))}</td><td class=num>{gb}</td></tr>")
    return f"<table>{head}{''.join(body)}</table>"


def _machine(data: dict) -> str:
    cpus = f", {data['logical_cpus']} logical CPUs" if data.get("logical_cpus") else ""
    return f"{data['machine']}{cpus}"


def _provenance(m: CpuMeasurement) -> str:
    """Which machine measured, when and how; for a committed record, that --cpu measures this one."""
    d = m.data
    gemm = f" GEMM: {html.escape(d['gemm'])}." if d.get("gemm") else ""
    prof = f" Predictions on the profile <code>{html.escape(d['profile'])}</code>." if d.get("profile") else ""
    if m.file is None:
        return (f"<p class=meta>Measured now, while this report was written, on this machine: "
                f"<b>{html.escape(_machine(d))}</b>.{gemm}{prof}</p>")
    when = f" on {html.escape(d['measured_at'])}" if d.get("measured_at") else ""
    cmd = f" (<code>{html.escape(d['command'])}</code>)" if d.get("command") else ""
    return (f"<p class=note>Measured on <b>{html.escape(_machine(d))}</b>{when}{cmd}: the committed record "
            f"<code>{html.escape(m.file)}</code>, not necessarily the machine that wrote this report. "
            f"<code>iosim report --cpu</code> measures this machine instead (about 50 s).</p>"
            f"<p class=meta>{gemm.strip()}{prof}</p>")


INTRO = (
    "<p>The seeds claim that tiling helps on CPUs too: about {claim:g}× from keeping blocks in L2/L3 "
    "(llama.cpp's flash-attention path). Here iosim's tiled kernel (<code>iosim.cpu</code>: the flash2 schedule "
    "in numba, calling NumPy's own BLAS) runs against NumPy's three steps (naive), fp32, one head, same inputs, "
    "one process, calls alternated; each time is the fastest of several calls. The prediction is the CPU model's "
    "(<code>iosim.simulate_cpu.simulate_cpu</code>) on a profile detected on the same machine, from rates measured "
    "apart from attention. Hardware cache counters are not readable on these machines: cache traffic is "
    "simulated, time is measured.</p>")


def _span(vals: list[float]) -> str:
    lo, hi = min(vals), max(vals)
    return f"{lo:.2f}×" if f"{lo:.2f}" == f"{hi:.2f}" else f"{lo:.2f}× to {hi:.2f}×"


def _summary(rows: list[dict], claim: float) -> str:
    meas = [r["ratio"] for r in rows if r.get("ratio") is not None]
    pred = [p for p in map(plots.predicted_ratio, rows) if p is not None]
    if not meas:
        return ""
    ns = f"N = {min(r['seq_len'] for r in rows):,} to {max(r['seq_len'] for r in rows):,}"
    p = f" (predicted {_span(pred)})" if pred else ""
    return f"<p>Measured naive ÷ tiled: {_span(meas)} over {ns}{p}; the seeds' claim is {claim:g}×.</p>"


def cpu_section(m: CpuMeasurement) -> tuple[str, int]:
    """The section's HTML and its number of figures (1)."""
    parts = [f'<section id="{SECTION_ID}"><h2>{TITLE}</h2>']
    d = m.data
    claim = float(d.get("seeds_claim", 2.0))
    parts += [INTRO.format(claim=claim), _provenance(m), _summary(d["rows"], claim)]
    fig = plots.cpu_ratio(d["rows"], seeds_claim=claim, machine=_machine(d))
    div = fig.to_html(full_html=False, include_plotlyjs=False, div_id=f"fig-{SECTION_ID}", config=PLOTLY_CONFIG)
    parts.append(f"<figure>{div}<figcaption>Naive time ÷ tiled time against N: measured (solid; fastest calls), "
                 f"predicted by the CPU model (dashed) and the seeds' claim (dotted, {claim:g}×); above 1, "
                 "the tiled kernel is faster.</figcaption></figure>")
    parts.append(f"<h3>Measured and predicted times</h3><div class=wide>{cpu_table(d['rows'])}</div></section>")
    return "\n".join(parts), 1
