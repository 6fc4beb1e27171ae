"""FP8 (e4m3) attention forward throughput: iosim's FlashAttention-3-design FP8 kernel against our bf16 flash3, cuDNN's
bf16 fused attention (torch SDPA) and cuDNN's FP8 forward (cudnn-frontend), same run, same inputs (issue 27).

    python benchmarks/bench_fp8.py [--d 64 128 256] [--n 1024 ... 16384] [--causal false true] [--reps 30]
                                   [--incoherent SEED] [--check] [--csv out.csv]
                                   [--long-csv docs/benchmarks/<profile>.csv --commit SHA]

Per shape (batch * N = 16384 tokens, heads = 2048 / d, as benchmarks/bench_attention.py), on one set of bf16 inputs
(standard normal, seeded by N and d):

- ``iosim-flash3-fp8``: ``iosim.gpu.attention(qf, kf, vf, schedule="flash3")`` on inputs quantized beforehand by
  ``iosim.gpu.quantize_fp8`` (Q in blocks of 128 rows, K and V in blocks of ``FLASH3_FP8_TILES[d][1]``, V transposed;
  Q and K share the ``--incoherent`` seed); ``iosim-fp8-quantize``: the quantize pass alone (Q, K and V); and
  quantize + attention through ``iosim.gpu.attention_fp8`` (printed, not recorded);
- ``iosim-flash3`` (bf16): ``iosim.gpu.attention(q, k, v, schedule="flash3")``;
- ``sdpa-cudnn`` (bf16): torch SDPA's cuDNN backend on (B, H, N, d) views;
- ``cudnn-fp8``: cuDNN's FP8 forward through cudnn-frontend (iosim/calibrate/cudnn_fp8.py): the graph built once a shape,
  inputs quantized per tensor from the same bf16 values. Where cuDNN refuses a shape the row says why.

Correctness before timing, every row: each backend's output (computed into a NaN-poisoned buffer: ours through
``out=``, our FP8 through iosim.gpu.fp8's ``out=`` (O, lse), cuDNN FP8 into its own; torch SDPA and
``attention_fp8``, which take none, right after a NaN-filled block of the output's size was freed, best effort) against a float64
reference of the bf16 inputs on up to 1,024 query rows (the first 128, the last, the rest evenly spaced; every key),
relative Frobenius error. The FP8 tolerance :data:`FP8_TOL` = 0.10: an e4m3 emulation of this design on these
inputs (per-block scales, P in e4m3; tests/test_bench_fp8.py) lands at 0.045-0.057, bf16 kernels at ~3e-3, and a
wrong tile or a mis-laid-out V at ~1. ``--check`` exits 1 when our FP8 output misses it on any shape (or our FP8 path
did not run). Timing: CUDA events on a busy stream (GPU time, free of host launch cost; benchmarks/cuda_events.py),
warm-up, the median of --reps calls. TFLOP/s = 4 N^2 d B H / t, halved when causal (the quantize pass is not
given any). Issue 27's bars are judged per row (:data:`BARS`). Progress goes to stderr; the table comes last.
--long-csv appends the FP8 rows (dtype ``fp8e4m3``; backends above) in docs/benchmarks' long format.
Needs torch, CuPy, iosim's FP8 kernel on sm_90, and for cudnn-fp8 the ``nvidia-cudnn-frontend`` package.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

from cuda_events import time_ms  # beside this file

from iosim.calibrate import cudnn_fp8

FP8_DTYPE = "fp8e4m3"
LONG_COLUMNS = ("device", "date", "commit", "dtype", "head_dim", "seq_len", "batch", "heads", "causal", "backend",
                "ms", "tflops")
LONG_BACKENDS = (("ours_fp8", "iosim-flash3-fp8"), ("quantize", "iosim-fp8-quantize"), ("cudnn_fp8", "cudnn-fp8"))
FP8_TOL = 0.10  # relative Frobenius error against float64 (module docstring: why this value)
BF16_TOL = 1e-2  # as tests/gpu and the other benchmarks
CHECK_ROWS = 1024
FIRST_TILE = 128
# issue 27: (causal, d) -> (target, floor) TFLOP/s of our FP8 forward; and at least 1.0x cuDNN's FP8 on every shape
BARS = {(False, 128): (1000.0, 850.0), (False, 256): (1100.0, 950.0), (True, 128): (850.0, 700.0)}
CUDNN_FP8_BAR = 1.0


def flops(s: cudnn_fp8.Shape, causal: bool) -> float:
    return 4 * s.seq_len ** 2 * s.head_dim * s.batch * s.heads / (2 if causal else 1)


def tflops(s: cudnn_fp8.Shape, causal: bool, ms: float) -> float:
    return flops(s, causal) / (ms * 1e-3) / 1e12


def shapes(ds, ns, tokens: int = 16384, hidden: int = 2048) -> list[cudnn_fp8.Shape]:
    """The FlashAttention papers' shapes: batch * N = ``tokens``, heads = ``hidden`` / d."""
    return [cudnn_fp8.Shape(max(1, tokens // n), n, hidden // d, d) for d in ds for n in ns]


def sample_rows(n: int, count: int = CHECK_ROWS) -> list[int]:
    """Query rows the check compares: the first tile's, the last, and the rest evenly spaced (all rows if n <= count)."""
    if n <= count:
        return list(range(n))
    first = list(range(min(FIRST_TILE, n)))
    rest = count - len(first) - 1
    spaced = [FIRST_TILE + round(i * (n - 1 - FIRST_TILE) / rest) for i in range(rest)] if rest > 0 else []
    return sorted(set(first + spaced + [n - 1]))


def bar_verdict(row: dict) -> str:
    """Issue 27's bars on one row: our FP8 TFLOP/s against its (target, floor), and ours ÷ cuDNN FP8 against 1.0."""
    out = []
    ours = row.get("ours_fp8_tflops")
    bar = BARS.get((row["causal"], row["d"]))
    if bar and ours is not None:
        target, floor = bar
        out.append(f">= {target:g} ok" if ours >= target else
                   f"under {target:g}, floor {floor:g} ok" if ours >= floor else f"UNDER FLOOR {floor:g}")
    ratio = row.get("ours/cudnn_fp8")
    if ratio is not None:
        out.append(f">= {CUDNN_FP8_BAR:g}x cuDNN fp8 ok" if ratio >= CUDNN_FP8_BAR else
                   f"UNDER {CUDNN_FP8_BAR:g}x cuDNN fp8")
    return "; ".join(out) or "-"


def short(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:200]}"


# ------------------------------------------------------------------------------------------------------------------
# the float64 check


def reference_rows(torch, inputs, rows: list[int], causal: bool):
    """float64 O (B, len(rows), H, d) of bf16 (B, N, H, d) inputs at query ``rows``, every key (top-left causal)."""
    q, k, v = inputs
    B, N, H, d = q.shape
    idx = torch.as_tensor(rows, device=q.device)
    out = torch.empty((B, len(rows), H, d), dtype=torch.float64, device=q.device)
    hidden = torch.arange(N, device=q.device)[None, :] > idx[:, None] if causal else None
    for b in range(B):
        for h in range(0, H, 4):  # four heads at a time: 1,024 x 16,384 float64 scores are 134 MB a head
            hs = slice(h, h + 4)
            qs, ks, vs = q[b, idx, hs].double(), k[b, :, hs].double(), v[b, :, hs].double()
            s = torch.einsum("rhd,nhd->hrn", qs, ks) / math.sqrt(d)
            if hidden is not None:
                s = s.masked_fill(hidden, float("-inf"))
            out[b, :, hs] = torch.einsum("hrn,nhd->rhd", s.softmax(-1), vs)
    return out


def errors(torch, o, ref, rows: list[int]) -> tuple[float, float]:
    """(relative Frobenius error, RMSE) of O (B, N, H, d) at ``rows`` against the float64 reference."""
    got = o[:, torch.as_tensor(rows, device=o.device)].double()
    diff = got - ref
    if not bool(torch.isfinite(got).all()):
        return math.inf, math.inf
    return float(diff.norm() / ref.norm()), float(diff.pow(2).mean().sqrt())


def as_torch(torch, x):
    return x if isinstance(x, torch.Tensor) else torch.from_dlpack(x)


def poisoned_call(torch, gpu, shape, call) -> tuple[Any, str]:
    """``call(options)`` computed once for the check, into a NaN-filled ``out=``; where the call does not take one,
    the NaN-filled block is freed first so torch's caching allocator hands it to the call's own output. (O, note)."""
    out = torch.full(shape, float("nan"), dtype=torch.bfloat16, device="cuda")
    o, note = None, ""
    try:
        o = call(gpu.AttentionOptions(out=out))
    except Exception as exc:  # an API without out=: fall back below (outside this block: exc holds `out`), say so
        note = f"no out= ({short(exc)}); allocator poisoned"
    if o is None:
        del out
        return after_poison(torch, shape, lambda: call(None)), note
    torch.cuda.synchronize()
    return as_torch(torch, o), note


def after_poison(torch, shape, call):
    """``call()``'s output (as torch), computed right after a NaN-filled bf16 block of ``shape`` was freed: torch's
    caching allocator hands that block to the next allocation of its size, the output's, so a kernel that leaves
    elements unwritten leaves NaN there, not an earlier call's answer."""
    spare = torch.full(shape, float("nan"), dtype=torch.bfloat16, device="cuda")
    del spare
    o = call()
    torch.cuda.synchronize()
    return as_torch(torch, o)


# ------------------------------------------------------------------------------------------------------------------
# the backends: each measures one shape and returns its fields of the row (key_ms, key_err, ...)


@dataclass
class Run:
    """What every shape's measurement needs: the modules, the options, cuDNN FP8's handle or why there is none."""

    torch: Any
    gpu: Any
    args: argparse.Namespace
    cudnn: Any = None
    handle: Any = None
    cudnn_why: str = ""


@dataclass
class Case:
    """One shape, causal or not, on its bf16 inputs, with the float64 reference of the checked rows."""

    shape: cudnn_fp8.Shape
    causal: bool
    inputs: tuple
    rows: list
    ref: Any


def _kw(options) -> dict:
    return {} if options is None else {"options": options}


def _timed(run: Run, fn) -> float:
    return time_ms(fn, run.args.reps, run.args.warmup)


def _checked(key: str, err: float, rmse: float, tol: float) -> dict:
    return {f"{key}_err": err, f"{key}_rmse": rmse, f"{key}_check": "ok" if err <= tol else "FAIL"}


def fp8_poisoned(torch, fp8, causal: bool, attend) -> tuple[Any, str]:
    """Our FP8 kernel once, for the check, into NaN-filled O and lse through iosim.gpu.fp8's ``out=`` (every element
    must be overwritten); where that path is refused, ``attend()`` after the allocator was poisoned. (O, note)."""
    qf, kf, vf = fp8
    B, N, H, d = qf.shape
    o = torch.full((B, N, H, d), float("nan"), dtype=torch.bfloat16, device="cuda")
    lse = torch.full((B, H, N), float("nan"), dtype=torch.float32, device="cuda")
    try:
        import cupy as cp

        from iosim.gpu.fp8 import attention_fp8_quantized

        attention_fp8_quantized(qf, kf, vf, causal=causal, out=(cp.from_dlpack(o), cp.from_dlpack(lse)))
        torch.cuda.synchronize()
        return o, ""
    except Exception as exc:  # fall back below (outside this block: exc holds `o`), say so
        note = f"no out= ({short(exc)}); allocator poisoned"
    del o, lse
    return after_poison(torch, (B, N, H, d), attend), note


def ours_fp8(run: Run, c: Case) -> dict:
    """Our FP8 forward on pre-quantized inputs; the quantize pass alone; quantize + attention (attention_fp8)."""
    torch, gpu, seed = run.torch, run.gpu, run.args.incoherent
    q, k, v = c.inputs
    bq, bkv = gpu.fp8_blocks(c.shape.head_dim)  # = (128, FLASH3_FP8_TILES[d][1])

    def quantize():
        return (gpu.quantize_fp8(q, block=bq, incoherent=seed), gpu.quantize_fp8(k, block=bkv, incoherent=seed),
                gpu.quantize_fp8(v, block=bkv, transpose=True))

    qf, kf, vf = quantize()

    def attend():
        return gpu.attention(qf, kf, vf, schedule="flash3", causal=c.causal)

    def end_to_end():
        return gpu.attention_fp8(q, k, v, causal=c.causal, incoherent=seed)

    o, note = fp8_poisoned(torch, (qf, kf, vf), c.causal, attend)
    out = _checked("ours_fp8", *errors(torch, o, c.ref, c.rows), FP8_TOL)
    del o
    out.update(ours_fp8_ms=_timed(run, attend), quantize_ms=_timed(run, quantize))
    if note:
        out["ours_fp8_note"] = note
    try:  # the convenience call on its own: where it fails, the rows above still stand
        out.update(_checked("e2e", *errors(torch, after_poison(torch, q.shape, end_to_end), c.ref, c.rows), FP8_TOL))
        out["e2e_ms"] = _timed(run, end_to_end)
    except Exception as exc:
        out["e2e_why"] = short(exc)
    return out


def ours_bf16(run: Run, c: Case) -> dict:
    torch, gpu = run.torch, run.gpu
    q, k, v = c.inputs

    def attend(options=None):
        return gpu.attention(q, k, v, schedule="flash3", causal=c.causal, **_kw(options))

    o, _ = poisoned_call(torch, gpu, q.shape, attend)
    return {**_checked("ours_bf16", *errors(torch, o, c.ref, c.rows), BF16_TOL), "ours_bf16_ms": _timed(run, attend)}


def cudnn_bf16(run: Run, c: Case) -> dict:
    """torch SDPA's cuDNN backend on (B, H, N, d) views, as benchmarks/bench_attention.py times it."""
    torch = run.torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    qt, kt, vt = (x.transpose(1, 2) for x in c.inputs)
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        o = after_poison(torch, c.inputs[0].shape,
                         lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=c.causal)).transpose(1, 2)
        out = _checked("cudnn_bf16", *errors(torch, o, c.ref, c.rows), BF16_TOL)
        del o
        out["cudnn_bf16_ms"] = _timed(run, lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=c.causal))
    return out


