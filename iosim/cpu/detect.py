"""Build a CPU profile for this machine: the OS's cache and core facts plus a few seconds of measurements.

Each measured number is a component rate the CPU time model composes (iosim.timing.cpu), measured apart from
attention and at sizes below the ones the model is judged on:

- ``dram.bandwidth``: all cores, a numba ``b = 2 a`` over 256 MB arrays (bytes read + written per second);
- ``dram.bandwidth_one_core``: one NumPy ufunc pass over 256 MB arrays (NumPy's passes run on one core);
- ``dram.first_touch``, ``dram.first_touch_cold``: writing freshly mapped memory minus writing it again (page
  faults and zeroing), on pages recycled from a free just before (repeated calls) and on memory idle for seconds
  (a first call; on a VM that backs guest memory lazily, far slower: :func:`measure_memory`);
- ``compute.numpy_exp_fp32``: NumPy's exp on a 256 KB (L2-resident) array, one core;
- ``compute.gemm``: NumPy matmuls (2048, d) @ (d, 2048) and (2048, 2048) @ (2048, d) (``qk``, ``pv``), and the
  tiled kernel's two GEMMs per tile at its default tiles, one per core in parallel (``tile``);
- ``compute.softmax_fp32``: the tiled kernel's online softmax on L2-resident tiles, all cores;
- ``compute.fp32``/``fp64``: the best BLAS GEMM rate seen (a lower bound of the peak; the clock and FMA width
  are not readable from inside a VM).

Hardware cache counters are not read: ``perf stat`` cache events are "not supported" on the virtual machines
iosim was built on, so cache traffic is simulated, never measured, here.
"""

from __future__ import annotations

import datetime
import platform
import time

import numba as nb
import numpy as np

from iosim.cpu import host, kernels
from iosim.cpu._blas import BLAS, set_num_threads_local
from iosim.hardware.cpu import CpuProfile, cpu_profile_from_dict
from iosim.simulate_cpu import default_tiles

HEAD_DIMS = (64, 128)
_MB = 1 << 20
# seconds after which freed memory counts as idle: on the CI VM (Firecracker, free page reporting) memory freed
# 1.5 s before was already back with the hypervisor (first fill 0.6-0.9 GB/s), 1 s before still recycled (9 GB/s)
IDLE_MEMORY_S = 2.0


def _best(fn, reps: int = 5) -> float:
    """The fastest of ``reps`` timed calls, seconds (after one warm-up call)."""
    fn()
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


@nb.njit(parallel=True, cache=True)
def _scale_all_cores(a, b):
    for i in nb.prange(a.size):
        b[i] = 2.0 * a[i]


@nb.njit(parallel=True, cache=True)
def _tile_gemms(q, k, v, cores, reps, Br, Bc, blas):
    """Each core: reps x (S = Q_i K_jᵀ, O_i += S V_j) over the K/V blocks of a 2048-key head."""
    d = q.shape[1]
    for t in nb.prange(cores):
        if blas:
            set_num_threads_local(1)
        S = np.zeros((Br, Bc), dtype=q.dtype)
        O = np.zeros((Br, d), dtype=q.dtype)
        Q = q[t * Br:(t + 1) * Br]
        for _ in range(reps):
            for c0 in range(0, k.shape[0], Bc):
                kernels._scores(Q, k[c0:c0 + Bc], S, Br, Bc, 0.1, blas)
                kernels._accumulate(S, v[c0:c0 + Bc], O, Br, Bc, blas)


@nb.njit(parallel=True, cache=True)
def _softmax_tiles(S0, cores, reps):
    Br, Bc = S0.shape
    for _core in nb.prange(cores):
        S = S0.copy()
        O = np.zeros((Br, 64), dtype=S0.dtype)
        m = np.full(Br, -np.inf, dtype=S0.dtype)
        l = np.zeros(Br, dtype=S0.dtype)
        e = np.empty(Bc, dtype=np.int32)
        Si, ef = S.view(np.int32), e.view(np.float32)
        for _rep in range(reps):
            kernels.online_softmax(S, Si, Br, Bc, (m, l, O), (e, ef))


def _fill_s(x: np.ndarray, value: float) -> float:
    t = time.perf_counter()
    x.fill(value)
    return time.perf_counter() - t


