"""Measure attention kernels on the GPU with Nsight Compute (``ncu``), and time them with CUDA events.

    >>> from iosim.measure import Config, measure
    >>> run = measure([Config("flash2", seq_len=4096, heads=32, head_dim=128)])   # needs a GPU and ncu
    >>> run.configs[0]["measured"]["dram_read_bytes"]

What is measured, per kernel launch (and summed over the kernels of one call):

====================  ====================================================  ================================
quantity              metric                                                boundary (DESIGN.md section 3)
====================  ====================================================  ================================
DRAM bytes read       ``dram__bytes_read.sum``                              ``hbm`` read
DRAM bytes written    ``dram__bytes_write.sum``                             ``hbm`` write
SM->L2 bytes read     ``lts__t_sectors_srcunit_tex_op_read.sum`` x 32 B     ``global`` read
SM->L2 bytes written  ``lts__t_sectors_srcunit_tex_op_write.sum`` x 32 B    ``global`` write
L2 traffic, all       ``lts__t_bytes.sum`` (fills, write-backs, ... too)    (not a boundary: reported only)
shared-memory         ``l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld``  ``sram`` (wavefronts, not bytes)
                      / ``_op_st`` ``.sum``, ``smsp__inst_executed_op_ldsm``
duration              ``gpu__time_duration.sum``
launch                ``launch__registers_per_thread``, ``launch__occupancy_limit_*``, grid, block, shared memory
====================  ====================================================  ================================

Why the ``srcunit_tex`` sectors: a plain copy kernel moving B bytes must read B and write B bytes from L2 at the SM
boundary; ``lts__t_bytes`` also counts the L2's own fills from DRAM and write-backs, so it reads more (the
``copy`` config measures both; docs/validation.md has the numbers).

Conditions: ``ncu --clock-control none`` and the default ``--cache-control all`` (L2 flushed before each kernel,
the L2 model's conditions). The DRAM bytes come from a profile of their own that collects nothing else, so ncu
runs each kernel once (one pass): with the other counters in the same profile, ncu replays the kernel several
times and restores the memory it wrote between replays, and the pass that counts DRAM then starts with about
2.4 MB of dirty lines in L2 that are not the kernel's (docs/validation.md, "Dirty lines at the start"). The
replayed profile's DRAM bytes are kept as ``dram_*_bytes_replayed``. Throughput time is taken outside the profiler
with CUDA events (warm-up, repeats, median). Each config's kernels are found by a marker kernel launched before
them (``iosim_marker`` with grid = config index + 1), so kernels of third-party libraries (torch SDPA's flash or
cuDNN backend) are attributed to their config whatever their number.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

SECTOR = 32

CORE_METRICS = (  # present on GH100 (ncu 2025.3.1 --query-metrics), see ../shared/research/kernels.md 4.1
    "dram__bytes_read.sum",
    "dram__bytes_write.sum",
    "lts__t_bytes.sum",
    "lts__t_sectors_srcunit_tex_op_read.sum",
    "gpu__time_duration.sum",
    "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum",
)
OPTIONAL_METRICS = (  # used where ``ncu --query-metrics`` lists them
    "lts__t_sectors_srcunit_tex_op_write.sum",
    # what the SMs' L1TEX units send to / receive from the memory system (before the L2 request coalescer, LRC,
    # that merges identical reads of different SMs on Hopper)
    "l1tex__m_xbar2l1tex_read_bytes.sum",
    "l1tex__m_l1tex2xbar_write_bytes.sum",
    "smsp__sass_data_bytes_mem_global_op_ld.sum",
    "smsp__sass_data_bytes_mem_global_op_ldgsts.sum",
    "smsp__sass_data_bytes_mem_global_op_st.sum",
    "lrc__t_sectors.sum",
    "lrc__t_requests.sum",
    "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum",
    "smsp__inst_executed_op_ldsm.sum",
    "launch__registers_per_thread",
    "launch__shared_mem_per_block_dynamic",
    "launch__shared_mem_per_block_static",
    "launch__occupancy_limit_registers",
    "launch__occupancy_limit_shared_mem",
    "launch__occupancy_limit_warps",
    "launch__occupancy_limit_blocks",
    "launch__grid_size",
    "launch__block_size",
)
DRAM_METRICS = ("dram__bytes_read.sum", "dram__bytes_write.sum", "gpu__time_duration.sum")  # one pass
KERNEL_REGEX = r"iosim_|flash_fwd|naive_|sdpa|fprop|fmha"
KINDS = ("flash2", "naive", "sdpa-flash", "sdpa-cudnn", "copy", "l2probe", "l2bw", "l2write", "l2reuse")


class MeasureError(RuntimeError):
    """Measurement cannot run (no GPU, no ncu, counters not permitted, ncu failed); the message says which."""


@dataclass
class Config:
    """One measured call: ``kind`` is a schedule of ours (flash2, naive), a torch SDPA backend (sdpa-flash,
    sdpa-cudnn), or a probe (copy: a float4 copy of ``nbytes``; l2probe: read ``nbytes`` twice, by a grid of
    ``blocks_per_sm`` blocks per SM of ``threads`` threads (8 x 256 unless given); l2bw: L2 read
    bandwidth over ``nbytes``; l2write: write ``nbytes`` (dirty lines), then, after a grid barrier and
    ``spin_us`` of idling, read ``read_bytes`` of other data, each line by one SM or, ``read_shared``, by every
    SM: the DRAM writes are the dirty bytes the reads pushed out of L2; with ``interleave``, no barrier: each
    thread reads its next 16 B of the read buffer and writes its next 16 B of the written one in the same step, as
    flash2's blocks read Q and write O side by side, until both are done; each line read by one SM; with
    ``read_written``, phase 2 reads back the ``nbytes`` just written, each thread what it wrote: the DRAM reads are
    the written lines L2 no longer holds; l2reuse: read ``nbytes`` ``hot_reps`` times (each line by one SM, by
    the ``read_group`` SMs of its group, or, ``read_shared``, by every SM), then ``read_bytes`` of other data once
    (each line by one SM) and ``spin_us`` of idling, then ``nbytes`` once more, with a grid barrier between the
    phases: the DRAM reads past the compulsory ones are the first buffer's lines L2 dropped, which tells whether
    lines read more often, or by more SMs, stay longer)."""

    kind: str
    seq_len: int = 1024
    heads: int = 1
    kv_heads: int | None = None
    batch: int = 1
    kv_len: int | None = None
    head_dim: int = 128
    dtype: str = "fp16"
    causal: bool = False
    block_q: int | None = None
    block_kv: int | None = None
    nbytes: int = 0
    read_bytes: int = 0
    read_shared: bool = False
    spin_us: int = 0
    interleave: bool = False
    read_written: bool = False
    hot_reps: int = 1
    read_group: int = 1
    blocks_per_sm: int = 8
    threads: int = 256

    def __post_init__(self):
        if self.kind not in KINDS:
            raise MeasureError(f"kind={self.kind!r}: expected one of {', '.join(KINDS)}")
        if self.dtype not in ("fp16", "bf16"):
            raise MeasureError(f"dtype={self.dtype!r}: expected fp16 or bf16 (the GPU kernels' dtypes)")
        if self.kv_heads is None:
            self.kv_heads = self.heads
        if self.kv_len is None:
            self.kv_len = self.seq_len
        if self.interleave and (self.kind != "l2write" or self.read_shared or self.spin_us):
            raise MeasureError("interleave: an l2write probe of private reads without idling (no read_shared, spin_us)")
        if self.read_written and (
            self.kind != "l2write" or self.read_shared or self.interleave or self.read_bytes or self.spin_us
        ):
            raise MeasureError(
                "read_written: an l2write probe that reads back its own nbytes (no read_bytes, read_shared, "
                "interleave, spin_us)"
            )
        if self.kind == "l2reuse" and (self.nbytes <= 0 or self.hot_reps < 1 or self.spin_us < 0):
            raise MeasureError("l2reuse: nbytes > 0 read hot_reps >= 1 times, then read_bytes, spin_us >= 0")
        if (self.blocks_per_sm, self.threads) != (8, 256) and (
            self.kind != "l2probe" or self.blocks_per_sm < 1 or self.threads not in (32, 64, 128, 256, 512, 1024)
        ):
            raise MeasureError(
                f"blocks_per_sm={self.blocks_per_sm}, threads={self.threads}: the l2probe's grid only "
                "(>= 1 block per SM; 32-1024 threads, a power of two)"
            )
        if self.read_group != 1 and (self.kind != "l2reuse" or self.read_shared or self.read_group < 1):
            raise MeasureError(
                f"read_group={self.read_group}: an l2reuse probe's buffer read by groups of that many SMs "
                "(>= 1, a divisor of the SM count; not with read_shared, which is every SM)"
            )
        if self.kind != "l2reuse" and self.hot_reps != 1:
            raise MeasureError(f"hot_reps={self.hot_reps}: only the l2reuse probe reads its buffer more than once")


# ----------------------------------------------------------------------------------------------------------------
# parsing ncu's CSV


def _number(s: str):
    s = s.strip().replace(",", "")
    if s in ("", "n/a", "N/A"):
        return None
    try:
        return int(s)
    except ValueError:
        try:
            return float(s)
        except ValueError:
            return s


def parse_ncu_csv(text: str) -> list[dict]:
    """Kernel launches from ``ncu --csv --print-units base`` (the details page with ``--metrics``).

    Returns one dict per launch, in profiling order: ``id``, ``kernel`` (full demangled name), ``grid``, ``block``
    (strings as ncu prints them) and ``metrics`` {name: number}. Lines ncu prints around the table (``==PROF==``
    and the program's own output) are skipped."""
    if "ERR_NVGPUCTRPERM" in text:
        raise MeasureError(
            "ncu: the user may not read the GPU performance counters (ERR_NVGPUCTRPERM); run as "
            "root or set NVreg_RestrictProfilingToAdminUsers=0 (NVIDIA: ERR_NVGPUCTRPERM)"
        )
    lines = text.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith('"ID"')), None)
    if start is None:
        errors = [ln for ln in lines if "==ERROR==" in ln]
        if errors:
            raise MeasureError("ncu: " + " | ".join(e.replace("==ERROR==", "").strip() for e in errors[:3]))
        return []
    body = [ln for ln in lines[start:] if ln.startswith('"')]
    rows = list(csv.DictReader(io.StringIO("\n".join(body))))
    launches: dict[int, dict] = {}
    for r in rows:
        try:
            kid = int(r["ID"])
        except (KeyError, ValueError):
            continue
        k = launches.setdefault(
            kid,
            {
                "id": kid,
                "kernel": r.get("Kernel Name", ""),
                "grid": r.get("Grid Size", ""),
                "block": r.get("Block Size", ""),
                "metrics": {},
                "units": {},
            },
        )
        name = r.get("Metric Name")
        if name:
            k["metrics"][name] = _number(r.get("Metric Value", ""))
            k["units"][name] = r.get("Metric Unit", "")
    return [launches[i] for i in sorted(launches)]


