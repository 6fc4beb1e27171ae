"""The fp8 quantize kernels (kernels/quantize_fp8.cu, issue 27): bf16 Q, K, V into the e4m3 layout iosim's fp8
flash3 kernel reads (:mod:`iosim.schedules.flash3_fp8`), counted as the kernel moves it. Not an attention schedule:
``simulate("fp8-quantize", problem)`` counts what runs before ``simulate("flash3", problem, kernel="iosim-flash3")``
on the same fp8 problem (tiles: the attention kernel's, Q in blocks of ``block_q`` rows, K and V of ``block_kv``).

    for each tensor X of Q, K, V (one launch each), one thread block per (batch, head, block of rows):
        load X_b (bf16)                      the amax pass
        load X_b (bf16) again                the quantize pass (the block was just read: mostly an L2 hit)
        s = amax(|X_b|) / 448; Y = X_b / s   (incoherent: X_b·diag(±1)·H_d first, in registers, Q and K only)
        store Y (e4m3; V as V^T, its key axis padded to 16 keys), store s (fp32)

Both loads are requests (``global``); the DRAM closed form (:func:`dram`) reads each input byte once. One unit is a
kv head with its group of query heads (K and V are quantized once per kv head). FLOPs ("other"): |x| and max per
element, one division per block, a multiply per element; incoherent processing adds the Walsh-Hadamard transform's
d·log2(d) additions per row (the ±1 diagonal flips signs: no FLOP). The e4m3 conversion is not a FLOP.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..blocks import Rows, block_rows, cdiv
from ..counts import Counts, KernelCounts
from ..problem import ELEMENT_BYTES, STAT_BYTES, AttentionProblem
from .base import Schedule, ScheduleError, Tiles
from .flash3_fp8 import FLASH3_FP8_TILES, SOURCE_DTYPE, padded_keys

NAME = "fp8-quantize"
SUMMARY = "fp8 block quantization of Q, K, V (bf16 in, e4m3 out, V transposed and padded), before iosim's fp8 flash3"
UNIT = "kv_head"
DRAM_MODEL = ("closed form (iosim.schedules.fp8_quantize.dram): each bf16 input byte crosses DRAM once (the "
              "quantize pass re-reads its block from L2), every byte written once")


@dataclass(frozen=True)
class QuantizeTiles(Tiles):
    """Rows per quantization block: ``block_q`` for Q, ``block_kv`` for K and V. ``incoherent``: Q and K rotated
    (random ±1 diagonal, then a Walsh-Hadamard transform along d) before they are quantized."""

    incoherent: bool = False

    def describe_options(self) -> dict:
        return {"incoherent": self.incoherent}


def make_tiles(p: AttentionProblem, profile, block_q=None, block_kv=None, incoherent=None) -> QuantizeTiles:
    """The attention kernel's fp8 tiles (``FLASH3_FP8_TILES``, the smallest head dim >= d) unless given."""
    if p.dtype != "fp8":
        raise ScheduleError(f"{NAME}: dtype={p.dtype!r}; the quantize kernel writes e4m3: give dtype='fp8' (its "
                            f"inputs are {SOURCE_DTYPE})")
    d = p.head_dim
    if incoherent and d & (d - 1):
        raise ScheduleError(f"{NAME}: incoherent processing takes a Walsh-Hadamard transform along d, which needs a "
                            f"power of two; head_dim={d}")
    Br, Bc = next((FLASH3_FP8_TILES[k] for k in sorted(FLASH3_FP8_TILES) if d <= k), FLASH3_FP8_TILES[256])
    return QuantizeTiles(block_q or Br, block_kv or Bc, incoherent=bool(incoherent))


def default_tiles(p: AttentionProblem, profile) -> QuantizeTiles:
    return make_tiles(p, profile)


def _quantize(x, tensor: str, rows: Rows, out: Rows, block: int, rotate: bool) -> None:
    """One thread block: the amax pass and the quantize pass over ``rows`` of ``tensor``; e4m3 to ``out``."""
    with x.thread_block():
        x.load(tensor, rows, dtype=SOURCE_DTYPE)  # amax pass
        X = x.load(tensor, rows, dtype=SOURCE_DTYPE)  # quantize pass
        Y, s = x.quantize(X, out, rotate)
        x.store(tensor, out, Y)
        x.store(f"{tensor.lower()}_scale", Rows(block, block + 1), s)


