"""numba kernels of the CPU forward: FlashAttention-2's schedule (Dao 2023, Algorithm 1) on CPU cores.

    for each (batch b, head h, Q block i), in parallel over cores (prange):   Q_i stays in L1/L2
        O_i = 0, l_i = 0, m_i = -inf                                            (Br x d, Br, Br; fp32 or fp64)
        for j over the K/V blocks Q_i sees (causal: up to the diagonal):
            S = (scale log2 e) Q_i K_jᵀ                                         GEMM 1, Br x Bc, stays in L2
            mask S where key > row + (kv_len - seq_len)                         diagonal blocks only
            m_new = max(m_i, rowmax S);  P = 2^(S - m_new);  l_i = 2^(m_i - m_new) l_i + rowsum P
            O_i = diag(2^(m_i - m_new)) O_i + P V_j                             GEMM 2 into O_i
        O_i = diag(l_i)^-1 O_i  (0 where l_i = 0: the row sees no key)          written once

Softmax runs base 2 (scale·log₂e folded into GEMM 1's alpha, as FlashAttention's kernels do). fp32 tiles use
a vectorizable 2^x (Cody-Waite split, degree-7 Taylor polynomial, exponent put in by integer add: relative
error below 2e-7); fp64 tiles use ``math.exp``. The GEMMs call BLAS (:mod:`iosim.cpu._blas`), one BLAS thread
per core, or loops where BLAS is missing.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numba as nb
import numpy as np

from iosim.cpu._blas import NO_TRANS, ROW_MAJOR, TRANS, dgemm, set_num_threads_local, sgemm

LOG2E = 1.4426950408889634
_LN2 = 0.6931471805599453
# 2^f = e^(f ln 2) = sum (f ln2)^n / n!, |f| <= 1/2: the degree-7 remainder is below 6e-9
_C = tuple(np.float32(_LN2**n / math.factorial(n)) for n in range(8))
_FM = {"reassoc", "contract", "nsz", "arcp", "afn"}  # no "nnan"/"ninf": -inf marks masked scores


@nb.njit(cache=True, fastmath=_FM)
def _exp2_row_f32(row, n, mx, e, ef):
    """row[:n] = 2^(row[:n] - mx); returns the sum. ``e``: int32 scratch of >= n, ``ef`` its float32 view.

    2^t = 2^k 2^f with k = round(t), |f| <= 1/2: 2^f by polynomial, 2^k written as the float whose exponent
    field is k + 127. Results below 2^-125 are 0."""
    for c in range(n):
        t = max(row[c] - mx, np.float32(-126.0))
        k = np.floor(t + np.float32(0.5))
        f = t - k
        p = _C[7]
        p = p * f + _C[6]
        p = p * f + _C[5]
        p = p * f + _C[4]
        p = p * f + _C[3]
        p = p * f + _C[2]
        p = p * f + _C[1]
        p = p * f + _C[0]  # 2^f in [0.70, 1.42]
        row[c] = p if t > np.float32(-125.0) else np.float32(0.0)
        e[c] = (np.int32(k) + np.int32(127)) << 23  # the bits of 2^k
    s = np.float32(0.0)
    for c in range(n):
        x = row[c] * ef[c]
        row[c] = x
        s += x
    return s


@nb.njit(cache=True, fastmath=_FM)
def _exp2_row_f64(row, n, mx):
    s = 0.0
    for c in range(n):
        x = math.exp((row[c] - mx) * _LN2)
        row[c] = x
        s += x
    return s


@nb.njit(cache=True, fastmath=_FM)
def _rowmax_f32(bits, n):
    """max of the float32 row whose bits are ``bits[:n]``, through integer keys: LLVM vectorizes integer max
    reductions, not float ones. NaN where the row holds a NaN (of either sign)."""
    key = np.int32(-2147483648)
    mag = np.int32(0)
    for c in range(n):
        b = bits[c]
        key = max(key, b ^ ((b >> 31) & np.int32(0x7FFFFFFF)))  # monotone in the float's value
        mag = max(mag, b & np.int32(0x7FFFFFFF))  # |x|'s bits: above +inf's only for a NaN
    if mag > np.int32(0x7F800000):
        return np.float32(np.nan)
    out = np.empty(1, dtype=np.int32)
    out[0] = key ^ ((key >> 31) & np.int32(0x7FFFFFFF))
    return out.view(np.float32)[0]


@nb.njit(cache=True, fastmath=_FM)
def _rowmax_f64(row, n):
    mx = -np.inf
    nan = False
    for c in range(n):
        mx = max(mx, row[c])
        nan |= row[c] != row[c]
    return np.nan if nan else mx


@nb.njit(cache=True, fastmath=_FM)
def online_softmax(S, Si, nr, nc, state, scratch):
    """Lines 9-10 before the second GEMM: S[:nr, :nc] (base-2 scores) becomes P; m, l updated; O rescaled.

    ``Si``: S's bits as int32 (fp32 tiles); ``state``: (m, l, O); ``scratch``: an int32 row and its float32 view."""
    m, l, O = state
    e, ef = scratch
    d = O.shape[1]
    for r in range(nr):
        row = S[r]
        mx = _rowmax_f32(Si[r], nc) if S.itemsize == 4 else _rowmax_f64(row, nc)
        if mx != mx or m[r] != m[r]:  # a NaN score: the row's softmax is NaN (max() would drop it)
            m[r], l[r] = np.nan, np.nan
            for c in range(nc):
                row[c] = np.nan
            continue
        mx = max(m[r], mx)
        if mx == -np.inf:  # no key of this row seen so far: P = 0, nothing to rescale
            for c in range(nc):
                row[c] = 0.0
            continue
        if S.itemsize == 4:
            s = _exp2_row_f32(row, nc, mx, e, ef)
        else:
            s = _exp2_row_f64(row, nc, mx)
        alpha = math.exp((m[r] - mx) * _LN2) if m[r] > -np.inf else 0.0
        l[r] = alpha * l[r] + s
        m[r] = mx
        if alpha != 1.0:
            for x in range(d):
                O[r, x] *= alpha


