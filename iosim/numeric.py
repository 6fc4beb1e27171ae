"""The numeric interpreter: runs a schedule's tile program on NumPy arrays.

Storage follows the problem dtype (Q, K, V, O, S, P rounded to fp16/bf16 whenever they are stored in
global memory), on-chip arithmetic is fp32, statistics are fp32: the same precision a GPU kernel has. Global
outputs start poisoned (NaN), so an element the schedule never writes fails the exactness tests.

    >>> O, stats = execute("flash2", problem, q, k, v)      # q: (batch, seq_len, heads, head_dim)
"""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np

from .blocks import Rows
from .counts import FP32_TENSORS
from .machine import Machine
from .problem import AttentionProblem
from .schedules import Tiles, get_schedule

F32 = np.float32


def round_to_dtype(x: np.ndarray, dtype: str) -> np.ndarray:
    """Round to the storage precision of ``dtype`` (kept in a float32 array; bf16 by round-to-nearest-even)."""
    x = np.asarray(x, dtype=F32)
    if dtype == "fp32":
        return x.copy()
    if dtype == "fp16":
        with np.errstate(over="ignore"):
            return x.astype(np.float16).astype(F32)
    if dtype == "bf16":
        bits = x.view(np.uint32).astype(np.uint64)
        rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        out = rounded.astype(np.uint32).view(F32)
        return np.where(np.isnan(x), x, out)
    if dtype == "fp8":
        return _round_e4m3(x)
    raise ValueError(f"dtype={dtype!r}: expected fp32, fp16, bf16 or fp8")


E4M3_MAX = 448.0  # largest finite fp8 e4m3 value (1.75 · 2^8); e4m3 has no infinities


def _round_e4m3(x: np.ndarray) -> np.ndarray:
    """Round to fp8 e4m3 (1 sign, 4 exponent bits with bias 7, 3 mantissa bits; subnormals down to 2^-9):
    round to nearest, ties to even, saturating at ±448 as ``cvt.rn.satfinite.e4m3x2.f32`` does. NaN stays NaN."""
    a = np.abs(x).astype(np.float64)
    _, e = np.frexp(np.where(a > 0, a, 1.0))  # a = m · 2^e, m in [0.5, 1): the leading bit is 2^(e-1)
    quantum = np.exp2(np.maximum(e - 1, -6) - 3)  # 3 mantissa bits below the leading one; 2^-9 for subnormals
    r = np.minimum(np.rint(a / quantum) * quantum, E4M3_MAX)  # np.rint rounds ties to even
    return np.where(np.isnan(x), x, np.copysign(r, x)).astype(F32)


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
    def load(self, tensor, rows, cols=None):
        a = self.g[tensor]
        tile = a[rows.slice(), cols.slice()] if cols is not None else a[rows.slice()]
        return tile.astype(F32, copy=True)

    def store(self, tensor, rows, tile, cols=None):
        stat = tensor in FP32_TENSORS
        value = np.asarray(tile, dtype=F32) if stat else round_to_dtype(tile, self.problem.dtype)
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
        return np.where(s > 0, P / np.where(s > 0, s, 1), F32(0)).astype(F32)

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
        O_new = np.where(l_new[:, None] > 0, num / np.where(l_new > 0, l_new, 1)[:, None], F32(0))
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
        seen = l > 0
        O_out = np.where(seen[:, None], O / np.where(seen, l, 1)[:, None], F32(0))
        with np.errstate(divide="ignore"):
            lse = np.where(seen, m + np.log(np.where(seen, l, 1)), F32(-np.inf))
        return O_out.astype(F32), lse.astype(F32)


def _check_inputs(p: AttentionProblem, q, k, v) -> None:
    want_q = (p.batch, p.seq_len, p.heads, p.head_dim)
    want_kv = (p.batch, p.kv_len, p.kv_heads, p.head_dim)
    for name, a, want in (("q", q, want_q), ("k", k, want_kv), ("v", v, want_kv)):
        if tuple(np.shape(a)) != want:
            raise ValueError(f"{name} has shape {tuple(np.shape(a))}, expected (batch, seq, heads, head_dim) = {want}")


