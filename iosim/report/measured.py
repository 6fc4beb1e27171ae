"""The measured section: committed measurement records beside the simulated bytes (a table of ratios and the
parity figure), and the time records beside the predicted times (:func:`time_parity_table`).

:func:`load_measured` is the one place that reads the byte records (:func:`measured_times` the time records);
point it at another loader and the table and the figure follow. Files are found relative to the scenario file's folder, and ``docs/validation/...`` also in
the committed records wherever iosim is installed (:func:`iosim._resources.validation_dir`), never in the
working directory; notes name them as the scenario does, never by an absolute local path.
"""

from __future__ import annotations

import csv
import html
from dataclasses import dataclass, field
from pathlib import Path

import plotly.graph_objects as go

from .. import plots, validation
from .._resources import validation_dir
from ..units import fmt_seconds

# How scenarios name the committed records: the repository's docs/validation/, installed as package data.
RECORDS = "docs/validation/"


@dataclass
class Measured:
    rows: list[dict] = field(default_factory=list)  # plots.MEASUREMENT_COLUMNS, plus ``file``
    read: list[str] = field(default_factory=list)  # files that gave rows, as named in notes
    skipped: list[str] = field(default_factory=list)  # files that are not measurement tables, with why


def load_measured(pattern: str, scenario_dir: Path | None = None) -> Measured:
    """The measured records matching ``pattern`` (a glob), from the first place where it matches a file: the
    scenario's folder, then, for ``docs/validation/...``, the committed records wherever iosim is installed."""
    out = Measured()
    hit = _first_match(pattern, scenario_dir)
    if hit is None:
        return out
    folder, found, shown = hit
    for path in found:
        rows, why = plots.read_measurement_file(path, shown + str(path.relative_to(folder)))
        out.rows += rows
        if why:
            out.skipped.append(why)
    out.read = sorted({r["file"] for r in out.rows})
    return out


def _first_match(pattern: str, scenario_dir: Path | None) -> tuple[Path, list[Path], str] | None:
    """The folder, the files in it and the prefix of their names, at the first place the pattern matches."""
    for folder, glob, shown in _places(pattern, scenario_dir):
        found = sorted(p for p in folder.glob(glob) if p.is_file())
        if found:
            return folder, found, shown
    return None


def _places(pattern: str, scenario_dir: Path | None) -> list[tuple[Path, str, str]]:
    """(folder, glob, prefix of the names shown) to try, in order."""
    p = Path(pattern)
    if p.is_absolute():  # the user's own folder, named as they wrote it
        return [(Path(p.anchor), str(p.relative_to(p.anchor)), p.anchor)]
    places = [(scenario_dir, pattern, "")] if scenario_dir is not None else []
    if pattern.startswith(RECORDS):
        try:
            places.append((validation_dir(), pattern[len(RECORDS):], RECORDS))
        except FileNotFoundError:
            pass
    return places


def scenario_dir(where: str) -> Path | None:
    """The folder of the scenario file a run came from (``where``), if it came from a file."""
    p = Path(where)
    return p.parent if p.suffix in (".yaml", ".yml", ".json") and p.parent.is_dir() else None


def parity_figure(pattern: str, where: str, title: str | None) -> tuple[go.Figure | None, str]:
    """The parity figure of the records, and the note under it (which files it read, which it left out)."""
    m = load_measured(pattern, scenario_dir(where))
    if not m.read and not m.skipped:
        return None, (f"No measurement files match {pattern} yet: the parity figure appears once the "
                      "cross-check writes them (see the validation page).")
    note = ("Read " + ", ".join(m.read) + "." if m.read else "No measured rows found.") + \
        (" Not measurement tables: " + "; ".join(m.skipped) + "." if m.skipped else "")
    kw = {"title": title} if title else {}
    return (plots.parity(m.rows, **kw) if m.rows else None), note


