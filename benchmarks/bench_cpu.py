"""Attention on this CPU: iosim's tiled numba kernel (flash2 schedule) vs NumPy's naive three steps.

    python benchmarks/bench_cpu.py [--n 512 1024 ... 65536] [--d 64 128] [--causal] [--naive-max 32768]
                                   [--profile PROFILE.yaml | --detect] [--csv out.csv]
    python benchmarks/bench_cpu.py --record --n 1024 2048 4096 8192 16384 --d 64


fp32, one head, batch 1. Same inputs, one process; naive and tiled calls alternate (iosim.cpu.compare.measure_pair).
Times are of warm calls, as on the GPU: each timed naive call comes right after an untimed naive call of the same
size, so its N x N matrix lands on the memory that call freed (the steady state of repeated calls). Each time is
the fastest of 7 pairs up to N = 8192, 3 up to 32768, else 2 (other processes on a shared machine only add time;
before each pair the script waits, up to 30 s, for the CPUs to be less than 15% busy); "ratio" is naive/tiled of
those, "med" the median of the per-pair ratios. "naive 1st" is naive's first call at that N, made after
--first-call-pause seconds (default 3) without large allocations, so that its memory is cold: on a VM that backs
guest memory lazily (free page reporting) the hypervisor maps it again, far slower than recycled memory. The load
average is printed per row. Naive is refused (and reported as not fitting) where one N x N fp32 matrix exceeds the
available memory; --naive-max skips it above that N to save time. With --detect (or --profile), the CPU model's
predicted times (warm, and naive's first call) stand beside the measurements, with the warm predictions' error;
--detect measures this machine first (about 10 s; iosim.cpu.detect). The first call's compile time (numba,
cached on disk afterwards) is printed first.

--record measures what ``iosim report --cpu`` measures (``iosim.cpu.compare.scenario_data``: this machine's profile
detected first, then the rows) and writes it as the committed record the default report shows,
docs/benchmarks/cpu-<machine>.json (or the path given), with the machine, the date and the command.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import json
import os
import re
import sys
import time
from pathlib import Path

import numpy as np

from iosim._version import __version__
from iosim.cpu import _blas
from iosim.cpu.compare import SEEDS_CLAIM, ratio_rows, rows_as_dicts, scenario_data
from iosim.cpu.detect import detect_profile
from iosim.cpu.host import model_name, usable_cpus
from iosim.hardware.cpu import get_cpu_profile


def first_call_seconds() -> float:
    """Seconds of the first tiled call in this process (compile, or load from numba's cache)."""
    import iosim.cpu as cpu

    q = np.zeros((1, 64, 1, 64), dtype=np.float32)
    t = time.perf_counter()
    cpu.attention(q, q, q)
    return time.perf_counter() - t


def _fmt(x, spec=".1f"):
    return "-" if x is None else format(x, spec)


def _err(pred, meas) -> str:
    """The prediction's error relative to the measurement, e.g. '-3%'."""
    return "" if pred is None or not meas else f"{100 * (pred / meas - 1):+.0f}%"


RECORDS = Path(__file__).resolve().parents[1] / "docs" / "benchmarks"


def record_path(machine: str, cpus: int) -> Path:
    """docs/benchmarks/cpu-<model>-<cpus>cpu.json, e.g. cpu-amd-epyc-7b13-2cpu.json."""
    slug = re.sub(r"[^a-z0-9]+", "-", machine.lower().replace("(r)", "").replace("(tm)", "")).strip("-")
    return RECORDS / f"cpu-{slug}-{cpus}cpu.json"


def write_record(seq_lens, head_dims, path: str | None, argv: list[str]) -> Path:
    """Measure as ``iosim report --cpu`` does and write the committed record the default report shows."""
    load = os.getloadavg()[0]
    data = scenario_data(tuple(seq_lens), tuple(head_dims))
    out = Path(path) if path else record_path(data["machine"], data["logical_cpus"])
    record = {
        "what": "naive (NumPy) vs tiled (iosim.cpu) attention, fp32, one head, measured on the machine named; "
                "predictions from the CPU model on this machine's detected profile",
        "measured_at": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": "python benchmarks/bench_cpu.py " + " ".join(argv),
        "iosim_version": __version__,
        "load_average_1min": {"before": round(load, 2), "after": round(os.getloadavg()[0], 2)},
        **data,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1) + "\n")
    return out


