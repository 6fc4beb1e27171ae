"""Figures: functions that take result records and return plotly figures. Writing files is separate.

A record is one simulated case as a flat dict (``iosim.scenario.RECORD_FIELDS``: profile, schedule, problem
fields, tiles, bytes per boundary, FLOPs, predicted time ...), as ``iosim run`` saves it in ``results.json``,
so every figure can be redrawn from saved results without simulating again. :func:`figure_data` turns any
figure into rows for a CSV beside it. Bytes on axes and in hover text are decimal (1 MB = 10^6 B); hover text
also gives the exact integer.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .units import fmt_bytes, fmt_rate, fmt_seconds

TEMPLATE = "plotly_white"
# One colour per schedule across every figure (schedules added later get the fallback cycle).
SCHEDULE_COLORS = {
    "naive": "#d62728", "flash1": "#1f77b4", "flash2": "#2ca02c", "flash3": "#9467bd",
    "flash-decoding": "#ff7f0e", "block-sparse": "#8c564b",
}
_FALLBACK = ["#17becf", "#bcbd22", "#e377c2", "#7f7f7f"]
BOUNDARY_DASH = {"global": "solid", "hbm": "dash", "sram": "dot"}
BOUNDARY_LABEL = {"global": "global (SM↔L2)", "hbm": "hbm (L2↔DRAM)", "sram": "sram (on chip)"}
PROFILE_SYMBOLS = ["circle", "square", "diamond", "triangle-up", "x", "star", "cross", "pentagon"]
# Fields that tell two series apart; tiles are a property of a series only where they are swept.
GROUP_FIELDS = ["profile", "schedule", "pass", "batch", "heads", "kv_heads", "head_dim", "dtype", "causal"]


def color(schedule: str) -> str:
    if schedule in SCHEDULE_COLORS:
        return SCHEDULE_COLORS[schedule]
    return _FALLBACK[sum(map(ord, schedule)) % len(_FALLBACK)]


def _layout(fig: go.Figure, title: str, x: str, y: str, log_x=True, log_y=True, height=460,
            log_x_type: str = "linear") -> go.Figure:
    fig.update_layout(
        template=TEMPLATE, title={"text": title, "x": 0.01, "xanchor": "left"}, height=height,
        legend={"title": None, "bgcolor": "rgba(255,255,255,0.85)", "font": {"size": 12}},
        hoverlabel={"align": "left"}, margin={"l": 70, "r": 20, "t": 60, "b": 60},
    )
    fig.update_xaxes(title=x, type="log" if log_x else log_x_type, showline=True, mirror=True, linecolor="#888")
    fig.update_yaxes(title=y, type="log" if log_y else "linear", showline=True, mirror=True, linecolor="#888",
                     exponentformat="SI")
    return fig


def _varying(records: list[dict], fields: Iterable[str]) -> list[str]:
    return [f for f in fields if len({r.get(f) for r in records}) > 1]


def _series(records: list[dict], x: str, extra_exclude=()) -> list[tuple[dict, list[dict]]]:
    """Split records into series: one per combination of the identity fields that vary (x excluded)."""
    keys = [f for f in _varying(records, GROUP_FIELDS) if f != x and f not in extra_exclude]
    groups: dict[tuple, list[dict]] = {}
    for r in records:
        groups.setdefault(tuple(r.get(k) for k in keys), []).append(r)
    out = []
    for key, rows in groups.items():
        rows = sorted(rows, key=lambda r: (r.get(x) is None, r.get(x)))
        out.append((dict(zip(keys, key)), rows))
    return out


def _label(ident: dict, always_schedule: bool = True, schedule: str | None = None) -> str:
    parts = []
    if always_schedule and schedule and "schedule" not in ident:
        parts.append(schedule)
    for k, v in ident.items():
        if k == "schedule" or k == "profile":
            parts.append(str(v))
        elif k == "causal":
            parts.append("causal" if v else "non-causal")
        else:
            parts.append(f"{k}={v}")
    return ", ".join(parts)


def _problem_line(r: dict) -> str:
    kv = f", kv_heads={r['kv_heads']}" if r.get("kv_heads") != r.get("heads") else ""
    nk = f", kv_len={r['kv_len']:,}" if r.get("kv_len") != r.get("seq_len") else ""
    return (f"batch={r['batch']}, heads={r['heads']}{kv}, N={r['seq_len']:,}{nk}, d={r['head_dim']}, "
            f"{r['dtype']}{', causal' if r.get('causal') else ''}")


def _tiles_line(r: dict) -> str:
    if r.get("block_q") is None:
        return "untiled (each GEMM reads its operands once)"
    m = f" (M = {r['sram_elements']:,} elements)" if r.get("sram_elements") else ""
    return f"Br={r['block_q']}, Bc={r['block_kv']}{m}"


def _hover(r: dict, lines: list[str]) -> str:
    head = f"<b>{r['schedule']}</b> on {r['profile']}<br>{_problem_line(r)}<br>tiles: {_tiles_line(r)}"
    if r.get("fits") is False:
        head += "<br><i>hypothetical: " + (r.get("note") or "tiles exceed the GPU's on-chip memory") + "</i>"
    return head + "<br>" + "<br>".join(lines)


def _bytes_hover(n) -> str:
    return "n/a" if n is None else f"{fmt_bytes(n)} ({int(n):,} B)"


def _style(records: list[dict]):
    """Marker symbol per profile when several profiles share a figure."""
    profiles = sorted({r["profile"] for r in records})
    return {p: PROFILE_SYMBOLS[i % len(PROFILE_SYMBOLS)] for i, p in enumerate(profiles)}


def _length_axis(records: list[dict]) -> tuple[str, str]:
    """N along x, or N_kv when only the key/value length varies (decoding: one query, a growing cache)."""
    if len({r["seq_len"] for r in records}) == 1 and len({r["kv_len"] for r in records}) > 1:
        return "kv_len", "key/value length N_kv (tokens)"
    return "seq_len", "sequence length N (tokens)"


# -- figures --------------------------------------------------------------------------------------------------


def traffic_vs_n(records: list[dict], boundaries=("global",), compulsory: bool = False,
                 title: str = "Traffic vs sequence length", references: list[dict] = ()) -> go.Figure:
    """Bytes moved against N (log-log), one line per schedule (and profile, dtype ... where they vary) and
    boundary; optionally the compulsory traffic (Q, K, V read once, O written once) and outside numbers
    (``references`` with an ``x``, e.g. measurements) as black markers."""
    fig = go.Figure()
    symbols = _style(records)
    xf, xtitle = _length_axis(records)
    for ident, rows in _series(records, xf):
        rows = [r for r in rows if r.get("global_bytes") is not None]
        if not rows:
            continue
        sched = rows[0]["schedule"]
        for b in boundaries:
            name = _label(ident, schedule=sched) + (f" · {b}" if len(boundaries) > 1 else "")
            fig.add_trace(go.Scatter(
                x=[r[xf] for r in rows], y=[r[f"{b}_bytes"] for r in rows], name=name,
                mode="lines+markers", line={"color": color(sched), "dash": BOUNDARY_DASH[b]},
                marker={"symbol": symbols[rows[0]["profile"]], "size": 7},
                text=[_hover(r, [f"{BOUNDARY_LABEL[b]}: {_bytes_hover(r[f'{b}_bytes'])}",
                                 f"read {_bytes_hover(r[f'{b}_read_bytes'])}, write {_bytes_hover(r[f'{b}_write_bytes'])}",
                                 f"compulsory: {_bytes_hover(r['compulsory_bytes'])}"]) for r in rows],
                hovertemplate="%{text}<extra></extra>"))
    if compulsory and records:
        by_n: dict = {}
        for r in records:
            key = (r["seq_len"], r["batch"], r["heads"], r["kv_heads"], r["head_dim"], r["dtype"], r["kv_len"])
            by_n[key] = r
        ident_fields = _varying(records, ["batch", "heads", "kv_heads", "head_dim", "dtype"])
        groups: dict = {}
        for r in by_n.values():
            groups.setdefault(tuple(r[f] for f in ident_fields), []).append(r)
        for gkey, rows in groups.items():
            rows.sort(key=lambda r: r[xf])
            suffix = ", ".join(f"{f}={v}" for f, v in zip(ident_fields, gkey))
            fig.add_trace(go.Scatter(
                x=[r[xf] for r in rows], y=[r["compulsory_bytes"] for r in rows],
                name="compulsory: Q, K, V read once, O written once" + (f" ({suffix})" if suffix else ""),
                mode="lines", line={"color": "black", "dash": "dashdot", "width": 1.5},
                text=[f"compulsory at {xf}={r[xf]:,}: {_bytes_hover(r['compulsory_bytes'])}" for r in rows],
                hovertemplate="%{text}<extra></extra>"))
    _reference_markers(fig, references)
    y = "bytes moved (decimal: 1 GB = 10⁹ B)"
    return _layout(fig, title, xtitle, y)


def _reference_markers(fig: go.Figure, references) -> None:
    """Outside numbers with an x position, one legend entry per provenance tag."""
    refs = [r for r in references if r.get("x") is not None and r.get("unit", "bytes") == "bytes"]
    symbols = {"measured": "star", "T": "x", "V": "diamond", "F": "cross", "D": "triangle-up"}
    for tag in sorted({r["tag"] for r in refs}):
        rs = [r for r in refs if r["tag"] == tag]
        fig.add_trace(go.Scatter(
            x=[r["x"] for r in rs], y=[r["value"] for r in rs], mode="markers",
            name="measured" if tag == "measured" else f"published figure, {_TAGS.get(tag, tag)}",
            marker={"symbol": symbols.get(tag, "x"), "size": 12, "color": "black"},
            text=[f"<b>{r['label']}</b><br>{_bytes_hover(r['value'])}<br>tag {r['tag']}: {_TAGS.get(r['tag'], '')}"
                  f"<br>source: {r['source']}" for r in rs],
            hovertemplate="%{text}<extra></extra>"))


def time_vs_n(records: list[dict], title: str = "Predicted time vs sequence length",
              relative_to: str | None = None) -> go.Figure:
    """Predicted time (roofline model) against N, log-log, one line per schedule and profile; with
    ``relative_to`` (a schedule), each time divided by that schedule's time on the same problem and profile."""
    fig = go.Figure()
    symbols = _style(records)
    xf, xtitle = _length_axis(records)
    base = {}
    if relative_to:
        base = {_case_key(r): r["predicted_s"] for r in records if r["schedule"] == relative_to}
    for ident, rows in _series(records, xf):
        rows = [r for r in rows if r.get("predicted_s") and (not relative_to or base.get(_case_key(r)))]
        if not rows:
            continue
        sched = rows[0]["schedule"]
        ys = [r["predicted_s"] / base[_case_key(r)] if relative_to else r["predicted_s"] for r in rows]
        fig.add_trace(go.Scatter(
            x=[r[xf] for r in rows], y=ys, name=_label(ident, schedule=sched),
            mode="lines+markers", line={"color": color(sched), "dash": "dot" if sched == relative_to else "solid"},
            marker={"symbol": symbols[rows[0]["profile"]], "size": 7},
            text=[_hover(r, [f"predicted: {fmt_seconds(r['predicted_s'])} ({r['predicted_s']:.6g} s), "
                             f"bound by {r['bound']}"]
                         + ([f"{y:.3g}× the time of {relative_to}"] if relative_to else [])
                         + [f"global: {_bytes_hover(r['global_bytes'])}, hbm: {_bytes_hover(r['hbm_bytes'])}",
                            f"FLOPs: {r['flops_total']:,}"]) for r, y in zip(rows, ys)],
            hovertemplate="%{text}<extra></extra>"))
    ytitle = f"predicted time ÷ {relative_to}'s" if relative_to else "predicted time (s)"
    return _layout(fig, title, xtitle, ytitle, log_y=not relative_to)


