"""Probes of how a GPU places thread blocks and which SMs share an L2 partition (inputs of the L2 model).

* :func:`dispatch_map`: the SM of every block of a grid that fits the GPU at once, for a given number of blocks per
  SM (set through dynamic shared memory). The L2 model puts the k-th block of the first wave where this map says.
* :func:`masked_read_probe`: the read-twice L2 probe with only the SMs of one partition reading (under ncu it
  tells how much of L2 one partition's SMs can use).
* :func:`l2_partition_map`: for each SM, the mean latency of L2 hits on lines another SM (the reference) has just
  loaded, against the same lines once it has loaded them itself. SMs on the reference's partition see no
  difference; the others pay a trip across the chip for part of the lines. :func:`split_halves` turns the latencies
  into two groups.

Kernels: ``kernels/topology.cu``. Every result is checked (each walk must end where its chain closes, every SM
must appear) before it is returned; a failed check raises :class:`TopologyError`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from iosim._resources import kernels_dir
from iosim.gpu._cupy import require_cupy
from iosim.gpu.build import nvrtc_options

SOURCE = "topology.cu"
LINE = 128  # bytes per L2 line
RESERVED_SMEM = 1024  # shared memory the system keeps per block on sm_80 and sm_90


class TopologyError(RuntimeError):
    """A probe's own check failed (a walk did not close, a block ran where it should not have)."""


def _module(cp):
    src = (kernels_dir() / SOURCE).read_text()
    return cp.RawModule(code=src, options=nvrtc_options(kernels_dir()))


