"""FP8 attention's accuracy measured the paper's way (FlashAttention-3, arXiv 2407.08608, §4.3 and Table 3; issue 27).

    python benchmarks/bench_fp8_accuracy.py [--seeds 0 1 2 3 4] [--seq-len 4096] [--head-dim 128] [--heads 1]
                                            [--causal] [--gpu] [--json PATH] [--check]

Inputs: Q, K, V (1, N, heads, d) with entries N(0, 1), 0.1 % of them N(0, 10²) (the paper's "outliers"), one draw per
seed. Each row is the RMSE of O over all its elements against softmax(Q Kᵀ/√d) V in float64 on the same unquantized
inputs (iosim.numeric.reference). Rows, each for the FP8 modes of iosim.numeric.fp8.MODES:

* ``per-tensor``: one scale per tensor, the paper's FP8 baseline;
* ``block``: one scale per tile of rows (Q: 128, K and V: block_kv of iosim.launch.FLASH3_FP8_TILES), no rotation;
* ``per-tensor+incoherent``: incoherent processing without block quantization (the paper's ablation);
* ``block+incoherent``: both, FlashAttention-3's FP8;
* ``bf16``: inputs rounded to bf16, softmax exact, O rounded to bf16 (emulated), or the flash3 bf16 kernel (gpu).

Sources: ``emulated`` (iosim.numeric.fp8, NumPy, runs anywhere) and, with ``--gpu``, ``gpu`` (iosim's kernels through
iosim.gpu.quantize_fp8 and iosim.gpu.attention(schedule="flash3"); needs CuPy, torch and a Hopper GPU).
``--json PATH`` writes every row (source, mode, seed, d, N, rmse). ``--check`` exits 1, saying why, where on any seed
and source block+incoherent is not below per-tensor, or its RMSE exceeds the paper's 9.1e-3 (issue 27's bar).
"""

from __future__ import annotations

import argparse
import datetime
import json
import shlex
import sys
import time

import numpy as np

from iosim import AttentionProblem
from iosim.launch.forward import FLASH3_FP8_TILES
from iosim.numeric import reference, round_to_dtype
from iosim.numeric.fp8 import MODES, fp8_attention, outlier_inputs, rmse

# FlashAttention-3's Table 3 and its ablation (N = 4096, d = 128): RMSE of O
PAPER = {"per-tensor": 2.4e-2, "block": 2.4e-2, "per-tensor+incoherent": 9.3e-3, "block+incoherent": 9.1e-3}
BAR = 9.1e-3  # issue 27: block+incoherent at most the paper's FA3 FP8 figure
ROWS = ("bf16", "per-tensor", "block", "per-tensor+incoherent", "block+incoherent")


def draw(seed: int, shape) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """Q, K, V of ``shape`` from ``default_rng(seed)``, and the seed of incoherent processing's signs (drawn after)."""
    rng = np.random.default_rng(seed)
    q, k, v = (outlier_inputs(shape, rng) for _ in range(3))
    return q, k, v, int(rng.integers(2**32))


def exact(q, k, v, causal: bool, dtype: str = "fp32") -> np.ndarray:
    """float64 softmax attention of the ``dtype``-rounded inputs, head by head (an N x N float64 matrix at a time)."""
    n, heads, d = q.shape[1], q.shape[2], q.shape[3]
    p = AttentionProblem(seq_len=n, head_dim=d, dtype=dtype, causal=causal)
    return np.concatenate([reference(p, q[:, :, [h]], k[:, :, [h]], v[:, :, [h]]) for h in range(heads)], axis=2)


def emulated(q, k, v, causal: bool, rotation: int) -> dict[str, np.ndarray]:
    """O of every row, from iosim.numeric (CPU)."""
    block_q, block_kv = FLASH3_FP8_TILES[q.shape[-1]]
    out = {"bf16": round_to_dtype(exact(q, k, v, causal, "bf16"), "bf16")}
    for mode in MODES:
        out[mode] = fp8_attention(q, k, v, causal=causal, block_q=block_q, block_kv=block_kv, mode=mode,
                                  seed=rotation)
    return out


