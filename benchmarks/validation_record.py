"""Regenerate the validation record: docs/validation/<device>.csv, the tables of docs/validation.md, the parity figure.

    python benchmarks/validation_record.py                 # re-judge the committed data (any CPU, about a minute)
    python benchmarks/validation_record.py --measure       # on a GPU with ncu: measure the sweep first (~10 min)
    python benchmarks/validation_record.py --measure --part backward --device h100   # the backward sweep only
    python benchmarks/validation_record.py --dry-run --part backward                 # its problems simulated (CPU)

Without ``--measure`` it reads data/validation/<device>-sweep.tar.xz (iosim.measure records: every launch of every
problem), simulates each problem with the current model on the built-in profile (``global`` from the schedule's
counts, ``hbm`` from the L2 model with the launch's measured tiles and registers), writes the record CSV, judges it
(iosim.validation), prints the table and the outliers, rewrites the table between the ``record`` markers of
docs/validation.md and writes docs/validation/<device>-parity.html. With ``--measure`` it first runs the sweep
(each problem ``--repeat`` times, the list over again each time) through iosim.measure and archives the records;
``--part backward`` measures the backward sweep (:func:`backward_sweep`) into <device>-backward.tar.xz instead,
``--part window`` the sliding-window sweep (:func:`window_sweep`: flash2 and flash3, hbm from the L2 model's windowed
program) into <device>-window.tar.xz, ``--part varlen`` packed sequences (:func:`varlen_sweep`: flash2's varlen
kernel, hbm from the L2 model walking the varlen grid as one program, :mod:`iosim.l2.packed`) into <device>-varlen.tar.xz,
``--part paged`` chunked prefill against a paged KV cache (:func:`paged_sweep`: flash2's paged kernel) into
<device>-paged.tar.xz.
``--dry-run`` measures nothing: it simulates every problem of the part's sweep as its records would be (the tiles
the kernels would report), so that a typo fails on a CPU, not on the GPU. ``--part fp8``: iosim's fp8 forward and its
quantize kernels (benchmarks/validation_fp8.py says what is measured and compared) into <device>-fp8.tar.xz.

The backward rows (kernels ``*-bwd``): ``global`` = the SASS global instructions' bytes (reads: ld + ldgsts + red +
atom; writes: st + red + atom: a reduction in L2 is a read and a write of what it updates, as the schedule counts
it), exact for our kernels; ``hbm`` from the L2 model's backward programs (iosim/l2/backward.py). sdpa-flash-bwd
(torch SDPA's FA2 backward) is simulated blind as flash2 backward, gqa="expand", at the tiles its kernel name
gives; sdpa-cudnn-bwd is measured only (its kernels' tiles and dQ reduction are not public: no schedule models it).
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import subprocess
import tarfile
import tempfile
from pathlib import Path

import plotly.graph_objects as go
from plotly.subplots import make_subplots
from time_record_window import window_tiles
from validation_fp8 import dry_run as fp8_dry_run  # beside this file
from validation_fp8 import fp8_checks, fp8_sweep, notes

from iosim.hardware.gpu import get_profile
from iosim.l2 import L2Inputs, simulate_l2
from iosim.l2.packed import packed_dram
from iosim.launch import FLASH_BWD_TILES, backward_launch_model, launch_model, resident_blocks
from iosim.launch.varlen import FLASH_PAGED_TILES
from iosim.measure import Attention, Options, measure
from iosim.measure.records import Measured, merge_repeats, read_records
from iosim.problem import AttentionProblem
from iosim.schedules.flash2_bwd import FA2_BWD_TILES
from iosim.simulate import simulate
from iosim.validation import Check, judge_all, outliers, summary_table, write_checks

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "data/validation"
DOCS = ROOT / "docs/validation"
PROFILE = {"h200": "h200-sxm-141gb", "h100": "h100-sxm5-80gb"}  # device -> the profile its record is simulated on
ARCHIVES = ("sweep", "flash3", "flash2", "backward", "fp8", "window", "varlen", "paged")  # data/validation/<device>-<part>.tar.xz: attention
# kernels; a part named after a kind replaces the earlier parts' problems of that kind (flash2 on the H100: three
# launches each); a part that is missing is skipped
BACKWARD = ("flash2-bwd", "sdpa-flash-bwd", "sdpa-cudnn-bwd")  # iosim.measure.BACKWARD_KINDS
FP8 = ("flash3-fp8", "fp8-quantize")  # iosim.measure.FP8_KINDS
MARK = "<!-- record:{device} {edge} (benchmarks/validation_record.py rewrites this part) -->"


def sweep() -> list[Attention]:
    """The record's problems: our flash2, flash3 and naive kernels, torch SDPA's flash (the blind check) and cuDNN
    (measured, not modeled)."""
    F, S, N_ = "flash2", "sdpa-flash", "naive"
    r = [Attention(F, seq_len=n, heads=32) for n in (512, 1024, 2048, 4096, 8192, 16384, 32768)]
    r += [Attention(F, seq_len=n, heads=32, head_dim=64) for n in (1024, 4096, 16384)]
    r += [Attention(F, seq_len=n, heads=32, causal=True) for n in (1024, 4096, 16384)]
    r += [Attention(F, seq_len=4096, heads=32, head_dim=64, causal=True)]
    r += [Attention(F, seq_len=n, heads=32, kv_heads=8) for n in (4096, 16384)]
    r += [Attention(F, seq_len=8192, heads=32, kv_heads=8, causal=True)]
    r += [Attention(F, seq_len=32768, heads=1), Attention(F, seq_len=8192, heads=8)]
    r += [Attention(F, seq_len=n, heads=32, dtype="bf16") for n in (4096, 16384)]
    r += [Attention(F, seq_len=8192, heads=32, block_q=64, block_kv=64), Attention(F, seq_len=8192, heads=16, batch=2)]
    r += [Attention(F, seq_len=16384, heads=4), Attention(F, seq_len=4096, heads=16, head_dim=64)]
    r += [Attention(F, seq_len=8192, heads=32, dtype="bf16", causal=True), Attention(F, seq_len=2048, heads=2)]
    r += [Attention(F, seq_len=32768, heads=16, kv_heads=2, head_dim=64, causal=True)]
    r += [Attention(F, seq_len=65536, heads=32)] + [Attention(F, seq_len=131072, heads=h) for h in (8, 12, 16, 24, 32)]
    r += [Attention(S, seq_len=n, heads=32) for n in (1024, 4096, 16384)]
    r += [Attention(S, seq_len=4096, heads=32, head_dim=64), Attention(S, seq_len=4096, heads=32, causal=True)]
    r += [Attention(S, seq_len=4096, heads=32, kv_heads=8), Attention("sdpa-cudnn", seq_len=4096, heads=32)]
    r += [Attention(N_, seq_len=n, heads=8, head_dim=64) for n in (512, 1024, 2048, 4096)]
    r += [Attention(N_, seq_len=n, heads=8) for n in (1024, 4096)]
    r += [Attention(N_, seq_len=2048, heads=8, head_dim=64, causal=True)]
    r += [Attention(N_, seq_len=2048, heads=8, kv_heads=2, head_dim=64), Attention(N_, seq_len=16384, heads=1, head_dim=64)]
    r += [Attention(N_, seq_len=n, heads=8, head_dim=64, dtype="bf16") for n in (1024, 4096)]
    r += [Attention(N_, seq_len=2048, heads=4, dtype="bf16", causal=True)]
    r += [Attention(N_, seq_len=8192, heads=2, kv_heads=1, head_dim=64)]
    T = "flash3"  # Hopper only (sm_90a); its global reads are TMA loads
    r += [Attention(T, seq_len=4096, heads=32), Attention(T, seq_len=4096, heads=32, causal=True)]
    r += [Attention(T, seq_len=8192, heads=16, head_dim=64), Attention(T, seq_len=4096, heads=32, kv_heads=8)]
    r += [Attention(T, seq_len=1000, kv_len=1777, heads=8, causal=True), Attention(T, seq_len=16384, heads=32, dtype="bf16")]
    r += [Attention(T, seq_len=2048, heads=4, head_dim=64), Attention(T, seq_len=16384, heads=8, causal=True)]
    return r


def backward_sweep() -> list[Attention]:
    """The backward record's problems: our kernels (ragged, causal with kv_len above and below seq_len, d 64, 128,
    256, fp16 and bf16, GQA 4:1, MQA, 1K to 32K tokens, 2 to 32 heads), torch SDPA's FA2 backward (the blind check;
    kv_len = seq_len where causal: SDPA aligns its causal mask top-left, FA2 bottom-right) and cuDNN's (measured)."""
    F, S, C = "flash2-bwd", "sdpa-flash-bwd", "sdpa-cudnn-bwd"
    r = [Attention(F, seq_len=1000, heads=2, dtype="bf16", causal=True),
         Attention(F, seq_len=4096, heads=8, batch=2, head_dim=64, dtype="bf16"),
         Attention(F, seq_len=777, kv_len=1500, heads=4, causal=True),
         Attention(F, seq_len=1500, kv_len=777, heads=4, head_dim=64, causal=True),
         Attention(F, seq_len=2048, heads=4, head_dim=256, dtype="bf16"),
         Attention(F, seq_len=2048, heads=8, kv_heads=2, batch=2, dtype="bf16", causal=True),
         Attention(F, seq_len=1000, kv_len=3000, heads=16, kv_heads=1, head_dim=64),
         Attention(F, seq_len=8192, heads=16, dtype="bf16", causal=True),
         Attention(F, seq_len=16384, heads=8),
         Attention(F, seq_len=32768, heads=2, head_dim=64, dtype="bf16", causal=True),
         Attention(F, seq_len=4096, heads=32),
         Attention(F, seq_len=16384, heads=32, kv_heads=8, dtype="bf16", causal=True),
         Attention(F, seq_len=8192, heads=8, head_dim=256)]
    r += [Attention(S, seq_len=4096, heads=32), Attention(S, seq_len=4096, heads=32, head_dim=64, dtype="bf16",
                                                           causal=True),
          Attention(S, seq_len=16384, heads=8, dtype="bf16"), Attention(S, seq_len=1000, kv_len=1500, heads=4,
                                                                         head_dim=64),
          Attention(S, seq_len=2048, heads=8, kv_heads=2, batch=2, dtype="bf16", causal=True),
          Attention(S, seq_len=8192, heads=8, head_dim=256, dtype="bf16")]
    r += [Attention(C, seq_len=4096, heads=32, dtype="bf16"), Attention(C, seq_len=4096, heads=32, dtype="bf16",
                                                                         causal=True),
          Attention(C, seq_len=16384, heads=8, dtype="bf16")]
    return r


