"""The training figure: measured forward + backward speedup over standard attention against N, per backend, beside
the simulated traffic ratio (standard ÷ FlashAttention-2, forward + backward, `global` bytes) and the seeds' 2-4×."""

from __future__ import annotations

import plotly.graph_objects as go

from .speedups import FA_CLAIM, FA_CLAIM_TEXT
from .style import layout

BACKENDS = {"sdpa-flash": "torch SDPA flash (FA2)", "sdpa-cudnn": "torch SDPA cuDNN", "iosim-flash2": "iosim flash2",
            "torch-math": "torch SDPA math"}
COLORS = {"sdpa-flash": "#1f77b4", "sdpa-cudnn": "#2ca02c", "iosim-flash2": "#d62728", "torch-math": "#8c8c8c"}


def training(rows: list[dict], traffic: dict[int, float], title: str) -> go.Figure:
    """``rows``: the record's rows of one run (seq_len, backend, speedup); ``traffic``: {N: simulated naive ÷ flash2
    bytes}."""
    fig = go.Figure()
    ns = sorted({int(r["seq_len"]) for r in rows})
    for backend, label in BACKENDS.items():
        pts = sorted((int(r["seq_len"]), float(r["speedup"])) for r in rows if r["backend"] == backend)
        if pts:
            fig.add_trace(go.Scatter(x=[p[0] for p in pts], y=[p[1] for p in pts], name=label, mode="lines+markers",
                                     line={"color": COLORS[backend]},
                                     hovertemplate=f"{label}<br>N=%{{x}}<br>%{{y:.2f}}× standard<extra></extra>"))
    if traffic:
        fig.add_trace(go.Scatter(x=list(traffic), y=list(traffic.values()), name="simulated bytes, standard ÷ flash2",
                                 mode="lines", line={"dash": "dot", "color": "#444"},
                                 hovertemplate="N=%{x}<br>%{y:.1f}× fewer global bytes<extra></extra>"))
    if ns:
        fig.add_trace(go.Scatter(x=[ns[0], ns[-1], ns[-1], ns[0]], y=[FA_CLAIM[0], FA_CLAIM[0], FA_CLAIM[1], FA_CLAIM[1]],
                                 fill="toself", mode="lines", line={"width": 0}, fillcolor="rgba(120,120,120,0.15)",
                                 name=FA_CLAIM_TEXT, hoverinfo="skip"))
    fig = layout(fig, title, "sequence length N", "speedup over standard attention (×)", log_x=True, log_y=True)
    return fig.update_xaxes(tickvals=ns, ticktext=[str(n) for n in ns])
