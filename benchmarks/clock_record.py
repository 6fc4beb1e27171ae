"""The clock record: every call's time over long runs of back-to-back calls from rest, beside the time model's
clocks under the board's power limiter (:mod:`iosim.timing.clock`).

    python benchmarks/clock_record.py --measure --device h100 [--out DIR]   # on the GPU (~1 min)
    python benchmarks/clock_record.py --device h100                        # anywhere: predict and judge

``--measure`` runs each call of :func:`shapes` (long, tensor-bound forward and backward calls of cuDNN, torch's FA2,
iosim's flash2 and flash3) back to back for RUN_S after REST_S of rest, CUDA events around every call, and writes
``data/validation/<device>-clock.json``: each call's milliseconds and its start in the run.

Without ``--measure`` it reads that JSON and compares three parts of each run with the model's runs: the calls that
start in the first START_S (``run="single"``: the clock before the limiter acts), the median of calls 3-22 (what the
time records measure, ``run="record"``) and the calls from STEADY_S on (``run="steady"``), each as the median call;
it prints |predicted - measured| / measured per part and the predicted clocks.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from time_judge import simulate_row  # beside this file
from time_record import PROFILE, ROOT, Shape, device_header

REST_S, RUN_S = 2.0, 4.0  # rest before a run; its length
START_S = 0.04  # calls starting this early run before the limiter acts (it acts after 45-70 ms)
STEADY_S = 1.2  # calls starting this late run under the board's averaged limit (it acts after 0.8-0.9 s)
RECORD = slice(2, 22)  # the time records' 20 calls after 2 warm-up calls


def shapes() -> list[tuple[str, Shape]]:
    """(kernel, shape): long calls, tensor-bound, d 64 and 128, forward and backward."""
    big, wide = Shape(1, 32, 32, 32768, 32768, 128, "bf16", True), Shape(1, 16, 16, 65536, 65536, 64)
    bwd = Shape(1, 16, 16, 16384, 16384, 128, "bf16", True)
    return [("cudnn", big), ("fa3", big), ("iosim-flash2", big), ("fa2", wide), ("cudnn", wide),
            ("cudnn-bwd", bwd), ("iosim-flash3-bwd", bwd)]


def _call(kernel: str, s: Shape):
    import torch

    if kernel.endswith("-bwd"):
        from time_record_backward import _callables as backward
        from time_record_backward import _gqa_inputs

        return backward(s, _gqa_inputs(torch, s, torch.bfloat16))[kernel]
    from time_record import _callables as forward

    mk = lambda n, h: torch.randn(s.batch, n, h, s.head_dim, device="cuda", dtype=torch.bfloat16)  # noqa: E731
    return forward(s, (mk(s.seq_len, s.heads), mk(s.kv_len, s.kv_heads), mk(s.kv_len, s.kv_heads)))[kernel]


def run(fn) -> tuple[list[float], list[float]]:
    """(ms of each call, seconds from the run's start to each call's start) of back-to-back calls for RUN_S after
    REST_S of rest; the host waits for the GPU every 4 calls, never more than a few calls ahead."""
    import torch

    fn()
    torch.cuda.synchronize()
    time.sleep(REST_S)
    events, t0 = [], time.perf_counter()
    while time.perf_counter() - t0 < RUN_S:
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        events.append((a, b))
        if len(events) % 4 == 0:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    ms = [a.elapsed_time(b) for a, b in events]
    starts = [events[0][0].elapsed_time(a) / 1e3 for a, _ in events]
    return ms, starts


def measure(device: str) -> dict:
    import torch

    rows = []
    for kernel, s in shapes():
        fn = _call(kernel, s)
        if isinstance(fn, Exception):
            print(f"{kernel:<17} {s.key:<34} refused: {fn}", flush=True)
            continue
        ms, starts = run(fn)
        rows.append({**s.__dict__, "kernel": kernel, "ms": ms, "starts": starts})
        print(f"{kernel:<17} {s.key:<34} {len(ms):4d} calls: first {ms[0]:.3f} ms, calls 3-22 "
              f"{statistics.median(ms[RECORD]):.3f}, from {STEADY_S} s {statistics.median(_late(rows[-1])):.3f}",
              flush=True)
        del fn
        torch.cuda.empty_cache()
    return {**device_header(device, 0), "rest_s": REST_S, "run_s": RUN_S, "rows": rows}


def _early(row: dict) -> list[float]:
    return [m for m, t in zip(row["ms"], row["starts"], strict=True) if t < START_S] or row["ms"][:1]


def _late(row: dict) -> list[float]:
    return [m for m, t in zip(row["ms"], row["starts"], strict=True) if t >= STEADY_S]


def judge(data: dict, profile: str) -> int:
    print(f"{'kernel':<17} {'shape':<34} {'part':<7} {'measured':>9} {'predicted':>9} {'err':>7}  clocks (GHz)")
    errs: dict[str, list[float]] = {}
    for row in data["rows"]:
        key = Shape(**{k: row[k] for k in Shape.__dataclass_fields__}).key
        for part, measured in (("single", _early(row)), ("record", row["ms"][RECORD]), ("steady", _late(row))):
            r = simulate_row({**row, "measured_ms": None}, profile, run=part)
            got, pred = statistics.median(measured), r.time.predicted_s * 1e3
            errs.setdefault(part, []).append(pred / got - 1)
            c = r.time.clock
            clocks = f"{c.start_hz / 1e9:.3f} / {c.fast_hz / 1e9:.3f} / {c.steady_hz / 1e9:.3f}" if c else "none"
            print(f"{row['kernel']:<17} {key:<34} {part:<7} {got:9.3f} {pred:9.3f} {pred / got - 1:+7.1%}  {clocks}")
    print(f"\n{data['device']} (measured at {data['commit'][:7]}), profile {profile}: |error| median / worst")
    for part, e in errs.items():
        print(f"  {part:<7} {statistics.median(abs(x) for x in e):6.1%} / {max(abs(x) for x in e):6.1%}  "
              f"({len(e)} runs)")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", required=True, choices=sorted(PROFILE))
    ap.add_argument("--measure", action="store_true", help="measure the runs on this GPU first")
    ap.add_argument("--out", type=Path, default=ROOT / "data" / "validation", help="folder of the JSON")
    ap.add_argument("--profile", default=None, help="profile to judge with [default: the device's built-in]")
    args = ap.parse_args(argv)
    path = args.out / f"{args.device}-clock.json"
    if args.measure:
        args.out.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(measure(args.device)) + "\n")
        print(f"wrote {path}")
    if not path.exists():
        sys.exit(f"{path} not found: measure it on the GPU first (--measure)")
    return judge(json.loads(path.read_text()), args.profile or PROFILE[args.device])


if __name__ == "__main__":
    sys.exit(main())
