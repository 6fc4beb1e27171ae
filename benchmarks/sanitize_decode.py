"""Small launches of the Flash-Decoding kernels (kernels/flash_decode.cu), for compute-sanitizer:

    python3 benchmarks/sanitize_decode.py                                    # once, to fill CuPy's kernel cache
    compute-sanitizer --tool memcheck  python3 benchmarks/sanitize_decode.py
    compute-sanitizer --tool racecheck python3 benchmarks/sanitize_decode.py
    compute-sanitizer --tool synccheck python3 benchmarks/sanitize_decode.py
    ... python3 benchmarks/sanitize_decode.py --fp8                          # the same calls on an fp8 cache

Every head dim, a contiguous cache and pages of 16 and 64 tokens (shuffled), one token with GQA 8:1 (8 rows),
16 tokens with GQA 8:1 (128 rows: 4 row blocks of 2 stripes; 8 of 1 at d = 256) and 4 tokens without GQA, ragged
lengths 0, 1, 37, 300 and 1000, the heuristic's splits and one split, bf16 (and fp16 at d = 128). CuPy's memory
pool is off, so every array is its own allocation and memcheck sees a read past the end of a cache, a page pool
or a block table; the pools hold exactly the pages the sequences use. ``--fp8``: every cache is e4m3 bits (random
bytes below 0x7f, e4m3's NaN) with random scales per kv head, the fp8 instantiations' path.
"""

from __future__ import annotations

import sys

import numpy as np

LENS = (0, 1, 37, 300, 1000)


def case(cp, rng, dtype, d: int, layout: str, q_len: int, heads: int, kv_heads: int, fp8: bool = False):
    """(q, k_cache, v_cache, seqlens_k, block_table) on the device; ``fp8``: the cache as e4m3 bits."""
    B = len(LENS)
    q = cp.asarray(rng.standard_normal((B, q_len, heads, d)).astype(np.float32)).astype(dtype)

    def cache(shape):
        if fp8:  # signs and magnitudes below 448 (0x7e): no NaN byte
            return cp.asarray(rng.integers(0, 0x7F, shape, dtype=np.uint8) | (rng.integers(0, 2, shape) << 7)
                              .astype(np.uint8))
        return cp.asarray(rng.standard_normal(shape).astype(np.float32)).astype(dtype)

    if layout == "contig":
        k = cache((B, max(LENS), kv_heads, d))
        return q, k, k.copy(), np.array(LENS, np.int32), None
    page = int(layout)
    used = [-(-n // page) for n in LENS]
    table = np.full((B, max(used)), -1, np.int32)
    order = rng.permutation(sum(used))
    table[np.arange(max(used))[None, :] < np.array(used)[:, None]] = order
    k = cache((sum(used), page, kv_heads, d))
    return q, k, k.copy(), np.array(LENS, np.int32), cp.asarray(table)


def main() -> int:
    import cupy as cp
    import ml_dtypes

    from iosim import gpu

    fp8 = "--fp8" in sys.argv[1:]
    cp.cuda.set_allocator(None)  # one cudaMalloc per array: memcheck sees the end of each
    rng = np.random.default_rng(0)
    n = 0
    shapes = ((1, 32, 4), (16, 32, 4), (4, 4, 4))  # (q_len, heads, kv_heads)
    for d in (64, 128, 256):
        dtypes = (np.dtype(ml_dtypes.bfloat16), np.dtype(np.float16)) if d == 128 else (np.dtype(ml_dtypes.bfloat16),)
        for dtype in dtypes:
            for layout in ("contig", "16", "64"):
                for q_len, heads, kv_heads in shapes:
                    q, k, v, lens, table = case(cp, rng, dtype, d, layout, q_len, heads, kv_heads, fp8)
                    if fp8:  # random scales per kv head
                        k, v = (gpu.QuantizedKV(x, rng.uniform(1e-3, 1e-2, kv_heads)) for x in (k, v))
                    for splits in (None, 1):
                        o, lse = gpu.decode(q, k, v, seqlens_k=lens, block_table=table, splits=splits)
                        cp.cuda.runtime.deviceSynchronize()
                        assert not bool(cp.isnan(o.astype(cp.float32)).any()), (d, layout, q_len, splits)
                        assert not bool(cp.isnan(lse).any()), (d, layout, q_len, splits)
                        n += 1
    print(f"sanitize_decode: {n} decode calls ran{' on fp8 caches' if fp8 else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
