"""FlashAttention-3 forward: Shah et al., "FlashAttention-3: Fast and Accurate Attention with Asynchrony and
Low-precision" (2024), Algorithm 1 (the consumer/producer forward pass), counted as tiles.

    producer warpgroup (TMA):   load Q_i; for j: load K_j, V_j into a 2-stage circular buffer in shared memory
    consumer warpgroups (x2):   for j: S = Q_i K_jᵀ (wgmma); online softmax; O += P V_j (wgmma)
                                ping-pong: one warpgroup's softmax runs under the other's GEMMs;
                                inside a warpgroup the softmax of tile j runs under the QKᵀ GEMM of tile j+1
    epilogue:                   O = O / l; write O and L = m + log l

The traffic per tile is FlashAttention-2's (Q outer loop, K/V streamed, O and L written once, causal block
skipping, early exit for Q blocks that see no key): FA3 changes *when* things happen, not what moves. What
it changes is the time, modeled in :mod:`iosim.timing.fa3` (memory, tensor cores and the softmax overlapped rather
than summed), and the tiles: FA3's own (hopper/tile_size.h), with K/V double-buffered in shared memory and
O, S, P, statistics in registers. The counted tile program holds one K/V stage (``sram_peak``); the
allocation checked against the profile (``working_set``) holds both stages.

fp8 (e4m3, ``dtype="fp8"``), two kernels:

* **FlashAttention-3's published fp8 kernel** (no kernel named, or ``kernel="fa3"``/``"cudnn"``): 1-byte Q, K, V,
  the tensor-core rate of fp8 (:mod:`iosim.timing`), FA3's fp8 tiles (128 x 224 for d <= 128). Deviations from FA3's
  fp8 kernel, not modeled: O is stored in the problem dtype (FA3 writes bf16), and the in-kernel transpose of V and
  its per-tensor descale factors cost nothing here.
* **iosim's fp8 kernel** (``kernel="iosim-flash3"``, whose description says ``fp8_layout: iosim``): the same tile
  walk over the layout the kernel reads, :mod:`iosim.schedules.flash3_fp8`: V transposed and padded to 16 keys,
  one fp32 block scale per Q block and two per K/V block visit, O written in bf16; tiles
  ``iosim.launch.FLASH3_FP8_TILES``. Its DRAM bytes are a closed form (every distinct byte once), not the L2
  model's walk, whose flash2 program does not hold that layout. The quantize kernel that writes the layout is
  counted apart: ``simulate("fp8-quantize", ...)`` (:mod:`iosim.schedules.fp8_quantize`).
"""

from __future__ import annotations

import numpy as np

from ..blocks import Rows, block_rows, cdiv, kv_block_range, kv_block_ranges
from ..counts import Counts
from ..problem import STAT_BYTES, AttentionProblem
from . import flash2, flash3_fp8
from .base import Schedule, ScheduleError, Tiles
from .fit import shrink_to_fit

NAME = "flash3"
SUMMARY = "FlashAttention-3: FA2's traffic per tile, Hopper pipeline (TMA producer, ping-pong consumers) in the time"
STATS = ("lse",)
STAGES = 2  # K/V pipeline depth (flash-attention's hopper/flash_fwd_launch_template.h: kStages = 2)

# FA3's forward tiles (kBlockM, kBlockN) for fp16/bf16 by head dim, non-causal / causal (from
# Dao-AILab/flash-attention's hopper/tile_size.h). The smallest head dim >= d is used.
FA3_TILES = {64: ((192, 192), (192, 128)), 96: ((192, 144), (192, 144)), 128: ((128, 176), (128, 128)),
             192: ((128, 112), (128, 112)), 256: ((128, 80), (128, 80))}
FA3_TILES_FP8 = {128: ((128, 224), (128, 224))}  # fp8 e4m3, d <= 128 (same source); larger d: the table above