def _grid_count(grid: str) -> int:
    nums = [int(x) for x in re.findall(r"\d+", grid or "")]
    out = 1
    for x in nums:
        out *= x
    return out if nums else 0


def summarize(launch: dict) -> dict:
    """Bytes at each boundary of one launch (None where the metric was not collected)."""
    m = launch["metrics"]

    def get(name, scale=1):
        v = m.get(name)
        return round(v * scale) if isinstance(v, (int, float)) else None

    return {
        "dram_read_bytes": get("dram__bytes_read.sum"),
        "dram_write_bytes": get("dram__bytes_write.sum"),
        "l2_read_bytes": get("lts__t_sectors_srcunit_tex_op_read.sum", SECTOR),
        "l2_write_bytes": get("lts__t_sectors_srcunit_tex_op_write.sum", SECTOR),
        "lts_t_bytes": get("lts__t_bytes.sum"),
        "xbar_read_bytes": get("l1tex__m_xbar2l1tex_read_bytes.sum"),
        "xbar_write_bytes": get("l1tex__m_l1tex2xbar_write_bytes.sum"),
        "sass_global_ld_bytes": get("smsp__sass_data_bytes_mem_global_op_ld.sum"),
        "sass_global_ldgsts_bytes": get("smsp__sass_data_bytes_mem_global_op_ldgsts.sum"),
        "sass_global_st_bytes": get("smsp__sass_data_bytes_mem_global_op_st.sum"),
        "lrc_sectors": get("lrc__t_sectors.sum"),
        "smem_ld_wavefronts": get("l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum"),
        "smem_st_wavefronts": get("l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum"),
        "ldsm_instructions": get("smsp__inst_executed_op_ldsm.sum"),
        "duration_ns": get("gpu__time_duration.sum"),
        "registers_per_thread": get("launch__registers_per_thread") or get("Registers Per Thread"),
        "occupancy_limits": {
            k.removeprefix("launch__occupancy_limit_").removeprefix("Block Limit ").lower(): v
            for k, v in m.items()
            if k.startswith(("launch__occupancy_limit_", "Block Limit "))
        },
    }


