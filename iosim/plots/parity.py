"""Measured against simulated bytes: reading measurement tables and the parity figure."""

from __future__ import annotations

import csv
from collections.abc import Iterable
from pathlib import Path

import plotly.graph_objects as go

from .records import bytes_hover
from .style import color, layout

MEASUREMENT_COLUMNS = ["kernel", "device", "profile", "batch", "heads", "kv_heads", "seq_len", "kv_len", "head_dim",
                       "dtype", "causal", "block_q", "block_kv", "boundary", "direction", "simulated_bytes",
                       "measured_bytes"]


def read_measurement_file(path: Path, name: str | None = None) -> tuple[list[dict], str | None]:
    """The rows of one measurement CSV file (columns MEASUREMENT_COLUMNS), each with ``file`` = ``name`` (the
    path by default), and ``None``; or no rows and why the file is not a measurement table. Rows whose bytes
    are not numbers are left out."""
    name = str(path) if name is None else name
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in ("kernel", "boundary", "simulated_bytes", "measured_bytes")
                   if c not in (reader.fieldnames or [])]
        if missing:
            return [], f"{name} (no columns {', '.join(missing)})"
        rows = []
        for row in reader:
            try:
                row["simulated_bytes"] = float(row["simulated_bytes"])
                row["measured_bytes"] = float(row["measured_bytes"])
            except (TypeError, ValueError):
                continue
            row["file"] = name
            rows.append(row)
    return rows, None


def read_measurements(paths: Iterable[Path], skipped: list[str] | None = None) -> list[dict]:
    """Rows of measurement CSV files. A file without the kernel, boundary and byte columns is left out (and
    named in ``skipped`` with the reason)."""
    rows = []
    for path in paths:
        got, why = read_measurement_file(path)
        rows += got
        if why and skipped is not None:
            skipped.append(why)
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
                  f"{boundary} {r.get('direction', '')}<br>simulated {bytes_hover(r['simulated_bytes'])}<br>"
                  f"measured {bytes_hover(r['measured_bytes'])}<br>ratio "
                  f"{(r['measured_bytes'] / r['simulated_bytes']) if r['simulated_bytes'] else float('nan'):.4g}"
                  for r in rs],
            hovertemplate="%{text}<extra></extra>"))
    vals = [v for r in rows for v in (r["simulated_bytes"], r["measured_bytes"]) if v > 0] or [1, 10]
    lo, hi = min(vals) / 2, max(vals) * 2
    fig.add_trace(go.Scatter(x=[lo, hi], y=[lo, hi], mode="lines", name="measured = simulated",
                             line={"color": "black", "dash": "dash"}, hoverinfo="skip"))
    return layout(fig, title, "simulated bytes", "measured bytes", units={"xaxis": "B", "yaxis": "B"})
