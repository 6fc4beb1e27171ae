"""Backward-pass throughput: iosim's FlashAttention-2 backward kernels vs torch SDPA's flash (FA2) and cuDNN backward,
and the training step of an attention layer (forward + backward) for the FlashAttention papers' GPT-2 shapes.

    python benchmarks/bench_backward.py [--d 64 128] [--n 1024 ... 16384] [--dtype bf16] [--causal false true]
                                        [--reps 20] [--long-csv docs/benchmarks/<device>.csv --commit SHA]
    python benchmarks/bench_backward.py --training [--n 512 1024 2048 4096]      # fwd + bwd, d = 64, 12 heads

Backward: every backend gets the same q, k, v, O, lse, dO (torch's (B, H, N, d) are transposed views of our
(B, N, H, d) tensors); each backend's backward alone is timed (torch's through its aten backward op, called directly,
so no autograd bookkeeping is timed; ours through iosim.gpu.attention_backward), CUDA events on a busy stream, the
median of --reps calls after warm-up. Backends: iosim-flash2-bwd (atomic dQ), iosim-flash2-bwd-det (deterministic),
iosim-flash3-bwd (kernels/flash3_bwd.cu, the FlashAttention-3 design; on sm_90 only), sdpa-flash-bwd, sdpa-cudnn-bwd,
torch-standard-bwd (standard attention's backward through autograd, S and P kept in memory by its forward; shapes
whose P exceeds 8 GiB are skipped). TFLOP/s by the papers' convention: 2.5 x 4 N^2 d B H / t, halved when causal.
Shape: B * N = 16384 tokens, heads = 2048 / d (as bench_attention.py).

--training: loss.backward() through the whole causal layer, forward included, for standard attention (torch-standard:
S = scale Q K^T, mask, softmax, P V in bf16 with autograd, S and P materialized: the papers' baseline; torch-math:
SDPA's math backend, which also upcasts to fp32), torch SDPA flash and cuDNN, and iosim-flash2 (gpu.attention with
requires_grad: our forward, our backward). B * N = 16384 tokens (GPT-2 small: 12 heads, d = 64); prints each
backend's ms and its speedup over torch-standard, beside the simulated traffic ratio (iosim.simulate, naive against
flash2, forward + backward, global bytes); --long-csv writes the rows the report's section "Training: forward +
backward" reads. Our naive kernels have no backward, so standard attention is torch's. Needs torch and CuPy.
"""

# ruff: noqa: B023  (each timing lambda is called at once, inside its loop iteration)
from __future__ import annotations

import argparse
import datetime
import os
import sys

from cuda_events import time_ms  # beside this file

from iosim.calibrate.backward_step import torch_backward

LONG_COLUMNS = ("device", "date", "commit", "dtype", "head_dim", "seq_len", "batch", "heads", "causal", "backend",
                "ms", "tflops")


def _inputs(torch, B, N, H, d, dt, causal):
    from iosim import gpu

    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (torch.randn(B, N, H, d, generator=g, device="cuda", dtype=torch.float32).to(dt) for _ in range(4))
    o, lse = gpu.attention(q, k, v, causal=causal, return_lse=True)
    return q, k, v, o, lse, do