def _bandwidths(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """bytes/s read + written, b = 2 a: all cores (numba), one core (a NumPy ufunc)."""
    all_cores = 2 * a.nbytes / _best(lambda: _scale_all_cores(a, b))
    return all_cores, 2 * a.nbytes / _best(lambda: np.multiply(a, np.float32(1.0001), out=b))


def measure_memory() -> dict[str, float]:
    """bytes/s: all cores, one core, and the first-touch rates of fresh memory, recycled and cold.

    First touch is a fresh buffer's first fill minus a rewrite of it. ``first_touch_cold``: the first fills of
    two fresh buffers mapped after a pause of ``IDLE_MEMORY_S``, so that no memory freed just before (by this
    process or another) is recycled into them (on a VM with free page reporting, the hypervisor maps them again:
    0.4-1.2 GB/s on the CI VM from one run to the next, at 256 MB as at 4 GB, one thread as two);
    ``first_touch``: the fastest of three buffers each mapped right after the previous one was freed, the pages
    the OS recycles between repeated calls (10-16 GB/s there)."""
    n = 256 * _MB // 4
    time.sleep(IDLE_MEMORY_S)
    a = np.empty(n, dtype=np.float32)
    b = np.empty_like(a)
    cold = _fill_s(a, 1.0) + _fill_s(b, 0.0)
    rewrite = min(_fill_s(a, 1.0) for _ in range(3))
    all_cores, one_core = _bandwidths(a, b)
    del b
    recycled = []
    for _ in range(3):
        x = np.empty(n, dtype=np.float32)  # the pages b or the previous x left
        recycled.append(_fill_s(x, 1.0))
        del x
    return {"all_cores": all_cores, "one_core": one_core,
            "first_touch": a.nbytes / max(min(recycled) - rewrite, 1e-9),
            "first_touch_cold": 2 * a.nbytes / max(cold - 2 * rewrite, 1e-9)}


def _settle() -> None:
    """Let OpenBLAS's worker threads, which spin for a while after a multi-threaded call, go to sleep: a
    measurement started at once would share a core with them."""
    time.sleep(0.3)


def measure_gemms(head_dim: int, l2_bytes: int) -> dict[str, float]:
    """FLOP/s of the tile, qk and pv GEMMs at ``head_dim`` (fp32); the tile pair first, before NumPy's
    multi-threaded BLAS calls leave spinning threads behind."""
    rng = np.random.default_rng(0)
    M = 2048
    q = rng.standard_normal((M, head_dim), dtype=np.float32)
    t = default_tiles(head_dim, 4, l2_bytes)
    cores = nb.get_num_threads()
    qt = rng.standard_normal((cores * t.block_q, head_dim), dtype=np.float32)
    reps = 16
    _settle()
    elapsed = _best(lambda: _tile_gemms(qt, q, q, cores, reps, t.block_q, t.block_kv, BLAS), reps=3)
    out = {"tile": cores * reps * 4 * t.block_q * M * head_dim / elapsed}
    kt = np.ascontiguousarray(q.T)
    s = np.empty((M, M), dtype=np.float32)
    o = np.empty((M, head_dim), dtype=np.float32)
    flops = 2 * M * M * head_dim
    out["qk"] = flops / _best(lambda: np.matmul(q, kt, out=s))
    out["pv"] = flops / _best(lambda: np.matmul(s, q, out=o))
    _settle()
    return out


def measure_softmax(l2_bytes: int) -> float:
    """Elements/s of the tiled kernel's online softmax, all cores, on tiles of the default size (d = 64)."""
    t = default_tiles(64, 4, l2_bytes)
    S0 = np.random.default_rng(1).standard_normal((t.block_q, t.block_kv)).astype(np.float32)
    reps = 200
    return nb.get_num_threads() * reps * S0.size / _best(lambda: _softmax_tiles(S0, nb.get_num_threads(), reps), reps=3)


def measure_numpy_exp() -> float:
    a = np.random.default_rng(2).standard_normal(64 * 1024).astype(np.float32)
    b = np.empty_like(a)
    reps = 50

    def run():
        for _ in range(reps):
            np.exp(a, out=b)

    return reps * a.size / _best(run)


def _sourced(value, what: str, stamp: str) -> dict:
    return {"value": value, "source": f"measured on this machine by iosim profiles detect ({stamp}): {what}"}


def _busy_note(busy: list[float | None]) -> str:
    """A warning for the profile's notes where other processes kept the CPUs busy around a measurement."""
    worst = max((b for b in busy if b is not None), default=0.0)
    return "" if worst <= 0.15 else (f"; CPUs up to {worst:.0%} busy with other processes around the measurements: "
                                     "the rates may be low, detect again on a quiet machine")


def detect_profile(name: str = "this-machine") -> CpuProfile:
    """A CpuProfile of this machine: sysfs/proc facts and a few seconds of measurements (module docstring)."""
    stamp = datetime.date.today().isoformat()
    busy = [host.wait_for_idle(timeout_s=60.0)]  # other processes' bursts would lower every rate
    caches = {c.level: c for c in host.host_caches()}
    tpc = host.threads_per_core()
    cores = max(1, host.usable_cpus() // tpc)
    l2 = caches["l2"].size if "l2" in caches else host.FALLBACK_L2_BYTES
    gemms = {}
    for d in HEAD_DIMS:  # each measurement waits for quiet CPUs again: a job started meanwhile halves the rates
        gemms[d] = measure_gemms(d, l2)
        busy.append(host.wait_for_idle(timeout_s=30.0))
    softmax = measure_softmax(l2)
    busy.append(host.wait_for_idle(timeout_s=30.0))
    mem = measure_memory()
    best = max(r for g in gemms.values() for r in g.values())
    x = np.ones((1024, 1024))
    fp64 = 2 * 1024**3 / _best(lambda: x @ x, reps=3)
    sysfs = "Linux sysfs /sys/devices/system/cpu/cpu0/cache"
    levels = []
    for lvl in ("l1d", "l2", "l3"):
        c = caches.get(lvl)
        if c is None:
            raise RuntimeError(f"detect: sysfs lists no {lvl} cache for cpu0; write this machine's profile by hand")
        levels.append({"level": lvl, "capacity": {"value": c.size, "source": f"{sysfs}: size of one instance"},
                       "line_size": {"value": c.line_size, "source": f"{sysfs}: coherency_line_size"},
                       "shared_by": {"value": max(1, c.shared_by_cpus // tpc),
                                     "source": f"{sysfs}: shared_cpu_list / threads per core"}})
    gemm = [{"kind": kind, "head_dim": d, "value": rate,
             "source": f"measured by iosim profiles detect ({stamp}), iosim.cpu.detect.measure_gemms"}
            for d, g in gemms.items() for kind, rate in g.items()]
    data = {
        "name": name, "display_name": f"{host.model_name()} ({cores} cores, {platform.node()})",
        "vendor": host.model_name().split()[0], "kind": "cpu",
        "notes": f"built by iosim profiles detect on {stamp}; BLAS: {'NumPy OpenBLAS' if BLAS else 'loops'}"
                 + _busy_note(busy),
        "cores": {"value": cores, "source": "os.sched_getaffinity / sysfs thread_siblings_list"},
        "threads_per_core": {"value": tpc, "source": "sysfs topology/thread_siblings_list"},
        "clock": {"value": None, "source": "not readable inside this VM; the FLOP rates are measured instead"},
        "caches": levels,
        "dram": {"capacity": {"value": host.total_memory(), "source": "/proc/meminfo MemTotal"},
                 "bandwidth": _sourced(mem["all_cores"], "numba b = 2a, 256 MB fp32, all cores", stamp),
                 "bandwidth_one_core": _sourced(mem["one_core"], "NumPy multiply, 256 MB fp32, one core", stamp),
                 "first_touch": _sourced(mem["first_touch"], "fill 256 MB mapped right after a free of "
                                         "256 MB, minus a rewrite", stamp),
                 "first_touch_cold": _sourced(mem["first_touch_cold"], "first fills of two fresh 256 MB buffers "
                                              "after a 2 s pause, minus rewrites", stamp)},
        "compute": {
            "fp32": _sourced(best, "best BLAS sgemm rate seen (a lower bound of the peak)", stamp),
            "fp64": _sourced(fp64, "NumPy dgemm 1024^3 (a lower bound of the peak)", stamp),
            "gemm": gemm,
            "softmax_fp32": _sourced(softmax, "iosim.cpu online softmax, L2-resident tiles, all cores",
                                     stamp),
            "numpy_exp_fp32": _sourced(measure_numpy_exp(), "NumPy exp, 256 KB fp32, one core", stamp),
        },
    }
    return cpu_profile_from_dict(data, "detected profile")
