"""The numeric interpreter of tile programs: a Machine whose tiles are NumPy arrays.

NaN in Q, K or V propagates: every output row that attends to a NaN element is NaN (and so is its
statistic), as on a GPU; a row that sees no key is 0 (lse -inf), told apart from NaN by ``l == 0``.

Storage follows the problem dtype (Q, K, V, O, S, P rounded to fp16/bf16/fp8 whenever they are stored in global
memory), on-chip arithmetic is fp32, statistics are fp32: the same precision a GPU kernel has.
"""

from __future__ import annotations

from contextlib import contextmanager

import ml_dtypes
import numpy as np

from ..blocks import Rows
from ..counts import FP32_TENSORS
from ..problem import AttentionProblem
from ..schedules.machine import Machine

F32 = np.float32


def round_to_dtype(x: np.ndarray, dtype: str) -> np.ndarray:
    """Round to the storage precision of ``dtype``, kept in a float32 array. The input is first made float32 (as a
    kernel's inputs are), then rounded to nearest, ties to even: fp16 by NumPy, bf16 and fp8 (e4m3) by ml_dtypes,
    fp8 saturating at ±448 as ``cvt.rn.satfinite.e4m3x2.f32`` does (ml_dtypes' e4m3fn would give NaN past 464 and
    for ±inf), e4m3 subnormals down to 2^-9. NaN stays the input's NaN. ml_dtypes gives the same bits as the bit
    arithmetic this replaced for all 2^32 float32 inputs (tests/test_rounding.py keeps that arithmetic as its
    reference)."""
    x = np.asarray(x, dtype=F32)
    if dtype == "fp32":
        return x.copy()
    if dtype == "fp16":
        with np.errstate(over="ignore"):
            return x.astype(np.float16).astype(F32)
    if dtype == "bf16":
        return np.where(np.isnan(x), x, x.astype(ml_dtypes.bfloat16).astype(F32))
    if dtype == "fp8":
        saturated = np.clip(x, -E4M3_MAX, E4M3_MAX)
        return np.where(np.isnan(x), x, saturated.astype(ml_dtypes.float8_e4m3fn).astype(F32))
    raise ValueError(f"dtype={dtype!r}: expected fp32, fp16, bf16 or fp8")


E4M3_MAX = 448.0  # largest finite fp8 e4m3 value (1.75 · 2^8); e4m3 has no infinities


