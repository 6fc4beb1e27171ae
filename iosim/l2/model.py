"""The L2 model's entry: a schedule's launch and tile accesses in, DRAM bytes of every kernel out.

Part of the L2 model; the model as a whole is described in :mod:`iosim.l2`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from ..counts import Counts
from ..launch import LaunchModel, launch_model, resident_blocks
from ..problem import AttentionProblem
from ..profile import Profile, get_profile
from ..schedules import Tiles
from ._common import ROOM_UNIT, TENSOR_CODES, TENSOR_NAMES, L2ModelError
from .atoms import atomize, global_bytes
from .lru import room_units, run_kernel
from .trace import KernelTrace, head_program

MAX_TRACED_ACCESSES = 1_000_000  # tile accesses per head the Python tracer walks in about 2.5 s


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


@dataclass
class L2Result:
    schedule: str
    profile: str
    inputs: L2Inputs
    kernels: list[KernelL2]
    launch: LaunchModel
    dedupe: bool
    seconds: float = 0.0

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
        return f"{x.capacity:,} B L2, {self.kernels[0].resident} blocks resident" + "".join(", " + e for e in extra)

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
            "seconds": self.seconds,
            "launch": self.launch.note,
            "kernels": [
                {"name": k.name, "grid": k.grid, "resident": k.resident, "hbm_read_bytes": k.dram_read,
                 "hbm_write_bytes": k.dram_write, "dirty_at_end_bytes": k.dirty_at_end,
                 "hbm_read_by_tensor": k.read_by_tensor, "hbm_write_by_tensor": k.write_by_tensor}
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


def unsupported(schedule: str, pass_: str, problem: AttentionProblem, tiles: Tiles, counts: Counts) -> str | None:
    """Why the L2 model cannot take this simulation (None if it can)."""
    if pass_ != "forward":
        return f"pass {pass_!r}: the L2 model knows the forward kernels' launches only"
    if schedule not in ("naive", "flash1", "flash2"):
        return f"schedule {schedule!r}: no launch geometry known to the L2 model"
    if schedule != "flash2":  # traced by the Python tracer: bound its length
        tile_rows = min(tiles.block_q or problem.seq_len, tiles.block_kv or problem.kv_len)
        per_head = (counts.global_read_bytes + counts.global_write_bytes) // problem.n_heads_total
        est = per_head // max(1, tile_rows * problem.head_dim * problem.elem_bytes) + problem.seq_len
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


def _run_trace(kt: KernelTrace, problem: AttentionProblem, x: L2Inputs, n_slots: int, grid: tuple,
               dedupe: bool) -> tuple:
    """One kernel's trace through the round loop: (read, write, dirty at end, rounds, read and written by tensor)."""
    at = atomize(kt, problem)
    n_atoms = len(at.atom_bytes)
    n_slot_heads = int(max(grid[2].max(), grid[3].max())) + 1
    m = (at.atom_bytes, at.atom_tensor, n_atoms, n_slot_heads * n_atoms, *(room_units(f) for f in x.room),
         ROOM_UNIT * x.capacity, dedupe)
    trace = (at.acc_atom, at.acc_shape, kt.write, at.shapes)
    return run_kernel(trace, at.atom_kv, grid, m, n_slots, x.dirty_at_start, len(TENSOR_CODES))


def simulate_l2(schedule: str, problem: AttentionProblem, tiles: Tiles, profile: str | Profile | None = None,
                inputs: L2Inputs = PROFILE_INPUTS, *, resident: int | list[int] | None = None, variant: str = "iosim",
                traces: list[KernelTrace] | None = None, dedupe: bool = True) -> L2Result:
    """DRAM read/write bytes of every kernel of ``schedule`` under the L2 model (see :mod:`iosim.l2`).

    ``inputs`` overrides the profile's L2 inputs; ``resident`` the number of program blocks running at once (one
    number, or one per kernel); ``variant``: ``"iosim"`` (our kernels' launch) or ``"fa2"`` (FlashAttention-2's);
    ``traces``: the access streams to run instead of the schedule's (the calibration probes); ``dedupe=False``
    runs the exact trace (see the module docstring)."""
    t0 = time.perf_counter()
    prof = get_profile(profile)
    x = inputs.resolved(prof)
    lm = launch_model(schedule, problem, tiles, variant=variant)
    if traces is None:
        traces = head_program(schedule, problem, tiles, kv_order=lm.kv_order)
    head_q, head_kv = head_slots(problem, lm.head_order)
    sms = int(prof.require("sm_count"))
    out = []
    for ki, kt in enumerate(traces):
        klm = lm.kernels[ki]
        r, limits = _residency(prof, klm, resident, ki)
        nb = kt.n_blocks
        order = np.arange(nb, dtype=np.int64)[::-1].copy() if klm.block_order == "reverse" else np.arange(nb)
        r = int(min(r, nb * len(head_q))) if nb else 1
        grid = (kt.ptr, order.astype(np.int64), head_q, head_kv, sms, x.block_share)
        if nb == 0:
            rd = wr = dirty = rounds = 0
            rd_t = wr_t = np.zeros(len(TENSOR_CODES), np.int64)
        else:
            rd, wr, dirty, rounds, rd_t, wr_t = _run_trace(kt, problem, x, r, grid, dedupe)
        gr, gw = global_bytes(kt, problem, len(head_q))
        out.append(KernelL2(kt.name, nb * len(head_q), r, limits, int(rd), int(wr), int(dirty),
                            {TENSOR_NAMES[i]: int(v) for i, v in enumerate(rd_t) if v},
                            {TENSOR_NAMES[i]: int(v) for i, v in enumerate(wr_t) if v}, gr, gw, int(rounds)))
    return L2Result(schedule, prof.name, x, out, lm, dedupe, time.perf_counter() - t0)
