"""Time of standard attention (Algorithm 0) as three kernels: two tensor-core GEMMs and a memory-bound softmax.

    S = scale·QKᵀ   each thread block loads Q_i and K_j, multiplies, stores the 128×128 tile S_ij
    P = softmax(S)  each thread block loads rows of S, takes max, exp2 and sum, stores the rows of P
    O = P·V         each thread block steps through P_i and V in tiles of 64 keys (a ring of cp.async buffers)

A thread block runs its phases **in sequence**, as the FA2 model's blocks do (:mod:`iosim.timing.fa2`): it loads (at
its SM's share of L2 bandwidth, or of DRAM bandwidth for the bytes the cache model sends to DRAM), computes (whole
128-row tiles at the measured mma.sync rate of its warps; the softmax's exp2 and fp32 work) and stores (its share of
L2 write bandwidth, or of DRAM write bandwidth), after two dependent loads' latency and its start. P·V's loads do
not hide under its multiplies: measured alone (ncu), that kernel takes about its loads plus its multiplies, and as
long on the H200 as on the H100 whose DRAM is 1.46× slower. The k blocks resident on an SM overlap one another as
FA2's do, so a round of k blocks takes

    max( latency + t_seq·(1 + loss·(k−1)) , k·t_load , k·t_compute , k·t_store )

with loss = :data:`iosim.timing.overlap.OVERLAP_LOSS` (the time model's one fitted constant), except the scores
kernel's, whose blocks are one tile each and start together every round: they stay in phase, so nothing of one
block hides under another's (loss 1). A kernel takes its rounds, or its DRAM bytes over DRAM bandwidth where that is
longer, plus its launch: the call's first (the scores kernel) or a further one (:meth:`Rates.first_launch_s`).

**Measured rounds.** Where the profile holds ``calibration.forward.naive`` (:mod:`iosim.calibrate.naive_step`;
16-bit calls), the two GEMM kernels take instead the rounds measured of them: naive.cu multiplies whole 128-row tiles
at 41-51% of the tensor pipe (Nsight Compute, one query row), bound by no rate the blocks above compose. Each thread
block costs the measured time of a round of blocks like it (:func:`measured_tile_seconds`: its rows, its masked
units), the grid its whole rounds and a last partial one (:func:`measured_blocks_s`). The softmax keeps its
composed blocks, from L2, beside its DRAM bytes at the seconds a MB the calibration measured it stream at its row
length (:func:`softmax_s_per_mb`): 1.4-1.5 TB/s at 128-key rows, where the composition gave it DRAM's rate.

For the energy model (:mod:`iosim.timing.energy`) each kernel also says what naive.cu does beside the counts: the
tensor FLOPs of the tiles it multiplies, the bytes through shared memory, and its L2 bytes at its own tiles.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..blocks import cdiv, n_kv_blocks_visible
from ..counts import KernelCounts
from ..launch import (
    NAIVE_TILES,
    launch_model,
    naive_row_pitch,
    naive_softmax_chunks,
    naive_softmax_row_threads,
    naive_softmax_rows_per_block,
    resident_blocks,
)
from ..problem import AttentionProblem
from ..schedules import Tiles
from ..schedules import naive as naive_schedule
from . import overlap
from .estimate import Conditions, KernelTime
from .rates import Rates

MEASURED_PARTS = ("qk", "qk_row", "qk_masked", "pv", "pv_row", "pv_block", "pv_masked")  # calibration.forward.naive
OPTIONAL_PARTS = ("pv_block_row",)  # measured since (absent: pv_block at any rows)
BLOCK_ROWS = NAIVE_TILES["qk"]["block_m"]  # query rows of a scores tile and of a P·V block (128 in both)
SOFTMAX_OPS = 6  # fp32 operations per score: max pass, subtract-scale, sum, normalize, two conversions
WARPS_M, WARPS_N = 4, 2  # kernels/naive.cu: both GEMMs' 8 warps, 4 along the rows (32 each) x 2 along the columns


@dataclass(frozen=True)
class Block:
    """One thread block's phases in seconds, each at the rates one block gets alone on its SM."""

    load_s: float
    compute_s: float
    store_s: float
    latency_s: float  # dependent loads nothing in the block hides
    steps: float = 1  # a block's compute_s steps (P·V: its K/V steps), on average: masked tiles are not multiplied
    in_phase: bool = False  # blocks of one tile that start together each round: no phase hides under another
    unit: str = "tensor"  # what computes: the tensor cores, or the softmax's exp2 and fp32 lanes

    def busy_s(self) -> float:
        """The phases that take the SM's issue slots, memory share or tensor cores, one after another."""
        return self.load_s + self.steps * self.compute_s + self.store_s

    def limits(self, k: int, shared_compute_s: float) -> dict[str, float]:
        """What a round of ``k`` resident blocks takes by each limit: their phases in sequence (latency overlaps
        freely; each further block adds ``loss`` of its busy phases) and the SM's shared load, compute and store
        (``shared_compute_s``: one step's compute with k blocks' warps sharing the units)."""
        loss = 1.0 if self.in_phase else overlap.OVERLAP_LOSS
        return {"sequence": self.latency_s + self.busy_s() * (1 + loss * (k - 1)), "load": k * self.load_s,
                self.unit: k * self.steps * shared_compute_s, "store": k * self.store_s}