def execute(schedule: str, problem: AttentionProblem, q, k, v, tiles: Tiles | None = None, *,
            profile=None, kv_order=None) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Run ``schedule`` numerically. Inputs (batch, seq, heads, head_dim) are first rounded to the problem dtype.

    Returns O (batch, seq_len, heads, head_dim) as float32 holding dtype-rounded values, and the global
    statistics the schedule wrote (``lse`` for flash2; ``m``, ``l`` for flash1), each (batch, heads, seq_len).
    ``kv_order`` (a function of the list of K/V block indices) changes the order of the K/V loop.
    """
    from .profile import get_profile
    from .simulate import resolve_tiles

    p = problem
    _check_inputs(p, q, k, v)
    mod = get_schedule(schedule)
    if tiles is None:
        tiles = resolve_tiles(schedule, p, get_profile(profile))
    q, k, v = (round_to_dtype(a, p.dtype) for a in (q, k, v))
    if getattr(mod, "UNIT", "head") == "kv_head":
        return _execute_kv_heads(mod, p, q, k, v, tiles, kv_order)
    O = np.full((p.batch, p.seq_len, p.heads, p.head_dim), np.nan, F32)
    stats = {s: np.full((p.batch, p.heads, p.seq_len), np.nan, F32) for s in mod.STATS}
    for b in range(p.batch):
        for h in range(p.heads):
            hk = h // p.group
            g = {
                "Q": q[b, :, h], "K": k[b, :, hk], "V": v[b, :, hk],
                "O": np.full((p.seq_len, p.head_dim), np.nan, F32),
                "S": np.full((p.seq_len, p.kv_len), np.nan, F32),
                "P": np.full((p.seq_len, p.kv_len), np.nan, F32),
            }
            for s in mod.STATS:
                g[s] = np.full(p.seq_len, np.nan, F32)
            mod.program(NumericMachine(p, g, kv_order), p, tiles)
            O[b, :, h] = g["O"]
            for s in mod.STATS:
                stats[s][b, h] = g[s]
    return O, stats


def _execute_kv_heads(mod, p: AttentionProblem, q, k, v, tiles: Tiles, kv_order):
    """``execute`` for a schedule whose unit is one kv head: its group of query heads packed as rows
    (row r = n·group + g), so that one program run reads K and V once for the whole group."""
    N, d, G = p.seq_len, p.head_dim, p.group
    R, S = G * N, getattr(tiles, "splits", 1)
    O = np.full((p.batch, N, p.heads, d), np.nan, F32)
    stats = {s: np.full((p.batch, p.heads, N), np.nan, F32) for s in mod.STATS}
    for b in range(p.batch):
        for hk in range(p.kv_heads):
            heads = slice(hk * G, (hk + 1) * G)
            g = {
                "Q": q[b, :, heads].reshape(R, d),  # (N, G, d) -> rows n·G + g
                "K": k[b, :, hk], "V": v[b, :, hk],
                "O": np.full((R, d), np.nan, F32),
                "Opart": np.full((S * R, d), np.nan, F32),
                "lsepart": np.full(S * R, np.nan, F32),
                **{s: np.full(R, np.nan, F32) for s in mod.STATS},
            }
            x = NumericMachine(p, g, kv_order)
            x.rows_per_query = G  # causal mask: packed row r is query position r // G
            mod.program(x, p, tiles)
            O[b, :, heads] = g["O"].reshape(N, G, d)
            for s in mod.STATS:
                stats[s][b, heads] = g[s].reshape(N, G).T
    return O, stats


def reference(problem: AttentionProblem, q, k, v) -> np.ndarray:
    """softmax(scale · Q Kᵀ) V in float64 from the dtype-rounded inputs; rows that see no key give 0."""
    p = problem
    q, k, v = (round_to_dtype(a, p.dtype).astype(np.float64) for a in (q, k, v))
    kr = np.repeat(k, p.group, axis=2)  # (B, Nk, H, d)
    vr = np.repeat(v, p.group, axis=2)
    S = np.einsum("bnhd,bmhd->bhnm", q, kr) * p.scale
    if p.causal:
        r = np.arange(p.seq_len)[:, None]
        c = np.arange(p.kv_len)[None, :]
        S = np.where(c > r + p.causal_offset, -np.inf, S)
    m = S.max(axis=-1, keepdims=True)
    m = np.where(np.isneginf(m), 0.0, m)
    P = np.exp(S - m)
    s = P.sum(axis=-1, keepdims=True)
    P = np.where(s > 0, P / np.where(s > 0, s, 1), 0.0)
    return np.einsum("bhnm,bmhd->bnhd", P, vr)


def reference_block_sparse(problem: AttentionProblem, q, k, v, block_mask, block_q: int, block_kv: int) -> np.ndarray:
    """softmax attention in float64 where only the keys of the non-zero blocks of ``block_mask`` (Tr × Tc,
    blocks of block_q × block_kv) count, causal mask included; a row that sees no key gives 0."""
    p = problem
    q, k, v = (round_to_dtype(a, p.dtype).astype(np.float64) for a in (q, k, v))
    kr, vr = np.repeat(k, p.group, axis=2), np.repeat(v, p.group, axis=2)
    S = np.einsum("bnhd,bmhd->bhnm", q, kr) * p.scale
    r, c = np.arange(p.seq_len)[:, None], np.arange(p.kv_len)[None, :]
    hidden = ~np.asarray(block_mask, dtype=bool)[r // block_q, c // block_kv]
    if p.causal:
        hidden |= c > r + p.causal_offset
    S = np.where(hidden, -np.inf, S)
    m = S.max(axis=-1, keepdims=True)
    P = np.exp(S - np.where(np.isneginf(m), 0.0, m))
    s = P.sum(axis=-1, keepdims=True)
    P = np.where(s > 0, P / np.where(s > 0, s, 1), 0.0)
    return np.einsum("bhnm,bmhd->bnhd", P, vr)


# -- backward pass ---------------------------------------------------------------------------------------


def execute_backward(schedule: str, problem: AttentionProblem, q, k, v, do, tiles: Tiles | None = None, *,
                     fwd_tiles: Tiles | None = None, profile=None,
                     kv_order=None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Run ``schedule``'s forward tile program, then its backward tile program, on the same global memory
    (the backward reads the O, statistics, and for naive P, that the forward stored).

    Inputs (batch, seq, heads, head_dim) are rounded to the problem dtype first. Returns dQ (batch, seq_len,
    heads, d) and dK, dV (batch, kv_len, kv_heads, d) as float32 arrays holding dtype-rounded values. With
    grouped-query heads each query head's dK, dV are summed over the group in fp32 and rounded once (the
    group-sum kernel of ``iosim.schedules.backward``).
    """
    from .profile import get_profile
    from .schedules import get_module
    from .simulate import resolve_tiles

    p = problem
    _check_inputs(p, q, k, v)
    if tuple(np.shape(do)) != tuple(np.shape(q)):
        raise ValueError(f"do has shape {tuple(np.shape(do))}, expected the shape of q {tuple(np.shape(q))}")
    fwd, bwd = get_schedule(schedule), get_module(schedule, "backward")
    if fwd_tiles is None or tiles is None:
        prof = get_profile(profile)
        fwd_tiles = fwd_tiles or resolve_tiles(schedule, p, prof)
        tiles = tiles or resolve_tiles(schedule, p, prof, pass_="backward")
    q, k, v, do = (round_to_dtype(a, p.dtype) for a in (q, k, v, do))
    N, Nk, d = p.seq_len, p.kv_len, p.head_dim
    dq = np.full((p.batch, N, p.heads, d), np.nan, F32)
    dk_h = np.full((p.batch, Nk, p.heads, d), np.nan, F32)  # per query head, summed over the group below
    dv_h = np.full((p.batch, Nk, p.heads, d), np.nan, F32)
    for b in range(p.batch):
        for h in range(p.heads):
            hk = h // p.group
            g = {
                "Q": q[b, :, h], "K": k[b, :, hk], "V": v[b, :, hk], "dO": do[b, :, h],
                **{t: np.full((N, d), np.nan, F32) for t in ("O", "dQ", "dQacc")},
                **{t: np.full((Nk, d), np.nan, F32) for t in ("dK", "dV")},
                **{t: np.full((N, Nk), np.nan, F32) for t in ("S", "P", "dS", "dP")},
                **{t: np.full(N, np.nan, F32) for t in ("m", "l", "lse", "D")},
            }
            fwd.program(NumericMachine(p, g, kv_order), p, fwd_tiles)
            bwd.program(NumericMachine(p, g, kv_order), p, tiles)
            dq[b, :, h], dk_h[b, :, h], dv_h[b, :, h] = g["dQ"], g["dK"], g["dV"]
    shape = (p.batch, Nk, p.kv_heads, p.group, d)  # query head h = kv head h // group, member h % group
    dk = round_to_dtype(dk_h.reshape(shape).sum(axis=3, dtype=F32), p.dtype)
    dv = round_to_dtype(dv_h.reshape(shape).sum(axis=3, dtype=F32), p.dtype)
    return dq, dk, dv