def window_sweep() -> list[Attention]:
    """The sliding-window record's problems (issue 28): our flash2 and flash3 forward with a window, causal (left, 0)
    and two-sided, windows of 255 to 4096 keys (not multiples of the tiles), grouped-query and ragged."""
    r = []
    for kind in ("flash2", "flash3"):
        r += [Attention(kind, seq_len=8192, heads=16, dtype="bf16", causal=True, window=(1024, 0)),
              Attention(kind, seq_len=16384, heads=8, dtype="bf16", causal=True, window=(4096, 0)),
              Attention(kind, seq_len=8192, heads=16, head_dim=64, dtype="bf16", window=(512, 512)),
              Attention(kind, seq_len=4096, heads=32, kv_heads=8, causal=True, window=(255, 0)),
              Attention(kind, seq_len=1000, kv_len=1777, heads=8, head_dim=64, causal=True, window=(300, 0))]
    return r


def packed(kind: str, heads: int, seqlens, **kw) -> Attention:
    """A packed-sequences problem: batch 1 of the sequences' totals."""
    pairs = tuple((n, n) if isinstance(n, int) else tuple(n) for n in seqlens)
    return Attention(kind, seq_len=sum(q for q, _ in pairs), kv_len=sum(k for _, k in pairs), heads=heads,
                     seqlens=pairs, dtype="bf16", **kw)