@nb.njit(cache=True)
def _gemm(ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc):
    """C = alpha op(A) op(B) + beta C through BLAS, leading dimensions in elements (cblas_?gemm's own parameter
    list, hence its length)."""
    if C.itemsize == 4:
        sgemm(ROW_MAJOR, ta, tb, m, n, k, np.float32(alpha), A.ctypes.data, lda, B.ctypes.data, ldb,
              np.float32(beta), C.ctypes.data, ldc)
    else:
        dgemm(ROW_MAJOR, ta, tb, m, n, k, alpha, A.ctypes.data, lda, B.ctypes.data, ldb, beta, C.ctypes.data,
              ldc)


@nb.njit(cache=True, fastmath=_FM)
def _scores(Q, K, S, nr, nc, alpha, blas):
    """S[:nr, :nc] = alpha Q Kᵀ; Q (nr, d), K (nc, d) row-strided views."""
    d = Q.shape[1]
    if blas:
        _gemm(NO_TRANS, TRANS, nr, nc, d, alpha, Q, Q.strides[0] // Q.itemsize, K, K.strides[0] // K.itemsize,
              0.0, S, S.shape[1])
        return
    for r in range(nr):
        for c in range(nc):
            acc = 0.0
            for x in range(d):
                acc += Q[r, x] * K[c, x]
            S[r, c] = alpha * acc


