"""Varlen prefill and sliding-window / document-mask attention: iosim's kernels against padding and FlexAttention.

    python benchmarks/bench_varlen.py --out DIR [--d 64 128] [--check] [--reps 30] [--parts padded flex paged]

(a) ``padded``: packed sequences through iosim.gpu.attention_varlen against the same batch padded to its longest
    sequence through iosim.gpu.attention (the dense kernel), causal and not. The padded call computes the padding too
    (and, non-causal, attends to padded keys: its values differ; it is timed, not checked). Issue 28's bar: varlen is
    never slower (padded ms / varlen ms >= 1). On a Hopper GPU each batch runs through flash2 and through flash3
    (the ``schedule`` column), varlen and padded through the same kernel design.
(b) ``flex``: sliding windows (causal, w = 256 .. 4096 keys, N = 8192) on the dense batch
    (``AttentionOptions(window=(w - 1, 0))``) and document masks (packed documents, causal within each: attention_varlen)
    against torch.compile'd ``torch.nn.attention.flex_attention`` with the same mask as a BlockMask
    (``create_block_mask``, built once, off the timed path). Issue 28's bar: ours >= 1.0x FlexAttention. A window
    row's ours is the flash3 kernel on a Hopper GPU (``schedule`` column; flash2's time beside it in ``flash2_ms``),
    flash2 elsewhere; documents likewise (attention_varlen's flash3 or flash2).
(c) ``paged``: chunked prefill, a chunk of new tokens per sequence against its KV cache (bottom-right causal), with
    the cache paged (pages of 16, 64 or 256 tokens in random order: gpu.varlen_batch(..., block_table=...)) against
    the same keys packed contiguously, both through flash2's varlen kernel at the paged kernel's tiles. Issue 28's bar
    for a paged cache: within 10% of the contiguous cache at page size 16, within 3% at 64 and up (contiguous ms /
    paged ms >= 0.90, >= 0.97). The contiguous call is timed before and after the paged one; its mean is the peer.
    Beside it, FlexAttention on the same pages through torch's paged-attention utility
    (``torch.nn.attention.experimental._paged_attention.PagedAttention``: the cache as (1, kv_heads, pages x
    page_size, d), a logical BlockMask of KV blocks of one page converted to the pages), the chunks padded to the
    longest as its batch (``flex_paged_ms``, ``paged_over_flex``), with its own kernel options, or where it refuses
    them (its KV block must be a page, and a page smaller than its kernel's block is refused) with its kernel's KV block
    set to one page (``flex_paged_options``); where neither runs the row says why (``flex_paged_error``).

bf16, heads = 2048 / d (grouped-query 4:1 with --gqa), the same inputs for every backend. ``--check`` compares every
row's output (ours and FlexAttention's) with a float64 reference on the GPU before timing; a failed row is reported and
the exit status is 1. Timing: CUDA events on a busy stream (benchmarks/cuda_events.py), warm-up, the median of --reps.
TFLOP/s count the FLOPs of the visible (query, key) pairs only: 4 d per pair (the field's convention). A CSV of every
row goes to --out/varlen-<device>.csv; a table is printed last.
"""

from __future__ import annotations

import argparse
import math
import sys

import numpy as np
from bench_csv import write_checked_rows  # beside this file
from cuda_events import time_ms  # beside this file

TOL = 1e-2  # bf16: relative Frobenius error against float64, as tests/gpu
# (name, query lengths): a long sequence among short ones, lengths drawn uniformly, equal lengths (no padding at all)
PADDED_BATCHES = {
    "skewed": [8192] + [512] * 14 + [64],
    "uniform": [int(x) for x in np.random.default_rng(28).integers(1, 4097, 16)],
    "equal": [4096] * 4,
}
WINDOWS = (256, 1024, 4096)
DOC_TOKENS = 16384
# chunked prefill: (new tokens, cached keys including them) per sequence
PAGED_BATCH = {"chunks": [512, 1024, 2048, 256], "cache": [4096, 8192, 16384, 2304]}
PAGE_SIZES = (16, 64, 256)


