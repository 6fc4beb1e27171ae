"""naive's and flash1's programs of one head, built directly instead of by the Python tracer (as flash2's is).

Part of the L2 model; the model as a whole is described in :mod:`iosim.l2`. Each kernel's loops stay compact, so
that memory grows with the tiles of one row, not with the accesses (the tests prove each program, expanded, equal to
the tracer's atomized trace, up to the numbering of atoms):

* naive's three kernels are rows of alike blocks (:class:`~iosim.l2.program.LoopProgram`): the scores kernel a row
  of ``Tc`` blocks (Q_i, K_j, S_ij) per Q tile, the softmax one block (S_r, P_r) per query row, the P V kernel one
  block (P_ij, V_j repeated over j; O_i) per Q tile. With ``recycle`` (blocks resident, L2 bytes, SMs, block share,
  heads) rows far enough apart (those of all heads, in turn) share atoms: a row's S and P tiles are touched once,
  and evicted long before the row that many rows later comes, so the cache's arrays hold a few rows of tiles, not
  all N x N_kv of every head;
* flash1 is one block per head: the fills of O, l, m as one group, then per K/V block K_j, V_j and the inner loop
  over the Q blocks that see it (Q_i, O_i, l_i, m_i read, O_i, l_i, m_i written) as one group.
"""

from __future__ import annotations

import numpy as np

from ..blocks import cdiv, n_kv_blocks_visible
from ..problem import STAT_BYTES, AttentionProblem
from ..schedules import Tiles
from ..schedules import naive as naive_schedule
from ._common import KV_TENSORS, TENSOR_CODES
from .program import LoopProgram

Recycle = tuple[int, int, int, float, int] | None  # (blocks resident at once, L2 bytes, SMs, block share, heads)


class _Atoms:
    """A head's atoms as they are numbered: appended tensor by tensor, or row by row."""

    def __init__(self):
        self.bytes: list[np.ndarray] = []
        self.tensor: list[np.ndarray] = []
        self.n = 0

    def add(self, tensor: str, sizes) -> int:
        """Append atoms of ``sizes`` bytes of ``tensor``; returns the first one's number."""
        return self.rows([(tensor, sizes)], 1)

    def rows(self, parts: list[tuple[str, object]], count: int) -> int:
        """Append ``count`` rows, each the atoms of ``parts`` ((tensor, sizes) in order); returns the first's."""
        sizes = [np.asarray(z, dtype=np.int64).reshape(-1) for _, z in parts]
        codes = [np.full(len(z), TENSOR_CODES[t], np.int64) for (t, _), z in zip(parts, sizes)]
        self.bytes.append(np.tile(np.concatenate(sizes), count))
        self.tensor.append(np.tile(np.concatenate(codes), count))
        first, self.n = self.n, self.n + len(self.bytes[-1])
        return first

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        b, t = np.concatenate(self.bytes), np.concatenate(self.tensor)
        return b, np.isin(t, KV_TENSORS), t


def _program(name: str, ptr, rec: dict, at: _Atoms, **rows) -> LoopProgram:
    """A LoopProgram from its records (arrays ``atom, write`` and, for groups, ``step, gidx, glen, reps``)."""
    n = len(rec["atom"])
    atom = np.asarray(rec["atom"], np.int64)
    write = np.asarray(rec["write"], bool)
    step = np.asarray(rec.get("step", np.zeros(n)), np.int32)
    gidx = np.asarray(rec.get("gidx", np.zeros(n)), np.int32)
    glen = np.asarray(rec.get("glen", np.ones(n)), np.int32)
    reps = np.asarray(rec.get("reps", np.ones(n)), np.int64)
    ab, kv, tensor = at.arrays()
    ptr = np.asarray(ptr, np.int64)
    # requested bytes of each record: the atoms between its first and its last repetition (steps of 0 or +-1)
    csum = np.concatenate([[0], np.cumsum(ab)])
    lo = np.minimum(atom, atom + step * (reps - 1))
    nbytes = np.where(step == 0, ab[atom] * reps, csum[lo + reps] - csum[lo])
    per_block = np.add.reduceat(np.stack([np.where(write, 0, nbytes), np.where(write, nbytes, 0)]), ptr[:-1], axis=1)
    per_block[:, ptr[:-1] == ptr[1:]] = 0
    acc = np.add.reduceat(reps, ptr[:-1])  # a record of a group runs reps times
    acc[ptr[:-1] == ptr[1:]] = 0
    tmpl = rows.get("templates") or len(ptr) - 1
    full = min(rows.get("rows", 1), rows.get("full_rows", 1))
    weight = np.where(np.arange(len(ptr) - 1) < tmpl, full, 1)
    rd, wr = (per_block * weight).sum(axis=1)
    return LoopProgram(name, ptr, atom.astype(np.int32), np.zeros(n, np.int32), write, step, gidx, glen, reps,
                       np.zeros((1, 3), np.int64), ab, kv, tensor, int(rd), int(wr), acc.astype(np.int64), **rows)