def _case_key(r: dict) -> tuple:
    return tuple(r.get(k) for k in ("profile", "pass", "batch", "heads", "kv_heads", "seq_len", "kv_len", "head_dim",
                                     "dtype", "causal"))


def roofline(records: list[dict], profiles: dict, title: str = "Roofline") -> go.Figure:
    """Arithmetic intensity (FLOPs per DRAM byte) against attainable FLOP/s, one point per schedule and size,
    with the ceilings of each profile: the matmul peak of the dtype, and DRAM and L2 bandwidth × intensity."""
    names = sorted({r["profile"] for r in records})
    fig = make_subplots(rows=1, cols=max(1, len(names)), shared_yaxes=True,
                        subplot_titles=[profiles.get(n, {}).get("display_name", n) for n in names],
                        horizontal_spacing=0.04)
    shown: set = set()
    rows_ok = [r for r in records if r.get("arithmetic_intensity") and r.get("predicted_s")]
    ai_all = [r["arithmetic_intensity"] for r in rows_ok] or [1.0, 1000.0]
    lo, hi = min(ai_all) / 3, max(ai_all) * 3
    for col, name in enumerate(names, 1):
        prof = profiles.get(name, {})
        dtypes = sorted({r["dtype"] for r in records if r["profile"] == name})
        xs = np.geomspace(lo, hi, 64)
        for dt in dtypes:
            peak = (prof.get("matmul") or {}).get(dt)
            if peak:
                fig.add_trace(go.Scatter(x=[lo, hi], y=[peak, peak], mode="lines",
                                         line={"color": "#444", "width": 1},
                                         name=f"matmul peak ({dt})", legendgroup="peak", showlegend="peak" not in shown,
                                         hovertemplate=f"{name}: matmul peak {dt} = {fmt_rate(peak, 'FLOP/s')}"
                                                       "<extra></extra>"), row=1, col=col)
                shown.add("peak")
        for key, label, dash in (("dram_bandwidth", "DRAM bandwidth × intensity", "dash"),
                                 ("l2_bandwidth", "L2 bandwidth × intensity (for global bytes)", "dot")):
            bw = prof.get(key)
            if bw:
                fig.add_trace(go.Scatter(x=xs, y=xs * bw, mode="lines", line={"color": "#888", "dash": dash},
                                         name=label, legendgroup=key, showlegend=key not in shown,
                                         hovertemplate=f"{name}: {label}, bandwidth {fmt_rate(bw, 'B/s')}"
                                                       "<extra></extra>"), row=1, col=col)
                shown.add(key)
        for sched in sorted({r["schedule"] for r in rows_ok if r["profile"] == name}):
            pts = sorted((r for r in rows_ok if r["profile"] == name and r["schedule"] == sched),
                         key=lambda r: r["seq_len"])
            fig.add_trace(go.Scatter(
                x=[r["arithmetic_intensity"] for r in pts], y=[r["attained_flops_per_s"] for r in pts],
                mode="markers+lines", line={"color": color(sched), "width": 1}, marker={"color": color(sched), "size": 8},
                name=sched, legendgroup=sched, showlegend=sched not in shown,
                text=[_hover(r, [f"arithmetic intensity: {r['arithmetic_intensity']:.4g} FLOP/B (DRAM bytes)",
                                 f"attainable (model): {fmt_rate(r['attained_flops_per_s'], 'FLOP/s')}",
                                 f"bound by {r['bound']}, predicted {fmt_seconds(r['predicted_s'])}"]) for r in pts],
                hovertemplate="%{text}<extra></extra>"), row=1, col=col)
            shown.add(sched)
    fig.update_layout(template=TEMPLATE, title={"text": title, "x": 0.01}, height=480,
                      legend={"bgcolor": "rgba(255,255,255,0.85)"}, margin={"l": 70, "r": 20, "t": 80, "b": 60})
    fig.update_xaxes(type="log", title="arithmetic intensity (FLOP per DRAM byte)", showline=True, mirror=True,
                     linecolor="#888")
    fig.update_yaxes(type="log", exponentformat="SI", showline=True, mirror=True, linecolor="#888")
    fig.update_yaxes(title="attainable FLOP/s", row=1, col=1)
    return fig