def visible_pairs(lens, causal: bool, window: int | None = None) -> int:
    """(query, key) pairs that are computed for real: each sequence's, self-attention, bottom-right causal."""
    total = 0
    for n in lens:
        if window is not None:
            w = min(window, n)
            total += w * (w + 1) // 2 + (n - w) * w  # rows 0 .. w-1 see i + 1 keys, the rest w
        else:
            total += n * (n + 1) // 2 if causal else n * n
    return total


def reference(torch, q, k, v, lens, causal: bool, window: int | None):
    """float64 O of packed (total, H, d) q, k, v, sequence by sequence (self-attention, the same lengths for q, k)."""
    H, Hk = q.shape[1], k.shape[1]
    out = torch.empty(q.shape, dtype=torch.float64, device=q.device)
    start = 0
    for n in lens:
        s = slice(start, start + n)
        qs = q[s].double().transpose(0, 1)
        ks, vs = (x[s].double().transpose(0, 1).repeat_interleave(H // Hk, 0) for x in (k, v))
        i, j = torch.arange(n, device=q.device)[:, None], torch.arange(n, device=q.device)[None, :]
        ok = (j <= i) if causal else torch.ones(n, n, dtype=torch.bool, device=q.device)
        if window is not None:
            ok &= j > i - window
        for h in range(0, H, 4):  # four heads at a time: n = 8192 is 2 GB of float64 scores a head
            hs = slice(h, h + 4)
            att = (qs[hs] @ ks[hs].transpose(1, 2) / math.sqrt(q.shape[2])).masked_fill(~ok, float("-inf"))
            out[s, hs] = (att.softmax(-1) @ vs[hs]).transpose(0, 1)
        start += n
    return out


def rel(a, b) -> float:
    return float((a.double() - b).norm() / b.norm())


def packed_inputs(torch, lens, H: int, Hk: int, d: int, seed: int):
    g = torch.Generator(device="cuda").manual_seed(seed)
    T = sum(lens)
    q = torch.randn(T, H, d, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(T, Hk, d, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(T, Hk, d, device="cuda", dtype=torch.bfloat16, generator=g)
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    return q, k, v, cu


def hopper(torch) -> bool:
    return torch.cuda.get_device_capability() == (9, 0)


def padded_row(torch, gpu, name: str, d: int, causal: bool, schedule: str, args) -> dict:
    """(a): one batch, varlen against padded, both through ``schedule``'s kernels."""
    lens = PADDED_BATCHES[name]
    H = 2048 // d
    Hk = H // 4 if args.gqa else H
    q, k, v, cu = packed_inputs(torch, lens, H, Hk, d, seed=d + len(lens))
    batch = gpu.varlen_batch(cu, cu)
    B, N = len(lens), max(lens)
    qp, kp, vp = (torch.zeros(B, N, x.shape[1], d, device="cuda", dtype=x.dtype) for x in (q, k, v))
    for b, n in enumerate(lens):  # each sequence at the start of its row, zeros after it
        for src, dst in ((q, qp), (k, kp), (v, vp)):
            dst[b, :n] = src[int(cu[b]):int(cu[b + 1])]
    row = {"part": "padded", "case": name, "d": d, "causal": causal, "heads": H, "kv_heads": Hk, "batch": B,
           "tokens": sum(lens), "padded_tokens": B * N, "schedule": schedule}
    ours = lambda: gpu.attention_varlen(q, k, v, batch, causal=causal, schedule=schedule).o  # noqa: E731
    if args.check:
        err = rel(ours(), reference(torch, q, k, v, lens, causal, None))
        row.update(check_err=err, check="ok" if err < TOL else "FAIL")
    row["ours_ms"] = time_ms(ours, args.reps, args.warmup)
    row["padded_ms"] = time_ms(lambda: gpu.attention(qp, kp, vp, causal=causal, schedule=schedule), args.reps,
                               args.warmup)
    flops = 4 * d * H * visible_pairs(lens, causal)
    row.update(ours_tflops=flops / row["ours_ms"] / 1e9, padded_over_ours=row["padded_ms"] / row["ours_ms"])
    return row


def paged_row(torch, gpu, page_size: int, d: int, args) -> dict:
    """(c): chunked prefill on a paged cache against the same keys contiguous, one kernel design and tile."""
    from iosim.launch import varlen as geo

    chunks, cache = PAGED_BATCH["chunks"], PAGED_BATCH["cache"]
    H = 2048 // d
    Hk = H // 4 if args.gqa else H
    q, _, _, cu_q = packed_inputs(torch, chunks, H, Hk, d, seed=d)
    _, k, v, cu_k = packed_inputs(torch, cache, H, Hk, d, seed=d + 1)
    kc, vc, table = gpu.paged_kv(k, v, cu_k, page_size, seed=page_size)  # pages in random order
    flat = gpu.varlen_batch(cu_q, cu_k)
    paged = gpu.varlen_batch(cu_q, cu_k, block_table=table, page_size=page_size)
    bq, bkv = geo.FLASH_PAGED_TILES[d]
    opts = gpu.AttentionOptions(block_q=bq, block_kv=bkv)
    row = {"part": "paged", "case": f"page {page_size}", "d": d, "causal": True, "heads": H, "kv_heads": Hk,
           "batch": len(chunks), "tokens": sum(chunks), "padded_tokens": sum(cache), "schedule": "flash2"}
    ours = lambda: gpu.attention_varlen(q, kc, vc, paged, causal=True).o  # noqa: E731
    contiguous = lambda: gpu.attention_varlen(q, k, v, flat, causal=True, options=opts).o  # noqa: E731
    if args.check:
        err = rel(ours(), reference_chunked(torch, q, k, v, chunks, cache))
        row.update(check_err=err, check="ok" if err < TOL else "FAIL")
    before = time_ms(contiguous, args.reps, args.warmup)
    row["ours_ms"] = time_ms(ours, args.reps, args.warmup)
    after = time_ms(contiguous, args.reps, args.warmup)
    row.update(contiguous_ms=(before + after) / 2, contiguous_spread=abs(before - after) / min(before, after))
    flops = 4 * d * H * sum(n * (nk - n) + n * (n + 1) // 2 for n, nk in zip(chunks, cache, strict=True))
    row.update(ours_tflops=flops / row["ours_ms"] / 1e9, contiguous_over_ours=row["contiguous_ms"] / row["ours_ms"])
    qb = torch.zeros(len(chunks), H, max(chunks), d, device="cuda", dtype=q.dtype)
    for b, n in enumerate(chunks):  # chunk b at the start of row b, zeros after it (rows the mask leaves out)
        qb[b, :, :n] = q[int(cu_q[b]):int(cu_q[b]) + n].transpose(0, 1)
    refusals = []
    for options in (None, {"BLOCK_N": page_size}):  # its own tiles; else a KV block of one page, as it requires
        try:
            row.update(flex_paged_times(torch, args, (q, k, v, qb), (chunks, cache), page_size, options))
            row["paged_over_flex"] = row["flex_paged_ms"] / row["ours_ms"]
            if row.get("flex_paged_err", 0.0) >= TOL:
                row["check"] = "FAIL"
            break
        except Exception as e:  # the peer's own refusal, reported in the row and the table
            refusals.append(f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}")
    else:
        row["flex_paged_error"] = " / ".join(refusals)
    return row


def flex_paged_times(torch, args, tensors, lens, page_size: int, options: dict | None) -> dict:
    """FlexAttention's paged call (:func:`flex_paged_fn`) checked against float64 where asked, then timed;
    ``tensors``: packed q, k, v and q as its batch (B, H, max chunk, d); ``lens``: (chunks, cache)."""
    q, k, v, qb = tensors
    chunks, cache = lens
    flex = flex_paged_fn(torch, k, v, chunks, cache, page_size, options)
    out = {}
    if args.check:
        packed = torch.cat([flex(qb)[b, :, :n].transpose(0, 1) for b, n in enumerate(chunks)])
        out["flex_paged_err"] = rel(packed, reference_chunked(torch, q, k, v, chunks, cache))
    out["flex_paged_ms"] = time_ms(lambda: flex(qb), args.reps, args.warmup)
    out["flex_paged_options"] = "its own" if options is None else f"BLOCK_N={page_size}"
    return out


def flex_paged_fn(torch, k, v, chunks, cache, page_size: int, options: dict | None = None):
    """FlexAttention on a paged cache through torch's PagedAttention utility, compiled, its converted BlockMask built
    once: a function of q (B, H, max chunk, d), chunk b against the first cache[b] keys of sequence b (packed k, v),
    bottom-right causal; ``options``: its kernel_options (None: its own)."""
    from torch.nn.attention.experimental._paged_attention import PagedAttention
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    B, Hk, d = len(chunks), k.shape[1], k.shape[2]
    pages = [-(-n // page_size) for n in cache]
    pa = PagedAttention(n_pages=sum(pages), page_size=page_size, max_batch_size=B, device="cuda")
    k_cache = torch.zeros(1, Hk, sum(pages) * page_size, d, device="cuda", dtype=k.dtype)
    v_cache = torch.zeros_like(k_cache)
    k0 = 0
    for b, n in enumerate(cache):
        idx = torch.tensor([b], device="cuda")
        pa.reserve(idx, torch.tensor(n, device="cuda"))
        pos = torch.arange(n, device="cuda")[None]
        pa.assign(idx, pos, k[k0:k0 + n].transpose(0, 1)[None], v[k0:k0 + n].transpose(0, 1)[None], k_cache, v_cache)
        k0 += n
    n_q = torch.tensor(chunks, device="cuda")
    offset = torch.tensor(cache, device="cuda") - n_q
    logical = create_block_mask(lambda b, h, i, j: (i < n_q[b]) & (j <= i + offset[b]), B=B, H=None,
                                Q_LEN=max(chunks), KV_LEN=max(cache), device="cuda", BLOCK_SIZE=(128, page_size))
    mask = pa.convert_logical_block_mask(logical, kv_len=torch.tensor(cache, device="cuda"))
    flex = fresh_compile(torch, flex_attention)
    return lambda qb: flex(qb, k_cache, v_cache, block_mask=mask, enable_gqa=qb.shape[1] != Hk, kernel_options=options)


def reference_chunked(torch, q, k, v, chunks, cache):
    """float64 O of each chunk against its cache (bottom-right causal), packed like q."""
    H, Hk = q.shape[1], k.shape[1]
    out = torch.empty(q.shape, dtype=torch.float64, device=q.device)
    q0 = k0 = 0
    for n, nk in zip(chunks, cache, strict=True):
        qs = q[q0:q0 + n].double().transpose(0, 1)
        ks = k[k0:k0 + nk].double().repeat_interleave(H // Hk, dim=1).transpose(0, 1)
        vs = v[k0:k0 + nk].double().repeat_interleave(H // Hk, dim=1).transpose(0, 1)
        s = qs @ ks.transpose(1, 2) / math.sqrt(q.shape[2])
        keep = torch.arange(nk, device=q.device)[None, :] <= torch.arange(n, device=q.device)[:, None] + (nk - n)
        out[q0:q0 + n] = (s.masked_fill(~keep, -math.inf).softmax(-1) @ vs).transpose(0, 1)
        q0, k0 = q0 + n, k0 + nk
    return out


def fresh_compile(torch, fn):
    """``torch.compile(fn)`` with dynamo's caches emptied first: every row compiles FlexAttention for its own masks
    and shapes, and past dynamo's recompile limit (8) a compiled function runs eagerly instead, 80-200x slower (a full
    run of this benchmark timed the paged rows' FlexAttention so, 2026-11-28)."""
    torch._dynamo.reset()
    return torch.compile(fn, dynamic=False)


def flex_fn(torch, mask_mod, B: int, H: int, T: int):
    """FlexAttention compiled, with its BlockMask for ``mask_mod`` built once: a function of (q, k, v) in
    (B, H, T, d)."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    block_mask = create_block_mask(mask_mod, B=None, H=None, Q_LEN=T, KV_LEN=T, device="cuda")
    flex = fresh_compile(torch, flex_attention)
    return lambda q, k, v: flex(q, k, v, block_mask=block_mask, enable_gqa=q.shape[1] != k.shape[1])


def flex_row(torch, gpu, kind: str, size: int, d: int, args) -> dict:
    """(b): a causal sliding window of ``size`` keys on the dense batch (N = 8192), or documents of ``size`` tokens
    on average packed into one sequence of DOC_TOKENS, causal within each."""
    H = 2048 // d
    Hk = H // 4 if args.gqa else H
    if kind == "window":
        lens = [8192] * 2
        window = size
    else:
        rng = np.random.default_rng(size)
        cuts = np.sort(rng.choice(np.arange(1, DOC_TOKENS), DOC_TOKENS // size - 1, replace=False))
        lens, window = [int(x) for x in np.diff(np.concatenate([[0], cuts, [DOC_TOKENS]]))], None
    q, k, v, cu = packed_inputs(torch, lens, H, Hk, d, seed=size + d)
    if kind == "window":
        B, N = len(lens), lens[0]
        qd, kd, vd = (x.view(B, N, x.shape[1], d) for x in (q, k, v))
        opts = gpu.AttentionOptions(window=(size - 1, 0))
        schedule = "flash3" if hopper(torch) else "flash2"
        ours = lambda: gpu.attention(  # noqa: E731
            qd, kd, vd, schedule=schedule, causal=True, options=opts).view(q.shape)
        ours2 = lambda: gpu.attention(qd, kd, vd, causal=True, options=opts).view(q.shape)  # noqa: E731
        fn = flex_fn(torch, lambda b, h, i, j: (j <= i) & (i - j < size), None, H, N)
        qt, kt, vt = (x.transpose(1, 2) for x in (qd, kd, vd))  # (B, H, N, d) views
        flex = lambda: fn(qt, kt, vt).transpose(1, 2).reshape(q.shape)  # noqa: E731
    else:
        schedule = "flash3" if hopper(torch) else "flash2"
        batch = gpu.varlen_batch(cu, cu)
        ours = lambda: gpu.attention_varlen(q, k, v, batch, causal=True, schedule=schedule).o  # noqa: E731
        ours2 = lambda: gpu.attention_varlen(q, k, v, batch, causal=True).o  # noqa: E731
        doc = torch.repeat_interleave(torch.arange(len(lens), device="cuda"), torch.tensor(lens, device="cuda"))
        fn = flex_fn(torch, lambda b, h, i, j: (doc[i] == doc[j]) & (j <= i), None, H, DOC_TOKENS)
        qt, kt, vt = (x.transpose(0, 1)[None] for x in (q, k, v))  # (1, H, T, d) views
        flex = lambda: fn(qt, kt, vt)[0].transpose(0, 1)  # noqa: E731
    row = {"part": "flex", "case": f"{kind}-{size}", "d": d, "causal": True, "heads": H, "kv_heads": Hk,
           "batch": len(lens), "tokens": sum(lens), "schedule": schedule}
    second = ours2 if schedule != "flash2" else None
    if args.check:
        ref = reference(torch, q, k, v, lens, True, window)
        err, ferr = rel(ours(), ref), rel(flex(), ref)
        err2 = rel(second(), ref) if second is not None else 0.0
        row.update(check_err=max(err, err2), flex_err=ferr,
                   check="ok" if max(err, err2) < TOL and ferr < TOL else "FAIL")
    row["ours_ms"] = time_ms(ours, args.reps, args.warmup)
    row["flex_ms"] = time_ms(flex, args.reps, args.warmup)
    if second is not None:
        row["flash2_ms"] = time_ms(second, args.reps, args.warmup)
    flops = 4 * d * H * visible_pairs(lens, True, window)
    row.update(ours_tflops=flops / row["ours_ms"] / 1e9, flex_tflops=flops / row["flex_ms"] / 1e9,
               ours_over_flex=row["flex_ms"] / row["ours_ms"])
    return row


def print_table(rows: list[dict], device: str) -> None:
    print(f"\n{device}; bf16; median of CUDA-event times (busy stream); TFLOP/s of the visible pairs\n")
    print("| part | case | d | causal | ours | ours ms | peer ms | ours TFLOP/s | peer / ours | check |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        peer, ratio = {"padded": ("padded_ms", "padded_over_ours"), "paged": ("contiguous_ms", "contiguous_over_ours")
                       }.get(r["part"], ("flex_ms", "ours_over_flex"))
        print(f"| {r['part']} | {r['case']} | {r['d']} | {r['causal']} | {r['schedule']} | {r['ours_ms']:.4f} | "
              f"{r[peer]:.4f} | {r['ours_tflops']:.1f} | {r[ratio]:.2f}x | {r.get('check', '-')} |")
        if r["part"] == "paged":  # the second peer: FlexAttention on the same pages
            flex = (f"{r['flex_paged_ms']:.4f} | | {r['paged_over_flex']:.2f}x" if "flex_paged_ms" in r
                    else f"did not run: {r.get('flex_paged_error', '?')} | | -")
            how = f" ({r['flex_paged_options']})" if "flex_paged_options" in r else ""
            print(f"| paged, FlexAttention{how} | {r['case']} | {r['d']} | True | flex | | {flex} | |")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="directory for the CSV")
    ap.add_argument("--d", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--parts", nargs="+", default=["padded", "flex", "paged"], choices=["padded", "flex", "paged"])
    ap.add_argument("--gqa", action="store_true", help="4 query heads per kv head (default: as many kv heads)")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--check", action="store_true", help="compare each row with float64 before timing")
    args = ap.parse_args(argv)
    import cupy as cp
    import torch

    from iosim import gpu

    device = torch.cuda.get_device_name()
    print(f"device: {device}; torch {torch.__version__}; cupy {cp.__version__}", flush=True)
    rows = []
    schedules = ("flash2", "flash3") if hopper(torch) else ("flash2",)
    runs = [(padded_row, (name, d, causal, sched)) for d in args.d if "padded" in args.parts for name in PADDED_BATCHES
            for causal in (False, True) for sched in schedules]
    runs += [(flex_row, (kind, size, d)) for d in args.d if "flex" in args.parts
             for kind, sizes in (("window", WINDOWS), ("documents", (512, 2048))) for size in sizes]
    runs += [(paged_row, (page, d)) for d in args.d if "paged" in args.parts for page in PAGE_SIZES]
    for fn, what in runs:
        rows.append(fn(torch, gpu, *what, args))
        print("  " + "  ".join(f"{k_}={v_:.4g}" if isinstance(v_, float) else f"{k_}={v_}"
                               for k_, v_ in rows[-1].items()), flush=True)
        torch.cuda.empty_cache()
    print_table(rows, device)
    return write_checked_rows(rows, args.out, "varlen", device)


if __name__ == "__main__":
    sys.exit(main())
