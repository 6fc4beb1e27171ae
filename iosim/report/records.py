"""The committed records the report reads (``docs/benchmarks/``, ``docs/validation/``): their rows, or a note saying
why there are none. Nothing here raises for a missing or foreign file: a section names it instead."""

from __future__ import annotations

import csv

from .._resources import benchmarks_dir, validation_dir


def csv_rows(path) -> list[dict] | None:
    """The rows of the CSV file ``path`` as dicts, or None where it cannot be read."""
    try:
        with open(path, newline="") as f:
            return list(csv.DictReader(f))
    except OSError:
        return None


def read_record(name: str, columns: set[str]) -> tuple[list[dict], str | None]:
    """The rows of ``docs/benchmarks/<name>``, or ([], why not)."""
    rows = csv_rows(benchmarks_dir() / name)
    if rows is None:
        return [], f"docs/benchmarks/{name}: no record"
    if not rows or not columns <= set(rows[0]):
        return [], f"docs/benchmarks/{name}: not the expected record (columns {', '.join(sorted(columns))})"
    return rows, None


def validation_rows(name: str, file: str, columns: set[str], what: str, script: str) -> tuple[list[dict], str]:
    """The rows of ``docs/validation/<file>`` (a record ``benchmarks/<script>`` writes), or ([], a note of GPU
    ``name`` saying there is no ``what``, or that the file is not the expected record)."""
    rows = csv_rows(validation_dir() / file)
    if rows is None:
        return [], f"<p class=note>{name}: no {what} (python benchmarks/{script} --measure).</p>"
    if not rows or not columns <= set(rows[0]):
        return [], f"<p class=note>{name}: {file} is not the expected record.</p>"
    return rows, ""
