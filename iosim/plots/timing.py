"""Predicted time against sequence length, absolute or relative to one schedule."""

from __future__ import annotations

import plotly.graph_objects as go

from ..units import fmt_seconds
from .records import bytes_hover, case_key, hover, label, length_axis, profile_symbols, series
from .style import color, layout


def time_vs_n(records: list[dict], title: str = "Predicted time vs sequence length",
              relative_to: str | None = None) -> go.Figure:
    """Predicted time (roofline model) against N, log-log, one line per schedule and profile; with
    ``relative_to`` (a schedule), each time divided by that schedule's time on the same problem and profile."""
    fig = go.Figure()
    symbols = profile_symbols(records)
    xf, xtitle = length_axis(records)
    base = {}
    if relative_to:
        base = {case_key(r): r["predicted_s"] for r in records if r["schedule"] == relative_to}
    for ident, rows in series(records, xf):
        rows = [r for r in rows if r.get("predicted_s") and (not relative_to or base.get(case_key(r)))]
        if not rows:
            continue
        sched = rows[0]["schedule"]
        ys = [r["predicted_s"] / base[case_key(r)] if relative_to else r["predicted_s"] for r in rows]
        fig.add_trace(go.Scatter(
            x=[r[xf] for r in rows], y=ys, name=label(ident, schedule=sched),
            mode="lines+markers", line={"color": color(sched), "dash": _dash(sched, ident, relative_to)},
            marker={"symbol": symbols[rows[0]["profile"]], "size": 7},
            text=[hover(r, [f"predicted: {fmt_seconds(r['predicted_s'])} ({r['predicted_s']:.6g} s), "
                             f"bound by {r['bound']}"]
                         + ([f"{y:.3g}× the time of {relative_to}"] if relative_to else [])
                         + [f"global: {bytes_hover(r['global_bytes'])}, hbm: {bytes_hover(r['hbm_bytes'])}",
                            f"FLOPs: {r['flops_total']:,}"]) for r, y in zip(rows, ys)],
            hovertemplate="%{text}<extra></extra>"))
    if not relative_to:
        return layout(fig, title, xtitle, "predicted time (s)", units={"yaxis": "s"})
    if "÷" not in title:  # a title that says time over an axis that is a ratio: say so under it
        title += f"<br><sup>y: each schedule's predicted time ÷ {relative_to}'s on the same problem</sup>"
    layout(fig, title, xtitle, f"time ÷ {relative_to}'s (1 = as fast)", log_y=False)
    return fig.update_layout(margin_t=80)


def _dash(schedule: str, ident: dict, relative_to: str | None) -> str:
    """Dotted: the schedule the others are divided by; dashed: causal, where causal and not share a figure."""
    if schedule == relative_to:
        return "dot"
    return "dash" if ident.get("causal") else "solid"