def _smem_for(occupancy: int, cp) -> int:
    """Dynamic shared memory per block so that exactly ``occupancy`` blocks fit on one SM."""
    a = cp.cuda.Device().attributes
    per_sm, optin = a["MaxSharedMemoryPerMultiprocessor"], a["MaxSharedMemoryPerBlockOptin"]
    smem = min(per_sm // occupancy - RESERVED_SMEM, optin)
    if (occupancy + 1) * (smem + RESERVED_SMEM) <= per_sm:
        raise TopologyError(f"cannot hold an SM to {occupancy} blocks with shared memory ({per_sm} B per SM)")
    return smem


def _launch(kernel, grid, block, args, smem):
    kernel.max_dynamic_shared_size_bytes = smem
    kernel((grid,), (block,), args, shared_mem=smem)


def dispatch_map(occupancy: int, spin_us: float = 50.0) -> dict:
    """Run a grid of ``occupancy`` x SM-count blocks, ``occupancy`` resident per SM; return ``{"sm": [...],
    "start_ns": [...]}`` by block index (start relative to the first block). Raises :class:`TopologyError` if the
    blocks were not all resident together or an SM got a different number of them."""
    cp = require_cupy()
    n_sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    kern = _module(cp).get_function("iosim_dispatch")
    grid = occupancy * n_sms
    sm = cp.full(grid, -1, dtype=cp.int32)  # poison: a block that never ran stays -1
    start = cp.zeros(grid, dtype=cp.uint64)
    _launch(kern, grid, 64, (sm, start, cp.int64(int(spin_us * 1000))), _smem_for(occupancy, cp))
    cp.cuda.Device().synchronize()
    sm_h, st = cp.asnumpy(sm), cp.asnumpy(start).astype(np.int64)
    st -= st.min()
    counts = np.bincount(sm_h[sm_h >= 0], minlength=n_sms)
    if (sm_h < 0).any() or (counts != occupancy).any():
        raise TopologyError(
            f"occupancy {occupancy}: blocks per SM {sorted(set(counts.tolist()))}, expected all equal"
        )
    if st.max() > spin_us * 1000 / 2:
        raise TopologyError(
            f"occupancy {occupancy}: a block started {st.max()} ns after the first: not one wave"
        )
    return {"sm": sm_h.tolist(), "start_ns": st.tolist()}


@dataclass
class PartitionProbe:
    """One run of ``iosim_l2near`` with reference block ``ref``. Cycles are per load (mean over the walk)."""

    ref: int
    ref_sm: int
    sm: list[int]  # by block
    load: list[float]  # the ref SM's loading walk of block b's region (a DRAM read)
    after_ref: list[float]  # walk 1: lines the ref SM just loaded
    own: list[float]  # walk 2: the same lines again
    cold: list[float]  # walk 3: untouched lines


def _chains(n_regions: int, lines: int, window: int, rng) -> tuple[np.ndarray, np.ndarray]:
    """Pointer chains: region r is a random cycle through ``lines`` distinct random lines of its ``window`` bytes."""
    words_per_line, lines_per_window = LINE // 4, window // LINE
    chain = np.zeros(n_regions * window // 4, dtype=np.uint32)
    heads = np.zeros(n_regions, dtype=np.uint32)
    for r in range(n_regions):
        picks = rng.choice(lines_per_window, size=lines, replace=False)
        words = (r * lines_per_window + picks) * words_per_line
        chain[words] = np.roll(words, -1)
        heads[r] = words[0]
    return chain, heads


def l2_partition_map(ref: int = 0, lines: int = 256, window: int = 1 << 20, seed: int = 0) -> PartitionProbe:
    """One run of the partition probe with block ``ref`` as the reference (see the module doc)."""
    cp = require_cupy()
    n_sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    ref %= n_sms
    kern = _module(cp).get_function("iosim_l2near")
    chain_h, heads_h = _chains(2 * n_sms, lines, window, np.random.default_rng(seed))
    chain, heads = cp.asarray(chain_h), cp.asarray(heads_h)
    flag = cp.zeros(n_sms, dtype=cp.uint32)
    sm = cp.full(n_sms, -1, dtype=cp.int32)
    cycles = cp.full(4 * n_sms, -1, dtype=cp.int64)
    ends = cp.full(4 * n_sms, 0xFFFFFFFF, dtype=cp.uint32)  # poison: a walk that did not run cannot close
    args = (chain, heads, cp.int32(lines), cp.int32(ref), flag, sm, cycles, ends)
    _launch(kern, n_sms, 32, args, _smem_for(1, cp))
    cp.cuda.Device().synchronize()
    sm_h, cyc, end = cp.asnumpy(sm), cp.asnumpy(cycles).reshape(n_sms, 4), cp.asnumpy(ends).reshape(n_sms, 4)
    if sorted(sm_h.tolist()) != list(range(n_sms)):
        raise TopologyError(f"blocks did not land one per SM: SMs {sorted(set(sm_h.tolist()))[:8]}...")
    others = np.arange(n_sms) != ref
    want = heads_h[:n_sms][others]
    walks = [end[others, 0] == want, end[others, 1] == want, end[others, 2] == want]
    walks.append(end[others, 3] == heads_h[n_sms:][others])
    if not all(w.all() for w in walks) or (cyc[others] <= 0).any():
        raise TopologyError("a pointer walk did not end where its chain closes: the probe is broken")
    per = cyc.astype(np.float64) / lines
    per[~others] = np.nan
    return PartitionProbe(
        ref,
        int(sm_h[ref]),
        sm_h.tolist(),
        per[:, 0].tolist(),
        per[:, 1].tolist(),
        per[:, 2].tolist(),
        per[:, 3].tolist(),
    )


def split_halves(p: PartitionProbe) -> tuple[list[int], float]:
    """Two groups of SMs from one probe run: the SMs whose ``after_ref`` latency lies below the widest gap in the
    sorted excess (``after_ref`` - ``own``) share the reference's partition (the reference joins them). Returns
    (partition by SM id: 0 = the reference's, 1 = the other; the gap in cycles, the split's margin)."""
    n = len(p.sm)
    excess = np.array(p.after_ref) - np.array(p.own)
    idx = [b for b in range(n) if b != p.ref]
    order = sorted(idx, key=lambda b: excess[b])
    vals = excess[order]
    gaps = np.diff(vals)
    cut = int(np.argmax(gaps))
    part = [0] * n
    for b in order[cut + 1 :]:
        part[p.sm[b]] = 1
    return part, float(gaps[cut])


def masked_read_probe(nbytes: int, readers: list[int], write: bool = False):
    """A zero-argument launcher of ``iosim_l2probe_masked``: ``nbytes`` (a multiple of 16) read twice, each float4
    by one thread, by the blocks on the SMs ``readers`` only (one block per SM); ``write``: ``iosim_l2write_masked``
    instead, the same SMs write ``nbytes`` once. Run it under ncu for DRAM bytes."""
    cp = require_cupy()
    n_sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    if not readers or any(not 0 <= m < n_sms for m in readers):
        raise TopologyError(f"readers must be SM ids in 0..{n_sms - 1}")
    rank = np.full(n_sms, -1, dtype=np.int32)
    rank[sorted(readers)] = np.arange(len(readers), dtype=np.int32)
    rank_d = cp.asarray(rank)
    n = nbytes // 16
    smem = _smem_for(1, cp)
    if write:
        kern = _module(cp).get_function("iosim_l2write_masked")
        w = cp.zeros(n * 4, dtype=cp.float32)
        args = (w, cp.int64(n), rank_d, cp.int32(len(readers)))
    else:
        kern = _module(cp).get_function("iosim_l2probe_masked")
        a = cp.random.random(n * 4, dtype=cp.float32) + 1.0
        args = (a, cp.int64(n), rank_d, cp.int32(len(readers)), cp.zeros(1, dtype=cp.float32))
    return lambda: _launch(kern, n_sms, 256, args, smem)