def cudnn_fp8_peer(run: Run, c: Case) -> dict:
    """cuDNN's FP8 forward (iosim/calibrate/cudnn_fp8.py), or why it did not run."""
    if run.cudnn is None:
        return {"cudnn_fp8_why": run.cudnn_why}
    torch = run.torch
    call, note = cudnn_fp8.prepare(torch, run.cudnn, run.handle, c.inputs, c.causal)
    if call is None:
        return {"cudnn_fp8_why": f"cudnn-fp8: not supported here: {note}"}
    call()
    torch.cuda.synchronize()
    out = _checked("cudnn_fp8", *errors(torch, call.output(torch), c.ref, c.rows), FP8_TOL)
    out.update(cudnn_fp8_ms=_timed(run, call), cudnn_fp8_note=note)
    return out


BACKENDS = (("ours_fp8", ours_fp8), ("ours_bf16", ours_bf16), ("cudnn_bf16", cudnn_bf16), ("cudnn_fp8", cudnn_fp8_peer))


def measure(run: Run, inputs: tuple, shape: cudnn_fp8.Shape, causal: bool) -> dict:
    """One row: every backend on the same inputs, each checked, then timed; a backend that fails says why."""
    rows = sample_rows(shape.seq_len)
    c = Case(shape, causal, inputs, rows, reference_rows(run.torch, inputs, rows, causal))
    row = {"d": shape.head_dim, "N": shape.seq_len, "batch": shape.batch, "heads": shape.heads, "causal": causal}
    for key, fn in BACKENDS:
        try:
            row.update(fn(run, c))
        except Exception as exc:  # one backend's failure is that row's cell, never the run's end
            row[f"{key}_why"] = short(exc)
        if f"{key}_why" in row:
            print(f"    {key}: {row[f'{key}_why']}", file=sys.stderr, flush=True)
    return with_rates(row, shape)


