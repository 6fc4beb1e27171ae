"""flash2's backward kernels as programs of one unit, built directly (as flash2's forward is) for the L2 model.

Part of the L2 model; the model as a whole is described in :mod:`iosim.l2`. The unit is what one run of the
schedule's program covers (iosim/schedules/flash2_bwd.py): a query head (``gqa="expand"``) or a kv head with its
group of query heads (``gqa="grouped"``, query head g's rows g·N .. (g+1)·N). Each kernel, expanded, makes the
tracer's accesses of the schedule's program (tested):

* the preprocess: a block per Q block of each query head: dO_i, O_i read; Delta_i (``D``) written and the fp32
  accumulator's rows dQacc_i written (zeros);
* the main kernel: a block per K/V block j: K_j, V_j read, then per query head of the unit the group (Q_i, dO_i,
  lse_i, D_i read; dQacc_i read and written) over the Q blocks that see a key of block j (a run i0 .. Tr-1, first
  to last, or last to first as FlashAttention-2 visits them); dK_j, dV_j written;
* the dQ conversion: dQacc_i read, dQ_i written;
* with ``gqa="expand"`` and grouped heads, the sum of the expanded dK, dV over the group
  (:func:`iosim.schedules.backward.group_sum`): its own unit, a kv head, a block per ``REDUCE_ROWS`` keys: every
  query head's dK copy, then every dV copy, read; the sums written.

A reduction ``dQacc_i += dS K_j`` (``red.global.add.f32``) is performed by the L2 itself: it needs the line's
current value, so a line L2 does not hold is first read from DRAM (a whole sector: the SM sends only the addend),
and the result is held dirty until evicted (or left dirty at the end, uncounted as Nsight Compute counts). That is
exactly a read followed by a write of the same atom in the model: DRAM sees dQacc_i read once per time it is
brought back into L2, and written once per time it is evicted dirty.
"""

from __future__ import annotations

import numpy as np

from ..blocks import cdiv, n_kv_blocks_visible
from ..problem import STAT_BYTES, AttentionProblem
from ..schedules import Tiles
from ..schedules.backward import REDUCE_ROWS
from ..schedules.flash2_bwd import gqa_of
from .program import LoopProgram
from .programs import _Atoms, _program


def _sizes(n: int, b: int) -> np.ndarray:
    """Rows of each block of ``b`` rows of ``n``."""
    return np.minimum(b, n - b * np.arange(cdiv(n, b), dtype=np.int64))


def _rows(p: AttentionProblem, t: Tiles) -> tuple[int, int, np.ndarray]:
    """(query heads of the unit G, Q blocks Tr, rows of each (g, i) block in the unit's order)."""
    G = p.group if gqa_of(t) == "grouped" else 1
    br = _sizes(p.seq_len, t.block_q)
    return G, len(br), np.tile(br, G)


def preprocess(p: AttentionProblem, t: Tiles) -> LoopProgram:
    """Block (g, i): dO_i, O_i read; D_i, dQacc_i written."""
    _, _, rows = _rows(p, t)
    d, e, at = p.head_dim, p.elem_bytes, _Atoms()
    do0, o0 = at.add("dO", rows * d * e), at.add("O", rows * d * e)
    dd0, a0 = at.add("D", rows * STAT_BYTES), at.add("dQacc", rows * d * STAT_BYTES)
    b = np.arange(len(rows))
    atom = np.stack([do0 + b, o0 + b, dd0 + b, a0 + b], axis=1).reshape(-1)
    write = np.tile([False, False, True, True], len(rows))
    return _program("flash2_bwd_preprocess", np.arange(0, len(atom) + 1, 4), {"atom": atom, "write": write}, at)


