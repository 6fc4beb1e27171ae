"""The report's section "Serving: decode, varlen, sliding windows": iosim's serving kernels as measured on the GPUs,
beside the time model where it predicts them.

The committed records: ``docs/benchmarks/decode-<profile>.csv`` (``python benchmarks/bench_decode.py --check --out
...``: iosim's Flash-Decoding kernel on a contiguous and a paged cache, its share of the calibrated DRAM read rate,
torch's fastest decode path in the same run) and ``docs/benchmarks/varlen-<profile>.csv`` (``python
benchmarks/bench_varlen.py --check --out ...``: packed sequences against the batch padded to its longest, sliding
windows and document masks against FlexAttention). The decode figure draws the measured share beside the time
model's (``simulate("flash-decoding", ..., kernel="iosim-decode")``, contiguous rows). A missing record is named in
the section; nothing here raises for it. Two figures need no record: a causal sliding window's simulated bytes and
predicted time against full attention (the benchmark's measured window rows drawn over them where the record has
them), and MLA's arithmetic intensity against GQA's beside each GPU's ridge (issue 28's report items). torch's MLA
decode and prefill, measured (``docs/validation/<device>-mla.csv`` and ``-mla-prefill.csv``, benchmarks/mla_record.py
and mla_prefill_record.py), are tabled and drawn beside the counts and the time models (:mod:`iosim.report.serving_mla`).
"""

from __future__ import annotations

import html

from ..hardware.gpu import get_profile
from ..plots.serving import (
    decode_bandwidth,
    varlen_against_padded,
    window_against_full,
)
from ..problem import AttentionProblem
from ..simulate import simulate
from .figures import PLOTLY_CONFIG
from .records import read_record, validation_rows
from .serving_mla import mla_part

SECTION_ID = "serving"
TITLE = "Serving: decode, varlen, sliding windows"
GPUS = (("H100", "h100-sxm5-80gb"), ("H200", "h200-sxm-141gb"))
DECODE_BYTES = {"H100": "h100-decode.csv", "H200": "h200-decode.csv"}  # docs/validation (decode_bytes_record.py)
DECODE_BYTE_COLUMNS = {"cache", "kernel", "boundary", "direction", "passed", "by", "error"}
DECODE_COLUMNS = {"n", "batch", "heads", "kv_heads", "d", "layout", "ours_ms", "pct_of_dram", "torch_best",
                  "speedup_vs_torch_best"}
VARLEN_COLUMNS = {"part", "case", "d", "causal", "ours_ms", "padded_over_ours", "ours_over_flex", "flex_ms",
                  "padded_ms"}
INTRO = ("<p>Inference servers run attention as decode: one new token a sequence against a KV cache kept in pages, "
         "the cache read once per token. Decode is bound by DRAM bandwidth, so the figure shows iosim's decode kernel "
         "(kernels/flash_decode.cu; bf16, d = 128, 32 query heads on 4 KV heads) as a share of the profile's "
         "calibrated DRAM read rate, measured on a contiguous cache and on pages of 16 tokens, beside the time model's "
         "prediction. The tables fold the rows and the packed-sequence (varlen) and sliding-window kernels against the "
         "same batch padded and against FlexAttention, measured in the same runs.</p>")


def cache_of(r: dict) -> str:
    """A decode row's cache: "bf16", or "fp8" (e4m3, a scale per kv head); rows recorded before fp8 caches are bf16."""
    return r.get("cache") or "bf16"