def with_rates(row: dict, shape: cudnn_fp8.Shape) -> dict:
    """TFLOP/s of every timed attention (not the quantize pass), and the ratios the table shows."""
    for key in ("ours_fp8", "e2e", "ours_bf16", "cudnn_bf16", "cudnn_fp8"):
        ms = row.get(f"{key}_ms")
        if ms is not None and ms > 0:
            row[f"{key}_tflops"] = tflops(shape, row["causal"], ms)
    f8 = row.get("ours_fp8_tflops")
    for name, other in (("ours/cudnn_fp8", "cudnn_fp8_tflops"), ("fp8/bf16", "ours_bf16_tflops")):
        if f8 is not None and row.get(other):
            row[name] = f8 / row[other]
    row["bars"] = bar_verdict(row)
    return row


# ------------------------------------------------------------------------------------------------------------------
# the table, the records


def _f(v, fmt: str = ".1f") -> str:
    return "—" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, fmt)


LABELS = {"ours_fp8": "ours-fp8", "e2e": "quant+attn", "ours_bf16": "ours-bf16", "cudnn_bf16": "cudnn-bf16", "cudnn_fp8": "cudnn-fp8"}
TABLE_HEAD = ("| d | N | causal | ours fp8 TFLOP/s | quantize ms | quant+attn TFLOP/s | cuDNN fp8 | ours/cuDNN-fp8 "
              "| ours bf16 | cuDNN bf16 | fp8/bf16 | err ours fp8 | err cuDNN fp8 | bars | notes |")


