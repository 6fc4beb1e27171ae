"""One launch of each kernel kind, for Nsight Compute (bank conflicts, DRAM bytes of materialized S and P):

    ncu --clock-control none -k regex:iosim --metrics ... python3 benchmarks/ncu_kernels.py

flash2 d=128 N=4096 (B=1, H=16, bf16, default tiles) and the naive path at N=2048 (B=1, H=16, d=64, bf16: S and
P are 16*2048^2*2 B = 134 MB each, over the 60 MB L2, so their DRAM writes are not hidden by dirty lines in L2).
Compilation happens before the profiled launches (a first unprofiled call of each configuration would also be
profiled, so kernels are compiled through a tiny problem of the same instantiation first).
"""

from __future__ import annotations

import sys


def main() -> int:
    import cupy as cp
    import ml_dtypes

    from iosim import gpu

    bf16 = ml_dtypes.bfloat16
    rng = cp.random.default_rng(0)

    def rand(*shape):
        return rng.standard_normal(shape, dtype=cp.float32).astype(bf16)

    cp.cuda.profiler.stop()  # compile outside the profiled range (ncu --profile-from-start off)
    tiny = rand(1, 8, 1, 128), rand(1, 8, 1, 64)
    gpu.attention(tiny[0], tiny[0], tiny[0])
    gpu.attention(tiny[1], tiny[1], tiny[1], schedule="naive")
    q = rand(1, 4096, 16, 128)
    qn = rand(1, 2048, 16, 64)
    cp.cuda.runtime.deviceSynchronize()
    cp.cuda.profiler.start()
    gpu.attention(q, q, q)
    print("flash2:", gpu.last_launch().launches)
    gpu.attention(qn, qn, qn, schedule="naive")
    print("naive:", gpu.last_launch().launches)
    cp.cuda.runtime.deviceSynchronize()
    cp.cuda.profiler.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
