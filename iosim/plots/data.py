"""A figure's data as rows, and as a CSV beside the figure: one row per plotted point."""

from __future__ import annotations

import csv
import re
from pathlib import Path

import numpy as np
import plotly.graph_objects as go


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
    return re.sub(r"<[^>]+>", "", s.replace("<br>", "; "))


def write_figure_csv(fig: go.Figure, path: str | Path) -> Path:
    path = Path(path)
    rows = figure_data(fig)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["trace", "x", "y", "hover"])
        w.writeheader()
        w.writerows(rows)
    return path