def table(rows: list[dict]) -> str:
    """The Markdown table printed last: one line per shape; a backend that did not run has "—" and its reason."""
    lines = [TABLE_HEAD, "|" + "---|" * (TABLE_HEAD.count("|") - 1)]
    for r in rows:
        notes = [why if why.startswith(LABELS[k]) else f"{LABELS[k]}: {why}"
                 for k in LABELS if (why := r.get(f"{k}_why"))]
        notes += [f"{k} check FAIL" for k in ("ours_fp8", "e2e", "ours_bf16", "cudnn_bf16", "cudnn_fp8")
                  if r.get(f"{k}_check") == "FAIL"]
        if r.get("cudnn_fp8_note"):
            notes.append(f"cudnn-fp8 {r['cudnn_fp8_note']}")
        cells = (r["d"], r["N"], r["causal"], _f(r.get("ours_fp8_tflops")), _f(r.get("quantize_ms"), ".4f"),
                 _f(r.get("e2e_tflops")), _f(r.get("cudnn_fp8_tflops")), _f(r.get("ours/cudnn_fp8"), ".2f"),
                 _f(r.get("ours_bf16_tflops")), _f(r.get("cudnn_bf16_tflops")), _f(r.get("fp8/bf16"), ".2f"),
                 _f(r.get("ours_fp8_err"), ".1e"), _f(r.get("cudnn_fp8_err"), ".1e"), r.get("bars", "-"),
                 "; ".join(notes).replace("|", "/") or "-")
        lines.append("| " + " | ".join(str(x) for x in cells) + " |")
    return "\n".join(lines)


