"""The tracer: a schedule's tile program, recorded as tile accesses per thread block.

Part of the L2 model; the model as a whole is described in :mod:`iosim.l2`.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from ..problem import AttentionProblem
from ..schedules import Tiles, get_schedule
from ..schedules.machine import Counter
from ._common import TENSOR_CODES, L2ModelError


class Tracer(Counter):
    """Records every global load/store of a tile program as ``(tensor, r0, r1, c0, c1, write)`` per thread block.

    It counts like the :class:`~iosim.schedules.machine.Counter` it extends (so a test can check the trace adds up to the
    schedule's ``global`` bytes). ``kv_order`` overrides the order of the K/V loop (``"forward"`` as written, or
    ``"reverse"`` as FlashAttention-2's CUDA kernel iterates). One kernel launch = one list of blocks.
    """

    def __init__(self, problem: AttentionProblem, kv_order: str = "forward"):
        super().__init__(problem)
        self.kv_order = kv_order
        self.traces: list[list[list[tuple]]] = []  # kernel -> block -> accesses
        self._blocks: list[list[tuple]] | None = None
        self._cur: list[tuple] | None = None

    @contextmanager
    def kernel(self, name, grid):
        self._blocks = []
        with super().kernel(name, grid):
            yield
        if self._cur is not None:  # a kernel whose program opened no thread block (one block for the grid)
            self._blocks.append(self._cur)
            self._cur = None
        self.traces.append(self._blocks)
        self._blocks = None

    @contextmanager
    def thread_block(self):
        self._cur = []
        with super().thread_block():
            yield
        self._blocks.append(self._cur)
        self._cur = None

    def order(self, blocks):
        return reversed(list(blocks)) if self.kv_order == "reverse" else blocks

    def _rec(self, tensor, rows, cols, write, pad=0):
        if self._cur is None:
            self._cur = []
        c0, c1 = (cols.start, cols.stop + pad) if cols is not None else (0, 0)
        self._cur.append((TENSOR_CODES[tensor], rows.start, rows.stop, c0, c1, write))

    def load(self, tensor, rows, cols=None, dtype=None, pad=0):
        self._check(dtype)
        self._rec(tensor, rows, cols, False, pad)
        return super().load(tensor, rows, cols, pad=pad)

    def store(self, tensor, rows, tile, cols=None, dtype=None, pad=0):
        self._check(dtype)
        self._rec(tensor, rows, cols, True, pad)
        return super().store(tensor, rows, tile, cols, pad=pad)

    def _check(self, dtype):
        if dtype is not None and dtype != self.problem.dtype:  # the atoms take every tile in the problem's dtype
            raise L2ModelError(f"the tracer records tiles in the problem's dtype ({self.problem.dtype}), not {dtype}")

    def fill(self, tensor, rows, value):
        self._rec(tensor, rows, None, True)
        return super().fill(tensor, rows, value)

    def atomic_add(self, tensor, rows, tile):
        # a reduction in L2 (red.global.add): the L2 reads the rows' lines (from DRAM where it does not hold them),
        # adds, and holds them dirty: a read, then a write
        self._rec(tensor, rows, None, False)
        self._rec(tensor, rows, None, True)
        return super().atomic_add(tensor, rows, tile)


@dataclass
class KernelTrace:
    """One kernel's accesses for one head: block b's accesses are rows ``ptr[b]:ptr[b+1]`` of the arrays."""

    name: str
    ptr: np.ndarray  # int64 (blocks + 1)
    tensor: np.ndarray  # int8
    r0: np.ndarray  # int64
    r1: np.ndarray
    c0: np.ndarray
    c1: np.ndarray
    write: np.ndarray  # bool

    @property
    def n_blocks(self) -> int:
        return len(self.ptr) - 1


def _from_lists(name: str, blocks: list[list[tuple]]) -> KernelTrace:
    ptr = np.zeros(len(blocks) + 1, dtype=np.int64)
    ptr[1:] = np.cumsum([len(b) for b in blocks])
    flat = [a for b in blocks for a in b]
    arr = np.array(flat, dtype=np.int64).reshape(-1, 6) if flat else np.zeros((0, 6), dtype=np.int64)
    return KernelTrace(
        name,
        ptr,
        arr[:, 0].astype(np.int8),
        arr[:, 1].copy(),
        arr[:, 2].copy(),
        arr[:, 3].copy(),
        arr[:, 4].copy(),
        arr[:, 5].astype(bool),
    )


def trace_program(
    schedule: str, problem: AttentionProblem, tiles: Tiles, kv_order: str = "forward", pass_: str = "forward"
) -> list[KernelTrace]:
    """Run the schedule's tile program of ``pass_`` for one head (the backward's unit: :mod:`iosim.l2.backward`)
    through the :class:`Tracer`; ``kv_order`` orders its inner loop (the backward's: over Q blocks)."""
    x = Tracer(problem, kv_order)
    get_schedule(schedule, pass_).program(x, problem, tiles)
    return [_from_lists(k.name, blocks) for k, blocks in zip(x.kernels, x.traces, strict=True)]