def record_main(args, argv: list[str]) -> int:
    print(f"CPU: {model_name()}, {usable_cpus()} logical CPUs; load average {os.getloadavg()[0]:.2f}; "
          f"detecting the profile, then measuring N {args.n}, d {args.d} ...", flush=True)
    path = write_record(args.n, args.d, args.record or None, argv)
    for r in json.loads(path.read_text())["rows"]:
        pr = r["naive_pred_ms"] / r["tiled_pred_ms"] if r["naive_pred_ms"] and r["tiled_pred_ms"] else None
        print(f"d={r['head_dim']} N={r['seq_len']:>6}: naive {_fmt(r['naive_ms'])} ms, tiled {_fmt(r['tiled_ms'])} ms, "
              f"ratio {_fmt(r['ratio'], '.2f')} (median {_fmt(r['ratio_median'], '.2f')}), predicted {_fmt(pr, '.2f')}")
    print(f"wrote {path}")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192, 16384, 32768, 65536])
    ap.add_argument("--d", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--naive-max", type=int, default=None, help="skip naive above this N")
    ap.add_argument("--first-call-pause", type=float, default=3.0, metavar="S",
                    help="seconds without large allocations before naive's first call at each N (cold memory)")
    ap.add_argument("--profile", default=None, help="CPU profile for the predictions")
    ap.add_argument("--detect", action="store_true", help="measure this machine's profile first")
    ap.add_argument("--csv", default=None)
    ap.add_argument("--record", nargs="?", const="", default=None, metavar="PATH",
                    help="write the report's committed record (default docs/benchmarks/cpu-<machine>.json)")
    args = ap.parse_args(argv)
    if args.record is not None:
        return record_main(args, sys.argv[1:] if argv is None else argv)

    print(f"first tiled call: {first_call_seconds():.2f} s (compile, or numba's on-disk cache)")
    print(f"CPU: {model_name()}, {os.cpu_count()} logical CPUs; GEMM: {_blas.describe()}; "
          f"load average {os.getloadavg()[0]:.2f}")
    profile = None
    if args.detect:
        t = time.perf_counter()
        profile = detect_profile()
        print(f"detected profile in {time.perf_counter() - t:.1f} s ({profile.notes}); rates: tile GEMM "
              f"{profile.gemm_rate('tile', args.d[0]).value / 1e9:.0f} GFLOP/s (d={args.d[0]}), softmax "
              f"{profile.require('compute.softmax_fp32') / 1e9:.2f} G/s, first touch "
              f"{profile.require('dram.first_touch') / 1e9:.1f} GB/s recycled, "
              f"{profile.require('dram.first_touch_cold') / 1e9:.2f} GB/s cold")
    elif args.profile:
        profile = get_cpu_profile(args.profile)
    out = []
    print(f"{'d':>4} {'N':>6} {'naive ms':>9} {'tiled ms':>9} {'ratio':>5} {'med':>5} {'pred naive':>16} "
          f"{'pred tiled':>16} {'pred ratio':>10} {'naive 1st':>9} {'pred 1st':>16} {'S GB':>6} fits  load"
          f"  (seeds' claim {SEEDS_CLAIM}x)")
    for d, n in ((d, n) for d in args.d for n in args.n):  # one row at a time: its load average beside it
        for r in ratio_rows([n], d, profile, causal=args.causal, naive_max=args.naive_max,
                            first_call_pause_s=args.first_call_pause):
            pr = r.naive_pred_ms / r.tiled_pred_ms if r.naive_pred_ms and r.tiled_pred_ms else None
            pn = f"{_fmt(r.naive_pred_ms)} {_err(r.naive_pred_ms, r.naive_ms)}"
            pt = f"{_fmt(r.tiled_pred_ms)} {_err(r.tiled_pred_ms, r.tiled_ms)}"
            p1 = f"{_fmt(r.naive_first_pred_ms)} {_err(r.naive_first_pred_ms, r.naive_first_ms)}"
            print(f"{d:>4} {r.seq_len:>6} {_fmt(r.naive_ms):>9} {_fmt(r.tiled_ms):>9} {_fmt(r.ratio, '.2f'):>5} "
                  f"{_fmt(r.ratio_median, '.2f'):>5} {pn:>16} {pt:>16} {_fmt(pr, '.2f'):>10} "
                  f"{_fmt(r.naive_first_ms):>9} {p1:>16} {r.naive_gb:>6.2f} {'yes' if r.naive_fits else 'NO':>4} "
                  f"{os.getloadavg()[0]:5.2f}", flush=True)
            out.append(r)
    if args.csv:
        rows = rows_as_dicts(out)
        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