def long_rows(rows: list[dict], device: str, commit: str, date: str) -> list[tuple]:
    """docs/benchmarks' long format, the FP8 backends only (dtype fp8e4m3): one row per (shape, backend) timed."""
    out = []
    for r in rows:
        for key, backend in LONG_BACKENDS:
            ms = r.get(f"{key}_ms")
            if ms is None or math.isnan(ms):
                continue
            rate = r.get(f"{key}_tflops")
            out.append((device, date, commit, FP8_DTYPE, r["d"], r["N"], r["batch"], r["heads"],
                        str(r["causal"]).lower(), backend, f"{ms:.4f}", "" if rate is None else f"{rate:.1f}"))
    return out


def append_long_csv(path: str, device: str, commit: str, rows: list[dict]) -> int:
    """Append to ``path`` (its header written where the file is new); the number of rows appended."""
    new = not os.path.exists(path)
    out = long_rows(rows, device, commit, datetime.date.today().isoformat())
    with open(path, "a", newline="") as f:
        w = csv.writer(f)
        if new:
            w.writerow(LONG_COLUMNS)
        w.writerows(out)
    print(f"appended {len(out)} rows to {path}")
    return len(out)


def check_failures(rows: list[dict]) -> list[str]:
    """Rows whose FP8 output missed FP8_TOL, or where our FP8 path did not run: --check's reasons to exit 1."""
    bad = []
    for r in rows:
        where = f"d={r['d']} N={r['N']} causal={r['causal']}"
        if "ours_fp8_why" in r:
            bad.append(f"{where}: our fp8 did not run ({r['ours_fp8_why']})")
        for key in ("ours_fp8", "e2e"):
            if r.get(f"{key}_check") == "FAIL":
                bad.append(f"{where}: {key} error {r[f'{key}_err']:.3g} > {FP8_TOL}")
    return bad


# ------------------------------------------------------------------------------------------------------------------
# the run


def device_lines(torch) -> str:
    """``nvidia-smi -L``'s lines where it answers, else torch's device name; then the versions."""
    try:
        gpus = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30, check=True)
        name = gpus.stdout.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        name = f"GPU 0: {torch.cuda.get_device_name()} (nvidia-smi -L: {short(exc)})"
    cc = ".".join(map(str, torch.cuda.get_device_capability()))
    return (f"{name}\nsm_{cc.replace('.', '')}; torch {torch.__version__}, CUDA {torch.version.cuda}, "
            f"cuDNN (torch's) {torch.backends.cudnn.version()}")


