"""iosim's fp8 (e4m3) FlashAttention-3 forward (kernels/flash3_fwd.cu's fp8 instantiations, issue 27), counted as the
kernel reads and writes its tensors: the ``flash3`` schedule's tile program with the kernel's fp8 layout.

    per Q block i (one consumer pair of the persistent grid):  load Q_i (fp8, Br x d), q_scale[i] (fp32)
        for each visited K/V block j:                         load K_j (fp8, Bc x d), k_scale[j] (fp32),
                                                              V^T_j (fp8, d x Bc'), v_scale[j] (fp32)
        epilogue:                                             write O_i in bf16 (the output dtype), L_i (fp32)

The layout the kernel reads (written by the quantize kernel, :mod:`iosim.schedules.fp8_quantize`):

* Q (B, N, H, d) and K (B, N_kv, H_kv, d) in e4m3, 1 byte an element;
* V transposed, V^T (B, H_kv, d, N_kv'), N_kv' = N_kv rounded up to ``FP8_KEY_GROUP`` = 16 keys (keys permuted
  within each group of 16 so that P·V_j's k32 steps read whole 16-byte rows): a K/V block's V^T tile holds
  Bc' = min(Bc, N_kv' - j·Bc) keys, so the last block reads the padding keys too (d·(N_kv' - N_kv) bytes more per
  visit of it when N_kv % 16 != 0);
* block quantization scales in fp32: q_scale (B, H, ceil(N/Br)), k_scale and v_scale (B, H_kv, ceil(N_kv/Bc)); a Q
  block reads its one q scale, every K/V block visit one k and one v scale (4 bytes each);
* O in bf16 (``OUTPUT_DTYPE``: the fp8 kernels' output is bf16, not e4m3), the logsumexp in fp32 as always.

The descaling arithmetic (q·k scales folded into the softmax scale, v's into P·V_j) is not counted: FLOPs are those
of the bf16 program. Everything else is FlashAttention-2's traffic (:mod:`iosim.schedules.flash2`): causal blocks above
the diagonal skipped, a Q block that sees no key writes O and L only.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..blocks import Rows, block_rows, cdiv, n_kv_blocks_visible
from ..counts import Counts
from ..problem import ELEMENT_BYTES, STAT_BYTES, AttentionProblem
from . import flash2
from .base import ScheduleError, Tiles

# fp8 e4m3 (kernels/flash3_fwd.cu's fp8 instantiations, issue 27), re-exported by iosim.launch.forward: the same
# block_q as bf16; block_kv a multiple of 64 (whole k32 steps of P V_j, in 64- or 128-byte swizzled panels of V^T).
# d=128: 192 ran 6-15% faster than 128 (H100, same run, docs/kernels.md); d=256: 128 spills (208 accumulator
# registers of 232)
FLASH3_FP8_TILES: dict[int, tuple[int, int]] = {64: (128, 128), 128: (128, 192), 256: (128, 64)}
# fp8 layout of V the kernel reads (written by iosim.gpu.quantize_fp8(..., transpose=True)): V^T, (B, H_kv, d,
# N_kv padded to FP8_KEY_GROUP), keys permuted within each group of FP8_KEY_GROUP (see kernels/flash3_fwd.cu)
FP8_KEY_GROUP = 16
OUTPUT_DTYPE = "bf16"  # what the fp8 kernels write O in
SOURCE_DTYPE = "bf16"  # what the quantize kernel reads Q, K, V in
LAYOUT = "iosim-fp8"
DRAM_MODEL = ("closed form (iosim.schedules.flash3_fp8.dram): every distinct byte read crosses DRAM once (a kv head's "
              "K, V^T and scales stay in L2 while its query heads' Q blocks run), every byte written once; the L2 "
              "model's walk does not hold the fp8 layout")


@dataclass(frozen=True)
class Fp8LayoutTiles(Tiles):
    """flash3's tiles with the fp8 layout of iosim's kernel (V^T padded to FP8_KEY_GROUP keys, block scales, bf16
    O). ``simulate`` hands them to ``flash3`` for a fp8 problem when the kernel description says
    ``fp8_layout: iosim`` (iosim-flash3)."""

    def __post_init__(self):
        super().__post_init__()
        if self.block_kv is None or self.block_kv % FP8_KEY_GROUP:
            raise ScheduleError(f"block_kv={self.block_kv!r}: iosim's fp8 layout needs a multiple of {FP8_KEY_GROUP} "
                                "keys (V^T's key groups), e.g. 64 or 128")

    def describe_options(self) -> dict:
        return {"layout": LAYOUT}


def padded_keys(kv_len):
    """N_kv' = N_kv rounded up to FP8_KEY_GROUP: the key axis of V^T."""
    return cdiv(kv_len, FP8_KEY_GROUP) * FP8_KEY_GROUP