def default_tiles(p: AttentionProblem, profile) -> Tiles:
    """FA3's tiles for the head dim; where they do not fit, halve Bc, then Br, until they do."""
    table = FA3_TILES_FP8 if p.dtype == "fp8" and p.head_dim <= max(FA3_TILES_FP8) else FA3_TILES
    Br, Bc = next((table[k][p.causal] for k in sorted(table) if p.head_dim <= k), (64, 32))
    return shrink_to_fit(SCHEDULE, p, Br, Bc, profile)


def make_tiles(p: AttentionProblem, profile, block_q=None, block_kv=None, tiling=None, window=None,
               seqlens=None) -> Tiles:
    """The tiles given (or the default, :func:`default_tiles`); with ``tiling="iosim"`` (``simulate`` sets it from a
    description with ``fp8_layout: iosim``) and a fp8 problem, tiles that count iosim's fp8 layout; with a sliding
    ``window`` (left, right) or packed sequences ``seqlens``, FlashAttention-2's tiles with them
    (:class:`iosim.schedules.flash2.Flash2Tiles`: the same K/V blocks are visited, kernels/flash3_fwd.cu's Local and
    Varlen instantiations, 16-bit inputs; packed sequences are counted as that kernel loads them, :func:`program`)."""
    if tiling not in (None, "fa3", "iosim"):
        raise ScheduleError(f"flash3: tiling={tiling!r}; expected 'fa3' or 'iosim'")
    default = default_tiles(p, profile) if block_q is None or block_kv is None else None
    Br = block_q if block_q is not None else default.block_q
    Bc = block_kv if block_kv is not None else default.block_kv
    if window is not None or seqlens is not None:
        if p.dtype == "fp8":
            raise ScheduleError(f"flash3: window={window!r}, seqlens={seqlens!r} with fp8: the windowed and packed "
                                "kernels take 16-bit inputs")
        return flash2.make_tiles(p, profile, Br, Bc, window=window, seqlens=seqlens)
    if tiling == "iosim" and p.dtype == "fp8":
        return flash3_fp8.Fp8LayoutTiles(Br, Bc)
    return default if block_q is None and block_kv is None else Tiles(Br, Bc)


def program(x, p: AttentionProblem, t: Tiles) -> None:
    """One head: one thread block (producer + 2 consumer warpgroups) per Q block."""
    if isinstance(t, flash3_fp8.Fp8LayoutTiles):
        return flash3_fp8.program(x, p, t)
    if getattr(t, "seqlens", ()):
        return _packed_program(x, p, t)
    N, Nk = p.seq_len, p.kv_len
    Br, Bc, window = t.block_q, t.block_kv, getattr(t, "window", None)
    Tr = cdiv(N, Br)

    with x.kernel("flash3_fwd", grid=Tr):
        for i in range(Tr):
            with x.thread_block():
                q = block_rows(i, Br, N)
                lo, hi = kv_block_range(i, Br, Bc, N, Nk, p.causal, window)
                if hi <= lo:  # causal or windowed: no row of this block sees a key (early exit)
                    O_i, L_i = x.empty_output(q)
                    x.store("O", q, O_i)
                    x.store("lse", q, L_i)
                    continue
                Q_i = x.load("Q", q)  # producer: TMA load of Q_i
                O_i, l_i, m_i = x.init_state(q)
                for j in x.order(range(lo, hi)):
                    k = block_rows(j, Bc, Nk)
                    K_j = x.load("K", k)  # producer: TMA into stage j % 2
                    V_j = x.load("V", k)
                    S_ij = x.scores(Q_i, K_j, q, k)  # consumer: wgmma
                    O_i, l_i, m_i = x.online_softmax(S_ij, V_j, O_i, l_i, m_i)  # softmax, then wgmma P V_j
                O_i, L_i = x.finalize(O_i, l_i, m_i)  # epilogue
                x.store("O", q, O_i)
                x.store("lse", q, L_i)


