"""The time record: measured kernel times beside the time model's predictions, on one GPU.

    python benchmarks/time_record.py --measure --device h100 [--out DIR]   # on the GPU: measure the sweep (~3 min)
    python benchmarks/time_record.py --device h100                        # anywhere: predict, write, judge
    python benchmarks/time_record.py --measure --part heldout --device h100   # the held-out shapes (~2 min)

``--part heldout`` measures :func:`held_out` instead: shapes of the classes issue 29 names (real models' prefill
and decode, odd lengths, grids under a wave, long runs), none in the record the model was built against and no
constant fitted on them, with our flash3 forward (``fa3``) beside the others; judged apart, into
``docs/validation/<device>-time-heldout.csv``.

``--measure`` times every shape of :func:`sweep` with every kernel (iosim flash2 and naive, torch SDPA's flash
backend = ``fa2``, its cuDNN backend = ``cudnn``, and torch's standard attention, matmul-softmax-matmul in the same
dtype), records each torch kernel's launch (name, grid, block, registers, shared memory; torch.profiler) and writes
``data/validation/<device>-time.json``. ``--append-throughput`` appends that measurement's benchmark shapes to
``docs/benchmarks/<profile>.csv`` (the throughput record: backends iosim-flash2, iosim-naive, torch-standard,
sdpa-flash, sdpa-cudnn).

Measured time: the median of ``--reps`` (20) CUDA-event intervals of warm calls on the same inputs, with the stream
kept busy ahead of them (a spin kernel of a few milliseconds first), so an interval is GPU time, not the host's
launch overhead (``benchmarks/bench_host.py`` measures that separately). Inputs that fit in L2 may stay resident
between calls; the model knows it (``warm=True``).

Without ``--measure`` it reads that JSON, predicts each row with :mod:`iosim.timing` on the built-in profile, writes
``docs/validation/<device>-time.csv`` and prints the errors per kernel (median and worst of |predicted - measured| /
measured) and the rows outside the issue's bounds.
"""

# ruff: noqa: B023  (each timing lambda is called at once, inside its loop iteration)
from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from cuda_events import time_ms  # beside this file

ROOT = Path(__file__).resolve().parent.parent
PROFILE = {"h100": "h100-sxm5-80gb", "h200": "h200-sxm-141gb"}
KERNELS = ("iosim-flash2", "iosim-naive", "fa2", "cudnn", "torch-standard", "fa3")
NAIVE_BYTES_MAX = 24 << 30  # S and P of the naive paths, each: larger shapes skip the two naive kernels


@dataclass(frozen=True)
class Shape:
    batch: int
    heads: int
    kv_heads: int
    seq_len: int
    kv_len: int
    head_dim: int
    dtype: str = "bf16"
    causal: bool = False
    benchmark: bool = False  # the shape convention of docs/benchmarks.md (B*N = 16K, H = 2048/d)

    @property
    def score_bytes(self) -> int:
        return self.batch * self.heads * self.seq_len * self.kv_len * 2

    @property
    def key(self) -> str:
        return (f"b{self.batch}h{self.heads}k{self.kv_heads}n{self.seq_len}m{self.kv_len}d{self.head_dim}"
                f"{self.dtype}{'c' if self.causal else ''}")