def reference_backward(problem: AttentionProblem, q, k, v, do, block_mask=None, block_q: int | None = None,
                       block_kv: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """dQ, dK, dV of O = softmax(tau·Q Kᵀ) V in float64, from the dtype-rounded inputs, derived by hand:

        P = softmax(S), S = tau Q Kᵀ      dV = Pᵀ dO        dP = dO Vᵀ
        dS = P ∘ (dP - rowsum(P ∘ dP))    dQ = tau dS K     dK = tau dSᵀ Q

    (rowsum(P ∘ dP) = rowsum(dO ∘ O)); with grouped-query heads dK, dV are summed over each group.
    Rows that see no key have P = 0 and contribute nothing. With ``block_mask`` (Tr × Tc, blocks of
    block_q × block_kv) only the keys of non-zero blocks count (block-sparse attention).
    """
    p = problem
    q, k, v, do = (round_to_dtype(a, p.dtype).astype(np.float64) for a in (q, k, v, do))
    kr = np.repeat(k, p.group, axis=2)  # (B, Nk, H, d)
    vr = np.repeat(v, p.group, axis=2)
    S = np.einsum("bnhd,bmhd->bhnm", q, kr) * p.scale
    r, c = np.arange(p.seq_len)[:, None], np.arange(p.kv_len)[None, :]
    if p.causal:
        S = np.where(c > r + p.causal_offset, -np.inf, S)
    if block_mask is not None:
        S = np.where(np.asarray(block_mask, dtype=bool)[r // block_q, c // block_kv], S, -np.inf)
    m = S.max(axis=-1, keepdims=True)
    m = np.where(np.isneginf(m), 0.0, m)
    P = np.exp(S - m)
    s = P.sum(axis=-1, keepdims=True)
    P = np.where(s > 0, P / np.where(s > 0, s, 1), 0.0)  # (B, H, N, Nk)
    dV = np.einsum("bhnm,bnhd->bmhd", P, do)
    dP = np.einsum("bnhd,bmhd->bhnm", do, vr)
    dS = P * (dP - (P * dP).sum(axis=-1, keepdims=True))
    dQ = p.scale * np.einsum("bhnm,bmhd->bnhd", dS, kr)
    dK = p.scale * np.einsum("bhnm,bnhd->bmhd", dS, q)
    shape = (p.batch, p.kv_len, p.kv_heads, p.group, p.head_dim)
    return dQ, dK.reshape(shape).sum(axis=3), dV.reshape(shape).sum(axis=3)
