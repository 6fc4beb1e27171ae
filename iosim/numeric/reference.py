"""softmax(scale · Q Kᵀ) V and its gradients in float64, written directly from the definitions: what every
schedule's numeric execution (and every GPU kernel) is checked against. Rows that see no key give 0; NaN in
Q, K or V propagates (every row that attends to it is NaN), so a test sees it, as in the numeric execution."""

from __future__ import annotations

import numpy as np

from ..problem import AttentionProblem
from .machine import round_to_dtype


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
    P = np.where(s == 0, 0.0, P / np.where(s == 0, 1, s))
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
    P = np.where(s == 0, 0.0, P / np.where(s == 0, 1, s))
    return np.einsum("bhnm,bmhd->bnhd", P, vr)


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
    P = np.where(s == 0, 0.0, P / np.where(s == 0, 1, s))  # (B, H, N, Nk)
    dV = np.einsum("bhnm,bnhd->bmhd", P, do)
    dP = np.einsum("bnhd,bmhd->bhnm", do, vr)
    dS = P * (dP - (P * dP).sum(axis=-1, keepdims=True))
    dQ = p.scale * np.einsum("bhnm,bmhd->bnhd", dS, kr)
    dK = p.scale * np.einsum("bhnm,bnhd->bmhd", dS, q)
    shape = (p.batch, p.kv_len, p.kv_heads, p.group, p.head_dim)
    return dQ, dK.reshape(shape).sum(axis=3), dV.reshape(shape).sum(axis=3)
