"""How every figure looks: one colour per schedule, one dash per boundary, one symbol per profile, the common
layout, and log axes labelled at 1-2-5 steps in one format (decimal prefixes: 100k, 1M ... 1P, never 10¹⁵
beside 100T)."""

from __future__ import annotations

import math
import numbers

import plotly.graph_objects as go
import plotly.io as pio

TEMPLATE = pio.templates["plotly_white"]  # the object: a name is looked up and validated on every use
# One colour per schedule across every figure (schedules added later get the fallback cycle).
SCHEDULE_COLORS = {
    "naive": "#d62728", "flash1": "#1f77b4", "flash2": "#2ca02c", "flash3": "#9467bd",
    "flash-decoding": "#ff7f0e", "block-sparse": "#8c564b",
}
_FALLBACK = ["#17becf", "#bcbd22", "#e377c2", "#7f7f7f"]
BOUNDARY_DASH = {"global": "solid", "hbm": "dash", "sram": "dot"}
BOUNDARY_LABEL = {"global": "global (SM↔L2)", "hbm": "hbm (L2↔DRAM)", "sram": "sram (on chip)"}
PROFILE_SYMBOLS = ["circle", "square", "diamond", "triangle-up", "x", "star", "cross", "pentagon"]
LEGEND = {"title": None, "bgcolor": "rgba(255,255,255,0.85)", "font": {"size": 12}}
_PREFIX = {-15: "f", -12: "p", -9: "n", -6: "µ", -3: "m", 0: "", 3: "k", 6: "M", 9: "G", 12: "T", 15: "P",
           18: "E", 21: "Z"}


def color(schedule: str) -> str:
    if schedule in SCHEDULE_COLORS:
        return SCHEDULE_COLORS[schedule]
    return _FALLBACK[sum(map(ord, schedule)) % len(_FALLBACK)]


def layout(fig: go.Figure, title: str, x: str, y: str, log_x=True, log_y=True, log_x_type: str = "linear",
           units: dict | None = None) -> go.Figure:
    """Title, axis titles, framed axes and log ticks (``units``: see :func:`log_ticks`); call it after the
    traces are added."""
    fig.update_layout(
        template=TEMPLATE, title={"text": title, "x": 0.01, "xanchor": "left"}, height=460, legend=LEGEND,
        hoverlabel={"align": "left"}, margin={"l": 70, "r": 20, "t": 60, "b": 60},
    )
    fig.update_xaxes(title=x, type="log" if log_x else log_x_type, showline=True, mirror=True, linecolor="#888")
    fig.update_yaxes(title=y, type="log" if log_y else "linear", showline=True, mirror=True, linecolor="#888",
                     exponentformat="SI")
    return log_ticks(fig, units)


def si(v: float, unit: str = "") -> str:
    """``si(1e15) == '1P'``, ``si(2e-5, 's') == '20 µs'``, ``si(5e8, 'B') == '500 MB'``: one decimal prefix
    for every magnitude (plotly's own SI format stops at 100T and writes 10¹⁵ after it)."""
    if v == 0:
        return f"0{' ' + unit if unit else ''}"
    e = math.floor(math.log10(abs(v)) + 1e-9)
    e3 = max(min(3 * (e // 3), 21), -15)
    mant = f"{v / 10**e3:.3g}"
    return f"{mant} {_PREFIX[e3]}{unit}" if unit else f"{mant}{_PREFIX[e3]}"


def tick_values(lo: float, hi: float) -> list[float]:
    """Decades across [lo, hi]; 1-2-5 steps where the range spans three decades or fewer."""
    a, b = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    steps = (1,) if b - a > 3 else (1, 2, 5)
    return [m * 10.0**e for e in range(a, b + 1) for m in steps if lo <= m * 10.0**e <= hi]


def log_ticks(fig: go.Figure, units: dict | None = None) -> go.Figure:
    """Label every log axis of ``fig`` at :func:`tick_values` of the data it shows, formatted by :func:`si`
    (``units`` maps an axis name such as 'yaxis' to the unit its ticks carry). Axes with explicit ticks, or
    whose data has fewer than two ticks, keep plotly's own."""
    units = units or {}
    for letter in "xy":
        for ref in sorted({getattr(tr, letter + "axis", None) or letter for tr in fig.data}):
            name = letter + "axis" + ref[1:]  # 'x2' -> 'xaxis2'
            axis = fig.layout[name]
            if axis.type != "log" or axis.tickvals is not None:
                continue
            vals = [v for tr in fig.data if (getattr(tr, letter + "axis", None) or letter) == ref
                    for v in (getattr(tr, letter) if getattr(tr, letter) is not None else [])
                    if isinstance(v, numbers.Real) and v > 0]
            ticks = tick_values(min(vals), max(vals)) if vals else []
            if len(ticks) >= 2:
                axis.update(tickvals=ticks, ticktext=[si(t, units.get(name, "")) for t in ticks])
    return fig
