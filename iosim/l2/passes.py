"""flash1's passes: the first passes over the Q blocks counted from their tiles, the last ones walked.

Part of the L2 model; the model as a whole is described in :mod:`iosim.l2`. flash1's block runs one pass over the
Q blocks per K/V block j (Q_i, O_i, l_i, m_i read, O_i, l_i, m_i written for every i that sees j). When a pass
moves far more than L2 holds (the blocks resident at once together: ``STREAMING`` L2s), LRU keeps nothing of it
for the next pass, which starts over at i = 0: every tile of a pass misses, and each dirty tile is written back
before it is touched again. The walk then starts at a late pass ``c``, from a cold cache, and again at ``c + 1``;
the difference of the two is pass ``c``'s DRAM bytes, tensor by tensor. Each earlier pass (and the fills of O, l,
m before them) costs its requested bytes times pass ``c``'s ratio of DRAM to requested bytes for that tensor (1
for the tiles of one head; less for K/V that the heads of a group read together). It is taken only where pass c's
Q tiles all missed (a ratio within 0.5% of 1); else every pass is walked. The last passes are walked: they leave
the dirty lines at the end, and under a causal mask they grow short enough to fit in L2.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ._common import TENSOR_CODES
from .program import LoopProgram

STREAMING = 4  # a pass moves at least this many L2s (the most bytes L2 holds): LRU keeps nothing of it
TOLERANCE = 0.005  # pass c's Q tiles all missed: its ratio of DRAM to requested Q bytes is 1 within this


def pass_records(prog: LoopProgram) -> np.ndarray:
    """The first record of each pass (its K_j), in the block's order."""
    return np.flatnonzero((prog.atom_tensor[prog.atom] == TENSOR_CODES["K"]) & (prog.glen == 1))


def requested(prog: LoopProgram, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
    """Bytes read and written by records ``lo:hi`` of one head, by tensor (every record one atom)."""
    a, reps, w = prog.atom[lo:hi], prog.reps[lo:hi], prog.write[lo:hi]
    step = prog.step[lo:hi].astype(np.int64)
    nbytes = np.array([prog.atom_bytes[x:x + r].sum() if s else prog.atom_bytes[x] * r
                       for x, r, s in zip(a.tolist(), reps.tolist(), step.tolist())], dtype=np.int64)
    t, n = prog.atom_tensor[a], len(TENSOR_CODES)
    return (np.bincount(t[~w], nbytes[~w], minlength=n).astype(np.int64),
            np.bincount(t[w], nbytes[w], minlength=n).astype(np.int64))


def suffix(prog: LoopProgram, record: int) -> LoopProgram:
    """The program of a block that starts at ``record`` (a pass's first) with a cold cache."""
    acc = int(prog.reps[record:].sum())
    return replace(prog, ptr=np.array([record, len(prog.atom)], np.int64), block_accesses=np.array([acc], np.int64))


def cut(prog: LoopProgram, blocks_together: int, l2_bytes: int) -> int | None:
    """The pass ``c`` from which to walk (``c - 1`` and ``c`` both stream), or None (walk every pass)."""
    if prog.n_blocks != 1 or prog.rows != 1:
        return None
    starts = pass_records(prog)
    ends = np.append(starts[1:], len(prog.atom))
    moved = np.array([int(sum(x.sum() for x in requested(prog, s + 2, e)))
                      for s, e in zip(starts.tolist(), ends.tolist())])
    if len(starts) < 3 or np.any(np.diff(moved) > 0):  # passes that grow (K/V in reverse): walk them all
        return None
    streaming = np.flatnonzero(blocks_together * moved >= STREAMING * l2_bytes)  # a first run of passes
    if len(streaming) < 2 or streaming[0] != 0:
        return None
    c = int(streaming[-1])
    return c if c >= 2 else None


def walk_passes(prog: LoopProgram, walk, heads: int, blocks_together: int, l2_bytes: int) -> tuple | None:
    """``walk(program)`` -> (read, write by tensor, the walk, heads walked) from pass ``c - 1`` on, with every
    head's earlier passes extrapolated; None where the passes do not stream (walk them all)."""
    c = cut(prog, blocks_together, l2_bytes)
    if c is None:
        return None
    starts = pass_records(prog)
    long, short = walk(suffix(prog, int(starts[c - 1]))), walk(suffix(prog, int(starts[c])))
    both = extrapolate(prog, c, heads, long[:2], short[:2])
    if both is None:
        return None
    w = long[2]
    w.skipped += (prog.accesses - suffix(prog, int(starts[c - 1])).accesses) * heads
    w.accesses = prog.accesses * heads
    return both[0], both[1], w, long[3]


def extrapolate(prog: LoopProgram, c: int, heads: int, long: tuple, short: tuple) -> tuple | None:
    """DRAM bytes (read, write by tensor) of all heads from the walks from pass ``c - 1`` (``long``) and ``c``
    (``short``), each (read, write) by tensor, or None when pass ``c - 1`` did not stream."""
    starts = pass_records(prog)
    p_rd, p_wr = requested(prog, int(starts[c - 1]), int(starts[c]))
    d_rd, d_wr = long[0] - short[0], long[1] - short[1]
    q, o = TENSOR_CODES["Q"], TENSOR_CODES["O"]
    if abs(d_rd[q] - heads * p_rd[q]) > TOLERANCE * heads * p_rd[q]:
        return None
    if abs(d_wr[o] - heads * p_wr[o]) > TOLERANCE * heads * p_wr[o]:
        return None
    pre_rd, pre_wr = requested(prog, 0, int(starts[c - 1]))
    with np.errstate(divide="ignore", invalid="ignore"):
        r_rd = np.where(p_rd > 0, d_rd / (heads * np.maximum(p_rd, 1)), 1.0)
        r_wr = np.where(p_wr > 0, d_wr / (heads * np.maximum(p_wr, 1)), 1.0)
    rd = long[0] + np.rint(heads * pre_rd * r_rd).astype(np.int64)
    wr = long[1] + np.rint(heads * pre_wr * r_wr).astype(np.int64)
    return rd, wr
