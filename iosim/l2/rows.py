"""naive's rows: the first rows of every head walked, the others extrapolated.

Part of the L2 model; the model as a whole is described in :mod:`iosim.l2`. naive's kernels are rows of alike
blocks (:mod:`iosim.l2.programs`): the scores kernel a row of blocks per Q tile, the softmax and P V kernels a block
per row. Once the first few rows have filled L2 and started the waves, each further row moves the same DRAM bytes
(its S or P tiles stream through L2; K or V is re-read, or kept, the same way every row). The walk runs the grid
with the first ``T``, ``2T`` and ``3T`` rows of every head; where the two increments agree (within
``TOLERANCE``, reads and writes), every further row costs the last increment's mean, tensor by tensor; else ``T``
doubles, and past a sixth of the rows every row is walked. ``T`` rows of every head cover two waves of resident
blocks, and ``T`` rows twice an L2 of the rows' own tiles.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..blocks import cdiv
from .program import LoopProgram

TOLERANCE = 0.005  # the two increments agree this well: every further row moves the same bytes


def prefix(prog: LoopProgram, rows: int) -> LoopProgram:
    """The program of the first ``rows`` rows (all full) of every head."""
    return replace(prog, rows=rows, full_rows=rows, ptr=prog.ptr[:prog.templates + 1],
                   block_accesses=prog.block_accesses[:prog.templates])


def _steady(d1: tuple, d2: tuple, slack: float) -> bool:
    for x, y in zip(d1, d2):
        if abs(x - y) > TOLERANCE * max(abs(x), abs(y)) + slack:
            return False
    return True


def _moved(x: tuple) -> tuple[int, int]:
    """(bytes read, bytes written to L2) of a walk: the written ones either evicted or dirty at the end (the end's
    state varies with where the waves stand; the sum of the two grows alike with every row)."""
    return int(x[0].sum()), int(x[1].sum()) + x[2].dirty


def walk_rows(prog: LoopProgram, walk, resident: int, l2_bytes: int, seq_len: int, heads: int) -> tuple | None:
    """``walk(program)`` -> (read, write by tensor, the walk, heads walked) of the first rows, the others
    extrapolated to the ``seq_len / row_height`` rows of a head (a last, partial row as its fraction); None where
    that saves little or the rows do not settle (walk them all)."""
    if prog.rows < 2 or not prog.row_height:
        return None
    blocks_per_row, rows = prog.templates, seq_len / prog.row_height
    row_bytes = int(prog.atom_bytes[:prog.row_stride].sum())  # a row's own tiles
    T = max(2, cdiv(2 * resident, blocks_per_row * heads), cdiv(2 * l2_bytes, max(1, row_bytes)))
    slack = 1e-4 * (prog.global_read + prog.global_write) / max(1, prog.rows)  # a ten-thousandth of a row
    while 3 * T <= prog.full_rows // 2:
        a, b, c = (walk(prefix(prog, k * T)) for k in (1, 2, 3))
        ma, mb, mc = _moved(a), _moved(b), _moved(c)
        if _steady((mb[0] - ma[0], mb[1] - ma[1]), (mc[0] - mb[0], mc[1] - mb[1]), slack * T):
            more = (rows - 3 * T) / T
            rd = c[0] + np.rint(more * (c[0] - b[0])).astype(np.int64)
            d_wr = c[1] - b[1]
            d_wr[np.argmax(d_wr)] += c[2].dirty - b[2].dirty  # the output's bytes left dirty move with the end
            wr = c[1] + np.rint(more * d_wr).astype(np.int64)
            w = c[2]
            total = prog.accesses * (w.accesses // max(1, prefix(prog, 3 * T).accesses))  # of the heads walked
            w.skipped += total - w.accesses
            w.accesses = total
            return rd, wr, w, c[3]
        T *= 2
    return None
