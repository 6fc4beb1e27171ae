"""DRAM bytes of flash2's forward on packed sequences (varlen): the varlen grid walked as one program.

kernels/flash_fwd.cu's varlen grid (:mod:`iosim.launch.varlen`) is (ceil(longest / Br), heads, sequences): the
blocks of sequence b run for every head before sequence b + 1's, a sequence's Q tiles from its last where causal or
windowed; a block past its sequence's last tile exits at once, touching nothing. :func:`packed_program` lays every
block that works out in that order as one program over one address space, head h's rows of Q, O and lse at
``h * total_q`` on, kv head k's rows of K and V at ``k * total_k`` on (so the query heads of a group share their
K/V tiles, as on the GPU), and the L2 model walks it as it walks one head of a dense problem (:func:`_run`: the
launch's residency, the profile's L2 inputs). Sequences in flight together share the cache, and a sequence's dirty
O is written back once what the blocks after it bring in pushes it out, as on the GPU. The walk takes every access
of every head (no head is extrapolated: the sequences differ); its steady K/V windows may be skipped as a dense
walk's are (``WalkOptions``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..blocks import cdiv, kv_block_range
from ..hardware.gpu import get_profile
from ..launch import launch_model
from ..problem import AttentionProblem
from ..schedules import Tiles
from ..schedules.flash2 import Flash2Tiles
from .atoms import atomize
from .model import PROFILE_INPUTS, L2Inputs, WalkOptions, _run
from .program import LoopProgram
from .trace import KernelTrace


@dataclass(frozen=True)
class PackedDram:
    """DRAM (read, write) bytes of a packed batch, and the model's text (``hbm_model``)."""

    read_bytes: int
    write_bytes: int
    text: str


