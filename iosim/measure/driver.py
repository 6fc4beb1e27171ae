"""Measure runs under Nsight Compute, and time them with CUDA events.

Conditions: ``ncu --clock-control none`` and the default ``--cache-control all`` (L2 flushed before each kernel,
the L2 model's conditions). The DRAM bytes come from a profile of their own that collects nothing else, so ncu
runs each kernel once (one pass): with the other counters in the same profile ncu replays the kernel and restores
the memory it wrote between replays, and the pass that counts DRAM then starts with about 2.4 MB of dirty lines in
L2 that are not the kernel's (docs/validation.md). The replayed profile's DRAM bytes are kept as
``dram_*_bytes_replayed``. Time for throughput is taken outside the profiler (CUDA events, warm-up, median).
"""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..gpu._cupy import GPUUnavailableError, require_cupy
from . import ncu as N
from .runs import MeasureError, Run
from .worker import write_spec

_PACKAGE_ROOT = Path(__file__).resolve().parent.parent.parent  # the folder holding iosim/


@dataclass
class Options:
    """How to measure: ``ncu`` the executable (found if None); ``timing``: a CUDA-event pass too (``reps`` calls);
    ``workdir`` for the worker's files (a temporary folder if None); ``metrics`` (chosen from what the GPU lists if
    None); ``keep_csv``: a path to keep ncu's raw CSV at; ``timeout`` seconds per worker."""

    ncu: str | None = None
    timing: bool = True
    reps: int = 10
    workdir: str | None = None
    cache_control: str = "all"
    metrics: list[str] | None = None
    keep_csv: str | None = None
    timeout: float | None = None


@dataclass
class Record:
    """What one call of :func:`measure` measured: the device, the counters, ncu's commands, one entry per run
    (``run``: its description; ``kernels``: per launch; ``measured``: summed over the call's launches;
    ``time_ms``; ``error`` where it failed)."""

    device: dict
    metrics: list[str]
    ncu_command: str
    dram_command: str
    entries: list[dict] = field(default_factory=list)

    def to_json(self) -> dict:
        return asdict(self)


def require_gpu() -> None:
    try:
        require_cupy()
    except GPUUnavailableError as exc:
        raise MeasureError(str(exc)) from None


def _worker_env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(_PACKAGE_ROOT), env.get("PYTHONPATH", "")])
    return env


def _run_worker(prefix: list[str], runs: list[Run], mode: str, workdir: Path, opts: Options) -> dict:
    spec, out = workdir / f"spec_{mode}.json", workdir / f"out_{mode}.json"
    write_spec(spec, runs, mode, opts.reps)
    cmd = [*prefix, sys.executable, "-m", "iosim.measure.worker", str(spec), str(out)]
    p = subprocess.run(cmd, capture_output=True, text=True, env=_worker_env(), timeout=opts.timeout)
    if not out.exists():
        tail = (p.stdout + p.stderr)[-2000:]
        if "ERR_NVGPUCTRPERM" in tail:
            N.parse_ncu_csv(tail)
        raise MeasureError(f"the measurement worker failed (exit {p.returncode}): {tail.strip()}")
    return json.loads(out.read_text())


def _profile(ncu: str, args: list[str], runs: list[Run], wd: Path, tag: str, opts: Options):
    """One run of the worker under ncu with ``args``: (the worker's records, ncu's launches, command, log)."""
    log = wd / f"ncu_{tag}.csv"
    prefix = [ncu, *args, "-k", f"regex:{N.KERNEL_REGEX}", "--log-file", str(log)]
    sub = wd / tag
    sub.mkdir(parents=True, exist_ok=True)
    prof = _run_worker(prefix, runs, "profile", sub, opts)
    text = log.read_text(errors="replace") if log.exists() else ""
    launches = N.parse_ncu_csv(text)
    if not launches:
        raise MeasureError(f"ncu profiled no kernel (log {log}): {text[-1500:]}")
    return prof, N.group_by_marker(launches), " ".join([*prefix[:-2], "--log-file", log.name]), text


