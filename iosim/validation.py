"""The validation record: measured bytes against simulated ones, judged by one rule (docs/validation.md).

A check is one (problem, kernel, boundary, direction) with the simulated bytes, the measured median and each
repeated launch's measured bytes. It passes when

* ``global``: simulated == measured (the schedule's loads and stores are counted exactly);
* ``hbm``: |simulated - measured| <= max(bound x measured, 1% of the kernel's compulsory bytes), bound 5% for
  reads and 10% for writes; or the simulated figure lies inside the range of the repeated launches widened by the
  bound: min x (1 - bound) <= simulated <= max x (1 + bound).

Compulsory bytes: Q, K, V read once, O written once, and the softmax statistics (one fp32 per query row) of the
flash kernels; iosim's fp8 forward (``flash3-fp8``) reads 1-byte Q, K, V and writes O in bf16, and its quantize
kernels (``fp8-quantize``) read bf16 Q, K, V and write them once in 1 byte. A backward pass (kernels named ``*-bwd``): Q, K, V, O, dO and the statistics read once, dQ, dK, dV
written once, Delta (one fp32 per query row) and the fp32 dQ accumulator once each. Where a head's K and V together
do not fit in L2 (long grids: the blocks of one head drift apart and re-read K/V lines L2 has dropped; in a backward
pass, a query head's Q, dO, statistics and accumulator, the data its K/V blocks share), the model's DRAM reads are a
lower bound, not an estimate: those checks are judged the same way and marked ``lower_bound``.

    >>> from iosim.validation import load_record, judge_all, summary_table
    >>> print(summary_table(judge_all(load_record("h200"))))
"""

from __future__ import annotations

import csv
import statistics
from dataclasses import dataclass
from pathlib import Path

from ._resources import data_dir
from .hardware.gpu import get_profile

BOUND = {"read": 0.05, "write": 0.10}  # relative bound on hbm reads and writes
FLOOR = 0.01  # of the kernel's compulsory bytes: the absolute floor, for near-zero writes
STATS_KERNELS = ("flash2", "flash3", "flash3-fp8", "sdpa-flash", "sdpa-cudnn")  # write the softmax statistics
FP8_ATTENTION = "flash3-fp8"  # iosim's fp8 forward: e4m3 Q, K, V in, O out in bf16
FP8_QUANTIZE = "fp8-quantize"  # its quantize kernels: bf16 Q, K, V in, e4m3 out
OUT_BYTES = 2  # the fp8 forward's O: bf16
SOURCE_BYTES = 2  # what the quantize kernels read: bf16
BACKWARD_SUFFIX = "-bwd"  # a backward pass's kernels: flash2-bwd, sdpa-flash-bwd, sdpa-cudnn-bwd
ELEM_BYTES = {"fp16": 2, "bf16": 2, "fp32": 4, "fp8": 1}
FIELDS = ("kernel", "device", "profile", "batch", "heads", "kv_heads", "seq_len", "kv_len", "head_dim", "dtype",
          "causal", "block_q", "block_kv", "boundary", "direction", "simulated_bytes", "measured_bytes",
          "measured_launches", "window", "seqlens", "page_size")  # window: "left:right" (a side empty: no bound),
# empty for none; seqlens: packed sequences, "queries:keys" each, space-separated (iosim.timing.uncertainty.seqlens_text);
# page_size: the tokens of a page where the keys were in a paged cache (chunked prefill), empty otherwise


class RecordError(ValueError):
    """A record file that cannot be read as a validation record; the message names the file and the field."""