def _tile_flops(p: AttentionProblem, i: int) -> float:
    """FLOPs one block's tensor cores run: its whole tile (128 rows even where fewer are real)."""
    if i == 0:
        t = NAIVE_TILES["qk"]
        return 2.0 * t["block_m"] * t["block_n"] * p.head_dim
    t = NAIVE_TILES["pv"]
    return 2.0 * t["block_m"] * cdiv(p.kv_len, t["block_k"]) * t["block_k"] * p.head_dim


def _grid(p: AttentionProblem, i: int, k: KernelCounts) -> int:
    """Thread blocks kernel ``i`` launches: the counts' tiles, or for the softmax its rows grouped as naive.cu
    groups them (256 / row_threads rows of a block)."""
    if i != 1:
        return max(k.grid, 1)
    return cdiv(p.n_heads_total * p.seq_len, naive_softmax_rows_per_block(p.kv_len, p.elem_bytes))


def _block(p: AttentionProblem, i: int, k: KernelCounts, grid: int, r: Rates, dram: tuple[float, float],
           warps: int, latency: float) -> tuple[Block, float]:
    """Kernel ``i``'s thread block, and the work of its compute phase (one step): FLOPs of a GEMM, operations of
    the softmax. Loads and stores go at the block's SM's share of L2 bandwidth, or of DRAM bandwidth for the bytes
    the cache model sends to DRAM."""
    rd, wr = dram
    s, wait = r.sms, 2 * latency + r.block_s  # operands in, results out; the block's start
    load = max(k.global_read_bytes / grid / (r.l2 / s), rd / grid / (r.dram_read / s))
    store = max(k.global_write_bytes / grid / (r.l2_write / s), wr / grid / (r.dram_write / s))
    if i == 1:  # softmax: exp2 and fp32 operations, no tensor cores
        scores = p.n_heads_total * p.seq_len * p.kv_len / grid
        compute = scores / (r.ex2 / s) + SOFTMAX_OPS * scores / (r.alu / s)
        return Block(load, compute, store, wait, unit="softmax"), compute
    flops = _tile_flops(p, i)
    steps = 1 if i == 0 else cdiv(p.kv_len, NAIVE_TILES["pv"]["block_k"])
    per_step = flops / steps
    _, _, loaded, done = _tiles(p, i)
    multiplied = steps * done / loaded  # a block's steps multiplied, on average: causally masked tiles are not
    return Block(load, per_step / (r.mma_at(warps) / s), store, wait, multiplied, in_phase=i == 0), per_step


def _tiles(p: AttentionProblem, i: int) -> tuple[int, int, int, int]:
    """GEMM kernel ``i``'s tile (rows, keys) and its tiles loaded and multiplied: the causal mask's tiles wholly
    right of every row's diagonal are loaded (the schedule counts them), not multiplied."""
    t = NAIVE_TILES["qk" if i == 0 else "pv"]
    bm, bk, heads = t["block_m"], t.get("block_n", t.get("block_k")), p.n_heads_total
    rows = cdiv(p.seq_len, bm)
    done = int(np.sum(n_kv_blocks_visible(np.arange(rows), bm, bk, p.seq_len, p.kv_len, p.causal))) * heads
    return bm, bk, rows * cdiv(p.kv_len, bk) * heads, done