def program(x, p: AttentionProblem, t: Tiles) -> None:
    """One head: flash3's thread blocks, reading the fp8 layout (module docstring)."""
    N, Nk, Nkp = p.seq_len, p.kv_len, padded_keys(p.kv_len)
    Br, Bc = t.block_q, t.block_kv
    Tr = cdiv(N, Br)

    with x.kernel("flash3_fwd", grid=Tr):
        for i in range(Tr):
            with x.thread_block():
                q = block_rows(i, Br, N)
                n_i = n_kv_blocks_visible(i, Br, Bc, N, Nk, p.causal)
                if n_i == 0:  # causal: no row of this block sees a key (early exit)
                    O_i, L_i = x.empty_output(q)
                    x.store("O", q, O_i, dtype=OUTPUT_DTYPE)
                    x.store("lse", q, L_i)
                    continue
                Q_i = x.load("Q", q)  # producer: TMA load of Q_i, and its scale
                x.load("q_scale", Rows(i, i + 1))
                O_i, l_i, m_i = x.init_state(q)
                for j in x.order(range(n_i)):
                    k = block_rows(j, Bc, Nk)
                    K_j = x.load("K", k)
                    x.load("k_scale", Rows(j, j + 1))
                    V_j = x.load("V", block_rows(j, Bc, Nkp))  # V^T_j: d x Bc' (padding keys of the last group)
                    x.load("v_scale", Rows(j, j + 1))
                    S_ij = x.scores(Q_i, K_j, q, k)
                    O_i, l_i, m_i = x.online_softmax(S_ij, V_j, O_i, l_i, m_i)
                O_i, L_i = x.finalize(O_i, l_i, m_i)
                x.store("O", q, O_i, dtype=OUTPUT_DTYPE)
                x.store("lse", q, L_i)


def _visits(p: AttentionProblem, t: Tiles) -> tuple[int, int, int, int]:
    """(K/V block visits Σ n_i, Q blocks that see a key, visits of the last K/V block, the most blocks one visits)."""
    Tr, Tc = cdiv(p.seq_len, t.block_q), cdiv(p.kv_len, t.block_kv)
    i = np.arange(Tr, dtype=np.int64)
    n = np.asarray(n_kv_blocks_visible(i, t.block_q, t.block_kv, p.seq_len, p.kv_len, p.causal), np.int64)
    n = n.reshape(Tr)
    return int(n.sum()), int((n > 0).sum()), int((n == Tc).sum()), int(n.max(initial=0))


def _pad_rows(p: AttentionProblem, t: Tiles) -> int:
    """Keys a V^T tile holds beyond its K tile, on the K/V block that holds the padding (the last one)."""
    last = (cdiv(p.kv_len, t.block_kv) - 1) * t.block_kv
    return min(t.block_kv, padded_keys(p.kv_len) - last) - min(t.block_kv, p.kv_len - last)


def closed_form(p: AttentionProblem, t: Tiles) -> Counts:
    """FlashAttention-2's closed form at 1-byte Q, K, V, plus: d·pad bytes of V^T per visit of the last K/V block
    (pad = N_kv' - N_kv), 4 B of q scale per Q block that sees a key, 4 B each of k and v scale per K/V block visit,
    O at 2 bytes an element (bf16)."""
    c = flash2.closed_form(p, t)
    (k,) = c.kernels
    k.name = "flash3_fwd"
    visits, q_blocks, last_visits, _ = _visits(p, t)
    d, e, pad = p.head_dim, p.elem_bytes, _pad_rows(p, t)
    extra_v = last_visits * pad * d * e
    k.global_read["V"] += extra_v
    k.global_read.update(q_scale=q_blocks * STAT_BYTES, k_scale=visits * STAT_BYTES, v_scale=visits * STAT_BYTES)
    k.global_write["O"] = p.seq_len * d * ELEMENT_BYTES[OUTPUT_DTYPE]
    scales = (q_blocks + 2 * visits) * STAT_BYTES
    k.sram_write += extra_v + scales  # each load is written into SRAM; V^T_j is read out by P·V_j
    k.sram_read += extra_v
    k.sram_peak = working_set(p, t)
    return Counts([k])


def working_set(p: AttentionProblem, t: Tiles) -> int:
    """The counted program's peak: FlashAttention-2's, the padding keys of a V^T tile, and the three scales."""
    d, e = p.head_dim, p.elem_bytes
    grow = (min(t.block_kv, padded_keys(p.kv_len)) - min(t.block_kv, p.kv_len)) * d * e  # the one tile, padded
    return int(flash2.working_set(p, t)) + grow + 3 * STAT_BYTES


def dram(p: AttentionProblem, t: Tiles) -> list[tuple[int, int]]:
    """DRAM (read, write) bytes of the whole call: every distinct byte read crosses DRAM once (a kv head's K, V^T and
    scales stay in L2 while its query heads' Q blocks run: the persistent grid walks a head's Q blocks, then the
    next head's, so a group's heads follow one another), every byte written once."""
    _, q_blocks, _, most = _visits(p, t)
    d, e = p.head_dim, p.elem_bytes
    rows_q = int(flash2.closed_form(p, t).kernels[0].global_read["Q"]) // (d * e)  # rows of blocks that see a key
    keys = min(p.kv_len, most * t.block_kv)
    keys_v = min(padded_keys(p.kv_len), most * t.block_kv)
    per_head = rows_q * d * e + q_blocks * STAT_BYTES
    per_kv_head = (keys + keys_v) * d * e + 2 * most * STAT_BYTES
    read = p.n_heads_total * per_head + p.batch * p.kv_heads * per_kv_head
    write = p.n_heads_total * p.seq_len * (d * ELEMENT_BYTES[OUTPUT_DTYPE] + STAT_BYTES)
    return [(read, write)]
