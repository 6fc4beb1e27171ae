"""Tile geometry: which rows a block holds, which K/V blocks a Q block visits, and how thread blocks fill the SMs.

One question per function, like FlashAttention's ``BlockInfo.get_n_block_min_max``. Ragged last tiles hold
their real rows only (no padding). Everything here works on Python ints and, where noted, on NumPy arrays
(for the vectorized closed forms).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np


def cdiv(a, b):
    """Ceiling division for ints or integer arrays."""
    return -(-a // b)


@dataclass(frozen=True)
class Rows:
    """Rows [start, stop) of a tensor: one tile's extent along the sequence."""

    start: int
    stop: int

    @property
    def size(self) -> int:
        return self.stop - self.start

    def slice(self) -> slice:
        return slice(self.start, self.stop)

    def shifted(self, by: int) -> Rows:
        """The same rows ``by`` rows further on (a packed sequence's rows in the packed tensor)."""
        return Rows(self.start + by, self.stop + by)


def block_rows(index: int, block: int, length: int) -> Rows:
    """Rows of block ``index`` when ``length`` rows are cut into blocks of ``block`` (last one ragged)."""
    start = index * block
    return Rows(start, min(start + block, length))


def n_kv_blocks_visible(i, Br, Bc, N, Nk, causal):
    """How many K/V blocks (from block 0) Q block ``i`` must visit: all of them, or, with a causal mask
    aligned bottom-right, those that hold at least one key visible to a row of the block.

    Query row r sees key c iff ``c <= r + (Nk - N)``; the block's last row is ``min((i+1)·Br, N) - 1``, so
    the visible keys are ``[0, min(Nk, min((i+1)·Br, N) + Nk - N))``. Works elementwise on arrays.
    """
    Tc = cdiv(Nk, Bc)
    if not causal:
        n = Tc + 0 * i
        return int(n) if np.ndim(n) == 0 else n
    last_row_end = np.minimum((i + 1) * Br, N)
    visible = np.clip(last_row_end + (Nk - N), 0, Nk)
    n = cdiv(visible, Bc)
    return int(n) if np.ndim(n) == 0 else n


