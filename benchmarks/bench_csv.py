"""What the checked benchmarks (bench_decode.py, bench_varlen.py) do with their rows: one CSV named for the device
under --out, and an exit status that fails where a row missed its float64 check."""

from __future__ import annotations

import csv
import re
import sys
from pathlib import Path


def write_checked_rows(rows: list[dict], out: str, prefix: str, device: str) -> int:
    """Write ``rows`` to ``<out>/<prefix>-<device, as a file name>.csv`` (every key a column, in first-seen order);
    1 if a row's ``check`` is "FAIL", else 0."""
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{prefix}-{re.sub(r'[^A-Za-z0-9]+', '-', device).strip('-').lower()}.csv"
    keys = list(dict.fromkeys(k for r in rows for k in r))
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)
    print(f"wrote {path}")
    failed = [r for r in rows if r.get("check") == "FAIL"]
    if failed:
        print(f"{len(failed)} rows FAILED the float64 check", file=sys.stderr)
    return 1 if failed else 0
