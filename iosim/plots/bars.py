"""Grouped bars: one metric against the values of one field (the Flash-Decoding sweep, causal or not ...)."""

from __future__ import annotations

import math

import plotly.graph_objects as go

from ..units import fmt_seconds
from .records import GROUP_FIELDS, bytes_hover, follows, hover, label, series, varying
from .style import color, layout, si, tick_values
from .timing import time_hover, with_time_source


def bars(records: list[dict], x: str, metric: str = "global_bytes", title: str | None = None) -> go.Figure:
    """Grouped bars: ``metric`` against the values of field ``x``, one colour per schedule. Fields that move
    with ``x`` (batch where batch × kv_len is fixed) label the category instead of splitting the bars; values
    spanning ten times or more go on a log axis, so that the short bars stay readable. Predicted time
    (``predicted_s``) says under the title whose model it is and on what it was calibrated."""
    fig = go.Figure()
    along = [f for f in varying(records, GROUP_FIELDS) if f != x and follows(records, f, x)]
    for ident, rows in series(records, x):
        sched = rows[0]["schedule"]
        fig.add_trace(go.Bar(
            x=[_cat(x, r, along) for r in rows], y=[r.get(metric) for r in rows],
            name=label(ident, schedule=sched), marker={"color": color(sched)},
            text=[hover(r, [f"{metric}: {_metric_hover(metric, r.get(metric))}"]
                        + ([time_hover(r)] if metric == "predicted_s" else [])) for r in rows],
            textposition="none", hovertemplate="%{text}<extra></extra>"))
    fig.update_layout(barmode="group")
    values = [r.get(metric) for r in records if r.get(metric) is not None]
    log_y = bool(values) and min(values) > 0 and max(values) >= 10 * min(values)
    y = _METRIC_AXIS.get(metric, metric) + (", log scale" if log_y else "")
    unit = {"predicted_s": "s", "energy_j": "J"}.get(metric, "B" if metric.endswith("_bytes") else "")
    title = title or f"{metric} by {x}"
    layout(fig, title, _cat_title(x, along), y, log_x=False, log_y=log_y, log_x_type="category", units={"yaxis": unit})
    if metric == "predicted_s":
        with_time_source(fig, title, records)
    if log_y:  # start the axis well below the shortest bar, so that every bar has a visible length
        lo, hi = min(values) / 4, max(values) * 1.3
        ticks = tick_values(lo, hi)
        fig.update_yaxes(range=[math.log10(lo), math.log10(hi)], tickvals=ticks, ticktext=[si(t, unit) for t in ticks])
    return fig


def _cat_title(x: str, along: list[str]) -> str:
    return x + "".join(f" (with {f})" for f in along)


def _cat(field: str, r: dict, along: list[str]) -> str:
    if field == "causal":
        return "causal" if r[field] else "non-causal"
    return f"{field}={r[field]}" + "".join(f"<br>{f}={r[f]}" for f in along)


_METRIC_AXIS = {"global_bytes": "global bytes (decimal)", "hbm_bytes": "hbm bytes (decimal)",
                "sram_bytes": "sram bytes (decimal)", "predicted_s": "predicted time (s)",
                "compulsory_bytes": "compulsory bytes", "flops_total": "FLOPs",
                "global_over_compulsory": "global ÷ compulsory", "hbm_over_compulsory": "hbm ÷ compulsory",
                "energy_j": "predicted energy a call (J)"}


def _metric_hover(metric: str, v) -> str:
    if v is None:
        return "n/a"
    if metric.endswith("_bytes"):
        return bytes_hover(v)
    if metric == "predicted_s":
        return f"{fmt_seconds(v)} ({v:.6g} s)"
    if metric == "energy_j":
        return f"{v:.4g} J"
    return f"{v:,.6g}"
