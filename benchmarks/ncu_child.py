"""Nsight Compute over a benchmark's child process: each profiled kernel's metrics, in launch order.

The child (the benchmark script itself with its own ``--child ...`` arguments) runs its warm-up outside the profiled
range and its measured calls inside ``cudaProfilerStart/Stop``; ncu runs with ``--profile-from-start off``, clocks
untouched (``--clock-control none``) and L2 flushed before every kernel (``--cache-control all``), as the records do.
"""

from __future__ import annotations

import csv
import os
import subprocess
import sys


def kernel_metrics(script: str, child_args: list[str], metrics: tuple[str, ...]) -> list[dict]:
    """[{"name": the kernel's name, metric: value (int), ...}] of every kernel ``script child_args`` profiled."""
    cmd = ["ncu", "--clock-control", "none", "--cache-control", "all", "--profile-from-start", "off", "--csv",
           "--print-units", "base", "--metrics", ",".join(metrics), sys.executable, script, *child_args]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=os.environ | {"PYTHONDONTWRITEBYTECODE": "1"})
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith('"')]
    if proc.returncode or not lines:
        raise RuntimeError(f"ncu failed ({proc.returncode}): {proc.stderr[-600:]}")
    kernels: dict[str, dict] = {}
    for r in csv.DictReader(lines):
        k = kernels.setdefault(r["ID"], {"name": r["Kernel Name"]})
        k[r["Metric Name"]] = int(float(r["Metric Value"].replace(",", "")))
    return [kernels[i] for i in sorted(kernels, key=int)]
