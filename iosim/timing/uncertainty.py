"""A prediction's uncertainty, from the committed time records' residuals (issue 29 item 4).

Each row of ``docs/validation/<device>-time.csv`` holds a kernel's predicted and measured seconds on one shape. The
rows are grouped by kernel (the description's name: iosim-flash2, fa2, cudnn, iosim-naive, and the backward's
iosim-flash2-bwd, fa2-bwd, cudnn-bwd, iosim-flash3-bwd; a kernel's fp8 rows, dtype fp8, are a kernel of their own,
``<name> fp8``: another arithmetic and other bytes than its bf16 rows, so neither widens the other's band) and by
**regime**:

* ``decode``: a forward pass of at most 64 query rows against a longer K/V (naive's three kernels are measured
  30-40% slower than predicted there, FA2's split-KV path 9-12%, against about 0 for prefill);
* ``causal`` and ``non-causal`` (prefill and every backward): cuDNN's causal forward is measured ~10% slower than
  its non-causal one relative to the model on both GPUs, naive's causal ~7% faster.

Grid size was looked at too: the records hold 2 rows per kernel under one wave and 7 at one to four waves (mostly
the decode rows), too few for a band of their own. A prediction's band is its time times the 10th and 90th
percentiles of measured ÷ predicted in its group (linear interpolation between order statistics, numpy's default),
from the records of the device whose profile it runs on, or from all devices' rows pooled for a profile with no
record (a profile on datasheet rates, uncalibrated, gets no band: the records' residuals are those of measured
rates). A regime with fewer than :data:`MIN_ROWS` rows falls back to the kernel's rows in every regime; a kernel
with no rows (fa3, a user's description, the peak roofline) says "no record".

Limits: these residuals are in-sample (the forward's one fitted constant, ``OVERLAP_LOSS``, was fitted on the
H100 record's rows), they describe warm back-to-back calls with the L2 model (the records' conditions), and a
10-90 band leaves a fifth of the recorded rows outside it by construction. The CSVs are read once, when a band is
first asked for (``import iosim`` reads nothing).
"""

from __future__ import annotations

import csv
from functools import cache
from pathlib import Path
from typing import NamedTuple

from .._resources import data_dir
from .estimate import Uncertainty

LOW_Q, HIGH_Q = 0.10, 0.90
MIN_ROWS = 5  # fewer rows in a regime: the kernel's band over all regimes
DECODE_MAX_ROWS = 64  # a forward with at most this many query rows against a longer K/V is decode
POOLED = "pooled"
ALL = "all regimes"
NO_RECORD = "no record"
UNCALIBRATED = "no record for datasheet rates"

__all__ = ["ALL", "DENSE", "NO_RECORD", "POOLED", "UNCALIBRATED", "Layout", "band", "groups", "quantile", "record_kernel",
           "regime", "table"]


class Layout(NamedTuple):
    """How a call lays its keys out, where that makes a regime of its own: a sliding window, packed sequences, and
    packed sequences whose keys are in a paged cache."""

    windowed: bool = False
    packed: bool = False
    paged: bool = False


DENSE = Layout()  # the dense batch: no window, no packed sequences


def regime(kernel: str, seq_len: int, kv_len: int, causal: bool, windowed: bool = False, packed: bool = False,
           paged: bool = False) -> str:
    """``paged`` (packed sequences whose keys are in a paged cache: chunked prefill), ``varlen`` (packed sequences),
    ``window`` (a sliding window's call), ``decode`` (a short forward against a longer K/V), ``causal`` or
    ``non-causal``."""
    if packed:
        return "paged" if paged else "varlen"
    if windowed:
        return "window"
    if not kernel.endswith("-bwd") and seq_len <= DECODE_MAX_ROWS and seq_len < kv_len:
        return "decode"
    return "causal" if causal else "non-causal"


