"""The L2 model's entry: a schedule's launch and tile accesses in, DRAM bytes of every kernel out.

Part of the L2 model; the model as a whole is described in :mod:`iosim.l2`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

from ..counts import Counts
from ..launch import LaunchModel, launch_model, resident_blocks
from ..problem import AttentionProblem
from ..profile import Profile, get_profile
from ..schedules import Tiles, get_schedule
from ._common import ROOM_UNIT, TENSOR_CODES, TENSOR_NAMES, L2ModelError
from .lru import room_units, run_kernel
from .program import LoopProgram, flash2_program, from_trace
from .trace import KernelTrace, trace_program

MAX_TRACED_ACCESSES = 1_000_000  # tile accesses per head the Python tracer walks in about 2.5 s
# Beyond this many tile accesses (all heads) the default model extrapolates over heads and skips steady windows;
# below it every access is walked (flash2, N = 65536, 32 heads, tiles 128 x 32: 67M accesses, 1-3 s on one core)
WALK_BUDGET = 64_000_000
HEAD_TOLERANCE = 0.005  # the middle heads' two halves agree this well: the heads are alike
WINDOW = 256  # rounds between the loop's stock-takings (steady.window)


@dataclass(frozen=True)
class L2Inputs:
    """What the model needs to know of a GPU's L2 beyond the launch (each defaults to the profile's value).

    ``capacity``: bytes of L2. ``room``: L2 bytes one byte takes when clean and read by the SMs of one half of the
    chip, clean and read by both halves (a copy in each partition), dirty (``l2.room``; 1, 1, 1: a plain LRU).
    ``dirty_at_start``: bytes of other dirty lines in L2 when the kernel starts (``l2.dirty_at_start``).
    ``block_share``: issue share of a block relative to the next older block on its SM (``sm.block_share``; 1:
    every resident block makes one access per round, the blocks in lockstep)."""

    capacity: int | None = None
    room: tuple[float, float, float] | None = None
    dirty_at_start: int | None = None
    block_share: float | None = None

    def resolved(self, prof: Profile) -> L2Inputs:
        """These inputs with the profile's values where none was given, checked."""
        out = L2Inputs(
            int(self.capacity if self.capacity is not None else prof.require("l2.capacity")),
            tuple(self.room) if self.room is not None else prof.l2_room(),
            int(self.dirty_at_start if self.dirty_at_start is not None else prof.l2_dirty_at_start()),
            float(self.block_share if self.block_share is not None else prof.block_share()),
        )
        if len(out.room) != 3 or min(out.room) < 1 / 64:
            raise L2ModelError(f"room={out.room}: expected three positive factors (private, shared, dirty)")
        if not 0.0 < out.block_share <= 1.0:
            raise L2ModelError(f"block_share={out.block_share}: expected 0 < block_share <= 1")
        return out


PROFILE_INPUTS = L2Inputs()  # every input from the profile


@dataclass
class KernelL2:
    name: str
    grid: int  # thread blocks of the schedule's program (all heads)
    resident: int  # program blocks running at once
    resident_limits: dict
    dram_read: int
    dram_write: int
    dirty_at_end: int
    read_by_tensor: dict = field(default_factory=dict)
    write_by_tensor: dict = field(default_factory=dict)
    global_read: int = 0
    global_write: int = 0
    rounds: int = 0
    heads_walked: int = 0  # heads the loop ran; the others' bytes are extrapolated from them
    heads: int = 0
    skipped: int = 0  # accesses of steady windows skipped (their bytes from the windows before)
    accesses: int = 0  # accesses of the heads walked, skipped ones included

    def approximation(self) -> str:
        """How this kernel's bytes were obtained, in a few words ("" for the full walk)."""
        out = []
        if self.heads_walked < self.heads:
            out.append(f"{self.heads_walked} of {self.heads} heads walked, the rest extrapolated")
        if self.skipped:
            out.append(f"{self.skipped / self.accesses:.0%} of their accesses in steady K/V windows skipped")
        return ", ".join(out)