def traffic_vs_block(records: list[dict], references: list[dict] = (), boundaries=("global",),
                     title: str = "Traffic vs block size") -> go.Figure:
    """Bytes against the tile size (Br = Bc = block), with published or transcribed values beside them.
    Tiles that do not fit the profile's shared memory per thread block are drawn hollow."""
    fig = go.Figure()
    for ident, rows in _series(records, "block_kv"):
        rows = [r for r in rows if r.get("global_bytes") is not None]
        if not rows:
            continue
        sched = rows[0]["schedule"]
        for b in boundaries:
            fig.add_trace(go.Scatter(
                x=[r["block_kv"] for r in rows], y=[r[f"{b}_bytes"] for r in rows],
                name=f"{_label(ident, schedule=sched)} (simulated{', ' + b if len(boundaries) > 1 else ''})",
                mode="lines+markers", line={"color": color(sched), "dash": BOUNDARY_DASH[b]},
                marker={"size": 10, "color": color(sched),
                        "symbol": ["circle" if r.get("fits", True) else "circle-open" for r in rows]},
                text=[_hover(r, [f"{BOUNDARY_LABEL[b]}: {_bytes_hover(r[f'{b}_bytes'])}",
                                 f"on-chip working set {r['sram_peak_bytes']:,} B per thread block"
                                 if r.get("sram_peak_bytes") else ""]) for r in rows],
                hovertemplate="%{text}<extra></extra>"))
    _reference_markers(fig, references)
    blocks = sorted({r["block_kv"] for r in records if r.get("block_kv")})
    _layout(fig, title, "block size Br = Bc (rows per tile)", "bytes moved (decimal: 1 GB = 10⁹ B)")
    fig.update_xaxes(type="log", tickvals=blocks, ticktext=[str(b) for b in blocks])
    return fig