def _packed_program(x, p: AttentionProblem, t) -> None:
    """One head of the packed sequences ``t.seqlens`` as kernels/flash3_fwd.cu's Varlen instantiation runs them: a
    thread block per Q tile of a sequence (the host's list, iosim.launch.flash3_schedule.varlen_tiles: sequence by
    sequence, a sequence's last tile first where causal or windowed). Its TMA boxes start at the sequence's first
    query and key rows of the packed tensors and are whole (Br query rows, Bc keys) up to the tensors' end, so a
    tile that ends past its sequence reads the next sequence's rows (:func:`_box`); it computes and writes its own
    rows only. The sequences' lengths (cu_seqlens) and the tile list come by plain loads, as the dense kernel's host
    schedule does, and are not counted (validation_record measures flash3's TMA bytes as its ``global``)."""
    Br, Bc, window = t.block_q, t.block_kv, t.window
    q0, k0 = _starts(t.seqlens)
    with x.kernel("flash3_fwd", grid=sum(cdiv(n, Br) for n, _ in t.seqlens)):
        for s, (N, Nk) in enumerate(t.seqlens):
            tiles = range(cdiv(N, Br))
            for i in (reversed(tiles) if p.causal or window is not None else tiles):
                with x.thread_block():
                    q = block_rows(i, Br, N)
                    lo, hi = kv_block_range(i, Br, Bc, N, Nk, p.causal, window)
                    if hi <= lo:  # no row of this tile sees a key: O = 0, lse = -inf, nothing loaded
                        O_i, L_i = x.empty_output(q)
                        x.store("O", q.shifted(q0[s]), O_i)
                        x.store("lse", q.shifted(q0[s]), L_i)
                        continue
                    Q_i = x.load("Q", _box(i, Br, q0[s], p.seq_len))
                    O_i, l_i, m_i = x.init_state(q)
                    for j in x.order(range(lo, hi)):
                        K_j = x.load("K", _box(j, Bc, k0[s], p.kv_len))
                        V_j = x.load("V", _box(j, Bc, k0[s], p.kv_len))
                        S_ij = x.scores(Q_i, K_j, q, block_rows(j, Bc, Nk))
                        O_i, l_i, m_i = x.online_softmax(S_ij, V_j, O_i, l_i, m_i)
                    O_i, L_i = x.finalize(O_i, l_i, m_i)
                    x.store("O", q.shifted(q0[s]), O_i)
                    x.store("lse", q.shifted(q0[s]), L_i)


def _starts(seqlens) -> tuple[list[int], list[int]]:
    """Each packed sequence's first query row and first key row."""
    q0, k0 = [0], [0]
    for n, nk in seqlens:
        q0.append(q0[-1] + n)
        k0.append(k0[-1] + nk)
    return q0, k0


def _box(i: int, rows: int, start: int, total: int) -> Rows:
    """Rows of the ``i``-th box of ``rows`` rows from a sequence's first row ``start`` in a packed tensor of
    ``total`` rows: whole, up to the tensor's end (TMA reads nothing past it)."""
    return Rows(start + i * rows, min(start + (i + 1) * rows, total))


def _packed_extra(p: AttentionProblem, t) -> tuple[int, int, int]:
    """What the Varlen kernel's whole boxes add over its sequences' own rows (:func:`_packed_program`): query rows
    loaded, query rows read by its steps (each loaded row once per K/V tile visited) and key rows loaded."""
    Br, Bc = t.block_q, t.block_kv
    q0, k0 = _starts(t.seqlens)
    dq = drv = dcv = 0
    for s, (N, Nk) in enumerate(t.seqlens):
        if N == 0:
            continue
        lo, hi = kv_block_ranges(N, Nk, Br, Bc, p.causal, t.window)
        n = np.maximum(hi - lo, 0)
        i = np.arange(len(n))
        extra = np.minimum(Br, p.seq_len - q0[s] - i * Br) - np.minimum(Br, N - i * Br)  # box rows past the sequence
        dq += int(np.sum(np.where(n > 0, extra, 0)))
        drv += int(np.sum(extra * n))
        last = cdiv(Nk, Bc) - 1  # only the sequence's last K/V tile can be ragged
        if last >= 0:
            kx = min(Bc, p.kv_len - k0[s] - last * Bc) - (Nk - last * Bc)
            dcv += kx * int(np.sum((n > 0) & (lo <= last) & (hi > last)))
    return dq, drv, dcv