@dataclass
class L2Result:
    schedule: str
    profile: str
    inputs: L2Inputs
    kernels: list[KernelL2]
    launch: LaunchModel
    dedupe: bool
    seconds: float = 0.0
    exact: bool = False  # the full walk was asked for (no extrapolation, no skipping)

    @property
    def capacity(self) -> int:
        return self.inputs.capacity

    def describe(self) -> str:
        """The model's inputs in one line (what ``iosim simulate`` prints under its table)."""
        x = self.inputs
        extra = [f"block share {x.block_share:g}"] if x.block_share < 1.0 else []
        if x.room != (1.0, 1.0, 1.0):
            extra.append("room private/shared/dirty " + "/".join(f"{r:g}" for r in x.room))
        if x.dirty_at_start:
            extra.append(f"{x.dirty_at_start:,} B dirty at start")
        approx = [f"{k.name}: {k.approximation()}" if len(self.kernels) > 1 else k.approximation()
                  for k in self.kernels if k.approximation()]
        walk = "; ".join(approx) if approx else "every access walked"
        return (f"{x.capacity:,} B L2, {self.kernels[0].resident} blocks resident" + "".join(", " + e for e in extra)
                + f", {walk}")

    @property
    def read_bytes(self) -> int:
        return sum(k.dram_read for k in self.kernels)

    @property
    def write_bytes(self) -> int:
        return sum(k.dram_write for k in self.kernels)

    def to_json(self) -> dict:
        x = self.inputs
        return {
            "model": "l2-lru",
            "conditions": "L2 flushed before each kernel; dirty lines left in L2 at kernel end not written (ncu)",
            "capacity_bytes": x.capacity,
            "block_share": x.block_share,
            "room": {"private": x.room[0], "shared": x.room[1], "dirty": x.room[2]},
            "dirty_at_start_bytes": x.dirty_at_start,
            "dedupe": self.dedupe,
            "exact": self.exact,
            "seconds": self.seconds,
            "launch": self.launch.note,
            "kernels": [
                {"name": k.name, "grid": k.grid, "resident": k.resident, "hbm_read_bytes": k.dram_read,
                 "hbm_write_bytes": k.dram_write, "dirty_at_end_bytes": k.dirty_at_end,
                 "hbm_read_by_tensor": k.read_by_tensor, "hbm_write_by_tensor": k.write_by_tensor,
                 "heads_walked": k.heads_walked, "skipped_accesses": k.skipped}
                for k in self.kernels
            ],
        }


def head_slots(p: AttentionProblem, head_order: str) -> tuple[np.ndarray, np.ndarray]:
    """Query-head and kv-head slot of each head, in the order the grid launches them."""
    B, H, Hk = p.batch, p.heads, p.kv_heads
    if head_order == "batch_major":
        b, h = np.divmod(np.arange(B * H, dtype=np.int64), H)
    elif head_order == "head_major":
        h, b = np.divmod(np.arange(B * H, dtype=np.int64), B)
    else:
        raise L2ModelError(f"head_order={head_order!r}")
    return b * H + h, b * Hk + h // (H // Hk)


FLASH2_LIKE = ("flash2", "flash3")  # schedules whose one-head program is flash2's, built without the tracer


def unsupported(schedule: str, pass_: str, problem: AttentionProblem, tiles: Tiles, counts: Counts) -> str | None:
    """Why the L2 model cannot take this simulation (None if it can)."""
    if pass_ != "forward":
        return f"pass {pass_!r}: the L2 model knows the forward kernels' launches only"
    if schedule not in ("naive", "flash1", "flash2", "flash3"):
        return f"schedule {schedule!r}: no launch geometry known to the L2 model"
    if schedule not in FLASH2_LIKE:  # traced by the Python tracer: bound its length
        est = tracer_accesses(schedule, problem, tiles, counts.global_read_bytes + counts.global_write_bytes)
        if est > MAX_TRACED_ACCESSES:
            return (f"{schedule}: about {est:,} tile accesses per head, too many for the Python tracer "
                    f"(limit {MAX_TRACED_ACCESSES:,})")
    return None