def _wrap(rows: int, blocks_per_row: int, row_bytes: int, recycle: Recycle, partial: bool) -> int:
    """Rows after which a row's Q-side atoms may be used again (0: never), counting the rows of all heads in turn.
    A block runs at least at the share of the youngest of the ``n`` blocks on its SM (``share ** (n - 1)`` of their
    sum; all at once in lockstep), so at most ``resident x (1 / that share + 1)`` blocks launch before it ends; the
    rows after those touch twice an L2 of their own tiles before the row ``wrap`` later starts, so that LRU has
    evicted every one of the row's. A last, partial row (``partial``) is shared by the heads: a head's full rows
    must then be at least ``wrap``."""
    if recycle is None:
        return 0
    resident, l2_bytes, sms, share, heads = recycle
    n = cdiv(resident, sms)
    slowest = 1.0 if share >= 1.0 else share ** (n - 1) * (1 - share) / (1 - share**n)
    gap = cdiv(int(resident * (1 / slowest + 1)) + 1, blocks_per_row)
    wrap = gap + 2 + cdiv(2 * l2_bytes, max(1, row_bytes))
    return wrap if wrap <= rows or (not partial and wrap < rows * heads) else 0


def _stored_cols(p: AttentionProblem, t: Tiles, Bc: int) -> tuple[np.ndarray, int]:
    """Columns of S and P each key tile's access moves (the last with the row's pad, as the schedule counts them),
    and the row pitch."""
    pitch = naive_schedule.pitch_of(p, t)
    bc = np.minimum(Bc, p.kv_len - Bc * np.arange(cdiv(p.kv_len, Bc)))
    bc[-1] += pitch - p.kv_len
    return bc, pitch


def _tile_rows(p: AttentionProblem, t: Tiles) -> tuple[int, int, int, int]:
    """(Br, Bc, full Q tiles, rows of the last, partial Q tile (0: none))."""
    Br, Bc = (p.seq_len, p.kv_len) if t.block_q is None else (t.block_q, t.block_kv)
    if Br >= p.seq_len:  # one Q tile, of every row
        return p.seq_len, Bc, 1, 0
    return Br, Bc, p.seq_len // Br, p.seq_len % Br


