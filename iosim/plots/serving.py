"""The serving figure: iosim's decode kernel's DRAM bandwidth against KV length, measured (contiguous cache and pages
of 16 tokens) beside the time model's prediction, as a share of the profile's calibrated DRAM read rate."""

from __future__ import annotations

import plotly.graph_objects as go

from .style import layout

BATCH_COLORS = ("#1f77b4", "#2ca02c", "#d62728", "#9467bd")


def decode_bandwidth(measured: dict, predicted: dict, title: str) -> go.Figure:
    """``measured``: {(batch, layout): [(n, % of DRAM read)]}; ``predicted``: {batch: [(n, %)]} (contiguous)."""
    fig = go.Figure()
    batches = sorted({b for b, _ in measured})
    for i, b in enumerate(batches):
        color = BATCH_COLORS[i % len(BATCH_COLORS)]
        for lay, dash, label in (("contig", "solid", "contiguous"), ("16", "dash", "pages of 16")):
            pts = sorted(measured.get((b, lay), []))
            if pts:
                fig.add_trace(go.Scatter(x=[p[0] for p in pts], y=[p[1] for p in pts], mode="lines+markers",
                                         name=f"batch {b}, {label} (measured)", line={"color": color, "dash": dash},
                                         hovertemplate=f"batch {b}, {label}<br>n=%{{x}}<br>%{{y:.1f}}%<extra></extra>"))
        pts = sorted(predicted.get(b, []))
        if pts:
            fig.add_trace(go.Scatter(x=[p[0] for p in pts], y=[p[1] for p in pts], mode="lines",
                                     name=f"batch {b}, contiguous (predicted)", line={"color": color, "dash": "dot"},
                                     hovertemplate=f"batch {b}, predicted<br>n=%{{x}}<br>%{{y:.1f}}%<extra></extra>"))
    fig = layout(fig, title, "keys per sequence n", "% of the calibrated DRAM read rate", log_x=True, log_y=False)
    ns = sorted({p[0] for pts in measured.values() for p in pts})
    fig.add_hline(y=100, line={"dash": "dot", "color": "#888"})
    return fig.update_xaxes(tickvals=ns, ticktext=[str(n) for n in ns])
