"""The report's section "FP8 forward": FlashAttention-3's FP8 (e4m3) forward against bf16, as iosim simulates it and
as iosim's FP8 kernel and cuDNN's measure (issue 27).

Three sources, each optional: the simulator (``simulate("flash3", ...)`` with ``dtype="fp8"`` and ``"bf16"`` on the
benchmark shapes: global and DRAM bytes); the committed throughput record ``docs/benchmarks/<profile>.csv`` (``python
benchmarks/bench_fp8.py --check --long-csv ...``: rows of dtype ``fp8e4m3``, backends ``iosim-flash3-fp8``,
``iosim-fp8-quantize`` and ``cudnn-fp8``; the newest such run is shown, beside the newest bf16 rows of
``iosim-flash3`` and ``sdpa-cudnn`` on the same shapes, whose run is named); and the accuracy record
``data/validation/<device>-fp8-accuracy.json`` (rows of source, mode, seed, d, N, rmse; in a source checkout only).
A missing record, or a record without FP8 rows yet, is said in the section; nothing here raises for it.
"""

from __future__ import annotations

import csv
import html
import json
import statistics
from pathlib import Path

from .._resources import benchmarks_dir
from ..plots.fp8 import SERIES, fp8_throughput
from ..problem import AttentionProblem
from ..simulate import simulate
from .figures import PLOTLY_CONFIG
from .speedups import newest_run

SECTION_ID = "fp8-forward"
TITLE = "FP8 forward"
GPUS = (("H100", "h100", "h100-sxm5-80gb"), ("H200", "h200", "h200-sxm-141gb"))  # name, device key, profile
FP8_DTYPE = "fp8e4m3"  # the throughput record's dtype of the FP8 rows
FP8 = ("iosim-flash3-fp8", "cudnn-fp8")
BF16 = ("iosim-flash3", "sdpa-cudnn")
QUANTIZE = "iosim-fp8-quantize"
COLUMNS = {"device", "date", "commit", "dtype", "head_dim", "seq_len", "batch", "heads", "causal", "backend", "ms"}
ACCURACY_KEYS = {"source", "mode", "seed", "d", "N", "rmse"}
BYTES_SHAPES = tuple((d, n) for d in (64, 128, 256) for n in (1024, 4096, 16384))  # non-causal, B N = 16K tokens
INTRO = ("<p>FlashAttention-3's FP8 forward reads Q, K and V as e4m3 (1 byte an element, per-block scales) and runs "
         "both GEMMs at the tensor cores' FP8 rate, twice bf16's. Below, per GPU: the bytes iosim simulates for its "
         "flash3 schedule in fp8 against bf16 on the benchmark shapes (batch × N = 16K tokens, heads = 2048 / d); "
         "the throughput measured by <code>benchmarks/bench_fp8.py</code> (iosim's FP8 kernel on inputs quantized "
         "beforehand, cuDNN's FP8 forward through cudnn-frontend, beside the bf16 kernels; CUDA events, the median; "
         "TFLOP/s = 4·N²·d·B·H / t, halved when causal); and the error against float64 from the accuracy record.</p>")


def _true(v) -> bool:
    return str(v).strip().lower() in ("true", "1", "yes")


def read_bench(profile: str) -> tuple[list[dict], str | None]:
    """The rows of ``docs/benchmarks/<profile>.csv``, or ([], why not)."""
    name = f"docs/benchmarks/{profile}.csv"
    try:
        with open(benchmarks_dir() / f"{profile}.csv", newline="", encoding="utf-8") as f:
            rows = list(csv.DictReader(f))
    except (OSError, UnicodeDecodeError, csv.Error):
        return [], f"{name}: no record"
    if not rows or not COLUMNS <= set(rows[0]):
        return [], f"{name}: not a throughput record (columns {', '.join(sorted(COLUMNS))} expected)"
    return rows, None


def _key(r: dict) -> tuple[int, bool, int] | None:
    try:
        return int(r["head_dim"]), _true(r["causal"]), int(r["seq_len"])
    except (KeyError, TypeError, ValueError):
        return None


def newest_fp8_run(rows: list[dict]) -> list[dict]:
    """The FP8 rows of the newest run (date, then later in the file) that has any: [] where none has."""
    return [r for r in newest_run(rows, _is_fp8) if _is_fp8(r)]


def _is_fp8(r: dict) -> bool:
    return r.get("dtype") == FP8_DTYPE


def tflops_of(r: dict) -> float | None:
    """4 N² d B H / t (causal ÷ 2) from the row's shape and milliseconds; None where they do not parse."""
    try:
        n, d, b, h, ms = (float(r[k]) for k in ("seq_len", "head_dim", "batch", "heads", "ms"))
    except (KeyError, TypeError, ValueError):
        return None
    return 4 * n * n * d * b * h / (2 if _true(r["causal"]) else 1) / (ms * 1e-3) / 1e12 if ms > 0 else None