def varlen_sweep() -> list[Attention]:
    """The packed-sequences record's problems (issue 28): our flash2's and flash3's varlen kernels on skewed lengths, documents,
    cross-attention pairs, a window over packed sequences, many short sequences, and two long ones whose K/V and O
    pass L2 (the dirty lines of one sequence written back under the next)."""
    docs = (815, 214, 677, 133, 902, 455, 371, 788, 120, 640, 509, 266, 873, 301, 590, 448)
    short = tuple(17 + (37 * i) % 114 for i in range(64))
    return [run for kind in ("flash2", "flash3") for run in (
            packed(kind, 16, (2048, 1024, 512, 256, 100), causal=True),
            packed(kind, 16, docs, kv_heads=4, head_dim=64, causal=True),
            packed(kind, 8, ((512, 2048), (1024, 1024), (100, 3000))),
            packed(kind, 8, (4096, 2048, 3000), causal=True, window=(1023, 0)),
            packed(kind, 12, short, head_dim=64, causal=True),
            packed(kind, 16, (16384, 8192), kv_heads=4, causal=True))]


def paged_sweep() -> list[Attention]:
    """The paged-cache record's problems (issue 28, chunked prefill): a chunk of new tokens per sequence against its
    cache, pages smaller than a K/V tile, not a power of two, one tile and several tiles long, and a window."""
    chunks = ((512, 4096), (1024, 8192), (256, 2304), (2048, 2048))
    return [packed("flash2", 32, chunks, kv_heads=8, causal=True, page_size=ps) for ps in (16, 48, 64, 256)] + [
        packed("flash2", 16, ((300, 5000), (77, 77), (1000, 3000)), head_dim=64, causal=True, window=(1023, 0),
               page_size=32)]