def use_dram_pass(entry: dict, counters: list[dict], dram: list[dict]) -> None:
    """Put the one-pass profile's DRAM bytes into ``entry`` (per kernel and summed); the replayed profile's stay as
    ``dram_*_bytes_replayed``. The two profiles must have seen the same kernels, else ``entry`` gets an error."""
    names = [k["kernel"] for k in counters], [k["kernel"] for k in dram]
    if names[0] != names[1]:
        entry.setdefault("error", f"MeasureError: the DRAM profile saw other kernels ({names[1]}) than {names[0]}")
        return
    for rec, k in zip(entry["kernels"], dram):
        m = N.summarize(k)
        for key in ("dram_read_bytes", "dram_write_bytes"):
            rec[key + "_replayed"] = rec[key]
            rec[key] = m[key]
    total = entry["measured"]
    for key in ("dram_read_bytes", "dram_write_bytes"):
        total[key + "_replayed"] = total.get(key)
        vals = [r[key] for r in entry["kernels"]]
        total[key] = sum(vals) if vals and all(isinstance(v, int) for v in vals) else None


def _entry(rec: dict, launches: list[dict], dram: list[dict]) -> dict:
    entry = dict(rec)
    entry["kernels"] = [{"kernel": k["kernel"], "grid": k["grid"], "block": k["block"], **N.summarize(k)}
                        for k in launches]
    entry["measured"] = N.sum_launches(launches)
    use_dram_pass(entry, launches, dram)
    return entry


def measure(runs: list[Run], opts: Options | None = None) -> Record:
    """Profile every run under ncu (once for the counters, once for DRAM bytes alone), then time it with CUDA events
    (``opts.timing``). Repeated launches of one problem: put its run in the list several times."""
    opts = opts or Options()
    require_gpu()
    ncu = N.find_ncu(opts.ncu)
    wd = Path(opts.workdir or tempfile.mkdtemp(prefix="iosim-measure-"))
    wd.mkdir(parents=True, exist_ok=True)
    mets = opts.metrics or N.choose_metrics(N.available_metrics(ncu))
    common = ["--clock-control", "none", "--cache-control", opts.cache_control, "--csv", "--print-units", "base"]
    args = [*common, "--section", "LaunchStats", "--section", "Occupancy", "--metrics", ",".join(mets)]
    prof, groups, command, text = _profile(ncu, args, runs, wd, "counters", opts)
    _, dram_groups, dram_command, dram_text = _profile(ncu, [*common, "--metrics", ",".join(N.DRAM_METRICS)],
                                                       runs, wd, "dram", opts)
    if opts.keep_csv:
        Path(opts.keep_csv).write_text(text + dram_text)
    times = _run_worker([], runs, "time", wd, opts)["results"] if opts.timing else None
    record = Record(prof["device"], mets, command, dram_command)
    for i, rec in enumerate(prof["results"]):
        entry = _entry(rec, groups.get(i, []), dram_groups.get(i, []))
        if times is not None:
            entry["time_ms"] = times[i].get("time_ms")
            if "error" in times[i]:
                entry.setdefault("error", times[i]["error"])
        record.entries.append(entry)
    return record


CSV_FIELDS = ("kind", "batch", "heads", "kv_heads", "seq_len", "kv_len", "head_dim", "dtype", "causal", "block_q",
              "block_kv", "nbytes", "read_bytes", "kernels", "dram_read_bytes", "dram_write_bytes", "l2_read_bytes",
              "l2_write_bytes", "sass_global_ld_bytes", "sass_global_st_bytes", "smem_ld_wavefronts", "duration_ns",
              "time_ms", "error")


def to_csv(record: Record) -> str:
    """One row per run: its description, the measured counters summed over its kernels, time, error."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=CSV_FIELDS, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    for e in record.entries:
        run = {k: v for k, v in e["run"].items() if k != "read_bytes"}
        row = {**run, **(e.get("measured") or {}), "read_bytes": e["run"].get("read_bytes", e.get("read_bytes")),
               "time_ms": e.get("time_ms"), "error": e.get("error", "")}
        row["kernels"] = ";".join(k["kernel"].split("(")[0] for k in e.get("kernels", []))
        w.writerow(row)
    return buf.getvalue()