def measured_points(rows: list[dict]) -> tuple[list[dict], dict, set[str]]:
    """(figure points, {(backend, d, causal, N): ms}, the bf16 runs used): the newest FP8 run, and for its shapes the
    newest bf16 row of each bf16 backend (later in the file wins)."""
    fp8 = newest_fp8_run(rows)
    shapes = {_key(r) for r in fp8} - {None}
    chosen = {(r["backend"], _key(r)): r for r in fp8 if r["backend"] in (*FP8, QUANTIZE)}
    bf16_runs = set()
    for r in rows:
        if r.get("dtype") == "bf16" and r.get("backend") in BF16 and _key(r) in shapes:
            chosen[(r["backend"], _key(r))] = r
    points, ms = [], {}
    for (backend, key), r in sorted(chosen.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        t = tflops_of(r)
        if t is None:
            continue
        ms[(backend, *key)] = float(r["ms"])
        if backend in SERIES:
            points.append({"backend": backend, "head_dim": key[0], "causal": key[1], "seq_len": key[2], "tflops": t})
        if backend in BF16:
            bf16_runs.add(f"{r.get('commit', '?')} of {r.get('date', '?')}")
    return points, ms, bf16_runs


def simulated_bytes(profile: str, shapes=BYTES_SHAPES) -> list[dict]:
    """flash3's global and DRAM (hbm) bytes in bf16 and fp8 on non-causal benchmark shapes; a case the simulator
    refuses carries its reason."""
    out = []
    for d, n in shapes:
        row: dict = {"d": d, "N": n}
        for dt in ("bf16", "fp8"):
            p = AttentionProblem(batch=max(1, 16384 // n), heads=2048 // d, seq_len=n, head_dim=d, dtype=dt)
            try:
                r = simulate("flash3", p, profile)
            except Exception as exc:  # the simulator's fp8 is being extended: say what it said, draw the rest
                row["why"] = f"{dt}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                break
            row[dt] = {b: sum(r.traffic[b].values()) for b in ("global", "hbm")}
        out.append(row)
    return out


def accuracy_dir() -> Path | None:
    """data/validation of the source checkout (it is not installed with the package), or None."""
    folder = Path(__file__).resolve().parents[2] / "data" / "validation"
    return folder if folder.is_dir() else None


def read_accuracy(device: str) -> tuple[list[dict], str | None]:
    """The rows of ``data/validation/<device>-fp8-accuracy.json`` (a list, or {"rows": [...]}), or ([], why not)."""
    name = f"data/validation/{device}-fp8-accuracy.json"
    folder = accuracy_dir()
    if folder is None or not (folder / f"{device}-fp8-accuracy.json").is_file():
        return [], f"{name}: no record (python benchmarks/bench_fp8_accuracy.py)"
    try:
        data = json.loads((folder / f"{device}-fp8-accuracy.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        return [], f"{name}: cannot be read ({type(exc).__name__})"
    rows = data.get("rows") if isinstance(data, dict) else data
    if not isinstance(rows, list) or not rows or not all(isinstance(r, dict) and ACCURACY_KEYS <= set(r)
                                                         for r in rows):
        return [], f"{name}: not an accuracy record (rows of {', '.join(sorted(ACCURACY_KEYS))} expected)"
    return rows, None


# ------------------------------------------------------------------------------------------------------------------
# the tables and the section


def _cells(cells) -> str:
    return "<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>"


def _head(names) -> str:
    return "<tr>" + "".join(f"<th>{html.escape(n)}</th>" for n in names) + "</tr>"


def bytes_table(rows: list[dict]) -> str:
    from ..plots.style import si

    head = _head(["d", "N", "global bf16", "global fp8", "bf16 ÷ fp8", "DRAM bf16", "DRAM fp8", "bf16 ÷ fp8"])
    body = []
    for r in rows:
        if "why" in r:
            body.append(_cells([r["d"], f"{r['N']:,}", f"not simulated: {html.escape(r['why'])}", "", "", "", "", ""]))
            continue
        cells = [r["d"], f"{r['N']:,}"]
        for b in ("global", "hbm"):
            lo, hi = r["fp8"][b], r["bf16"][b]
            cells += [si(hi, "B"), si(lo, "B"), f"{hi / lo:.2f}×" if lo else "—"]
        body.append(_cells(cells))
    return f"<table>{head}{''.join(body)}</table>"


def _x(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}×" if a and b else "—"


def measured_table(points: list[dict], ms: dict) -> str:
    """One row per shape of the FP8 run: each backend's TFLOP/s, fp8 ÷ bf16 (iosim), iosim ÷ cuDNN fp8, the quantize
    pass's milliseconds."""
    rate = {(p["backend"], p["head_dim"], p["causal"], p["seq_len"]): p["tflops"] for p in points}
    head = _head(["d", "N", "causal", "iosim fp8", "cuDNN fp8", "iosim bf16", "cuDNN bf16", "iosim fp8 ÷ bf16",
                  "iosim ÷ cuDNN fp8", "quantize ms"])
    body = []
    for d, causal, n in sorted({k[1:] for k in rate}):
        t = {b: rate.get((b, d, causal, n)) for b in SERIES}
        q = ms.get((QUANTIZE, d, causal, n))
        body.append(_cells([d, f"{n:,}", "causal" if causal else "non-causal",
                            *(f"{t[b]:.1f}" if t[b] else "—" for b in SERIES),
                            _x(t["iosim-flash3-fp8"], t["iosim-flash3"]), _x(t["iosim-flash3-fp8"], t["cudnn-fp8"]),
                            f"{q:.4f}" if q is not None else "—"]))
    return f"<table>{head}{''.join(body)}</table>"


def accuracy_table(rows: list[dict]) -> str:
    """RMSE against float64 per (source, mode, d, N): the mean over seeds."""
    groups: dict[tuple, list[float]] = {}
    for r in rows:
        try:
            groups.setdefault((str(r["source"]), str(r["mode"]), int(r["d"]), int(r["N"])), []).append(float(r["rmse"]))
        except (TypeError, ValueError):
            continue
    head = _head(["source", "mode", "d", "N", "RMSE (mean over seeds)", "seeds"])
    body = [_cells([html.escape(s), html.escape(m), d, f"{n:,}", f"{statistics.fmean(v):.2e}", len(v)])
            for (s, m, d, n), v in sorted(groups.items())]
    return f"<table>{head}{''.join(body)}</table>"


def _measured_html(name: str, profile: str) -> tuple[list[str], int]:
    rows, why = read_bench(profile)
    cmd = f"python benchmarks/bench_fp8.py --check --long-csv docs/benchmarks/{profile}.csv --commit SHA"
    if why:
        return [f"<p class=note>{html.escape(why)}: no FP8 measurement ({html.escape(cmd)}).</p>"], 0
    points, ms, bf16_runs = measured_points(rows)
    if not points:
        return [f"<p class=note>docs/benchmarks/{profile}.csv has no {FP8_DTYPE} rows yet: no FP8 measurement "
                f"({html.escape(cmd)}).</p>"], 0
    run = newest_fp8_run(rows)[-1]
    by = f"{run['device']}, run {run['commit']} of {run['date']}"
    fig = fp8_throughput(points, f"{name}: FP8 against bf16, measured")
    div = fig.to_html(full_html=False, include_plotlyjs=False, div_id=f"fig-{SECTION_ID}-{name.lower()}",
                      config=PLOTLY_CONFIG)
    bf16 = f"bf16 rows from run{'s' if len(bf16_runs) > 1 else ''} {', '.join(sorted(bf16_runs))}" if bf16_runs \
        else "no bf16 rows on these shapes"
    return [f"<figure>{div}<figcaption>{name} (fp8: {html.escape(by)}; {html.escape(bf16)}): TFLOP/s against N, "
            "filled markers fp8, open bf16; solid non-causal, dashed causal.</figcaption></figure>",
            f"<details><summary>Measured rows ({html.escape(by)})</summary><div class=wide>"
            f"{measured_table(points, ms)}</div></details>"], 1


def fp8_section() -> tuple[str, int]:
    """The section's HTML and its number of figures (one per GPU with FP8 rows in its throughput record)."""
    parts, n_fig = [f'<section id="{SECTION_ID}"><h2>{TITLE}</h2>', INTRO], 0
    for name, device, profile in GPUS:
        parts.append(f"<h3>{name}</h3>")
        parts.append(f"<p>Simulated bytes, flash3, non-causal ({html.escape(profile)}):</p><div class=wide>"
                     f"{bytes_table(simulated_bytes(profile))}</div>")
        html_, n = _measured_html(name, profile)
        parts += html_
        n_fig += n
        acc, why = read_accuracy(device)
        parts.append(f"<p class=note>{html.escape(why)}.</p>" if why else
                     f"<p>Error against float64 (data/validation/{device}-fp8-accuracy.json):</p>"
                     f"<div class=wide>{accuracy_table(acc)}</div>")
    parts.append("</section>")
    return "\n".join(parts), n_fig
