"""Decode throughput: iosim's Flash-Decoding kernel (contiguous and paged KV caches) against torch's decode paths.

    python benchmarks/bench_decode.py --out DIR [--n 8192 16384 32768] [--batch 16 32 64]
                                      [--pages contig 16 64 256] [--cache bf16 fp8] [--check] [--flex] [--reps 30]

Shape (issue 28's bar): bf16, d = 128, 32 query heads on 4 kv heads (GQA 8:1), q_len 1, every sequence --n keys.
Per (n, batch) one contiguous cache (batch, n, kv_heads, d) is drawn; each paged layout is the same keys and values
in pages of 16/64/256 tokens stored in a shuffled order (block table of a random permutation), so every row reads
the same values. ``--cache fp8``: each layout again with the cache quantized to e4m3 by iosim.gpu.quantize_kv_fp8
(one scale per kv head); its rows count K and V at one byte, are checked against float64 on the dequantized cache
(what the kernel computes on), report the quantization's error against the bf16 reference beside it
(``fp8_vs_bf16_err``), and compare their time with our bf16 row of the same layout (no torch decode path takes an
fp8 cache: the peers' columns are the bf16 peers'). Peers, on the contiguous cache in the same run: torch SDPA's
flash backend (q (B, H, 1, d), enable_gqa=True), the same backend on the folded form (the 8 query heads of a kv head as 8 query rows, what
FlashAttention-2 does inside for one token), cuDNN on the folded form, and with --flex torch.compile'd
flex_attention (enable_gqa=True); "torch best" is the fastest of those that ran.

Bandwidth = (K and V bytes + q bytes + o bytes) / time, as a % of the calibrated DRAM read bandwidth of the
profile of this GPU (iosim's h100-sxm5-80gb or h200-sxm-141gb calibration; --profile to choose). The split
kernel's fp32 partial outputs are not counted (overhead). Timing: CUDA events around each call on a busy stream
(benchmarks/cuda_events.py, BUSY: a ~10 ms spin is queued first, so intervals are GPU time), warm-up, the median
of --reps calls. Our calls run a plan made once per layout (checks and split choice off the timed path).
--check compares every row's output and lse (and SDPA flash's output) with a float64 reference computed on the
GPU before timing; a failed row is reported and the exit status is 1. A CSV of every row goes to
--out/decode-<device>.csv; a short table is printed last.
"""

from __future__ import annotations

import argparse
import math
import sys

from bench_csv import write_checked_rows  # beside this file
from cuda_events import time_ms  # beside this file

PROFILES = (("H100", "h100-sxm5-80gb"), ("H200", "h200-sxm-141gb"))
TOL = 1e-2  # bf16: relative Frobenius error against float64, as tests/gpu


def calibrated_read_bw(device: str, name: str | None) -> tuple[float, str]:
    """(bytes/s, the profile's name): the profile's measured DRAM read bandwidth, else its datasheet figure."""
    from iosim import get_profile

    if name is None:
        name = next((p for key, p in PROFILES if key in device), None)
    if name is None:
        return math.nan, "none"
    prof = get_profile(name)
    bw = prof.measured("dram.read")
    return (float(bw), f"{name} calibrated dram.read") if bw else (float(prof.dram.bandwidth.value), f"{name} datasheet")


def paged_copy(torch, k, v, page: int, seed: int):
    """(k_pages, v_pages, block_table): the contiguous (B, n, Hk, d) cache cut into pages of ``page`` tokens stored
    at the slots of a random permutation (a sequence's pages in any order)."""
    B, n, Hk, d = k.shape
    per_seq = n // page
    perm = torch.randperm(B * per_seq, generator=torch.Generator().manual_seed(seed)).to(k.device)
    pool_k, pool_v = torch.empty_like(k).view(-1, page, Hk, d), torch.empty_like(v).view(-1, page, Hk, d)
    pool_k[perm] = k.reshape(-1, page, Hk, d)  # logical page j of sequence b -> physical page perm[b * per_seq + j]
    pool_v[perm] = v.reshape(-1, page, Hk, d)
    return pool_k, pool_v, perm.view(B, per_seq).to(torch.int32)


