"""The report's section "Training: forward + backward": the seeds' training claim (FlashAttention 2-4× faster than
standard attention end to end) measured on the attention layer, forward and backward, for GPT-2-small shapes.

The committed records ``docs/benchmarks/training-<profile>.csv`` (``python benchmarks/bench_backward.py --training
--long-csv ...``: one run per commit, appended; the newest run is shown) hold each backend's milliseconds and speedup
over torch-standard (S = scale Q Kᵀ, mask, softmax, P V in the dtype, with autograd: S and P written and read back).
Beside it the simulated ratio of `global` bytes, naive ÷ flash2, forward + backward, on the record's shapes. A
missing record is named in the section; nothing here raises for it.
"""

from __future__ import annotations

import csv
import html

from .._resources import benchmarks_dir
from ..plots.training import BACKENDS, training
from ..problem import AttentionProblem
from ..simulate import simulate
from .figures import PLOTLY_CONFIG

SECTION_ID = "training"
TITLE = "Training: forward + backward"
GPUS = (("H100", "h100-sxm5-80gb"), ("H200", "h200-sxm-141gb"))
COLUMNS = {"device", "date", "commit", "dtype", "head_dim", "seq_len", "batch", "heads", "causal", "backend", "ms",
           "speedup"}
INTRO = ("<p>The FlashAttention papers' headline is a training result: 2-4× faster than standard attention, because "
         "the backward pass, too, never writes the N×N matrices to memory. Measured here on the attention layer "
         "alone (loss.backward() through it, forward included), causal, bf16, d = 64, 12 heads, batch × N = 16384 "
         "tokens (GPT-2 small), each backend in the same run, CUDA events, the median. Standard attention is torch's "
         "matmul, softmax, matmul in bf16 with autograd (iosim's naive kernels have no backward). The dotted line is "
         "iosim's simulated ratio of global bytes, standard ÷ FlashAttention-2, forward + backward.</p>")


def read_training(profile: str) -> tuple[list[dict], str | None]:
    """The newest run's rows of ``training-<profile>.csv``, or ([], why not)."""
    name = f"docs/benchmarks/training-{profile}.csv"
    try:
        path = benchmarks_dir() / f"training-{profile}.csv"
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
    except (OSError, FileNotFoundError):
        return [], f"{name}: no record (python benchmarks/bench_backward.py --training --long-csv {name})"
    if not rows or not COLUMNS <= set(rows[0]):
        return [], f"{name}: not a training record (columns {', '.join(sorted(COLUMNS))} expected)"
    last = max((r["date"], r["commit"]) for r in rows)
    return [r for r in rows if (r["date"], r["commit"]) == last], None


def traffic_ratio(rows: list[dict], profile: str) -> dict[int, float]:
    """{N: naive ÷ flash2 global bytes, forward + backward} on the record's shapes (the two-level view)."""
    out = {}
    for r in rows:
        n = int(r["seq_len"])
        if n in out:
            continue
        p = AttentionProblem(batch=int(r["batch"]), heads=int(r["heads"]), seq_len=n, head_dim=int(r["head_dim"]),
                             dtype=r["dtype"], causal=r["causal"] == "true")
        b = {s: sum(simulate(s, p, profile, pass_="both", l2=False).traffic["global"].values()) for s in ("naive", "flash2")}
        out[n] = b["naive"] / b["flash2"]
    return dict(sorted(out.items()))


def _table(rows: list[dict], traffic: dict[int, float]) -> str:
    """One row per N: batch, standard attention's ms, each backend's speedup, the simulated bytes ratio."""
    head = "<tr><th>N</th><th>batch</th><th>standard ms</th>" + "".join(
        f"<th>{html.escape(label)}</th>" for label in BACKENDS.values()) + "<th>simulated bytes ratio</th></tr>"
    body = []
    for n in sorted({int(r["seq_len"]) for r in rows}):
        by = {r["backend"]: r for r in rows if int(r["seq_len"]) == n}
        std = by.get("torch-standard")
        cells = [str(n), next(iter(by.values()))["batch"], f"{float(std['ms']):.2f}" if std else "—"]
        cells += [f"{float(by[b]['speedup']):.2f}×" if b in by else "—" for b in BACKENDS]
        cells.append(f"{traffic[n]:.1f}×" if n in traffic else "—")
        body.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    return f"<table>{head}{''.join(body)}</table>"


def training_section() -> tuple[str, int]:
    """The section's HTML and its number of figures (one per GPU with a record)."""
    parts, n_fig = [f'<section id="{SECTION_ID}"><h2>{TITLE}</h2>', INTRO], 0
    for name, profile in GPUS:
        rows, why = read_training(profile)
        parts.append(f"<h3>{name}</h3>")
        if why:
            parts.append(f"<p class=note>{html.escape(why)}.</p>")
            continue
        traffic = traffic_ratio(rows, profile)
        run = f"{rows[0]['device']}, run {rows[0]['commit']} of {rows[0]['date']}"
        fig = training(rows, traffic, f"{name}: forward + backward of the attention layer")
        div = fig.to_html(full_html=False, include_plotlyjs=False, div_id=f"fig-{SECTION_ID}-{name.lower()}",
                          config=PLOTLY_CONFIG)
        parts.append(f"<figure>{div}<figcaption>{name} ({html.escape(run)}): measured speedups over standard "
                     "attention (solid), simulated bytes ratio (dotted), the seeds' 2-4× (shaded).</figcaption></figure>")
        parts.append(f"<details><summary>Table ({html.escape(run)})</summary><div class=wide>{_table(rows, traffic)}"
                     "</div></details>")
        n_fig += 1
    parts.append("</section>")
    return "\n".join(parts), n_fig