def program(x, p: AttentionProblem, t: Tiles) -> None:
    """One kv head with its group of query heads: three launches, one thread block per block of rows."""
    N, Nk, Nkp, G = p.seq_len, p.kv_len, padded_keys(p.kv_len), p.group
    Tr, Tc = cdiv(N, t.block_q), cdiv(Nk, t.block_kv)
    with x.kernel("quantize_q", grid=G * Tr):
        for _ in range(G):
            for i in range(Tr):
                q = block_rows(i, t.block_q, N)
                _quantize(x, "Q", q, q, i, t.incoherent)
    with x.kernel("quantize_k", grid=Tc):
        for j in range(Tc):
            k = block_rows(j, t.block_kv, Nk)
            _quantize(x, "K", k, k, j, t.incoherent)
    with x.kernel("quantize_v", grid=Tc):
        for j in range(Tc):  # V^T: the last block writes the padding keys of its group
            _quantize(x, "V", block_rows(j, t.block_kv, Nk), block_rows(j, t.block_kv, Nkp), j, False)


def _kernel(name: str, tensor: str, heads: int, rows: int, out_rows: int, block: int, p: AttentionProblem,
            rotate: bool) -> KernelCounts:
    """One launch's counts for ``heads`` heads of ``rows`` rows (``out_rows`` written) in blocks of ``block``."""
    d, src, e, s = p.head_dim, ELEMENT_BYTES[SOURCE_DTYPE], p.elem_bytes, STAT_BYTES
    blocks = cdiv(rows, block)
    k = KernelCounts(name, grid=heads * blocks)
    k.global_read[tensor] = heads * 2 * rows * d * src
    k.global_write.update({tensor: heads * out_rows * d * e, f"{tensor.lower()}_scale": heads * blocks * s})
    k.flops["other"] = heads * (2 * rows * d + blocks + (rows * d * int(math.log2(d)) if rotate else 0))
    k.sram_write = heads * (2 * rows * d * src + out_rows * d * e + blocks * s)  # two loads; Y and s
    k.sram_read = heads * (rows * d * src + out_rows * d * e + blocks * s)  # quantize reads X; the stores Y, s
    first_out = min(block, out_rows)
    k.sram_peak = min(block, rows) * d * src + first_out * d * e + s  # X_b, Y_b, s of the first (largest) block
    return k


def closed_form(p: AttentionProblem, t: Tiles) -> Counts:
    """One kv head: Q of its ``group`` query heads, K, V: bf16 read twice, e4m3 written (V^T: N_kv' keys), a scale
    per block."""
    N, Nk, G = p.seq_len, p.kv_len, p.group
    rot = getattr(t, "incoherent", False)
    return Counts([_kernel("quantize_q", "Q", G, N, N, t.block_q, p, rot),
                   _kernel("quantize_k", "K", 1, Nk, Nk, t.block_kv, p, rot),
                   _kernel("quantize_v", "V", 1, Nk, padded_keys(Nk), t.block_kv, p, False)])


def working_set(p: AttentionProblem, t: Tiles) -> int:
    """The largest thread block's registers: a bf16 block of rows, its e4m3 copy and its scale."""
    d, src, e = p.head_dim, ELEMENT_BYTES[SOURCE_DTYPE], p.elem_bytes
    rows = max(min(t.block_q, p.seq_len), min(t.block_kv, padded_keys(p.kv_len)))
    return rows * d * (src + e) + STAT_BYTES


def _no_smem(p: AttentionProblem, t: Tiles) -> int:
    return 0  # the block is held in registers


def dram(p: AttentionProblem, t: Tiles, profile=None) -> list[tuple[int, int]]:
    """DRAM (read, write) of each launch, the whole call: every input byte once, every byte written once (its record
    measures less: L2's dirty room, which decode's closed form applies, is not applied here yet; docs/validation.md).
    ``profile`` is not read."""
    units = p.batch * p.kv_heads
    return [(units * k.global_read_bytes // 2, units * k.global_write_bytes) for k in closed_form(p, t).kernels]


SCHEDULE = Schedule(NAME, SUMMARY, program, closed_form, default_tiles, working_set, _no_smem, unit=UNIT,
                    make_tiles=make_tiles, options=("incoherent",), dram=dram, dram_model=DRAM_MODEL)