def reference_f64(torch, q, k, v):
    """float64 O (B, 1, H, d) and lse (B, H, 1) on the GPU, one sequence at a time (every key visible)."""
    B, _, H, d = q.shape
    Hk = k.shape[2]
    o = torch.empty(q.shape, dtype=torch.float64, device=q.device)
    lse = torch.empty((B, H, 1), dtype=torch.float64, device=q.device)
    for b in range(B):
        qb = q[b, 0].double().view(Hk, H // Hk, d)  # query head h = kv head h // G, row h % G
        s = torch.einsum("kgd,nkd->kgn", qb, k[b].double()) / math.sqrt(d)
        lse[b, :, 0] = torch.logsumexp(s, dim=-1).reshape(H)
        o[b, 0] = torch.einsum("kgn,nkd->kgd", torch.softmax(s, dim=-1), v[b].double()).reshape(H, d)
    return o, lse


def rel(a, b) -> float:
    return float((a.double() - b).norm() / b.norm())


def torch_peers(torch, q, k, v, args) -> dict[str, tuple[float, object]]:
    """{peer: (ms, its output (B, 1, H, d))} of every torch decode path that runs on this GPU."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    B, _, H, d = q.shape
    Hk = k.shape[2]
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, H, 1, d), (B, Hk, n, d) views
    qf = q.view(B, Hk, H // Hk, d)  # folded: the G query heads of a kv head as G query rows (q_len = 1)
    peers = {
        "sdpa-flash": (SDPBackend.FLASH_ATTENTION, lambda: F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True),
                       lambda o: o.transpose(1, 2)),
        "sdpa-flash-folded": (SDPBackend.FLASH_ATTENTION, lambda: F.scaled_dot_product_attention(qf, kt, vt),
                              lambda o: o.reshape(B, 1, H, d)),
        "sdpa-cudnn-folded": (SDPBackend.CUDNN_ATTENTION, lambda: F.scaled_dot_product_attention(qf, kt, vt),
                              lambda o: o.reshape(B, 1, H, d)),
    }
    out = {}
    for name, (backend, fn, shape) in peers.items():
        try:
            with sdpa_kernel(backend):
                res = shape(fn())
                out[name] = (time_ms(fn, args.reps, args.warmup), res)
        except Exception as exc:  # a backend that does not take this case on this GPU
            print(f"  {name}: skipped ({type(exc).__name__}: {str(exc).splitlines()[0][:120]})", flush=True)
    if args.flex:
        try:
            from torch.nn.attention.flex_attention import flex_attention

            # one compile per shape: past dynamo's recompile limit (8) flex_attention would fall back to its unfused
            # form (the whole score matrix), which is not the peer to time
            cfg = torch._dynamo.config
            limit = "recompile_limit" if hasattr(cfg, "recompile_limit") else "cache_size_limit"  # its older name
            setattr(cfg, limit, max(getattr(cfg, limit), 64))
            flex = torch.compile(flex_attention, dynamic=False)
            fn = lambda: flex(qt, kt, vt, enable_gqa=True)  # noqa: E731
            res = fn().transpose(1, 2)
            out["flex"] = (time_ms(fn, args.reps, args.warmup), res)
        except Exception as exc:
            print(f"  flex: skipped ({type(exc).__name__}: {str(exc).splitlines()[0][:120]})", flush=True)
    return out


def run_ours(torch, gpu, q, k, v, page, args, seed, scales=None):
    """(ms, o, lse, plan) of our kernel on the contiguous cache (page None) or a paged copy of it; ``scales``: an
    fp8 cache's (k_scale, v_scale), k and v then its uint8 e4m3 bits."""
    B, n = k.shape[:2]
    lens = [n] * B
    if page is None:
        kc, vc, table = k, v, None
    else:
        kc, vc, table = paged_copy(torch, k, v, page, seed)
    if scales is not None:
        kc, vc = gpu.QuantizedKV(kc, scales[0]), gpu.QuantizedKV(vc, scales[1])
    plan = gpu.plan_decode(q, kc, vc, seqlens_k=lens, block_table=table, splits=args.splits)
    o = torch.empty_like(q)
    lse = torch.empty((B, q.shape[2], 1), dtype=torch.float32, device=q.device)
    plan.run(q, kc, vc, out=(o, lse))
    torch.cuda.synchronize()  # an asynchronous fault surfaces here, before the timing
    ms = time_ms(lambda: plan.run(q, kc, vc, out=(o, lse)), args.reps, args.warmup)
    return ms, o, lse, plan


def bench_shape(torch, gpu, n: int, B: int, args, bw: float) -> list[dict]:
    """Every row of one (n, batch): the peers once, then ours on each layout."""
    H, Hk, d = args.heads, args.kv_heads, args.d
    g = torch.Generator(device="cuda").manual_seed(n * 1000 + B)
    q = torch.randn(B, 1, H, d, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(B, n, Hk, d, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(B, n, Hk, d, device="cuda", dtype=torch.bfloat16, generator=g)
    nbytes = 2 * k.numel() * k.element_size() + 2 * q.numel() * q.element_size()  # K, V read; q read, o written
    ref = reference_f64(torch, q, k, v) if args.check else None
    peers = torch_peers(torch, q, k, v, args)
    best = min(peers.items(), key=lambda kv: kv[1][0]) if peers else (None, (math.nan, None))
    caches = {"bf16": (k, v, None, ref, nbytes)}
    if "fp8" in args.cache:
        kq, vq = gpu.quantize_kv_fp8(k), gpu.quantize_kv_fp8(v)
        deq = [x.values.float() * x.scale.view(1, 1, Hk, 1) for x in (kq, vq)]
        caches["fp8"] = (kq.values.view(torch.uint8), vq.values.view(torch.uint8), (kq.scale, vq.scale),
                         reference_f64(torch, q, *deq) if args.check else None,
                         2 * k.numel() + 2 * q.numel() * q.element_size())
        del deq
    rows, bf16_ms = [], {}
    for cache in args.cache:
        kc, vc, scales, cref, cbytes = caches[cache]
        for layout in args.pages:
            page = None if layout == "contig" else int(layout)
            if page is not None and n % page:
                print(f"  page {page}: skipped (n = {n} is not a whole number of pages)", flush=True)
                continue
            ms, o, lse, plan = run_ours(torch, gpu, q, kc, vc, page, args, seed=n + B, scales=scales)
            row = {"n": n, "batch": B, "heads": H, "kv_heads": Hk, "d": d, "cache": cache, "layout": layout,
                   "splits": plan.splits, "chunk": plan.split.chunk, "split_rule": plan.split_rule, "ours_ms": ms,
                   "GB_per_s": cbytes / (ms * 1e-3) / 1e9, "pct_of_dram": 100 * cbytes / (ms * 1e-3) / bw,
                   "torch_best": best[0], "torch_best_ms": best[1][0], "speedup_vs_torch_best": best[1][0] / ms}
            row.update({f"{name}_ms": t for name, (t, _) in peers.items()})
            if cache == "bf16":
                bf16_ms[layout] = ms
            elif layout in bf16_ms:
                row["speedup_vs_our_bf16"] = bf16_ms[layout] / ms
            if cref is not None:
                err = rel(o, cref[0])
                lerr = float((lse.double() - cref[1]).abs().max() / cref[1].abs().max().clamp(min=1))
                row.update(check_err=err, check_lse_err=lerr, check="ok" if err < TOL and lerr < TOL else "FAIL")
                if cache == "fp8":
                    row["fp8_vs_bf16_err"] = rel(o, ref[0])
                elif "sdpa-flash" in peers:
                    row["sdpa_flash_err"] = rel(peers["sdpa-flash"][1], ref[0])
            rows.append(row)
            print("  " + "  ".join(f"{k_}={v_:.4g}" if isinstance(v_, float) else f"{k_}={v_}"
                                   for k_, v_ in row.items()), flush=True)
            del o, lse, plan
            torch.cuda.empty_cache()
    return rows


def print_table(rows: list[dict], device: str, bw_name: str) -> None:
    print(f"\n{device}; bandwidth % of {bw_name}; median of CUDA-event times (busy stream)\n")
    print("| n | batch | cache | layout | splits | ours ms | GB/s | % DRAM | torch best | torch ms | ours / torch | "
          "paged / contig | fp8 / bf16 | check |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    contig = {(r["n"], r["batch"], r["cache"]): r["ours_ms"] for r in rows if r["layout"] == "contig"}
    for r in rows:
        c = contig.get((r["n"], r["batch"], r["cache"]))
        ratio = f"{r['ours_ms'] / c:.3f}" if c else "-"
        fp8 = f"{r['speedup_vs_our_bf16']:.2f}x" if "speedup_vs_our_bf16" in r else "-"
        print(f"| {r['n']} | {r['batch']} | {r['cache']} | {r['layout']} | {r['splits']} | {r['ours_ms']:.4f} | "
              f"{r['GB_per_s']:.0f} | {r['pct_of_dram']:.1f} | {r['torch_best']} | {r['torch_best_ms']:.4f} | "
              f"{r['speedup_vs_torch_best']:.2f}x | {ratio} | {fp8} | {r.get('check', '-')} |")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="directory for the CSV")
    ap.add_argument("--n", type=int, nargs="+", default=[8192, 16384, 32768], help="keys per sequence")
    ap.add_argument("--batch", type=int, nargs="+", default=[16, 32, 64])
    ap.add_argument("--pages", nargs="+", default=["contig", "16", "64", "256"], help="contig and/or page sizes")
    ap.add_argument("--cache", nargs="+", default=["bf16"], choices=["bf16", "fp8"],
                    help="the cache's dtype: bf16 and/or fp8 (e4m3, quantized per kv head)")
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--splits", type=int, default=None, help="force the split count (default: the heuristic)")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--check", action="store_true", help="compare each row with float64 before timing")
    ap.add_argument("--flex", action="store_true", help="also time torch.compile'd flex_attention")
    ap.add_argument("--profile", default=None, help="iosim profile for the bandwidth (default: by device name)")
    args = ap.parse_args(argv)
    for p in args.pages:
        if p != "contig" and not p.isdigit():
            ap.error(f"--pages {p!r}: expected 'contig' or a page size in tokens")
    import cupy as cp
    import torch

    from iosim import gpu

    device = torch.cuda.get_device_name()
    bw, bw_name = calibrated_read_bw(device, args.profile)
    print(f"device: {device}; torch {torch.__version__}; cupy {cp.__version__}; DRAM read {bw / 1e12:.3f} TB/s "
          f"({bw_name})", flush=True)
    rows = []
    for n in args.n:
        for B in args.batch:
            rows += bench_shape(torch, gpu, n, B, args, bw)
            torch.cuda.empty_cache()
    print_table(rows, device, bw_name)
    return write_checked_rows(rows, args.out, "decode", device)


if __name__ == "__main__":
    sys.exit(main())