def tensor_flops(p: AttentionProblem, i: int) -> float:
    """FLOPs kernel ``i``'s tensor cores run (the energy model's): its tiles multiplied, whole."""
    if i == 1:
        return 0.0
    bm, bk, _, done = _tiles(p, i)
    return float(done * 2 * bm * bk * p.head_dim)


def l2_bytes(p: AttentionProblem) -> list[float]:
    """Bytes each kernel moves between the SMs and L2 (the energy model's): the schedule's global bytes at naive.cu's
    tiles (Q_i read once per key tile, K_j and V once per 128 query rows). The description's counts are the paper's,
    each operand read once, which the time model's block phases take (the kernels hide those re-reads, which come
    from L2)."""
    t = NAIVE_TILES["qk"]
    counts = naive_schedule.closed_form(p, Tiles(t["block_m"], t["block_n"]))
    return [float((k.global_read_bytes + k.global_write_bytes) * p.n_heads_total) for k in counts.kernels]


def smem_bytes(p: AttentionProblem, i: int) -> float:
    """Bytes through shared memory of kernel ``i`` (the energy model's): each GEMM tile's operands landed (cp.async)
    and, where it is multiplied, read by the warps (warp (wm, wn) reads its 32 rows of A and its columns of B: A
    twice, B four times); S staged for its stores. The softmax's rows stay in registers."""
    if i == 1:
        return 0.0
    d, e = p.head_dim, p.elem_bytes
    bm, bk, loaded, done = _tiles(p, i)
    if i == 0:  # a tile: Q_i and K_j (bm x d, bk x d); S_ij staged (written, read)
        return float(loaded * (bm + bk) * d * e + done * (WARPS_N * bm + WARPS_M * bk) * d * e
                     + loaded * 2 * bm * bk * e)
    return float(loaded * (bm + d) * bk * e + done * (WARPS_N * bm + WARPS_M * d) * bk * e)  # P and V tiles


