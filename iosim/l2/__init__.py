"""The L2 model: a three-level hierarchy (DRAM - L2 - SM) that turns a schedule's tile accesses into DRAM bytes.

``global`` (what the SMs request from L2) is the schedule's own count. ``hbm`` (what crosses L2 <-> DRAM) depends on
which thread blocks run at once, the order the hardware launches them, and the L2 capacity; this package predicts
it under the conditions Nsight Compute measures by default:

* L2 is flushed (clean and empty) before every kernel, so each kernel starts cold;
* reads that miss fetch their bytes from DRAM; writes allocate without a fetch (whole sectors are written) and
  mark the bytes dirty; a dirty byte reaches DRAM only when it is evicted during the kernel;
* dirty bytes still in L2 when the kernel ends are NOT counted as DRAM writes (reported as ``dirty_at_end``).

How the access stream is made (one module each)
-----------------------------------------------
1. ``trace``: the tile program of ONE head is run by :class:`Tracer` (an interpreter that records every load and
   store as ``(tensor, rows, cols, write)`` per thread block). The model builds each schedule's program directly
   instead, its loops kept compact (the tests prove each, expanded, equal to the tracer's), because a Python walk
   of a 131072-token head takes minutes: flash2's K/V loop as one repeated group (:mod:`iosim.l2.program`);
   naive's kernels as rows of alike blocks, flash1's passes as groups (:mod:`iosim.l2.programs`); flash2's
   backward kernels, each K/V block's loop over Q blocks as one group (:mod:`iosim.l2.backward`, which also says
   how DRAM sees the fp32 dQ reductions: a read of the line where L2 lacks it, then a dirty line). The tracer
   itself runs only for traces given to :func:`simulate_l2` (the calibration probes) and in the tests.
2. ``atoms``: each tensor's accesses within one kernel are cut into *atoms*, rectangles between consecutive tile
   edges. Every access is a whole number of atoms; a line belongs to exactly one atom.
3. ``model``: the grid is laid out as the GPU launches it (:mod:`iosim.launch`): heads outermost in the kernel's
   grid order, the blocks of a head in ``blockIdx.x`` order. ``R`` thread blocks run at once (shared memory,
   registers, threads, block limit per SM, times the SM count); slot ``s`` is on SM ``s mod sm_count``.
4. ``lru``: execution is modeled as rounds: in each round a running block issues its next tile access if its share
   allows; a block that finishes hands its slot to the next block in launch order. Shares (block drift,
   ``sm.block_share`` = b): the k-th oldest block on an SM gets a share proportional to b**k, the shares of an SM
   summing to one access per round (b = 1: lockstep). L2 is a byte-weighted LRU of the profile's capacity, with
   atoms as the unit of recency and partial eviction of the least-recent atom. Each byte takes room by kind
   (``l2.room``): a clean line read by SMs of one half of the chip (slots below / above ``sm_count / 2``), one
   read by both halves (a copy in each L2 partition), a dirty line. ``l2.dirty_at_start`` bytes of dirty lines
   (not the kernel's) are the least recent at the start. With no room factors and nothing dirty at the start this
   equals a line-granular LRU over the same trace (tested against a plain line-level LRU).

Approximation (``WalkOptions(dedupe=True)``, the default): within one round, a tile that several blocks read is
touched once, at its first occurrence in the round (later reads in the same round are hits in both models; only
their recency order inside the round differs; valid when L2 holds a few rounds' worth of tiles, R x tile bytes,
which is 2 MiB against 60 MiB for flash2 on an H200). Lockstep blocks that stream the same K/V then cost one LRU
operation per round instead of R. The tests bound its difference from the exact trace (``dedupe=False``) on small
cases.

Large problems (``WalkOptions(exact=False)``, the default, beyond ``WALK_BUDGET`` = 64 million tile accesses in
all): the access stream is not walked in full. A ``--l2-exact`` / ``WalkOptions(exact=True)`` run walks every
access (as above) and is what the default is checked against (tests/test_l2_scale.py: within 1% on ``hbm`` read
and write).

* No trace is stored: flash2's K/V loop is one group of two records (K_j, V_j) repeated for each visible j
  (:mod:`iosim.l2.program`), so memory is per atom (~4 MB per head at N = 1,048,576), not per access (4.8 GB).
  naive's rows of S and P tiles are touched once each: rows far enough apart share atoms (those of all heads, in
  turn; far enough that LRU has evicted a row's tiles before the row that many later comes, so the bytes are the
  same, tested), and the cache holds a few hundred rows of tiles, not all N x N_kv of every head.
* Heads are alike: the grid is walked for its first few heads: the first (it starts cold), whole periods of the
  grid's pattern of shared K/V (a GQA query group; with every batch for grid (.., batch, heads)), and the last (it
  drains the grid and leaves dirty lines at the end); every head not walked is given the mean DRAM bytes of the
  walked middle heads. The extrapolation is taken only once the middle heads' first and second halves (whole
  periods each) agree within 0.5%, reads and writes each; else about four times as many heads are walked, and the
  whole grid once a walk would not save three quarters of it. A head whose boundary falls at another point of the
  waves costs differently (up to 10% at N = 131072, every fourth head): the first walk has 2 middle periods where a
  head runs 32 waves or more (and is taken where it saves half the grid), 6 from 8 waves, else 14. Where a
  head has few blocks (flash1's one), many run beside each other: the middle heads walked must fill the resident
  slots four times over, else every head is walked.
* Waves repeat: every 256 rounds the loop takes stock (:mod:`iosim.l2.steady`). When every resident block is deep
  in its K/V loop, none launched for two windows, the last two windows fetched the same bytes (within 1%) and
  wrote none while each block advanced alike, and either no read in them hit on data fetched in an earlier round
  or every block ran in every round (a block trailing another closely enough to reuse its data: such reuse ends at
  once as blocks drift apart, which a skip would not see; blocks that all run every round keep their distances,
  as a causal grid's blocks, launched a few rounds apart with one block an SM, do for all of their K/V loop), the
  windows up to one before the first block leaves its loop are skipped: their reads are the windows' mean; the
  cache is flushed, its dirty bytes written back (in those windows at least one L2 of new data arrives, so they
  would be evicted); the blocks jump ahead and re-run the last windows, enough to fetch one L2, without counting
  them, so that L2 holds what it would.
* Rows repeat (naive, :mod:`iosim.l2.rows`): the grid is walked with the first T, 2T and 3T rows of each head;
  where the two increments agree within 0.5%, every further row costs the last increment.
* Passes stream (flash1, :mod:`iosim.l2.passes`): where each pass over the Q blocks moves four L2s or more, LRU
  keeps nothing of it for the next; the walk starts at a late pass, from a cold cache, and at the one after it, and
  every earlier pass costs its tiles at the rate the difference of the two walks gives, tensor by tensor (taken
  where that pass's Q tiles all missed; else every pass is walked).
* naive with tiles so small that its P V kernel would hold more than ``MAX_NAIVE_TILES`` tiles at once is refused
  (:func:`unsupported` says why).

``L2Result.describe()`` (the ``hbm_model`` text) says which were used, e.g. "4 of 32 heads walked, the rest
extrapolated, 81% of their accesses in steady K/V windows skipped". Measured against the full walk (docs/validation.md has the
figures; tests/test_l2_scale.py and tests/test_l2_programs.py check 1%): flash2 at N = 1,048,576 within 0.05%,
causal and grouped-query too; naive within 0.3%; flash1's passes to the byte.

The inputs (room factors, dirty lines at the start, block drift) are calibrated on the GPU by the probes of
:mod:`iosim.l2.probes` (docs/validation.md says how, and what the models tried and not adopted taught). Not
modeled: set associativity and address hashing (the model's edge is hard where the L2's is soft), where the
hardware really places blocks, sectors of a line left unfilled, prefetch, compression, and speed differences between
blocks other than by age on their SM.
"""

from ._common import KV_TENSORS, TENSOR_CODES, TENSOR_NAMES, L2ModelError
from .model import (
    MAX_NAIVE_TILES,
    KernelL2,
    L2Inputs,
    L2Result,
    WalkOptions,
    head_slots,
    simulate_l2,
    unsupported,
)
from .trace import KernelTrace, Tracer, trace_program

__all__ = [
    "KV_TENSORS",
    "MAX_NAIVE_TILES",
    "TENSOR_CODES",
    "TENSOR_NAMES",
    "KernelL2",
    "KernelTrace",
    "L2Inputs",
    "L2ModelError",
    "L2Result",
    "Tracer",
    "WalkOptions",
    "head_slots",
    "simulate_l2",
    "trace_program",
    "unsupported",
]
