"""FP8 (e4m3) quantization and the FP8 attention forward's arithmetic, emulated in NumPy (issue 27).

The scheme the GPU kernel runs (docs/fp8.md), step for step:

* Q, K, V are quantized to e4m3 with one fp32 scale per block of rows of one (batch, head): Q per ``block_q`` rows,
  K and V per ``block_kv`` rows; ``scale = amax(block) / 448`` (1 where the block is all zeros) and
  ``value = round_e4m3(x / scale)``, saturating at ±448. The per-tensor baseline has one scale for a whole tensor.
* Incoherent processing (optional): Q and K are multiplied along d by one random ±1 diagonal, then by the
  normalized Walsh-Hadamard matrix, before quantizing. Both are orthogonal, so Q Kᵀ is unchanged in exact
  arithmetic; outliers are spread over the d entries of their row.
* S = (q_scale · k_scale) · (Qq Kqᵀ) in fp32; online softmax in fp32 on base 2; P = exp2(...) ∈ [0, 1] times
  :data:`P_FACTOR` rounded to e4m3 for P·V (the factor puts P in e4m3's normal range and cancels in O / l); the
  row sums l from the fp32 (unrounded) P; P·V's fp32 tile times V's block scale; O = acc / (P_FACTOR · l), in bf16.

Arrays are laid out as everywhere in iosim: (batch, seq, heads, head_dim).

    >>> q, k, v = (outlier_inputs((1, 4096, 1, 128), rng) for _ in range(3))
    >>> o = fp8_attention(q, k, v, block_kv=128, mode="block+incoherent", seed=0)   # bf16 values in float32
"""

from __future__ import annotations

import math

import numpy as np

from .machine import E4M3_MAX, F32, round_to_dtype

P_FACTOR = 256.0  # P ∈ [0, 1] is scaled by this before its e4m3 rounding (so P's large values are normal numbers)
LOG2E = math.log2(math.e)
# mode -> (one scale per block (else per tensor), incoherent processing of Q and K)
MODES: dict[str, tuple[bool, bool]] = {
    "per-tensor": (False, False),
    "block": (True, False),
    "block+incoherent": (True, True),
    "per-tensor+incoherent": (False, True),
}


def round_e4m3(x) -> np.ndarray:
    """Round to e4m3 (to nearest, ties to even, saturating at ±448), kept in a float32 array."""
    return round_to_dtype(x, "fp8")


def scale_of(amax) -> np.ndarray:
    """fp32 scale(s) of blocks whose largest magnitude is ``amax``: amax / 448 in fp32; 1 where amax is 0."""
    amax = np.asarray(amax, dtype=F32)
    return np.where(amax == 0, F32(1), amax / F32(E4M3_MAX)).astype(F32)