def group_by_marker(launches: list[dict]) -> dict[int, list[dict]]:
    """Launches after each ``iosim_marker`` (grid = config index + 1) up to the next marker."""
    out: dict[int, list[dict]] = {}
    cur = None
    for k in launches:
        if "iosim_marker" in k["kernel"]:
            cur = _grid_count(k["grid"]) - 1
            out.setdefault(cur, [])
        elif cur is not None:
            out[cur].append(k)
    return out


def sum_launches(launches: list[dict]) -> dict:
    total: dict = {}
    for k in launches:
        for key, v in summarize(k).items():
            if isinstance(v, int):
                total[key] = (total.get(key) or 0) + v
            elif key not in total:
                total[key] = v if not isinstance(v, dict) else None
    return total


# ----------------------------------------------------------------------------------------------------------------
# the worker: runs inside ncu (or alone, for timing)

_PROBE_SRC = r"""
extern "C" __global__ void iosim_marker(int* p) { if (p && threadIdx.x == 0 && blockIdx.x == 0) p[0] = 1; }
extern "C" __global__ void iosim_copy(const float4* __restrict__ a, float4* __restrict__ b, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        b[i] = a[i];
}
extern "C" __global__ void iosim_l2probe(const float4* __restrict__ a, float* out, long long n, int reps) {
    float s = 0.f;
    for (int r = 0; r < reps; ++r)
        for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
             i += (long long)gridDim.x * blockDim.x) {
            float4 x = __ldcg(a + i);  // L2 only: L1 must not serve the second pass
            s += x.x + x.y + x.z + x.w;
        }
    if (s == 12345.678f) out[0] = s;  // keeps the loads; never true for the data used
}
// Write-back probe: one block per SM (all co-resident). Phase 1 writes w (dirty lines); a grid barrier; thread 0 of
// each block idles spin_ns on the global timer; phase 2 reads r through L2 (ld.global.cg): each float4 by one
// block (shared = 0) or the whole of r by every block in the same order (shared = 1, like K/V in attention).
// shared = 2 (interleaved): one grid-stride loop over both, each step reads r[i] (if any) then writes w[i] (if any).
// shared = 3 (read back): phase 2 reads w itself (nr = nw), each thread the float4s it wrote.
extern "C" __global__ void iosim_l2write(float4* w, long long nw, const float4* __restrict__ r, long long nr,
                                         int shared, long long spin_ns, unsigned* bar, float* out) {
    const long long tid = blockIdx.x * (long long)blockDim.x + threadIdx.x, nthreads = (long long)gridDim.x * blockDim.x;
    if (shared == 2) {
        float s = 0.f;
        for (long long i = tid; i < nw || i < nr; i += nthreads) {
            if (i < nr) {
                float4 x = __ldcg(r + i);
                s += x.x + x.y + x.z + x.w;
            }
            if (i < nw) w[i] = make_float4(1.f, 2.f, s, (float)i);
        }
        if (s == 12345.678f) out[0] = s;
        return;
    }
    for (long long i = tid; i < nw; i += nthreads) w[i] = make_float4(1.f, 2.f, 3.f, (float)i);
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        atomicAdd(bar, 1u);
        while (atomicAdd(bar, 0u) < gridDim.x) {}
        if (spin_ns > 0) {
            unsigned long long t0, t;
            asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
            do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < (unsigned long long)spin_ns);
        }
    }
    __syncthreads();
    float s = 0.f;
    const bool every = shared == 1;
    const float4* src = shared == 3 ? w : r;
    const long long start = every ? threadIdx.x : tid, step = every ? blockDim.x : nthreads;
    for (long long i = start; i < nr; i += step) {
        float4 x = __ldcg(src + i);
        s += x.x + x.y + x.z + x.w;
    }
    if (s == 12345.678f) out[0] = s;
}
// all blocks of the grid (one per SM, all co-resident) past phase `phase` before any goes on; bar starts at 0
__device__ void iosim_grid_barrier(unsigned* bar, unsigned phase) {
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        atomicAdd(bar, 1u);
        while (atomicAdd(bar, 0u) < phase * gridDim.x) {}
    }
    __syncthreads();
}
// Reuse probe: one block per SM. Phase 1 reads a reps times: blocks in groups of `group` (a divisor of the grid),
// each 4 KiB chunk of a read by every block of one group, the groups taking turns chunk by chunk (group = 1: each
// float4 by one thread; group = gridDim.x: the whole of a by every block in the same order); phase 2 reads b once,
// each float4 by one thread, then thread 0 of each block idles spin_ns on the global timer; phase 3 reads a as
// phase 1 did, once. All through L2 only (ld.global.cg).
extern "C" __global__ void iosim_l2reuse(const float4* __restrict__ a, long long na, const float4* __restrict__ b,
                                         long long nb, int reps, int group, long long spin_ns, unsigned* bar,
                                         float* out) {
    const long long tid = blockIdx.x * (long long)blockDim.x + threadIdx.x, nthreads = (long long)gridDim.x * blockDim.x;
    const long long start = (long long)(blockIdx.x / group) * blockDim.x + threadIdx.x;
    const long long step = (long long)(gridDim.x / group) * blockDim.x;
    float s = 0.f;
    for (int r = 0; r < reps; ++r)
        for (long long i = start; i < na; i += step) {
            float4 x = __ldcg(a + i);
            s += x.x + x.y + x.z + x.w;
        }
    iosim_grid_barrier(bar, 1);
    for (long long i = tid; i < nb; i += nthreads) {
        float4 x = __ldcg(b + i);
        s += x.x + x.y + x.z + x.w;
    }
    if (threadIdx.x == 0 && spin_ns > 0) {
        unsigned long long t0, t;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
        do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < (unsigned long long)spin_ns);
    }
    iosim_grid_barrier(bar, 2);
    for (long long i = start; i < na; i += step) {
        float4 x = __ldcg(a + i);
        s += x.x + x.y + x.z + x.w;
    }
    if (s == 12345.678f) out[0] = s;
}
"""


