"""Small launches of every kernel kind, for compute-sanitizer (memcheck, racecheck):

    compute-sanitizer --tool memcheck   python3 benchmarks/sanitize_cases.py
    compute-sanitizer --tool racecheck  python3 benchmarks/sanitize_cases.py
    compute-sanitizer --tool synccheck  python3 benchmarks/sanitize_cases.py --schedule flash3   # Hopper only

Ragged tiles (N, N_kv not multiples of any tile), causal with N > N_kv and N < N_kv, grouped-query heads, every
flash2 tile of head dims 64 and 128 (and the default tile of 32 and 256), both dtypes, the naive path and the
flash2 backward (atomic and deterministic, every head dim); with
``--schedule flash3``, the same shapes through the flash3 kernel (every head dim it has) instead, and its backward
(kernels/flash3_bwd.cu, atomic and deterministic).
Run it once without the sanitizer first so CuPy's kernel cache holds the cubins (NVRTC under the sanitizer is slow).
"""

from __future__ import annotations

import sys


def flash3_cases(cp, rng, dtypes) -> int:
    """The ragged / causal / grouped-query shapes through schedule="flash3" (Hopper only)."""
    from iosim import gpu

    n = 0
    for dtype in dtypes:
        for d in gpu.FLASH3_TILES:
            for causal in (False, True):
                for N, Nk in ((130, 97), (37, 150), (200, 260)):
                    q = rng.standard_normal((1, N, 4, d), dtype=cp.float32).astype(dtype)
                    k = rng.standard_normal((1, Nk, 2, d), dtype=cp.float32).astype(dtype)
                    v = rng.standard_normal((1, Nk, 2, d), dtype=cp.float32).astype(dtype)
                    o, _ = gpu.attention(q, k, v, schedule="flash3", causal=causal, return_lse=True)
                    assert not bool(cp.isnan(o.astype(cp.float32)).any()), (d, causal, N, Nk)
                    n += 1
    return n


def flash3_backward_cases(cp, rng, dtypes) -> int:
    """The flash3 backward (kernels/flash3_bwd.cu, both modes) on ragged, causal both ways and grouped-query shapes,
    every head dim it has (Hopper only)."""
    from iosim import gpu, launch

    n = 0
    for dtype in dtypes:
        for d in launch.FLASH3_BWD_TILES:
            for causal in (False, True):
                for N, Nk in ((130, 97), (37, 150), (200, 260)):
                    q, do = (rng.standard_normal((1, N, 4, d), dtype=cp.float32).astype(dtype) for _ in range(2))
                    k, v = (rng.standard_normal((1, Nk, 2, d), dtype=cp.float32).astype(dtype) for _ in range(2))
                    o, lse = gpu.attention(q, k, v, causal=causal, return_lse=True, schedule="flash3")
                    for det in (False, True):
                        opts = gpu.BackwardOptions(schedule="flash3", deterministic=det)
                        grads = gpu.attention_backward(q, k, v, o, do, lse, causal=causal, options=opts)
                        assert not any(bool(cp.isnan(g.astype(cp.float32)).any()) for g in grads), (d, causal, N)
                        n += 1
    return n


def backward_cases(cp, rng, dtypes) -> int:
    """The backward kernels (both modes) on ragged, causal both ways and grouped-query shapes, every head dim."""
    from iosim import gpu

    n = 0
    for dtype in dtypes:
        for d in gpu.FLASH_BWD_TILES:
            for causal in (False, True):
                for N, Nk in ((130, 97), (37, 150)):
                    q, do = (rng.standard_normal((1, N, 4, d), dtype=cp.float32).astype(dtype) for _ in range(2))
                    k, v = (rng.standard_normal((1, Nk, 2, d), dtype=cp.float32).astype(dtype) for _ in range(2))
                    o, lse = gpu.attention(q, k, v, causal=causal, return_lse=True)
                    for det in (False, True):
                        grads = gpu.attention_backward(q, k, v, o, do, lse, causal=causal,
                                                       options=gpu.BackwardOptions(deterministic=det))
                        assert not any(bool(cp.isnan(g.astype(cp.float32)).any()) for g in grads), (d, causal, N)
                        n += 1
    return n


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--schedule", choices=["flash2", "flash3", "backward"], default="flash2",
                    help="flash2: flash2, naive and backward launches (default); flash3: the flash3 kernel's; "
                         "backward: the backward kernels' alone")
    args = ap.parse_args(argv)
    import cupy as cp
    import ml_dtypes  # CuPy 14's bfloat16 is ml_dtypes.bfloat16
    import numpy as np

    from iosim import gpu

    rng = cp.random.default_rng(0)
    if args.schedule == "flash3":
        dtypes = (np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16))
        n = flash3_cases(cp, rng, dtypes)
        nb = flash3_backward_cases(cp, rng, dtypes)
        cp.cuda.runtime.deviceSynchronize()
        print(f"sanitize_cases: {n} flash3 launches and {nb} flash3 backward calls ran")
        return 0
    dtypes = (np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16))
    if args.schedule == "backward":
        n = backward_cases(cp, rng, dtypes)
        cp.cuda.runtime.deviceSynchronize()
        print(f"sanitize_cases: {n} backward calls ran")
        return 0
    n = 0
    for dtype in dtypes:
        for d, tiles in gpu.FLASH_TILES.items():
            for bq, bkv in tiles if d in (64, 128) else tiles[:1]:
                for causal in (False, True):
                    for N, Nk in ((130, 97), (37, 150)):
                        q = rng.standard_normal((1, N, 4, d), dtype=cp.float32).astype(dtype)
                        k = rng.standard_normal((1, Nk, 2, d), dtype=cp.float32).astype(dtype)
                        v = rng.standard_normal((1, Nk, 2, d), dtype=cp.float32).astype(dtype)
                        o, _ = gpu.attention(q, k, v, causal=causal, return_lse=True,
                                             options=gpu.AttentionOptions(block_q=bq, block_kv=bkv))
                        assert not bool(cp.isnan(o.astype(cp.float32)).any()), (d, bq, bkv, causal, N, Nk)
                        n += 1
        for d in (64, 128):
            for causal in (False, True):
                q = rng.standard_normal((1, 70, 4, d), dtype=cp.float32).astype(dtype)
                k = rng.standard_normal((1, 45, 2, d), dtype=cp.float32).astype(dtype)
                o, _ = gpu.attention(q, k, k, causal=causal, schedule="naive", return_lse=True)
                assert not bool(cp.isnan(o.astype(cp.float32)).any())
                n += 1
    n += backward_cases(cp, rng, dtypes)
    cp.cuda.runtime.deviceSynchronize()
    print(f"sanitize_cases: {n} launches ran (backward included)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