def backward_rows(torch, args) -> list[dict]:
    from iosim import gpu

    rows = []
    for dt_name in args.dtype:
        dt = {"bf16": torch.bfloat16, "fp16": torch.float16}[dt_name]
        for d in args.d:
            H = 2048 // d
            for causal in args.causal:
                for N in args.n:
                    B = max(1, 16384 // N)
                    q, k, v, o, lse, do = _inputs(torch, B, N, H, d, dt, causal)
                    scale = d ** -0.5
                    flops = 2.5 * 4 * N * N * d * B * H / (2 if causal else 1)
                    calls = {
                        "iosim-flash2-bwd": lambda: gpu.attention_backward(q, k, v, o, do, lse, causal=causal),
                        "iosim-flash2-bwd-det": lambda: gpu.attention_backward(
                            q, k, v, o, do, lse, causal=causal, options=gpu.BackwardOptions(deterministic=True)),
                    }
                    if torch.cuda.get_device_capability() == (9, 0):  # the FA3 design: sm_90 only
                        calls["iosim-flash3-bwd"] = lambda: gpu.attention_backward(
                            q, k, v, o, do, lse, causal=causal, options=gpu.BackwardOptions(schedule="flash3"))
                    for name, backend in (("sdpa-flash-bwd", "flash"), ("sdpa-cudnn-bwd", "cudnn")):
                        try:
                            calls[name] = torch_backward(torch, backend, q, k, v, do, causal, scale)
                        except RuntimeError as exc:  # a backend that does not take the shape: say so, go on
                            print(f"  {name}: not run ({str(exc).splitlines()[0][:90]})", file=sys.stderr)
                    if B * H * N * N * 2 <= STANDARD_BYTES_MAX:
                        calls["torch-standard-bwd"] = _standard_backward(torch, q, k, v, do, causal)
                    for name, fn in calls.items():
                        ms = time_ms(fn, args.reps)
                        rows.append({"dtype": dt_name, "d": d, "N": N, "batch": B, "heads": H, "causal": causal,
                                     "backend": name, "ms": ms, "tflops": flops / ms / 1e9})
                    _print_shape(rows[-len(calls):])
    return rows


STANDARD_BYTES_MAX = 8 << 30  # P (and its gradient, and dS) of standard attention's backward, each


def _standard_backward(torch, q, k, v, do, causal):
    """A zero-argument call of standard attention's backward alone: the graph (S and P in memory, as the papers'
    baseline keeps them) built once, its backward run again each call (autograd.grad, graph retained)."""
    leaves = [x.detach().requires_grad_() for x in (q, k, v)]
    out = _standard(torch, causal)(*leaves)
    return lambda: torch.autograd.grad(out, leaves, do, retain_graph=True)


def _print_shape(rows: list[dict]) -> None:
    r0 = rows[0]
    by = {r["backend"]: r for r in rows}
    ours = by["iosim-flash2-bwd"]["ms"]
    ratios = "  ".join(f"{b.removeprefix('sdpa-')}/ours {by[b]['ms'] / ours:.2f}x" for b in by
                       if b.startswith("sdpa"))
    if "iosim-flash3-bwd" in by:  # flash3's speed over each torch backend (> 1: flash3 is faster)
        f3 = by["iosim-flash3-bwd"]["ms"]
        ratios += "  |" + "".join(f"  f3 vs {b.removeprefix('sdpa-')} {by[b]['ms'] / f3:.2f}x" for b in by
                                  if b.startswith("sdpa"))
    cells = "  ".join(f"{b.removeprefix('iosim-').removeprefix('flash2-').removeprefix('sdpa-')} {r['tflops']:6.1f}"
                      for b, r in by.items())
    print(f"{r0['dtype']} d={r0['d']:<3} N={r0['N']:<6} causal={r0['causal']!s:<5} TFLOP/s: {cells}  | {ratios}",
          flush=True)


TRAINING_COLUMNS = ("device", "date", "commit", "dtype", "head_dim", "seq_len", "batch", "heads", "causal", "backend",
                    "ms", "speedup")


def _standard(torch, causal: bool):
    """Standard attention as the FlashAttention papers time it: S = scale Q K^T, mask, softmax, O = P V, in the
    input dtype with autograd (S and P materialized in memory, read back by the backward)."""
    def f(q, k, v):
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
        s = (qt @ kt.transpose(-1, -2)) * q.shape[-1] ** -0.5
        if causal:
            n = s.shape[-1]
            s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=s.device).triu(1), float("-inf"))
        return (torch.softmax(s, dim=-1) @ vt).transpose(1, 2)
    return f


