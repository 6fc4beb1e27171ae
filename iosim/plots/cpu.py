"""Attention on a CPU: the measured naive ÷ tiled time against N, beside the CPU model's predicted ratio and the
seeds' claim.

The rows are ``iosim.cpu.compare``'s (``seq_len, head_dim, naive_ms, tiled_ms, ratio, ratio_median,
naive_pred_ms, tiled_pred_ms ...``) as plain dicts, from a committed record or measured now; this module never
measures. The claim is a trace, not a shape, so that it is in the figure's CSV like every other point.
"""

from __future__ import annotations

import plotly.graph_objects as go

from .style import color, layout

MEASURED_COLOR = color("flash2")  # the tiled kernel runs the flash2 schedule
CLAIM_COLOR = "#7f7f7f"


def predicted_ratio(row: dict) -> float | None:
    """naive_pred_ms ÷ tiled_pred_ms, or None where the profile gives no predicted time."""
    n, t = row.get("naive_pred_ms"), row.get("tiled_pred_ms")
    return n / t if n and t else None


def _hover(r: dict, what: str, y: float) -> str:
    def ms(v):
        return "n/a" if v is None else f"{v:.4g} ms"

    return (f"<b>{what}</b>: {y:.3g}×<br>N={r['seq_len']:,}, d={r['head_dim']}, fp32, one head"
            f"{', causal' if r.get('causal') else ''}<br>measured: naive {ms(r.get('naive_ms'))}, "
            f"tiled {ms(r.get('tiled_ms'))}<br>predicted: naive {ms(r.get('naive_pred_ms'))}, "
            f"tiled {ms(r.get('tiled_pred_ms'))}")


def cpu_ratio(rows: list[dict], seeds_claim: float = 2.0, machine: str | None = None,
              title: str = "Attention on a CPU: naive time ÷ tiled time") -> go.Figure:
    """Measured naive/tiled ratio (fastest calls) and the model's predicted ratio against N, one pair of lines per
    head dim, and the seeds' claim as a horizontal line; above 1, tiling is faster."""
    fig = go.Figure()
    dims = sorted({r["head_dim"] for r in rows})
    for d in dims:
        mine = sorted((r for r in rows if r["head_dim"] == d), key=lambda r: r["seq_len"])
        tag = f", d={d}" if len(dims) > 1 else ""
        meas = [r for r in mine if r.get("ratio") is not None]
        fig.add_trace(go.Scatter(
            x=[r["seq_len"] for r in meas], y=[r["ratio"] for r in meas], name=f"measured{tag}",
            mode="lines+markers", line={"color": MEASURED_COLOR}, marker={"size": 8},
            text=[_hover(r, "measured", r["ratio"]) for r in meas], hovertemplate="%{text}<extra></extra>"))
        pred = [(r, predicted_ratio(r)) for r in mine if predicted_ratio(r) is not None]
        fig.add_trace(go.Scatter(
            x=[r["seq_len"] for r, _ in pred], y=[p for _, p in pred], name=f"predicted (CPU model){tag}",
            mode="lines+markers", line={"color": MEASURED_COLOR, "dash": "dash"},
            marker={"size": 7, "symbol": "diamond-open"},
            text=[_hover(r, "predicted", p) for r, p in pred], hovertemplate="%{text}<extra></extra>"))
    xs = sorted({r["seq_len"] for r in rows})
    fig.add_trace(go.Scatter(
        x=[xs[0], xs[-1]] if xs else [], y=[seeds_claim, seeds_claim] if xs else [],
        name=f"seeds' claim ({seeds_claim:g}×)", mode="lines", line={"color": CLAIM_COLOR, "dash": "dot"},
        text=[f"the seeds' claim: tiling about {seeds_claim:g}× faster on CPUs"] * (2 if xs else 0),
        hovertemplate="%{text}<extra></extra>"))
    fig.add_hline(y=1, line={"color": "#bbb", "width": 1})
    if machine:
        title += f"<br><sup>{machine}</sup>"
    layout(fig, title, "sequence length N (tokens)", "naive time ÷ tiled time (1 = as fast)", log_y=False)
    fig.update_xaxes(tickvals=xs, ticktext=[f"{x:,}" for x in xs])  # the measured N, not 2k, 5k, 10k
    fig.update_yaxes(rangemode="tozero")
    return fig.update_layout(margin_t=80 if machine else 60)
