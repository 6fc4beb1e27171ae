"""The L2 model's entry: a schedule's launch and tile accesses in, DRAM bytes of every kernel out.

Part of the L2 model; the model as a whole is described in :mod:`iosim.l2`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

from ..blocks import cdiv
from ..counts import Counts
from ..hardware.gpu import Profile, get_profile
from ..launch import LaunchModel, backward_launch_model, launch_model, resident_blocks
from ..problem import AttentionProblem
from ..schedules import Tiles
from ..schedules.flash2_bwd import GroupedTiles, gqa_of
from ._common import TENSOR_NAMES, L2ModelError
from .backward import flash2_bwd_programs
from .passes import walk_passes
from .program import LoopProgram, flash2_program, from_trace
from .programs import flash1_program, naive_programs
from .rows import walk_rows
from .trace import KernelTrace
from .walk import PROFILE_INPUTS, L2Inputs, head_period, walk_kernel

# Beyond this many tile accesses (all heads) the default model extrapolates over heads and skips steady windows;
# below it every access is walked (flash2, N = 65536, 32 heads, tiles 128 x 32: 67M accesses, 1-3 s on one core)
WALK_BUDGET = 64_000_000
# naive's P V kernel holds the P tiles of about three times the resident blocks' rows at once (each row's tiles as
# atoms of their own): beyond this many (about 700 MB of arrays) it is refused; naive's own tiles (128) stay far
# below it (N = 187,392, the longest whose S and P fit in an H200: 1.5 million).
MAX_NAIVE_TILES = 12_000_000
# flash1 runs one block a head, every head beside the others: its Q, O, l, m, K, V tiles of every head are atoms at
# once; beyond this many (about 1 GB) it is refused (its default tiles stay far below it wherever the problem fits)
MAX_FLASH1_TILES = 16_000_000


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
    skipped_what: str = "in steady K/V windows skipped"  # what became of the skipped accesses

    def approximation(self) -> str:
        """How this kernel's bytes were obtained, in a few words ("" for the full walk)."""
        out = []
        if self.heads_walked < self.heads:
            out.append(f"{self.heads_walked} of {self.heads} heads walked, the rest extrapolated")
        if self.skipped:
            out.append(f"{self.skipped / self.accesses:.0%} of their accesses {self.skipped_what}")
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


FLASH2_LIKE = ("flash2", "flash3")  # schedules whose one-head program is flash2's


def naive_tiles(problem: AttentionProblem, tiles: Tiles) -> int:
    """About how many P tiles naive's P V kernel holds as atoms: those of up to ~1024 rows (a wrap of rows shared
    in turn, :mod:`iosim.l2.programs`)."""
    Br, Bc = (problem.seq_len, problem.kv_len) if tiles.block_q is None else (tiles.block_q, tiles.block_kv)
    return min(cdiv(problem.seq_len, Br), 1024) * cdiv(problem.kv_len, Bc)


def flash1_tiles(problem: AttentionProblem, tiles: Tiles) -> int:
    """Tiles of every head that flash1's walk holds as atoms (Q, O, l, m and K, V, each head apart)."""
    Tr, Tc = cdiv(problem.seq_len, tiles.block_q), cdiv(problem.kv_len, tiles.block_kv)
    return problem.n_heads_total * (4 * Tr + 2 * Tc)


def unsupported(schedule: str, pass_: str, problem: AttentionProblem, tiles: Tiles, counts: Counts) -> str | None:
    """Why the L2 model cannot take this simulation (None if it can)."""
    if pass_ != "forward" and schedule not in ("flash2", "flash3"):
        return f"pass {pass_!r}: the L2 model knows the backward kernels of flash2 and flash3 only, not {schedule!r}'s"
    if schedule not in ("naive", "flash1", "flash2", "flash3"):
        return f"schedule {schedule!r}: no launch geometry known to the L2 model"
    if getattr(tiles, "seqlens", ()):
        return ("flash2 with packed sequences: the L2 model's flash2 program is one sequence's (dense or windowed); "
                "iosim.l2.packed walks the varlen grid as one program (simulate with l2=True does)")
    if schedule == "naive" and naive_tiles(problem, tiles) > MAX_NAIVE_TILES:
        return (f"naive: about {naive_tiles(problem, tiles):,} tiles of P at once in the L2 model (limit "
                f"{MAX_NAIVE_TILES:,}); use larger tiles (block_q/block_kv: naive's own kernel takes 128)")
    if schedule == "flash1" and flash1_tiles(problem, tiles) > MAX_FLASH1_TILES:
        return (f"flash1: {flash1_tiles(problem, tiles):,} tiles at once in the L2 model (limit "
                f"{MAX_FLASH1_TILES:,}); use larger tiles (block_q/block_kv) or fewer heads")
    return None


