"""The serving figures: iosim's decode kernel's DRAM bandwidth against KV length, measured (contiguous cache and pages
of 16 tokens) beside the time model's prediction, as a share of the profile's calibrated DRAM read rate; MLA's
arithmetic intensity against GQA's beside the GPUs' ridges; torch's MLA decode attention measured beside its model;
a sliding window's bytes and time against full causal attention, simulated beside measured."""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .style import LEGEND, TEMPLATE, color, layout

BATCH_COLORS = ("#1f77b4", "#2ca02c", "#d62728", "#9467bd")


DECODE_LINES = (  # (layout, cache, dash, label) of the measured lines
    ("contig", "bf16", "solid", "contiguous"), ("16", "bf16", "dash", "pages of 16"),
    ("contig", "fp8", "dashdot", "fp8 cache, contiguous"))
PREDICTED_DASH = {"bf16": "dot", "fp8": "longdash"}


def decode_bandwidth(measured: dict, predicted: dict, title: str) -> go.Figure:
    """``measured``: {(batch, layout, cache): [(n, % of DRAM read)]}; ``predicted``: {(batch, cache): [(n, %)]}
    (contiguous); cache "bf16" or "fp8"."""
    fig = go.Figure()
    batches = sorted({key[0] for key in measured})
    for i, b in enumerate(batches):
        color = BATCH_COLORS[i % len(BATCH_COLORS)]
        for lay, cache, dash, label in DECODE_LINES:
            pts = sorted(measured.get((b, lay, cache), []))
            if pts:
                fig.add_trace(go.Scatter(x=[p[0] for p in pts], y=[p[1] for p in pts], mode="lines+markers",
                                         name=f"batch {b}, {label} (measured)", line={"color": color, "dash": dash},
                                         hovertemplate=f"batch {b}, {label}<br>n=%{{x}}<br>%{{y:.1f}}%<extra></extra>"))
        for cache, dash in PREDICTED_DASH.items():
            pts = sorted(predicted.get((b, cache), []))
            if pts:
                name = f"batch {b}, {'fp8 cache, ' if cache == 'fp8' else ''}contiguous (predicted)"
                fig.add_trace(go.Scatter(x=[p[0] for p in pts], y=[p[1] for p in pts], mode="lines", name=name,
                                         line={"color": color, "dash": dash},
                                         hovertemplate=f"{name}<br>n=%{{x}}<br>%{{y:.1f}}%<extra></extra>"))
    fig = layout(fig, title, "keys per sequence n", "% of the calibrated DRAM read rate", log_x=True, log_y=False)
    ns = sorted({p[0] for pts in measured.values() for p in pts})
    fig.add_hline(y=100, line={"dash": "dot", "color": "#888"})
    return fig.update_xaxes(tickvals=ns, ticktext=[str(n) for n in ns])


