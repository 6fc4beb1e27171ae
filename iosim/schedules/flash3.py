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

from ..blocks import block_rows, cdiv, kv_block_range
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


def make_tiles(p: AttentionProblem, profile, block_q=None, block_kv=None, tiling=None, window=None) -> Tiles:
    """The tiles given (or the default, :func:`default_tiles`); with ``tiling="iosim"`` (``simulate`` sets it from a
    description with ``fp8_layout: iosim``) and a fp8 problem, tiles that count iosim's fp8 layout; with a sliding
    ``window`` (left, right), FlashAttention-2's windowed tiles (:class:`iosim.schedules.flash2.Flash2Tiles`: the
    same K/V blocks are visited, kernels/flash3_fwd.cu's Local instantiations, 16-bit inputs)."""
    if tiling not in (None, "fa3", "iosim"):
        raise ScheduleError(f"flash3: tiling={tiling!r}; expected 'fa3' or 'iosim'")
    default = default_tiles(p, profile) if block_q is None or block_kv is None else None
    Br = block_q if block_q is not None else default.block_q
    Bc = block_kv if block_kv is not None else default.block_kv
    if window is not None:
        if p.dtype == "fp8":
            raise ScheduleError(f"flash3: window={window!r} with fp8: the windowed kernel takes 16-bit inputs")
        return flash2.make_tiles(p, profile, Br, Bc, window=window)
    if tiling == "iosim" and p.dtype == "fp8":
        return flash3_fp8.Fp8LayoutTiles(Br, Bc)
    return default if block_q is None and block_kv is None else Tiles(Br, Bc)


def program(x, p: AttentionProblem, t: Tiles) -> None:
    """One head: one thread block (producer + 2 consumer warpgroups) per Q block."""
    if isinstance(t, flash3_fp8.Fp8LayoutTiles):
        return flash3_fp8.program(x, p, t)
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
    c = flash2.closed_form(p, t)
    (k,) = c.kernels
    k.name = "flash3_fwd"
    k.sram_peak = flash2.working_set(p, t)
    return c


def _dram(p: AttentionProblem, t: Tiles) -> list[tuple[int, int]] | None:
    return flash3_fp8.dram(p, t) if isinstance(t, flash3_fp8.Fp8LayoutTiles) else None


# the Hopper pipeline's time (iosim.timing.fa3) instead of the plain roofline
SCHEDULE = Schedule(NAME, SUMMARY, program, closed_form, default_tiles, working_set, shared_memory, stats=STATS,
                    time_model="hopper", make_tiles=make_tiles, options=("tiling", "window"), dram=_dram,
                    dram_model=flash3_fp8.DRAM_MODEL)