@dataclass(frozen=True)
class WalkOptions:
    """How the model walks a kernel's accesses: ``exact`` walks every one (no heads extrapolated, no steady windows
    skipped), else a kernel of more than ``budget`` tile accesses (all heads) is approximated as the module
    docstring of :mod:`iosim.l2` says; ``dedupe=False`` runs the exact trace (a tile that several blocks read in one
    round touched by each); ``progress(done, total)``, where given, is called about every 0.1 s with the accesses
    made so far."""

    exact: bool = False
    budget: int = WALK_BUDGET
    dedupe: bool = True
    progress: Callable[[int, int], None] | None = None


def _residency(prof: Profile, kernel, resident, index: int) -> tuple[int, dict]:
    """Program blocks of one kernel running at once: from the launch, or as given (one number or one per kernel)."""
    if resident is None:
        return resident_blocks(prof, kernel.threads, kernel.smem, kernel.registers)
    r = resident[index] if isinstance(resident, (list, tuple)) else resident
    return int(r), {"given": r}


def _programs(schedule: str, problem: AttentionProblem, tiles: Tiles, lm: LaunchModel,
              recycle: list | None) -> list[LoopProgram]:
    """Each forward kernel's program of one head, built directly (``recycle``: naive's rows may share atoms, one
    (resident blocks, L2 bytes, SMs, block share, heads) per kernel: :mod:`iosim.l2.programs`)."""
    if schedule in FLASH2_LIKE:  # flash3 moves flash2's tiles (its schedule's closed form)
        return [replace(flash2_program(problem, tiles, lm.kv_order), name=f"{schedule}_fwd")]
    if schedule == "flash1":
        if flash1_tiles(problem, tiles) > MAX_FLASH1_TILES:
            raise L2ModelError(unsupported(schedule, "forward", problem, tiles, Counts([])))
        return [flash1_program(problem, tiles, lm.kv_order)]
    if schedule == "naive":
        if naive_tiles(problem, tiles) > MAX_NAIVE_TILES:
            raise L2ModelError(unsupported(schedule, "forward", problem, tiles, Counts([])))
        return naive_programs(problem, tiles, recycle)
    raise L2ModelError(f"schedule {schedule!r}: no program known to the L2 model")


def unit_slots(problem: AttentionProblem, head_order: str, unit: str = "head") -> tuple[np.ndarray, np.ndarray]:
    """Query-side and kv-side slot of each of the grid's heads in launch order: query heads (:func:`head_slots`), or
    kv heads (a backward program whose unit is a kv head with its group: both slots the kv head's)."""
    if unit == "head":
        return head_slots(problem, head_order)
    B, Hk = problem.batch, problem.kv_heads
    if head_order == "batch_major":
        b, h = np.divmod(np.arange(B * Hk, dtype=np.int64), Hk)
    else:
        h, b = np.divmod(np.arange(B * Hk, dtype=np.int64), B)
    s = b * Hk + h
    return s, s.copy()


def _bwd_tiles(schedule: str, tiles: Tiles) -> Tiles:
    """flash3's backward moves flash2's tiles in the grouped design (iosim/schedules/flash3_bwd.py)."""
    return GroupedTiles(tiles.block_q, tiles.block_kv) if schedule == "flash3" else tiles


def own_variant(pass_: str, tiles: Tiles) -> str:
    """The launch a pass's kernels run by default: iosim's, but FlashAttention-2's for the backward's
    ``gqa="expand"`` (its design; iosim's kernel is ``"grouped"``)."""
    return "fa2" if pass_ == "backward" and gqa_of(tiles) == "expand" else "iosim"


def simulate_l2(schedule: str, problem: AttentionProblem, tiles: Tiles, profile: str | Profile | None = None,
                inputs: L2Inputs = PROFILE_INPUTS, *, pass_: str = "forward", variant: str | None = None,
                walk: WalkOptions = WalkOptions()) -> L2Result:
    """DRAM read/write bytes of every kernel of ``schedule`` under the L2 model (see :mod:`iosim.l2`).

    ``inputs`` overrides the profile's L2 inputs and the launch's blocks resident at once; ``pass_``:
    ``"forward"`` or ``"backward"`` (flash2's and flash3's: :mod:`iosim.l2.backward`); ``variant``: ``"iosim"``
    (our kernels' launch) or ``"fa2"`` (FlashAttention-2's; None: :func:`own_variant`); ``walk``: how the accesses
    are walked (:class:`WalkOptions`)."""
    variant = variant or own_variant(pass_, _bwd_tiles(schedule, tiles))
    lm = (backward_launch_model(schedule, problem, tiles, variant=variant) if pass_ == "backward" else
          launch_model(schedule, problem, tiles, variant=variant))

    def programs(recycle: list | None) -> list[LoopProgram]:
        if pass_ != "backward":
            return _programs(schedule, problem, tiles, lm, recycle)
        if schedule not in ("flash2", "flash3"):
            raise L2ModelError(unsupported(schedule, pass_, problem, tiles, Counts([])))
        out = flash2_bwd_programs(problem, _bwd_tiles(schedule, tiles), lm.kv_order)
        if schedule == "flash3":  # flash2's grouped traffic, as the flash3 backward schedule counts it
            out[1] = replace(out[1], name="flash3_bwd")
        return out

    return _run(schedule, problem, lm, programs, profile, inputs, walk, traced=False)