_TAGS = {"V": "verbatim in the source", "F": "read off a published figure",
         "T": "third-party transcription (unverified)", "D": "derived by arithmetic", "measured": "measured"}


def lower_bound_elements(N: int, Nk: int, d: int, M):
    """Saha & Ye (2024), Theorem 3.1: Θ(min(N²d/√M, N²d²/M)) slow-memory accesses (elements), constant 1;
    N² read as N·N_kv."""
    M = np.asarray(M, dtype=float)
    return np.minimum(N * Nk * d / np.sqrt(M), N * Nk * d * d / M)


def traffic_vs_sram(records: list[dict], title: str = "Traffic vs SRAM size and the I/O lower bound") -> go.Figure:
    """Bytes against the on-chip SRAM size M (elements), tiles derived from M, with the I/O lower bound
    Θ(min(N²d/√M, N²d²/M)) (constant 1, times the element size and the number of heads) and M = d² marked."""
    fig = go.Figure()
    rows_all = [r for r in records if r.get("sram_elements")]
    for ident, rows in _series(rows_all, "sram_elements"):
        rows = [r for r in rows if r.get("global_bytes") is not None]
        if not rows:
            continue
        sched = rows[0]["schedule"]
        fig.add_trace(go.Scatter(
            x=[r["sram_elements"] for r in rows], y=[r["global_bytes"] for r in rows],
            name=f"{_label(ident, schedule=sched)} (simulated, global)", mode="lines+markers",
            line={"color": color(sched)}, marker={"size": 7},
            text=[_hover(r, [f"M = {r['sram_elements']:,} elements", f"global: {_bytes_hover(r['global_bytes'])}",
                             f"lower bound (Θ, constant 1): {_bytes_hover(_bound_bytes(r, r['sram_elements']))}"])
                  for r in rows],
            hovertemplate="%{text}<extra></extra>"))
    shapes = {(r["seq_len"], r["kv_len"], r["head_dim"], r["dtype"], r["batch"] * r["heads"]): r for r in rows_all}
    for (N, _Nk, d, _dt, _bh), r in shapes.items():
        Ms = sorted({x["sram_elements"] for x in rows_all})
        grid = np.geomspace(Ms[0], Ms[-1], 96)
        y = _bound_bytes(r, grid)
        suffix = f" (N={N:,}, d={d})" if len(shapes) > 1 else ""
        fig.add_trace(go.Scatter(
            x=grid, y=y, mode="lines", line={"color": "black", "width": 2, "dash": "dash"},
            name="I/O lower bound Θ(min(N²d/√M, N²d²/M)), constant 1" + suffix,
            text=[f"M = {m:,.0f}: bound {_bytes_hover(v)}" for m, v in zip(grid, y)],
            hovertemplate="%{text}<extra></extra>"))
        fig.add_vline(x=d * d, line={"color": "#999", "dash": "dot"})
        fig.add_annotation(x=math.log10(d * d), y=1, yref="paper", text=f"M = d² = {d * d:,}", showarrow=False,
                           yanchor="bottom", font={"size": 12})
        fig.add_annotation(x=math.log10(d * d), y=0.02, yref="paper", xanchor="right", showarrow=False,
                           text="small cache: N²d/√M  ", font={"size": 11, "color": "#555"})
        fig.add_annotation(x=math.log10(d * d), y=0.02, yref="paper", xanchor="left", showarrow=False,
                           text="  large cache: N²d²/M", font={"size": 11, "color": "#555"})
    return _layout(fig, title, "on-chip SRAM size M (elements)", "bytes moved (decimal: 1 GB = 10⁹ B)")