def _worker(spec_path: str, out_path: str) -> None:
    """Run the configs of ``spec_path`` (JSON); write launch records and timings to ``out_path``."""
    import cupy as cp

    spec = json.loads(Path(spec_path).read_text())
    mode = spec.get("mode", "profile")  # "profile": one call each (under ncu); "time": CUDA-event timing
    reps, warmup = int(spec.get("reps", 10)), int(spec.get("warmup", 3))
    mod = cp.RawModule(code=_PROBE_SRC)
    marker = mod.get_function("iosim_marker")
    copy_k = mod.get_function("iosim_copy")
    probe_k = mod.get_function("iosim_l2probe")
    write_k = mod.get_function("iosim_l2write")
    reuse_k = mod.get_function("iosim_l2reuse")
    sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    dummy = cp.zeros(1, dtype=cp.int32)
    try:
        import torch
    except Exception:
        torch = None
    results = []
    for idx, c in enumerate(spec["configs"]):
        c = Config(**c)
        rec: dict = {"index": idx, "config": asdict(c)}
        try:
            fn, info = _prepare(c, cp, torch, (copy_k, probe_k, write_k, reuse_k), sms)
            rec.update(info)
            if mode == "profile":
                marker((idx + 1,), (32,), (dummy,))
                fn()
                cp.cuda.Device().synchronize()
            else:
                rec["time_ms"] = event_median_ms(fn, cp, reps, warmup)
            if c.kind in ("flash2", "naive"):
                from iosim.gpu import last_launch

                lr = last_launch()
                rec["launch"] = {"tiles": lr.tiles, "kernels": [asdict(k) for k in lr.launches]}
        except Exception as exc:  # recorded, the sweep goes on
            rec["error"] = f"{type(exc).__name__}: {exc}"
        results.append(rec)
        fn = None  # frees the inputs before the next config
        cp.get_default_memory_pool().free_all_blocks()
        if torch is not None:
            torch.cuda.empty_cache()
    Path(out_path).write_text(
        json.dumps({"mode": mode, "device": _device_info(cp), "results": results}, indent=1)
    )


