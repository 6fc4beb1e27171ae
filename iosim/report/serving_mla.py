"""The serving section's MLA part (DeepSeek's multi-head latent attention, issue 28): MLA's arithmetic intensity
against GQA's beside each GPU's ridges (counts), and torch's MLA decode and prefill as measured
(``docs/validation/<device>-mla.csv`` from benchmarks/mla_record.py, ``-mla-prefill.csv`` from
benchmarks/mla_prefill_record.py) beside the counts and the time models of torch's kernels. A missing record is
named, never raised."""

from __future__ import annotations

import html

from ..hardware.gpu import get_profile
from ..plots.serving import intensity_bars, mla_time
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
from ..timing import roofline
from ..timing.mla import attention_time as mla_attention_time
from ..timing.mla import prefill_attention_time, prefill_reference
from ..timing.mla import reference as mla_reference
from ..timing.rates import rates
from .figures import PLOTLY_CONFIG
from .records import validation_rows

MLA_RECORDS = {"H100": "h100-mla.csv", "H200": "h200-mla.csv"}  # docs/validation (benchmarks/mla_record.py)
MLA_COLUMNS = {"batch", "kv_len", "stage", "torch_kernels", "dram_read", "dram_write", "ms"}
MLA_STAGES = {"q_absorb": 0, "attention": 1, "o_absorb": 2}  # -> mla_decode.counts' kernel
# MLA prefill run by torch (benchmarks/mla_prefill_record.py): its record per GPU, its stages -> mla_prefill's kernels
MLA_PREFILL_RECORDS = {"H100": "h100-mla-prefill.csv", "H200": "h200-mla-prefill.csv"}
MLA_PREFILL_COLUMNS = {"batch", "seq_len", "kv_len", "stage", "torch_kernels", "dram_read", "dram_write", "ms"}
MLA_PREFILL_STAGES = ("kv_up", "k_cat", "attention")


def mla_figure(gpus, section_id: str) -> str:
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
    for name, profile in gpus:
        r = rates(get_profile(profile), "bf16")
        ridges += [(f"{name} mma.sync", max(r.mma_at(w) for w in (4, 8, 16, 32, 64)) / r.dram_read),
                   (f"{name} wgmma", r.wgmma / r.dram_read)]
    fig = intensity_bars(cases, ridges, "MLA against GQA: FLOPs per DRAM byte (simulated counts)")
    div = fig.to_html(full_html=False, include_plotlyjs=False, div_id=f"fig-{section_id}-mla", config=PLOTLY_CONFIG)
    return (f"<figure>{div}<figcaption>FLOPs per DRAM byte, every distinct byte once (DeepSeek-V3's shapes: 128 query "
            "heads on one latent of 512 + 64; decode with the up-projections absorbed, batch 64 at 32K keys; prefill "
            "expands keys and values per head; GQA at d = 128), against each GPU's ridge (calibrated bf16 tensor "
            "rate over DRAM read rate): over a line, a kernel there is bound by its tensor cores.</figcaption>"
            "</figure>")


def mla_measured(name: str, profile: str) -> str:
    """MLA decode run by torch (benchmarks/mla_record.py) beside the counts: the projections' DRAM bytes simulated
    (mla_decode.dram) and measured, the attention's global bytes against the counts of the design torch runs
    (iosim.timing.mla.reference) and its DRAM bytes beside the compulsory ones; the time of the projections beside
    the roofline's, of the attention beside its model's (iosim.timing.mla) where the profile measured its step."""
    rows, note = _decode_rows(name)
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


def mla_time_figure(name: str, profile: str, section_id: str) -> str:
    """Torch's MLA decode attention on GPU ``name``: each recorded shape's measured time beside the model's
    (iosim.timing.mla, where the profile measured the kernel's step) and the roofline of the schedule's counts; ""
    where there is no record."""
    rows, note = _decode_rows(name)
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
    div = fig.to_html(full_html=False, include_plotlyjs=False, div_id=f"fig-{section_id}-mla-time-{name.lower()}",
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
    rows, note = _prefill_rows(name)
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
        body.append(f"<tr><td>{_shape(m, '×')}</td><td>{html.escape(r['stage'])}</td>"
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


def mla_prefill_time_figure(name: str, profile: str, section_id: str) -> str:
    """Torch's MLA prefill attention (cuDNN's kernel) on GPU ``name``: each recorded shape's measured time beside the
    model's (iosim.timing.mla.prefill_attention_time) and the roofline of the schedule's counts; "" where there is no
    record."""
    rows, note = _prefill_rows(name)
    if note:
        return ""
    prof, bars = get_profile(profile), []
    for r in rows:
        if r["stage"] != "attention":
            continue
        m = prefill_reference(int(r["batch"]), int(r["seq_len"]), int(r["kv_len"]))
        roof = roofline.predict(mla_prefill_counts(m), [a + b for a, b in mla_prefill_dram(m)], m.dtype, prof)
        bars.append((_shape(m, "x"), float(r["ms"]), prefill_attention_time(m, prof).predicted_s * 1e3,
                     roof.kernels[-1].predicted_s * 1e3))
    fig = mla_time(bars, f"{name}: torch's MLA prefill attention, measured beside its model",
                   roofline_name="roofline of the counts", x_title="sequences x new tokens (on keys)")
    div = fig.to_html(full_html=False, include_plotlyjs=False, div_id=f"fig-{section_id}-mla-prefill-{name.lower()}",
                      config=PLOTLY_CONFIG)
    return (f"<figure>{div}<figcaption>{name}: the attention of DeepSeek-V3's prefill as torch runs it (cuDNN's fused "
            "kernel on keys of 192 and values of 128; a chunk on its cached prefix, bottom-right) measured beside the "
            "fa3 model of cuDNN's kernel (its step, tile and call parts measured at these widths) and the roofline of "
            "the schedule's counts (benchmarks/mla_prefill_record.py).</figcaption></figure>")


def _decode_rows(name: str) -> tuple[list[dict], str]:
    """GPU ``name``'s MLA decode record (benchmarks/mla_record.py), or a note that there is none."""
    return validation_rows(name, MLA_RECORDS[name], MLA_COLUMNS, "MLA record", "mla_record.py")


def _prefill_rows(name: str) -> tuple[list[dict], str]:
    """GPU ``name``'s MLA prefill record (benchmarks/mla_prefill_record.py), or a note that there is none."""
    return validation_rows(name, MLA_PREFILL_RECORDS[name], MLA_PREFILL_COLUMNS, "MLA prefill record",
                           "mla_prefill_record.py")


def _shape(m: MlaPrefill, times: str) -> str:
    """A prefill's shape: sequences ``times`` new tokens, and the keys they see where those are more (a chunk)."""
    return f"{m.batch} {times} {m.seq_len}" + (f" on {m.kv_len}" if m.kv_len != m.seq_len else "")


def mla_part(gpus, section_id: str) -> tuple[str, int]:
    """The MLA part of the serving section (its HTML, its number of figures): the intensity figure once, then per GPU
    of ``gpus`` ((name, profile), ...) its decode time figure and tables, its prefill time figure and table."""
    parts, n_fig = [mla_figure(gpus, section_id)], 1
    for name, profile in gpus:
        decode, prefill = mla_time_figure(name, profile, section_id), mla_prefill_time_figure(name, profile, section_id)
        parts += [decode, mla_measured(name, profile), prefill, mla_prefill_measured(name, profile)]
        n_fig += bool(decode) + bool(prefill)
    return "\n".join(parts), n_fig
