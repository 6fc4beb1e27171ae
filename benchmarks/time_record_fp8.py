"""The fp8 time record (issue 27): iosim's fp8 forward and cuDNN's FP8 forward measured beside the time model.

    python benchmarks/time_record_fp8.py --measure --device h100    # on the GPU (~1-2 min): 20 shapes, 2 kernels
    python benchmarks/time_record_fp8.py --dry-run --device h100    # any CPU: every row predicted as the judge will
    python benchmarks/time_record.py --device h100                  # anywhere: judges it beside the other parts

What is timed is the attention kernel alone, on inputs quantized beforehand: the quantize pass is not in any row
(bench_fp8.py times it apart; ``simulate("fp8-quantize", ...)`` counts it). Per shape, one set of bf16 inputs
(standard normal, seeded), and two rows, each ``dtype`` fp8:

- ``iosim-flash3``: ``iosim.gpu.attention(qf, kf, vf, schedule="flash3")`` on ``iosim.gpu.quantize_fp8``'s inputs
  (block scales at the kernel's tiles, V transposed; not rotated: incoherent processing changes no byte and no FLOP
  of the attention kernel). O in bf16.
- ``cudnn``: cuDNN's FP8 forward through cudnn-frontend (iosim/calibrate/cudnn_fp8.py), inputs quantized per tensor,
  asked for fp8 O only: on Hopper cuDNN refuses bf16 and fp16 output for FP8 attention, and the time model counts
  cudnn's O in the problem's dtype, fp8 (docs/timing.md), so the row means the same on every machine. Where
  cudnn-frontend is missing or refuses a shape, that row is kept without a time and the reason is printed.

Every output is checked against float64 first (bench_fp8.py's check: up to 1,024 query rows, every key; tolerance
``bench_fp8.FP8_TOL``); a failed check is recorded and the exit status is 1. Then the time: the median of ``--reps``
CUDA-event intervals of warm calls after warm-up, the stream kept busy ahead (benchmarks/cuda_events.py), as the
other parts of the time record. Writes ``data/validation/<device>-time-fp8.json``; time_record.py predicts each row
with ``simulate("flash3", problem (dtype "fp8"), kernel=<row's kernel>, l2=True, warm=True)`` at the description's
fp8 tiles and judges each kernel's fp8 rows as a group of its own (``iosim-flash3 fp8``, ``cudnn fp8``: issue 27's
bound, median 5%, worst 15%), apart from the bf16 rows of the same kernel.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import asdict
from pathlib import Path

from time_record import PROFILE, Shape, device_header, save_record, time_call

from iosim.calibrate import cudnn_fp8
from iosim.launch import FLASH3_FP8_TILES

ROOT = Path(__file__).resolve().parent.parent
KERNELS = ("iosim-flash3", "cudnn")
O_DTYPE = {"iosim-flash3": "bf16", "cudnn": "fp8"}  # what each kernel writes O in (the module docstring)
SCALES = {"iosim-flash3": "block (Q 128 rows, K and V block_kv rows), not rotated", "cudnn": "per tensor"}
HEAD_DIMS = tuple(FLASH3_FP8_TILES)  # the fp8 kernel's instantiations: 64, 128, 256


def _bench(n: int, d: int, causal: bool) -> Shape:
    """The benchmarks' convention: batch * N = 16K tokens, heads = 2048 / d."""
    return Shape(max(1, 16384 // n), 2048 // d, 2048 // d, n, n, d, "fp8", causal, benchmark=True)


def sweep() -> list[Shape]:
    """d 64, 128 and 256; N 1024 to 32768; causal and not; grouped-query 4:1; ragged N (3000, 1000: partial Q and
    K/V tiles); a grid under one wave. kv_len = seq_len everywhere: cuDNN's causal mask is aligned top-left, ours
    bottom-right, and they agree only there."""
    out = [_bench(n, d, False) for d in HEAD_DIMS for n in (1024, 4096, 16384)]
    out += [_bench(n, 128, True) for n in (1024, 4096, 16384)] + [_bench(16384, d, True) for d in (64, 256)]
    out += [Shape(4, 32, 8, 4096, 4096, 128, "fp8", c) for c in (False, True)]
    out += [Shape(4, 16, 16, 3000, 3000, 128, "fp8"), Shape(8, 16, 16, 1000, 1000, 128, "fp8", True)]
    out += [Shape(1, 4, 4, 2048, 2048, 128, "fp8"), Shape(1, 16, 16, 32768, 32768, 128, "fp8", True)]
    return out


def check_shapes(shapes: list[Shape]) -> None:
    """What the measurement assumes of every shape; a ValueError naming the shape where one does not hold."""
    for s in shapes:
        if s.dtype != "fp8" or s.head_dim not in HEAD_DIMS or s.heads % s.kv_heads or s.kv_len != s.seq_len:
            raise ValueError(f"{s.key}: expected dtype fp8, head_dim in {HEAD_DIMS}, heads a multiple of kv_heads and "
                             "kv_len = seq_len (the two causal masks agree only there)")
    keys = [s.key for s in shapes]
    if len(set(keys)) != len(keys):
        raise ValueError(f"a shape is listed twice: {sorted(k for k in keys if keys.count(k) > 1)}")


def judge_row(s: Shape, kernel: str) -> dict:
    """The fields of a row the judge (time_judge.simulate_row) reads."""
    return {**asdict(s), "kernel": kernel}


# ------------------------------------------------------------------------------------------------------------------
# measuring (GPU)


def _inputs(torch, s: Shape) -> tuple:
    g = torch.Generator(device="cuda").manual_seed(s.seq_len * s.head_dim + s.heads)

    def draw(h):
        return torch.randn(s.batch, s.seq_len, h, s.head_dim, device="cuda", dtype=torch.bfloat16, generator=g)

    return draw(s.heads), draw(s.kv_heads), draw(s.kv_heads)


def _reference(torch, bench, s: Shape, inputs) -> tuple[list[int], object]:
    """(checked rows, float64 O there): bench_fp8's reference, K and V repeated over their group's query heads."""
    q, k, v = inputs
    group = s.heads // s.kv_heads
    k, v = (x.repeat_interleave(group, dim=2) for x in (k, v))
    rows = bench.sample_rows(s.seq_len)
    return rows, bench.reference_rows(torch, (q, k, v), rows, s.causal)


def _ours(torch, gpu, bench, s: Shape, inputs, ref) -> tuple[object | None, dict]:
    """(the timed call, its check) of our fp8 kernel on inputs quantized here (the quantize pass is not timed)."""
    q, k, v = inputs
    bq, bkv = gpu.fp8_blocks(s.head_dim)
    qf, kf, vf = gpu.quantize_fp8(q, block=bq), gpu.quantize_fp8(k, block=bkv), gpu.quantize_fp8(v, block=bkv,
                                                                                                   transpose=True)

    def attend():
        return gpu.attention(qf, kf, vf, schedule="flash3", causal=s.causal)

    o, note = bench.fp8_poisoned(torch, (qf, kf, vf), s.causal, attend)
    err, _ = bench.errors(torch, o, ref[1], ref[0])
    return attend, {"check_err": err, **({"note": note} if note else {})}


def _cudnn(torch, bench, peer, s: Shape, inputs, ref) -> tuple[object | None, dict]:
    """(the timed call or None, its check or why not) of cuDNN's FP8 forward, fp8 O only."""
    cudnn, handle, why = peer
    if cudnn is None:
        return None, {"why": why}
    call, note = cudnn_fp8.prepare(torch, cudnn, handle, inputs, s.causal, out_types=("fp8",))
    if call is None:
        return None, {"why": f"cudnn-fp8: not supported here: {note}"}
    call()
    torch.cuda.synchronize()
    err, _ = bench.errors(torch, call.output(torch), ref[1], ref[0])
    return call, {"check_err": err}


def measure_shape(torch, gpu, bench, peer, s: Shape, reps: int, only: list[str] | None) -> list[dict]:
    """The shape's rows: each kernel checked against float64, then timed; a kernel that cannot run says why."""
    inputs = _inputs(torch, s)
    ref = _reference(torch, bench, s, inputs)
    rows = []
    for kernel, prepare in (("iosim-flash3", lambda: _ours(torch, gpu, bench, s, inputs, ref)),
                            ("cudnn", lambda: _cudnn(torch, bench, peer, s, inputs, ref))):
        if only and kernel not in only:
            continue
        row = {**judge_row(s, kernel), "o_dtype": O_DTYPE[kernel], "scales": SCALES[kernel], "measured_ms": None,
               "timed": "the attention kernel alone, inputs quantized beforehand"}
        try:
            fn, info = prepare()
        except Exception as exc:  # recorded: the other kernel and shapes go on
            fn, info = None, {"why": f"{type(exc).__name__}: {exc}"[:300]}
        row.update(info)
        if "check_err" in row:
            row["check"] = "ok" if row["check_err"] <= bench.FP8_TOL else "FAIL"
        if fn is not None and row.get("check") == "ok":
            row["measured_ms"], row["launches"], row["timed_s"] = time_call(fn, reps, launches=True)
        rows.append(row)
    return rows


def _line(i: int, n: int, s: Shape, row: dict) -> str:
    ms = row["measured_ms"]
    what = f"{ms:10.4f} ms" if ms is not None else "not timed"
    check = f"check {row['check']} ({row['check_err']:.2e})" if "check" in row else row.get("why", "")
    return f"[{i + 1}/{n}] {s.key:<34} {row['kernel']:<13} {what}  {check}"


def measure(device: str, reps: int, only: list[str] | None) -> dict:
    import bench_fp8  # beside this file: the float64 check, the poisoned output, cuDNN's handle
    import torch

    from iosim import gpu

    shapes = sweep()
    check_shapes(shapes)
    peer = (None, None, "cudnn-fp8: not asked for (--only)") if only and "cudnn" not in only else \
        bench_fp8.open_cudnn(torch)
    if peer[2]:
        print(peer[2], flush=True)
    rows = []
    for i, s in enumerate(shapes):
        for row in measure_shape(torch, gpu, bench_fp8, peer, s, reps, only):
            rows.append(row)
            print(_line(i, len(shapes), s, row), flush=True)
        torch.cuda.empty_cache()
    return {**device_header(device, reps), "rows": rows}


# ------------------------------------------------------------------------------------------------------------------
# the dry run (any machine)


def dry_run(device: str) -> None:
    """Every row predicted as time_record.py will predict it (time_judge.predict_row), so a shape or a kernel the
    judge cannot take fails here, not after the GPU run."""
    from time_judge import predict_row  # beside this file

    shapes = sweep()
    check_shapes(shapes)
    profile = PROFILE[device]
    for i, s in enumerate(shapes):
        for kernel in KERNELS:
            t0 = time.perf_counter()
            pred, bq, bkv, bound = predict_row(judge_row(s, kernel), profile)
            print(f"[{i + 1}/{len(shapes)}] {s.key:<34} {kernel:<13} predicted {pred * 1e3:9.4f} ms  tiles "
                  f"{bq}x{bkv}  bound {bound}  ({time.perf_counter() - t0:.2f} s)")
    print(f"{len(shapes)} shapes x {len(KERNELS)} kernels on {profile}; nothing measured")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", choices=sorted(PROFILE), required=True)
    ap.add_argument("--measure", action="store_true", help="measure the sweep on this GPU")
    ap.add_argument("--dry-run", action="store_true", help="predict every row as the judge will; measure nothing")
    ap.add_argument("--reps", type=int, default=20, help="timed calls per row (default 20)")
    ap.add_argument("--only", nargs="+", choices=KERNELS, help="with --measure: these kernels only")
    ap.add_argument("--out", type=Path, default=None, help="with --measure: folder for the JSON (default data/validation)")
    args = ap.parse_args(argv)
    if args.measure == args.dry_run:
        ap.error("give --measure (on the GPU) or --dry-run (any CPU); time_record.py --device DEVICE judges the record")
    if args.reps < 1:
        ap.error(f"--reps {args.reps}: expected at least 1")
    if args.dry_run:
        dry_run(args.device)
        return 0
    start = time.perf_counter()
    data = measure(args.device, args.reps, args.only)
    raw = save_record(data, (args.out or ROOT / "data/validation") / f"{args.device}-time-fp8.json")
    print(f"wrote {raw} ({time.perf_counter() - start:.0f} s)")
    failed = [f"{r['kernel']} b{r['batch']} h{r['heads']}/{r['kv_heads']} N={r['seq_len']} d={r['head_dim']}"
              for r in data["rows"] if r.get("check") == "FAIL"]
    for f in failed:
        print(f"FAILED the float64 check: {f}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.exit(main())
