"""The FP8 forward figure: measured TFLOP/s against N, one panel per head dim, FP8 beside bf16 for iosim's flash3 and
cuDNN (solid: non-causal, dashed: causal)."""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .speedups import n_label
from .style import LEGEND, TEMPLATE, color

# backend (docs/benchmarks' names) -> legend name, colour, marker: one hue per kernel family, fp8 dark and filled,
# bf16 light and open (the dash is the mask)
SERIES = {
    "iosim-flash3-fp8": ("iosim flash3, fp8", color("flash3"), "circle"),
    "cudnn-fp8": ("cuDNN, fp8", "#1b7837", "square"),
    "iosim-flash3": ("iosim flash3, bf16", "#c5b0d5", "circle-open"),
    "sdpa-cudnn": ("cuDNN, bf16", "#98df8a", "square-open"),
}


def fp8_throughput(points: list[dict], title: str) -> go.Figure:
    """``points``: {backend, head_dim, causal, seq_len, tflops} (backends of :data:`SERIES`); one panel per head dim,
    log N, linear TFLOP/s."""
    dims = sorted({p["head_dim"] for p in points}) or [None]
    fig = make_subplots(rows=1, cols=len(dims), shared_yaxes=True, horizontal_spacing=0.04,
                        subplot_titles=[f"d = {d}" if d else "" for d in dims])
    shown: set[str] = set()
    for col, d in enumerate(dims, 1):
        for backend, (name, colour, marker) in SERIES.items():
            for causal in (False, True):
                pts = sorted((p["seq_len"], p["tflops"]) for p in points
                             if p["backend"] == backend and p["head_dim"] == d and p["causal"] == causal)
                if not pts:
                    continue
                mask = "causal" if causal else "non-causal"
                fig.add_trace(go.Scatter(
                    x=[n for n, _ in pts], y=[t for _, t in pts], mode="lines+markers", name=name, legendgroup=name,
                    showlegend=name not in shown, line={"color": colour, "dash": "dash" if causal else "solid"},
                    marker={"symbol": marker, "size": 8},
                    hovertemplate=f"{name}, {mask}, d={d}<br>N=%{{x:,}}<br>%{{y:.1f}} TFLOP/s<extra></extra>"),
                    row=1, col=col)
                shown.add(name)
    ns = sorted({p["seq_len"] for p in points})
    fig.update_layout(template=TEMPLATE, height=520, title={"text": title, "x": 0.01, "xanchor": "left"},
                      legend={**LEGEND, "orientation": "h", "x": 0, "xanchor": "left", "y": -0.18, "yanchor": "top"},
                      hoverlabel={"align": "left"}, margin={"l": 70, "r": 20, "t": 80, "b": 60})
    fig.update_xaxes(type="log", tickvals=ns, ticktext=[n_label(n) for n in ns], showline=True, mirror=True,
                     linecolor="#888")
    fig.update_yaxes(showline=True, mirror=True, linecolor="#888", rangemode="tozero")
    fig.update_yaxes(title="TFLOP/s (4·N²·d·B·H / t, causal ÷ 2)", row=1, col=1)
    fig.add_annotation(text="sequence length N (tokens)", x=0.5, xref="paper", y=0, yref="paper", yshift=-28,
                       yanchor="top", showarrow=False, font={"size": 14})
    return fig