def main_kernel(p: AttentionProblem, t: Tiles, q_order: str = "forward") -> LoopProgram:
    """Block j: K_j, V_j; per query head g of the unit the group (Q_i, dO_i, lse_i, D_i, dQacc_i read, dQacc_i
    written) over the visiting Q blocks in ``q_order``; dK_j, dV_j written."""
    G, Tr, rows = _rows(p, t)
    N, Nk, Br, Bc, d, e = p.seq_len, p.kv_len, t.block_q, t.block_kv, p.head_dim, p.elem_bytes
    bc = _sizes(Nk, Bc)
    at = _Atoms()
    k0, v0 = at.add("K", bc * d * e), at.add("V", bc * d * e)
    q0, do0 = at.add("Q", rows * d * e), at.add("dO", rows * d * e)
    l0, dd0 = at.add("lse", rows * STAT_BYTES), at.add("D", rows * STAT_BYTES)
    a0 = at.add("dQacc", rows * d * STAT_BYTES)
    dk0, dv0 = at.add("dK", bc * d * e), at.add("dV", bc * d * e)
    n = np.asarray(n_kv_blocks_visible(np.arange(Tr), Br, Bc, N, Nk, p.causal)).reshape(Tr)
    rec: dict[str, list] = {"atom": [], "write": [], "step": [], "gidx": [], "glen": [], "reps": []}
    ptr, reverse = [0], q_order == "reverse"

    def add(atoms, write, step=0, glen=1, reps=1):
        m = len(atoms)
        for key, v in (("atom", atoms), ("write", write), ("step", [step] * m),
                       ("gidx", list(range(m)) if glen > 1 else [0] * m), ("glen", [glen] * m), ("reps", [reps] * m)):
            rec[key] += list(v)

    for j in range(len(bc)):
        add([k0 + j, v0 + j], [False, False])
        i0 = int(np.searchsorted(n, j, side="right"))  # n grows with i: the Q blocks i0 .. Tr-1 see block j
        for g in range(G if i0 < Tr else 0):
            first = g * Tr + (Tr - 1 if reverse else i0)
            add([q0 + first, do0 + first, l0 + first, dd0 + first, a0 + first, a0 + first], [False] * 5 + [True],
                -1 if reverse else 1, 6, Tr - i0)
        add([dk0 + j, dv0 + j], [True, True])
        ptr.append(len(rec["atom"]))
    return _program("flash2_bwd", ptr, rec, at)


def convert_dq(p: AttentionProblem, t: Tiles) -> LoopProgram:
    """Block (g, i): dQacc_i read, dQ_i written."""
    _, _, rows = _rows(p, t)
    d, e, at = p.head_dim, p.elem_bytes, _Atoms()
    a0, dq0 = at.add("dQacc", rows * d * STAT_BYTES), at.add("dQ", rows * d * e)
    b = np.arange(len(rows))
    atom = np.stack([a0 + b, dq0 + b], axis=1).reshape(-1)
    return _program("flash2_bwd_convert_dq", np.arange(0, len(atom) + 1, 2),
                    {"atom": atom, "write": np.tile([False, True], len(rows))}, at)


def group_sum(p: AttentionProblem) -> LoopProgram:
    """One kv head: block r reads rows r of the group's dK copies, then of its dV copies, and writes the sums."""
    G, d, e = p.group, p.head_dim, p.elem_bytes
    rows = _sizes(p.kv_len, REDUCE_ROWS)
    R = len(rows)
    at = _Atoms()
    ck0, cv0 = at.add("dK", np.tile(rows, G) * d * e), at.add("dV", np.tile(rows, G) * d * e)
    sk0, sv0 = at.add("dK", rows * d * e), at.add("dV", rows * d * e)
    r = np.arange(R)[:, None]
    g = np.arange(G)[None, :]
    atom = np.concatenate([ck0 + g * R + r, cv0 + g * R + r, sk0 + r, sv0 + r], axis=1).reshape(-1)
    write = np.tile(np.array([False] * (2 * G) + [True, True]), R)
    return _program("bwd_dkdv_group_sum", np.arange(0, len(atom) + 1, 2 * G + 2), {"atom": atom, "write": write}, at)


def flash2_bwd_programs(p: AttentionProblem, t: Tiles, q_order: str = "forward") -> list[LoopProgram]:
    """The backward's kernels in launch order; each program's ``unit`` says what one of its heads is."""
    unit = "kv_head" if gqa_of(t) == "grouped" else "head"
    out = [preprocess(p, t), main_kernel(p, t, q_order), convert_dq(p, t)]
    for prog in out:
        prog.unit = unit
    if unit == "head" and p.group > 1:
        gs = group_sum(p)
        gs.unit = "kv_head"
        out.append(gs)
    return out