class NumericMachine(Machine):
    """Executes one head. ``gmem`` holds that head's global tensors (2-D arrays, rows along the sequence)."""

    def __init__(self, problem: AttentionProblem, gmem: dict[str, np.ndarray], kv_order=None):
        self.problem = problem
        self.g = gmem
        self._kv_order = kv_order

    @contextmanager
    def kernel(self, name, grid):
        yield

    @contextmanager
    def thread_block(self):
        yield

    def order(self, blocks):
        blocks = list(blocks)
        return self._kv_order(blocks) if self._kv_order else blocks

    # -- global <-> SRAM -----------------------------------------------------------------------------
    def load(self, tensor, rows, cols=None, dtype=None, pad=0):  # a row's pad is memory, not values: unread
        if tensor not in self.g:  # fp8 block scales: this executor runs unquantized inputs rounded to the dtype
            raise ValueError(f"the numeric executor has no tensor {tensor!r}: it does not run block quantization "
                             "(iosim's fp8 layout); execute flash3 with plain Tiles for e4m3 rounding alone")
        a = self.g[tensor]
        tile = a[rows.slice(), cols.slice()] if cols is not None else a[rows.slice()]
        return tile.astype(F32, copy=True)

    def store(self, tensor, rows, tile, cols=None, dtype=None, pad=0):
        stat = tensor in FP32_TENSORS
        value = np.asarray(tile, dtype=F32) if stat else round_to_dtype(tile, dtype or self.problem.dtype)
        if cols is not None:
            self.g[tensor][rows.slice(), cols.slice()] = value
        else:
            self.g[tensor][rows.slice()] = value.reshape(self.g[tensor][rows.slice()].shape)

    def fill(self, tensor, rows, value):
        self.g[tensor][rows.slice()] = value

    # -- steps ---------------------------------------------------------------------------------------
    def _mask(self, rows: Rows, cols: Rows) -> np.ndarray | None:
        """True where query row r may not see key c (bottom-right causal alignment)."""
        p = self.problem
        if not p.causal:
            return None
        # rows_per_query > 1: a kv head's query heads packed as rows (n, g) -> r = n·group + g (flash-decoding)
        r = np.arange(rows.start, rows.stop)[:, None] // getattr(self, "rows_per_query", 1)
        c = np.arange(cols.start, cols.stop)[None, :]
        return c > r + p.causal_offset

    def scores(self, Q_i, K_j, rows, cols):
        S = (Q_i @ K_j.T) * F32(self.problem.scale)
        mask = self._mask(rows, cols)
        if mask is not None:
            S = np.where(mask, F32(-np.inf), S)
        return S.astype(F32)

    def row_softmax(self, S, rows):
        m = S.max(axis=1, keepdims=True)
        m_safe = np.where(np.isneginf(m), F32(0), m)  # a row that sees no key: P = 0
        P = np.exp(S - m_safe)
        s = P.sum(axis=1, keepdims=True)
        return np.where(s == 0, F32(0), P / np.where(s == 0, 1, s)).astype(F32)  # NaN stays NaN

    def zeros_acc(self, rows):
        return np.zeros((rows.size, self.problem.head_dim), dtype=F32)

    def matmul_acc(self, O, P, V_j):
        return (O + P @ V_j).astype(F32)

    def block_stats(self, S):
        m_ij = S.max(axis=1)
        m_safe = np.where(np.isneginf(m_ij), F32(0), m_ij)
        P_ij = np.exp(S - m_safe[:, None])  # masked entries: exp(-inf) = 0
        return m_ij, P_ij.astype(F32), P_ij.sum(axis=1).astype(F32)

    def flash1_update(self, O_i, l_i, m_i, m_ij, P_ij, l_ij, V_j):
        m_new = np.maximum(m_i, m_ij)
        safe = np.where(np.isneginf(m_new), F32(0), m_new)  # both -inf: nothing seen yet
        a = np.exp(m_i - safe)  # e^(m_i - m_new)
        b = np.exp(np.where(np.isneginf(m_ij), F32(-np.inf), m_ij - safe))  # e^(m~ - m_new)
        l_new = a * l_i + b * l_ij
        num = (l_i * a)[:, None] * O_i + b[:, None] * (P_ij @ V_j)
        empty = l_new == 0  # no key seen yet (a NaN l is not empty: NaN propagates to O)
        O_new = np.where(empty[:, None], F32(0), num / np.where(empty, 1, l_new)[:, None])
        return O_new.astype(F32), l_new.astype(F32), m_new.astype(F32)

    def init_state(self, rows):
        br, d = rows.size, self.problem.head_dim
        return np.zeros((br, d), F32), np.zeros(br, F32), np.full(br, -np.inf, F32)

    def online_softmax(self, S, V_j, O, l, m):
        m_new = np.maximum(m, S.max(axis=1))
        safe = np.where(np.isneginf(m_new), F32(0), m_new)
        P = np.exp(S - safe[:, None])
        alpha = np.exp(m - safe)
        l_new = alpha * l + P.sum(axis=1)
        O_new = alpha[:, None] * O + P @ V_j
        return O_new.astype(F32), l_new.astype(F32), m_new.astype(F32)

    def empty_output(self, rows):
        return np.zeros((rows.size, self.problem.head_dim), F32), np.full(rows.size, -np.inf, F32)

    # -- backward pass (tau folded into dS) ------------------------------------------------------------
    def atomic_add(self, tensor, rows, tile):
        self.g[tensor][rows.slice()] += np.asarray(tile, dtype=F32)

    def zeros_grad(self, role, rows):
        return np.zeros((rows.size, self.problem.head_dim), F32)

    def recompute_probs(self, S, L_i):
        with np.errstate(invalid="ignore"):  # masked entries (S = -inf) of a row that sees no key: -inf - -inf
            P = np.where(np.isneginf(S), F32(0), np.exp(S - L_i[:, None]))
        return P.astype(F32)

    def recompute_probs_ml(self, S, m_i, l_i):
        with np.errstate(invalid="ignore", divide="ignore"):
            P = np.where(np.isneginf(S), F32(0), np.exp(S - m_i[:, None]) / l_i[:, None])
        return P.astype(F32)

    def matmul_tn_acc(self, acc, A, B):
        return (acc + A.T @ B).astype(F32)

    def matmul_nn_acc(self, acc, A, B):
        return (acc + A @ B).astype(F32)

    def dprobs(self, dO_i, V_j):
        return (dO_i @ V_j.T).astype(F32)

    def rowdot(self, dO_i, O_i):
        return (dO_i * O_i).sum(axis=1).astype(F32)

    def dscores(self, P, dP, D_i):
        return (F32(self.problem.scale) * P * (dP - D_i[:, None])).astype(F32)

    def softmax_grad(self, P, dP):
        D = (P * dP).sum(axis=1, keepdims=True)
        return (F32(self.problem.scale) * P * (dP - D)).astype(F32)

    # -- split-KV decoding --------------------------------------------------------------------------
    def merge_partial(self, O, l, m, O_s, L_s):
        m_new = np.maximum(m, L_s)
        safe = np.where(np.isneginf(m_new), F32(0), m_new)  # nothing seen in either: weights 0
        a = np.exp(m - safe)
        c = np.exp(L_s - safe)
        return (a[:, None] * O + c[:, None] * O_s).astype(F32), (a * l + c).astype(F32), m_new.astype(F32)

    def finalize(self, O, l, m):
        seen = l != 0  # a row that saw no key gives O = 0, lse = -inf; a NaN l (NaN input) gives NaN in both
        O_out = np.where(seen[:, None], O / np.where(seen, l, 1)[:, None], F32(0))
        with np.errstate(divide="ignore"):
            lse = np.where(seen, m + np.log(np.where(seen, l, 1)), F32(-np.inf))
        return O_out.astype(F32), lse.astype(F32)
