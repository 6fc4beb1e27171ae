"""Small launches of the fp8 forward (flash3_fwd.cu's e4m3 instantiations) and of its quantization kernel
(quantize_fp8.cu), for compute-sanitizer:

    python3 benchmarks/sanitize_fp8.py                                    # once, to fill CuPy's kernel cache
    compute-sanitizer --tool memcheck  python3 benchmarks/sanitize_fp8.py
    compute-sanitizer --tool racecheck python3 benchmarks/sanitize_fp8.py
    compute-sanitizer --tool synccheck python3 benchmarks/sanitize_fp8.py

Every fp8 instantiation (each head dim of iosim.launch.FLASH3_FP8_TILES, causal or not) on a ragged grouped-query
shape (N = 130, N_kv = 97 and N = 37, N_kv = 250: partial tiles, causal rows that see no key, keys past the last
tile padded in V^T), with and without incoherent processing, and every quantization instantiation (rows and V^T, fp16
and bf16, block and per-tensor scales). CuPy's memory pool is off, so every array is its own allocation and memcheck
sees a read past the end of a tensor, a scale array or the V^T padding, or a write past O or lse.
"""

from __future__ import annotations

import sys

import numpy as np

SHAPES = ((1, 130, 97, 4, 1), (2, 37, 250, 4, 2))  # (batch, seq_len, kv_len, heads, kv_heads)


def main() -> int:
    import cupy as cp
    import ml_dtypes

    from iosim import gpu, launch

    cp.cuda.set_allocator(None)  # one cudaMalloc per array: memcheck sees the end of each
    rng = np.random.default_rng(0)
    n = 0
    for d in launch.FLASH3_FP8_TILES:
        for dtype in (np.dtype(ml_dtypes.bfloat16), np.dtype(np.float16)):
            for B, N, Nk, H, Hk in SHAPES:
                q = cp.asarray(rng.standard_normal((B, N, H, d)).astype(np.float32)).astype(dtype)
                k = cp.asarray(rng.standard_normal((B, Nk, Hk, d)).astype(np.float32)).astype(dtype)
                v = cp.asarray(rng.standard_normal((B, Nk, Hk, d)).astype(np.float32)).astype(dtype)
                for causal in (False, True):
                    for kw in ({}, {"incoherent": 1}, {"per_tensor": True}):
                        o, lse = gpu.attention_fp8(q, k, v, causal=causal, return_lse=True, **kw)
                        cp.cuda.runtime.deviceSynchronize()
                        assert not bool(cp.isnan(o.astype(cp.float32)).any()), (d, N, causal, kw)
                        assert not bool(cp.isnan(lse).any()), (d, N, causal, kw)
                        n += 1
    print(f"sanitize_fp8: {n} fp8 calls (each 3 quantizations + 1 attention) ran")
    return 0


if __name__ == "__main__":
    sys.exit(main())
