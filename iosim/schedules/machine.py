"""The instruction set of tile programs, and the counting interpreter.

A schedule (``iosim/schedules/*.py``) is written once, as a Python function over one attention head that
calls the methods of a :class:`Machine`: launch kernels, start thread blocks, load tiles from global memory
into SRAM, run the algorithm's steps on tiles, store tiles. Interpreters implement the methods:

* :class:`Counter` (here) adds up bytes per boundary, tensor and direction, and FLOPs per kind;
* :class:`iosim.numeric.NumericMachine` computes on NumPy arrays, so the exactness tests test the very
  schedule that is costed.

Tiles are opaque to the schedule: the counter's tiles carry only a shape and an element size, the numeric
machine's carry numbers. The steps are named after the papers' lines (``scores``, ``online_softmax``,
``rescale``...). FLOPs are counted as executed: a masked element inside a visited tile costs its FLOPs.

On-chip accounting (``sram``): a load writes the tile into SRAM in its storage dtype; a step reads its
operands out of SRAM and writes its results (fp32, 4 B per element) into it; a store reads the tile out.
Every on-chip value occupies a buffer named by its role (``Q``, ``K``, ``V``, ``S``, ``P``, ``O``, ``m``,
``l``...); a new value of a role replaces the old one, as a kernel reuses its registers and shared memory.
The peak, per thread block, is the largest sum of the live buffers.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

from ..blocks import Rows
from ..counts import FP32_TENSORS, INDEX_TENSORS, MATRIX_TENSORS, ROW_TENSORS, SCALE_TENSORS, KernelCounts
from ..problem import ELEMENT_BYTES, STAT_BYTES, AttentionProblem

ACC_BYTES = 4  # on-chip results (scores, probabilities, accumulators, statistics) are fp32


class Machine:
    """Interface of a tile-program interpreter. One instance runs one head (``head``, ``kv_head``)."""

    problem: AttentionProblem

    @contextmanager
    def kernel(self, name: str, grid: int):
        """A kernel launch with ``grid`` thread blocks per head."""
        yield

    @contextmanager
    def thread_block(self):
        """One thread block; its on-chip buffers are released at the end."""
        yield

    def order(self, blocks):
        """The order in which a loop visits K/V blocks (the counts do not depend on it)."""
        return blocks

    # global <-> SRAM. ``dtype``: the tile's storage type where it is not the problem's (an fp8 kernel's bf16 output,
    # the quantize kernel's bf16 input); fp32 tensors (statistics, scales) are fp32 whatever is given. ``pad``: columns
    # of S or P past ``cols`` that the access moves with them (a row's pad up to its pitch in memory): global bytes,
    # never part of the tile
    def load(self, tensor: str, rows: Rows, cols: Rows | None = None, dtype: str | None = None, pad: int = 0): ...

    def broadcast(self, tensor: str, rows: Rows, threads: int):
        """Every one of ``threads`` threads loads the same rows (a sequence's length, a block-table entry): the
        value is ``load``'s; the counter charges the load instructions' bytes, ``threads`` times the rows'."""
        return self.load(tensor, rows)
    def store(self, tensor: str, rows: Rows, tile, cols: Rows | None = None, dtype: str | None = None,
              pad: int = 0) -> None: ...
    def fill(self, tensor: str, rows: Rows, value: float) -> None:
        """Write a constant straight to global memory (FlashAttention-1 Alg. 1 line 2)."""

    # on-chip steps (see each interpreter for the arithmetic)
    def scores(self, Q_i, K_j, rows: Rows, cols: Rows): ...
    def row_softmax(self, S, rows: Rows): ...
    def matmul_acc(self, O, P, V_j): ...
    def zeros_acc(self, rows: Rows): ...
    def block_stats(self, S): ...
    def flash1_update(self, O_i, l_i, m_i, m_ij, P_ij, l_ij, V_j): ...
    def init_state(self, rows: Rows): ...
    def online_softmax(self, S, V_j, O, l, m): ...
    def finalize(self, O, l, m): ...
    def empty_output(self, rows: Rows): ...

    # backward pass (iosim/schedules/*_bwd.py) and split-KV decoding (iosim/schedules/flash_decoding.py)
    def atomic_add(self, tensor: str, rows: Rows, tile) -> None:
        """tensor[rows] += tile in global memory, by atomic adds (a read and a write of the rows, fp32)."""

    def zeros_grad(self, role: str, rows: Rows): ...
    def recompute_probs(self, S, L_i): ...
    def recompute_probs_ml(self, S, m_i, l_i): ...
    def matmul_tn_acc(self, acc, A, B): ...
    def matmul_nn_acc(self, acc, A, B): ...
    def dprobs(self, dO_i, V_j): ...
    def rowdot(self, dO_i, O_i): ...
    def dscores(self, P, dP, D_i): ...
    def softmax_grad(self, P, dP): ...
    def merge_partial(self, O, l, m, O_s, L_s): ...
    def merge_state(self, O, l, m, O2, l2, m2):
        """Two unnormalized (O, l, m) states of the same rows (iosim's decode kernel: its warps' states)."""

    # fp8 block quantization (iosim/schedules/fp8_quantize.py)
    def quantize(self, X, out: Rows, rotate: bool):
        """A block X in the problem's dtype, as ``out``'s rows (V^T: its padding keys), and its one fp32 scale;
        ``rotate``: X·diag(±1)·H_d first (incoherent processing)."""


@dataclass
class Tile:
    """A tile as the counter sees it: a shape, an element size and the role of its on-chip buffer."""

    rows: int
    cols: int
    elem: int
    role: str

    @property
    def nbytes(self) -> int:
        return self.rows * self.cols * self.elem


class Counter(Machine):
    """Counts bytes and FLOPs of one head; :func:`iosim.simulate.walk` scales by the number of heads."""

    def __init__(self, problem: AttentionProblem):
        self.problem = problem
        self.d = problem.head_dim
        self.kernels: list[KernelCounts] = []
        self._k: KernelCounts | None = None
        self._buffers: dict[str, int] = {}
        self._peak = 0

    # -- structure -----------------------------------------------------------------------------------
    @contextmanager
    def kernel(self, name: str, grid: int):
        self._k = KernelCounts(name=name, grid=grid, sram_peak=0)
        yield
        self.kernels.append(self._k)
        self._k = None

    @contextmanager
    def thread_block(self):
        self._buffers = {}
        self._peak = 0
        yield
        self._k.sram_peak = max(self._k.sram_peak, self._peak)
        self._buffers = {}

    def _hold(self, tile: Tile) -> Tile:
        self._buffers[tile.role] = tile.nbytes
        self._peak = max(self._peak, sum(self._buffers.values()))
        self._k.sram_write += tile.nbytes
        return tile

    def _read(self, *tiles: Tile) -> None:
        self._k.sram_read += sum(t.nbytes for t in tiles)

    def _flops(self, matmul: int = 0, exp: int = 0, other: int = 0) -> None:
        f = self._k.flops
        f["matmul"] += matmul
        f["exp"] += exp
        f["other"] += other

    def _elem(self, tensor: str, dtype: str | None = None) -> int:
        if tensor in FP32_TENSORS or tensor in INDEX_TENSORS:
            return STAT_BYTES
        return ELEMENT_BYTES[dtype] if dtype is not None else self.problem.elem_bytes

    def _shape(self, tensor: str, rows: Rows, cols: Rows | None) -> tuple[int, int]:
        if tensor in SCALE_TENSORS:  # rows = the blocks whose scales are read or written, one value each
            return rows.size, 1
        if tensor in MATRIX_TENSORS:
            return rows.size, cols.size
        if tensor in ROW_TENSORS:
            return rows.size, 1
        return rows.size, self.d

    # -- global <-> SRAM -----------------------------------------------------------------------------
    def load(self, tensor, rows, cols=None, dtype=None, pad=0):
        r, c = self._shape(tensor, rows, cols)
        tile = Tile(r, c, self._elem(tensor, dtype), tensor)
        self._k.global_read[tensor] += tile.nbytes + r * pad * tile.elem
        return self._hold(tile)

    def broadcast(self, tensor, rows, threads):
        # every thread of ``threads`` loads the same rows: the load instructions move threads x their bytes (what
        # Nsight Compute's smsp__sass_data_bytes_mem_global counters count, docs/validation.md); on chip one copy
        r, c = self._shape(tensor, rows, None)
        tile = Tile(r, c, self._elem(tensor), tensor)
        self._k.global_read[tensor] += threads * tile.nbytes
        return self._hold(tile)

    def store(self, tensor, rows, tile, cols=None, dtype=None, pad=0):
        r, c = self._shape(tensor, rows, cols)
        self._k.global_write[tensor] += r * (c + pad) * self._elem(tensor, dtype)
        self._read(tile)

    def fill(self, tensor, rows, value):
        r, c = self._shape(tensor, rows, None)
        self._k.global_write[tensor] += r * c * self._elem(tensor)

    # -- steps ---------------------------------------------------------------------------------------
    def scores(self, Q_i, K_j, rows, cols):
        # S = scale * Q_i K_j^T: 2·br·bc·d matmul FLOPs, one multiply per score for the scale
        br, bc = rows.size, cols.size
        self._read(Q_i, K_j)
        self._flops(matmul=2 * br * bc * self.d, other=br * bc)
        return self._hold(Tile(br, bc, ACC_BYTES, "S"))

    def row_softmax(self, S, rows):
        # P = softmax(S) row by row: max, subtract, exp, sum, divide
        self._read(S)
        n = S.rows * S.cols
        self._flops(exp=n, other=4 * n)
        return self._hold(Tile(S.rows, S.cols, ACC_BYTES, "P"))

    def zeros_acc(self, rows):
        return self._hold(Tile(rows.size, self.d, ACC_BYTES, "O"))

    def quantize(self, X, out, rotate):
        # amax pass: |x| and max per element; scale = amax / 448, one division; quantize pass: a multiply per
        # element (the e4m3 conversion is no FLOP); rotate: the Walsh-Hadamard transform, d·log2(d) adds per row
        n = X.rows * X.cols
        self._read(X)
        self._flops(other=2 * n + 1 + (X.rows * X.cols * (X.cols.bit_length() - 1) if rotate else 0))
        return (self._hold(Tile(out.size, X.cols, self.problem.elem_bytes, "Y")),
                self._hold(Tile(1, 1, STAT_BYTES, "scale")))

    def matmul_acc(self, O, P, V_j):
        # O += P V_j: 2·br·bc·d
        self._read(O, P, V_j)
        self._flops(matmul=2 * P.rows * P.cols * self.d)
        return self._hold(Tile(O.rows, O.cols, ACC_BYTES, "O"))

    def block_stats(self, S):
        # FA1 Alg. 1 line 10: m~ = rowmax(S); P~ = exp(S - m~); l~ = rowsum(P~)
        br, bc = S.rows, S.cols
        self._read(S)
        self._flops(exp=br * bc, other=3 * br * bc)
        m_ij = self._hold(Tile(br, 1, ACC_BYTES, "m~"))
        P_ij = self._hold(Tile(br, bc, ACC_BYTES, "S"))  # P~ is written over S, in place
        l_ij = self._hold(Tile(br, 1, ACC_BYTES, "l~"))
        return m_ij, P_ij, l_ij

    def flash1_update(self, O_i, l_i, m_i, m_ij, P_ij, l_ij, V_j):
        # FA1 Alg. 1 line 11: m_new = max(m_i, m~)                             br other
        #                     l_new = e^(m_i-m_new) l_i + e^(m~-m_new) l~     2br exp, 4br other
        # line 12: O_i = diag(l_new)^-1 (diag(l_i) e^(m_i-m_new) O_i + e^(m~-m_new) P~ V_j)
        #          P~ V_j: 2·br·bc·d matmul; per row: 2 factors + 1 reciprocal (3br);
        #          per element: 2 scalings, 1 add, 1 normalization (4·br·d)
        br, bc = P_ij.rows, P_ij.cols
        self._read(O_i, l_i, m_i, m_ij, P_ij, l_ij, V_j)
        self._flops(matmul=2 * br * bc * self.d, exp=2 * br, other=br + 4 * br + 3 * br + 4 * br * self.d)
        O_new = self._hold(Tile(br, self.d, ACC_BYTES, "O"))
        l_new = self._hold(Tile(br, 1, ACC_BYTES, "l"))
        m_new = self._hold(Tile(br, 1, ACC_BYTES, "m"))
        return O_new, l_new, m_new

    def init_state(self, rows):
        # FA2 Alg. 1 line 5, on chip: O = 0, l = 0, m = -inf
        br = rows.size
        return (
            self._hold(Tile(br, self.d, ACC_BYTES, "O")),
            self._hold(Tile(br, 1, ACC_BYTES, "l")),
            self._hold(Tile(br, 1, ACC_BYTES, "m")),
        )

    def online_softmax(self, S, V_j, O, l, m):
        # FA2 Alg. 1 lines 9-10:
        #   m_new = max(m, rowmax(S))             br·bc other (row max; the max with m is folded in: + br)
        #   P~ = exp(S - m_new)                   br·bc other + br·bc exp
        #   alpha = exp(m - m_new)                br other + br exp
        #   l = alpha·l + rowsum(P~)              br·bc other + 2br other
        #   O = diag(alpha) O + P~ V_j            br·d other + 2·br·bc·d matmul
        br, bc = S.rows, S.cols
        self._read(S, V_j, O, l, m)
        self._flops(
            matmul=2 * br * bc * self.d,
            exp=br * bc + br,
            other=3 * br * bc + 4 * br + br * self.d,
        )
        self._hold(Tile(br, bc, ACC_BYTES, "S"))  # P~ is written over S, in place
        return (
            self._hold(Tile(br, self.d, ACC_BYTES, "O")),
            self._hold(Tile(br, 1, ACC_BYTES, "l")),
            self._hold(Tile(br, 1, ACC_BYTES, "m")),
        )

    def empty_output(self, rows):
        # a Q block that sees no key: O = 0, L = -inf, nothing computed
        br = rows.size
        return self._hold(Tile(br, self.d, ACC_BYTES, "O")), self._hold(Tile(br, 1, ACC_BYTES, "lse"))

    def finalize(self, O, l, m):
        # FA2 Alg. 1 lines 12-13: O = diag(l)^-1 O (br reciprocals + br·d multiplies); L = m + log(l)
        br = O.rows
        self._read(O, l, m)
        self._flops(exp=br, other=br + br * self.d + br)
        O_out = self._hold(Tile(br, self.d, ACC_BYTES, "O"))
        lse = self._hold(Tile(br, 1, ACC_BYTES, "lse"))
        return O_out, lse


    # -- backward pass ------------------------------------------------------------------------------
    # Names follow FlashAttention-2 Alg. 2 and FlashAttention-1 Algs. 3-4. The softmax scale tau is folded
    # into dS (dS := tau · P∘(dP - D)), so that dQ = dS K and dK = dSᵀ Q need no further scaling.
    def atomic_add(self, tensor, rows, tile):
        # FA2 Alg. 2 line 15: dQ_i += dS K_j by atomicAdd on an fp32 buffer. iosim counts each atomic as
        # what it moves at the SM <-> L2 boundary: a read and a write of the rows it updates.
        r, c = self._shape(tensor, rows, None)
        n = r * c * self._elem(tensor)
        self._k.global_read[tensor] += n
        self._k.global_write[tensor] += n
        self._k.flops["other"] += r * c  # the add
        self._read(tile)

    def zeros_grad(self, role, rows):
        # an fp32 gradient accumulator (dQ_i, dK_j, dV_j) set to 0 on chip
        return self._hold(Tile(rows.size, self.d, ACC_BYTES, role))

    def recompute_probs(self, S, L_i):
        # FA2 Alg. 2 line 11: P = exp(S - L_i)                      br·bc subtractions, br·bc exp
        self._read(S, L_i)
        n = S.rows * S.cols
        self._flops(exp=n, other=n)
        return self._hold(Tile(S.rows, S.cols, ACC_BYTES, "S"))  # P is written over S, in place

    def recompute_probs_ml(self, S, m_i, l_i):
        # FA1 Alg. 4: P = diag(l_i)^-1 exp(S - m_i)        br reciprocals, br·bc subtract + multiply, br·bc exp
        self._read(S, m_i, l_i)
        n = S.rows * S.cols
        self._flops(exp=n, other=2 * n + S.rows)
        return self._hold(Tile(S.rows, S.cols, ACC_BYTES, "S"))  # P is written over S, in place

    def matmul_tn_acc(self, acc, A, B):
        # acc += Aᵀ B  (dV_j += P_ijᵀ dO_i, dK_j += dS_ijᵀ Q_i): 2·rows(A)·cols(A)·cols(B)
        self._read(acc, A, B)
        self._flops(matmul=2 * A.rows * A.cols * B.cols)
        return self._hold(Tile(acc.rows, acc.cols, ACC_BYTES, acc.role))

    def matmul_nn_acc(self, acc, A, B):
        # acc += A B  (dQ_i += dS_ij K_j): 2·rows(A)·cols(A)·cols(B)
        self._read(acc, A, B)
        self._flops(matmul=2 * A.rows * A.cols * B.cols)
        return self._hold(Tile(acc.rows, acc.cols, ACC_BYTES, acc.role))

    def dprobs(self, dO_i, V_j):
        # dP_ij = dO_i V_jᵀ: 2·br·bc·d
        self._read(dO_i, V_j)
        self._flops(matmul=2 * dO_i.rows * V_j.rows * self.d)
        return self._hold(Tile(dO_i.rows, V_j.rows, ACC_BYTES, "dP"))

    def rowdot(self, dO_i, O_i):
        # D_i = rowsum(dO_i ∘ O_i): br·d multiplies and adds
        self._read(dO_i, O_i)
        self._flops(other=2 * dO_i.rows * self.d)
        return self._hold(Tile(dO_i.rows, 1, ACC_BYTES, "D"))

    def dscores(self, P, dP, D_i):
        # dS_ij = tau · P_ij ∘ (dP_ij - D_i): 3 per element
        self._read(P, dP, D_i)
        n = P.rows * P.cols
        self._flops(other=3 * n)
        return self._hold(Tile(P.rows, P.cols, ACC_BYTES, "dP"))  # dS is written over dP, in place

    def softmax_grad(self, P, dP):
        # FA1 Alg. 3 line 3 on one row block: D = rowsum(P ∘ dP) (2 per element); dS = tau · P ∘ (dP - D) (3)
        self._read(P, dP)
        n = P.rows * P.cols
        self._flops(other=5 * n)
        return self._hold(Tile(P.rows, P.cols, ACC_BYTES, "dS"))

    # -- split-KV decoding --------------------------------------------------------------------------
    def merge_partial(self, O, l, m, O_s, L_s):
        # Combine one split's normalized partial output O_s and logsumexp L_s into the running (O, l, m):
        #   m_new = max(m, L_s)                       br other
        #   a = exp(m - m_new), c = exp(L_s - m_new)  2br exp, 2br other
        #   l = a·l + c                               2br other
        #   O = a·O + c·O_s                           3·br·d other
        br = O.rows
        self._read(O, l, m, O_s, L_s)
        self._flops(exp=2 * br, other=5 * br + 3 * br * self.d)
        return (
            self._hold(Tile(br, self.d, ACC_BYTES, "O")),
            self._hold(Tile(br, 1, ACC_BYTES, "l")),
            self._hold(Tile(br, 1, ACC_BYTES, "m")),
        )

    def merge_state(self, O, l, m, O2, l2, m2):
        # Two unnormalized states of the same rows (iosim's decode kernel merges its warps' this way):
        #   m_new = max(m, m2)                          br other
        #   a = exp(m - m_new), c = exp(m2 - m_new)     2br exp, 2br other
        #   l = a·l + c·l2                              3br other
        #   O = a·O + c·O2                              3·br·d other
        br = O.rows
        self._read(O, l, m, O2, l2, m2)
        self._flops(exp=2 * br, other=6 * br + 3 * br * self.d)
        return (
            self._hold(Tile(br, self.d, ACC_BYTES, "O")),
            self._hold(Tile(br, 1, ACC_BYTES, "l")),
            self._hold(Tile(br, 1, ACC_BYTES, "m")),
        )
