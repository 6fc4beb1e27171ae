"""The backward pass's time record: measured backward kernel times beside the time model's, on one GPU.

    python benchmarks/time_record_backward.py --measure --device h100   # on the GPU (~2 min)
    python benchmarks/time_record.py --device h100                      # anywhere: predicts and judges both records

``--measure`` times the backward alone (given Q, K, V, O, dO and the forward's statistics) for every shape of
:func:`sweep` with every backward kernel: ``iosim-flash2-bwd`` (kernels/flash_bwd.cu through
iosim.gpu.attention_backward), ``iosim-flash3-bwd`` (the Hopper backward, where this checkout has it), ``fa2-bwd``
(torch SDPA's flash backend's backward, its aten op called directly) and ``cudnn-bwd`` (its cuDNN backend's), as
time_record.py times the forward: the median of ``--reps`` CUDA-event intervals of warm calls on the same inputs,
the stream kept busy ahead. Each row names the commit it was measured at; ``--only K... --merge JSON`` measures some
kernels again and keeps the other rows of an earlier record. Each kernel's launches (name, grid, block, registers,
shared memory; torch.profiler) are recorded beside its time, and how long each timed run lasted (the GPU lowers its
clock under long tensor load).
Writes ``data/validation/<device>-time-backward.json``; time_record.py judges it beside the forward record.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

from bench_backward import _inputs  # beside this file
from time_record import PROFILE, Shape, device_header, save_record, time_call

from iosim.calibrate.backward_step import torch_backward

ROOT = Path(__file__).resolve().parent.parent
KERNELS = ("iosim-flash2-bwd", "iosim-flash3-bwd", "fa2-bwd", "cudnn-bwd")

def _bench(n: int, d: int, causal: bool, dtype: str = "bf16") -> Shape:
    return Shape(max(1, 16384 // n), 2048 // d, 2048 // d, n, n, d, dtype, causal, benchmark=True)

def sweep() -> list[Shape]:
    """N 512 to 32768, d 64, 128 and 256, causal and not, fp16 and bf16, grouped-query, ragged, kv_len != seq_len,
    under one wave to many."""
    out = [_bench(n, d, c) for n in (1024, 4096, 16384) for d in (64, 128) for c in (False, True)]
    out += [_bench(n, d, False) for n in (512, 2048, 8192) for d in (64, 128)]
    out += [_bench(4096, 128, False, "fp16"), _bench(2048, 64, True, "fp16"), _bench(4096, 256, False),
            _bench(4096, 256, True)]
    out += [Shape(4, 32, 8, 4096, 4096, 128, "bf16", c) for c in (False, True)]  # grouped-query 4:1
    out += [Shape(1, h, h, 2048, 2048, 128) for h in (1, 4, 16, 64)]  # under one wave to a few
    out += [Shape(4, 16, 16, 1000, 1000, 128, "bf16", True), Shape(2, 16, 16, 3000, 3000, 64)]  # ragged
    out += [Shape(4, 16, 16, 1024, 4096, 128, "bf16", True), Shape(1, 16, 16, 32768, 32768, 128, "bf16", True)]
    return out

def _callables(s: Shape, tensors) -> dict:
    import iosim.gpu as gpu

    q, k, v, o, lse, do = tensors
    calls = {"iosim-flash2-bwd": lambda: gpu.attention_backward(q, k, v, o, do, lse, causal=s.causal)}
    try:  # the Hopper backward (sm_90a; head_dim <= 128): a refusal is recorded
        gpu.attention_backward(q, k, v, o, do, lse, causal=s.causal, options=gpu.BackwardOptions(schedule="flash3"))
        calls["iosim-flash3-bwd"] = lambda: gpu.attention_backward(q, k, v, o, do, lse, causal=s.causal,
                                                                   options=gpu.BackwardOptions(schedule="flash3"))
    except Exception as exc:
        calls["iosim-flash3-bwd"] = exc
    import torch

    for name, backend in (("fa2-bwd", "flash"), ("cudnn-bwd", "cudnn")):
        try:
            calls[name] = torch_backward(torch, backend, q, k, v, do, s.causal, s.head_dim ** -0.5)
        except RuntimeError as exc:
            calls[name] = exc
    return calls

def measure(device: str, reps: int, only: list[str] | None = None) -> dict:
    import torch

    header = device_header(device, reps)
    rows, shapes = [], sweep()
    for i, s in enumerate(shapes):
        dt = {"bf16": torch.bfloat16, "fp16": torch.float16}[s.dtype]
        tensors = _gqa_inputs(torch, s, dt)
        for name, fn in _callables(s, tensors).items():
            if only and name not in only:
                continue
            if isinstance(fn, Exception):  # refused before any timing
                ms, launch, seconds = None, [{"error": f"{type(fn).__name__}: {fn}"[:300]}], 0.0
            else:
                ms, launch, seconds = time_call(fn, reps, launches=True)
            rows.append({**asdict(s), "kernel": name, "measured_ms": ms, "run_s": round(seconds, 3),
                         "commit": header["commit"], "launches": launch})
            print(f"[{i + 1}/{len(shapes)}] {s.key:<34} {name:<17} "
                  f"{'refused' if ms is None else f'{ms:10.4f} ms'}", flush=True)
        del tensors
        torch.cuda.empty_cache()
    return {**header, "rows": rows}


def _gqa_inputs(torch, s: Shape, dt):
    """Q, K, V, O, lse, dO of one shape (our forward's O and lse); K and V with the shape's kv heads and kv_len."""
    if (s.kv_heads, s.kv_len) == (s.heads, s.seq_len):
        return _inputs(torch, s.batch, s.seq_len, s.heads, s.head_dim, dt, s.causal)
    from iosim import gpu

    g = torch.Generator(device="cuda").manual_seed(0)

    def mk(n, h):
        return torch.randn(s.batch, n, h, s.head_dim, generator=g, device="cuda", dtype=torch.float32).to(dt)

    q, do = mk(s.seq_len, s.heads), mk(s.seq_len, s.heads)
    k, v = mk(s.kv_len, s.kv_heads), mk(s.kv_len, s.kv_heads)
    o, lse = gpu.attention(q, k, v, causal=s.causal, return_lse=True)
    return q, k, v, o, lse, do

def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", choices=sorted(PROFILE), required=True)
    ap.add_argument("--measure", action="store_true", help="measure the sweep on this GPU")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--only", nargs="*", choices=KERNELS,
                    help="measure these kernels only; their rows replace theirs in the existing JSON (--merge)")
    ap.add_argument("--merge", type=Path, default=None, help="with --only: the JSON whose other rows are kept")
    ap.add_argument("--out", type=Path, default=None, help="folder for the JSON (default data/validation)")
    args = ap.parse_args(argv)
    if not args.measure:
        ap.error("without --measure, run benchmarks/time_record.py --device DEVICE: it judges both records")
    raw = (args.out or ROOT / "data/validation") / f"{args.device}-time-backward.json"
    data = measure(args.device, args.reps, args.only)
    if args.only and args.merge:
        kept = [r for r in json.loads(args.merge.read_text())["rows"] if r["kernel"] not in args.only]
        data["rows"] = kept + data["rows"]
    save_record(data, raw)
    print(f"wrote {raw}")
    return 0

if __name__ == "__main__":
    sys.exit(main())