def predicted_share(rows: list[dict], profile: str) -> dict[tuple[int, str], list[tuple[int, float]]]:
    """{(batch, cache): [(n, % of the calibrated DRAM read rate)]}: the time model on the contiguous rows' shapes,
    the K/V bytes (a byte a value in an fp8 cache) over its predicted time."""
    read = get_profile(profile).calibration.dram.read.value
    out: dict[tuple[int, str], list[tuple[int, float]]] = {}
    for r in rows:
        if r["layout"] != "contig":
            continue
        b, n, d, cache = int(r["batch"]), int(r["n"]), int(r["d"]), cache_of(r)
        p = AttentionProblem(batch=b, heads=int(r["heads"]), kv_heads=int(r["kv_heads"]), seq_len=1, kv_len=n,
                             head_dim=d, dtype="bf16")
        kv_dtype = "fp8" if cache == "fp8" else None
        t = simulate("flash-decoding", p, profile, kernel="iosim-decode", kv_dtype=kv_dtype, warm=True).time.predicted_s
        kv_bytes = 2 * b * n * int(r["kv_heads"]) * d * (1 if kv_dtype else 2)
        out.setdefault((b, cache), []).append((n, 100 * kv_bytes / t / read))
    return out


def _decode_table(rows: list[dict]) -> str:
    head = ("<tr><th>n</th><th>batch</th><th>cache</th><th>layout</th><th>ours ms</th><th>% of DRAM read</th>"
            "<th>torch's fastest (bf16)</th><th>ours ÷ torch</th></tr>")
    body = "".join(
        f"<tr><td>{r['n']}</td><td>{r['batch']}</td><td>{cache_of(r)}</td><td>{html.escape(r['layout'])}</td>"
        f"<td>{float(r['ours_ms']):.4f}"
        f"</td><td>{float(r['pct_of_dram']):.1f}%</td><td>{html.escape(r['torch_best'])}</td>"
        f"<td>{float(r['speedup_vs_torch_best']):.2f}×</td></tr>" for r in rows)
    return f"<table>{head}{body}</table>"


def _varlen_table(rows: list[dict]) -> str:
    head = ("<tr><th>against</th><th>case</th><th>d</th><th>causal</th><th>ours</th><th>ours ms</th><th>peer ms</th>"
            "<th>peer ÷ ours</th></tr>")
    body = []
    peers = {"padded": ("padded batch", "padded_ms", "padded_over_ours"), "flex": ("FlexAttention", "flex_ms",
                                                                                 "ours_over_flex"),
             "paged": ("contiguous cache (chunked prefill on pages)", "contiguous_ms", "contiguous_over_ours")}
    for r in rows:
        if r["part"] not in peers:
            continue
        against, ms_key, ratio_key = peers[r["part"]]
        peer_ms, ratio = r[ms_key], r[ratio_key]
        body.append(f"<tr><td>{against}</td><td>{html.escape(r['case'])}</td>"
                    f"<td>{r['d']}</td><td>{r['causal']}</td><td>{html.escape(r.get('schedule') or 'flash2')}</td>"
                    f"<td>{float(r['ours_ms']):.4f}</td>"
                    f"<td>{float(peer_ms):.4f}</td><td>{float(ratio):.2f}×</td></tr>")
        if r["part"] == "paged" and r.get("flex_paged_ms"):  # the same pages through FlexAttention's PagedAttention
            body.append(f"<tr><td>FlexAttention on the same pages ({html.escape(r.get('flex_paged_options', ''))})"
                        f"</td><td>{html.escape(r['case'])}</td><td>{r['d']}</td><td>{r['causal']}</td>"
                        f"<td>{html.escape(r.get('schedule') or 'flash2')}</td><td>{float(r['ours_ms']):.4f}</td>"
                        f"<td>{float(r['flex_paged_ms']):.4f}</td><td>{float(r['paged_over_flex']):.2f}×</td></tr>")
    return f"<table>{head}{''.join(body)}</table>"


WINDOW_PROBLEM = {"batch": 2, "heads": 16, "seq_len": 8192, "head_dim": 128}  # bench_varlen's windows at d = 128
WINDOWS = (128, 256, 512, 1024, 2048, 4096)