def _device_info(cp) -> dict:
    p = cp.cuda.runtime.getDeviceProperties(0)
    name = p["name"].decode() if isinstance(p["name"], bytes) else p["name"]
    return {
        "name": name,
        "sm_count": p["multiProcessorCount"],
        "l2_bytes": p["l2CacheSize"],
        "smem_per_sm": p["sharedMemPerMultiprocessor"],
        "regs_per_sm": p["regsPerMultiprocessor"],
        "cc": f"{p['major']}.{p['minor']}",
        **_device_identity(p),
    }


def _device_identity(p: dict) -> dict:
    """Which physical GPU this is (CUDA device properties): its UUID and PCI address. The lent machines differ
    from call to call, and some properties (each SM's speed over a long grid, docs/validation.md) are the chip's,
    not the model's."""
    out = {}
    uuid = p.get("uuid")
    if isinstance(uuid, (bytes, bytearray)) and len(uuid) == 16:
        h = uuid.hex()
        out["uuid"] = f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
    if "pciBusID" in p:
        out["pci_bus_id"] = f"{p.get('pciDomainID', 0):08x}:{p['pciBusID']:02x}:{p.get('pciDeviceID', 0):02x}.0"
    return out


def event_median_ms(fn, cp, reps: int, warmup: int = 0) -> float:
    """Median CUDA-event time of ``fn()`` over ``reps`` calls after ``warmup`` untimed ones, in ms."""
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(reps):
        a, b = cp.cuda.Event(), cp.cuda.Event()
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(cp.cuda.get_elapsed_time(a, b))
    return statistics.median(ts)