def naive_scores(p: AttentionProblem, t: Tiles, recycle: Recycle = None) -> LoopProgram:
    """Kernel 1: block (i, j) reads Q_i, K_j and writes S_ij; a row per Q tile, its atoms Q_i, S_i0 .. S_i,Tc-1."""
    Br, Bc, full, last = _tile_rows(p, t)
    d, e, Nk = p.head_dim, p.elem_bytes, p.kv_len
    Tc = cdiv(Nk, Bc)
    bc = np.minimum(Bc, Nk - Bc * np.arange(Tc))
    sc, pitch = _stored_cols(p, t, Bc)
    rows = full + (last > 0)
    wrap = _wrap(full, Tc, Br * pitch * e, recycle, last > 0)
    at = _Atoms()
    at.rows([("Q", [Br * d * e]), ("S", Br * sc * e)], wrap or full)
    last_q = at.add("Q", [last * d * e]) if last else 0
    if last:
        at.add("S", last * sc * e)
    k0 = at.add("K", bc * d * e)
    j = np.arange(Tc)
    q_of = [np.zeros(Tc, np.int64)] + ([np.full(Tc, last_q)] if last else [])
    atom = np.concatenate([np.stack([q, k0 + j, q + 1 + j], axis=1).reshape(-1) for q in q_of])
    write = np.tile([False, False, True], len(atom) // 3)
    return _program("naive_scores", np.arange(0, len(atom) + 1, 3), {"atom": atom, "write": write}, at,
                    templates=Tc, rows=rows, row_stride=Tc + 1, row_wrap=wrap, full_rows=full, row_height=Br)


def naive_softmax(p: AttentionProblem, t: Tiles, recycle: Recycle = None) -> LoopProgram:
    """Kernel 2: block r reads row r of S and writes row r of P (at the row's pitch); a row per query row, its
    atoms S_r, P_r."""
    N, row = p.seq_len, naive_schedule.pitch_of(p, t) * p.elem_bytes
    wrap = _wrap(N, 1, 2 * row, recycle, False)
    at = _Atoms()
    at.rows([("S", [row]), ("P", [row])], wrap or N)
    return _program("naive_softmax", [0, 2], {"atom": [0, 1], "write": [False, True]}, at, templates=1, rows=N,
                    row_stride=2, row_wrap=wrap, full_rows=N, row_height=1)


def naive_pv(p: AttentionProblem, t: Tiles, recycle: Recycle = None) -> LoopProgram:
    """Kernel 3: block i reads P_ij, V_j for every j (one group) and writes O_i; a row per Q tile, its atoms
    P_i0 .. P_i,Tc-1, O_i."""
    Br, Bc, full, last = _tile_rows(p, t)
    d, e, Nk = p.head_dim, p.elem_bytes, p.kv_len
    Tc = cdiv(Nk, Bc)
    bc = np.minimum(Bc, Nk - Bc * np.arange(Tc))
    sc, pitch = _stored_cols(p, t, Bc)
    wrap = _wrap(full, 1, Br * pitch * e, recycle, last > 0)
    at = _Atoms()
    at.rows([("P", Br * sc * e), ("O", [Br * d * e])], wrap or full)
    last_p = at.add("P", last * sc * e) if last else 0
    if last:
        at.add("O", [last * d * e])
    v0 = at.add("V", bc * d * e)
    firsts = [0] + ([last_p] if last else [])
    rec = {"atom": [], "write": [], "step": [], "gidx": [], "glen": [], "reps": []}
    for f in firsts:
        for k, v in {"atom": [f, v0, f + Tc], "write": [False, False, True], "step": [1, 1, 0], "gidx": [0, 1, 0],
                     "glen": [2, 2, 1], "reps": [Tc, Tc, 1]}.items():
            rec[k] += v
    return _program("naive_pv", np.arange(0, 3 * len(firsts) + 1, 3), rec, at, templates=1, rows=full + (last > 0),
                    row_stride=Tc + 1, row_wrap=wrap, full_rows=full, row_height=Br)


def naive_programs(p: AttentionProblem, t: Tiles, recycle: list[Recycle] | None = None) -> list[LoopProgram]:
    """naive's three kernels (``recycle``: one per kernel, or None: every row its own atoms)."""
    r = recycle or [None, None, None]
    return [naive_scores(p, t, r[0]), naive_softmax(p, t, r[1]), naive_pv(p, t, r[2])]


def flash1_program(p: AttentionProblem, t: Tiles, kv_order: str = "forward") -> LoopProgram:
    """flash1's one block per head: fills of O_i, l_i, m_i (one group over i), then per K/V block j (in
    ``kv_order``) K_j, V_j and the group (Q_i, O_i, l_i, m_i read; O_i, l_i, m_i written) over the Q blocks that
    see it (a last run of them: the visible i form a suffix of 0 .. Tr-1)."""
    N, Nk, Br, Bc, d, e = p.seq_len, p.kv_len, t.block_q, t.block_kv, p.head_dim, p.elem_bytes
    Tr, Tc = cdiv(N, Br), cdiv(Nk, Bc)
    br = np.minimum(Br, N - Br * np.arange(Tr))
    bc = np.minimum(Bc, Nk - Bc * np.arange(Tc))
    at = _Atoms()
    q0, o0 = at.add("Q", br * d * e), at.add("O", br * d * e)
    l0, m0 = at.add("l", br * STAT_BYTES), at.add("m", br * STAT_BYTES)
    k0, v0 = at.add("K", bc * d * e), at.add("V", bc * d * e)
    n = np.asarray(n_kv_blocks_visible(np.arange(Tr), Br, Bc, N, Nk, p.causal)).reshape(Tr)
    rec = {"atom": [o0, l0, m0], "write": [True] * 3, "step": [1] * 3, "gidx": [0, 1, 2], "glen": [3] * 3,
           "reps": [Tr] * 3}
    inner = {"write": [False] * 4 + [True] * 3, "step": [1] * 7, "gidx": list(range(7)), "glen": [7] * 7}
    for j in (range(Tc) if kv_order != "reverse" else range(Tc - 1, -1, -1)):
        for k, v in {"atom": [k0 + j, v0 + j], "write": [False, False], "step": [0, 0], "gidx": [0, 0],
                     "glen": [1, 1], "reps": [1, 1]}.items():
            rec[k] += v
        i0 = int(np.searchsorted(n, j, side="right"))  # n grows with i: the first Q block that sees block j
        if i0 < Tr:
            rec["atom"] += [q0 + i0, o0 + i0, l0 + i0, m0 + i0, o0 + i0, l0 + i0, m0 + i0]
            rec["reps"] += [Tr - i0] * 7
            for k, v in inner.items():
                rec[k] += v
    return _program("flash1_fwd", [0, len(rec["atom"])], rec, at)