@dataclass(frozen=True)
class Check:
    """One row of a record: the problem, where (boundary, direction), simulated and measured bytes, the measured
    bytes of each repeated launch (empty where there was one), a sliding window (left, right) where the call had one,
    the packed sequences ((queries, keys), ...) of a varlen call, and the page size where its keys were paged."""

    kernel: str
    profile: str
    batch: int
    heads: int
    kv_heads: int
    seq_len: int
    kv_len: int
    head_dim: int
    dtype: str
    causal: bool
    block_q: int
    block_kv: int
    boundary: str
    direction: str
    simulated: int
    measured: int
    launches: tuple[int, ...] = ()
    window: tuple[int | None, int | None] | None = None
    seqlens: tuple[tuple[int, int], ...] | None = None
    page_size: int | None = None

    @property
    def label(self) -> str:
        gqa = f"/{self.kv_heads}" if self.kv_heads != self.heads else ""
        return (f"{self.kernel} N={self.seq_len} H={self.heads}{gqa} d={self.head_dim} {self.dtype}"
                f"{' causal' if self.causal else ''} {self.block_q}x{self.block_kv}"
                + (f" B={self.batch}" if self.batch != 1 else "")
                + (f" window={window_text(self.window)}" if self.window is not None else "")
                + (f" {len(self.seqlens)} sequences" if self.seqlens else "")
                + (f" paged {self.page_size}" if self.page_size else ""))

    @property
    def group(self) -> str:
        """The record table's kernel column: the kernel, and "varlen" for packed sequences, "window" where the call
        had one."""
        if self.page_size:
            return f"{self.kernel} paged"
        if self.seqlens:
            return f"{self.kernel} varlen"
        return f"{self.kernel} window" if self.window is not None else self.kernel

    @property
    def backward(self) -> bool:
        return self.kernel.endswith(BACKWARD_SUFFIX)

    @property
    def compulsory(self) -> int:
        """Q, K, V read once; O (and the flash kernels' statistics) written once (B). A backward pass: Q, K, V, O,
        dO, the statistics read, dQ, dK, dV written, Delta and the fp32 dQ accumulator, each once. The fp8 kernels:
        O in bf16 (flash3-fp8); bf16 in and e4m3 out (fp8-quantize)."""
        e = ELEM_BYTES[self.dtype]
        rows = self.batch * self.heads * self.seq_len
        q = o = rows * self.head_dim * e
        kv = 2 * self.batch * self.kv_heads * self.kv_len * self.head_dim * e
        if self.kernel == FP8_QUANTIZE:  # every element of Q, K, V read in bf16 and written once in e4m3
            elements = (rows + 2 * self.batch * self.kv_heads * self.kv_len) * self.head_dim
            return elements * (SOURCE_BYTES + ELEM_BYTES["fp8"])
        if self.kernel == FP8_ATTENTION:
            o = rows * self.head_dim * OUT_BYTES
        if self.backward:  # Q, O, dO, dQ; K, V, dK, dV; lse, Delta; dQacc
            return 4 * q + 2 * kv + 2 * rows * 4 + rows * self.head_dim * 4
        stats = rows * 4 if self.kernel in STATS_KERNELS else 0
        return q + kv + o + stats


@dataclass(frozen=True)
class Verdict:
    """A judged check: ``error`` (simulated - measured) / measured (None where measured is 0 and simulated not),
    ``passed``, ``by`` ("exact", "bound", "floor", "range" or "" when it failed) and ``lower_bound``."""

    check: Check
    error: float | None
    passed: bool
    by: str
    lower_bound: bool


def lower_bound(check: Check) -> bool:
    """True where the model's DRAM reads are a lower bound: one head's K and V do not fit in L2 (a backward pass:
    one query head's Q, dO, lse, Delta and fp32 dQ accumulator, what its K/V blocks share)."""
    if check.boundary != "hbm" or check.direction != "read":
        return False
    d, e = check.head_dim, ELEM_BYTES[check.dtype]
    # our backward kernel's block visits every query head of its kv head's group in turn: the group's rows
    group = check.heads // check.kv_heads if check.kernel == "flash2-bwd" else 1
    shared = check.seq_len * (2 * d * e + 2 * 4 + d * 4) * group if check.backward else 2 * check.kv_len * d * e
    return shared >= int(get_profile(check.profile).require("l2.capacity"))


def hbm_rule(sim: int, meas: int, direction: str, compulsory: int) -> str:
    """Which part of the ``hbm`` rule a simulated count passes by: "bound" (within BOUND[direction] of the
    measurement), "floor" (within FLOOR of the compulsory bytes) or "" (neither)."""
    if abs(sim - meas) <= BOUND[direction] * meas:
        return "bound"
    return "floor" if abs(sim - meas) <= FLOOR * compulsory else ""


def judge(check: Check) -> Verdict:
    """The rule of the module docstring applied to one check."""
    sim, meas = check.simulated, check.measured
    err = 0.0 if sim == meas else (sim - meas) / meas if meas else None
    if check.boundary == "global":
        return Verdict(check, err, sim == meas, "exact" if sim == meas else "", False)
    bound = BOUND[check.direction]
    by = hbm_rule(sim, meas, check.direction, check.compulsory)
    if not by and check.launches and min(check.launches) * (1 - bound) <= sim <= max(check.launches) * (1 + bound):
        by = "range"
    return Verdict(check, err, bool(by), by, lower_bound(check))


def judge_all(checks: list[Check]) -> list[Verdict]:
    return [judge(c) for c in checks]


def window_text(window: tuple[int | None, int | None] | None) -> str:
    """A window as the record writes it: "left:right", a side empty for no bound; "" for none."""
    return "" if window is None else ":".join("" if w is None else str(w) for w in window)


def seqlens_text(seqlens) -> str:
    """Packed sequences as the records write them: "queries:keys" each, space-separated; "" for none."""
    return " ".join(f"{q}:{k}" for q, k in seqlens) if seqlens else ""


def _window(s: str | None) -> tuple[int | None, int | None] | None:
    if not s:
        return None
    left, right = s.split(":")
    return (int(left) if left else None, int(right) if right else None)


def _seqlens(s: str | None) -> tuple[tuple[int, int], ...] | None:
    if not s:
        return None
    return tuple((int(q), int(k)) for q, k in (x.split(":") for x in s.split()))