def parity_table(pattern: str, where: str) -> str:
    """Measured ÷ simulated bytes per kernel, boundary and direction: median, min and max over the rows."""
    rows = load_measured(pattern, scenario_dir(where)).rows
    if not rows:
        return f"<p class=note>No measurement rows match {html.escape(pattern)} yet.</p>"
    groups: dict = {}
    for r in rows:
        if r["simulated_bytes"] > 0:
            groups.setdefault((r["kernel"], r["boundary"], r.get("direction", "")), []).append(
                r["measured_bytes"] / r["simulated_bytes"])
    out = []
    for (kernel, boundary, direction), ratios in sorted(groups.items()):
        ratios.sort()
        mid = len(ratios) // 2
        med = ratios[mid] if len(ratios) % 2 else (ratios[mid - 1] + ratios[mid]) / 2
        out.append(f"<tr><td>{html.escape(kernel)}</td><td>{html.escape(boundary)}</td>"
                   f"<td>{html.escape(direction)}</td><td class=num>{len(ratios)}</td>"
                   f"<td class=num><b>{med:.3f}</b></td><td class=num>{ratios[0]:.3f}</td>"
                   f"<td class=num>{ratios[-1]:.3f}</td></tr>")
    ratios = ("<table><tr><th>kernel</th><th>boundary</th><th>direction</th><th>rows</th><th>measured ÷ simulated, "
              f"median</th><th>min</th><th>max</th></tr>{''.join(out)}</table>")
    return ratios + (judged_tables() if pattern.startswith(RECORDS) else "")


def judged_tables() -> str:
    """The committed records judged by the rule of docs/validation.md, one table per device."""
    parts = []
    for device in validation.devices():
        rows = []
        for r in validation.summarize(validation.judge_all(validation.load_record(device))):
            worst = "n/a (measured 0)" if r.worst_error is None else f"{r.worst_error:+.1%}"
            lower = f" ({r.lower_bound} lower bounds)" if r.lower_bound else ""
            rows.append(f"<tr><td>{html.escape(r.kernel)}</td><td>{r.boundary} {r.direction}</td>"
                        f"<td class=num>{r.checks}</td><td class=num><b>{r.passed}</b>{lower}</td>"
                        f"<td class=num>{r.median_error:.1%}</td><td class=num>{worst}</td></tr>")
        parts.append(f"<p class=note>{html.escape(device)}, judged by the rule of the validation page: a check "
                     "passes within 5% (reads) or 10% (writes) of measured, or 1% of the kernel's compulsory bytes, "
                     "or inside the range of repeated launches; <code>global</code> must be exact.</p>"
                     "<table><tr><th>kernel</th><th>boundary</th><th>checks</th><th>within the rule</th>"
                     f"<th>median error</th><th>worst error</th></tr>{''.join(rows)}</table>")
    return "".join(parts)


TIME_KEYS = ("profile", "batch", "heads", "kv_heads", "seq_len", "kv_len", "head_dim", "dtype", "causal")


def measured_times(pattern: str, where: str) -> tuple[dict[tuple, float], list[str]]:
    """Measured seconds of the time records matching ``pattern`` (the columns of docs/validation/<device>-time.csv),
    by (kernel, profile, shape), and the files read."""
    hit = _first_match(pattern, scenario_dir(where))
    if hit is None:
        return {}, []
    folder, found, shown = hit
    out, read = {}, []
    for path in found:
        with path.open(newline="") as f:
            rows = [r for r in csv.DictReader(f) if r.get("measured_s") and r.get("kernel")]
        if rows:
            read.append(shown + str(path.relative_to(folder)))
        for r in rows:
            out[_time_key(r["kernel"], r)] = float(r["measured_s"])
    return out, read


def _time_key(kernel: str, r: dict) -> tuple:
    return (kernel, *(str(r[k]).lower() for k in TIME_KEYS))


def time_parity_table(pattern: str, where: str, records: list[dict]) -> str:
    """Each case's predicted time beside the measured time of the same kernel, profile and shape."""
    measured, read = measured_times(pattern, where)
    rows = []
    for r in records:
        m = measured.get(_time_key(r.get("time_kernel") or "", r))
        if m is None or not r.get("predicted_s"):
            continue
        err = (r["predicted_s"] - m) / m
        rows.append(f"<tr><td>{html.escape(r['profile'])}</td><td>{html.escape(r['time_kernel'])}</td>"
                    f"<td>{html.escape(plots.problem_line(r))}</td><td class=num>{fmt_seconds(r['predicted_s'])}</td>"
                    f"<td class=num>{fmt_seconds(m)}</td><td class=num><b>{err:+.1%}</b></td></tr>")
    if not rows:
        return f"<p class=note>No measured time in {html.escape(pattern)} matches these cases yet.</p>"
    note = f"<p class=note>Measured: {html.escape(', '.join(read))} (the median of warm CUDA-event calls).</p>"
    return (note + "<table><tr><th>profile</th><th>kernel</th><th>problem</th><th>predicted</th><th>measured</th>"
            f"<th>predicted − measured, ÷ measured</th></tr>{''.join(rows)}</table>")