def fa2_bwd_tiles(names: list[str], head_dim: int) -> tuple[int, int]:
    """(Br, Bc) of FlashAttention-2's backward from its kernel names (Flash_bwd_kernel_traits<d, Br, Bc, ...>), or
    FA2's table (FA2_BWD_TILES) where no name has them."""
    for name in names:
        m = re.search(r"Flash_bwd_kernel_traits<\d+, (\d+), (\d+),", name)
        if m:
            return int(m.group(1)), int(m.group(2))
    return next(FA2_BWD_TILES[k] for k in sorted(FA2_BWD_TILES) if head_dim <= k)


def simulate_backward(m: Measured, profile: str) -> tuple[str, object, object, tuple[int, int]] | None:
    """(variant, simulate's result, the L2 model's, tiles) of a measured backward problem; None where it is not
    modeled (cuDNN's)."""
    run = m.run
    if run.kind == "sdpa-cudnn-bwd":
        return None
    p = AttentionProblem.make(batch=run.batch, heads=run.heads, kv_heads=run.kv_heads, seq_len=run.seq_len,
                              kv_len=run.kv_len, head_dim=run.head_dim, dtype=run.dtype, causal=run.causal)
    if run.kind == "flash2-bwd":
        (bq, bkv), gqa, variant = (m.launch["tiles"]["block_q"], m.launch["tiles"]["block_kv"]), "grouped", "iosim"
    else:
        (bq, bkv), gqa, variant = fa2_bwd_tiles([k["kernel"] for k in m.kernels], run.head_dim), "expand", "fa2"
    prof = get_profile(profile)
    r = simulate("flash2", p, prof, pass_="backward", block_q=bq, block_kv=bkv, gqa=gqa, l2=False)
    lm = backward_launch_model("flash2", p, r.tiles, variant=variant)
    # the measured registers of the first three kernels (preprocess, main, dQ conversion: both designs' order)
    regs = [k.registers for k in lm.kernels]
    for i, k in enumerate(m.kernels[:3]):
        regs[i] = k.get("registers_per_thread") or regs[i]
    lm = backward_launch_model("flash2", p, r.tiles, variant=variant, registers=regs)
    resident = [resident_blocks(prof, k.threads, k.smem, k.registers)[0] for k in lm.kernels]
    l2 = simulate_l2("flash2", p, r.tiles, prof, L2Inputs(resident=resident), pass_="backward", variant=variant)
    return variant, r, l2, (bq, bkv)