def record_kernel(kernel: str, dtype: str | None) -> str:
    """The group a row or a prediction of ``kernel`` in ``dtype`` belongs to: the kernel, or ``<kernel> fp8``."""
    return f"{kernel} fp8" if dtype == "fp8" else kernel


def quantile(values: list[float], q: float) -> float:
    """The ``q`` quantile of ``values``, linear between order statistics (numpy.quantile's default)."""
    x = sorted(values)
    h = (len(x) - 1) * q
    lo = int(h)
    return x[lo] + (h - lo) * (x[min(lo + 1, len(x) - 1)] - x[lo])


@cache
def groups(folder: str | None = None) -> dict[tuple[str, str, str], tuple[float, ...]]:
    """measured ÷ predicted by (scope, kernel, regime) over every ``*-time.csv`` in ``folder`` (default: the
    committed records); scope is a record's profile, or :data:`POOLED` for all of them; regime :data:`ALL` too."""
    root = Path(folder) if folder else data_dir("validation")
    out: dict[tuple[str, str, str], list[float]] = {}
    for path in sorted(root.glob("*-time.csv")):
        with path.open(newline="") as f:
            for r in csv.DictReader(f):
                if not (r.get("measured_s") and r.get("predicted_s") and float(r["predicted_s"]) > 0):
                    continue
                ratio = float(r["measured_s"]) / float(r["predicted_s"])
                reg = regime(r["kernel"], int(r["seq_len"]), int(r["kv_len"] or r["seq_len"]),
                             r["causal"].strip().lower() == "true", bool(r.get("window")), bool(r.get("seqlens")),
                             bool(r.get("page_size")))
                kernel = record_kernel(r["kernel"], r.get("dtype"))
                for scope in (r["profile"], POOLED):
                    for g in (reg, ALL):
                        out.setdefault((scope, kernel, g), []).append(ratio)
    return {k: tuple(v) for k, v in out.items()}


def _profiles(folder: str | None) -> list[str]:
    return sorted({s for s, _, _ in groups(folder)} - {POOLED})


def band(kernel: str, profile: str, problem, predicted_s: float, folder: str | None = None,
         calibrated: bool = True, layout: Layout = DENSE) -> Uncertainty:
    """The band of ``predicted_s`` for ``kernel`` on ``profile`` (a name) and ``problem`` (seq_len, kv_len,
    causal; dtype, where given: fp8 takes the kernel's fp8 rows): that profile's record if it has one, else all
    records pooled; the regime's rows, else the kernel's.
    A prediction on datasheet rates (``calibrated`` False) gets none: the records' residuals are of measured rates."""
    if not calibrated:
        return Uncertainty(None, None, UNCALIBRATED, 0, "")
    g = groups(folder)
    recorded = _profiles(folder)
    scope = profile if profile in recorded else POOLED
    device = profile if scope == profile else f"{POOLED}: {', '.join(recorded)}"
    reg = regime(kernel, problem.seq_len, problem.kv_len, problem.causal, *layout)
    kernel = record_kernel(kernel, getattr(problem, "dtype", None))
    for key in ((scope, kernel, reg), (scope, kernel, ALL)):
        ratios = g.get(key, ())
        if len(ratios) >= MIN_ROWS or (key[2] == ALL and ratios):
            return Uncertainty(predicted_s * quantile(list(ratios), LOW_Q),
                               predicted_s * quantile(list(ratios), HIGH_Q), f"{kernel}, {key[2]}", len(ratios),
                               device)
    return Uncertainty(None, None, NO_RECORD, 0, "")


def table(folder: str | None = None) -> list[tuple[str, str, str, int, float, float, float]]:
    """(scope, kernel, regime, rows, p10, median, p90) of measured ÷ predicted for every group (docs/timing.md)."""
    return [(s, k, r, len(v), quantile(list(v), LOW_Q), quantile(list(v), 0.5), quantile(list(v), HIGH_Q))
            for (s, k, r), v in sorted(groups(folder).items())]
