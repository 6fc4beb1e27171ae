"""Standard attention on the GPU: iosim's naive kernels (S and P materialized, tensor cores) vs torch's own.

    python benchmarks/bench_standard.py [--d 64 128] [--n 1024 ... 16384] [--dtype bf16 fp16] [--causal false true]
                                        [--reps 20] [--csv out.csv]

Both sides are Algorithm 0 in the input dtype: S = scale·QKᵀ written to global memory, P = softmax(S) written, then
O = P·V. torch's is the tighter of its two usual spellings: ``baddbmm`` with the scale folded into the GEMM (no extra
pass over S), ``softmax``, ``bmm``, with a ``masked_fill`` of S for causal; ``matmul(q, kᵀ) * scale`` (textbook,
one more pass over S) is timed beside it. Same inputs, same run, CUDA events around each call, warm-up, the median of
--reps calls; the FlashAttention papers' shapes (batch · N = 16384 tokens, heads = 2048 / d). Before timing, each
output is poisoned (NaN) and computed once, then compared with a float64 reference on its first batch and head.
Prints the table last; issue 17's bar is iosim-naive >= 0.8× torch's (the ``vs torch`` column) for N 1024 to 16384.
"""

from __future__ import annotations

import argparse
import csv
import sys

from cuda_events import time_ms  # beside this file


def _torch_standard(qt, kt, vt, causal: bool, fold_scale: bool):
    """torch's standard attention over (B, H, N, d) views: one (B·H) batch of GEMMs, softmax, GEMMs."""
    import torch

    B, H, N, d = qt.shape
    q3, k3, v3 = (x.reshape(B * H, N, d) for x in (qt.contiguous(), kt.contiguous(), vt.contiguous()))
    scale = d**-0.5
    mask = torch.ones(N, N, dtype=torch.bool, device=qt.device).triu(1) if causal else None

    def run():
        if fold_scale:
            s = torch.baddbmm(torch.empty(B * H, N, N, dtype=q3.dtype, device=q3.device), q3, k3.transpose(1, 2),
                              beta=0.0, alpha=scale)
        else:
            s = torch.matmul(q3, k3.transpose(1, 2)) * scale
        if mask is not None:
            s = s.masked_fill(mask, float("-inf"))
        return torch.bmm(torch.softmax(s, dim=-1), v3)

    return run


def _reference(q, k, v, causal: bool):
    """float64 softmax(QKᵀ/√d)V of batch 0, head 0 (q, k, v: (B, N, H, d))."""
    import torch

    q0, k0, v0 = (x[0, :, 0].double() for x in (q, k, v))
    s = q0 @ k0.T * q0.shape[-1] ** -0.5
    if causal:
        s = s.masked_fill(torch.ones_like(s, dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(s, -1) @ v0


def _rel_err(out0, ref) -> float:
    return float((out0.double() - ref).norm() / ref.norm())


def _case(q, k, v, causal: bool, reps: int) -> dict:
    """One shape: iosim-naive and torch's two spellings, checked against float64, then timed."""
    import cupy as cp
    import torch

    from iosim import gpu

    B, n, H, d = q.shape
    ref = _reference(q, k, v, causal)
    out = torch.full_like(q, float("nan"))  # poisoned: a kernel that skips a row shows as NaN

    def ours():
        return gpu.attention(q, k, v, schedule="naive", causal=causal, options=gpu.AttentionOptions(out=out))

    ours()
    torch.cuda.synchronize()
    row = {"N": n, "batch": B, "heads": H, "causal": causal, "naive_err": _rel_err(out[0, :, 0], ref),
           "naive_ms": time_ms(ours, reps, warmup=3)}
    torch.cuda.synchronize()
    cp.get_default_memory_pool().free_all_blocks()  # S and P's workspace, before torch allocates its own
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    for key, fold in (("torch", True), ("torch_textbook", False)):
        fn = _torch_standard(qt, kt, vt, causal, fold)
        o = fn()
        torch.cuda.synchronize()
        row[f"{key}_err"] = _rel_err(o.view(B, H, n, d)[0, 0], ref)
        o = None
        row[f"{key}_ms"] = time_ms(fn, reps, warmup=3)
        fn = None
        torch.cuda.empty_cache()
    row["vs_torch"] = row["torch_ms"] / row["naive_ms"]
    row["vs_textbook"] = row["torch_textbook_ms"] / row["naive_ms"]
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--d", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--n", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384])
    ap.add_argument("--dtype", nargs="+", default=["bf16"], choices=["bf16", "fp16"])
    ap.add_argument("--causal", nargs="+", default=["false"], choices=["false", "true"])
    ap.add_argument("--tokens", type=int, default=16384, help="batch * N")
    ap.add_argument("--hidden", type=int, default=2048, help="heads * d")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--csv", help="write the table here too")
    args = ap.parse_args(argv)

    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    dev = torch.cuda.get_device_name()
    print(f"device: {dev}; torch {torch.__version__}", flush=True)
    rows = []
    for dname in args.dtype:
        tdt = {"bf16": torch.bfloat16, "fp16": torch.float16}[dname]
        for d in args.d:
            for n in args.n:
                B, H = max(1, args.tokens // n), args.hidden // d
                g = torch.Generator(device="cuda").manual_seed(7 * n + d)
                qkv = [torch.randn(B, n, H, d, device="cuda", dtype=tdt, generator=g) for _ in range(3)]
                for causal in (c == "true" for c in args.causal):
                    row = {"dtype": dname, "d": d, **_case(*qkv, causal, args.reps)}
                    rows.append(row)
                    print("  " + "  ".join(f"{k_}={v_:.4g}" if isinstance(v_, float) else f"{k_}={v_}"
                                           for k_, v_ in row.items()), flush=True)
                qkv = None
                torch.cuda.empty_cache()

    print(f"\n{dev}: iosim naive vs torch standard attention, median of {args.reps} calls (CUDA events), "
          "speedup = torch ms / iosim ms\n")
    print("| dtype | d | N | B×H | causal | iosim-naive ms | torch ms | vs torch | torch textbook ms | vs textbook "
          "| rel. error (iosim / torch) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['dtype']} | {r['d']} | {r['N']} | {r['batch']}×{r['heads']} | {r['causal']} | "
              f"{r['naive_ms']:.3f} | {r['torch_ms']:.3f} | {r['vs_torch']:.2f}× | {r['torch_textbook_ms']:.3f} | "
              f"{r['vs_textbook']:.2f}× | {r['naive_err']:.1e} / {r['torch_err']:.1e} |")
    ok = [r for r in rows if 1024 <= r["N"] <= 16384]
    if ok:
        worst = min(ok, key=lambda r: r["vs_torch"])
        print(f"\nslowest against torch (N 1024-16384): {worst['vs_torch']:.2f}× at {worst['dtype']} d={worst['d']} "
              f"N={worst['N']} causal={worst['causal']}; the bar is 0.80×")
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