def _bench(n: int, d: int, causal: bool, dtype: str = "bf16") -> Shape:
    b, h = max(1, 16384 // n), 2048 // d
    return Shape(b, h, h, n, n, d, dtype, causal, benchmark=True)


def sweep() -> list[Shape]:
    """N 128 to 65536, d 64 and 128, causal and not, fp16 and bf16, grouped-query, one wave to many, decode."""
    out = [_bench(n, d, c) for n in (128, 256, 1024, 4096, 16384) for d in (64, 128) for c in (False, True)]
    out += [Shape(1, 2048 // d, 2048 // d, 65536, 65536, d, "bf16", c) for d in (64, 128) for c in (False, True)]
    out += [Shape(1, 1, 1, 65536, 65536, 128)]  # naive's largest: S and P 8 GiB each
    out += [_bench(n, 128, False, "fp16") for n in (1024, 4096, 16384)]
    out += [_bench(2048, 64, False), _bench(2048, 128, False), _bench(8192, 128, False), _bench(8192, 64, True)]
    out += [Shape(max(1, 16384 // n), 32, 8, n, n, 128, "bf16", c) for n in (1024, 4096, 16384) for c in (False, True)]
    out += [Shape(1, h, h, 2048, 2048, 128) for h in (1, 4, 16, 64, 256)]  # under one wave to many
    out += [Shape(8, 32, 8, 1, m, 128) for m in (256, 1024, 4096, 16384, 65536)]  # decode: one query
    return out


def held_out() -> list[Shape]:
    """Shapes no constant was fitted on and the model was not built against (issue 29 item 2)."""
    models = [Shape(4, 32, 8, 2048, 2048, 128, causal=True), Shape(1, 32, 8, 8192, 8192, 128, causal=True),  # Llama-3 8B
              Shape(1, 64, 8, 4096, 4096, 128, causal=True),  # Llama-3 70B
              Shape(2, 28, 4, 3000, 3000, 128, causal=True),  # Qwen2 7B, an odd length
              Shape(8, 12, 12, 1024, 1024, 64, causal=True), Shape(16, 16, 16, 1024, 1024, 64, causal=True),  # GPT-2
              Shape(2, 8, 1, 4096, 4096, 256, causal=True)]  # Gemma 2B: multi-query, d = 256
    odd = [Shape(4, 16, 16, 1000, 1000, 128), Shape(1, 32, 32, 5000, 5000, 64, causal=True),
           Shape(8, 16, 16, 777, 777, 64)]
    small = [Shape(1, 4, 4, 2048, 2048, 128), Shape(1, 2, 2, 8192, 8192, 64, causal=True)]
    long = [Shape(1, 32, 32, 32768, 32768, 128, causal=True), Shape(1, 16, 16, 65536, 65536, 64)]
    decode = [Shape(16, 32, 8, 1, 8192, 128), Shape(64, 32, 8, 1, 2048, 128)]
    return models + odd + small + long + decode


# ------------------------------------------------------------------------------------------------------------------
# measuring (GPU)


def _callables(s: Shape, tensors):
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import iosim.gpu as gpu

    q, k, v = tensors
    qt, kt, vt = (x.transpose(1, 2) for x in tensors)  # torch's (B, H, N, d) views of our (B, N, H, d)
    gqa = s.heads != s.kv_heads
    scale = s.head_dim ** -0.5

    def sdpa(backend):
        def run():
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(qt, kt, vt, is_causal=s.causal, enable_gqa=gqa)
        return run

    def standard():
        kk, vv = kt, vt
        if gqa:
            kk, vv = (x.repeat_interleave(s.heads // s.kv_heads, dim=1) for x in (kt, vt))
        sc = torch.matmul(qt, kk.transpose(-1, -2)) * scale
        if s.causal:
            mask = torch.ones(s.seq_len, s.kv_len, dtype=torch.bool, device=q.device).tril(s.kv_len - s.seq_len)
            sc = sc.masked_fill(~mask, float("-inf"))
        return torch.matmul(torch.softmax(sc, dim=-1), vv)

    runs = {
        "iosim-flash2": lambda: gpu.attention(q, k, v, causal=s.causal, schedule="flash2"),
        "iosim-naive": lambda: gpu.attention(q, k, v, causal=s.causal, schedule="naive"),
        "fa2": sdpa(SDPBackend.FLASH_ATTENTION),
        "cudnn": sdpa(SDPBackend.CUDNN_ATTENTION),
        "torch-standard": standard,
        "fa3": lambda: gpu.attention(q, k, v, causal=s.causal, schedule="flash3"),  # ours; held-out part only
    }
    if s.score_bytes > NAIVE_BYTES_MAX:
        del runs["iosim-naive"], runs["torch-standard"]
    if s.seq_len == 1:
        del runs["cudnn"]  # decode is the flash backend's split-KV kernel; cuDNN's fused kernel is a prefill kernel
    return runs


def _launches(fn) -> list[dict]:
    """The kernels one call launches: name, grid, block, registers per thread, shared memory (torch.profiler)."""
    import tempfile

    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        events = json.load(open(f.name))["traceEvents"]
    out = []
    for e in sorted((e for e in events if e.get("cat") == "kernel"), key=lambda e: e["ts"]):
        a = e.get("args", {})
        out.append({"name": e["name"], "grid": a.get("grid"), "block": a.get("block"),
                    "registers": a.get("registers per thread"), "smem": a.get("shared memory"),
                    "us": e.get("dur")})
    return out


def device_header(device: str, reps: int) -> dict:
    """What a record says of its measurement: GPU 0's name, the driver, torch, the commit measured, the reps."""
    import subprocess

    import torch

    driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                            capture_output=True, text=True).stdout.strip()
    return {"device": torch.cuda.get_device_properties(0).name, "device_key": device, "driver": driver,
            "torch": torch.__version__, "commit": os.environ.get("IOSIM_COMMIT", "unknown"), "reps": reps}


def save_record(data: dict, path: Path) -> Path:
    """Write a measured record (``data``) as JSON to ``path``, its folder made where missing."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1))
    return path


def part_main(argv: list[str] | None, part: str, description: str, measure, dry_run) -> int:
    """The command line of a part of the time record (time_record_<part>.py): ``--dry-run`` predicts every row on any
    CPU (``dry_run(device)``), ``--measure`` times them on this GPU (``measure(device, reps)``, a record with
    ``failed_checks``) into ``<out>/<device>-time-<part>.json``; exit 1 where a check failed."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--device", choices=sorted(PROFILE), required=True)
    ap.add_argument("--measure", action="store_true", help="measure on this GPU")
    ap.add_argument("--dry-run", action="store_true", help="predict every row (no GPU)")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out", type=Path, default=None, help="folder for the JSON (default data/validation)")
    args = ap.parse_args(argv)
    if args.dry_run:
        dry_run(args.device)
        return 0
    if not args.measure:
        ap.error("--measure or --dry-run (time_record.py judges the measured part)")
    data = measure(args.device, args.reps)
    path = save_record(data, (args.out or ROOT / "data/validation") / f"{args.device}-time-{part}.json")
    print(f"wrote {path}; {data['failed_checks']} failed checks")
    return 1 if data["failed_checks"] else 0


def time_call(fn, reps: int, launches: bool) -> tuple[float | None, list[dict], float]:
    """(median ms, the call's launches where asked, seconds the timing ran) of one call; a backend that refuses the
    shape is recorded (ms None, the error as its launch), not fatal."""
    import time

    try:
        t0 = time.perf_counter()
        ms = time_ms(fn, reps)
        seconds = time.perf_counter() - t0
        return ms, (_launches(fn) if launches else []), seconds
    except Exception as exc:
        return None, [{"error": f"{type(exc).__name__}: {exc}"[:300]}], 0.0


def measure(device: str, reps: int, only: list[str] | None, part: str = "record") -> dict:
    import torch

    torch.manual_seed(0)
    header = device_header(device, reps)
    rows, shapes = [], (held_out() if part == "heldout" else sweep())
    for i, s in enumerate(shapes):
        dt = {"bf16": torch.bfloat16, "fp16": torch.float16}[s.dtype]

        def mk(n, h):
            return torch.randn(s.batch, n, h, s.head_dim, device="cuda", dtype=dt)

        tensors = (mk(s.seq_len, s.heads), mk(s.kv_len, s.kv_heads), mk(s.kv_len, s.kv_heads))
        for name, fn in _callables(s, tensors).items():
            if (only and name not in only) or (name == "fa3" and part != "heldout") or \
                    (name == "fa3" and (s.seq_len == 1 or s.head_dim not in (64, 128, 256))):
                continue
            ms, launch, timed_s = time_call(fn, reps, launches=name in ("fa2", "cudnn"))
            # timed_s: how long the timing ran (warm-up and reps), so the clock it ran at can be known (issue 29)
            rows.append({**asdict(s), "kernel": name, "measured_ms": ms, "launches": launch, "timed_s": timed_s})
            print(f"[{i + 1}/{len(shapes)}] {s.key:<34} {name:<15} "
                  f"{'refused' if ms is None else f'{ms:10.4f} ms'}", flush=True)
        del tensors
        torch.cuda.empty_cache()
    return {**header, "rows": rows}


def append_throughput(data: dict, path: Path) -> None:
    """docs/benchmarks/<device>.csv rows (backends as docs/benchmarks.md names them) for the benchmark shapes."""
    import csv
    import datetime

    names = {"iosim-flash2": "iosim-flash2", "iosim-naive": "iosim-naive", "torch-standard": "torch-standard",
             "fa2": "sdpa-flash", "cudnn": "sdpa-cudnn"}
    new = not path.exists()
    with path.open("a", newline="") as f:
        w = csv.writer(f)
        if new:
            w.writerow(("device", "date", "commit", "dtype", "head_dim", "seq_len", "batch", "heads", "causal",
                        "backend", "ms", "tflops"))
        for r in data["rows"]:
            if not r["benchmark"] or r["measured_ms"] is None:
                continue
            flops = 4 * r["seq_len"] * r["kv_len"] * r["head_dim"] * r["batch"] * r["heads"] / (2 if r["causal"] else 1)
            w.writerow((data["device"], datetime.date.today().isoformat(), data["commit"][:7], r["dtype"],
                        r["head_dim"], r["seq_len"], r["batch"], r["heads"], str(r["causal"]).lower(),
                        names[r["kernel"]], f"{r['measured_ms']:.4f}", f"{flops / r['measured_ms'] / 1e9:.1f}"))


# ------------------------------------------------------------------------------------------------------------------
# predicting and judging (any machine)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", choices=sorted(PROFILE), required=True)
    ap.add_argument("--measure", action="store_true", help="measure the sweep on this GPU first")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--only", nargs="*", choices=KERNELS, help="with --measure: these kernels only")
    ap.add_argument("--fit", action="store_true",
                    help="fit iosim.timing.overlap.OVERLAP_LOSS on this record (once, on one GPU) and print it")
    ap.add_argument("--append-throughput", action="store_true",
                    help="append the benchmark shapes' rows to docs/benchmarks/<profile>.csv (once per measurement)")
    ap.add_argument("--out", type=Path, default=None, help="with --measure: folder for the JSON (default data/validation)")
    ap.add_argument("--part", choices=("record", "heldout"), default="record",
                    help="the record (the sweep the model was built against) or the held-out shapes")
    args = ap.parse_args(argv)
    suffix = "-heldout" if args.part == "heldout" else ""
    raw = (args.out or ROOT / "data/validation") / f"{args.device}-time{suffix}.json"
    if args.measure:
        save_record(measure(args.device, args.reps, args.only, args.part), raw)
        print(f"wrote {raw}")
        return 0
    if args.append_throughput:
        append_throughput(json.loads(raw.read_text()), ROOT / "docs/benchmarks" / f"{PROFILE[args.device]}.csv")
    from time_judge import fit_overlap, judge_record  # beside this file; imports iosim.timing

    if args.fit:
        fit_overlap(raw, PROFILE[args.device])
        return 0

    return judge_record(args.device, raw, PROFILE[args.device], ROOT, args.part)


if __name__ == "__main__":
    sys.exit(main())