def residency(profile, head_dim: int, i: int) -> int:
    """Blocks of naive.cu's kernel ``i`` (0 scores, 1 softmax, 2 P·V) resident on an SM of ``profile`` at ``head_dim``
    (the launch model's threads, shared memory and registers; the softmax's at a 128-key row)."""
    p = AttentionProblem(batch=1, heads=1, seq_len=128, kv_len=128, head_dim=head_dim)
    km = launch_model("naive", p, Tiles(NAIVE_TILES["qk"]["block_m"], NAIVE_TILES["qk"]["block_n"])).kernels[i]
    threads = NAIVE_TILES["softmax"]["threads"] if i == 1 else km.threads
    total, _ = resident_blocks(profile, threads, km.smem, km.registers)
    return max(1, total // int(profile.require("sm_count")))


def measured_parts(profile, p: AttentionProblem) -> dict[str, float] | None:
    """``calibration.forward.naive`` at the problem's head dim, part by part (seconds;
    :mod:`iosim.calibrate.naive_step`), for a 16-bit problem where every part was measured; else None (the composed
    blocks)."""
    cal = getattr(profile.calibration, "forward", None) if profile.calibration is not None else None
    table = getattr(cal, "naive", None) if cal is not None else None
    if not table or p.elem_bytes != 2 or any(part not in table or p.head_dim not in table[part].value
                                             for part in MEASURED_PARTS):
        return None
    optional = [part for part in OPTIONAL_PARTS if part in table and p.head_dim in table[part].value]
    return {part: float(table[part].value[p.head_dim]) for part in (*MEASURED_PARTS, *optional)}


def softmax_fill(kv_len: int) -> tuple[int, float]:
    """The softmax instantiation's row slots (threads a row x 16-byte chunks a thread, in keys) at ``kv_len``, and the
    share of them a row fills (0 slots: the shared-memory path of rows past the register path)."""
    rt, chunks = naive_softmax_row_threads(kv_len, 2), naive_softmax_chunks(kv_len, 2)
    slots = rt * chunks * 8
    return slots, (naive_row_pitch(kv_len, 2) / slots if slots else 1.0)


def softmax_s_per_mb(profile, p: AttentionProblem) -> float | None:
    """``calibration.forward.naive.softmax_mb`` at the problem's row length: seconds the softmax takes a MB of S
    streamed from DRAM (and a MB of P written). A block's time is a fixed part and a part per byte, so at a share f
    of its instantiation's slots filled the seconds a MB are linear in 1/f: through the instantiation's full and
    half-full measurements. Rows past the register path take the longest measured instantiation's, full. None for
    a profile without it or a problem not 16-bit."""
    cal = getattr(profile.calibration, "forward", None) if profile.calibration is not None else None
    entry = (getattr(cal, "naive", None) or {}).get("softmax_mb") if cal is not None else None
    if entry is None or p.elem_bytes != 2:
        return None
    table = entry.value
    slots, fill = softmax_fill(p.kv_len)
    smem = sorted(k for k in table if not softmax_fill(k)[0])  # rows through shared memory, where measured
    if not slots and smem:  # that path: linear in log2(kv_len) between its measured lengths, the nearest outside
        x = np.log2(np.clip(p.kv_len, smem[0], smem[-1]))
        return float(np.interp(x, np.log2(smem), [table[k] for k in smem]))
    if slots not in table:  # the shared-memory path unmeasured (the longest measured), or an instantiation not
        slots = max(table) if not slots else min(table, key=lambda k: abs(np.log2(k) - np.log2(slots)))
        fill = 1.0
    partial = [k for k in table if k != slots and softmax_fill(k)[0] == slots]
    if not partial or fill >= 1.0:
        return float(table[slots])
    half = partial[0]
    x = (1 / fill - 1) / (1 / softmax_fill(half)[1] - 1)
    return float(table[slots] + x * (table[half] - table[slots]))


def _by_rows(m: dict[str, float], part: str, rows: np.ndarray) -> np.ndarray:
    """A tile's (a block's) time at ``rows`` real query rows: linear between the one-row and the whole-tile
    measurements (the multiplies are the whole tile's at any rows; Q's loads and S's and O's stores grow with the
    rows)."""
    whole, one = m[part], m[f"{part}_row"]
    return one + (rows - 1) / (BLOCK_ROWS - 1) * (whole - one)


def _row_tiles(p: AttentionProblem) -> tuple[np.ndarray, np.ndarray]:
    """Each query row tile's first row and real rows (the last tile may be short)."""
    m0 = np.arange(cdiv(p.seq_len, BLOCK_ROWS)) * BLOCK_ROWS
    return m0, np.minimum(BLOCK_ROWS, p.seq_len - m0)


def measured_tile_seconds(p: AttentionProblem, m: dict[str, float], i: int) -> tuple[float, int]:
    """Kernel ``i``'s (0 scores, 2 P·V) round times summed over one head's thread blocks, and those blocks: a block's
    round time is the measured time of a round of resident blocks like it. Scores: per tile, ``qk`` at its rows, or
    ``qk_masked`` where naive.cu skips its multiplies (every key right of the tile's last row's diagonal, that row
    counted as the tile's 128th even past seq_len, as the kernel does). P·V: per block, ``pv_block`` and its 64-key
    steps, ``pv`` at its rows where they are multiplied, ``pv_masked`` past its last visible key."""
    m0, rows = _row_tiles(p)
    offset = p.kv_len - p.seq_len
    if i == 0:
        tc = cdiv(p.kv_len, NAIVE_TILES["qk"]["block_n"])
        last = m0 + BLOCK_ROWS - 1 + offset if p.causal else np.full_like(m0, p.kv_len - 1)
        seen = np.clip(last // NAIVE_TILES["qk"]["block_n"] + 1, 0, tc)
        return float(np.sum(seen * _by_rows(m, "qk", rows) + (tc - seen) * m["qk_masked"])), int(m0.size * tc)
    steps = cdiv(p.kv_len, NAIVE_TILES["pv"]["block_k"])
    last = m0 + rows - 1 + offset if p.causal else np.full_like(m0, p.kv_len - 1)
    seen = np.clip(last // NAIVE_TILES["pv"]["block_k"] + 1, 0, steps)
    block = _by_rows(m, "pv_block", rows) if "pv_block_row" in m else m["pv_block"]
    return float(np.sum(block + seen * _by_rows(m, "pv", rows) + (steps - seen) * m["pv_masked"])), int(m0.size)


def measured_blocks_s(p: AttentionProblem, m: dict[str, float], i: int, sms: int, k: int) -> tuple[float, int, float]:
    """Seconds kernel ``i``'s grid takes at ``k`` blocks an SM from the measured round times: its whole rounds at
    the blocks' mean round time, and a last partial round at the share of it its blocks on the busiest SM make
    (``per_sm`` / k). Also its rounds and the mean round time."""
    total, per_head = measured_tile_seconds(p, m, i)
    grid = per_head * p.n_heads_total
    mean = total / per_head
    whole, rest = divmod(grid, sms * k)
    return (whole + (cdiv(rest, sms) / k if rest else 0.0)) * mean, whole + (1 if rest else 0), mean


def kernel_times(c: Conditions, tiles: Tiles, counts: list[KernelCounts],
                 dram: list[tuple[float, float]]) -> list[KernelTime]:
    """The time of each of the three kernels (``counts``, with ``dram[k]`` = kernel k's DRAM (read, write) bytes),
    its parts and its bound."""
    p, profile, r, latency = c.problem, c.profile, c.rates, c.latency
    lm = launch_model("naive", p, tiles)
    l2 = l2_bytes(p)
    steps = measured_parts(profile, p)
    out = []
    for i, (k, (rd, wr)) in enumerate(zip(counts, dram, strict=True)):
        km = lm.kernels[i]
        threads = NAIVE_TILES["softmax"]["threads"] if i == 1 else km.threads
        total, _ = resident_blocks(profile, threads, km.smem, km.registers)
        grid = _grid(p, i, k)
        per_sm = min(max(1, total // r.sms), cdiv(grid, r.sms))  # a partial wave spreads over the SMs
        memory = r.dram_s(rd, wr)
        launch = r.first_launch_s() if i == 0 else r.next_launch_s()  # three kernels, one call
        if steps is not None and i != 1:  # the GEMMs' measured rounds
            blocks, rounds, mean = measured_blocks_s(p, steps, i, r.sms, max(1, total // r.sms))
            parts = {"blocks": blocks, "dram": memory, "round": mean, "rounds": rounds, "resident_blocks": per_sm,
                     "launch": launch}
            bound = "dram" if memory > blocks else "sequence"  # its blocks' measured rounds
            parts = {"utilization": 1.0, **parts, "bound": bound}
            out.append(KernelTime.of(k.name, k.grid, max(blocks, memory) + launch, parts, smem_bytes(p, i),
                                     tensor_flops(p, i), l2[i]))
            continue
        rounds = cdiv(grid, r.sms * per_sm)
        per_mb = softmax_s_per_mb(profile, p) if i == 1 else None
        if per_mb is not None:  # the softmax's measured streaming: its blocks' phases from L2, its DRAM bytes apart
            memory = (rd + wr) / 2 / 1e6 * per_mb
        blk, work = _block(p, i, k, grid, r, (0.0, 0.0) if per_mb is not None else (rd, wr), threads // 32, latency)
        shared = blk.compute_s if i == 1 else work / (r.mma_at(per_sm * threads // 32) / r.sms)
        limits = blk.limits(per_sm, shared)
        blocks = rounds * max(limits.values())
        parts = {"blocks": blocks, "dram": memory, "block_load": blk.load_s, "block_compute": blk.compute_s,
                 "block_store": blk.store_s, "rounds": rounds, "resident_blocks": per_sm,
                 "launch": launch}
        bound = "dram" if memory > blocks else max(limits, key=limits.get)
        parts = {"utilization": 1.0, **parts, "bound": bound}
        out.append(KernelTime.of(k.name, k.grid, max(blocks, memory) + launch, parts, smem_bytes(p, i),
                                 tensor_flops(p, i), l2[i]))
    return out


def tile_note() -> str:
    return f"qk tile {NAIVE_TILES['qk']}, pv tile {NAIVE_TILES['pv']}"