def simulate_traces(traces: list[KernelTrace], problem: AttentionProblem, tiles: Tiles,
                    profile: str | Profile | None = None, inputs: L2Inputs = PROFILE_INPUTS,
                    walk: WalkOptions = WalkOptions()) -> L2Result:
    """DRAM bytes of access streams given in place of a schedule's (the calibration probes: :mod:`iosim.l2.probes`),
    each one kernel launched as flash2's forward with ``tiles`` is (its residency unless ``inputs`` gives one)."""
    lm = launch_model("flash2", problem, tiles)
    return _run("flash2", problem, lm, lambda _: [from_trace(kt, problem) for kt in traces], profile, inputs, walk,
                traced=True)


def _run(schedule: str, problem: AttentionProblem, lm: LaunchModel, programs: Callable, profile: str | Profile | None,
         inputs: L2Inputs, walk: WalkOptions, traced: bool) -> L2Result:
    """Walk each kernel's program (``programs(recycle)``: the recycling of :func:`_programs`) over the launch ``lm``
    (``traced``: programs of access streams given, each head its own pattern)."""
    t0 = time.perf_counter()
    prof = get_profile(profile)
    x = inputs.resolved(prof)
    residency = [_residency(prof, klm, x.resident, ki) for ki, klm in enumerate(lm.kernels)]
    sms = int(prof.require("sm_count"))
    l2_bytes = int(x.capacity / min(x.room))  # the most bytes L2 holds
    recycle = None if walk.exact else [(r, l2_bytes, sms, x.block_share, problem.n_heads_total) for r, _ in residency]
    walk_args = (x, sms, l2_bytes, walk)
    out = []
    for ki, prog in enumerate(programs(recycle)):
        head_q, head_kv = unit_slots(problem, lm.head_order, prog.unit)
        period = len(head_q)
        if not traced:
            period = head_period(problem, lm.head_order) if prog.unit == "head" else 1
        out.append(_kernel_l2(schedule, problem, prog, residency[ki], lm.kernels[ki], (head_q, head_kv, period),
                              walk_args))
    return L2Result(schedule, prof.name, x, out, lm, walk.dedupe, time.perf_counter() - t0, walk.exact)


def _kernel_l2(schedule: str, problem: AttentionProblem, prog: LoopProgram, residency: tuple, klm, heads: tuple,
               walk_args: tuple) -> KernelL2:
    """One kernel's DRAM bytes: its program walked over the grid's heads ``heads`` = (query-side slots, kv-side
    slots, period of the pattern of shared K/V)."""
    x, sms, l2_bytes, opts = walk_args
    head_q, head_kv, period = heads
    H = len(head_q)
    r, limits = residency
    nb = prog.n_blocks
    r = int(min(r, nb * H)) if nb else 1
    k = KernelL2(prog.name, nb * H, r, limits, 0, 0, 0, global_read=prog.global_read * H,
                 global_write=prog.global_write * H, heads_walked=H, heads=H)
    if not nb:
        return k
    grid = (klm.block_order == "reverse", head_q, head_kv, sms, x.block_share)
    approximate = not opts.exact and prog.accesses * H > opts.budget

    def walk(pr):
        return walk_kernel(pr, x, r, grid, opts.dedupe, period, approximate, opts.progress)

    short = None
    if approximate and schedule == "flash1":  # the passes that stream: counted from their tiles
        short = walk_passes(prog, walk, H, r, l2_bytes)
        what = "(flash1's passes that stream) counted from their tiles"
    elif approximate and schedule == "naive":  # rows alike: the first walked, the others extrapolated
        short = walk_rows(prog, walk, r, l2_bytes, problem.seq_len, H)
        what = "(naive's rows past the first) extrapolated from them"
    rd_t, wr_t, w, k.heads_walked = short or walk(prog)
    k.skipped_what = what if short else k.skipped_what
    k.dram_read, k.dram_write, k.dirty_at_end = int(rd_t.sum()), int(wr_t.sum()), w.dirty
    k.read_by_tensor = {TENSOR_NAMES[i]: int(v) for i, v in enumerate(rd_t) if v}
    k.write_by_tensor = {TENSOR_NAMES[i]: int(v) for i, v in enumerate(wr_t) if v}
    k.rounds, k.skipped, k.accesses = w.rounds, w.skipped, w.accesses
    return k