def fa2_tiles(name: str) -> tuple[int, int]:
    """(Br, Bc) from FlashAttention-2's kernel name: Flash_fwd_kernel_traits<d, Br, Bc, warps, ...>."""
    m = re.search(r"Flash_fwd_kernel_traits<\d+, (\d+), (\d+),", name)
    if not m:
        raise ValueError(f"no Flash_fwd_kernel_traits in {name[:120]!r}")
    return int(m.group(1)), int(m.group(2))


def simulate_measured(m: Measured, profile: str) -> list[Check] | None:
    """The four checks (global, hbm x read, write) of one measured problem; None where the model has no kernel."""
    run = m.run
    if m.error or run.kind not in ("flash2", "flash3", "naive", "sdpa-flash", *BACKWARD, *FP8) or not m.kernels:
        return None
    if run.kind in FP8:
        return fp8_checks(m, profile)
    if run.kind in BACKWARD:
        got = simulate_backward(m, profile)
        return None if got is None else _checks(m, profile, got[1], got[2], got[3])
    p = AttentionProblem.make(batch=run.batch, heads=run.heads, kv_heads=run.kv_heads, seq_len=run.seq_len,
                              kv_len=run.kv_len, head_dim=run.head_dim, dtype=run.dtype, causal=run.causal)
    if run.kind in ("flash2", "flash3"):
        bq, bkv, variant = m.launch["tiles"]["block_q"], m.launch["tiles"]["block_kv"], "iosim"
    elif run.kind == "naive":
        qk = m.launch["tiles"]["qk"]
        bq, bkv, variant = qk["block_m"], qk["block_n"], "iosim"
    else:
        (bq, bkv), variant = fa2_tiles(m.kernels[0]["kernel"]), "fa2"
    schedule = run.kind if run.kind in ("naive", "flash3") else "flash2"
    prof = get_profile(profile)
    r = simulate(schedule, p, prof, block_q=bq, block_kv=bkv, l2=False, window=run.window,  # global; hbm below
                 seqlens=run.seqlens, page_size=run.page_size)
    regs = [k.get("registers_per_thread") for k in m.kernels]
    lm = launch_model(schedule, p, r.tiles, variant=variant, registers=regs)
    resident = [resident_blocks(prof, k.threads, k.smem, k.registers)[0] for k in lm.kernels]
    if run.seqlens:  # packed sequences: the varlen grid walked as one program
        return _checks(m, profile, r, packed_dram(p, r.tiles, prof, inputs=L2Inputs(resident=resident)), (bq, bkv))
    l2 = simulate_l2(schedule, p, r.tiles, prof, L2Inputs(resident=resident), variant=variant)
    return _checks(m, profile, r, l2, (bq, bkv))


def _checks(m: Measured, profile: str, r, l2, tiles: tuple[int, int]) -> list[Check]:
    """The four checks of one measured problem from simulate's result ``r`` (global) and the L2 model's (hbm)."""
    run, meas = m.run, m.measured
    bq, bkv = tiles
    # flash3 loads Q, K, V by TMA (its own tile schedule, a few kB, by plain loads, is not the schedule's); a
    # reduction in L2 (red, atom: the backward's dQ) is a read and a write of what it updates
    red = (meas.get("sass_global_red_bytes") or 0) + (meas.get("sass_global_atom_bytes") or 0)
    loads = meas.get("tma_global_ld_bytes") if run.kind == "flash3" else \
        (meas.get("sass_global_ld_bytes") or 0) + (meas.get("sass_global_ldgsts_bytes") or 0) + red
    stores = meas.get("sass_global_st_bytes")
    measured = {("global", "read"): loads,
                ("global", "write"): None if stores is None else stores + red,
                ("hbm", "read"): meas["dram_read_bytes"], ("hbm", "write"): meas["dram_write_bytes"]}
    simulated = {("global", "read"): r.counts.global_read_bytes, ("global", "write"): r.counts.global_write_bytes,
                 ("hbm", "read"): l2.read_bytes, ("hbm", "write"): l2.write_bytes}
    base = (run.kind, profile, run.batch, run.heads, run.kv_heads, run.seq_len, run.kv_len, run.head_dim, run.dtype,
            run.causal, bq, bkv)
    out = []
    for (b, d), sim in simulated.items():
        launches = tuple(int(x[f"dram_{d}_bytes"]) for x in m.launches) if b == "hbm" else ()
        out.append(Check(*base, b, d, int(sim), int(measured[(b, d)]), launches, run.window, run.seqlens,
                         run.page_size))
    return out


