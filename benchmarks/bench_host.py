"""Host time per call of iosim.gpu.attention beside torch SDPA's flash backend, on a problem so small that the GPU
waits for the host (issue 20: 2 x 256 tokens). Prints microseconds per call with torch tensors as inputs (torch
out), the ratio ours / torch's, and ours with CuPy arrays as inputs (the same memory, made once outside the loop).

    python benchmarks/bench_host.py [--calls 2000]        # needs a GPU, CuPy and torch
"""

from __future__ import annotations

import argparse
import statistics
import time


def per_call_us(fn, calls: int, sync) -> float:
    """Median over 5 rounds of (wall time of ``calls`` back-to-back calls, then one sync) / calls."""
    fn()
    sync()
    rounds = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        sync()
        rounds.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(rounds)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=2000)
    args = ap.parse_args()
    import cupy as cp
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from iosim import gpu

    print(f"device {torch.cuda.get_device_name()}, torch {torch.__version__}, CuPy {cp.__version__}")
    print(f"{'problem':<34}{'iosim us':>10}{'torch us':>10}{'ratio':>8}{'iosim, CuPy in':>16}")
    for schedule, (B, N, H, d) in (("flash2", (2, 256, 8, 64)), ("flash2", (2, 256, 16, 128)),
                                   ("flash3", (2, 256, 16, 128))):
        q, k, v = (torch.randn(B, N, H, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
        assert isinstance(gpu.attention(q, k, v, schedule=schedule), torch.Tensor)  # torch in, torch out
        ours = per_call_us(lambda q=q, k=k, v=v, s=schedule: gpu.attention(q, k, v, schedule=s), args.calls,
                           torch.cuda.synchronize)
        qc, kc, vc = (cp.from_dlpack(x) for x in (q, k, v))
        ours_cupy = per_call_us(lambda q=qc, k=kc, v=vc, s=schedule: gpu.attention(q, k, v, schedule=s),
                                args.calls, torch.cuda.synchronize)
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            theirs = per_call_us(lambda qt=qt, kt=kt, vt=vt: F.scaled_dot_product_attention(qt, kt, vt), args.calls,
                                 torch.cuda.synchronize)
        print(f"{schedule} B={B} N={N} H={H} d={d}".ljust(34) + f"{ours:>10.1f}{theirs:>10.1f}{ours / theirs:>8.2f}"
              f"{ours_cupy:>16.1f}", flush=True)


if __name__ == "__main__":
    main()