def open_cudnn(torch) -> tuple[Any, Any, str]:
    """(cudnn module, handle, "") or (None, None, why cuDNN FP8 is not measured)."""
    try:
        import cudnn
    except ImportError as exc:
        why = f"no cudnn-frontend ({short(exc)}; pip install nvidia-cudnn-frontend)"
        return None, None, f"cudnn-fp8: not supported here: {why}"
    try:
        handle = cudnn_fp8.open_handle(torch, cudnn)
    except Exception as exc:
        return None, None, f"cudnn-fp8: not supported here: no cuDNN handle ({short(exc)})"
    backend = getattr(cudnn, "backend_version_string", lambda: "?")()
    print(f"cudnn-frontend {getattr(cudnn, '__version__', '?')}, cuDNN backend {backend}", flush=True)
    return cudnn, handle, ""


def inputs_of(torch, s: cudnn_fp8.Shape) -> tuple:
    g = torch.Generator(device="cuda").manual_seed(s.seq_len * s.head_dim)
    return tuple(torch.randn(s.batch, s.seq_len, s.heads, s.head_dim, device="cuda", dtype=torch.bfloat16,
                             generator=g) for _ in range(3))


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--d", type=int, nargs="+", default=[64, 128, 256])
    ap.add_argument("--n", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384])
    ap.add_argument("--causal", nargs="+", default=["false", "true"], choices=["false", "true"])
    ap.add_argument("--tokens", type=int, default=16384, help="batch * N")
    ap.add_argument("--hidden", type=int, default=2048, help="heads * d")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--incoherent", type=int, default=None, help="the Hadamard seed Q and K are quantized with")
    ap.add_argument("--check", action="store_true", help=f"exit 1 where our fp8 error exceeds {FP8_TOL} (float64)")
    ap.add_argument("--csv", help="write every field of every row here")
    ap.add_argument("--long-csv", help="append the fp8 rows here (docs/benchmarks/<profile>.csv)")
    ap.add_argument("--commit", default="", help="the commit measured, for --long-csv")
    args = ap.parse_args(argv)
    args.causal = [c == "true" for c in args.causal]
    return args


def run_all(run: Run) -> list[dict]:
    torch, rows = run.torch, []
    todo = shapes(run.args.d, run.args.n, run.args.tokens, run.args.hidden)
    for i, s in enumerate(todo):
        inputs = inputs_of(torch, s)
        for causal in run.args.causal:
            t = time.perf_counter()
            print(f"[{i + 1}/{len(todo)}] d={s.head_dim} N={s.seq_len} B={s.batch} H={s.heads} causal={causal} ...",
                  file=sys.stderr, flush=True)
            rows.append(measure(run, inputs, s, causal))
            r = rows[-1]
            print(f"    {time.perf_counter() - t:.1f} s; ours fp8 {_f(r.get('ours_fp8_tflops'))}, cuDNN fp8 "
                  f"{_f(r.get('cudnn_fp8_tflops'))}, ours bf16 {_f(r.get('ours_bf16_tflops'))} TFLOP/s",
                  file=sys.stderr, flush=True)
        del inputs
        torch.cuda.empty_cache()
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    start = time.perf_counter()
    import torch

    from iosim import gpu

    print(device_lines(torch), flush=True)
    cudnn, handle, why = open_cudnn(torch)
    if why:
        print(why, flush=True)
    rows = run_all(Run(torch, gpu, args, cudnn, handle, why))
    print(f"\n{torch.cuda.get_device_name()}: TFLOP/s = 4 N^2 d B H / t (causal / 2), median of {args.reps} "
          f"(CUDA events, busy stream); err = relative Frobenius error vs float64 (fp8 tolerance {FP8_TOL})\n")
    print(table(rows))
    if args.csv:
        keys = list(dict.fromkeys(k for r in rows for k in r))
        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=keys)
            w.writeheader()
            w.writerows(rows)
        print(f"wrote {args.csv}")
    if args.long_csv:
        append_long_csv(args.long_csv, torch.cuda.get_device_name(), args.commit, rows)
    bad = check_failures(rows)
    for line in bad:
        print(f"check: {line}", file=sys.stderr)
    print(f"wall time {time.perf_counter() - start:.1f} s")
    return 1 if args.check and bad else 0


if __name__ == "__main__":
    sys.exit(main())