def kv_block_range(i: int, Br: int, Bc: int, N: int, Nk: int, causal: bool,
                   window: tuple[int | None, int | None] | None = None) -> tuple[int, int]:
    """K/V blocks ``lo .. hi - 1`` that Q block ``i`` visits: those holding a key some row of the block sees.

    Row r sees key c iff ``c <= r + off`` (causal) and ``r + off - left <= c <= r + off + right`` (``window``; None:
    no bound on that side), off = Nk - N. The largest key is the block's last row's (capped at Nk - 1), the smallest
    its first row's; as kernels/flash_fwd.cu computes them (an empty range: hi <= lo)."""
    Tc, off = cdiv(Nk, Bc), Nk - N
    left, right = window if window is not None else (None, None)
    if causal:
        right = 0 if right is None else min(right, 0)
    hi = Tc
    if right is not None:
        last_key = min((i + 1) * Br, N) - 1 + off + right
        hi = 0 if last_key < 0 else min(Tc, last_key // Bc + 1)
    lo = 0
    if left is not None:
        first_key = i * Br + off - left
        lo = 0 if first_key <= 0 else min(Tc, first_key // Bc)
    return lo, hi


def kv_block_ranges(N: int, Nk: int, Br: int, Bc: int, causal: bool,
                    window: tuple[int | None, int | None] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(lo, hi) of :func:`kv_block_range` for every Q block, int64 arrays (an empty range: hi <= lo)."""
    Tr = cdiv(N, Br)
    if window is None:  # from block 0: the vectorized count
        hi = np.asarray(n_kv_blocks_visible(np.arange(Tr), Br, Bc, N, Nk, causal), dtype=np.int64).reshape(Tr)
        return np.zeros(Tr, dtype=np.int64), hi
    ranges = np.array([kv_block_range(i, Br, Bc, N, Nk, causal, window) for i in range(Tr)], dtype=np.int64)
    return ranges.reshape(-1, 2)[:, 0], ranges.reshape(-1, 2)[:, 1]


@dataclass(frozen=True)
class VisitSums:
    """Sums over the visited (Q block i, K/V block j) pairs that every tiled closed form is made of.

    pairs     Σ_i n_i                      visited tile pairs
    row_visits Σ_i br_i · n_i              query rows times K/V blocks visited
    col_visits Σ_i Σ_{j<n_i} bc_j          key rows streamed, summed over Q blocks
    area      Σ_i br_i · Σ_{j<n_i} bc_j    score elements computed (masked ones inside visited tiles included)
    kv_blocks  number of K/V blocks visited by at least one Q block
    q_rows    Σ_{i: n_i > 0} br_i              query rows of the Q blocks that visit at least one K/V block
    """

    pairs: int
    row_visits: int
    col_visits: int
    area: int
    kv_blocks: int
    q_rows: int


def visit_sums(N, Nk, Br, Bc, causal: bool, window: tuple[int | None, int | None] | None = None) -> VisitSums:
    """Exact visit sums, vectorized over the Q blocks (no Python loop over blocks).

    ``N, Nk, Br, Bc`` may be ints (the fields are then ints) or NumPy integer arrays that broadcast together
    (the fields are then arrays of that shape): one call covers a whole sweep. ``window`` (left, right): a sliding
    window (:func:`kv_block_range`), ints only.
    """
    if window is not None:
        return _visit_sums_window(int(N), int(Nk), int(Br), int(Bc), causal, window)
    if all(np.ndim(x) == 0 for x in (N, Nk, Br, Bc)):
        return _visit_sums_scalar(int(N), int(Nk), int(Br), int(Bc), causal)
    N, Nk, Br, Bc = (np.asarray(x, dtype=np.int64) for x in np.broadcast_arrays(N, Nk, Br, Bc))
    Tr = cdiv(N, Br)
    i = np.arange(int(Tr.max()), dtype=np.int64).reshape((-1,) + (1,) * N.ndim)  # blocks along axis 0
    valid = i < Tr
    br = np.where(valid, np.minimum((i + 1) * Br, N) - i * Br, 0)
    n = np.where(valid, n_kv_blocks_visible(i, Br, Bc, N, Nk, causal), 0)
    cols = np.minimum(n * Bc, Nk)
    sums = (n.sum(axis=0), (br * n).sum(axis=0), cols.sum(axis=0), (br * cols).sum(axis=0), n.max(axis=0),
            np.where(n > 0, br, 0).sum(axis=0))
    # Each sum fits int64 (at most N·N_kv <= 2^62), but a closed form's products of them (4·area·d) need not:
    # hand them on as Python ints (dtype object), as the sweep's sizes are, so no product wraps.
    return VisitSums(*(s.astype(object) for s in sums))


def _visit_sums_scalar(N: int, Nk: int, Br: int, Bc: int, causal: bool) -> VisitSums:
    Tr = cdiv(N, Br)
    i = np.arange(Tr, dtype=np.int64)
    br = np.minimum((i + 1) * Br, N) - i * Br
    n = np.asarray(n_kv_blocks_visible(i, Br, Bc, N, Nk, causal), dtype=np.int64)
    cols = np.minimum(n * Bc, Nk)  # visited K/V blocks are 0..n-1, contiguous from the start
    return VisitSums(
        pairs=int(n.sum()),
        row_visits=int((br * n).sum()),
        col_visits=int(cols.sum()),
        area=int((br * cols).sum()),
        kv_blocks=int(n.max()) if Tr else 0,
        q_rows=int(br[n > 0].sum()),
    )


def _visit_sums_window(N: int, Nk: int, Br: int, Bc: int, causal: bool, window) -> VisitSums:
    """visit_sums where each Q block visits the K/V blocks of :func:`kv_block_range` (from ``lo``, not from 0)."""
    Tr = cdiv(N, Br)
    ranges = list(zip(*(a.tolist() for a in kv_block_ranges(N, Nk, Br, Bc, causal, window)), strict=True))
    br = [min((i + 1) * Br, N) - i * Br for i in range(Tr)]
    n = [max(0, hi - lo) for lo, hi in ranges]
    cols = [min(hi * Bc, Nk) - lo * Bc if hi > lo else 0 for lo, hi in ranges]
    live = [r for r, k in zip(ranges, n, strict=True) if k]  # the visited blocks of the Q blocks: one run, no gaps
    return VisitSums(pairs=sum(n), row_visits=sum(b * k for b, k in zip(br, n, strict=True)), col_visits=sum(cols),
                     area=sum(b * c for b, c in zip(br, cols, strict=True)),
                     kv_blocks=max(hi for _, hi in live) - min(lo for lo, _ in live) if live else 0,
                     q_rows=sum(b for b, k in zip(br, n, strict=True) if k))


def assign(costs, slots: int) -> tuple[list[list[int]], list]:
    """List scheduling, the one placement of thread blocks used everywhere (the time models' grids, the flash3 host
    scheduler): work items in the order given, each to the slot that frees first (the lowest-numbered on a tie).
    Returns each slot's items and each slot's load."""
    per_slot: list[list[int]] = [[] for _ in range(slots)]
    heap = [(0, x) for x in range(slots)]
    for i, c in enumerate(costs):
        load, x = heapq.heappop(heap)
        per_slot[x].append(i)
        heapq.heappush(heap, (load + c, x))
    loads = [0] * slots
    for load, x in heap:
        loads[x] = load
    return per_slot, loads


def makespan(durations: np.ndarray, slots: int, longest_first: bool = False) -> float:
    """When the last of ``durations`` (thread blocks in launch order, or longest first: a persistent scheduler's LPT)
    ends on ``slots`` slots under :func:`assign`."""
    d = np.sort(durations)[::-1] if longest_first else np.asarray(durations)
    if len(d) <= slots:
        return float(d.max()) if len(d) else 0.0
    if np.all(d == d[0]):  # equal work: whole waves
        return float(cdiv(len(d), slots) * d[0])
    return float(max(assign(d.tolist(), slots)[1]))


def tail_makespan(durations: np.ndarray, sms: int, per_sm: int, speedup) -> float:
    """:func:`makespan` on ``sms`` SMs of ``per_sm`` slots each, where a block runs faster once its SM holds fewer:
    ``durations`` are each block's seconds at ``per_sm`` blocks an SM, ``speedup[j]`` (j = 1 .. per_sm,
    ``speedup[per_sm]`` = 1) how much faster every block on an SM runs while j run there. While blocks wait for a
    slot every freed slot is taken at once, so each SM holds ``per_sm`` until the last block is placed; after that
    each SM empties (slot x of :func:`assign` is on SM x mod sms, the breadth-first deal of a grid) and its last
    blocks speed up."""
    d = np.asarray(durations, dtype=float)
    slots = sms * per_sm
    if len(d) == 0:
        return 0.0
    if np.all(d == d[0]):  # equal work: whole waves, then the last wave's blocks dealt over the SMs
        waves, last = divmod(len(d), slots)
        if last == 0:
            return float(waves * d[0])
        busiest = min(per_sm, cdiv(last, sms))  # blocks on the SMs holding the most of the last wave
        return float(waves * d[0] + d[0] / speedup[busiest])
    per_slot, loads = assign(d.tolist(), slots)
    ends = np.asarray(loads, dtype=float)
    placed = max(ends[x] - d[items[-1]] for x, items in enumerate(per_slot) if items)  # the last block's start
    left = np.maximum(ends - placed, 0.0).reshape(-1, sms)  # (slot row, SM): work each running block has left
    left = np.sort(left, axis=0)
    finish = np.full(sms, placed)
    done = np.zeros(sms)
    for row in range(left.shape[0]):  # the block with the least left on each SM ends first, then the next
        running = np.count_nonzero(left[row:] > 0, axis=0)
        step = np.where(running > 0, (left[row] - done) / np.asarray([speedup[max(1, n)] for n in running]), 0.0)
        finish += np.maximum(step, 0.0)
        done = np.maximum(done, left[row])
    return float(finish.max())
