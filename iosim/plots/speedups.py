"""Measured speedups over standard attention on one GPU: torch's standard attention time ÷ each fused kernel's
time against N, beside the time model's predicted speedup and the seeds' claims.

Rows are plain dicts (``iosim.report.speedups`` reads them from the committed records; this module never reads a
file): measured ``{backend, head_dim, causal, seq_len, speedup, ms, standard_ms}``, predicted ``{kernel, backend,
head_dim, causal, seq_len, speedup, s, standard_s}``. One panel per head dim; colour = kernel, line style =
non-causal (solid) or causal (dashed), predicted = dotted with open markers. The claims are traces, not shapes, so
that they are in the figure's CSV like every point.
"""

from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .style import LEGEND, TEMPLATE, color, log_ticks

# The seeds' claims about time, as the report draws and judges them.
FA_CLAIM = (2.0, 4.0)  # FlashAttention 2-4x faster than standard attention
FA_CLAIM_TEXT = "FlashAttention 2-4× faster than standard attention"
FA3_CLAIM = (1.5, 2.0)  # FA3-class (cuDNN) 1.5-2x FA2
FA3_CLAIM_TEXT = "FA3-class (cuDNN) 1.5-2× FA2"
SHORT_N = 256  # standard attention wins below ~256 tokens
SHORT_TEXT = "standard attention wins below ~256 tokens"

# backend (docs/benchmarks.md's names) -> legend name and colour
BACKENDS = {
    "sdpa-flash": ("FA2 (sdpa-flash)", "#1f77b4"),
    "sdpa-cudnn": ("cuDNN (sdpa-cudnn)", color("flash3")),  # an FA3-class Hopper kernel
    "iosim-flash2": ("iosim flash2", color("flash2")),
}
CLAIM_GREY = "#7f7f7f"


@dataclass(frozen=True)
class SpeedupFigure:
    gpu: str  # "H100"
    measured: list[dict]
    predicted: list[dict]
    measured_by: str = ""  # which run: device, commit, date
    predicted_by: str = ""  # the time model's calibration, in words


def n_label(n: int) -> str:
    """256, 512, 1k ... 16k (k = 1024 tokens)."""
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else f"{n:,}"


def _case(r: dict) -> str:
    return f"N={r['seq_len']:,}, d={r['head_dim']}, {'causal' if r['causal'] else 'non-causal'}"


def _mask(causal: bool) -> str:
    return "causal" if causal else "non-causal"


def _series(rows: list[dict]):
    """(backend, name, colour, causal, points by N) of each backend and mask that has points."""
    for backend, (name, colour) in BACKENDS.items():
        for causal in (False, True):
            pts = sorted((r for r in rows if r["backend"] == backend and r["causal"] == causal),
                         key=lambda r: r["seq_len"])
            if pts:
                yield backend, name, colour, causal, pts


def _measured(fig: go.Figure, rows: list[dict], col: int, shown: set) -> None:
    for backend, name, colour, causal, pts in _series(rows):
        key = f"{backend}-{causal}"
        fig.add_trace(go.Scatter(
            x=[r["seq_len"] for r in pts], y=[r["speedup"] for r in pts], name=f"{name}, {_mask(causal)}",
            mode="lines+markers", legendgroup=key, showlegend=key not in shown,
            line={"color": colour, "dash": "dash" if causal else "solid"},
            marker={"color": colour, "size": 7, "symbol": "triangle-up" if causal else "circle"},
            text=[f"<b>{name}</b>, measured: {r['speedup']:.3g}× standard attention<br>{_case(r)}<br>"
                  f"torch-standard {r['standard_ms']:.4g} ms ÷ {backend} {r['ms']:.4g} ms" for r in pts],
            hovertemplate="%{text}<extra></extra>"), row=1, col=col)
        shown.add(key)


def _predicted(fig: go.Figure, rows: list[dict], col: int, shown: set) -> None:
    for backend, name, colour, causal, pts in _series(rows):
        key = f"pred-{backend}-{causal}"
        fig.add_trace(go.Scatter(
            x=[r["seq_len"] for r in pts], y=[r["speedup"] for r in pts],
            name=f"{name.split(' (')[0]} predicted, {_mask(causal)}", mode="lines+markers",
            legendgroup=key, showlegend=key not in shown, line={"color": colour, "dash": "dot", "width": 1.5},
            marker={"color": colour, "size": 7, "symbol": "triangle-up-open" if causal else "circle-open"},
            text=[f"<b>{name}</b>, predicted: {r['speedup']:.3g}× standard attention<br>{_case(r)}<br>"
                  f"the time model's iosim-naive {r['standard_s'] * 1e3:.4g} ms ÷ {r['kernel']} "
                  f"{r['s'] * 1e3:.4g} ms" for r in pts],
            hovertemplate="%{text}<extra></extra>"), row=1, col=col)
        shown.add(key)


