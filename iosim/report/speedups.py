"""The report's section "Measured speedups": standard attention against FlashAttention-2, cuDNN and iosim's
flash2 on each GPU with a record, measured beside the time model's prediction and the seeds' claims.

Two committed records per GPU, found wherever iosim is installed (:mod:`iosim._resources`), never in the working
directory: the throughput record ``docs/benchmarks/<profile>.csv`` (one run per commit, appended; the newest run
that has ``torch-standard`` is shown, so every speedup is two times of one run) and the time record
``docs/validation/<device>-time.csv`` (predicted and measured kernel times; the predicted speedup is the model's
``iosim-naive`` ÷ its ``fa2`` or ``cudnn``, on the benchmark shapes). A record that is missing, unreadable or
without the rows needed is named in the section; nothing here raises for it.
"""

from __future__ import annotations

import csv
import html
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from .. import plots
from .._resources import benchmarks_dir, scenarios_dir, validation_dir
from ..hardware.gpu import ProfileError, get_profile
from ..plots.speedups import FA3_CLAIM, FA_CLAIM, SHORT_N, SpeedupFigure
from .figures import PLOTLY_CONFIG

SECTION_ID = "measured-speedups"
TITLE = "Measured speedups"
GPUS = (("H100", "h100", "h100-sxm5-80gb"), ("H200", "h200", "h200-sxm-141gb"))  # name, device key, profile
STANDARD = "torch-standard"  # the throughput record's standard attention: matmul, softmax, matmul in the dtype
MODEL_STANDARD = "iosim-naive"  # the time model's standard attention (tensor cores, S and P in the dtype)
MODEL_KERNELS = {"fa2": "sdpa-flash", "cudnn": "sdpa-cudnn"}  # time-record kernel -> the backend it models
HEAD_DIMS = (64, 128)
FROM_N = 1024  # the table's ranges: N >= this


@dataclass
class GpuSpeedups:
    name: str  # H100
    profile: str  # h100-sxm5-80gb
    bench_file: str  # as the report names it
    time_file: str
    measured: list[dict] = field(default_factory=list)
    predicted: list[dict] = field(default_factory=list)
    run: dict | None = None  # device, commit, date of the run shown
    missing: list[str] = field(default_factory=list)  # sentences: which record is missing or lacks what

    @property
    def figure(self) -> SpeedupFigure:
        by = f"{self.run['device']}, run {self.run['commit']} of {self.run['date']}" if self.run else ""
        return SpeedupFigure(self.name, self.measured, self.predicted, by, _calibration(self.profile))


def _calibration(profile: str) -> str:
    try:
        return plots.calibrated_on(get_profile(profile).calibration_label())
    except ProfileError:
        return "calibration unknown"


def _read(path: Path | None, shown: str, columns: set[str]) -> tuple[list[dict], str | None]:
    """The rows of a CSV record, or why there are none (missing, unreadable, columns absent)."""
    if path is None or not path.is_file():
        return [], f"{shown} is missing"
    try:
        with path.open(newline="", encoding="utf-8") as f:
            rows = list(csv.DictReader(f))
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        return [], f"{shown} cannot be read ({exc})"
    lacking = sorted(columns - set(rows[0] if rows else ()))
    return (rows, None) if not lacking else ([], f"{shown} has no columns {', '.join(lacking)}")


def _num(v) -> float | None:
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def _true(v) -> bool:
    return str(v).strip().lower() in ("true", "1", "yes")


BENCH_COLUMNS = {"device", "date", "commit", "dtype", "head_dim", "seq_len", "causal", "backend", "ms"}
TIME_COLUMNS = {"kernel", "batch", "heads", "kv_heads", "seq_len", "kv_len", "head_dim", "dtype", "causal",
                "predicted_s"}


