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
and mla_prefill_record.py), are tabled beside the counts and the time models.
"""

from __future__ import annotations

import html

from ..hardware.gpu import get_profile
from ..plots.serving import (
    decode_bandwidth,
    intensity_bars,
    mla_time,
    varlen_against_padded,
    window_against_full,
)
from ..problem import AttentionProblem
from ..schedules.mla_decode import MlaDecode
from ..schedules.mla_decode import counts as mla_decode_counts
from ..schedules.mla_decode import dram as mla_decode_dram
from ..schedules.mla_decode import gqa_intensity as gqa_decode_intensity
from ..schedules.mla_decode import intensity as mla_decode_intensity
from ..schedules.mla_prefill import MlaPrefill
from ..schedules.mla_prefill import counts as mla_prefill_counts
from ..schedules.mla_prefill import dram as mla_prefill_dram
from ..schedules.mla_prefill import gqa_intensity as gqa_prefill_intensity
from ..schedules.mla_prefill import intensity as mla_prefill_intensity
from ..simulate import simulate
from ..timing import roofline
from ..timing.mla import attention_time as mla_attention_time
from ..timing.mla import prefill_attention_time, prefill_reference
from ..timing.mla import reference as mla_reference
from ..timing.rates import rates
from .figures import PLOTLY_CONFIG
from .records import read_record, validation_rows

SECTION_ID = "serving"
TITLE = "Serving: decode, varlen, sliding windows"
GPUS = (("H100", "h100-sxm5-80gb"), ("H200", "h200-sxm-141gb"))
MLA_RECORDS = {"H100": "h100-mla.csv", "H200": "h200-mla.csv"}  # docs/validation (benchmarks/mla_record.py)
DECODE_BYTES = {"H100": "h100-decode.csv", "H200": "h200-decode.csv"}  # docs/validation (decode_bytes_record.py)
DECODE_BYTE_COLUMNS = {"cache", "kernel", "boundary", "direction", "passed", "by", "error"}
MLA_COLUMNS = {"batch", "kv_len", "stage", "torch_kernels", "dram_read", "dram_write", "ms"}
MLA_STAGES = {"q_absorb": 0, "attention": 1, "o_absorb": 2}  # -> mla_decode.counts' kernel
# MLA prefill run by torch (benchmarks/mla_prefill_record.py): its record per GPU, its stages -> mla_prefill's kernels
MLA_PREFILL_RECORDS = {"H100": "h100-mla-prefill.csv", "H200": "h200-mla-prefill.csv"}
MLA_PREFILL_COLUMNS = {"batch", "seq_len", "kv_len", "stage", "torch_kernels", "dram_read", "dram_write", "ms"}
MLA_PREFILL_STAGES = ("kv_up", "k_cat", "attention")
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


def mla_figure() -> str:
    """MLA's arithmetic intensity against GQA's (iosim.schedules.mla_decode and mla_prefill, counts) beside each GPU's
    ridges (calibrated tensor rate over calibrated DRAM read rate)."""
    cases = [("GQA 8:1 decode", gqa_decode_intensity(32, 4, 128, 32768, batch=64)),
             ("MLA decode, 1 token", mla_decode_intensity(MlaDecode(batch=64, kv_len=32768))),
             ("MLA decode, 4 tokens", mla_decode_intensity(MlaDecode(batch=64, kv_len=32768, q_len=4))),
             ("GQA 32/8 prefill, 4K", gqa_prefill_intensity(32, 8, 128, 4096)),
             ("MLA prefill, 4K", mla_prefill_intensity(MlaPrefill(batch=1, seq_len=4096, kv_len=4096))),
             ("MLA prefill, 4K, with K/V expansion",
              mla_prefill_intensity(MlaPrefill(batch=1, seq_len=4096, kv_len=4096), attention_only=False))]
    ridges = []
    for name, profile in GPUS:
        r = rates(get_profile(profile), "bf16")
        ridges += [(f"{name} mma.sync", max(r.mma_at(w) for w in (4, 8, 16, 32, 64)) / r.dram_read),
                   (f"{name} wgmma", r.wgmma / r.dram_read)]
    fig = intensity_bars(cases, ridges, "MLA against GQA: FLOPs per DRAM byte (simulated counts)")
    div = fig.to_html(full_html=False, include_plotlyjs=False, div_id=f"fig-{SECTION_ID}-mla", config=PLOTLY_CONFIG)
    return (f"<figure>{div}<figcaption>FLOPs per DRAM byte, every distinct byte once (DeepSeek-V3's shapes: 128 query "
            "heads on one latent of 512 + 64; decode with the up-projections absorbed, batch 64 at 32K keys; prefill "
            "expands keys and values per head; GQA at d = 128), against each GPU's ridge (calibrated bf16 tensor "
            "rate over DRAM read rate): over a line, a kernel there is bound by its tensor cores.</figcaption>"
            "</figure>")


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


def mla_measured(name: str, profile: str) -> str:
    """MLA decode run by torch (benchmarks/mla_record.py) beside the counts: the projections' DRAM bytes simulated
    (mla_decode.dram) and measured, the attention's global bytes against the counts of the design torch runs
    (iosim.timing.mla.reference) and its DRAM bytes beside the compulsory ones; the time of the projections beside
    the roofline's, of the attention beside its model's (iosim.timing.mla) where the profile measured its step."""
    rows, note = validation_rows(name, MLA_RECORDS[name], MLA_COLUMNS, "MLA record", "mla_record.py")
    if note:
        return note
    body, prof = [], get_profile(profile)
    for r in rows:
        body.append(_mla_row(r, prof))
    head = ("<tr><th>sequences × keys</th><th>stage</th><th>torch's kernel</th><th>global read MB, simulated / "
            "measured</th><th>DRAM read MB, simulated / measured</th><th>written MB, simulated / measured</th>"
            "<th>ms, predicted / measured</th></tr>")
    return (f"<details><summary>{name}: MLA decode, a torch reference measured against the counts ({len(rows)} rows)"
            f"</summary><div class=wide><table>{head}{''.join(body)}</table></div><p class=note>DeepSeek-V3's "
            "absorbed step run by torch (bmm, SDPA's memory-efficient kernel on the latent cache, bmm); bytes by "
            "Nsight Compute, L2 flushed before each kernel. The projections' DRAM reads match the counts and their "
            "time is set beside the roofline's. Torch's attention kernel keeps its fp32 accumulator in global memory: "
            "its global bytes are set beside the counts of that design, its DRAM bytes beside the compulsory ones (a "
            "floor: the accumulators' spill from L2 is not modeled), its time beside its model's, from the kernel's "
            "measured step (docs/serving.md).</p></details>")


def mla_time_figure(name: str, profile: str) -> str:
    """Torch's MLA decode attention on GPU ``name``: each recorded shape's measured time beside the model's
    (iosim.timing.mla, where the profile measured the kernel's step) and the roofline of the schedule's counts; ""
    where there is no record."""
    rows, note = validation_rows(name, MLA_RECORDS[name], MLA_COLUMNS, "MLA record", "mla_record.py")
    if note:
        return ""
    prof, bars = get_profile(profile), []
    for r in rows:
        if r["stage"] != "attention":
            continue
        batch, kv_len = int(r["batch"]), int(r["kv_len"])
        m = MlaDecode(batch=batch, kv_len=kv_len)
        t = mla_attention_time(mla_reference(batch, kv_len), prof)
        roof = roofline.predict(mla_decode_counts(m), [a + b for a, b in mla_decode_dram(m)], m.dtype, prof)
        bars.append((f"{batch} x {kv_len}", float(r["ms"]), None if t is None else t.predicted_s * 1e3,
                     roof.kernels[1].predicted_s * 1e3))
    fig = mla_time(bars, f"{name}: torch's MLA decode attention, measured beside its model")
    div = fig.to_html(full_html=False, include_plotlyjs=False, div_id=f"fig-{SECTION_ID}-mla-time-{name.lower()}",
                      config=PLOTLY_CONFIG)
    model = ("its model's (the kernel's step measured by iosim calibrate rates, the blocks dealt over the SMs)"
             if any(b[2] is not None for b in bars) else "no model: this GPU's profile has not measured its step")
    over = [b[1] / b[3] for b in bars]
    return (f"<figure>{div}<figcaption>{name}: the attention stage of DeepSeek-V3's absorbed decode step as torch runs "
            f"it (its memory-efficient kernel, the fp32 accumulator in global memory), measured beside {model}, and the "
            f"roofline of the schedule's counts (FlashMLA's design), which it takes {min(over):.1f}-{max(over):.1f}x "
            "(benchmarks/mla_record.py).</figcaption></figure>")


def _mla_row(r: dict, prof) -> str:
    """One stage of one shape of the MLA record as a table row (:func:`mla_measured`)."""
    batch, kv_len = int(r["batch"]), int(r["kv_len"])
    m = MlaDecode(batch=batch, kv_len=kv_len)
    k = MLA_STAGES.get(r["stage"])
    glob = "—"
    if k is None:  # torch.cat: a copy the schedule does not have
        sim_r = sim_w = sim_t = "—"
    elif r["stage"] == "attention":
        ref = mla_reference(batch, kv_len)
        d, c, t = mla_decode_dram(ref)[1], mla_decode_counts(ref).kernels[1], mla_attention_time(ref, prof)
        sim_r, sim_w = f"{d[0] / 1e6:.1f} (floor)", f"{d[1] / 1e6:.2f} (floor)"
        sim_t = "no step measured" if t is None else f"{t.predicted_s * 1e3:.3f} (model)"
        if r.get("global_read"):
            glob = f"{c.global_read_bytes / 1e6:.1f} / {int(r['global_read']) / 1e6:.1f}"
    else:
        d = mla_decode_dram(m)
        t = roofline.predict(mla_decode_counts(m), [a + b for a, b in d], m.dtype, prof).kernels[k].predicted_s
        sim_r, sim_w, sim_t = f"{d[k][0] / 1e6:.1f}", f"{d[k][1] / 1e6:.2f}", f"{t * 1e3:.3f} (roofline)"
    return (f"<tr><td>{batch} × {kv_len}</td><td>{html.escape(r['stage'])}</td>"
            f"<td>{html.escape(r['torch_kernels'])}</td><td>{glob}</td><td>{sim_r} / {int(r['dram_read']) / 1e6:.1f}"
            f"</td><td>{sim_w} / {int(r['dram_write']) / 1e6:.2f}</td><td>{sim_t} / {float(r['ms']):.3f}</td></tr>")


def mla_prefill_measured(name: str, profile: str) -> str:
    """MLA prefill run by torch (benchmarks/mla_prefill_record.py) beside the counts: each stage's DRAM bytes
    simulated (mla_prefill.dram, torch's gemm+cat expansion) and measured, the attention's time beside its model's
    (iosim.timing.mla.prefill_attention_time), the GEMM's and the copy's beside the roofline's."""
    rows, note = validation_rows(name, MLA_PREFILL_RECORDS[name], MLA_PREFILL_COLUMNS, "MLA prefill record",
                                 "mla_prefill_record.py")
    if note:
        return note
    prof, body = get_profile(profile), []
    for r in rows:
        m = prefill_reference(int(r["batch"]), int(r["seq_len"]), int(r["kv_len"]))
        k, d = MLA_PREFILL_STAGES.index(r["stage"]), mla_prefill_dram(m)
        if r["stage"] == "attention":
            t = f"{prefill_attention_time(m, prof).predicted_s * 1e3:.3f} (model)"
        else:
            roof = roofline.predict(mla_prefill_counts(m), [a + b for a, b in d], m.dtype, prof)
            t = f"{roof.kernels[k].predicted_s * 1e3:.3f} (roofline)"
        on = f" on {m.kv_len}" if m.kv_len != m.seq_len else ""
        body.append(f"<tr><td>{m.batch} × {m.seq_len}{on}</td><td>{html.escape(r['stage'])}</td>"
                    f"<td>{html.escape(r['torch_kernels'][:60])}</td><td>{d[k][0] / 1e6:.1f} / "
                    f"{int(r['dram_read']) / 1e6:.1f}</td><td>{d[k][1] / 1e6:.1f} / {int(r['dram_write']) / 1e6:.1f}"
                    f"</td><td>{t} / {float(r['ms']):.3f}</td></tr>")
    head = ("<tr><th>sequences × tokens (on keys)</th><th>stage</th><th>torch's kernel</th><th>DRAM read MB, simulated / "
            "measured</th><th>written MB, simulated / measured</th><th>ms, predicted / measured</th></tr>")
    return (f"<details><summary>{name}: MLA prefill, a torch reference measured against the counts ({len(rows)} "
            f"rows)</summary><div class=wide><table>{head}{''.join(body)}</table></div><p class=note>DeepSeek-V3's "
            "prefill (128 heads, causal; a chunk on its cached prefix, bottom-right) as torch runs it: one GEMM writes "
            "each head's K_nope and V from the latent, torch.cat joins K = [K_nope ; k_R], cuDNN's kernel attends on "
            "keys of 192 and values of 128 (SDPA's backend; a chunk through cudnn-frontend); bytes "
            "by Nsight Compute, L2 flushed before each kernel (outputs that stay in L2 past a kernel's end are not "
            "in its DRAM writes); the attention's time beside the fa3 model of cuDNN's kernel with its step, tile "
            "and call parts measured at these widths (docs/serving.md).</p></details>")


def serving_section() -> tuple[str, int]:
    """The section's HTML and its number of figures (per GPU: decode and varlen against padded, where the GPU has
    records, and the sliding window; MLA against GQA once)."""
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
    parts.append(mla_figure())
    for name, profile in GPUS:
        figure = mla_time_figure(name, profile)
        parts += [figure, mla_measured(name, profile), mla_prefill_measured(name, profile)]
        n_fig += bool(figure)
    parts.append("</section>")
    return "\n".join(parts), n_fig + 1