def intensity_bars(cases: list[tuple[str, float]], ridges: list[tuple[str, float]], title: str) -> go.Figure:
    """FLOPs per DRAM byte of each (label, value) case as bars, each (label, ridge) as a horizontal line: a case
    over a line is bound by the tensor cores there, under it by DRAM."""
    fig = go.Figure(go.Bar(x=[c[0] for c in cases], y=[c[1] for c in cases], marker={"color": "#9467bd"},
                           text=[f"{c[1]:.0f}" for c in cases], textposition="outside", name="FLOPs per DRAM byte",
                           hovertemplate="%{x}<br>%{y:.1f} FLOP/B<extra></extra>"))
    ends = [cases[0][0], cases[-1][0]]
    for i, (label, ridge) in enumerate(ridges):  # in the legend: labels on the plot would overlap (214 beside 203)
        fig.add_trace(go.Scatter(x=ends, y=[ridge, ridge], mode="lines", name=f"ridge, {label}: {ridge:.0f}",
                                 line={"dash": ("dot", "dash", "dashdot", "longdash")[i % 4],
                                       "color": ("#1f77b4", "#ff7f0e")[i // 2 % 2]},
                                 hovertemplate=f"{label} ridge {ridge:.0f} FLOP/B<extra></extra>"))
    return layout(fig, title, "", "FLOPs per DRAM byte", log_x=False, log_y=True)


def window_against_full(simulated: list[tuple[int, float, float]], full: tuple[float, float],
                        measured: list[tuple[int, float]], title: str) -> go.Figure:
    """A sliding window's simulated ``global`` bytes and predicted time against the window (``simulated``: (keys,
    bytes, seconds)), full causal attention's (``full``: bytes, seconds) as dotted lines, and measured times
    (``measured``: (keys, seconds)) as markers."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("bytes SM↔L2 (simulated)", "time"))
    w = [s[0] for s in simulated]
    fig.add_trace(go.Scatter(x=w, y=[s[1] for s in simulated], mode="lines+markers", name="window, simulated",
                             line={"color": "#9467bd"}, legendgroup="sim"), row=1, col=1)
    fig.add_trace(go.Scatter(x=w, y=[s[2] for s in simulated], mode="lines+markers", name="window, predicted",
                             line={"color": "#9467bd"}, showlegend=False, legendgroup="sim"), row=1, col=2)
    if measured:
        fig.add_trace(go.Scatter(x=[m[0] for m in measured], y=[m[1] for m in measured], mode="markers",
                                 name="window, measured", marker={"color": "#d62728", "size": 10, "symbol": "x"}),
                      row=1, col=2)
    for col, value in ((1, full[0]), (2, full[1])):
        fig.add_trace(go.Scatter(x=[w[0], w[-1]], y=[value, value], mode="lines", name="full causal attention",
                                 line={"color": "#888", "dash": "dot"}, showlegend=col == 1), row=1, col=col)
    fig.update_layout(template=TEMPLATE, title={"text": title, "x": 0.01, "xanchor": "left"}, height=420,
                      legend=LEGEND, margin={"l": 70, "r": 20, "t": 80, "b": 60})
    fig.update_xaxes(type="log", title="window (keys)", showline=True, mirror=True, linecolor="#888", tickvals=w,
                     ticktext=[str(x) for x in w])
    fig.update_yaxes(type="log", showline=True, mirror=True, linecolor="#888", exponentformat="SI")
    fig.update_yaxes(title="bytes", row=1, col=1)
    return fig.update_yaxes(title="seconds", row=1, col=2)



def varlen_against_padded(bars: dict[str, list[tuple[str, float]]], work: list[tuple[str, float]],
                          title: str) -> go.Figure:
    """Measured padded ÷ varlen time per batch (``bars``: {kernel: [(batch label, ratio)]}) beside the ratio of the
    (query, key) pairs the padded batch computes to the packed batch's (``work``): what padding wastes."""
    fig = go.Figure()
    for kernel, pts in bars.items():
        fig.add_trace(go.Bar(x=[p[0] for p in pts], y=[p[1] for p in pts], name=f"measured, {kernel}",
                             marker={"color": color(kernel)}, hovertemplate="%{x}<br>%{y:.2f}×<extra></extra>"))
    fig.add_trace(go.Scatter(x=[w[0] for w in work], y=[w[1] for w in work], mode="markers",
                             name="pairs computed, padded ÷ packed",
                             marker={"color": "#333", "symbol": "diamond", "size": 9},
                             hovertemplate="%{x}<br>%{y:.2f}× the pairs<extra></extra>"))
    fig.update_layout(barmode="group")
    return layout(fig, title, "", "padded ÷ varlen", log_x=False, log_y=True)


def mla_time(rows: list[tuple[str, float, float | None, float]], title: str,
             roofline_name: str = "roofline of the counts (FlashMLA's design)",
             x_title: str = "sequences x cached keys") -> go.Figure:
    """Torch's MLA attention (decode, or prefill) per shape, each ``(label, measured ms, model ms or None, roofline
    ms)``: the measured time beside its model's (where the profile measured what it needs) and the roofline of the
    schedule's counts (``roofline_name``), grouped bars on a log axis."""
    labels = [r[0] for r in rows]
    fig = go.Figure()
    series = (("measured", [r[1] for r in rows], "#d62728"), ("model", [r[2] for r in rows], "#1f77b4"),
              (roofline_name, [r[3] for r in rows], "#7f7f7f"))
    for name, values, shade in series:
        if all(v is None for v in values):
            continue
        fig.add_trace(go.Bar(x=labels, y=values, name=name, marker={"color": shade},
                             hovertemplate=f"%{{x}}<br>{name}: %{{y:.3f}} ms<extra></extra>"))
    fig.update_layout(barmode="group")
    return layout(fig, title, x_title, "ms", log_x=False, log_y=True)