def newest_run(rows: list[dict], has) -> list[dict]:
    """The rows of the newest run (commit and date; later in the file = newer on the same date) that has a row for
    which ``has(row)`` holds, or [] where none has."""
    last: dict[tuple, int] = {}
    for i, r in enumerate(rows):
        if has(r):
            last[(r.get("commit"), r.get("date"))] = i
    if not last:
        return []
    key = max(last, key=lambda k: (k[1] or "", last[k]))
    return [r for r in rows if (r.get("commit"), r.get("date")) == key]


def newest_standard_run(rows: list[dict]) -> list[dict]:
    """The rows of the newest run that has torch-standard rows, or [] where none has."""
    return newest_run(rows, lambda r: r.get("backend") == STANDARD)


def _dtype(rows: list[dict]) -> str | None:
    have = {r.get("dtype") for r in rows}
    return "bf16" if "bf16" in have else min(have - {None}, default=None)


def measured_speedups(run: list[dict]) -> list[dict]:
    """torch-standard ms ÷ each backend's ms, per (head dim, causal, N) of one run, d 64 and 128, one dtype."""
    dtype = _dtype([r for r in run if r.get("backend") == STANDARD])
    ms: dict[tuple, float] = {}
    for r in run:
        d, n, t = _num(r.get("head_dim")), _num(r.get("seq_len")), _num(r.get("ms"))
        if r.get("dtype") == dtype and d in HEAD_DIMS and n and t and t > 0:
            ms[(r["backend"], int(d), _true(r.get("causal")), int(n))] = t
    out = []
    for (backend, d, causal, n), t in sorted(ms.items()):
        std = ms.get((STANDARD, d, causal, n))
        if backend in plots.SPEEDUP_BACKENDS and std:
            out.append({"backend": backend, "head_dim": d, "causal": causal, "seq_len": n, "speedup": std / t,
                        "ms": t, "standard_ms": std, "naive_ms": ms.get((MODEL_STANDARD, d, causal, n)),
                        "dtype": dtype})
    return out