def _residency(prof: Profile, kernel, resident, index: int) -> tuple[int, dict]:
    """Program blocks of one kernel running at once: from the launch, or as given (one number or one per kernel)."""
    if resident is None:
        return resident_blocks(prof, kernel.threads, kernel.smem, kernel.registers)
    r = resident[index] if isinstance(resident, (list, tuple)) else resident
    return int(r), {"given": r}


def tracer_accesses(schedule: str, problem: AttentionProblem, tiles: Tiles, global_bytes: int | None = None) -> int:
    """About how many tile accesses per head the Python tracer would record (``global_bytes``: all heads' requested
    bytes; from the schedule's closed form if not given)."""
    if global_bytes is None:
        s = get_schedule(schedule)
        counts = Counts([k.scaled(s.units(problem)) for k in s.closed_form(problem, tiles).kernels])
        global_bytes = counts.global_read_bytes + counts.global_write_bytes
    tile_rows = min(tiles.block_q or problem.seq_len, tiles.block_kv or problem.kv_len)
    per_head = global_bytes // problem.n_heads_total
    return per_head // max(1, tile_rows * problem.head_dim * problem.elem_bytes) + problem.seq_len


def _programs(schedule: str, problem: AttentionProblem, tiles: Tiles, lm: LaunchModel,
              traces: list[KernelTrace] | None) -> list[LoopProgram]:
    """Each kernel's program of one head: flash2's built directly, any other traced (refused before tracing
    where the Python tracer would take too long)."""
    if traces is None and schedule in FLASH2_LIKE:  # flash3 moves flash2's tiles (its schedule's closed form)
        return [replace(flash2_program(problem, tiles, lm.kv_order), name=f"{schedule}_fwd")]
    if traces is None:
        est = tracer_accesses(schedule, problem, tiles)
        if est > MAX_TRACED_ACCESSES:
            raise L2ModelError(f"{schedule}: about {est:,} tile accesses per head, too many for the Python tracer "
                               f"(limit {MAX_TRACED_ACCESSES:,})")
        traces = trace_program(schedule, problem, tiles, kv_order=lm.kv_order)
    return [from_trace(kt, problem) for kt in traces]


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
    ptr, order, head_q, head_kv, sms, share = grid
    _, hq = np.unique(head_q[:heads], return_inverse=True)  # only the walked heads take room in the cache arrays
    _, hk = np.unique(head_kv[:heads], return_inverse=True)
    hq, hk = hq.reshape(-1).astype(np.int64), hk.reshape(-1).astype(np.int64)
    n_slot_heads = int(max(hq.max(), hk.max())) + 1
    units = np.arange(heads, dtype=np.int64)  # a K/V head shared by a group counts as its last head's
    unit_q, unit_kv = np.zeros(n_slot_heads, np.int64), np.zeros(n_slot_heads, np.int64)
    unit_q[hq], unit_kv[hk] = units, units
    n_atoms = len(prog.atom_bytes)
    m = (prog.atom_bytes, prog.atom_tensor, n_atoms, n_slot_heads * n_atoms, *(room_units(f) for f in x.room),
         ROOM_UNIT * x.capacity, dedupe, prog.atom_kv, unit_q, unit_kv)
    trace = (prog.atom, prog.shape, prog.write, prog.shapes, prog.step, prog.gidx, prog.glen, prog.reps)
    counter = np.zeros(1, np.int64)
    args = (trace, prog.atom_kv, (ptr, order, hq, hk, sms, share, unit_q), m, min(n_slots, prog.n_blocks * heads),
            x.dirty_at_start, len(TENSOR_CODES), (WINDOW, skip, counter))
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