def _blocks(p: AttentionProblem, t: Flash2Tiles) -> list[tuple[int, int, int, int, int, int]]:
    """(first and end Q row, first and end K/V row of its sequence, first and end K/V tile) of every block that
    works, in launch order, in the flattened rows of :func:`packed_program`."""
    Br, Bc, window = t.block_q, t.block_kv, t.window
    reverse = p.causal or window is not None  # the kernel's Causal || Local: a sequence's last tile first
    tq, tk = sum(n for n, _ in t.seqlens), sum(n for _, n in t.seqlens)
    out, q0, k0 = [], 0, 0
    for n, nk in t.seqlens:
        tiles = range(cdiv(n, Br))
        for h in range(p.heads):
            hq, hk = h * tq + q0, (h // (p.heads // p.kv_heads)) * tk + k0
            for i in (reversed(tiles) if reverse else tiles):
                lo, hi = kv_block_range(i, Br, Bc, n, nk, p.causal, window) if nk else (0, 0)
                out.append((hq + i * Br, hq + min((i + 1) * Br, n), hk, hk + nk, lo, max(lo, hi)))
        q0, k0 = q0 + n, k0 + nk
    return out


def packed_program(p: AttentionProblem, t: Flash2Tiles) -> tuple[LoopProgram, AttentionProblem]:
    """The varlen grid's blocks that work as one program (module docstring), and the one-head problem of its
    flattened rows. Per block: Q_i, the group (K_j, V_j) over its visited j (one record each, repeated), O_i, lse_i;
    a block that sees no key: O_i, lse_i. As :func:`iosim.l2.program.flash2_program` builds one dense head."""
    Bc = t.block_kv
    tq, tk = sum(n for n, _ in t.seqlens), sum(n for _, n in t.seqlens)
    flat = p.model_copy(update={"batch": 1, "heads": 1, "kv_heads": 1, "seq_len": max(1, p.heads * tq),
                                "kv_len": max(1, p.kv_heads * tk), "causal": False})
    b = np.array(_blocks(p, t), dtype=np.int64).reshape(-1, 6)
    q_lo, q_hi, kv0, kv_end, lo, hi = b.T
    n = hi - lo
    seen = n > 0
    cnt = np.where(seen, 5, 2)  # Q, K, V, O, lse, or O, lse
    ptr = np.zeros(len(b) + 1, dtype=np.int64)
    ptr[1:] = np.cumsum(cnt)
    blk = np.repeat(np.arange(len(b)), cnt)
    kk = np.arange(ptr[-1]) - ptr[blk]
    kk = np.where(seen[blk], kk, kk + 3)  # role: 0 Q, 1 K, 2 V, 3 O, 4 lse
    kv = (kk == 1) | (kk == 2)
    # a K/V record names its first tile (a sequence's last tile ends at its last key)
    r0 = np.where(kv, kv0[blk] + lo[blk] * Bc, q_lo[blk])
    r1 = np.where(kv, np.minimum(kv0[blk] + (lo[blk] + 1) * Bc, kv_end[blk]), q_hi[blk])
    codes = np.array([0, 1, 2, 3, 8], dtype=np.int8)[kk]
    # one extra block reads every K/V tile any block visits, so that the atoms are those of the whole trace
    xs, xe = _all_kv_tiles(kv0[seen], kv_end[seen], lo[seen], hi[seen], Bc)
    xc = np.tile(np.array([1, 2], dtype=np.int8), len(xs))
    m = len(kk)
    zeros = np.zeros(m + 2 * len(xs), dtype=np.int64)
    syn = KernelTrace("flash2_fwd", np.append(ptr, m + 2 * len(xs)), np.concatenate([codes, xc]),
                      np.concatenate([r0, np.repeat(xs, 2)]), np.concatenate([r1, np.repeat(xe, 2)]), zeros, zeros,
                      np.concatenate([kk >= 3, np.zeros(2 * len(xs), bool)]))
    at = atomize(syn, flat)
    reps = np.where(kv, n[blk], 1).astype(np.int64)
    step = kv.astype(np.int32)
    atom = at.acc_atom[:m]
    csum = np.concatenate([[0], np.cumsum(at.atom_bytes)])
    nbytes = csum[atom + reps] - csum[atom]
    wr = kk >= 3
    prog = LoopProgram("flash2_fwd", ptr, atom, at.acc_shape[:m], wr, step, np.where(kk == 2, 1, 0).astype(np.int32),
                       np.where(kv, 2, 1).astype(np.int32), reps, at.shapes, at.atom_bytes, at.atom_kv,
                       at.atom_tensor, int(nbytes[~wr].sum()), int(nbytes[wr].sum()), np.where(seen, 2 * n + 3, 2))
    return prog, flat


def _all_kv_tiles(kv0, kv_end, lo, hi, Bc: int) -> tuple[np.ndarray, np.ndarray]:
    """(first, end row) of every K/V tile some block visits: per (sequence, kv head), tiles min(lo) .. max(hi)."""
    starts, ends = [], []
    for k0 in np.unique(kv0):
        sel = kv0 == k0
        j = np.arange(lo[sel].min(), hi[sel].max())
        starts.append(k0 + j * Bc)
        ends.append(np.minimum(k0 + (j + 1) * Bc, kv_end[sel][0]))
    if not starts:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    return np.concatenate(starts), np.concatenate(ends)


def packed_dram(problem: AttentionProblem, tiles: Flash2Tiles, profile, walk: WalkOptions | None = None,
                inputs: L2Inputs = PROFILE_INPUTS) -> PackedDram:
    """DRAM bytes of flash2's forward on ``tiles.seqlens`` (``problem``: batch 1, the packed totals): the varlen grid
    walked as one program (:func:`packed_program`) at the residency of flash2's launch at these tiles; ``walk`` and
    ``inputs`` as :func:`iosim.l2.simulate_l2` takes them."""
    prog, flat = packed_program(problem, tiles)
    lm = launch_model("flash2", flat, Tiles(tiles.block_q, tiles.block_kv))  # forward block order: prog's own
    r = _run("flash2", flat, lm, lambda _: [prog], profile, inputs, walk or WalkOptions(), traced=False)
    text = (f"l2-lru over the varlen grid walked as one program (every head of every sequence in launch order): "
            f"{r.describe()}; L2 flushed before the kernel, dirty lines left at the end not written "
            "(Nsight Compute's conditions); iosim.l2.packed")
    sector = int(get_profile(profile).require("l2.sector_size"))
    table = table_sectors(tiles, sector) * sector
    if table:
        text += f"; plus the block table's live sectors read once, {table} B"
    return PackedDram(r.read_bytes + table, r.write_bytes, text)


def table_sectors(tiles: Flash2Tiles, sector_bytes: int) -> int:
    """Sectors (``sector_bytes``, the profile's L2 sector) of a paged cache's block table (a row of ``table_width``
    int32 entries per sequence) that hold an entry the kernel reads (each sequence's first ceil(keys / page_size)):
    each is read from DRAM once, kept in L2 for the rest of the kernel (a few kilobytes). The walk above leaves the
    table out, as it does the lengths."""
    if not getattr(tiles, "page_size", None):
        return 0
    per = sector_bytes // 4
    sectors = set()
    for s, (_, nk) in enumerate(tiles.seqlens):
        first = s * tiles.table_width
        sectors.update(range(first // per, (first + cdiv(nk, tiles.page_size) - 1) // per + 1) if nk else ())
    return len(sectors)