def _benchmark_shape(r: dict) -> bool:
    """docs/benchmarks.md's shapes: batch × N = 16K tokens, heads = 2048 / d, self-attention, no grouping."""
    b, h, kh, n, m, d = (int(_num(r.get(k)) or 0) for k in ("batch", "heads", "kv_heads", "seq_len", "kv_len",
                                                          "head_dim"))
    return n == m and h == kh and d in HEAD_DIMS and h * d == 2048 and b == max(1, 16384 // max(n, 1))


def predicted_speedups(rows: list[dict], profile: str, dtype: str | None) -> list[dict]:
    """The model's iosim-naive ÷ fa2 and ÷ cudnn on the benchmark shapes of ``profile`` in ``dtype``."""
    dtype = dtype or _dtype(rows)
    s: dict[tuple, float] = {}
    for r in rows:
        t = _num(r.get("predicted_s"))
        if r.get("profile", profile) == profile and r.get("dtype") == dtype and _benchmark_shape(r) and t:
            s[(r["kernel"], int(r["head_dim"]), _true(r["causal"]), int(r["seq_len"]))] = t
    out = []
    for (kernel, d, causal, n), t in sorted(s.items()):
        std = s.get((MODEL_STANDARD, d, causal, n))
        if kernel in MODEL_KERNELS and std:
            out.append({"kernel": kernel, "backend": MODEL_KERNELS[kernel], "head_dim": d, "causal": causal,
                        "seq_len": n, "speedup": std / t, "s": t, "standard_s": std, "dtype": dtype})
    return out


def _folder(which) -> Path | None:
    try:
        return which()
    except FileNotFoundError:
        return None


def load_gpu(name: str, device: str, profile: str, bench: Path | None = None,
             validation: Path | None = None) -> GpuSpeedups:
    """One GPU's measured and predicted speedups from its two records (folders: the committed ones by default)."""
    bench = bench or _folder(benchmarks_dir)
    validation = validation or _folder(validation_dir)
    g = GpuSpeedups(name, profile, f"docs/benchmarks/{profile}.csv", f"docs/validation/{device}-time.csv")
    rows, why = _read(bench / f"{profile}.csv" if bench else None, g.bench_file, BENCH_COLUMNS)
    run = newest_standard_run(rows)
    if why:
        g.missing.append(f"{why}: no measured speedups")
    elif not run:
        runs = sorted({f"{r['commit']} of {r['date']}" for r in rows})
        g.missing.append(f"{g.bench_file} has no run with {STANDARD} (runs: {', '.join(runs) or 'none'}): "
                         "no measured speedups")
    else:
        g.run = {k: run[-1].get(k, "") for k in ("device", "commit", "date")}
        g.measured = measured_speedups(run)
    t_rows, why = _read(validation / f"{device}-time.csv" if validation else None, g.time_file, TIME_COLUMNS)
    g.predicted = predicted_speedups(t_rows, profile, g.measured[0]["dtype"] if g.measured else None)
    if why:
        g.missing.append(f"{why}: no predicted speedups")
    elif not g.predicted:
        g.missing.append(f"{g.time_file} has no {MODEL_STANDARD} beside fa2 or cudnn on the benchmark shapes: "
                         "no predicted speedups")
    return g


def builtin_report(runs) -> bool:
    """Whether ``runs`` are every built-in scenario (the default ``iosim report``), which shows this section."""
    try:
        builtin = {p.resolve() for p in scenarios_dir().glob("*.yaml")}
    except FileNotFoundError:
        return False
    return bool(builtin) and {Path(r.scenario.where).resolve() for r in runs} >= builtin


def load_speedups(bench: Path | None = None, validation: Path | None = None) -> list[GpuSpeedups]:
    """Every GPU of :data:`GPUS`, from the committed records (or the folders given)."""
    return [load_gpu(*gpu, bench=bench, validation=validation) for gpu in GPUS]


# ------------------------------------------------------------------------------------------------------------------
# the table and the section


def _x(v: float) -> str:
    return f"{v:.2f}×" if v < 10 else f"{v:.1f}×"


def _lohi(vals: list[float], sep: str = " to ") -> str:
    lo, hi = _x(min(vals)), _x(max(vals))
    return lo if lo == hi else f"{lo}{sep}{hi}"


def _span(vals: list[float]) -> str:
    if not vals:
        return "—"
    shapes = f"{len(vals)} shape{'s' if len(vals) > 1 else ''}"
    if _x(min(vals)) == _x(max(vals)):
        return f"{_x(vals[0])} ({shapes})"
    return f"{_lohi(vals)} (median {_x(statistics.median(vals))}, {shapes})"


def versus(vals: list[float], claim: tuple[float, float]) -> str:
    """How measured values compare with a claimed range lo-hi×."""
    lo, hi = claim
    if not vals:
        return "not measured"
    above, below = sum(v > hi for v in vals), sum(v < lo for v in vals)
    inside = len(vals) - above - below
    if above == len(vals):
        return f"<b>above</b> the claim: every shape beyond {hi:g}×"
    if below == len(vals):
        return f"<b>below</b> the claim: every shape under {lo:g}×"
    if inside == len(vals):
        return "<b>within</b> the claim"
    return f"{inside} of {len(vals)} shapes within, {above} above, {below} below"


def _pick(rows: list[dict], backend: str, from_n: int = FROM_N) -> dict[tuple, dict]:
    return {(r["head_dim"], r["causal"], r["seq_len"]): r for r in rows
            if r["backend"] == backend and r["seq_len"] >= from_n}


def _ratio(rows: list[dict], over: str, under: str) -> list[float]:
    """Per shape, ``over``'s speedup ÷ ``under``'s (= under's time ÷ over's time), N >= FROM_N."""
    a, b = _pick(rows, over), _pick(rows, under)
    return [a[k]["speedup"] / b[k]["speedup"] for k in sorted(a.keys() & b.keys())]


def _short(rows: list[dict]) -> tuple[str, str]:
    """The shortest N: each kernel's speedup there, and whether standard attention wins (speedup < 1)."""
    if not rows:
        return "—", "not measured"
    n0 = min(r["seq_len"] for r in rows)
    at = {b: [r["speedup"] for r in rows if r["seq_len"] == n0 and r["backend"] == b] for b in MODEL_KERNELS.values()}
    shown = ", ".join(f"{plots.SPEEDUP_BACKENDS[b][0].split(' (')[0]} {_lohi(v, '–')}" for b, v in at.items() if v)
    wins = [r for r in rows if r["speedup"] < 1 and r["backend"] in at]
    if wins:
        top = max(r["seq_len"] for r in wins)
        verdict = f"<b>seen</b>: standard attention is faster up to N = {top:,}"
    else:
        verdict = (f"<b>not seen</b> at N ≥ {n0:,}: every fused kernel is faster"
                   + (" (no shorter N measured)" if n0 >= SHORT_N else ""))
    return f"at N = {n0:,}: {shown}", verdict


def _model_check(m: list[dict], p: list[dict]) -> tuple[str, str, str]:
    """The model against the same run: iosim-naive ÷ FA2 and ÷ cuDNN measured, predicted, and their quotient."""
    pred = {(r["backend"], r["head_dim"], r["causal"], r["seq_len"]): r["speedup"] for r in p}
    pairs = [(r["naive_ms"] / r["ms"], pred[k]) for r in m if r["seq_len"] >= FROM_N and r.get("naive_ms")
             and (k := (r["backend"], r["head_dim"], r["causal"], r["seq_len"])) in pred]
    if not pairs:
        return "—", "—", "no iosim-naive time in the run"
    q = [b / a for a, b in pairs]
    return (_span([a for a, _ in pairs]), _span([b for _, b in pairs]),
            f"predicted ÷ measured: median {statistics.median(q):.2f}, {min(q):.2f} to {max(q):.2f}")


def _gpu_rows(g: GpuSpeedups) -> list[str]:
    m = g.measured
    shapes = {(r["head_dim"], r["causal"], r["seq_len"]) for r in m}
    p = [r for r in g.predicted if not m or (r["head_dim"], r["causal"], r["seq_len"]) in shapes]  # same shapes
    fa, fa3 = f"{FA_CLAIM[0]:g}-{FA_CLAIM[1]:g}×", f"{FA3_CLAIM[0]:g}-{FA3_CLAIM[1]:g}× FA2"
    cells = []
    for backend, what in (("sdpa-flash", "FA2 ÷ standard"), ("sdpa-cudnn", "cuDNN ÷ standard"),
                          ("iosim-flash2", "iosim flash2 ÷ standard")):
        vals = [r["speedup"] for r in _pick(m, backend).values()]
        pred = [r["speedup"] for r in _pick(p, backend).values()]
        cells.append((what, _span(vals), _span(pred), f"FlashAttention {fa}", versus(vals, FA_CLAIM)))
    ratio, pred = _ratio(m, "sdpa-cudnn", "sdpa-flash"), _ratio(p, "sdpa-cudnn", "sdpa-flash")
    cells.append(("cuDNN ÷ FA2", _span(ratio), _span(pred), f"FA3-class {fa3}", versus(ratio, FA3_CLAIM)))
    check = _model_check(m, p)
    cells.append(("the model's check: iosim-naive ÷ FA2 and cuDNN", check[0], check[1], "—", check[2]))
    shown, verdict = _short(m)
    cells.append(("the shortest N", shown, _short(g.predicted)[0], f"standard wins below ~{SHORT_N} tokens",
                  verdict))
    run = (f"<br><span class=meta>run {html.escape(g.run['commit'])}, {html.escape(g.run['date'])}</span>"
           if g.run else "")
    out = []
    for i, c in enumerate(cells):
        head = f"<td rowspan={len(cells)}><b>{g.name}</b>{run}</td>" if i == 0 else ""
        out.append(f"<tr>{head}<td>{c[0]}</td><td class=num>{c[1]}</td><td class=num>{c[2]}</td>"
                   f"<td>{c[3]}</td><td>{c[4]}</td></tr>")
    return out


def speedup_table(gpus: list[GpuSpeedups]) -> str:
    """Per GPU: the measured and predicted speedup ranges (N >= 1,024) and how the measured compare with the
    seeds' claims."""
    rows = [r for g in gpus if g.measured or g.predicted for r in _gpu_rows(g)]
    if not rows:
        return "<p class=note>No GPU has a speedup record yet.</p>"
    return (f"<table><tr><th>GPU</th><th>comparison</th><th>measured, N ≥ {FROM_N:,}</th>"
            f"<th>predicted by the time model, N ≥ {FROM_N:,}</th><th>the seeds' claim</th>"
            f"<th>measured against the claim</th></tr>{''.join(rows)}</table>")


INTRO = (
    "<p>Standard attention (<code>torch-standard</code>: torch's matmul, softmax and matmul in the input dtype, S "
    "and P in memory) against the fused kernels, FlashAttention-2 (torch SDPA's flash backend, "
    "<code>sdpa-flash</code>), cuDNN's fused attention (an FA3-class Hopper kernel, <code>sdpa-cudnn</code>) and "
    "iosim's own flash2, on the benchmark shapes of the benchmarks page (batch × N = 16K tokens, heads = 2048 / d, "
    "{dtype}). Speedup = standard attention's time ÷ the kernel's, both medians of CUDA-event times of warm calls in "
    "one run of the throughput record <code>docs/benchmarks/&lt;profile&gt;.csv</code>. Dotted: the speedup the time "
    "model predicts on the same shapes (<code>docs/validation/&lt;device&gt;-time.csv</code>): its own standard "
    "attention on tensor cores (<code>iosim-naive</code>, at least 0.8× torch's) ÷ its <code>fa2</code> or "
    "<code>cudnn</code>. Shaded: the seeds' claims, FlashAttention 2-4× faster than standard attention, and "
    "FA3-class kernels 1.5-2× FA2 (a band over FA2's measured non-causal line: cuDNN's should lie in it); "
    "dash-dotted at N = {short}: standard attention said to win below it.</p>")


def _figure_html(g: GpuSpeedups) -> str:
    fig = plots.speedups(g.figure)
    div = fig.to_html(full_html=False, include_plotlyjs=False, div_id=f"fig-{SECTION_ID}-{g.name.lower()}",
                      config=PLOTLY_CONFIG)
    return (f"<figure>{div}<figcaption>{g.name}: speedup over standard attention against N, d = 64 and 128 "
            "(panels): measured (solid: non-causal, dashed: causal), predicted by iosim's time model (dotted), "
            "the seeds' claims (shaded, dash-dotted); above 1, the kernel is faster.</figcaption></figure>")


def speedup_section(gpus: list[GpuSpeedups]) -> tuple[str, int]:
    """The section's HTML and its number of figures: one per GPU with measured or predicted speedups."""
    dtype = next((r["dtype"] for g in gpus for r in g.measured + g.predicted), "bf16")
    parts = [f'<section id="{SECTION_ID}"><h2>{TITLE}</h2>', INTRO.format(dtype=dtype, short=SHORT_N)]
    n_fig = 0
    for g in gpus:
        parts.append(f"<h3>{g.name}</h3>")
        parts += [f"<p class=note>{html.escape(m)}.</p>" for m in g.missing]
        if g.measured or g.predicted:
            parts.append(_figure_html(g))
            n_fig += 1
    parts.append(f"<h3>Speedup ranges against the seeds' claims</h3><div class=wide>{speedup_table(gpus)}</div>"
                 "</section>")
    return "\n".join(parts), n_fig
