"""How long `iosim simulate --no-l2` takes, with the time model, from the shell prompt to the answer.

    python benchmarks/bench_simulate.py [--n 4096 16384 32768] [--reps 3]

Wall time of the whole command (interpreter start, imports, simulation, printing), the median of --reps runs, for
each forward schedule on the H100 profile (32 heads, d = 128, fp16), and the simulation alone in-process
(``iosim.simulate``), beside issue 17's goal of under 1 s for N <= 32768. Runs anywhere; no GPU.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

SCHEDULES = ("naive", "flash1", "flash2", "flash3", "flash-decoding", "block-sparse")
GOAL_S = 1.0


def _cli_s(schedule: str, n: int, reps: int) -> float:
    cmd = [sys.executable, "-m", "iosim", "simulate", schedule, "--seq-len", str(n), "--heads", "32",
           "--profile", "h100-sxm5-80gb", "--no-l2"]
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def _call_s(schedule: str, n: int, reps: int) -> float:
    from iosim import AttentionProblem, simulate

    p = AttentionProblem(seq_len=n, heads=32)
    simulate(schedule, p, "h100-sxm5-80gb", l2=False)  # first call: profile and kernel description parsed
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        simulate(schedule, p, "h100-sxm5-80gb", l2=False)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, nargs="+", default=[4096, 16384, 32768])
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args(argv)
    rows = [(s, n, _cli_s(s, n, args.reps), _call_s(s, n, args.reps)) for s in SCHEDULES for n in args.n]
    print(f"\n`iosim simulate SCHEDULE --seq-len N --heads 32 --no-l2` (H100 profile), median of {args.reps}\n")
    print("| schedule | N | command (s) | simulate() alone (s) | goal (s) | command ÷ goal |")
    print("|---|---|---|---|---|---|")
    for s, n, cli, call in rows:
        print(f"| {s} | {n} | {cli:.2f} | {call:.4f} | {GOAL_S:.1f} | {cli / GOAL_S:.2f} |")
    worst = max(rows, key=lambda r: r[2])
    print(f"\nslowest: {worst[0]} at N = {worst[1]}, {worst[2]:.2f} s (goal < {GOAL_S:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
