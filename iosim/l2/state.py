"""The named state of the L2 model's compiled round loop (:mod:`iosim.l2.lru`, :mod:`iosim.l2.steady`).

Plain arrays grouped by role into named tuples, which numba compiles to the same code as plain tuples (a field is
a fixed slot: ``slots.rep[s]`` is ``slots[9][s]``); the two small int64 arrays read by position (a grid's
``layout`` and the stock-taking's ``stats``) have named indices, module constants that numba folds in.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

# Grid.layout, an int64 array (iosim.l2.program.LoopProgram.layout): block ``b`` of a head is template block
# ``b mod TEMPLATES`` of row ``b div TEMPLATES``, its Q-side atoms moved by ROW_STRIDE per row
BLOCKS, REVERSED, TEMPLATES, ROW_STRIDE, ROW_WRAP, FULL_ROWS, KV_STRIDE = range(7)
# Window.stats, an int64 array: windows counted, round the replay ends, accesses skipped, and the last window's
# hits, room fetched and writes
WINDOWS, REPLAY_END, SKIPPED, LAST_HITS, LAST_ROOM, LAST_WROTE = range(6)


class Trace(NamedTuple):
    """One head's program as records, each its first atom and the ``shape`` (an index into ``shapes``: rows,
    columns, row stride; 0 is one atom) of the rectangle of atoms it covers; a record is the ``gidx``-th of a
    group of ``glen`` records run ``reps`` times, its atom moving by ``step`` each time (:mod:`iosim.l2.program`)."""

    atom: np.ndarray
    shape: np.ndarray
    write: np.ndarray
    shapes: np.ndarray
    step: np.ndarray
    gidx: np.ndarray
    glen: np.ndarray
    reps: np.ndarray


class Grid(NamedTuple):
    """The launch: records ``ptr[t]:ptr[t+1]`` belong to template block ``t``; ``layout`` (indices above) places a
    head's blocks; with a row wrap, the rows of all heads in turn share that many rows of atoms (a last, partial
    row has template blocks of its own: :class:`iosim.l2.program.LoopProgram`), else each head's atoms are moved
    by the atoms of a head; K/V atoms are moved by the K/V stride per K/V head. Heads launch in the order of
    ``head_q``/``head_kv`` (their Q-side and K/V-side slots), the blocks of a head in order (or reversed);
    ``share`` is the block drift (1: lockstep); ``unit_q`` the unit of heads of each Q-side slot."""

    ptr: np.ndarray
    layout: np.ndarray
    head_q: np.ndarray
    head_kv: np.ndarray
    n_sms: int
    share: float
    unit_q: np.ndarray


class Slots(NamedTuple):
    """The blocks resident at once, one per slot (slot s is on SM s mod ``n_sms``): the record it is at and its
    block's end, its Q-side and K/V-side atom offsets, live or not, its launch number (``age``), issue share and
    credit, ``half`` the L2 partition near its SM (1 or 2), ``rep`` the repetition of the group it is in, ``unit``
    the unit of heads it belongs to, ``done`` its accesses so far."""

    pos: np.ndarray
    end: np.ndarray
    qoff: np.ndarray
    kvoff: np.ndarray
    live: np.ndarray
    age: np.ndarray
    rate: np.ndarray
    credit: np.ndarray
    half: np.ndarray
    rep: np.ndarray
    unit: np.ndarray
    done: np.ndarray


class Cache(NamedTuple):
    """Per atom (all heads): its resident bytes, room per byte, the partitions that read it, dirty or not, its
    neighbours in the recency list and the round it was last touched; DRAM bytes by unit of heads and tensor; the
    unit of heads of the block that last touched each atom (its write-backs are that unit's)."""

    res: np.ndarray
    cost: np.ndarray
    mask: np.ndarray
    dirty: np.ndarray
    prev: np.ndarray
    nxt: np.ndarray
    last_round: np.ndarray
    out_read: np.ndarray
    out_write: np.ndarray
    owner: np.ndarray


class Batch(NamedTuple):
    """Accesses of a run of rounds, atom by atom in round and slot order (:func:`iosim.l2.lru.run_kernel` gathers
    them from the resident blocks, then runs them through the cache): the global atom (all heads), the atom of the
    head's program, written or read, the L2 partition near the block's SM (1 or 2), the block's unit of heads and
    the round."""

    g: np.ndarray
    a: np.ndarray
    write: np.ndarray
    half: np.ndarray
    unit: np.ndarray
    rnd: np.ndarray


class Model(NamedTuple):
    """What the loop knows of the atoms and of L2: bytes and tensor by atom, atoms of a head, the index of the
    foreign dirty lines, room per byte (clean private, clean shared, dirty) and capacity in room units, whether a
    read again in the same round is a hit, which atoms are K/V-side, and the unit of heads of each Q-side and
    K/V-side slot (DRAM bytes are kept per unit, so that :mod:`iosim.l2.model` can extrapolate over heads)."""

    atom_bytes: np.ndarray
    atom_tensor: np.ndarray
    n_atoms: int
    foreign: int
    cost_private: int
    cost_shared: int
    cost_dirty: int
    capacity: int
    dedupe: bool
    atom_kv: np.ndarray
    unit_q: np.ndarray
    unit_kv: np.ndarray


class Control(NamedTuple):
    """Every ``window`` rounds :func:`iosim.l2.steady.window` takes stock (and with ``skip`` skips the steady part
    of long K/V loops); ``progress[0]`` holds the accesses made or skipped so far."""

    window: int
    skip: bool
    progress: np.ndarray


class Window(NamedTuple):
    """The stock-taking's memory: accesses done at the window's start, advance in the last two windows, reads at
    the window's start, reads in the last two windows, reads to restore when a replay ends, ``stats`` (indices
    above)."""

    done0: np.ndarray
    d1: np.ndarray
    d2: np.ndarray
    r_snap: np.ndarray
    rd1: np.ndarray
    rd2: np.ndarray
    restore: np.ndarray
    stats: np.ndarray
