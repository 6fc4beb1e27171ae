"""Nsight Compute (``ncu``): which counters, finding the executable, and reading its CSV into bytes per boundary.

====================  ====================================================  ================================
quantity              metric                                                boundary (docs/concepts.md)
====================  ====================================================  ================================
DRAM bytes read       ``dram__bytes_read.sum``                              ``hbm`` read
DRAM bytes written    ``dram__bytes_write.sum``                             ``hbm`` write
SM global loads       ``smsp__sass_data_bytes_mem_global_op_ld`` + ldgsts   ``global`` read
SM global stores      ``smsp__sass_data_bytes_mem_global_op_st.sum``        ``global`` write
SM->L2 sectors x 32   ``lts__t_sectors_srcunit_tex_op_read/write.sum``      (after L1 hits and the L2 request
                                                                            coalescer: reported only)
L2 traffic, all       ``lts__t_bytes.sum`` (fills, write-backs, ... too)    (not a boundary: reported only)
shared-memory         ``l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld``  ``sram`` (wavefronts, not bytes)
duration              ``gpu__time_duration.sum``
====================  ====================================================  ================================
"""

from __future__ import annotations

import csv
import io
import re
import shutil
import subprocess
from pathlib import Path

from .runs import MeasureError

SECTOR = 32  # bytes per L2 sector

CORE_METRICS = (  # present on GH100 (ncu 2025.3.1 --query-metrics)
    "dram__bytes_read.sum",
    "dram__bytes_write.sum",
    "lts__t_bytes.sum",
    "lts__t_sectors_srcunit_tex_op_read.sum",
    "gpu__time_duration.sum",
    "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum",
)
OPTIONAL_METRICS = (  # used where ``ncu --query-metrics`` lists them
    "lts__t_sectors_srcunit_tex_op_write.sum",
    "l1tex__m_xbar2l1tex_read_bytes.sum",  # what leaves the SM's L1TEX for L2 (after L1 hits)
    "l1tex__m_l1tex2xbar_write_bytes.sum",
    "smsp__sass_data_bytes_mem_global_op_ld.sum",  # what the global load and store instructions move: `global`
    "smsp__sass_data_bytes_mem_global_op_ldgsts.sum",
    "smsp__sass_data_bytes_mem_global_op_st.sum",
    "smsp__sass_data_bytes_mem_global_op_red.sum",  # reductions in L2 (the backward's dQ): a read and a write each
    "smsp__sass_data_bytes_mem_global_op_atom.sum",
    "l1tex__m_xbar2l1tex_read_bytes_mem_global_op_tma_ld.sum",  # TMA loads (flash3): its `global` reads
    "lrc__t_sectors.sum",  # the L2 request coalescer (Hopper) merges identical reads of different SMs
    "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum",
    "smsp__inst_executed_op_ldsm.sum",
    "launch__registers_per_thread",
    "launch__shared_mem_per_block_dynamic",
    "launch__occupancy_limit_registers",
    "launch__occupancy_limit_shared_mem",
    "launch__occupancy_limit_warps",
    "launch__occupancy_limit_blocks",
    "launch__grid_size",
    "launch__block_size",
)
DRAM_METRICS = ("dram__bytes_read.sum", "dram__bytes_write.sum", "gpu__time_duration.sum")  # the one-pass profile
# ours, the markers, torch's backends; the backward's: ours and FA2's flash_bwd_*, cuDNN's bprop, and the reduction
# kernel torch sums FA2's expanded dK, dV with (grouped-query heads); the fp8 quantize kernels (quantize_fp8_kernel)
KERNEL_REGEX = r"iosim_|flash_fwd|flash_bwd|flash3_|naive_|sdpa|fprop|bprop|fmha|reduce_kernel|quantize_fp8"
END_MARKER_Z = 2  # an iosim_marker launched with gridDim.z = 2 ends its run's range (its grid.x: the run index + 1)

_SUMMARY = {  # record key: (metric, scale)
    "dram_read_bytes": ("dram__bytes_read.sum", 1),
    "dram_write_bytes": ("dram__bytes_write.sum", 1),
    "l2_read_bytes": ("lts__t_sectors_srcunit_tex_op_read.sum", SECTOR),
    "l2_write_bytes": ("lts__t_sectors_srcunit_tex_op_write.sum", SECTOR),
    "lts_t_bytes": ("lts__t_bytes.sum", 1),
    "xbar_read_bytes": ("l1tex__m_xbar2l1tex_read_bytes.sum", 1),
    "xbar_write_bytes": ("l1tex__m_l1tex2xbar_write_bytes.sum", 1),
    "sass_global_ld_bytes": ("smsp__sass_data_bytes_mem_global_op_ld.sum", 1),
    "sass_global_ldgsts_bytes": ("smsp__sass_data_bytes_mem_global_op_ldgsts.sum", 1),
    "sass_global_st_bytes": ("smsp__sass_data_bytes_mem_global_op_st.sum", 1),
    "sass_global_red_bytes": ("smsp__sass_data_bytes_mem_global_op_red.sum", 1),
    "sass_global_atom_bytes": ("smsp__sass_data_bytes_mem_global_op_atom.sum", 1),
    # what TMA loads (cp.async.bulk.tensor) bring from L2 into shared memory: flash3's `global` reads, in whole boxes
    "tma_global_ld_bytes": ("l1tex__m_xbar2l1tex_read_bytes_mem_global_op_tma_ld.sum", 1),
    "lrc_sectors": ("lrc__t_sectors.sum", 1),
    "smem_ld_wavefronts": ("l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum", 1),
    "smem_st_wavefronts": ("l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum", 1),
    "ldsm_instructions": ("smsp__inst_executed_op_ldsm.sum", 1),
    "duration_ns": ("gpu__time_duration.sum", 1),
}