def _prepare(c: Config, cp, torch, probes, sms):
    """A zero-argument callable that launches the config once, and facts about it."""
    copy_k, probe_k, write_k, reuse_k = probes
    if c.kind == "l2reuse":
        na, nb = c.nbytes // 16, c.read_bytes // 16
        a = cp.random.random(na * 4, dtype=cp.float32) + 1.0
        b = cp.random.random(max(nb, 1) * 4, dtype=cp.float32) + 1.0
        bar = cp.zeros(1, dtype=cp.uint32)
        o = cp.zeros(1, dtype=cp.float32)
        spin = cp.int64(c.spin_us * 1000)
        group = sms if c.read_shared else c.read_group
        if sms % group:
            raise MeasureError(f"read_group={group}: not a divisor of this GPU's {sms} SMs")
        args = (a, cp.int64(na), b, cp.int64(nb), cp.int32(c.hot_reps), cp.int32(group), spin, bar, o)

        def run():
            cp.cuda.runtime.memsetAsync(bar.data.ptr, 0, 4, cp.cuda.get_current_stream().ptr)
            reuse_k((sms,), (256,), args)  # one block per SM: the grid barriers need all of them resident

        reads = na * 16 * (c.hot_reps + 1) * group + nb * 16
        return run, {"bytes": reads, "read_bytes": reads}
    if c.kind == "l2write":
        nw = c.nbytes // 16
        nr = nw if c.read_written else c.read_bytes // 16
        w = cp.zeros(max(nw, 1) * 4, dtype=cp.float32)
        r = cp.random.random(max(0 if c.read_written else nr, 1) * 4, dtype=cp.float32) + 1.0
        bar = cp.zeros(1, dtype=cp.uint32)
        o = cp.zeros(1, dtype=cp.float32)
        args = (
            w,
            cp.int64(nw),
            r,
            cp.int64(nr),
            cp.int32(2 if c.interleave else 3 if c.read_written else int(c.read_shared)),
            cp.int64(c.spin_us * 1000),
            bar,
            o,
        )

        def run():
            cp.cuda.runtime.memsetAsync(bar.data.ptr, 0, 4, cp.cuda.get_current_stream().ptr)
            write_k((sms,), (256,), args)  # one block per SM: the grid barrier needs all of them resident

        reads = nr * 16 * (sms if c.read_shared else 1)
        return run, {"bytes": nw * 16 + reads, "write_bytes": nw * 16, "read_bytes": reads}
    if c.kind == "copy":
        n = c.nbytes // 16
        a = cp.random.random(n * 4, dtype=cp.float32)
        b = cp.empty_like(a)
        grid = (sms * 8,)
        return (lambda: copy_k(grid, (256,), (a, b, cp.int64(n)))), {"bytes": n * 16}
    if c.kind in ("l2probe", "l2bw"):
        n = c.nbytes // 16
        a = cp.random.random(n * 4, dtype=cp.float32) + 1.0
        o = cp.zeros(1, dtype=cp.float32)
        reps = 2 if c.kind == "l2probe" else 20
        grid, block = (sms * c.blocks_per_sm,), (c.threads,)
        return (lambda: probe_k(grid, block, (a, o, cp.int64(n), cp.int32(reps)))), {"bytes": n * 16 * reps}
    if torch is None:
        raise MeasureError("the attention configs need PyTorch for inputs (torch is not importable)")
    dt = {"fp16": torch.float16, "bf16": torch.bfloat16}[c.dtype]
    g = torch.Generator(device="cuda").manual_seed(1234)
    q = torch.randn(c.batch, c.seq_len, c.heads, c.head_dim, device="cuda", dtype=dt, generator=g)
    k = torch.randn(c.batch, c.kv_len, c.kv_heads, c.head_dim, device="cuda", dtype=dt, generator=g)
    v = torch.randn(c.batch, c.kv_len, c.kv_heads, c.head_dim, device="cuda", dtype=dt, generator=g)
    if c.kind in ("flash2", "naive"):
        from iosim import gpu

        kw = {} if c.kind == "naive" else {"block_q": c.block_q, "block_kv": c.block_kv}
        return (lambda: gpu.attention(q, k, v, schedule=c.kind, causal=c.causal, **kw)), {}
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = SDPBackend.FLASH_ATTENTION if c.kind == "sdpa-flash" else SDPBackend.CUDNN_ATTENTION
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, H, N, d) views, no copy
    gqa = c.heads != c.kv_heads

    def run():
        with sdpa_kernel(backend):
            return torch.nn.functional.scaled_dot_product_attention(
                qt, kt, vt, is_causal=c.causal, enable_gqa=gqa
            )

    return run, {}


