"""Predicted time against sequence length, absolute or relative to one schedule, and the words every
predicted-time figure carries: whose time it is (iosim's kernel time model, ``iosim.timing``, or the peak roofline)
and on what its rates were measured (a calibrated profile) or that they were not (datasheet peaks, uncalibrated)."""

from __future__ import annotations

import re
import textwrap

import plotly.graph_objects as go

from ..units import fmt_seconds
from .records import bytes_hover, case_key, hover, label, length_axis, profile_symbols, series
from .style import color, layout

PEAK = "peak roofline, uncalibrated"
UNCALIBRATED = "datasheet rates, uncalibrated"
NOT_RECORDED = "time model not recorded in these results (saved by an older iosim)"


def calibrated_on(calibration: str | None) -> str:
    """A profile's calibration label in short: 'measured on NVIDIA H100 80GB HBM3, driver ..., 2026-11-24, commit
    ...' gives 'rates measured on NVIDIA H100 80GB HBM3, 2026-11-24'; 'uncalibrated' (or none) gives
    :data:`UNCALIBRATED`."""
    if not calibration or calibration == "uncalibrated":
        return UNCALIBRATED
    m = re.match(r"measured on (.+?)(?=, driver |, CUDA |, commit |, \d{4}-\d\d-\d\d|$)", calibration)
    date = re.search(r"\d{4}-\d\d-\d\d", calibration)
    return f"rates measured on {m.group(1) if m else calibration}" + (f", {date.group(0)}" if date else "")


def _unique(values) -> list:
    return list(dict.fromkeys(v for v in values if v is not None))


def time_source(records: list[dict]) -> str:
    """One line for the records' predicted times: e.g. "predicted by iosim's time model (kernels: iosim-flash2,
    iosim-naive; rates measured on NVIDIA H100 80GB HBM3, 2026-11-24)", or "peak roofline, uncalibrated" where
    every time is the peak bound; profiles are named where several calibrations share a figure, schedules where
    some times are the model's and some the roofline's. Empty where no record has a predicted time."""
    rows = [r for r in records if r.get("predicted_s")]
    if not rows:
        return ""
    if not any(r.get("time_kernel") for r in rows):
        return NOT_RECORDED
    modelled = [r for r in rows if r.get("time_kernel") not in (None, "roofline")]
    peak = _unique(r["schedule"] for r in rows if r.get("time_kernel") in (None, "roofline"))
    if not modelled:
        return PEAK
    by_cal: dict[str, list[str]] = {}  # short calibration -> the profiles that have it
    for r in modelled:
        profs = by_cal.setdefault(calibrated_on(r.get("time_calibration")), [])
        profs += [] if r["profile"] in profs else [r["profile"]]
    name = len(by_cal) > 1 or len({r["profile"] for r in rows}) > 1
    cals = "; ".join(f"{', '.join(profs)}: {cal}" if name else cal for cal, profs in by_cal.items())
    out = f"predicted by iosim's time model (kernels: {', '.join(_unique(r['time_kernel'] for r in modelled))}; {cals})"
    return out + (f"; {', '.join(peak)}: {PEAK}" if peak else "")


def time_hover(r: dict) -> str:
    """One hover line: the kernel model of this case's time and its calibration, in full."""
    kernel = r.get("time_kernel")
    if kernel is None:
        return NOT_RECORDED
    if kernel == "roofline":
        return f"time: {PEAK} (work ÷ datasheet peaks)"
    cal = r.get("time_calibration") or "uncalibrated"
    return f"time: the {kernel} kernel model, {UNCALIBRATED if cal == 'uncalibrated' else cal}"


def with_time_source(fig: go.Figure, title: str, records: list[dict], width: int = 92) -> go.Figure:
    """``title`` with :func:`time_source` under it in small type, wrapped to ``width`` characters (the figure's
    text must fit an 800 px page), and the top margin made room for."""
    lines = [title, *textwrap.wrap(time_source(records), width)]
    sub = "<br>".join(lines[1:])
    text = f"{lines[0]}<br><sup>{sub}</sup>" if sub else lines[0]
    n = text.count("<br>")  # lines under the title, each about 22 px; the title starts below the mode bar
    fig.update_layout(title={"text": text, "y": 1, "yref": "container", "yanchor": "top", "pad": {"t": 30}},
                      margin_t=max(fig.layout.margin.t or 60, 30 + 24 + 22 * n + 6))
    return fig


def time_vs_n(records: list[dict], title: str = "Predicted time vs sequence length",
              relative_to: str | None = None) -> go.Figure:
    """Predicted time (iosim's kernel time model, or the peak roofline where a schedule has no kernel model: the
    subtitle says which, and on what the rates were measured) against N, log-log, one line per schedule and
    profile; with ``relative_to`` (a schedule), each time divided by that schedule's time on the same problem and
    profile."""
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
                             f"bound by {r['bound']}", time_hover(r)]
                         + ([f"{y:.3g}× the time of {relative_to}"] if relative_to else [])
                         + [f"global: {bytes_hover(r['global_bytes'])}, hbm: {bytes_hover(r['hbm_bytes'])}",
                            f"FLOPs: {r['flops_total']:,}"]) for r, y in zip(rows, ys)],
            hovertemplate="%{text}<extra></extra>"))
    if not relative_to:
        layout(fig, title, xtitle, "predicted time (s)", units={"yaxis": "s"})
        return with_time_source(fig, title, records)
    if "÷" not in title:  # a title that says time over an axis that is a ratio: say so under it
        title += f"<br><sup>y: each schedule's predicted time ÷ {relative_to}'s on the same problem</sup>"
    layout(fig, title, xtitle, f"time ÷ {relative_to}'s (1 = as fast)", log_y=False)
    return with_time_source(fig, title, records)


def _dash(schedule: str, ident: dict, relative_to: str | None) -> str:
    """Dotted: the schedule the others are divided by; dashed: causal, where causal and not share a figure."""
    if schedule == relative_to:
        return "dot"
    return "dash" if ident.get("causal") else "solid"
