"""Loop programs: one head's tile accesses as the round loop reads them, repeated groups kept compact.

Part of the L2 model; the model as a whole is described in :mod:`iosim.l2`. A record touches one atom (or a
rectangle of atoms, ``shape``) at its first repetition; records form groups (``glen`` records, this one
``gidx``-th) that run ``reps`` times, every record's atom moving by its ``step`` each time. Any trace is a program of
groups of one record run once (:func:`from_trace`); flash2's K/V loop is one group of two records (K_j, V_j) per
thread block (:func:`flash2_program`), so a head of N = 1,048,576 tokens (8192 blocks x 65,539 accesses) is 40,960
records and 90,112 atoms instead of 537 million accesses (4.8 GB as arrays).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..blocks import cdiv, kv_block_ranges
from ..problem import AttentionProblem
from ..schedules import Tiles
from .atoms import _access_bytes, atomize
from .trace import KernelTrace


@dataclass
class LoopProgram:
    """One kernel's accesses for one head: template block t's records are ``ptr[t]:ptr[t+1]``. Block b of the head
    is template block ``b mod templates`` in row ``b div templates``; row r's Q-side atoms (all but K/V's) are those
    of row 0 moved by ``r * row_stride``. With ``row_wrap`` > 0 the rows of every head in turn (head h's row r is
    row ``h * full_rows + r``) share ``row_wrap`` rows of atoms: each row's tiles are touched once, and evicted long
    before the row that many rows later comes. A row from ``full_rows`` on (the last, partial row of tiles) is the
    template blocks after the first ``templates``, whose records name their atoms as they are (shared by all heads
    with a row wrap). A program without rows: one row of every block."""

    name: str
    ptr: np.ndarray  # int64 [template blocks + 1]
    atom: np.ndarray  # int32 per record: its first atom at the group's first repetition
    shape: np.ndarray  # int32 per record: 0 = one atom, k > 0 = row k of ``shapes``
    write: np.ndarray  # bool per record
    step: np.ndarray  # int32 per record: atom offset per repetition of its group
    gidx: np.ndarray  # int32 per record: its index in its group
    glen: np.ndarray  # int32 per record: records in its group
    reps: np.ndarray  # int64 per record: repetitions of its group
    shapes: np.ndarray  # int64 [K, 3] (rows of atoms, cols, stride)
    atom_bytes: np.ndarray  # int64 [A]
    atom_kv: np.ndarray  # bool [A]
    atom_tensor: np.ndarray  # int64 [A]
    global_read: int  # requested bytes of one head
    global_write: int
    block_accesses: np.ndarray  # int64 [template blocks]: accesses of each, groups expanded
    templates: int = 0  # template blocks per row (0: all of them, one row)
    rows: int = 1
    row_stride: int = 0
    row_wrap: int = 0
    full_rows: int = 1  # a row from this one on is the last, partial row
    row_height: int = 0  # query rows of a full row (0: no rows)
    unit: str = "head"  # what one of the grid's heads is: a query head, or a kv head (:mod:`iosim.l2.backward`)

    def __post_init__(self):
        if not self.templates:
            self.templates = len(self.ptr) - 1

    @property
    def n_blocks(self) -> int:
        return self.templates * self.rows

    @property
    def accesses(self) -> int:
        """Accesses of one head, groups expanded."""
        full = int(self.block_accesses[:self.templates].sum()) * min(self.rows, self.full_rows)
        return full + (int(self.block_accesses[self.templates:].sum()) if self.rows > self.full_rows else 0)

    def layout(self, reverse: bool) -> np.ndarray:
        """The grid's layout of one head's blocks, as the round loop reads it (:mod:`iosim.l2.lru`)."""
        return np.array([self.n_blocks, int(reverse), self.templates, self.row_stride, self.row_wrap,
                         self.full_rows, self.strides[1]], dtype=np.int64)

    @property
    def strides(self) -> tuple[int, int]:
        """Atoms between the Q-side atoms of two heads, and between the K/V atoms of two K/V heads. With a row
        wrap the heads share their Q-side atoms, and K/V's are last: K/V head k's follow the Q-side ones and the
        K/V atoms of the k heads before it."""
        n = len(self.atom_bytes)
        if self.row_wrap:
            return 0, int(self.atom_kv.sum())
        return n, n

    def block(self, b: int) -> tuple[int, int]:
        """(template block, Q-side atom offset) of block ``b`` of the head."""
        t, r = b % self.templates, b // self.templates
        if r >= self.full_rows:
            return t + self.templates, 0
        return t, (r % self.row_wrap if self.row_wrap else r) * self.row_stride


def from_trace(kt: KernelTrace, p: AttentionProblem) -> LoopProgram:
    """A trace as a program of single records."""
    at = atomize(kt, p)
    n = len(kt.tensor)
    nbytes = _access_bytes(kt, p)
    one = np.ones(n, np.int32)
    return LoopProgram(kt.name, kt.ptr, at.acc_atom, at.acc_shape, kt.write, np.zeros(n, np.int32),
                       np.zeros(n, np.int32), one, one.astype(np.int64), at.shapes, at.atom_bytes, at.atom_kv,
                       at.atom_tensor, int(nbytes[~kt.write].sum()), int(nbytes[kt.write].sum()), np.diff(kt.ptr))


def flash2_program(p: AttentionProblem, t: Tiles, kv_order: str = "forward") -> LoopProgram:
    """flash2's program of one head: per block Q_i, the group (K_j, V_j) over its visible j in ``kv_order``, O_i,
    lse_i (a block that sees no key: O_i, lse_i); with a sliding window (``t.window``) the visible j are the range
    :func:`iosim.blocks.kv_block_range` gives. Equal, expanded, to the atomized trace (tests)."""
    N, Nk, Br, Bc = p.seq_len, p.kv_len, t.block_q, t.block_kv
    Tr = cdiv(N, Br)
    i = np.arange(Tr, dtype=np.int64)
    lo, hi = kv_block_ranges(N, Nk, Br, Bc, p.causal, getattr(t, "window", None))
    n = np.maximum(hi - lo, 0)
    seen = n > 0
    cnt = np.where(seen, 5, 2)  # Q, K, V, O, lse, or O, lse
    ptr = np.zeros(Tr + 1, dtype=np.int64)
    ptr[1:] = np.cumsum(cnt)
    blk = np.repeat(i, cnt)
    kk = np.arange(ptr[-1]) - ptr[blk]
    kk = np.where(seen[blk], kk, kk + 3)  # role: 0 Q, 1 K, 2 V, 3 O, 4 lse
    reverse = kv_order == "reverse"
    j0 = (lo + np.where(reverse, n - 1, 0))[blk]
    kv = (kk == 1) | (kk == 2)
    r0 = np.where(kv, j0 * Bc, blk * Br)
    r1 = np.where(kv, np.minimum((j0 + 1) * Bc, Nk), np.minimum((blk + 1) * Br, N))
    codes = np.array([0, 1, 2, 3, 8], dtype=np.int8)[kk]
    # one extra block reads K_j, V_j for every visited j, so that the atoms are those of the whole trace
    jn = np.arange(int(lo[seen].min()), int((lo + n)[seen].max())) if seen.any() else np.zeros(0, np.int64)
    xs = np.stack([jn * Bc, jn * Bc]).T.reshape(-1)
    xe = np.stack([np.minimum((jn + 1) * Bc, Nk)] * 2).T.reshape(-1)
    xc = np.tile(np.array([1, 2], dtype=np.int8), len(jn))
    m = len(kk)
    zeros = np.zeros(m + len(xc), dtype=np.int64)
    syn = KernelTrace("flash2_fwd", np.append(ptr, m + len(xc)), np.concatenate([codes, xc]),
                      np.concatenate([r0, xs]), np.concatenate([r1, xe]), zeros, zeros,
                      np.concatenate([kk >= 3, np.zeros(len(xc), bool)]))
    at = atomize(syn, p)
    reps = np.where(kv, n[blk], 1).astype(np.int64)
    step = np.where(kv, -1 if reverse else 1, 0).astype(np.int32)
    atom = at.acc_atom[:m]
    # requested bytes: a group record touches the contiguous atoms between its first and last repetition
    csum = np.concatenate([[0], np.cumsum(at.atom_bytes)])
    lo = np.minimum(atom, atom + step * (reps - 1))
    nbytes = csum[lo + reps] - csum[lo]
    wr = kk >= 3
    return LoopProgram("flash2_fwd", ptr, atom, at.acc_shape[:m], wr, step, np.where(kk == 2, 1, 0).astype(np.int32),
                       np.where(kv, 2, 1).astype(np.int32), reps, at.shapes, at.atom_bytes, at.atom_kv,
                       at.atom_tensor, int(nbytes[~wr].sum()), int(nbytes[wr].sum()), np.where(seen, 2 * n + 3, 2))


def expand(prog: LoopProgram) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(ptr, first atom, shape, write) of every access, groups expanded (small programs: for the tests)."""
    atoms, shapes, writes, ptr = [], [], [], [0]
    for b in range(prog.n_blocks):
        t, off = prog.block(b)
        x = int(prog.ptr[t])
        q = 0
        while x < prog.ptr[t + 1]:
            a = int(prog.atom[x]) + q * int(prog.step[x])
            atoms.append(a if prog.atom_kv[a] else a + off)
            shapes.append(int(prog.shape[x]))
            writes.append(bool(prog.write[x]))
            if prog.gidx[x] == prog.glen[x] - 1 and q + 1 < prog.reps[x]:
                q += 1
                x -= int(prog.glen[x]) - 1
            else:
                q = 0 if prog.gidx[x] == prog.glen[x] - 1 else q
                x += 1
        ptr.append(len(atoms))
    return np.array(ptr), np.array(atoms, np.int64), np.array(shapes, np.int64), np.array(writes, bool)