def window_points(profile: str, vrows: list[dict]) -> tuple[list, tuple[float, float], list]:
    """A causal window's simulated global bytes and predicted time on our flash3 kernel (the benchmark's problem),
    full causal attention's, and the benchmark's measured flash3 window rows of the same problem (seconds)."""
    p = AttentionProblem(**WINDOW_PROBLEM, causal=True, dtype="bf16")

    def run(**kw) -> tuple[float, float]:
        r = simulate("flash3", p, profile, kernel="iosim-flash3", l2=False, **kw)
        g = r.traffic["global"]
        return g["read_bytes"] + g["write_bytes"], r.time.predicted_s

    sim = [(w, *run(window=(w - 1, 0))) for w in WINDOWS]
    measured = [(int(r["case"].split("-")[1]), float(r["ours_ms"]) / 1e3) for r in vrows
                if r["part"] == "flex" and r["case"].startswith("window-") and int(r["d"]) == WINDOW_PROBLEM["head_dim"]
                and r.get("schedule") == "flash3" and int(r.get("heads") or 0) == WINDOW_PROBLEM["heads"]]
    return sim, run(), sorted(measured)


def padded_points(vrows: list[dict]) -> tuple[dict[str, list[tuple[str, float]]], list[tuple[str, float]]]:
    """The varlen record's padded rows: measured padded ÷ varlen time by kernel, and the ratio of the pairs the
    padded batch computes (each sequence padded to the longest, batch x N_max's square or causal triangle) to the
    packed batch's (recovered from the row's TFLOP/s, which count the packed pairs at 4·d FLOPs a pair and head)."""
    bars: dict[str, list[tuple[str, float]]] = {}
    work: dict[str, float] = {}
    for r in vrows:
        if r["part"] != "padded":
            continue
        causal = r["causal"] in ("True", "true", True)
        label = f"{r['case']}, d = {r['d']}{', causal' if causal else ''}"
        bars.setdefault(r.get("schedule") or "flash2", []).append((label, float(r["padded_over_ours"])))
        d, heads, batch = int(r["d"]), int(r["heads"]), int(r["batch"])
        packed = float(r["ours_tflops"]) * 1e12 * float(r["ours_ms"]) * 1e-3 / (4 * d * heads)
        n_max = int(r["padded_tokens"]) // batch
        work[label] = batch * (n_max * (n_max + 1) / 2 if causal else n_max * n_max) / packed
    return bars, list(work.items())


def decode_bytes(name: str) -> str:
    """The decode kernels' bytes against Nsight Compute (benchmarks/decode_bytes_record.py): per cache, boundary and
    direction, the kernels within iosim.validation's rule and how."""
    rows, note = validation_rows(name, DECODE_BYTES[name], DECODE_BYTE_COLUMNS, "decode byte record",
                                 "decode_bytes_record.py")
    if note:
        return note
    groups: dict[tuple[str, str, str], list[dict]] = {}
    for r in rows:
        groups.setdefault((r["cache"], r["boundary"], r["direction"]), []).append(r)
    body = []
    for (cache, boundary, direction), rs in groups.items():
        passed = sum(r["passed"] == "True" for r in rs)
        by = ", ".join(f"{b} {sum(r['by'] == b for r in rs)}" for b in ("exact", "bound", "floor") if any(
            r["by"] == b for r in rs))
        worst = max((abs(float(r["error"])) for r in rs if r["error"] not in ("", "None")), default=0.0)
        body.append(f"<tr><td>{'fp8' if cache == 'fp8' else 'q dtype'}</td><td>{boundary}</td><td>{direction}</td>"
                    f"<td>{passed} of {len(rs)}</td><td>{by}</td><td>{100 * worst:.1f}%</td></tr>")
    head = ("<tr><th>cache</th><th>boundary</th><th>direction</th><th>kernels within the rule</th><th>by</th>"
            "<th>largest |error|</th></tr>")
    return (f"<details><summary>{name}: the decode kernels' bytes against Nsight Compute ({len(rows)} checks)</summary>"
            f"<div class=wide><table>{head}{''.join(body)}</table></div><p class=note>9 calls, each on a cache in q's "
            "dtype and an fp8 one; <code>global</code> must be exact, <code>hbm</code> within 5% (reads) or 10% "
            "(writes) or 1% of the call's compulsory bytes; the kernels' small writes stay in L2 past their end "
            "(docs/validation.md).</p></details>")