def _kernel(prog: LoopProgram, x: L2Inputs, n_slots: int, grid: tuple, dedupe: bool, period: int,
            budget: int | None, progress) -> tuple[np.ndarray, np.ndarray, _Walk, int]:
    """DRAM bytes by tensor of all heads, the walk they came from, and the heads it walked. Approximate: the first
    heads (the first, ``m`` periods of ``period`` heads, the last), more while the middle ones cost differently in
    their first and second half (all once the walk would save less than it costs); each head not walked costs the
    middle heads' mean. A period is a query group with its K/V (and, for grid (.., batch, heads), that group in
    every batch): halves of whole periods hold as many heads of each place in a group."""
    H = len(grid[2])
    # A head whose boundary falls at another point of the waves costs differently (up to 10% at 4 waves a head,
    # every fourth head at N = 131072); a pattern that repeats every few heads is caught when it repeats within a
    # half, and one of a longer period p moves the mean by about 1/(waves x p): the fewer waves a head has, the
    # more heads are walked first.
    waves = prog.n_blocks / n_slots
    m = 2 if waves >= 32 else 6 if waves >= 8 else 14
    walked = 2 + m * period
    approximate = budget is not None
    walked = walked if approximate and (2 if m == 2 else 4) * walked <= H else H
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


def simulate_l2(schedule: str, problem: AttentionProblem, tiles: Tiles, profile: str | Profile | None = None,
                inputs: L2Inputs = PROFILE_INPUTS, *, resident: int | list[int] | None = None, variant: str = "iosim",
                traces: list[KernelTrace] | None = None, dedupe: bool = True, exact: bool = False,
                progress: Callable[[int, int], None] | None = None, budget: int = WALK_BUDGET) -> L2Result:
    """DRAM read/write bytes of every kernel of ``schedule`` under the L2 model (see :mod:`iosim.l2`).

    ``inputs`` overrides the profile's L2 inputs; ``resident`` the number of program blocks running at once (one
    number, or one per kernel); ``variant``: ``"iosim"`` (our kernels' launch) or ``"fa2"`` (FlashAttention-2's);
    ``traces``: the access streams to run instead of the schedule's (the calibration probes); ``dedupe=False``
    runs the exact trace (see the module docstring). A kernel of more than ``budget`` tile accesses (all heads) is
    approximated (heads extrapolated, steady windows skipped; the module docstring says how) unless ``exact``.
    ``progress(done, total)`` is called about every 0.1 s with the accesses made so far (none when not given)."""
    t0 = time.perf_counter()
    prof = get_profile(profile)
    x = inputs.resolved(prof)
    lm = launch_model(schedule, problem, tiles, variant=variant)
    programs = _programs(schedule, problem, tiles, lm, traces)
    head_q, head_kv = head_slots(problem, lm.head_order)
    H = len(head_q)
    period = head_period(problem, lm.head_order) if traces is None else H
    sms = int(prof.require("sm_count"))
    out = []
    for ki, prog in enumerate(programs):
        klm = lm.kernels[ki]
        r, limits = _residency(prof, klm, resident, ki)
        nb = prog.n_blocks
        order = np.arange(nb, dtype=np.int64)[::-1].copy() if klm.block_order == "reverse" else np.arange(nb)
        r = int(min(r, nb * H)) if nb else 1
        k = KernelL2(prog.name, nb * H, r, limits, 0, 0, 0, global_read=prog.global_read * H,
                     global_write=prog.global_write * H, heads_walked=H, heads=H)
        if nb:
            grid = (prog.ptr, order.astype(np.int64), head_q, head_kv, sms, x.block_share)
            approximate = not exact and prog.accesses * H > budget
            rd_t, wr_t, w, k.heads_walked = _kernel(prog, x, r, grid, dedupe, period, budget if approximate else None,
                                                    progress)
            k.dram_read, k.dram_write, k.dirty_at_end = int(rd_t.sum()), int(wr_t.sum()), w.dirty
            k.read_by_tensor = {TENSOR_NAMES[i]: int(v) for i, v in enumerate(rd_t) if v}
            k.write_by_tensor = {TENSOR_NAMES[i]: int(v) for i, v in enumerate(wr_t) if v}
            k.rounds, k.skipped, k.accesses = w.rounds, w.skipped, w.accesses
        out.append(k)
    return L2Result(schedule, prof.name, x, out, lm, dedupe, time.perf_counter() - t0, exact)
