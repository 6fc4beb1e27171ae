"""Traffic figures: bytes against sequence length, resident bytes of one head, bytes per tensor."""

from __future__ import annotations

import plotly.graph_objects as go

from .records import (
    TAGS,
    bytes_hover,
    hover,
    label,
    length_axis,
    problem_line,
    profile_symbols,
    series,
    varying,
)
from .style import BOUNDARY_DASH, BOUNDARY_LABEL, color, layout


def traffic_vs_n(records: list[dict], boundaries=("global",), compulsory: bool = False,
                 title: str = "Traffic vs sequence length", references: list[dict] = ()) -> go.Figure:
    """Bytes moved against N (log-log), one line per schedule (and profile, dtype ... where they vary) and
    boundary; optionally the compulsory traffic (Q, K, V read once, O written once) and outside numbers
    (``references`` with an ``x``, e.g. measurements) as black markers."""
    fig = go.Figure()
    symbols = profile_symbols(records)
    xf, xtitle = length_axis(records)
    for ident, rows in series(records, xf):
        rows = [r for r in rows if r.get("global_bytes") is not None]
        if not rows:
            continue
        sched = rows[0]["schedule"]
        for b in boundaries:
            name = label(ident, schedule=sched) + (f" · {b}" if len(boundaries) > 1 else "")
            fig.add_trace(go.Scatter(
                x=[r[xf] for r in rows], y=[r[f"{b}_bytes"] for r in rows], name=name,
                mode="lines+markers", line={"color": color(sched), "dash": BOUNDARY_DASH[b]},
                marker={"symbol": symbols[rows[0]["profile"]], "size": 7},
                text=[hover(r, [f"{BOUNDARY_LABEL[b]}: {bytes_hover(r[f'{b}_bytes'])}",
                                 f"read {bytes_hover(r[f'{b}_read_bytes'])}, write {bytes_hover(r[f'{b}_write_bytes'])}",
                                 f"compulsory: {bytes_hover(r['compulsory_bytes'])}"]) for r in rows],
                hovertemplate="%{text}<extra></extra>"))
    if compulsory and records:
        by_n: dict = {}
        for r in records:
            key = (r["seq_len"], r["batch"], r["heads"], r["kv_heads"], r["head_dim"], r["dtype"], r["kv_len"])
            by_n[key] = r
        ident_fields = varying(records, ["batch", "heads", "kv_heads", "head_dim", "dtype"])
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
                text=[f"compulsory at {xf}={r[xf]:,}: {bytes_hover(r['compulsory_bytes'])}" for r in rows],
                hovertemplate="%{text}<extra></extra>"))
    reference_markers(fig, references)
    y = "bytes moved (decimal: 1 GB = 10⁹ B)"
    return layout(fig, title, xtitle, y, units={"yaxis": "B"})


def reference_markers(fig: go.Figure, references) -> None:
    """Outside numbers with an x position, one legend entry per provenance tag."""
    refs = [r for r in references if r.get("x") is not None and r.get("unit", "bytes") == "bytes"]
    symbols = {"measured": "star", "T": "x", "V": "diamond", "F": "cross", "D": "triangle-up"}
    for tag in sorted({r["tag"] for r in refs}):
        rs = [r for r in refs if r["tag"] == tag]
        fig.add_trace(go.Scatter(
            x=[r["x"] for r in rs], y=[r["value"] for r in rs], mode="markers",
            name="measured" if tag == "measured" else f"published figure, {TAGS.get(tag, tag)}",
            marker={"symbol": symbols.get(tag, "x"), "size": 12, "color": "black"},
            text=[f"<b>{r['label']}</b><br>{bytes_hover(r['value'])}<br>tag {r['tag']}: {TAGS.get(r['tag'], '')}"
                  f"<br>source: {r['source']}" for r in rs],
            hovertemplate="%{text}<extra></extra>"))


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
                  f"{bytes_hover(r['matrix_bytes'])}" for r in rows],
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
                      f"{bytes_hover(r['linear_bytes'])}" for r in rd],
                hovertemplate="%{text}<extra></extra>"))
    return layout(fig, title, "sequence length N (tokens)", "bytes resident per head", units={"yaxis": "B"})


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
                text=[f"<b>{t} {direction}</b><br>{bytes_hover(v)}<br>{problem_line(r)}" for v, r in zip(ys, records)],
                textposition="none", hovertemplate="%{text}<extra></extra>"))
    fig.update_layout(barmode="stack")
    return layout(fig, title, "schedule and number of heads", "global bytes (decimal)", log_x=False, log_y=False,
                   log_x_type="category")