def rewrite_doc(device: str, table: str, meta: str) -> None:
    """Put ``table`` and ``meta`` between the record markers of docs/validation.md."""
    doc = ROOT / "docs/validation.md"
    text = doc.read_text()
    start, end = MARK.format(device=device, edge="start"), MARK.format(device=device, edge="end")
    if start not in text or end not in text:
        print(f"docs/validation.md has no record markers for {device}: table not written there")
        return
    head, rest = text.split(start, 1)
    doc.write_text(f"{head}{start}\n{meta}\n\n{table}\n{end}{rest.split(end, 1)[1]}")


def parity_figure(checks: list[Check], path: Path, device: str) -> None:
    """Simulated against measured bytes, log-log, one panel per boundary and direction, y = x dotted."""
    panels = [("global", "read"), ("global", "write"), ("hbm", "read"), ("hbm", "write")]
    fig = make_subplots(rows=2, cols=2, subplot_titles=[f"{b} {d} (bytes)" for b, d in panels])
    colors = {"flash2": "#1f77b4", "flash3": "#9467bd", "naive": "#d62728", "sdpa-flash": "#2ca02c",
              "flash2-bwd": "#17becf", "sdpa-flash-bwd": "#bcbd22", "flash3-fp8": "#8c564b", "fp8-quantize": "#e377c2"}
    for i, (b, d) in enumerate(panels):
        at = {"row": i // 2 + 1, "col": i % 2 + 1}
        sel = [c for c in checks if (c.boundary, c.direction) == (b, d)]
        vals = [v for c in sel for v in (c.simulated, c.measured) if v > 0] or [1, 10]
        lo, hi = min(vals) / 2, max(vals) * 2
        fig.add_trace(go.Scatter(x=[lo, hi], y=[lo, hi], mode="lines", line={"color": "gray", "dash": "dot"},
                                 showlegend=False, hoverinfo="skip"), **at)
        for kernel, color in colors.items():
            pts = [c for c in sel if c.kernel == kernel]
            fig.add_trace(go.Scatter(x=[max(c.measured, lo) for c in pts], y=[max(c.simulated, lo) for c in pts],
                                     mode="markers", name=kernel, legendgroup=kernel, showlegend=i == 0,
                                     marker={"color": color, "size": 8}, text=[c.label for c in pts],
                                     hovertemplate="%{text}<br>measured %{x:.4s}B<br>simulated %{y:.4s}B"
                                                   "<extra></extra>"), **at)
        fig.update_xaxes(type="log", title_text="measured (Nsight Compute)", **at)
        fig.update_yaxes(type="log", title_text="simulated (iosim)", **at)
    fig.update_layout(title=f"iosim vs Nsight Compute, {device} (sdpa-flash: the blind check, torch's FA2); "
                            "zeros drawn at the axis floor", height=900, width=1100, template="plotly_white")
    fig.write_html(path, include_plotlyjs="cdn")
    print(f"wrote {path}")


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def measure_sweep(device: str, repeat: int, kinds: list[str] | None = None, part: str = "sweep") -> None:
    """Run the sweep (its problems of ``kinds``, or all) ``repeat`` times over through iosim.measure; archive the
    record as <device>-<part>.tar.xz."""
    problems = [a for a in part_sweep(part) if not kinds or a.kind in kinds]
    with tempfile.TemporaryDirectory() as tmp:
        rec = measure(problems * repeat, Options(workdir=tmp, keep_csv=f"{tmp}/ncu_sweep.csv")).to_json()
        rec["repeat"], rec["commit"] = repeat, _commit()
        Path(tmp, "measured_sweep.json").write_text(json.dumps(rec, indent=1))
        with tarfile.open(DATA / f"{device}-{part}.tar.xz", "w:xz") as tar:
            for name in ("measured_sweep.json", "ncu_sweep.csv"):
                tar.add(Path(tmp, name), arcname=name)
    print(f"wrote {DATA / f'{device}-{part}.tar.xz'}: record its device, driver, commit and command in "
          f"{DATA / 'manifest.json'}")


def part_sweep(part: str) -> list[Attention]:
    """The problems ``--measure --part PART`` runs: the backward's, fp8's, or the forward sweep (any other name)."""
    return {"backward": backward_sweep, "fp8": fp8_sweep, "window": window_sweep,
            "varlen": varlen_sweep, "paged": paged_sweep}.get(part, sweep)()


def dry_run(part: str, profile: str, repeat: int) -> None:
    """Simulate every problem of the part's sweep as its record would be (no measurement: the tiles our kernels
    would report, FA2's table for torch's), printing the simulated bytes and what ncu will profile."""
    import time

    if part == "fp8":
        fp8_dry_run(profile, repeat)
        return
    if part in ("window", "varlen", "paged"):
        tiled_dry_run(profile, repeat, part)
        return
    problems = part_sweep(part)
    launches = 0
    for run in problems:
        t0 = time.perf_counter()
        if run.kind not in BACKWARD:
            print(f"{run.kind}: the forward record's problem (not dry-run here)")
            continue
        launch = {"tiles": dict(zip(("block_q", "block_kv"), FLASH_BWD_TILES[run.head_dim]))}
        got = simulate_backward(Measured(run, {}, {}, launch=launch), profile)
        kernels = 3 + (run.kind != "flash2-bwd" and run.heads != run.kv_heads) * 2  # torch sums dK, dV apart
        launches += kernels + 2  # and the run's two markers
        if got is None:
            print(f"{run}: measured only")
            continue
        _, r, l2, tiles = got
        g = r.traffic["global"]
        print(f"{run.kind} B{run.batch} N{run.seq_len} Nk{run.kv_len} H{run.heads}/{run.kv_heads} d{run.head_dim} "
              f"{run.dtype}{' causal' if run.causal else ''} {tiles[0]}x{tiles[1]}: global {g['read_bytes']:,}/"
              f"{g['write_bytes']:,} hbm {l2.read_bytes:,}/{l2.write_bytes:,} ({time.perf_counter() - t0:.1f} s)")
    print(f"{len(problems)} problems x {repeat} launches: about {launches * repeat} kernels profiled per ncu pass")


def tiled_dry_run(profile: str, repeat: int, part: str = "window") -> None:
    """The window or varlen part's problems simulated at the tiles our kernels run them at (global, and hbm from
    the L2 model)."""
    prof = get_profile(profile)
    problems = part_sweep(part)
    for run in problems:
        bq, bkv = (FLASH_PAGED_TILES[run.head_dim] if run.page_size else
                   window_tiles(run.kind, run.head_dim, run.causal, run.window))
        p = AttentionProblem.make(batch=run.batch, heads=run.heads, kv_heads=run.kv_heads, seq_len=run.seq_len,
                                  kv_len=run.kv_len, head_dim=run.head_dim, dtype=run.dtype, causal=run.causal)
        r = simulate(run.kind, p, prof, block_q=bq, block_kv=bkv, l2=False, window=run.window, seqlens=run.seqlens,
                     page_size=run.page_size)
        l2 = packed_dram(p, r.tiles, prof) if run.seqlens else simulate_l2(run.kind, p, r.tiles, prof)
        g = r.traffic["global"]
        what = f"{len(run.seqlens)} sequences" if run.seqlens else f"window {run.window}"
        what += f" paged {run.page_size}" if run.page_size else ""
        print(f"{run.kind} N{run.seq_len} Nk{run.kv_len} H{run.heads}/{run.kv_heads} d{run.head_dim} {what} "
              f"{bq}x{bkv}: global {g['read_bytes']:,}/{g['write_bytes']:,} hbm {l2.read_bytes:,}/{l2.write_bytes:,}")
    print(f"{len(problems)} problems x {repeat} launches")


def measured_only(measured: dict) -> None:
    """Print the problems measured but not modeled (cuDNN's backward): DRAM bytes and time, kernels."""
    for m in measured.get("sdpa-cudnn-bwd", []):
        r, x = m.run, m.measured
        names = ", ".join(k["kernel"].split("(")[0][:60] for k in m.kernels)
        print(f"  measured only: {r.kind} N={r.seq_len} H={r.heads}/{r.kv_heads} d={r.head_dim} {r.dtype}"
              f"{' causal' if r.causal else ''}: DRAM {x.get('dram_read_bytes')} / {x.get('dram_write_bytes')} B, "
              f"{m.time_ms} ms; {names}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="h200", choices=sorted(PROFILE))
    ap.add_argument("--measure", action="store_true", help="measure the sweep on this GPU first (ncu)")
    ap.add_argument("--repeat", type=int, default=3, help="launches of each problem with --measure (default 3)")
    ap.add_argument("--kinds", nargs="*", help="with --measure: only these kernels (flash2 naive sdpa-flash ...)")
    ap.add_argument("--part", default="sweep", help="with --measure: the archive's part name (default sweep); "
                    "backward: the backward sweep, into <device>-backward.tar.xz; fp8: the fp8 forward and its "
                    "quantize kernels, into <device>-fp8.tar.xz; window: flash2 and flash3 with sliding windows, "
                    "into <device>-window.tar.xz; varlen: flash2 on packed sequences, into <device>-varlen.tar.xz; "
                    "paged: flash2's chunked prefill on a paged cache, into <device>-paged.tar.xz")
    ap.add_argument("--dry-run", action="store_true", help="simulate the part's sweep as recorded; measure nothing")
    ap.add_argument("--no-figure", action="store_true", help="skip the parity figure (needs plotly)")
    args = ap.parse_args(argv)
    if args.dry_run:
        dry_run(args.part, PROFILE[args.device], args.repeat)
        return
    if args.measure:
        measure_sweep(args.device, args.repeat, args.kinds, args.part)
    profile = PROFILE[args.device]
    measured, name = {}, args.device  # kind -> merged problems
    for part in ARCHIVES:
        path = DATA / f"{args.device}-{part}.tar.xz"
        if not path.is_file():
            continue
        got: dict[str, list] = {}
        for data in read_records(path).values():
            name = data.get("device", {}).get("name", name)
            for m in merge_repeats(data):
                got.setdefault(m.run.kind, []).append(m)
        for kind, ms in got.items():
            measured[kind] = ms if kind == part else measured.get(kind, []) + ms
    checks = [c for ms in measured.values() for m in ms for c in simulate_measured(m, profile) or []]
    write_checks(DOCS / f"{args.device}.csv", checks, name)
    verdicts = judge_all(checks)
    table = summary_table(verdicts)
    meta = (f"Judged {datetime.date.today().isoformat()} at commit {_commit()} on profile `{profile}`: "
            f"`python benchmarks/validation_record.py --device {args.device}`.")
    print(meta + "\n\n" + table + "\n\noutside the rule, or a lower bound:")
    for v in outliers(verdicts):
        c = v.check
        err = "n/a" if v.error is None else f"{v.error:+.1%}"
        print(f"  {c.label} {c.boundary} {c.direction}: simulated {c.simulated:,} measured {c.measured:,} ({err})"
              f"{' passed by ' + v.by if v.passed else ''}{' [lower bound]' if v.lower_bound else ''}")
    measured_only(measured)
    fp8_lines = notes(measured.get("flash3-fp8", []), profile)
    if fp8_lines:
        print("flash3-fp8: what the exact global reads leave out (benchmarks/validation_fp8.py)")
        print("\n".join(fp8_lines))
    rewrite_doc(args.device, table, meta)
    if not args.no_figure:
        parity_figure(checks, DOCS / f"{args.device}-parity.html", args.device)


if __name__ == "__main__":
    main()