def _bound_bytes(r: dict, M):
    eb = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1}[r["dtype"]]
    return lower_bound_elements(r["seq_len"], r["kv_len"], r["head_dim"], M) * eb * r["batch"] * r["heads"]


def footprint(records: list[dict], title: str = "Memory footprint of one head") -> go.Figure:
    """Bytes that must be resident: the N×N_kv score matrix (S or P) of one head, materialized by naive
    attention, against Q, K, V and O (O(N·d)), which is all a tiled kernel keeps in global memory."""
    fig = go.Figure()
    seen = set()
    for dt in sorted({r["dtype"] for r in records}):
        rows = sorted({r["seq_len"]: r for r in records if r["dtype"] == dt}.values(), key=lambda r: r["seq_len"])
        fig.add_trace(go.Scatter(
            x=[r["seq_len"] for r in rows], y=[r["matrix_bytes"] for r in rows], mode="lines+markers",
            name=f"N×N matrix (S or P), {dt}", line={"color": "#d62728", "dash": "solid" if dt == "fp32" else "dash"},
            text=[f"N = {r['seq_len']:,}, {dt}: N×N matrix = {_binary(r['matrix_bytes'])} = "
                  f"{_bytes_hover(r['matrix_bytes'])}" for r in rows],
            hovertemplate="%{text}<extra></extra>"))
        for d in sorted({r["head_dim"] for r in rows}):
            if (dt, d) in seen:
                continue
            seen.add((dt, d))
            rd = [r for r in rows if r["head_dim"] == d]
            fig.add_trace(go.Scatter(
                x=[r["seq_len"] for r in rd], y=[r["linear_bytes"] for r in rd], mode="lines+markers",
                name=f"Q, K, V, O = 4·N·d, d={d}, {dt}",
                line={"color": "#2ca02c", "dash": "solid" if dt == "fp32" else "dash"},
                text=[f"N = {r['seq_len']:,}, d = {d}, {dt}: Q, K, V, O = {_binary(r['linear_bytes'])} = "
                      f"{_bytes_hover(r['linear_bytes'])}" for r in rd],
                hovertemplate="%{text}<extra></extra>"))
    return _layout(fig, title, "sequence length N (tokens)", "bytes resident per head")