@nb.njit(cache=True, fastmath=_FM)
def _accumulate(P, V, O, nr, nc, blas):
    """O[:nr] += P[:nr, :nc] V; V (nc, d) a row-strided view."""
    d = O.shape[1]
    if blas:
        _gemm(NO_TRANS, NO_TRANS, nr, d, nc, 1.0, P, P.shape[1], V, V.strides[0] // V.itemsize, 1.0, O, d)
        return
    for r in range(nr):
        for c in range(nc):
            p = P[r, c]
            for x in range(d):
                O[r, x] += p * V[c, x]


@nb.njit(cache=True)
def _mask(S, nr, nc, row0, col0, offset):
    """Causal, bottom-right aligned: key col0 + c is hidden from row row0 + r when col0 + c > row0 + r + offset."""
    for r in range(nr):
        first_hidden = max(0, row0 + r + offset + 1 - col0)
        for c in range(first_hidden, nc):
            S[r, c] = -np.inf


@nb.njit(cache=True)
def _q_block(t, Tr):
    """Zigzag order (0, Tr-1, 1, Tr-2, ...): prange's contiguous chunks then get equal causal work."""
    return t // 2 if t % 2 == 0 else Tr - 1 - t // 2


@nb.njit(cache=True, fastmath=_FM)
def _q_block_forward(io, cfg, b, h, hk, i, buf):
    """Q block i of head (b, h), kv head hk: ``io`` = (q, k, v, out), ``cfg`` = (Br, Bc, alpha, causal, blas),
    ``buf`` = the core's (S, S's int32 bits, O, m, l, scratch row, its float32 view)."""
    q, k, v, out = io
    Br, Bc, alpha, causal, blas = cfg
    S, Si, O, m, l, e, ef = buf
    N, Nk = q.shape[1], k.shape[1]
    r0 = i * Br
    nr = min(Br, N - r0)
    offset = Nk - N
    last_key = min(Nk, r0 + nr + offset) if causal else Nk  # keys [0, last_key) seen by some row
    O[:] = 0.0
    m[:] = -np.inf
    l[:] = 0.0
    Q_i = q[b, r0:r0 + nr, h, :]  # line 4: stays in cache throughout
    for c0 in range(0, max(last_key, 0), Bc):  # line 6
        nc = min(Bc, Nk - c0)
        _scores(Q_i, k[b, c0:c0 + nc, hk, :], S, nr, nc, alpha, blas)  # line 8
        if causal and c0 + nc - 1 > r0 + offset:  # the block crosses the diagonal
            _mask(S, nr, nc, r0, c0, offset)
        online_softmax(S, Si, nr, nc, (m, l, O), (e, ef))  # line 9
        _accumulate(S, v[b, c0:c0 + nc, hk, :], O, nr, nc, blas)  # line 10
    for r in range(nr):  # lines 12, 14
        inv = 1.0 / l[r] if l[r] > 0.0 or l[r] != l[r] else 0.0  # l = 0: no key seen; l NaN: NaN
        for x in range(O.shape[1]):
            out[b, r0 + r, h, x] = O[r, x] * inv


class Tiling(NamedTuple):
    """How :func:`flash2_forward` runs: tiles of ``Br`` query rows by ``Bc`` keys, the softmax ``scale``, the causal
    mask, and its GEMMs by BLAS (``blas``) or by loops."""

    Br: int
    Bc: int
    scale: float
    causal: bool
    blas: bool


@nb.njit(parallel=True, cache=True)
def flash2_forward(q, k, v, out, tiling):
    """out = softmax(scale Q Kᵀ) V for q (B, N, H, d), k and v (B, N_kv, H_kv, d), out like q; ``tiling``: a
    :class:`Tiling`."""
    Br, Bc, scale, causal, blas = tiling
    B, N, H, d = q.shape
    group = H // k.shape[2]
    Tr = (N + Br - 1) // Br
    alpha = scale * LOG2E
    for t in nb.prange(B * H * Tr):
        if blas:
            set_num_threads_local(1)  # this core runs one BLAS thread; the cores are prange's
        bh = t // Tr
        b = bh // H
        h = bh - b * H
        ti = t - bh * Tr
        S = np.empty((Br, Bc), dtype=q.dtype)  # scores, then P: the tile that lives in L2
        O = np.empty((Br, d), dtype=q.dtype)
        m = np.empty(Br, dtype=q.dtype)
        l = np.empty(Br, dtype=q.dtype)
        e = np.empty(Bc, dtype=np.int32)
        buf = (S, S.view(np.int32), O, m, l, e, e.view(np.float32))
        _q_block_forward((q, k, v, out), (Br, Bc, alpha, causal, blas), b, h, h // group, _q_block(ti, Tr), buf)
