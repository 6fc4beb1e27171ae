"""The L2 model: a three-level hierarchy (DRAM - L2 - SM) that turns a schedule's tile accesses into DRAM bytes.

``global`` (what the SMs request from L2) is the schedule's own count. ``hbm`` (what crosses L2 <-> DRAM) depends on
which thread blocks run at once, the order the hardware launches them, and the L2 capacity; this module predicts
it under the conditions Nsight Compute measures by default:

* L2 is flushed (clean and empty) before every kernel, so each kernel starts cold;
* reads that miss fetch their bytes from DRAM; writes allocate without a fetch (whole sectors are written) and
  mark the bytes dirty; a dirty byte reaches DRAM only when it is evicted during the kernel;
* dirty bytes still in L2 when the kernel ends are NOT counted as DRAM writes (reported as ``dirty_at_end``).

How the access stream is made
-----------------------------
1. The tile program of ONE head is run by :class:`Tracer` (a :class:`~iosim.machine.Counter` that also records
   every load/store as ``(tensor, rows, cols, write)`` per thread block). For flash2 and naive, whose programs
   are simple, :func:`head_program` can produce the same records with NumPy (``fast=True``; the tests prove them
   equal to the tracer's), because a Python walk of a 131072-token head takes minutes.
2. Each tensor's accesses within one kernel are cut into *atoms*: rectangles between consecutive tile edges. Every
   access is a whole number of atoms; a line belongs to exactly one atom.
3. The grid is laid out as the GPU launches it (:func:`launch_model` states it per schedule, read from ``iosim/gpu``):
   heads outermost in the kernel's grid order, the blocks of a head in ``blockIdx.x`` order. ``R`` thread blocks
   run at once (:func:`resident_blocks`: shared memory, registers, threads, block limit per SM, times the SM
   count); slot ``s`` is on SM ``s mod sm_count``. Execution is modeled as rounds: in each round a running block
   issues its next tile access if its share allows; a block that finishes hands its slot to the next block in launch
   order. Shares (block drift, ``sm.block_share`` = b): the k-th oldest block on an SM gets a share proportional to
   b**k, the shares of an SM summing to one access per round (b = 1: every block one access per round, lockstep).
   Measured on the H200 from block timelines (docs/validation.md): b = 0.851.
4. L2 is a byte-weighted LRU of the profile's capacity, with atoms as the unit of recency and partial eviction of
   the least-recent atom. Each byte takes room by kind (``l2.room``): a clean line read by SMs of one half of the
   chip (slots below / above ``sm_count / 2``), one read by both halves (a copy in each L2 partition), a dirty line.
   ``l2.dirty_at_start`` bytes of dirty lines (not the kernel's) are the least recent at the start. With no room
   factors and nothing dirty at the start this equals a line-granular LRU over the same trace when every access
   touches its atoms' lines in a fixed order (tested against a plain line-level LRU).

Approximation (``dedupe=True``, the default): within one round, a tile that several blocks read is touched once,
at its first occurrence in the round (later reads in the same round are hits in both models; only their recency
order inside the round differs; valid when L2 holds a few rounds' worth of tiles, R x tile bytes, which is 2 MiB
against 60 MiB for flash2 on an H200). This makes lockstep blocks that stream the same K/V cost one LRU operation per
round instead of R. The tests bound its difference from the exact trace (``dedupe=False``) on small cases.

Two options change the picture of L2 (docs/validation.md): ``partitions=True`` (or ``l2.partitions: 2``) keeps the
two L2 partitions apart, each an LRU of half the capacity with copies of lines homed across
(:mod:`iosim.l2.partitions`, as the one-partition probe shows), and ``topology`` places blocks on SMs and SMs on
partitions as measured (:class:`iosim.profile.SMTopology`). Neither is the default. ``dirty_limit`` (or
``l2.dirty_limit``): past that many dirty bytes L2 writes back its least recently touched dirty lines and keeps them,
clean, as run 13's read-back probe shows the GPU does; with ``miss_curve`` (the stack-distance variant, a soft edge)
and ``clean_ahead``, dirty lines are also written back a little before they are evicted. That model fits every
probe best, yet misses more of the sweep than the default (docs/validation.md, "Dirty lines past a limit"); no
profile sets it.

Not modeled: set associativity and address hashing (the model's edge is hard where the L2's is soft:
docs/validation.md, outliers), the measured placement by default (the assumed one: halves by slot number), sectors of
a line left unfilled (row segments shorter than a line), prefetch, compression, and speed differences between
blocks other than by age on their SM. :mod:`iosim.l2.probes` runs the model on the probe kernels that measure
its inputs.
"""

from ._common import KV_TENSORS, TENSOR_CODES, TENSOR_NAMES, L2ModelError
from .cache import KernelL2, L2Result, block_accesses, simulate_l2, timeline_rates
from .hooks import MAX_TRACED_ACCESSES, apply_l2, simulate_hbm
from .launch import (
    FLASH2_REGISTERS,
    FLASH2_REGISTERS_DEFAULT,
    KernelLaunchModel,
    LaunchModel,
    launch_model,
    resident_blocks,
)
from .reference import compulsory, reference_lines
from .trace import KernelTrace, Tracer, head_program, trace_program

__all__ = [
    "FLASH2_REGISTERS",
    "FLASH2_REGISTERS_DEFAULT",
    "KV_TENSORS",
    "MAX_TRACED_ACCESSES",
    "TENSOR_CODES",
    "TENSOR_NAMES",
    "KernelL2",
    "KernelLaunchModel",
    "KernelTrace",
    "L2ModelError",
    "L2Result",
    "LaunchModel",
    "Tracer",
    "apply_l2",
    "block_accesses",
    "compulsory",
    "head_program",
    "launch_model",
    "reference_lines",
    "resident_blocks",
    "simulate_hbm",
    "simulate_l2",
    "timeline_rates",
    "trace_program",
]