def serving_section() -> tuple[str, int]:
    """The section's HTML and its number of figures (per GPU: decode and varlen against padded, where the GPU has
    records, and the sliding window; then the MLA part, :func:`iosim.report.serving_mla.mla_part`)."""
    parts, n_fig = [f'<section id="{SECTION_ID}"><h2>{TITLE}</h2>', INTRO], 0
    for name, profile in GPUS:
        parts.append(f"<h3>{name}</h3>")
        rows, why = read_record(f"decode-{profile}.csv", DECODE_COLUMNS)
        if why:
            parts.append(f"<p class=note>{html.escape(why)} (python benchmarks/bench_decode.py --check).</p>")
        else:
            measured: dict = {}
            for r in rows:
                key = (int(r["batch"]), r["layout"], cache_of(r))
                measured.setdefault(key, []).append((int(r["n"]), float(r["pct_of_dram"])))
            fig = decode_bandwidth(measured, predicted_share(rows, profile), f"{name}: decode, DRAM bandwidth")
            div = fig.to_html(full_html=False, include_plotlyjs=False, div_id=f"fig-{SECTION_ID}-{name.lower()}",
                              config=PLOTLY_CONFIG)
            parts.append(f"<figure>{div}<figcaption>{name}: measured (solid: contiguous, dashed: pages of 16) and "
                         "predicted (dotted) share of the calibrated DRAM read rate; an fp8 cache (e4m3, a scale per "
                         "kv head: half the bytes) measured dash-dotted, predicted long-dashed, its bytes at a byte a "
                         "value.</figcaption></figure>")
            parts.append(f"<details><summary>Decode rows ({len(rows)})</summary><div class=wide>"
                         f"{_decode_table(rows)}</div></details>")
            parts.append(decode_bytes(name))
            n_fig += 1
        vrows, why = read_record(f"varlen-{profile}.csv", VARLEN_COLUMNS)
        if why:
            parts.append(f"<p class=note>{html.escape(why)} (python benchmarks/bench_varlen.py --check).</p>")
        else:
            parts.append(f"<details><summary>Varlen and sliding windows ({len(vrows)} rows)</summary><div class=wide>"
                         f"{_varlen_table(vrows)}</div></details>")
        if not why:
            bars, work = padded_points(vrows)
            fig = varlen_against_padded(bars, work, f"{name}: packed sequences against the batch padded to the longest")
            div = fig.to_html(full_html=False, include_plotlyjs=False, div_id=f"fig-{SECTION_ID}-varlen-{name.lower()}",
                              config=PLOTLY_CONFIG)
            parts.append(f"<figure>{div}<figcaption>{name}: measured time of the padded batch over the packed one "
                         "(bench_varlen, bf16; each batch through flash2 and, on Hopper, flash3), beside how many more "
                         "(query, key) pairs the padded batch computes: varlen saves what padding wastes, less its "
                         "ragged tiles; equal lengths (no padding) show what the packed kernel itself costs."
                         "</figcaption></figure>")
            n_fig += 1
        sim, full, measured = window_points(profile, vrows)
        fig = window_against_full(sim, full, measured, f"{name}: a causal sliding window against full attention")
        div = fig.to_html(full_html=False, include_plotlyjs=False, div_id=f"fig-{SECTION_ID}-window-{name.lower()}",
                          config=PLOTLY_CONFIG)
        parts.append(f"<figure>{div}<figcaption>{name}: our flash3 kernel with a causal window of w keys (B = 2, 16 "
                     "heads, N = 8192, d = 128, bf16): the simulated bytes between the SMs and L2 grow as N·w, not "
                     "N²; predicted time (line) and measured (crosses, bench_varlen), full causal attention dotted."
                     "</figcaption></figure>")
        n_fig += 1
    mla, mla_figures = mla_part(GPUS, SECTION_ID)
    parts += [mla, "</section>"]
    return "\n".join(parts), n_fig + mla_figures