def _row_blocks(x: np.ndarray, block: int, axis: int) -> tuple[np.ndarray, int]:
    """x with ``axis`` moved next to the last axis and cut into blocks: (..., n_blocks, block, d); and its length."""
    if block < 1:
        raise ValueError(f"block={block}: expected a positive number of rows")
    if axis % x.ndim == x.ndim - 1:
        raise ValueError("axis is the sequence axis: the last axis (head_dim) is always within one block")
    xs = np.moveaxis(x, axis, -2)
    n = xs.shape[-2]
    nb = -(-n // block)
    pad = [(0, 0)] * (xs.ndim - 2) + [(0, nb * block - n), (0, 0)]
    return np.pad(xs, pad).reshape(*xs.shape[:-2], nb, block, xs.shape[-1]), n


def quantize_blocks(x, block: int, axis: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """e4m3 values of ``x`` (float32 holding e4m3 numbers, the shape of x) and their fp32 scales, one per block of
    ``block`` consecutive indices along ``axis`` (the sequence) and all of the last axis (head_dim).

    For x of (batch, seq, heads, d) and axis=1 the scales are (batch, heads, ceil(seq / block)): the other axes in
    their order, then the blocks. x ≈ values · scale of its block (:func:`dequantize_blocks`).
    """
    x = np.asarray(x, dtype=F32)
    blocks, n = _row_blocks(x, block, axis)
    scales = scale_of(np.abs(blocks).max(axis=(-2, -1)))
    values = round_e4m3(blocks / scales[..., None, None])
    values = values.reshape(*blocks.shape[:-3], -1, x.shape[-1])[..., :n, :]
    return np.moveaxis(values, -2, axis), scales


def dequantize_blocks(values, scales, block: int, axis: int = 1) -> np.ndarray:
    """values · scale in fp32: the inverse of :func:`quantize_blocks` up to e4m3's rounding."""
    values = np.asarray(values, dtype=F32)
    vs = np.moveaxis(values, axis, -2)
    per_row = np.repeat(np.asarray(scales, dtype=F32), block, axis=-1)[..., : vs.shape[-2]]
    return np.moveaxis(vs * per_row[..., None], -2, axis)


def quantize_tensor(x) -> tuple[np.ndarray, np.float32]:
    """The per-tensor baseline: e4m3 values of ``x`` with one fp32 scale, amax(x) / 448, for the whole tensor."""
    x = np.asarray(x, dtype=F32)
    scale = F32(scale_of(np.abs(x).max()))
    return round_e4m3(x / scale), scale


def hadamard(d: int) -> np.ndarray:
    """The normalized d × d Walsh-Hadamard matrix (Sylvester's order) in float64: symmetric and orthogonal."""
    _check_power_of_two(d)
    h = np.ones((1, 1))
    while h.shape[0] < d:
        h = np.block([[h, h], [h, -h]])
    return h / math.sqrt(d)


def _check_power_of_two(d: int) -> None:
    if d < 1 or d & (d - 1):
        raise ValueError(f"d={d}: the Walsh-Hadamard transform needs a power of two")


def fwht(x) -> np.ndarray:
    """x @ hadamard(d) along the last axis, by the fast transform: log2(d) butterfly stages, O(d log d) per row, in
    x's float dtype (float32 stays float32)."""
    x = np.asarray(x)
    x = x.astype(F32) if x.dtype.kind != "f" else x
    d = x.shape[-1]
    _check_power_of_two(d)
    lead, h = x.shape[:-1], 1
    while h < d:  # stage h adds and subtracts the entries whose indices differ in bit log2(h)
        y = x.reshape(*lead, d // (2 * h), 2, h)
        x = np.stack((y[..., 0, :] + y[..., 1, :], y[..., 0, :] - y[..., 1, :]), axis=-2).reshape(*lead, d)
        h *= 2
    return x * x.dtype.type(1 / math.sqrt(d))


def random_signs(d: int, seed: int) -> np.ndarray:
    """The ±1 diagonal of incoherent processing: d signs from ``numpy.random.default_rng(seed)``."""
    return np.random.default_rng(seed).integers(0, 2, d).astype(np.float64) * 2 - 1


def incoherent(x, seed: int) -> np.ndarray:
    """Incoherent processing along the last axis: x · diag(signs(seed)) · H, H the normalized Walsh-Hadamard matrix.
    Applied to Q and K with the same seed it leaves Q Kᵀ unchanged (up to rounding): (Q D H)(K D H)ᵀ = Q Kᵀ."""
    x = np.asarray(x)
    x = x.astype(F32) if x.dtype.kind != "f" else x
    return fwht(x * random_signs(x.shape[-1], seed).astype(x.dtype))


def outlier_inputs(shape, rng: np.random.Generator, *, fraction: float = 1e-3, outlier_std: float = 10.0):
    """FlashAttention-3's accuracy inputs (§4.3): entries N(0, 1), except ``fraction`` of them (chosen uniformly,
    exactly round(fraction · size) of them) drawn N(0, outlier_std²). float32."""
    x = rng.standard_normal(shape)
    count = round(fraction * x.size)
    where = rng.choice(x.size, count, replace=False)
    x.reshape(-1)[where] = rng.normal(0.0, outlier_std, count)
    return x.astype(F32)


def rmse(a, b) -> float:
    """Root mean square of a - b over all elements, in float64 (the accuracy measure of FlashAttention-3's Table 3)."""
    diff = np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)
    return float(np.sqrt(np.mean(diff * diff)))


def quantize(x, block: int, *, per_block: bool) -> tuple[np.ndarray, np.ndarray]:
    """(values, scales (batch, heads, blocks)) of x (batch, seq, heads, d): :func:`quantize_blocks` along seq, or
    with ``per_block=False`` the per-tensor baseline's one scale repeated for every block (the kernel's input)."""
    if per_block:
        return quantize_blocks(x, block, axis=1)
    values, scale = quantize_tensor(x)
    b, n, h, _ = values.shape
    return values, np.full((b, h, -(-n // block)), scale, F32)


def fp8_attention(q, k, v, *, causal: bool = False, block_q: int = 128, block_kv: int,
                  mode: str = "block+incoherent", seed: int = 0) -> np.ndarray:
    """softmax(Q Kᵀ / √d) V with the FP8 forward's arithmetic (module docstring), emulated: O (batch, seq, heads, d)
    as float32 holding bf16 values. q (batch, N, heads, d); k, v (batch, N_kv, kv_heads, d), kv_heads dividing
    heads; causal is bottom-right aligned, as iosim's kernels. ``mode``: one of :data:`MODES`; ``seed``: the random
    signs of incoherent processing. ``block_kv``: the kernel's K/V tile (iosim.launch.forward.FLASH3_FP8_TILES)."""
    if mode not in MODES:
        raise ValueError(f"mode={mode!r}: expected one of {sorted(MODES)}")
    per_block, rotate = MODES[mode]
    q, k, v = (np.asarray(a, dtype=F32) for a in (q, k, v))
    if q.ndim != 4 or k.shape != v.shape or k.shape[0] != q.shape[0] or k.shape[3] != q.shape[3] \
            or q.shape[2] % k.shape[2]:
        raise ValueError(f"q {q.shape}, k {k.shape}, v {v.shape}: expected (batch, seq, heads, head_dim), k and v "
                         "alike, kv heads dividing heads")
    if rotate:
        q, k = incoherent(q, seed), incoherent(k, seed)
    (qv, qs), (kv, ks), (vv, vs) = (quantize(a, blk, per_block=per_block)
                                    for a, blk in ((q, block_q), (k, block_kv), (v, block_kv)))
    out = np.empty(q.shape, F32)
    group = q.shape[2] // k.shape[2]
    for b in range(q.shape[0]):
        for h in range(q.shape[2]):
            hk = h // group
            q_row_scale = np.repeat(qs[b, h], block_q)[: q.shape[1]]
            out[b, :, h] = _head((qv[b, :, h], q_row_scale), (kv[b, :, hk], ks[b, hk]), (vv[b, :, hk], vs[b, hk]),
                                 block_kv, causal)
    return round_to_dtype(out, "bf16")


def _head(q, k, v, block_kv: int, causal: bool) -> np.ndarray:
    """One head's O in fp32 before the bf16 store. q = (e4m3 values (N, d), the scale of each row); k, v = (e4m3
    values (N_kv, d), one scale per block of block_kv rows). The K/V loop is the kernel's; its work is done for all
    query rows at once (rows are independent; the query tiles change only Q's scales, given per row), skipping the
    rows that see none of a tile's keys under the causal mask, as the kernel skips those tiles (for such a row the
    step would change nothing: alpha = 1, P = 0)."""
    (qv, q_scale), (kv, k_scale), (vv, v_scale) = q, k, v
    n, nk = qv.shape[0], kv.shape[0]
    offset = nk - n  # bottom-right causal: query row r sees keys c <= r + offset
    log2_scale = F32(LOG2E / math.sqrt(qv.shape[1]))
    m, l = np.full(n, -np.inf, F32), np.zeros(n, F32)
    acc = np.zeros(qv.shape, F32)
    for j in range(-(-nk // block_kv)):
        c0, c1 = j * block_kv, min((j + 1) * block_kv, nk)
        r0 = max(0, c0 - offset) if causal else 0
        if r0 >= n:
            break
        rows = slice(r0, n)
        s = (qv[rows] @ kv[c0:c1].T) * (q_scale[rows, None] * k_scale[j])  # fp32: S = (q_s · k_s) Qq Kqᵀ
        s = s * log2_scale  # base 2: exp(τ S) = exp2(τ log2(e) S)
        if causal:
            s = np.where(np.arange(c0, c1)[None, :] > np.arange(r0, n)[:, None] + offset, F32(-np.inf), s)
        m_new = np.maximum(m[rows], s.max(axis=1))
        safe = np.where(np.isneginf(m_new), F32(0), m_new)
        p = np.exp2(s - safe[:, None])
        alpha = np.exp2(m[rows] - safe)
        l[rows] = alpha * l[rows] + p.sum(axis=1, dtype=F32)  # from the fp32 P
        pv = round_e4m3(p * F32(P_FACTOR)) @ vv[c0:c1]  # P·V on e4m3 operands, fp32 accumulator
        acc[rows] = alpha[:, None] * acc[rows] + pv * v_scale[j]
        m[rows] = m_new
    seen = l > 0
    return np.where(seen[:, None], acc / (F32(P_FACTOR) * np.where(seen, l, 1))[:, None], F32(0)).astype(F32)
