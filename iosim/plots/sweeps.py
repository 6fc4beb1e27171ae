"""Sweeps of the tiling: bytes against the block size, and against the SRAM size beside the I/O lower bound."""

from __future__ import annotations

import math

import numpy as np
import plotly.graph_objects as go

from .records import bytes_hover, hover, label, series
from .style import BOUNDARY_DASH, BOUNDARY_LABEL, color, layout
from .traffic import reference_markers


def traffic_vs_block(records: list[dict], references: list[dict] = (), boundaries=("global",),
                     title: str = "Traffic vs block size") -> go.Figure:
    """Bytes against the tile size (Br = Bc = block), with published or transcribed values beside them.
    Tiles that do not fit the profile's shared memory per thread block are drawn hollow."""
    fig = go.Figure()
    for ident, rows in series(records, "block_kv"):
        rows = [r for r in rows if r.get("global_bytes") is not None]
        if not rows:
            continue
        sched = rows[0]["schedule"]
        for b in boundaries:
            fig.add_trace(go.Scatter(
                x=[r["block_kv"] for r in rows], y=[r[f"{b}_bytes"] for r in rows],
                name=f"{label(ident, schedule=sched)} (simulated{', ' + b if len(boundaries) > 1 else ''})",
                mode="lines+markers", line={"color": color(sched), "dash": BOUNDARY_DASH[b]},
                marker={"size": 10, "color": color(sched),
                        "symbol": ["circle" if r.get("fits", True) else "circle-open" for r in rows]},
                text=[hover(r, [f"{BOUNDARY_LABEL[b]}: {bytes_hover(r[f'{b}_bytes'])}",
                                 f"on-chip working set {r['sram_peak_bytes']:,} B per thread block"
                                 if r.get("sram_peak_bytes") else ""]) for r in rows],
                hovertemplate="%{text}<extra></extra>"))
    reference_markers(fig, references)
    blocks = sorted({r["block_kv"] for r in records if r.get("block_kv")})
    layout(fig, title, "block size Br = Bc (rows per tile)", "bytes moved (decimal: 1 GB = 10⁹ B)",
           units={"yaxis": "B"})
    fig.update_xaxes(type="log", tickvals=blocks, ticktext=[str(b) for b in blocks])
    return fig


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
    for ident, rows in series(rows_all, "sram_elements"):
        rows = [r for r in rows if r.get("global_bytes") is not None]
        if not rows:
            continue
        sched = rows[0]["schedule"]
        fig.add_trace(go.Scatter(
            x=[r["sram_elements"] for r in rows], y=[r["global_bytes"] for r in rows],
            name=f"{label(ident, schedule=sched)} (simulated, global)", mode="lines+markers",
            line={"color": color(sched)}, marker={"size": 7},
            text=[hover(r, [f"M = {r['sram_elements']:,} elements", f"global: {bytes_hover(r['global_bytes'])}",
                             f"lower bound (Θ, constant 1): {bytes_hover(_bound_bytes(r, r['sram_elements']))}"])
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
            text=[f"M = {m:,.0f}: bound {bytes_hover(v)}" for m, v in zip(grid, y)],
            hovertemplate="%{text}<extra></extra>"))
        fig.add_vline(x=d * d, line={"color": "#999", "dash": "dot"})
        fig.add_annotation(x=math.log10(d * d), y=1, yref="paper", text=f"M = d² = {d * d:,}", showarrow=False,
                           yanchor="bottom", font={"size": 12})
        fig.add_annotation(x=math.log10(d * d), y=0.02, yref="paper", xanchor="right", showarrow=False,
                           text="small cache: N²d/√M  ", font={"size": 11, "color": "#555"})
        fig.add_annotation(x=math.log10(d * d), y=0.02, yref="paper", xanchor="left", showarrow=False,
                           text="  large cache: N²d²/M", font={"size": 11, "color": "#555"})
    return layout(fig, title, "on-chip SRAM size M (elements)", "bytes moved (decimal: 1 GB = 10⁹ B)",
           units={"yaxis": "B"})


def _bound_bytes(r: dict, M):
    eb = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1}[r["dtype"]]
    return lower_bound_elements(r["seq_len"], r["kv_len"], r["head_dim"], M) * eb * r["batch"] * r["heads"]