def _packed_closed_form(p: AttentionProblem, t) -> Counts:
    """:func:`_packed_program` in closed form: flash2's packed counts at the same tiles, without its reads of the
    lengths and its exiting blocks, with the whole boxes' extra rows loaded and read."""
    c = flash2.closed_form(p, t)
    (k,) = c.kernels
    d, b = p.head_dim, p.elem_bytes
    for name in ("cu_seqlens_q", "cu_seqlens_k"):
        del k.global_read[name]
    launched = cdiv(max(1, max(n for n, _ in t.seqlens)), t.block_q) * len(t.seqlens)
    grid = sum(cdiv(n, t.block_q) for n, _ in t.seqlens)
    k.sram_write -= (2 * 2 * launched + grid) * 4  # flash2's one copy of each length read
    dq, drv, dcv = _packed_extra(p, t)
    k.global_read["Q"] += dq * d * b
    k.global_read["K"] += dcv * d * b
    k.global_read["V"] += dcv * d * b
    k.sram_write += (dq + 2 * dcv) * d * b
    k.sram_read += (drv + 2 * dcv) * d * b
    k.name, k.grid = "flash3_fwd", grid
    k.sram_peak = flash2.working_set(p, t)
    return c


def shared_memory(p: AttentionProblem, t: Tiles) -> int:
    """Q_i and STAGES stages of K_j, V_j."""
    b, d = p.elem_bytes, p.head_dim
    br, bc = min(t.block_q, p.seq_len), min(t.block_kv, p.kv_len)
    return br * d * b + STAGES * 2 * bc * d * b


def working_set(p: AttentionProblem, t: Tiles) -> int:
    """Shared memory plus registers: the fp32 O accumulator, S/P, l, m and L."""
    d = p.head_dim
    br, bc = min(t.block_q, p.seq_len), min(t.block_kv, p.kv_len)
    return shared_memory(p, t) + br * d * 4 + br * bc * 4 + 3 * br * STAT_BYTES


def closed_form(p: AttentionProblem, t: Tiles) -> Counts:
    """FlashAttention-2's closed form (the same tiles move), the kernel named flash3_fwd; the peak is that of
    the tile program, with one K/V stage. iosim's fp8 layout: :func:`iosim.schedules.flash3_fp8.closed_form`."""
    if isinstance(t, flash3_fp8.Fp8LayoutTiles):
        return flash3_fp8.closed_form(p, t)
    if getattr(t, "seqlens", ()):
        return _packed_closed_form(p, t)
    c = flash2.closed_form(p, t)
    (k,) = c.kernels
    k.name = "flash3_fwd"
    k.sram_peak = flash2.working_set(p, t)
    return c


def _dram(p: AttentionProblem, t: Tiles, profile) -> list[tuple[int, int]] | None:
    # every byte written counted (its record measures less: L2's dirty room, which decode's closed form applies, is
    # not applied here yet; docs/validation.md)
    return flash3_fp8.dram(p, t) if isinstance(t, flash3_fp8.Fp8LayoutTiles) else None


# the Hopper pipeline's time (iosim.timing.fa3) instead of the plain roofline
SCHEDULE = Schedule(NAME, SUMMARY, program, closed_form, default_tiles, working_set, shared_memory, stats=STATS,
                    time_model="hopper", make_tiles=make_tiles, options=("tiling", "window", "seqlens"), dram=_dram,
                    dram_model=flash3_fp8.DRAM_MODEL)
