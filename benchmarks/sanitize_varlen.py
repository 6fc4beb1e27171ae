"""Small launches of flash_fwd.cu's varlen kernel (packed sequences, sliding windows), for compute-sanitizer:

    python3 benchmarks/sanitize_varlen.py                                    # once, to fill CuPy's kernel cache
    compute-sanitizer --tool memcheck  python3 benchmarks/sanitize_varlen.py
    compute-sanitizer --tool racecheck python3 benchmarks/sanitize_varlen.py
    compute-sanitizer --tool synccheck python3 benchmarks/sanitize_varlen.py
    compute-sanitizer --tool memcheck  python3 benchmarks/sanitize_varlen.py --paged  # the paged kernel alone

Every varlen instantiation (each tile of iosim.launch.varlen's lists, plain, causal and windowed, fp16 and bf16),
on packed sequences of lengths 0, 1, 37, 300 and 130 (keys 5, 1, 0, 333, 130: empty sequences, a sequence with keys
but no queries and the reverse, rows that see no key), grouped-query heads 4:1; windows (0, 0), (17, 0), (40, 9),
(0, None), and on the dense batch (null cu_seqlens) one window per tile; on a Hopper GPU also flash3_fwd.cu's windowed
instantiations (d 64, 128, 256) on the dense batch, the same windows, and its packed-sequence instantiations on the
same packed batch (plain, causal and the windows). The paged kernel (chunked prefill) on the same batch with its keys
in a paged cache of exactly the pages it needs (pages of 16 and 64 tokens in random order, ``gpu.paged_kv``), each
head dim, plain, causal and two windows. CuPy's memory pool is off, so every array is its own allocation and memcheck
sees a read past the end of q, k, v, cu_seqlens or the block table, or a write past o or lse.
"""

from __future__ import annotations

import sys

import numpy as np

LENS_Q = (0, 1, 37, 300, 130)
LENS_K = (5, 1, 0, 333, 130)
WINDOWS = ((0, 0), (17, 0), (40, 9), (0, None))


def packed(cp, rng, dtype, d: int):
    q = cp.asarray(rng.standard_normal((sum(LENS_Q), 8, d)).astype(np.float32)).astype(dtype)
    k = cp.asarray(rng.standard_normal((sum(LENS_K), 2, d)).astype(np.float32)).astype(dtype)
    v = cp.asarray(rng.standard_normal((sum(LENS_K), 2, d)).astype(np.float32)).astype(dtype)
    return q, k, v


def check(cp, o, lse, what) -> None:
    cp.cuda.runtime.deviceSynchronize()
    assert not bool(cp.isnan(o.astype(cp.float32)).any()), what
    assert not bool(cp.isnan(lse).any()), what


def main() -> int:
    import cupy as cp
    import ml_dtypes

    from iosim import gpu
    from iosim.launch import varlen as geo

    cp.cuda.set_allocator(None)  # one cudaMalloc per array: memcheck sees the end of each
    rng = np.random.default_rng(0)
    cu = [np.concatenate([[0], np.cumsum(lens)]).astype(np.int32) for lens in (LENS_Q, LENS_K)]
    batch = gpu.varlen_batch(*cu)
    n = 0
    paged_only = "--paged" in sys.argv[1:]
    for dtype in (np.dtype(ml_dtypes.bfloat16), np.dtype(np.float16)) if not paged_only else ():
        for local, table in ((False, geo.FLASH_VARLEN_TILES), (True, geo.FLASH_LOCAL_TILES)):
            for d, tiles in table.items():
                q, k, v = packed(cp, rng, dtype, d)
                for bq, bkv in tiles:
                    opts = gpu.AttentionOptions(block_q=bq, block_kv=bkv)
                    masks = [(c, w) for c in (False, True) for w in (WINDOWS if local else (None,))
                             if not (c and w is not None and w[1] != 0)]
                    for causal, window in masks:
                        o, lse = gpu.attention_varlen(q, k, v, batch, causal=causal, window=window, options=opts)
                        check(cp, o, lse, (d, bq, bkv, causal, window))
                        n += 1
                    if local:  # the dense batch with a window: the same kernel, null cu_seqlens
                        qd = cp.asarray(rng.standard_normal((2, 77, 4, d)).astype(np.float32)).astype(dtype)
                        kd = cp.asarray(rng.standard_normal((2, 90, 2, d)).astype(np.float32)).astype(dtype)
                        o, lse = gpu.attention(qd, kd, kd, return_lse=True, options=gpu.AttentionOptions(
                            block_q=bq, block_kv=bkv, window=(20, 3)))
                        check(cp, o, lse, (d, bq, bkv, "dense window"))
                        n += 1
    for dtype in (np.dtype(ml_dtypes.bfloat16), np.dtype(np.float16)):  # the paged kernel
        for d in geo.FLASH_PAGED_TILES:
            q, k, v = packed(cp, rng, dtype, d)
            for page in (16, 64):
                kc, vc, table = gpu.paged_kv(k, v, cu[1], page, seed=page)
                paged = gpu.varlen_batch(*cu, block_table=table, page_size=page)
                for causal, window in ((False, None), (True, None), (True, (17, 0)), (False, (40, 9))):
                    o, lse = gpu.attention_varlen(q, kc, vc, paged, causal=causal, window=window)
                    check(cp, o, lse, (d, "paged", page, causal, window))
                    n += 1
    if cp.cuda.Device().compute_capability == "90" and not paged_only:  # flash3's windows: dense batch, N != N_kv, 4:1 heads
        for dtype in (np.dtype(ml_dtypes.bfloat16), np.dtype(np.float16)):
            for d in (64, 128, 256):
                qd = cp.asarray(rng.standard_normal((2, 300, 8, d)).astype(np.float32)).astype(dtype)
                kd = cp.asarray(rng.standard_normal((2, 333, 2, d)).astype(np.float32)).astype(dtype)
                for window in WINDOWS:
                    o, lse = gpu.attention(qd, kd, kd, schedule="flash3", causal=window[1] == 0, return_lse=True,
                                           options=gpu.AttentionOptions(window=window))
                    check(cp, o, lse, (d, "flash3", window))
                    n += 1
                q, k, v = packed(cp, rng, dtype, d)  # flash3's packed sequences: plain, causal, windows
                for causal, window in ((False, None), (True, None), *((w[1] == 0, w) for w in WINDOWS)):
                    o, lse = gpu.attention_varlen(q, k, v, batch, causal=causal, window=window, schedule="flash3")
                    check(cp, o, lse, (d, "flash3 varlen", causal, window))
                    n += 1
    print(f"sanitize_varlen: {n} kernel launches, no NaN")
    return 0


if __name__ == "__main__":
    sys.exit(main())
