"""What the OS says about this machine's CPU (sysfs, /proc): caches, cores, model name, memory. No measuring."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from functools import cache
from pathlib import Path

SYSFS_CPU = Path("/sys/devices/system/cpu")
FALLBACK_L2_BYTES = 1 << 20  # where sysfs is unreadable (not Linux): 1 MiB, a common per-core L2


@dataclass(frozen=True)
class HostCache:
    level: str  # "l1d", "l2", "l3"
    size: int  # bytes of one instance
    line_size: int
    shared_by_cpus: int  # logical CPUs that share one instance


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)


def _count_cpus(cpu_list: str) -> int:
    n = 0
    for part in cpu_list.split(","):
        lo, _, hi = part.partition("-")
        n += int(hi) - int(lo) + 1 if hi else 1
    return n


@cache
def host_caches(cpu: int = 0) -> tuple[HostCache, ...]:
    """Data and unified caches of ``cpu`` from sysfs, innermost first (empty where sysfs has none)."""
    out = []
    for idx in sorted((SYSFS_CPU / f"cpu{cpu}" / "cache").glob("index*")):
        kind, level, size = (_read(idx / f) for f in ("type", "level", "size"))
        if kind not in ("Data", "Unified") or not level or not size:
            continue
        name = "l1d" if level == "1" else f"l{level}"
        line = _read(idx / "coherency_line_size") or "64"
        shared = _read(idx / "shared_cpu_list") or str(cpu)
        out.append(HostCache(name, _size(size), int(line), _count_cpus(shared)))
    return tuple(out)


def host_l2_bytes() -> int:
    """This machine's L2 per instance in bytes (FALLBACK_L2_BYTES where sysfs does not say)."""
    for c in host_caches():
        if c.level == "l2":
            return c.size
    return FALLBACK_L2_BYTES


def threads_per_core(cpu: int = 0) -> int:
    sib = _read(SYSFS_CPU / f"cpu{cpu}" / "topology" / "thread_siblings_list")
    return _count_cpus(sib) if sib else 1


def usable_cpus() -> int:
    """Logical CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def model_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def total_memory() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def busy_fraction(window_s: float = 0.5) -> float | None:
    """Share of all CPUs' time spent busy over the next ``window_s`` (/proc/stat; None off Linux)."""
    def read():
        with open("/proc/stat") as f:
            vals = [int(x) for x in f.readline().split()[1:]]
        return vals[3] + vals[4], sum(vals)  # idle + iowait, total

    try:
        i0, t0 = read()
        time.sleep(window_s)
        i1, t1 = read()
    except OSError:
        return None
    return 1.0 - (i1 - i0) / max(1, t1 - t0)


def wait_for_idle(max_busy: float = 0.15, timeout_s: float = 120.0) -> float | None:
    """Wait (up to ``timeout_s``) until other processes keep the CPUs less than ``max_busy`` busy; returns the
    last busy fraction seen. On a shared machine this keeps other jobs' bursts out of the timings."""
    deadline = time.monotonic() + timeout_s
    busy = busy_fraction()
    while busy is not None and busy > max_busy and time.monotonic() < deadline:
        busy = busy_fraction()
    return busy
