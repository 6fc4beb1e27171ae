"""Walking the grid: the round loop over the first heads of a kernel's grid, and the other heads extrapolated.

Part of the L2 model; the model as a whole is described in :mod:`iosim.l2`. The loop itself (:mod:`iosim.l2.lru`)
runs in a thread while this one reports its progress; it is imported on the first walk, so that ``import iosim``
does not load numba.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..hardware.gpu import Profile
from ..problem import AttentionProblem
from ._common import ROOM_UNIT, TENSOR_CODES, L2ModelError, room_units
from .program import LoopProgram
from .state import Control, Grid, Model, Trace

HEAD_TOLERANCE = 0.005  # the middle heads' two halves agree this well: the heads are alike
WINDOW = 256  # rounds between the loop's stock-takings (steady.window)


@dataclass(frozen=True)
class L2Inputs:
    """What the model assumes of the GPU, each None for the profile's value (``resident``: the launch's).

    ``capacity``: bytes of L2. ``room``: L2 bytes one byte takes when clean and read by the SMs of one half of the
    chip, clean and read by both halves (a copy in each partition), dirty (``l2.room``; 1, 1, 1: a plain LRU).
    ``dirty_at_start``: bytes of other dirty lines in L2 when the kernel starts (``l2.dirty_at_start``).
    ``block_share``: issue share of a block relative to the next older block on its SM (``sm.block_share``; 1:
    every resident block makes one access per round, the blocks in lockstep). ``resident``: program blocks running
    at once, one number or one per kernel (None: the kernel's launch on the profile, :func:`iosim.launch.resident_blocks`)."""

    capacity: int | None = None
    room: tuple[float, float, float] | None = None
    dirty_at_start: int | None = None
    block_share: float | None = None
    resident: int | tuple[int, ...] | list[int] | None = None

    def resolved(self, prof: Profile) -> L2Inputs:
        """These inputs with the profile's values where none was given, checked (``resident`` stays as given: the
        launch's is per kernel)."""
        out = L2Inputs(
            int(self.capacity if self.capacity is not None else prof.require("l2.capacity")),
            tuple(self.room) if self.room is not None else prof.l2_room(),
            int(self.dirty_at_start if self.dirty_at_start is not None else prof.l2_dirty_at_start()),
            float(self.block_share if self.block_share is not None else prof.block_share()),
            self.resident,
        )
        if len(out.room) != 3 or min(out.room) < 1 / 64:
            raise L2ModelError(f"room={out.room}: expected three positive factors (private, shared, dirty)")
        if not 0.0 < out.block_share <= 1.0:
            raise L2ModelError(f"block_share={out.block_share}: expected 0 < block_share <= 1")
        return out


PROFILE_INPUTS = L2Inputs()  # every input from the profile


def head_period(problem: AttentionProblem, head_order: str) -> int:
    """Launched heads after which the pattern of shared K/V repeats: a query group (and, for grid (.., batch,
    heads), that group in every batch)."""
    g = problem.heads // problem.kv_heads
    return g if head_order == "batch_major" else g * problem.batch


@dataclass
class _Walk:
    """The loop's answer for the first launched heads: DRAM bytes by head (the foreign dirty lines last) and
    tensor."""

    read: np.ndarray
    write: np.ndarray
    dirty: int
    rounds: int
    skipped: int
    accesses: int


def _call(args: tuple, counter: np.ndarray, total: int, progress: Callable[[int, int], None] | None) -> tuple:
    """Run the loop; with ``progress``, in a thread (numba releases the GIL) while this one reports its progress."""
    from .lru import run_kernel  # numba, on the first walk only

    if progress is None:
        return run_kernel(*args)
    box: dict = {}

    def run():
        try:
            box["out"] = run_kernel(*args)
        except BaseException as e:  # handed to the caller below
            box["err"] = e

    th = threading.Thread(target=run, daemon=True)
    th.start()
    while th.is_alive():
        th.join(0.1)
        progress(min(int(counter[0]), total), total)
    if "err" in box:
        raise box["err"]
    progress(total, total)
    return box["out"]


def _walk(prog: LoopProgram, x: L2Inputs, n_slots: int, grid: tuple, dedupe: bool, heads: int, skip: bool,
          progress) -> _Walk:
    """The round loop over the first ``heads`` launched heads of the grid, DRAM bytes kept per launched head."""
    reverse, head_q, head_kv, sms, share = grid
    layout = prog.layout(reverse)
    _, hq = np.unique(head_q[:heads], return_inverse=True)  # only the walked heads take room in the cache arrays
    _, hk = np.unique(head_kv[:heads], return_inverse=True)
    hq, hk = hq.reshape(-1).astype(np.int64), hk.reshape(-1).astype(np.int64)
    n_slot_heads = int(max(hq.max(), hk.max())) + 1
    units = np.arange(heads, dtype=np.int64)  # a K/V head shared by a group counts as its last head's
    unit_q, unit_kv = np.zeros(n_slot_heads, np.int64), np.zeros(n_slot_heads, np.int64)
    unit_q[hq], unit_kv[hk] = units, units
    n_atoms, (q_stride, kv_stride) = len(prog.atom_bytes), prog.strides
    foreign = max(int(hq.max()) * q_stride, int(hk.max()) * kv_stride) + n_atoms  # the atoms of all heads
    private, shared, dirty = (room_units(f) for f in x.room)
    m = Model(prog.atom_bytes, prog.atom_tensor, n_atoms, foreign, private, shared, dirty, ROOM_UNIT * x.capacity,
              dedupe, prog.atom_kv, unit_q, unit_kv)
    trace = Trace(prog.atom, prog.shape, prog.write, prog.shapes, prog.step, prog.gidx, prog.glen, prog.reps)
    counter = np.zeros(1, np.int64)
    args = (trace, Grid(prog.ptr, layout, hq, hk, sms, share, unit_q), m,
            min(n_slots, prog.n_blocks * heads), x.dirty_at_start, len(TENSOR_CODES), Control(WINDOW, skip, counter))
    total = prog.accesses * heads
    rd, wr, dirty, rounds, skipped = _call(args, counter, total, progress)
    return _Walk(rd, wr, int(dirty), int(rounds), int(skipped), total)


def _alike(w: _Walk, walked: int, slack: float) -> bool:
    """The middle heads (all but the first and the last) moved the same DRAM bytes in their first and their second
    half, reads and writes each, within HEAD_TOLERANCE (and ``slack`` bytes a head)."""
    half = (walked - 2) // 2
    for arr in (w.read, w.write):
        x, y = int(arr[1:1 + half].sum()), int(arr[walked - 1 - half:walked - 1].sum())
        if abs(x - y) > HEAD_TOLERANCE * max(x, y) + slack * half:
            return False
    return True


def walk_kernel(prog: LoopProgram, x: L2Inputs, n_slots: int, grid: tuple, dedupe: bool, period: int,
                approximate: bool, progress) -> tuple[np.ndarray, np.ndarray, _Walk, int]:
    """DRAM bytes by tensor of all heads, the walk they came from, and the heads it walked. ``grid`` = (blocks
    reversed, head_q, head_kv, SM count, block share) (:mod:`iosim.l2.lru`). Approximate: the first
    heads (the first, ``m`` periods of ``period`` heads, the last), more while the middle ones cost differently in
    their first and second half (all once the walk would save less than it costs); each head not walked costs the
    middle heads' mean. A period is a query group with its K/V (and, for grid (.., batch, heads), that group in
    every batch): halves of whole periods hold as many heads of each place in a group. Where a head's blocks are
    few (flash1's one), many heads run beside each other: the middle heads walked must fill the resident slots four
    times over, else every head is walked."""
    H = len(grid[1])
    # A head whose boundary falls at another point of the waves costs differently (up to 10% at 4 waves a head,
    # every fourth head at N = 131072); a pattern that repeats every few heads is caught when it repeats within a
    # half, and one of a longer period p moves the mean by about 1/(waves x p): the fewer waves a head has, the
    # more heads are walked first.
    waves = prog.n_blocks / n_slots
    m = 2 if waves >= 32 else 6 if waves >= 8 else 14
    walked = 2 + m * period
    fill = (walked - 2) * prog.n_blocks >= 4 * n_slots  # the middle heads fill the slots 4 times over
    walked = walked if approximate and fill and (2 if m == 2 else 4) * walked <= H else H
    slack = 1e-4 * (prog.global_read + prog.global_write)
    while True:
        w = _walk(prog, x, n_slots, grid, dedupe, walked, approximate, progress)
        if walked == H:
            return w.read.sum(axis=0), w.write.sum(axis=0), w, walked
        if _alike(w, walked, slack):
            rest, mid = H - walked, walked - 2
            rd = w.read.sum(axis=0) + rest * w.read[1:walked - 1].sum(axis=0) // mid
            wr = w.write.sum(axis=0) + rest * w.write[1:walked - 1].sum(axis=0) // mid
            w.rounds += rest * w.rounds // walked
            return rd, wr, w, walked
        m = 4 * (m + 2) - 2
        walked = 2 + m * period if 4 * (2 + m * period) <= H else H