def _claims(fig: go.Figure, rows: list[dict], xs: tuple[float, float], ys: tuple[float, float], col: int,
            shown: set) -> None:
    """The 2-4x band, the 1.5-2x band over FA2's measured non-causal line, the line at N = 256."""
    lo, hi = xs
    fig.add_trace(go.Scatter(
        x=[lo, hi, hi, lo, lo], y=[FA_CLAIM[0], FA_CLAIM[0], FA_CLAIM[1], FA_CLAIM[1], FA_CLAIM[0]],
        fill="toself", fillcolor="rgba(127,127,127,0.16)", line={"width": 0}, mode="lines",
        name=f"claim: {FA_CLAIM_TEXT}", legendgroup="claim-fa", showlegend="claim-fa" not in shown,
        text=[f"the seeds' claim: {FA_CLAIM_TEXT}"] * 5, hoverinfo="text", hoveron="fills+points"), row=1, col=col)
    shown.add("claim-fa")
    fa2 = sorted((r for r in rows if r["backend"] == "sdpa-flash" and not r["causal"]), key=lambda r: r["seq_len"])
    if fa2:
        x = [r["seq_len"] for r in fa2]
        fig.add_trace(go.Scatter(
            x=x + x[::-1] + x[:1], y=[r["speedup"] * FA3_CLAIM[0] for r in fa2]
            + [r["speedup"] * FA3_CLAIM[1] for r in fa2[::-1]] + [fa2[0]["speedup"] * FA3_CLAIM[0]],
            fill="toself", fillcolor="rgba(148,103,189,0.14)", line={"width": 0}, mode="lines",
            name=f"claim: {FA3_CLAIM_TEXT} (on FA2's non-causal line)", legendgroup="claim-fa3",
            showlegend="claim-fa3" not in shown, hoverinfo="text", hoveron="fills+points",
            text=[f"the seeds' claim: {FA3_CLAIM_TEXT}: cuDNN's non-causal line should lie in this band"]
            * (2 * len(x) + 1)), row=1, col=col)
        shown.add("claim-fa3")
    fig.add_trace(go.Scatter(
        x=[SHORT_N, SHORT_N], y=list(ys), mode="lines+markers", line={"color": CLAIM_GREY, "dash": "dashdot"},
        marker={"symbol": "line-ew-open", "size": 10, "color": CLAIM_GREY},
        name=f"claim: {SHORT_TEXT} (N = {SHORT_N})", legendgroup="claim-short",
        showlegend="claim-short" not in shown,
        text=[f"the seeds' claim: {SHORT_TEXT}: below 1× left of this line"] * 2,
        hovertemplate="%{text}<extra></extra>"), row=1, col=col)
    shown.add("claim-short")


def _subtitle(sf: SpeedupFigure) -> str:
    """Which run was measured, and on what the model's rates were measured: one line each, wrapped for 800 px."""
    lines = [f"measured: {sf.measured_by}" if sf.measured_by else "measured: no run with torch-standard recorded"]
    if sf.predicted:
        lines.append(f"predicted (dotted): iosim's time model, iosim-naive ÷ fa2 or cudnn; {sf.predicted_by}")
    return "<br>".join(w for line in lines for w in textwrap.wrap(line, 92))


def speedups(sf: SpeedupFigure, title: str | None = None) -> go.Figure:
    """Speedup over standard attention against N (log-log), one panel per head dim: measured (solid: non-causal,
    dashed: causal), predicted (dotted), the claims (bands and the line at N = 256); 1 = as fast."""
    rows = sf.measured + sf.predicted
    dims = sorted({r["head_dim"] for r in rows}) or [None]
    fig = make_subplots(rows=1, cols=len(dims), shared_yaxes=True, horizontal_spacing=0.04,
                        subplot_titles=[f"d = {d}" if d else "" for d in dims])
    ns = sorted({r["seq_len"] for r in rows}) or [SHORT_N]
    xs = (min(ns[0], SHORT_N) / 1.25, ns[-1] * 1.25)
    vals = [r["speedup"] for r in rows] or [1.0]
    ys = (min(0.8, min(vals) / 1.2), max(FA_CLAIM[1], max(vals)) * 1.3)
    shown: set = set()
    for col, d in enumerate(dims, 1):
        mine = [r for r in sf.measured if r["head_dim"] == d]
        _claims(fig, mine, xs, ys, col, shown)
        _measured(fig, mine, col, shown)
        _predicted(fig, [r for r in sf.predicted if r["head_dim"] == d], col, shown)
    title = title or f"{sf.gpu}: speedup over standard attention"
    sub = _subtitle(sf)
    top = 30 + 24 + 22 * (sub.count("<br>") + 1) + 24  # below the mode bar: the title, its lines, panel titles
    fig.update_layout(template=TEMPLATE, height=520 + top,
                      title={"text": f"{title}<br><sup>{sub}</sup>", "x": 0.01, "xanchor": "left", "y": 1,
                             "yref": "container", "yanchor": "top", "pad": {"t": 30}},
                      legend={**LEGEND, "orientation": "h", "x": 0, "xanchor": "left", "y": -0.16, "yanchor": "top"},
                      hoverlabel={"align": "left"}, margin={"l": 70, "r": 20, "t": top, "b": 40})
    fig.update_annotations(font_size=13, yshift=4)  # the panel titles
    fig.add_annotation(text="sequence length N (tokens)", x=0.5, xref="paper", y=0, yref="paper", yshift=-28,
                       yanchor="top", showarrow=False, font={"size": 14})
    fig.add_hline(y=1, line={"color": "#bbb", "width": 1})
    fig.update_xaxes(type="log", range=[math.log10(xs[0]), math.log10(xs[1])], tickvals=ns, ticktext=[n_label(n) for n in ns],
                     showline=True, mirror=True, linecolor="#888")
    fig.update_yaxes(type="log", range=[math.log10(ys[0]), math.log10(ys[1])], showline=True, mirror=True, linecolor="#888")
    fig.update_yaxes(title="standard time ÷ kernel time (log)", row=1, col=1)
    return log_ticks(fig, {"yaxis": "×", "yaxis2": "×"})
