"""Forward attention throughput: iosim's flash2 (and, on Hopper, flash3) kernels vs torch SDPA's flash (FA2) and cuDNN.

    python benchmarks/bench_attention.py [--csv out.csv] [--d 64 128] [--n 512 ... 16384] [--dtype bf16 fp16]
                                         [--tiles 128x32 64x64] [--reps 30] [--flash3 auto|yes|no]
                                         [--long-csv docs/benchmarks/<device>.csv --commit SHA]

Backends, all in the same run on the same inputs: iosim-flash2 (schedule="flash2"), iosim-flash3 (schedule="flash3",
sm_90 only; --flash3 auto times it where the GPU is Hopper), sdpa-flash, sdpa-cudnn. --long-csv appends one row per
(shape, backend) with the columns device, date, commit, dtype, head_dim, seq_len, batch, heads, causal, backend, ms,
tflops (the file is created with its header if missing).

The FlashAttention papers' benchmark shape: batch * N = 16384 tokens, heads = 2048 / d. Same input values for every
backend (torch's (B, H, N, d) are transposed views of our (B, N, H, d) tensors), same run, CUDA events around each
call, warm-up, the median of --reps calls. One input set is 3 * 16384 * 2048 * 2 B = 201 MB, over 3x the H200's
60 MB L2, so inputs are not rotated. TFLOP/s = 4 * N^2 * d * batch * heads / t, halved when causal.
Needs torch and CuPy on a CUDA GPU; prints a table and, with --csv, writes it.
"""

# ruff: noqa: B023  (each timing lambda is called at once, inside its loop iteration)
from __future__ import annotations

import argparse
import csv
import sys

from cuda_events import time_ms  # beside this file

LONG_COLUMNS = (
    "device", "date", "commit", "dtype", "head_dim", "seq_len", "batch", "heads", "causal", "backend", "ms", "tflops",
)  # fmt: skip
_BACKENDS = (("iosim-flash2", "ours"), ("iosim-flash3", "flash3"), ("sdpa-flash", "flash"), ("sdpa-cudnn", "cudnn"))


