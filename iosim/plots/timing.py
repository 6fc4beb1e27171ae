"""Predicted time against sequence length, absolute or relative to one schedule, and the words every
predicted-time figure carries: whose time it is (iosim's kernel time model, ``iosim.timing``, or the peak roofline)
and on what its rates were measured (a calibrated profile) or that they were not (datasheet peaks, uncalibrated)."""

from __future__ import annotations

import re
import textwrap
from types import SimpleNamespace

import plotly.graph_objects as go

from ..timing import uncertainty
from ..units import fmt_seconds
from .records import bytes_hover, case_key, hover, label, length_axis, profile_symbols, series
from .style import color, layout

PEAK = "peak roofline, uncalibrated"
UNCALIBRATED = "datasheet rates, uncalibrated"
NOT_RECORDED = "time model not recorded in these results (saved by an older iosim)"
BAND_NOTE = ("shaded: the time records' 10th-90th percentile of measured ÷ predicted for the kernel and regime "
             "(docs/timing.md)")


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
    clock = f"; SM clock {r['clock_hz'] / 1e9:.3f} GHz under the power limiter" if r.get("clock_hz") else ""
    return f"time: the {kernel} kernel model, {UNCALIBRATED if cal == 'uncalibrated' else cal}{clock}"


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
    profile, shaded by the time records' band where its kernel has one (:func:`record_band`); with ``relative_to``
    (a schedule), each time divided by that schedule's time on the same problem and profile (no band)."""
    fig = go.Figure()
    symbols = profile_symbols(records)
    xf, xtitle = length_axis(records)
    base, shade = {}, []  # each series' bands, drawn after the lines (the lines' traces keep their order)
    if relative_to:
        base = {case_key(r): r["predicted_s"] for r in records if r["schedule"] == relative_to}
    for ident, rows in series(records, xf):
        rows = [r for r in rows if r.get("predicted_s") and (not relative_to or base.get(case_key(r)))]
        if not rows:
            continue
        sched = rows[0]["schedule"]
        ys = [r["predicted_s"] / base[case_key(r)] if relative_to else r["predicted_s"] for r in rows]
        bands = [None if relative_to else record_band(r) for r in rows]
        shade.append((rows, bands, label(ident, schedule=sched), color(sched)))
        fig.add_trace(go.Scatter(
            x=[r[xf] for r in rows], y=ys, name=label(ident, schedule=sched), legendgroup=label(ident, schedule=sched),
            mode="lines+markers", line={"color": color(sched), "dash": _dash(sched, ident, relative_to)},
            marker={"symbol": symbols[rows[0]["profile"]], "size": 7},
            text=[hover(r, [f"predicted: {fmt_seconds(r['predicted_s'])} ({r['predicted_s']:.6g} s), "
                             f"bound by {r['bound']}", time_hover(r)]
                         + ([f"{y:.3g}× the time of {relative_to}"] if relative_to else [])
                         + ([band_hover(b)] if b else [])
                         + [f"global: {bytes_hover(r['global_bytes'])}, hbm: {bytes_hover(r['hbm_bytes'])}",
                            f"FLOPs: {r['flops_total']:,}"]) for r, y, b in zip(rows, ys, bands, strict=True)],
            hovertemplate="%{text}<extra></extra>"))
    banded = sum(_add_band(fig, rows, bands, xf, name, c) for rows, bands, name, c in shade)
    if not relative_to:
        title += f"<br><sup>{BAND_NOTE}</sup>" if banded else ""
        layout(fig, title, xtitle, "predicted time (s)", units={"yaxis": "s"})
        return with_time_source(fig, title, records)
    if "÷" not in title:  # a title that says time over an axis that is a ratio: say so under it
        title += f"<br><sup>y: each schedule's predicted time ÷ {relative_to}'s on the same problem</sup>"
    layout(fig, title, xtitle, f"time ÷ {relative_to}'s (1 = as fast)", log_y=False)
    return with_time_source(fig, title, records)


def record_band(r: dict) -> uncertainty.Uncertainty | None:
    """A case's band from the time records (:mod:`iosim.timing.uncertainty`), None where its kernel has none."""
    kernel = r.get("time_kernel")
    if not kernel or kernel == "roofline" or not r.get("predicted_s"):
        return None
    shape = SimpleNamespace(seq_len=r["seq_len"], kv_len=r.get("kv_len") or r["seq_len"], causal=bool(r["causal"]),
                            dtype=r.get("dtype"))
    cal = r.get("time_calibration") not in (None, "uncalibrated")
    u = uncertainty.band(kernel, r["profile"], shape, r["predicted_s"], calibrated=cal)
    return u if u.low_s is not None else None


def band_hover(u: uncertainty.Uncertainty) -> str:
    return (f"band: {fmt_seconds(u.low_s)} to {fmt_seconds(u.high_s)} (10th-90th percentile of measured ÷ "
            f"predicted over {u.rows} rows of {u.group}, {u.device})")


def _add_band(fig: go.Figure, rows: list[dict], bands: list, xf: str, name: str, line_color: str) -> int:
    """Two traces under a series: its band's upper edge, then its lower edge filled up to it; 0 where no row of
    the series has a band, else 1."""
    pts = [(r[xf], b) for r, b in zip(rows, bands, strict=True) if b is not None]
    if not pts:
        return 0
    text = [band_hover(b) for _, b in pts]
    for edge, fill in (("high_s", None), ("low_s", "tonexty")):
        fig.add_trace(go.Scatter(
            x=[x for x, _ in pts], y=[getattr(b, edge) for _, b in pts], name=f"{name}: band {edge[:-2]}",
            mode="lines", line={"width": 0, "color": line_color}, fill=fill, opacity=0.18, showlegend=False,
            legendgroup=name, text=text, hoverinfo="skip"))
    return 1


def _dash(schedule: str, ident: dict, relative_to: str | None) -> str:
    """Dotted: the schedule the others are divided by; dashed: causal, where causal and not share a figure."""
    if schedule == relative_to:
        return "dot"
    return "dash" if ident.get("causal") else "solid"