def _bool(s: str) -> bool:
    return str(s).strip().lower() in ("true", "1", "yes")


def read_checks(path: str | Path) -> list[Check]:
    """The checks of one record CSV (columns :data:`FIELDS`; ``measured_launches`` optional)."""
    path = Path(path)
    out = []
    with open(path, newline="") as f:
        for i, r in enumerate(csv.DictReader(f), start=2):
            try:
                launches = tuple(int(x) for x in (r.get("measured_launches") or "").split(";") if x)
                out.append(Check(r["kernel"], r["profile"], int(r["batch"]), int(r["heads"]), int(r["kv_heads"]),
                                 int(r["seq_len"]), int(r["kv_len"]), int(r["head_dim"]), r["dtype"],
                                 _bool(r["causal"]), int(r["block_q"]), int(r["block_kv"]), r["boundary"],
                                 r["direction"], int(float(r["simulated_bytes"])), int(float(r["measured_bytes"])),
                                 launches, _window(r.get("window")), _seqlens(r.get("seqlens")),
                                 int(r["page_size"]) if r.get("page_size") else None))
            except (KeyError, ValueError, TypeError) as exc:
                raise RecordError(f"{path}, line {i}: {type(exc).__name__}: {exc}; expected the columns "
                                  f"{', '.join(FIELDS)}") from None
    return out


def record_dir() -> Path:
    """The folder of the per-device records (docs/validation/ in a checkout, inside the package when installed)."""
    return data_dir("validation")


def devices() -> list[str]:
    """Devices with a byte record (``<device>.csv``; beside them, the time records ``<device>-time.csv`` and their
    held-out part ``<device>-time-heldout.csv``, the MLA references' ``<device>-mla.csv`` and ``-mla-prefill.csv``
    and the decode kernels' byte record ``<device>-decode.csv``, benchmarks/decode_bytes_record.py's, judged there a
    kernel at a time)."""
    skip = ("-time", "-time-heldout", "-mla", "-mla-prefill", "-decode")
    return sorted(p.stem for p in record_dir().glob("*.csv") if not p.stem.endswith(skip))


def load_record(device: str) -> list[Check]:
    """The checks of ``docs/validation/<device>.csv``, from any working directory, installed or not."""
    path = record_dir() / f"{device}.csv"
    if not path.is_file():
        raise RecordError(f"no validation record for device {device!r} ({path}); records: {', '.join(devices())}")
    return read_checks(path)


def write_checks(path: str | Path, checks: list[Check], device: str) -> None:
    """Write ``checks`` as a record CSV (columns :data:`FIELDS`)."""
    with open(path, "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(FIELDS)
        for c in checks:
            w.writerow([c.kernel, device, c.profile, c.batch, c.heads, c.kv_heads, c.seq_len, c.kv_len, c.head_dim,
                        c.dtype, c.causal, c.block_q, c.block_kv, c.boundary, c.direction, c.simulated, c.measured,
                        ";".join(map(str, c.launches)), window_text(c.window), seqlens_text(c.seqlens),
                        c.page_size or ""])


@dataclass(frozen=True)
class Row:
    """One line of a record's table: a kernel at a boundary and direction."""

    kernel: str
    boundary: str
    direction: str
    checks: int
    passed: int
    median_error: float
    worst_error: float | None  # signed; None where a measured 0 met a simulated non-zero
    lower_bound: int


def summarize(verdicts: list[Verdict]) -> list[Row]:
    """Per kernel, boundary and direction: checks, within the rule, median |error| and the worst error."""
    groups: dict[tuple, list[Verdict]] = {}
    for v in verdicts:
        groups.setdefault((v.check.group, v.check.boundary, v.check.direction), []).append(v)
    rows = []
    for (k, b, d), vs in groups.items():
        errs = [v.error for v in vs]
        finite = [abs(e) for e in errs if e is not None]
        worst = None if None in errs else max(errs, key=abs)
        rows.append(Row(k, b, d, len(vs), sum(v.passed for v in vs), statistics.median(finite) if finite else 0.0,
                        worst, sum(v.lower_bound for v in vs)))
    return rows


def summary_table(verdicts: list[Verdict]) -> str:
    """The record's table (Markdown)."""
    lines = ["| kernel | boundary | checks | within the rule | median error | worst error |", "|---|---|---:|---:|---:|---:|"]
    for r in summarize(verdicts):
        worst = "n/a (measured 0)" if r.worst_error is None else f"{r.worst_error:+.1%}"
        lb = f" ({r.lower_bound} lower bounds)" if r.lower_bound else ""
        lines.append(f"| {r.kernel} | {r.boundary} {r.direction} | {r.checks} | {r.passed}{lb} | "
                     f"{r.median_error:.1%} | {worst} |")
    return "\n".join(lines)


def outliers(verdicts: list[Verdict]) -> list[Verdict]:
    """The checks outside the rule, and those passed where the model is only a lower bound."""
    return [v for v in verdicts if not v.passed or v.lower_bound]