# ----------------------------------------------------------------------------------------------------------------
# the driver


def find_ncu(ncu: str | None = None) -> str:
    cands = (
        [ncu]
        if ncu
        else [
            shutil.which("ncu"),
            *sorted(Path("/opt/nvidia/nsight-compute").glob("*/ncu"), reverse=True),
            "/usr/local/cuda/bin/ncu",
        ]
    )
    for c in cands:
        if c and Path(c).exists():
            return str(c)
    raise MeasureError(
        "Nsight Compute (ncu) not found: install it (it ships with the CUDA toolkit) or give its "
        "path with --ncu"
    )


def require_gpu() -> None:
    from .gpu._cupy import GPUUnavailableError, require_cupy

    try:
        require_cupy()
    except GPUUnavailableError as exc:
        raise MeasureError(str(exc)) from None


def available_metrics(ncu: str) -> set[str]:
    """Base metric names ``ncu --query-metrics`` lists for the local GPU (empty if the query fails)."""
    try:
        out = subprocess.run([ncu, "--query-metrics"], capture_output=True, text=True, timeout=120).stdout
    except Exception:
        return set()
    return {
        ln.split()[0] for ln in out.splitlines() if ln and not ln.startswith((" ", "-", "Device", "Metric"))
    }


def choose_metrics(available: set[str]) -> list[str]:
    extra = [m for m in OPTIONAL_METRICS if not available or m.split(".")[0] in available]
    return [*CORE_METRICS, *extra]


@dataclass
class Run:
    device: dict
    metrics: list[str]
    ncu_command: str
    configs: list[dict] = field(default_factory=list)
    dram_command: str | None = None  # the one-pass DRAM profile's command (None: DRAM from the replayed one)

    def to_json(self) -> dict:
        return asdict(self)


def _run_worker(
    cmd_prefix: list[str], configs: list[Config], mode: str, workdir: Path, env=None, reps=10, timeout=None
) -> dict:
    spec = workdir / f"spec_{mode}.json"
    out = workdir / f"out_{mode}.json"
    spec.write_text(json.dumps({"mode": mode, "reps": reps, "configs": [asdict(c) for c in configs]}))
    cmd = [*cmd_prefix, sys.executable, "-m", "iosim.measure", "worker", str(spec), str(out)]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    if not out.exists():
        tail = (p.stdout + p.stderr)[-2000:]
        if "ERR_NVGPUCTRPERM" in tail:
            parse_ncu_csv(tail)
        raise MeasureError(f"the measurement worker failed (exit {p.returncode}): {tail.strip()}")
    data = json.loads(out.read_text())
    data["stderr_tail"] = p.stderr[-2000:]
    return data


def _profile(ncu_path, args, configs, wd: Path, tag: str, env, timeout) -> tuple[dict, list[dict], str, str]:
    """One run of the worker under ncu with ``args``: (the worker's records, ncu's launches, ncu's command, ncu's
    log)."""
    log = wd / f"ncu_{tag}.csv"
    prefix = [ncu_path, *args, "-k", f"regex:{KERNEL_REGEX}", "--log-file", str(log)]
    sub = wd / tag
    sub.mkdir(parents=True, exist_ok=True)
    prof = _run_worker(prefix, configs, "profile", sub, env=env, timeout=timeout)
    text = log.read_text(errors="replace") if log.exists() else ""
    launches = parse_ncu_csv(text)
    if not launches:
        raise MeasureError(f"ncu profiled no kernel (log {log}): {text[-1500:]}")
    return prof, launches, " ".join([*prefix[:-2], "--log-file", log.name]), text