def _append_long_csv(path: str, device: str, commit: str, rows: list[dict]) -> None:
    """One row per (shape, backend): the docs/benchmarks/<device>.csv record."""
    import datetime
    import math
    import os

    date = datetime.date.today().isoformat()
    new = not os.path.exists(path)
    with open(path, "a", newline="") as f:
        w = csv.writer(f)
        if new:
            w.writerow(LONG_COLUMNS)
        for r in rows:
            if r.get("extra_tiles"):
                continue  # a --tiles row: the default tile's row stands for iosim-flash2
            for backend, key in _BACKENDS:
                ms = r.get(f"{key}_ms")
                if ms is None or math.isnan(ms):
                    continue
                w.writerow((device, date, commit, r["dtype"], r["d"], r["N"], r["batch"], r["heads"],
                            str(r["causal"]).lower(), backend, f"{ms:.4f}", f"{r[f'{key}_tflops']:.1f}"))
    print(f"appended to {path}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--d", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--n", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192, 16384])
    ap.add_argument("--dtype", nargs="+", default=["bf16", "fp16"], choices=["bf16", "fp16"])
    ap.add_argument("--causal", nargs="+", default=["false", "true"], choices=["false", "true"])
    ap.add_argument(
        "--tiles", nargs="*", default=[], help="extra (block_q)x(block_kv) configs of ours, e.g. 64x64"
    )
    ap.add_argument("--tokens", type=int, default=16384, help="batch * N")
    ap.add_argument("--hidden", type=int, default=2048, help="heads * d")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--no-peers", action="store_true", help="time only iosim's kernel")
    ap.add_argument("--csv", help="write the table here")
    ap.add_argument("--flash3", choices=["auto", "yes", "no"], default="auto",
                    help="time schedule='flash3' too (auto: where the GPU is Hopper, sm_90)")
    ap.add_argument("--long-csv", help="append one row per (shape, backend) here (docs/benchmarks/<device>.csv)")
    ap.add_argument("--commit", default="", help="the commit measured, for --long-csv")
    args = ap.parse_args(argv)

    import cupy as cp
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from iosim import gpu

    torch.backends.cuda.matmul.allow_tf32 = False
    dev = torch.cuda.get_device_name()
    print(f"device: {dev}; torch {torch.__version__}; cupy {cp.__version__}", flush=True)
    with_flash3 = args.flash3 == "yes" or (
        args.flash3 == "auto" and str(cp.cuda.Device().compute_capability) == "90"
    )
    rows = []
    for dname in args.dtype:
        tdt = {"bf16": torch.bfloat16, "fp16": torch.float16}[dname]
        for d in args.d:
            for n in args.n:
                B, H = args.tokens // n, args.hidden // d
                g = torch.Generator(device="cuda").manual_seed(n * d)
                q, k, v = (torch.randn(B, n, H, d, device="cuda", dtype=tdt, generator=g) for _ in range(3))
                qc, kc, vc = (cp.from_dlpack(x) for x in (q, k, v))  # zero-copy views for our kernel
                qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))  # (B, H, N, d) views for torch
                out = cp.empty_like(qc)
                for causal in (c == "true" for c in args.causal):
                    flops = 4 * n * n * d * B * H / (2 if causal else 1)
                    tf = lambda ms, flops=flops: flops / (ms * 1e-3) / 1e12  # noqa: E731
                    configs = [None] + [tuple(int(x) for x in t.split("x")) for t in args.tiles]
                    for tiles in configs:
                        if tiles is not None and tiles not in gpu.FLASH_TILES[d]:
                            continue
                        bq, bkv = (
                            tiles
                            if tiles
                            else gpu.default_tiles(d, {"bf16": "bfloat16", "fp16": "float16"}[dname], causal)
                        )
                        ours_ms = time_ms(
                            lambda: gpu.attention(
                                qc, kc, vc, causal=causal,
                                options=gpu.AttentionOptions(block_q=bq, block_kv=bkv, out=out)
                            ),
                            args.reps,
                            args.warmup,
                            busy=False,
                        )
                        row = {
                            "dtype": dname, "d": d, "N": n, "batch": B, "heads": H, "causal": causal,
                            "tiles": f"{bq}x{bkv}", "ours_ms": ours_ms, "ours_tflops": tf(ours_ms),
                        }  # fmt: skip
                        if tiles is not None:
                            row["extra_tiles"] = True
                        if with_flash3 and tiles is None and d in gpu.FLASH3_TILES:
                            f3_ms = time_ms(
                                lambda: gpu.attention(qc, kc, vc, schedule="flash3", causal=causal,
                                                      options=gpu.AttentionOptions(out=out)),
                                args.reps,
                                args.warmup,
                                busy=False,
                            )
                            row["flash3_ms"], row["flash3_tflops"] = f3_ms, tf(f3_ms)
                            f3_out = torch.from_dlpack(out).transpose(1, 2).float()
                        if not args.no_peers and tiles is None:
                            for name, backend in (
                                ("flash", SDPBackend.FLASH_ATTENTION),
                                ("cudnn", SDPBackend.CUDNN_ATTENTION),
                            ):
                                try:
                                    with sdpa_kernel(backend):
                                        ref = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
                                        ms = time_ms(
                                            lambda: F.scaled_dot_product_attention(
                                                qt, kt, vt, is_causal=causal
                                            ),
                                            args.reps,
                                            args.warmup,
                                            busy=False,
                                        )
                                    row[f"{name}_ms"], row[f"{name}_tflops"] = ms, tf(ms)
                                except Exception as exc:  # a backend that does not support this case
                                    print(f"  {name} failed at d={d} N={n}: {type(exc).__name__}: {exc}")
                                    row[f"{name}_ms"] = row[f"{name}_tflops"] = float("nan")
                                    continue
                                if name == "flash":  # same values in: our output must agree with FA2's
                                    ours = torch.from_dlpack(out).transpose(1, 2).float()
                                    row["rel_diff_vs_flash"] = float(
                                        (ours - ref.float()).norm() / ref.float().norm()
                                    )
                                    if "flash3_ms" in row:
                                        row["flash3_rel_diff_vs_flash"] = float(
                                            (f3_out - ref.float()).norm() / ref.float().norm()
                                        )
                            row["ours/flash"] = row["ours_tflops"] / row["flash_tflops"]
                            row["ours/cudnn"] = row["ours_tflops"] / row["cudnn_tflops"]
                            if "flash3_ms" in row:
                                row["flash3/flash"] = row["flash3_tflops"] / row["flash_tflops"]
                                row["flash3/cudnn"] = row["flash3_tflops"] / row["cudnn_tflops"]
                        rows.append(row)
                        print("  " + "  ".join(f"{k_}={v_:.4g}" if isinstance(v_, float) else f"{k_}={v_}"
                                               for k_, v_ in row.items()), flush=True)  # fmt: skip
                q = k = v = qc = kc = vc = qt = kt = vt = out = None  # free before the next shape
                torch.cuda.empty_cache()

    nan = float("nan")
    hdr = (
        "| dtype | d | N | causal | tiles | ours TFLOP/s | SDPA flash | SDPA cuDNN | ours/flash | ours/cuDNN "
        "| flash3 TFLOP/s | flash3/flash | flash3/cuDNN |"
    )
    print(f"\n{dev}, TFLOP/s = 4*N^2*d*B*H/t (causal /2), median of {args.reps} (CUDA events); ours = flash2\n")
    print(hdr)
    print("|" + "---|" * (hdr.count("|") - 1))
    for r in rows:
        peers = (
            f"{r.get('flash_tflops', nan):.1f} | {r.get('cudnn_tflops', nan):.1f} | "
            f"{r.get('ours/flash', nan):.2f} | {r.get('ours/cudnn', nan):.2f}"
        )
        f3 = f"{r.get('flash3_tflops', nan):.1f} | {r.get('flash3/flash', nan):.2f} | {r.get('flash3/cudnn', nan):.2f}"
        print(
            f"| {r['dtype']} | {r['d']} | {r['N']} | {r['causal']} | {r['tiles']} | {r['ours_tflops']:.1f} | {peers} "
            f"| {f3} |"
        )
    if args.long_csv:
        _append_long_csv(args.long_csv, dev, args.commit, rows)
    if args.csv:
        keys = sorted(
            {k_ for r in rows for k_ in r}, key=lambda k_: list(rows[0]).index(k_) if k_ in rows[0] else 99
        )
        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=keys)
            w.writeheader()
            w.writerows(rows)
        print(f"wrote {args.csv}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