def _binary(n: float) -> str:
    for f, p in ((2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if n >= f:
            return f"{n / f:.4g} {p}"
    return f"{n:.4g} B"


def by_tensor(records: list[dict], title: str = "Global traffic per tensor") -> go.Figure:
    """Stacked bars: global bytes read and written per tensor, one bar per case (schedule, problem)."""
    fig = go.Figure()
    cats = [f"{r['schedule']}<br>{r['batch'] * r['heads']} head{'s' if r['batch'] * r['heads'] > 1 else ''}"
            + (f"<br>{r['profile']}" if len({x['profile'] for x in records}) > 1 else "") for r in records]
    tensors: list[str] = []
    for r in records:
        for t in r.get("by_tensor") or {}:
            if t not in tensors:
                tensors.append(t)
    palette = {"Q": "#1f77b4", "K": "#17becf", "V": "#2ca02c", "O": "#9467bd", "S": "#d62728", "P": "#ff7f0e",
               "m": "#8c564b", "l": "#bcbd22", "lse": "#7f7f7f"}
    for t in tensors:
        for direction, pattern in (("read", ""), ("write", "/")):
            ys = [(r.get("by_tensor") or {}).get(t, {}).get(f"global_{direction}_bytes", 0) for r in records]
            if not any(ys):
                continue
            fig.add_trace(go.Bar(
                x=cats, y=ys, name=f"{t} {'load' if direction == 'read' else 'store'}",
                marker={"color": palette.get(t, "#aaa"), "pattern": {"shape": pattern}},
                text=[f"<b>{t} {direction}</b><br>{_bytes_hover(v)}<br>{_problem_line(r)}" for v, r in zip(ys, records)],
                textposition="none", hovertemplate="%{text}<extra></extra>"))
    fig.update_layout(barmode="stack")
    return _layout(fig, title, "schedule and number of heads", "global bytes (decimal)", log_x=False, log_y=False,
                   log_x_type="category")


def bars(records: list[dict], x: str, metric: str = "global_bytes", title: str | None = None) -> go.Figure:
    """Grouped bars: ``metric`` against the values of field ``x``, one colour per schedule."""
    fig = go.Figure()
    for ident, rows in _series(records, x):
        sched = rows[0]["schedule"]
        fig.add_trace(go.Bar(
            x=[_cat(x, r[x]) for r in rows], y=[r.get(metric) for r in rows], name=_label(ident, schedule=sched),
            marker={"color": color(sched)},
            text=[_hover(r, [f"{metric}: {_metric_hover(metric, r.get(metric))}"]) for r in rows],
            textposition="none", hovertemplate="%{text}<extra></extra>"))
    fig.update_layout(barmode="group")
    y = _METRIC_AXIS.get(metric, metric)
    return _layout(fig, title or f"{metric} by {x}", x, y, log_x=False, log_y=False,
                   log_x_type="category")


def _cat(field: str, v) -> str:
    if field == "causal":
        return "causal" if v else "non-causal"
    return f"{field}={v}"


_METRIC_AXIS = {"global_bytes": "global bytes (decimal)", "hbm_bytes": "hbm bytes (decimal)",
                "sram_bytes": "sram bytes (decimal)", "predicted_s": "predicted time (s)",
                "compulsory_bytes": "compulsory bytes", "flops_total": "FLOPs",
                "global_over_compulsory": "global ÷ compulsory", "hbm_over_compulsory": "hbm ÷ compulsory"}


def _metric_hover(metric: str, v) -> str:
    if v is None:
        return "n/a"
    if metric.endswith("_bytes"):
        return _bytes_hover(v)
    if metric == "predicted_s":
        return f"{fmt_seconds(v)} ({v:.6g} s)"
    return f"{v:,.6g}"


MEASUREMENT_COLUMNS = ["kernel", "device", "profile", "batch", "heads", "kv_heads", "seq_len", "kv_len", "head_dim",
                       "dtype", "causal", "block_q", "block_kv", "boundary", "direction", "simulated_bytes",
                       "measured_bytes"]


def read_measurements(paths: Iterable[Path], skipped: list[str] | None = None) -> list[dict]:
    """Rows of measurement CSV files (columns MEASUREMENT_COLUMNS). A file without the kernel, boundary and byte
    columns is left out (and named in ``skipped`` with the reason); so are rows whose bytes are not numbers."""
    rows = []
    for path in paths:
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            missing = [c for c in ("kernel", "boundary", "simulated_bytes", "measured_bytes")
                       if c not in (reader.fieldnames or [])]
            if missing:
                if skipped is not None:
                    skipped.append(f"{path} (no columns {', '.join(missing)})")
                continue
            for row in reader:
                try:
                    row["simulated_bytes"] = float(row["simulated_bytes"])
                    row["measured_bytes"] = float(row["measured_bytes"])
                except (TypeError, ValueError):
                    continue
                row["file"] = str(path)
                rows.append(row)
    return rows


def parity(rows: list[dict], title: str = "Measured vs simulated bytes") -> go.Figure:
    """Measured bytes against simulated bytes (log-log) with the line y = x, one colour per kernel and a
    symbol per boundary."""
    fig = go.Figure()
    symbols = {"global": "circle", "hbm": "square", "dram": "square", "sram": "diamond", "l2": "circle"}
    groups: dict = {}
    for r in rows:
        groups.setdefault((r["kernel"], r["boundary"]), []).append(r)
    for (kernel, boundary), rs in sorted(groups.items()):
        fig.add_trace(go.Scatter(
            x=[r["simulated_bytes"] for r in rs], y=[r["measured_bytes"] for r in rs], mode="markers",
            name=f"{kernel} · {boundary}", marker={"size": 9, "symbol": symbols.get(boundary, "circle"),
                                                    "color": color(kernel.split("_")[0])},
            text=[f"<b>{kernel}</b> on {r.get('device', '?')} ({r.get('profile', '?')})<br>"
                  f"N={r.get('seq_len')}, d={r.get('head_dim')}, heads={r.get('heads')}, {r.get('dtype')}"
                  f"{', causal' if str(r.get('causal')).lower() == 'true' else ''}<br>"
                  f"{boundary} {r.get('direction', '')}<br>simulated {_bytes_hover(r['simulated_bytes'])}<br>"
                  f"measured {_bytes_hover(r['measured_bytes'])}<br>ratio "
                  f"{(r['measured_bytes'] / r['simulated_bytes']) if r['simulated_bytes'] else float('nan'):.4g}"
                  for r in rs],
            hovertemplate="%{text}<extra></extra>"))
    vals = [v for r in rows for v in (r["simulated_bytes"], r["measured_bytes"]) if v > 0] or [1, 10]
    lo, hi = min(vals) / 2, max(vals) * 2
    fig.add_trace(go.Scatter(x=[lo, hi], y=[lo, hi], mode="lines", name="measured = simulated",
                             line={"color": "black", "dash": "dash"}, hoverinfo="skip"))
    return _layout(fig, title, "simulated bytes", "measured bytes")


# -- data beside the figure --------------------------------------------------------------------------------


def figure_data(fig: go.Figure) -> list[dict]:
    """One row per plotted point: figure trace name, x, y, and the hover text (tags stripped)."""
    rows = []
    for tr in fig.data:
        xs = tr.x if tr.x is not None else []
        ys = tr.y if tr.y is not None else []
        texts = tr.text if isinstance(tr.text, (list, tuple)) else [tr.text] * len(xs)
        for i, (x, y) in enumerate(zip(xs, ys)):
            t = texts[i] if i < len(texts) else None
            rows.append({"trace": tr.name, "x": _plain(x), "y": _plain(y),
                         "hover": _strip(t) if isinstance(t, str) else ""})
    return rows


def _plain(v):
    if isinstance(v, np.generic):
        return v.item()
    return v


def _strip(s: str) -> str:
    import re

    return re.sub(r"<[^>]+>", "", s.replace("<br>", "; "))


def write_figure_csv(fig: go.Figure, path: str | Path) -> Path:
    path = Path(path)
    rows = figure_data(fig)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["trace", "x", "y", "hover"])
        w.writeheader()
        w.writerows(rows)
    return path