def measure(
    configs: list[Config],
    *,
    ncu: str | None = None,
    timing: bool = True,
    workdir: str | None = None,
    cache_control: str = "all",
    metrics: list[str] | None = None,
    keep_csv: str | None = None,
    timeout: float | None = None,
    dram_pass: bool = True,
) -> Run:
    """Profile every config under ncu (one call each), then time it with CUDA events (``timing``).

    ``dram_pass`` (default): DRAM bytes from a one-pass profile of their own (module docstring); off, they come
    from the replayed profile with every other counter, as before 2026-11-22's run 5."""
    require_gpu()
    ncu_path = find_ncu(ncu)
    wd = Path(workdir or tempfile.mkdtemp(prefix="iosim-measure-"))
    wd.mkdir(parents=True, exist_ok=True)
    mets = metrics or choose_metrics(available_metrics(ncu_path))
    common = ["--clock-control", "none", "--cache-control", cache_control, "--csv", "--print-units", "base"]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(Path(__file__).resolve().parent.parent), env.get("PYTHONPATH", "")]
    )
    args = [*common, "--section", "LaunchStats", "--section", "Occupancy", "--metrics", ",".join(mets)]
    prof, launches, command, text = _profile(ncu_path, args, configs, wd, "counters", env, timeout)
    groups = group_by_marker(launches)
    dram_groups, dram_command = None, None
    if dram_pass:
        args = [*common, "--metrics", ",".join(DRAM_METRICS)]
        _, dram_launches, dram_command, dram_text = _profile(ncu_path, args, configs, wd, "dram", env, timeout)
        dram_groups = group_by_marker(dram_launches)
        text += dram_text
    if keep_csv:
        Path(keep_csv).write_text(text)
    times = _run_worker([], configs, "time", wd, env=env, timeout=timeout)["results"] if timing else None
    run = Run(prof["device"], mets, command, dram_command=dram_command)
    for i, rec in enumerate(prof["results"]):
        ks = groups.get(i, [])
        entry = dict(rec)
        entry["kernels"] = [
            {"kernel": k["kernel"], "grid": k["grid"], "block": k["block"], **summarize(k)}
            for k in ks
        ]
        entry["measured"] = sum_launches(ks)
        if dram_groups is not None:
            _use_dram_pass(entry, ks, dram_groups.get(i, []))
        if times is not None:
            entry["time_ms"] = times[i].get("time_ms")
            if "error" in times[i]:
                entry.setdefault("error", times[i]["error"])
        run.configs.append(entry)
    return run


def _use_dram_pass(entry: dict, counters: list[dict], dram: list[dict]) -> None:
    """Put the one-pass profile's DRAM bytes into ``entry`` (per kernel and summed); the replayed profile's stay as
    ``dram_*_bytes_replayed``. The two profiles must have seen the same kernels."""
    names = [k["kernel"] for k in counters], [k["kernel"] for k in dram]
    if names[0] != names[1]:
        entry.setdefault("error", f"MeasureError: the DRAM profile saw other kernels ({names[1]}) than {names[0]}")
        return
    for rec, k in zip(entry["kernels"], dram):
        m = summarize(k)
        for key in ("dram_read_bytes", "dram_write_bytes"):
            rec[key + "_replayed"] = rec[key]
            rec[key] = m[key]
    total = entry["measured"]
    for key in ("dram_read_bytes", "dram_write_bytes"):
        total[key + "_replayed"] = total.get(key)
        vals = [r[key] for r in entry["kernels"]]
        total[key] = sum(vals) if vals and all(isinstance(v, int) for v in vals) else None


# ----------------------------------------------------------------------------------------------------------------
# outputs

CSV_FIELDS = (
    "kind",
    "batch",
    "heads",
    "kv_heads",
    "seq_len",
    "kv_len",
    "head_dim",
    "dtype",
    "causal",
    "block_q",
    "block_kv",
    "kernels",
    "dram_read_bytes",
    "dram_write_bytes",
    "l2_read_bytes",
    "l2_write_bytes",
    "lts_t_bytes",
    "smem_ld_wavefronts",
    "smem_st_wavefronts",
    "duration_ns",
    "time_ms",
    "error",
)


def to_csv(run: Run) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=CSV_FIELDS, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    for e in run.configs:
        row = {
            **e["config"],
            **(e.get("measured") or {}),
            "time_ms": e.get("time_ms"),
            "error": e.get("error", ""),
        }
        row["kernels"] = ";".join(k["kernel"].split("(")[0] for k in e.get("kernels", []))
        w.writerow(row)
    return buf.getvalue()


def main(argv=None) -> None:  # python -m iosim.measure worker SPEC OUT
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) == 3 and argv[0] == "worker":
        _worker(argv[1], argv[2])
        return
    print(
        "usage: python -m iosim.measure worker SPEC.json OUT.json (use `iosim measure` instead)",
        file=sys.stderr,
    )
    sys.exit(2)


if __name__ == "__main__":
    main()
