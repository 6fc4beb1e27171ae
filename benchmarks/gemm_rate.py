"""Device side: the dense matmul rate of this GPU through cuBLAS (torch.matmul): the tensor-core roof code reaches,
beside the datasheet's peak (on our H200: 743 TFLOP/s fp16, 791 bf16 at N = 8192-16384, 2026-11-22).

    python3 benchmarks/gemm_rate.py [--n 8192 16384] [--reps 20]

For each dtype (fp16, bf16) and size n: C = A B with n x n x n operands (fp32 accumulation, cuBLAS's default for
these types), 2 n^3 FLOPs; the median of ``reps`` CUDA-event timings after 5 warm-up calls. A fresh random A, B per
size; C is checked against a float64 product of a few rows (a wrong GEMM has no rate). Prints one line per case and
the best rate per dtype last.
"""

from __future__ import annotations

import argparse

from iosim.measure.events import ISOLATED, time_ms, torch_clock


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, nargs="+", default=[8192, 16384])
    ap.add_argument("--reps", type=int, default=20)
    a = ap.parse_args()
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("gemm_rate: no CUDA device")
    best: dict[str, float] = {}
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    for name, dt in (("fp16", torch.float16), ("bf16", torch.bfloat16)):
        for n in a.n:
            g = torch.Generator(device="cuda").manual_seed(n)
            x = torch.randn(n, n, device="cuda", dtype=dt, generator=g)
            y = torch.randn(n, n, device="cuda", dtype=dt, generator=g)
            c = torch.full((n, n), float("nan"), device="cuda", dtype=dt)
            torch.matmul(x, y, out=c)
            rows = torch.tensor([0, n // 2, n - 1], device="cuda")
            ref = x[rows].double() @ y.double()
            err = ((c[rows].double() - ref).abs().max() / ref.abs().max()).item()
            if not err < {"fp16": 2e-3, "bf16": 2e-2}[name]:
                raise SystemExit(f"{name} n={n}: C differs from the float64 product by {err:.3g} (relative)")
            # the ISOLATED view: each call waits for the one before (as this script always timed a GEMM)
            t = time_ms(lambda x=x, y=y, c=c: torch.matmul(x, y, out=c), a.reps, 5, ISOLATED, torch_clock(torch)) / 1e3
            rate = 2 * n**3 / t / 1e12
            best[name] = max(best.get(name, 0.0), rate)
            print(f"{name} n={n}: {t * 1e3:.3f} ms median of {a.reps}, {rate:.1f} TFLOP/s (max error {err:.1e})")
            del x, y, c
            torch.cuda.empty_cache()
    print("best: " + ", ".join(f"{k} {v:.1f} TFLOP/s" for k, v in best.items()))


if __name__ == "__main__":
    main()