def _number(s: str):
    s = s.strip().replace(",", "")
    if s in ("", "n/a", "N/A"):
        return None
    for conv in (int, float):
        try:
            return conv(s)
        except ValueError:
            pass
    return s


def _raise_on_errors(text: str) -> None:
    if "ERR_NVGPUCTRPERM" in text:
        raise MeasureError(
            "ncu: the user may not read the GPU performance counters (ERR_NVGPUCTRPERM); run as "
            "root or set NVreg_RestrictProfilingToAdminUsers=0 (NVIDIA: ERR_NVGPUCTRPERM)"
        )
    errors = [ln for ln in text.splitlines() if "==ERROR==" in ln]
    if errors:
        raise MeasureError("ncu: " + " | ".join(e.replace("==ERROR==", "").strip() for e in errors[:3]))


def parse_ncu_csv(text: str) -> list[dict]:
    """Kernel launches from ``ncu --csv --print-units base`` (the details page with ``--metrics``).

    Returns one dict per launch, in profiling order: ``id``, ``kernel`` (full demangled name), ``grid``, ``block``
    (strings as ncu prints them), ``metrics`` {name: number} and ``units``. Lines ncu prints around the table
    (``==PROF==`` and the program's own output) are skipped."""
    lines = text.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith('"ID"')), None)
    if start is None or "ERR_NVGPUCTRPERM" in text:
        _raise_on_errors(text)
        return []
    body = [ln for ln in lines[start:] if ln.startswith('"')]
    launches: dict[int, dict] = {}
    for r in csv.DictReader(io.StringIO("\n".join(body))):
        try:
            kid = int(r["ID"])
        except (KeyError, ValueError):
            continue
        k = launches.setdefault(kid, {"id": kid, "kernel": r.get("Kernel Name", ""), "grid": r.get("Grid Size", ""),
                                      "block": r.get("Block Size", ""), "metrics": {}, "units": {}})
        name = r.get("Metric Name")
        if name:
            k["metrics"][name] = _number(r.get("Metric Value", ""))
            k["units"][name] = r.get("Metric Unit", "")
    return [launches[i] for i in sorted(launches)]


def grid_count(grid: str) -> int:
    """Blocks in a grid as ncu prints it, ``"(1056, 1, 1)"`` -> 1056 (0 if there are no numbers)."""
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

    out = {key: get(name, scale) for key, (name, scale) in _SUMMARY.items()}
    out["registers_per_thread"] = get("launch__registers_per_thread") or get("Registers Per Thread")
    out["occupancy_limits"] = {
        k.removeprefix("launch__occupancy_limit_").removeprefix("Block Limit ").lower(): v
        for k, v in m.items()
        if k.startswith(("launch__occupancy_limit_", "Block Limit "))
    }
    return out


def group_by_marker(launches: list[dict]) -> dict[int, list[dict]]:
    """Launches after each ``iosim_marker`` (grid = run index + 1) up to the next marker, or up to an end marker
    (gridDim.z = :data:`END_MARKER_Z`: what follows it, the next run's preparation, belongs to no run)."""
    out: dict[int, list[dict]] = {}
    cur = None
    for k in launches:
        if "iosim_marker" in k["kernel"]:
            dims = [int(x) for x in re.findall(r"\d+", k["grid"] or "")]
            if len(dims) == 3 and dims[2] == END_MARKER_Z:
                cur = None
                continue
            cur = grid_count(k["grid"]) - 1
            out.setdefault(cur, [])
        elif cur is not None:
            out[cur].append(k)
    return out


def sum_launches(launches: list[dict]) -> dict:
    """The summaries of several launches (the kernels of one call) added up; non-numbers from the first."""
    total: dict = {}
    for k in launches:
        for key, v in summarize(k).items():
            if isinstance(v, int):
                total[key] = (total.get(key) or 0) + v
            elif key not in total:
                total[key] = v if not isinstance(v, dict) else None
    return total


def find_ncu(ncu: str | None = None) -> str:
    """The ncu executable: ``ncu`` as given, else on PATH, under /opt/nvidia/nsight-compute, or in CUDA's bin."""
    cands = [ncu] if ncu else [shutil.which("ncu"), *sorted(Path("/opt/nvidia/nsight-compute").glob("*/ncu"),
                                                            reverse=True), "/usr/local/cuda/bin/ncu"]
    for c in cands:
        if c and Path(c).exists():
            return str(c)
    raise MeasureError("Nsight Compute (ncu) not found: install it (it ships with the CUDA toolkit) or give its "
                       "path with --ncu")


def available_metrics(ncu: str) -> set[str]:
    """Base metric names ``ncu --query-metrics`` lists for the local GPU (empty if the query fails)."""
    try:
        out = subprocess.run([ncu, "--query-metrics"], capture_output=True, text=True, timeout=120).stdout
    except (OSError, subprocess.SubprocessError):
        return set()
    return {ln.split()[0] for ln in out.splitlines() if ln and not ln.startswith((" ", "-", "Device", "Metric"))}


def choose_metrics(available: set[str]) -> list[str]:
    """The core metrics and those optional ones the GPU has (all of them if the query gave nothing)."""
    extra = [m for m in OPTIONAL_METRICS if not available or m.split(".")[0] in available]
    return [*CORE_METRICS, *extra]