def training_rows(torch, args) -> list[dict]:
    """fwd + bwd of the attention layer, GPT-2 small shapes (d = 64, 12 heads, B * N = 16384), causal, every
    backend in one run; speedup = torch-standard's ms / the backend's."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from iosim import AttentionProblem, gpu, simulate

    rows, d, H, dt = [], 64, 12, torch.bfloat16
    names = ("torch-standard", "torch-math", "sdpa-flash", "sdpa-cudnn", "iosim-flash2")
    print(f"{'N':>6} {'B':>4} " + " ".join(f"{n:>15}" for n in names) + "   speedup over torch-standard"
          "   simulated traffic naive/flash2 (fwd+bwd, global)")
    for N in args.n:
        B = max(1, 16384 // N)
        q, k, v, do = (torch.randn(B, N, H, d, device="cuda", dtype=dt) for _ in range(4))
        leaves = [x.clone().requires_grad_() for x in (q, k, v)]

        def step(attn):
            for x in leaves:
                x.grad = None
            attn(*leaves).backward(do)

        def sdpa(backend):
            def f(q, k, v):
                with sdpa_kernel(backend):
                    return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                          is_causal=True).transpose(1, 2)
            return f

        fns = {"torch-standard": _standard(torch, True), "torch-math": sdpa(SDPBackend.MATH),
               "sdpa-flash": sdpa(SDPBackend.FLASH_ATTENTION), "sdpa-cudnn": sdpa(SDPBackend.CUDNN_ATTENTION),
               "iosim-flash2": lambda q, k, v: gpu.attention(q, k, v, causal=True)}
        ms = {name: time_ms(lambda: step(fn), args.reps) for name, fn in fns.items()}
        p = AttentionProblem(batch=B, heads=H, seq_len=N, head_dim=d, dtype="bf16", causal=True)
        sim = {s: sum(simulate(s, p, "h100-sxm5-80gb", pass_="both", l2=False).traffic["global"].values())
               for s in ("naive", "flash2")}
        for name, t in ms.items():
            rows.append({"dtype": "bf16", "d": d, "N": N, "batch": B, "heads": H, "causal": True, "backend": name,
                         "ms": t, "speedup": ms["torch-standard"] / t})
        print(f"{N:>6} {B:>4} " + " ".join(f"{ms[n]:>15.3f}" for n in names) + "   "
              + " ".join(f"{ms['torch-standard'] / ms[n]:.2f}x" for n in names[1:])
              + f"   {sim['naive'] / sim['flash2']:.1f}x", flush=True)
    return rows


def _append(path: str, columns: tuple[str, ...], dev: str, commit: str, rows: list[dict], last: str) -> None:
    new = not os.path.exists(path)
    with open(path, "a") as f:
        if new:
            f.write(",".join(columns) + "\n")
        for r in rows:
            f.write(f"{dev},{datetime.date.today().isoformat()},{commit},{r['dtype']},{r['d']},{r['N']},"
                    f"{r['batch']},{r['heads']},{str(r['causal']).lower()},{r['backend']},{r['ms']:.4f},"
                    f"{r[last]:.{3 if last == 'speedup' else 1}f}\n")
    print(f"appended to {path}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--d", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--n", type=int, nargs="+", default=None)
    ap.add_argument("--dtype", nargs="+", default=["bf16"], choices=["bf16", "fp16"])
    ap.add_argument("--causal", nargs="+", default=["false", "true"], choices=["false", "true"])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--training", action="store_true", help="fwd + bwd of the layer, GPT-2 small shapes")
    ap.add_argument("--long-csv", help="append one row per (shape, backend) here: docs/benchmarks/<profile>.csv, "
                                       "or with --training docs/benchmarks/training-<profile>.csv")
    ap.add_argument("--commit", default="", help="the commit measured, for --long-csv")
    args = ap.parse_args(argv)
    args.causal = [c == "true" for c in args.causal]
    import torch

    dev = torch.cuda.get_device_name()
    print(f"device {dev}, torch {torch.__version__}")
    if args.training:
        args.n = args.n or [512, 1024, 2048, 4096]
        rows = training_rows(torch, args)
        if args.long_csv:
            _append(args.long_csv, TRAINING_COLUMNS, dev, args.commit, rows, "speedup")
        return 0
    args.n = args.n or [1024, 2048, 4096, 8192, 16384]
    rows = backward_rows(torch, args)
    if args.long_csv:
        _append(args.long_csv, LONG_COLUMNS, dev, args.commit, rows, "tflops")
    return 0


if __name__ == "__main__":
    sys.exit(main())
