"""Figures from a scenario's figure specs: each spec names a kind of figure and which cases it shows."""

from __future__ import annotations

from dataclasses import dataclass

import plotly.graph_objects as go

from .. import plots
from ..scenario import FigureSpec, ScenarioError, ScenarioRun, select
from .measured import parity_figure

PLOTLY_CONFIG = {"displaylogo": False, "responsive": True, "toImageButtonOptions": {"format": "svg"}}


@dataclass
class FigureOut:
    name: str
    spec: FigureSpec
    fig: go.Figure | None
    note: str = ""  # why there is no figure, or which files it read


def _refs(run: ScenarioRun) -> list[dict]:
    return [r.model_dump() for r in run.scenario.references]


def make_figure(run: ScenarioRun, spec: FigureSpec, index: int) -> FigureOut:
    scn = run.scenario
    name = spec.name or f"{scn.name}-{index + 1}-{spec.kind.replace('_', '-')}"
    recs = select(run.records, spec.where)
    kind, title = spec.kind, spec.title
    kw = {"title": title} if title else {}
    if kind == "parity":
        fig, note = parity_figure(spec.files, scn.where, title)
        return FigureOut(name, spec, fig, note)
    if not recs:
        raise ScenarioError(f"{scn.where}: figures[{index}]: where={spec.where} matches no case; fix 'where'")
    if kind == "traffic_vs_n":
        fig = plots.traffic_vs_n(recs, spec.boundaries, spec.compulsory, references=_refs(run), **kw)
    elif kind == "time_vs_n":
        fig = plots.time_vs_n(recs, relative_to=spec.relative_to, **kw)
    elif kind == "roofline":
        fig = plots.roofline(recs, run.profiles, **kw)
    elif kind == "traffic_vs_block":
        fig = plots.traffic_vs_block(recs, _refs(run), spec.boundaries, **kw)
    elif kind == "traffic_vs_sram":
        fig = plots.traffic_vs_sram(recs, **kw)
    elif kind == "footprint":
        fig = plots.footprint(recs, **kw)
    elif kind == "by_tensor":
        fig = plots.by_tensor(recs, **kw)
    elif kind == "bars":
        if not spec.x:
            raise ScenarioError(f"{scn.where}: figures[{index}]: kind 'bars' needs 'x' (a field such as kv_heads)")
        fig = plots.bars(recs, spec.x, spec.metric, **kw)
    else:  # pragma: no cover - the schema lists every kind
        raise ScenarioError(f"{scn.where}: figures[{index}]: unknown kind {kind!r}")
    return FigureOut(name, spec, fig)


def make_figures(run: ScenarioRun) -> list[FigureOut]:
    return [make_figure(run, spec, i) for i, spec in enumerate(run.scenario.figures)]

