"""Time of iosim's Flash-Decoding kernels (kernels/flash_decode.cu; kernel description ``iosim-decode``), from the
profile's calibrated rates only.

**The split kernel** streams the KV cache. Its grid is the kernel's (:func:`iosim.launch.decode.decode_split`
chose the splits, the simulator's tiles carry them): a block per (row block, split, sequence, kv head), in launch
order, ``slots`` = SMs × blocks per SM resident at once (:func:`iosim.launch.decode.decode_slots`: shared memory,
the description's registers, threads). Each block

1. starts (``launch.per_block``), reads its sequence's length (one L2 latency) and issues Q and its first K/V tiles
   (one DRAM latency, ``latency.dram``; L2's where warm calls keep the cache in L2); where the profile has
   ``decode.fixed_dram`` or ``decode.fixed`` (:func:`block_fixed_s`), that measurement replaces these terms and the
   merge of step 3;
2. streams its split's K and V: all streaming blocks share the bandwidth equally (water-filling), each capped by
   its warps' own pace, a tile of 16 keys a warp each ``decode.tile`` seconds (the calibrated time of the warp's
   dependent chain through a tile at the blocks sharing its SM, :mod:`iosim.calibrate.decode_tile`; 0 where the
   profile lacks it), by what it keeps in flight over the latency (Little's law: 4 warps × (stages − 1) tiles of
   2·16·d elements of the cache), and by its SM's tensor, exp2 and fp32 rates at the blocks per SM (``mma_sync``,
   ``exp``, ``fp32.fma``; an fp8 cache adds the tile's conversion to 16 bits, :data:`FP8_CONVERT_OPS`
   instructions, at the fp32 rate); the chip's bandwidth for global K/V bytes is the L2 read rate, or the DRAM read
   rate times the reuse of each DRAM byte (the row blocks of a kv head share it in L2), whichever is lower;
3. merges its 4 warps' states through shared memory (``smem.ldmatrix`` rate at the SM's share) and stores.

A block that holds no keys of its sequence starts, reads the length and exits. Blocks take a free slot in launch
order as one ends, so a grid of more blocks than slots runs in waves and a grid of fewer runs at the blocks' caps:
partial waves and stragglers (the last split of the longest sequence) come out of the same walk (:func:`fluid`).
The walk keeps which SM each block runs on: the first slots are dealt breadth first (a block on every SM, then a
second), a later block takes the slot of the block that ended, on its SM; a block's warps' pace (``decode.tile``,
the tensor and fp32 shares) is that of the blocks streaming on its own SM at the time. A ragged batch, whose empty
blocks exit at once, piles its long splits two or three to some SMs, which then run them at that pace.
The kernel takes that walk, the call's first launch (``launch.call``) and the drain of its last stores (one
latency), and no less than its DRAM reads and writes at the calibrated rates.

**The combine kernel** (splits > 1) runs a warp per output row, 4 rows a block: each block's time is a chain of
dependent L2 loads (the length, then the splits' lse and O_s a round of :func:`iosim.launch.decode.combine_unroll`
splits at a time, their loads in flight together, one pass: a round is the calibrated ``decode.combine_round``, one
L2 latency where the profile lacks it), placed on the combine kernel's own resident slots; the kernel takes the
longer of that placement and the partials' bytes (from L2 where they fit in it, else DRAM), plus the call's part
beyond its blocks: ``decode.combine_fixed`` (what the combine adds to a call after the split kernel beyond its
rounds, measured there: on sm_90 the combine is the split kernel's programmatic dependent, its launch and start
overlapping the split kernel's last blocks), less one block's start, or a further launch (``launch.dependent``) and
an L2 latency where the profile lacks it.

Nothing here is fitted: ``decode.tile``, ``decode.fixed_dram``, ``decode.combine_round`` and
``decode.combine_fixed`` are measured on shapes of their own (one block an SM up to as many as an SM holds, and a
grid of 4 blocks; the tile with every sequence on the same pages in L2, the fixed parts with each on its own in
DRAM, as calls run; the combine as what it adds to calls of one sequence and of a grid that fills every SM), and the
measured decode rows (docs/benchmarks/decode-*.csv, the time records) judge the model
(``benchmarks/time_record_decode.py --judge-benchmark``, ``benchmarks/time_record.py``).
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from ..blocks import cdiv, makespan
from ..hardware.calibration import decode_keys
from ..launch import decode as geo
from ..launch.model import resident_blocks
from ..problem import AttentionProblem
from ..schedules.decode_layout import TILE_KEYS, WARPS, PagedDecodingTiles
from .estimate import Conditions, KernelTime, Workload
from .rates import WARP_LANES, Rates

# an fp8 cache: the warp instructions a lane adds to a 16-key tile per 16 values of d (kernels/flash_decode.cu v4;
# SASS of nvcc 13.0, d = 128, against the bf16 cache's kernel): V's 16 x 16 bytes turned into fp16 (LDS.64 and STS.128
# per 8 bytes, with 4 F2FP.F16.E4M3.UNPACK_B on sm_89+, "cvt", or 4 PRMT, 8 LOP3, 1 SHF before, "bits") and K's mma
# fragments read from the e4m3 ring (4 LDS.U16 and 4 conversions for one ldmatrix saved): 13 and 34.
FP8_CONVERT_OPS = {"cvt": 13, "bits": 34}


def fp8_path(profile) -> str:
    """How the kernel converts e4m3 on this GPU: "cvt" where it has fp8 tensor cores (sm_89+: the profile gives
    ``compute.tensor.fp8``), else "bits"."""
    fp8 = getattr(profile.compute.tensor, "fp8", None)
    return "cvt" if fp8 is not None and fp8.value is not None else "bits"


def fluid(stream: np.ndarray, fixed: np.ndarray, sms: int, per_sm: int, bandwidth: float, caps) -> float:
    """When the last of the blocks ends: block i (launch order) takes a slot on an SM, spends ``fixed[i]`` seconds not
    streaming, then streams ``stream[i]`` bytes. The first ``sms · per_sm`` blocks are placed breadth first (block i
    on SM i mod sms: one on every SM, then a second, as the block scheduler deals out a grid); every later one takes
    the slot the block that ended last left, on that block's SM. The streaming blocks share ``bandwidth`` by
    water-filling (:func:`iosim.timing._fluid.shares`), each at most ``caps[k]`` bytes/s while k blocks stream on
    its SM (its warps' pace there). An event walk: blocks start streaming or end at each event (all those that do at
    the same instant: a wave of equal blocks is one event), and the rates are set again; compiled
    (:func:`iosim.timing._fluid.walk`), since the split choice walks every candidate grid."""
    from ._fluid import walk  # numba, on the first decode prediction

    return float(walk(np.asarray(stream, dtype=np.float64), np.asarray(fixed, dtype=np.float64), int(sms), int(per_sm),
                      float(bandwidth), np.asarray(caps, dtype=np.float64)))


def _split_keys(p: AttentionProblem, t: PagedDecodingTiles, row_blocks: int) -> np.ndarray:
    """Keys of each split-kernel block in launch order: row blocks fastest, then splits, then sequence · kv head."""
    lens = np.asarray(t.kv_lens, dtype=np.int64)[:, None]
    s = np.arange(t.splits, dtype=np.int64)[None, :]
    per = np.clip(np.minimum(lens, (s + 1) * t.chunk) - s * t.chunk, 0, None)  # (batch, splits)
    per = np.repeat(per[:, None, :, None], p.kv_heads, axis=1)
    return np.repeat(per, row_blocks, axis=3).reshape(-1)


def _tile_seconds(p: AttentionProblem, t: PagedDecodingTiles, r: Rates, warps_per_sm: int, path: str = "cvt") -> float:
    """Seconds an SM takes per warp tile of 16 keys with ``warps_per_sm`` warps issuing: the multiplies on the
    tensor pipe, beside the softmax's exp2 and fp32 work (other warps' phases overlap; FA2's per-score counts) and
    an fp8 tile's conversion (:data:`FP8_CONVERT_OPS` of the GPU's ``path``: warp instructions of 32 lanes per 16
    values of d)."""
    Br, d = t.block_q, p.head_dim
    mma = 4 * Br * TILE_KEYS * d / (r.mma_at(warps_per_sm) / r.sms)
    scores = Br * TILE_KEYS
    convert = WARP_LANES * FP8_CONVERT_OPS[path] * d // 16 if t.kv_dtype else 0
    softmax = (scores + Br) / (r.ex2 / r.sms) + (4 * scores + Br * d + convert) / (r.alu / r.sms)
    return max(mma, softmax)


def tile_chain_s(profile, head_dim: int, stripes: int, fp8: bool, per_sm: float = 1.0) -> float:
    """``calibration.decode.tile`` of this instantiation at ``per_sm`` blocks an SM: seconds a warp's chain through
    one tile takes (linear in the blocks between the measured counts, and past the last two; 0 where the profile
    has no such measurement)."""
    cal = getattr(profile.calibration, "decode", None)
    cache, key = decode_keys(head_dim, stripes, fp8)
    entry = (cal.tile.get(cache, {}) if cal is not None else {}).get(key)
    return _interpolate(entry.value, per_sm) if entry is not None else 0.0


def block_fixed_s(profile, head_dim: int, stripes: int, fp8: bool, per_sm: float, r: Rates,
                  fill: float = 1.0) -> float | None:
    """``calibration.decode.fixed_dram`` (or ``fixed``, :func:`_fixed_entry`) less the call's launch and its last
    stores' drain: the seconds a block spends beyond its tiles (start, length and Q, the first tiles, the warps'
    merge, the stores), at ``per_sm`` blocks an SM (as :func:`tile_chain_s` interpolates); with ``fill`` (running
    blocks over SMs) under 1, on the way to ``decode.fixed_alone`` (a grid of a few blocks) where the profile has it.
    None where the profile has no such measurement."""
    entry, _ = _fixed_entry(profile, head_dim, stripes, fp8)
    if entry is None:
        return None
    cal = profile.calibration.decode
    cache, key = decode_keys(head_dim, stripes, fp8)
    full = _interpolate(entry.value, per_sm)
    alone = ((cal.fixed_alone or {}).get(cache, {})).get(key)
    if alone is not None and alone.value is not None and fill < 1.0:
        full = float(alone.value) + (full - float(alone.value)) * fill
    return max(0.0, full - r.first_launch_s() - r.l2_latency_s)


def _fixed_entry(profile, head_dim: int, stripes: int, fp8: bool):
    """(``decode.fixed_dram``'s entry, True) where the profile has it; else (``decode.fixed``'s, measured with the
    cache in L2 before 2026-11-29, False); else (None, False)."""
    cal = getattr(profile.calibration, "decode", None)
    cache, key = decode_keys(head_dim, stripes, fp8)
    for table, over_dram in ((getattr(cal, "fixed_dram", None), True), (getattr(cal, "fixed", None), False)):
        entry = (table or {}).get(cache, {}).get(key)
        if entry is not None:
            return entry, over_dram
    return None, False


def _interpolate(table: dict, per_sm: float) -> float:
    """A table by blocks an SM at ``per_sm``: linear between the measured counts and past the last two."""
    pts = sorted((int(k), float(v)) for k, v in table.items())
    if len(pts) == 1:
        return pts[0][1]
    (k0, t0), (k1, t1) = next(((a, b) for a, b in itertools.pairwise(pts) if per_sm <= b[0]), pts[-2:])
    return max(t0 + (t1 - t0) * (per_sm - k0) / (k1 - k0), min(t0, t1))


def combine_round_s(profile, head_dim: int, r: Rates) -> float:
    """``calibration.decode.combine_round`` at this head dim: a round of the combine's split loop (one L2 latency
    where the profile lacks it)."""
    cal = getattr(profile.calibration, "decode", None)
    table = cal.combine_round.value if cal is not None and cal.combine_round is not None else {}
    return float(table.get(head_dim, r.l2_latency_s))


def combine_fixed_s(profile, head_dim: int) -> float | None:
    """``calibration.decode.combine_fixed`` at this head dim: what the combine adds to a call beyond its rounds,
    measured after the split kernel (None where the profile lacks it: the model then composes it from the launch and
    L2 latencies)."""
    cal = getattr(profile.calibration, "decode", None)
    entry = cal.combine_fixed if cal is not None else None
    value = entry.value.get(head_dim) if entry is not None else None
    return float(value) if value is not None else None


def split_time(c: Conditions, work: Workload, registers: int) -> KernelTime:
    """The split kernel (module docstring)."""
    p, t, r = c.problem, work.tiles, c.rates
    d, e = p.head_dim, t.kv_bytes(p)  # the cache's element: what streams
    stripes = t.block_q // geo.STRIPE_ROWS
    row_blocks = cdiv(p.group * p.seq_len, t.block_q)
    slots = geo.decode_slots(c.profile, d, stripes, p.elem_bytes, registers, e, p.kv_heads)
    per_sm = max(1, slots // r.sms)
    keys = _split_keys(p, t, row_blocks)
    stream = keys * 2 * d * e  # K and V of the block's keys
    active = keys > 0
    running = min(int(active.sum()), slots)
    k_eff = max(1, min(per_sm, cdiv(running, r.sms)))  # blocks sharing an SM, on average
    tile = 2 * TILE_KEYS * d * e
    in_flight = WARPS * (geo.decode_stages(d) - 1) * tile

    def cap(k: int) -> float:  # a block's bytes/s with k blocks streaming on its SM
        chain = tile_chain_s(c.profile, d, stripes, bool(t.kv_dtype), k)
        return min(in_flight / c.latency if c.latency else math.inf,
                   WARPS * tile / chain if chain else math.inf,
                   tile / (_tile_seconds(p, t, r, WARPS * k, fp8_path(c.profile)) * k))

    hbm_read, hbm_write = work.hbm[0]
    total = float(stream.sum())
    # global K/V bytes per DRAM byte read (a batch with no key streams nothing: the bandwidth is then moot)
    reuse = (total / hbm_read if total else 1.0) if hbm_read else math.inf
    bandwidth = min(r.l2, r.dram_read * reuse)
    merge = 2 * WARPS * t.block_q * (d + 2) * 4 / (r.smem / r.sms)  # the warps' states through shared memory
    own = r.block_s + r.l2_latency_s + c.latency + merge
    measured = block_fixed_s(c.profile, d, stripes, bool(t.kv_dtype), k_eff, r, min(1.0, running / r.sms))
    if measured is not None and _fixed_entry(c.profile, d, stripes, bool(t.kv_dtype))[1]:
        own = max(0.0, measured - max(0.0, r.dram_latency_s - c.latency))  # over DRAM; a call in L2 waits less
    elif measured is not None:  # measured in L2: what its ring did not wait for added
        own = measured + max(0.0, c.latency - r.l2_latency_s)
    fixed = np.where(active, own, r.block_s + r.l2_latency_s)
    walk = fluid(stream, fixed, r.sms, per_sm, bandwidth, [math.inf] + [cap(k) for k in range(1, per_sm + 1)])
    dram = r.dram_s(hbm_read, hbm_write)
    seconds = r.first_launch_s() + max(walk + c.latency, dram)
    ideal = total / bandwidth
    bound = ("l2" if bandwidth == r.l2 else "dram") if ideal >= 0.8 * walk else "blocks"
    parts = {"utilization": min(1.0, len(keys) / slots), "splits": t.splits, "resident_blocks": per_sm,
             "blocks": walk, "stream": ideal, "dram": dram, "launch": r.first_launch_s(), "bound": bound}
    return KernelTime.of(work.counts.kernels[0].name, len(keys), seconds, parts)


def combine_time(c: Conditions, work: Workload, registers: int, resident_share: float) -> KernelTime:
    """The combine kernel (module docstring)."""
    p, t, r = c.problem, work.tiles, c.rates
    rows = p.batch * p.seq_len * p.heads
    ns = np.repeat(np.minimum(t.splits, cdiv(np.asarray(t.kv_lens, dtype=np.int64), t.chunk)), p.seq_len * p.heads)
    ns = np.concatenate([ns, np.zeros(-rows % WARPS, dtype=np.int64)]).reshape(-1, WARPS).max(axis=1)
    rounds = cdiv(ns, geo.combine_unroll(p.head_dim))  # a round: combine_unroll splits, their loads in flight together
    start = r.block_s + r.l2_latency_s  # a block's start and its length
    chain = start + rounds * combine_round_s(c.profile, p.head_dim, r)
    slots = resident_blocks(c.profile, geo.DECODE_THREADS, 0, registers)[0]
    placed = makespan(chain.astype(float), slots)
    read, write = work.hbm[1]
    cap = c.profile.l2.capacity.value
    from_l2 = bool(cap) and work.hbm[0][1] <= resident_share * cap  # the partials the split kernel just wrote
    streamed = read / (r.l2 if from_l2 else r.dram_read) + write / r.l2_write
    measured = combine_fixed_s(c.profile, p.head_dim)  # beyond its rounds after the split kernel, a start included
    call = r.next_launch_s() + r.l2_latency_s if measured is None else max(0.0, measured - start)
    seconds = call + max(placed, streamed)
    parts = {"utilization": min(1.0, len(ns) / slots), "blocks": placed, "stream": streamed,
             "launch": call, "bound": "latency" if placed >= streamed else ("l2" if from_l2 else "dram")}
    return KernelTime.of(work.counts.kernels[1].name, len(ns), seconds, parts)


def kernel_times(c: Conditions, work: Workload, resident_share: float) -> list[KernelTime]:
    """The split kernel's time, and the combine kernel's where there are several splits."""
    desc, p, t = c.desc, c.problem, work.tiles
    if not isinstance(t, PagedDecodingTiles):
        raise TypeError("iosim-decode's time model takes the tiles of iosim's decode kernel (simulate with "
                        "kernel='iosim-decode')")
    stripes = t.block_q // geo.STRIPE_ROWS
    out = [split_time(c, work, desc.decode_registers(p.head_dim, stripes))]
    if t.splits > 1:
        out.append(combine_time(c, work, desc.decode.combine_registers, resident_share))
    return out