def on_gpu(q, k, v, causal: bool, rotation: int) -> dict[str, np.ndarray]:
    """O of every row from iosim's flash3 kernels, on the inputs rounded to bf16 (what quantize_fp8 reads; bf16's
    rounding is the bf16 row's error, about a tenth of fp8's). Per-tensor modes quantize with ``per_tensor=True``;
    the random signs for ``incoherent=rotation`` are iosim.gpu.fp8.rotation_signs' (the RMSE does not depend on
    which)."""
    import torch

    from iosim import gpu

    block_q, block_kv = FLASH3_FP8_TILES[q.shape[-1]]
    qt, kt, vt = (torch.from_numpy(a).cuda().to(torch.bfloat16).contiguous() for a in (q, k, v))
    out = {"bf16": gpu.attention(qt, kt, vt, schedule="flash3", causal=causal)}
    for mode, (per_block, rotate) in MODES.items():
        signs, tensor = (rotation if rotate else None), not per_block
        qf = gpu.quantize_fp8(qt, block=block_q, per_tensor=tensor, incoherent=signs)
        kf = gpu.quantize_fp8(kt, block=block_kv, per_tensor=tensor, incoherent=signs)
        vf = gpu.quantize_fp8(vt, block=block_kv, per_tensor=tensor, transpose=True)
        out[mode] = gpu.attention(qf, kf, vf, schedule="flash3", causal=causal)
    torch.cuda.synchronize()
    return {m: o.float().cpu().numpy() for m, o in out.items()}


def measure(args) -> list[dict]:
    """Every row of every seed and source: dicts of source, mode, seed, d, N, rmse."""
    shape = (1, args.seq_len, args.heads, args.head_dim)
    sources = {"emulated": emulated, **({"gpu": on_gpu} if args.gpu else {})}
    rows = []
    for seed in args.seeds:
        t0 = time.perf_counter()
        q, k, v, rotation = draw(seed, shape)
        ref = exact(q, k, v, args.causal)
        for source, run in sources.items():
            for mode, o in run(q, k, v, args.causal, rotation).items():
                rows.append({"source": source, "mode": mode, "seed": seed, "d": args.head_dim, "N": args.seq_len,
                             "rmse": rmse(o, ref)})
        print(f"seed {seed}: {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return rows


def table(rows: list[dict], args) -> str:
    """RMSE per mode: the paper's, then each source's mean over seeds with [min, max]."""
    sources = sorted({r["source"] for r in rows}, key=["emulated", "gpu"].index)
    lines = [f"FP8 attention accuracy, RMSE of O vs float64 on the unquantized inputs: N={args.seq_len}, "
             f"d={args.head_dim}, heads={args.heads}, {'causal' if args.causal else 'not causal'}, seeds "
             f"{' '.join(map(str, args.seeds))}",
             f"{'mode':<24}{'paper':>9}" + "".join(f"{s + ' mean [min, max]':>36}" for s in sources)]
    for mode in ROWS:
        line = f"{mode:<24}{PAPER[mode]:>9.1e}" if mode in PAPER else f"{mode:<24}{'-':>9}"
        for s in sources:
            vals = [r["rmse"] for r in rows if r["source"] == s and r["mode"] == mode]
            line += f"{np.mean(vals):>13.2e} [{min(vals):.2e}, {max(vals):.2e}]"
        lines.append(line)
    return "\n".join(lines)


def failures(rows: list[dict]) -> list[str]:
    """Issue 27's checks, per source and seed: block+incoherent below per-tensor, and at most BAR."""
    by = {(r["source"], r["seed"], r["mode"]): r["rmse"] for r in rows}
    why = []
    for source, seed in sorted({(s, sd) for s, sd, _ in by}):
        ours, base = by[source, seed, "block+incoherent"], by[source, seed, "per-tensor"]
        if not ours < base:
            why.append(f"{source} seed {seed}: block+incoherent {ours:.3e} is not below per-tensor {base:.3e}")
        if ours > BAR:
            why.append(f"{source} seed {seed}: block+incoherent {ours:.3e} exceeds the paper's {BAR:.1e}")
    return why


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--seq-len", type=int, default=4096)
    ap.add_argument("--head-dim", type=int, default=128, choices=sorted(FLASH3_FP8_TILES))
    ap.add_argument("--heads", type=int, default=1)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--gpu", action="store_true", help="also run iosim's flash3 kernels (CuPy, torch, Hopper)")
    ap.add_argument("--json", metavar="PATH", help="write every row as JSON")
    ap.add_argument("--check", action="store_true", help="exit 1 if issue 27's ordering or bar fails")
    args = ap.parse_args(argv)
    rows = measure(args)
    print(table(rows, args))
    if args.json:
        meta = {"command": shlex.join(["python", *sys.argv]), "date": datetime.date.today().isoformat(),
                "causal": args.causal, "heads": args.heads, "paper": PAPER, "bar": BAR}
        with open(args.json, "w") as f:
            json.dump({**meta, "rows": rows}, f, indent=1)
    why = failures(rows) if args.check else []
    for line in why:
        print("check failed:", line)
    return 1 if why else 0


if __name__ == "__main__":
    sys.exit(main())
