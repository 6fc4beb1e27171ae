"""The roofline: attainable FLOP/s against arithmetic intensity, one panel per profile, under its ceilings."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..units import fmt_rate, fmt_seconds
from .records import hover
from .style import LEGEND, TEMPLATE, color, log_ticks
from .timing import time_hover


def roofline(records: list[dict], profiles: dict, title: str = "Roofline") -> go.Figure:
    """Arithmetic intensity (FLOPs per DRAM byte) against attainable FLOP/s, one point per schedule and size,
    with the ceilings of each profile: the matmul peak of the dtype, and DRAM and L2 bandwidth × intensity.
    The points' FLOP/s are FLOPs ÷ predicted time, whose model and calibration each hover text names.
    One panel per profile, side by side on a shared y axis; one x-axis title under all of them and the
    legend below, so that narrow pages keep the panels wide."""
    names = sorted({r["profile"] for r in records})
    fig = make_subplots(rows=1, cols=max(1, len(names)), shared_yaxes=True,
                        subplot_titles=[profiles.get(n, {}).get("display_name", n) for n in names],
                        horizontal_spacing=0.03)
    shown: set = set()
    rows_ok = [r for r in records if r.get("arithmetic_intensity") and r.get("predicted_s")]
    ai_all = [r["arithmetic_intensity"] for r in rows_ok] or [1.0, 1000.0]
    span = (min(ai_all) / 3, max(ai_all) * 3)
    for col, name in enumerate(names, 1):
        dtypes = sorted({r["dtype"] for r in records if r["profile"] == name})
        _ceilings(fig, _Panel(name, profiles.get(name, {}), col), dtypes, span, shown)
        _points(fig, _Panel(name, profiles.get(name, {}), col), rows_ok, shown)
    fig.update_layout(template=TEMPLATE, title={"text": title, "x": 0.01}, height=520, legend=LEGEND,
                      margin={"l": 70, "r": 20, "t": 80, "b": 40})
    fig.update_layout(legend={"orientation": "h", "x": 0, "xanchor": "left", "y": -0.2, "yanchor": "top"})
    fig.update_annotations(font_size=13)  # the panel titles
    fig.add_annotation(text="arithmetic intensity (FLOP per DRAM byte)", x=0.5, xref="paper", y=0, yref="paper",
                       yshift=-28, yanchor="top", showarrow=False, font={"size": 14})
    fig.update_xaxes(type="log", showline=True, mirror=True, linecolor="#888")
    fig.update_yaxes(type="log", exponentformat="SI", showline=True, mirror=True, linecolor="#888")
    fig.update_yaxes(title="attainable FLOP/s", row=1, col=1)
    return log_ticks(fig)


@dataclass
class _Panel:
    name: str  # the profile
    prof: dict  # its summary (iosim.scenario.profile_summary)
    col: int


def _ceilings(fig: go.Figure, panel: _Panel, dtypes: list[str], span: tuple[float, float], shown: set) -> None:
    """The matmul peak of each dtype, and DRAM and L2 bandwidth × intensity."""
    lo, hi = span
    xs = np.geomspace(lo, hi, 64)
    for dt in dtypes:
        peak = (panel.prof.get("matmul") or {}).get(dt)
        if peak:
            fig.add_trace(go.Scatter(x=[lo, hi], y=[peak, peak], mode="lines", line={"color": "#444", "width": 1},
                                     name=f"matmul peak ({dt})", legendgroup="peak", showlegend="peak" not in shown,
                                     hovertemplate=f"{panel.name}: matmul peak {dt} = {fmt_rate(peak, 'FLOP/s')}"
                                                   "<extra></extra>"), row=1, col=panel.col)
            shown.add("peak")
    for key, label, dash in (("dram_bandwidth", "DRAM bandwidth × intensity", "dash"),
                             ("l2_bandwidth", "L2 bandwidth × intensity (for global bytes)", "dot")):
        bw = panel.prof.get(key)
        if bw:
            fig.add_trace(go.Scatter(x=xs, y=xs * bw, mode="lines", line={"color": "#888", "dash": dash},
                                     name=label, legendgroup=key, showlegend=key not in shown,
                                     hovertemplate=f"{panel.name}: {label}, bandwidth {fmt_rate(bw, 'B/s')}"
                                                   "<extra></extra>"), row=1, col=panel.col)
            shown.add(key)


def _points(fig: go.Figure, panel: _Panel, rows_ok: list[dict], shown: set) -> None:
    """One line of points per schedule, in order of N."""
    mine = [r for r in rows_ok if r["profile"] == panel.name]
    for sched in sorted({r["schedule"] for r in mine}):
        pts = sorted((r for r in mine if r["schedule"] == sched), key=lambda r: r["seq_len"])
        fig.add_trace(go.Scatter(
            x=[r["arithmetic_intensity"] for r in pts], y=[r["attained_flops_per_s"] for r in pts],
            mode="markers+lines", line={"color": color(sched), "width": 1}, marker={"color": color(sched), "size": 8},
            name=sched, legendgroup=sched, showlegend=sched not in shown,
            text=[hover(r, [f"arithmetic intensity: {r['arithmetic_intensity']:.4g} FLOP/B (DRAM bytes)",
                            f"attainable (model): {fmt_rate(r['attained_flops_per_s'], 'FLOP/s')}",
                            f"bound by {r['bound']}, predicted {fmt_seconds(r['predicted_s'])}",
                            time_hover(r)]) for r in pts],
            hovertemplate="%{text}<extra></extra>"), row=1, col=panel.col)
        shown.add(sched)
