"""Attention on the CPU: FlashAttention-2's tiled forward (numba, all cores) or NumPy's three steps.

    >>> from iosim import cpu
    >>> o = cpu.attention(q, k, v, causal=True)            # q (B, N, H, d), k and v (B, N_kv, H_kv, d)
    >>> o = cpu.attention(q, k, v, schedule="naive")       # S = scale Q Kᵀ, P = softmax(S), O = P V

Dtypes: float32 and float64 are computed in their own precision; float16 and bfloat16 (ml_dtypes) are upcast to
float32, computed in float32, and the output is cast back to the input dtype (as the GPU kernels store O in the
problem dtype after fp32 accumulation). Causal masks are bottom-right aligned: query row i sees key j iff
j <= i + (kv_len - seq_len); a row that sees no key gets O = 0.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from iosim.cpu import _blas, kernels
from iosim.cpu.host import host_l2_bytes
from iosim.schedules import Tiles
from iosim.simulate_cpu import default_tiles
from iosim.units import fmt_bytes

SCHEDULES = ("flash2", "naive")
_COMPUTE = {"float32": np.float32, "float64": np.float64, "float16": np.float32, "bfloat16": np.float32}


class AttentionInputError(ValueError):
    """An argument of iosim.cpu.attention has a wrong value (shape, tile, scale, ...)."""


class AttentionTypeError(TypeError):
    """An argument of iosim.cpu.attention has a wrong type or dtype."""


class NaiveMemoryError(MemoryError):
    """schedule='naive' would materialize an N x N_kv matrix larger than the memory available."""


@dataclass(frozen=True)
class Run:
    """What the last iosim.cpu.attention call ran."""

    schedule: str
    shape: tuple[int, int, int, int, int, int]  # batch, seq_len, kv_len, heads, kv_heads, head_dim
    dtype: str  # the input dtype
    compute_dtype: str
    causal: bool
    tiles: Tiles | None
    gemm: str  # which GEMM the tiled kernel used


_last: Run | None = None


def last_run() -> Run | None:
    """The Run record of the most recent attention() call in this process (None before the first)."""
    return _last


def _validate(q, k, v, schedule, causal, scale):
    if schedule not in SCHEDULES:
        raise AttentionInputError(f"schedule={schedule!r}: expected one of {SCHEDULES}")
    if not isinstance(causal, bool):
        raise AttentionTypeError(f"causal={causal!r}: expected True or False")
    for name, x, dims in (("q", q, "(batch, seq_len, heads, head_dim)"),
                          ("k", k, "(batch, kv_len, kv_heads, head_dim)"),
                          ("v", v, "(batch, kv_len, kv_heads, head_dim)")):
        if not isinstance(x, np.ndarray):
            raise AttentionTypeError(f"{name}: got {type(x).__name__}; expected a NumPy array {dims}")
        if x.ndim != 4:
            raise AttentionInputError(f"{name}: shape {x.shape} has {x.ndim} dims; expected 4 dims {dims}")
        if min(x.shape) < 1:
            raise AttentionInputError(f"{name}: shape {x.shape} has an empty dimension; expected all >= 1")
        if x.dtype.name not in _COMPUTE:
            raise AttentionTypeError(f"{name}: dtype {x.dtype} is not supported; expected one of "
                                     f"{', '.join(_COMPUTE)}")
    for name, x in (("k", k), ("v", v)):
        if x.dtype != q.dtype:
            raise AttentionTypeError(f"{name}: dtype {x.dtype} differs from q's {q.dtype}; expected the same")
    B, _, H, D = q.shape
    if v.shape != k.shape:
        raise AttentionInputError(f"v: shape {v.shape} differs from k's {k.shape}; expected equal")
    if k.shape[0] != B:
        raise AttentionInputError(f"k: batch {k.shape[0]} differs from q's batch {B}; expected equal")
    if k.shape[3] != D:
        raise AttentionInputError(f"k: head_dim {k.shape[3]} differs from q's head_dim {D}; expected equal")
    if H % k.shape[2]:
        raise AttentionInputError(f"k: kv_heads={k.shape[2]} does not divide q's heads={H}; expected heads "
                                  "to be a multiple of kv_heads")
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    if isinstance(scale, bool) or not isinstance(scale, (int, float, np.floating, np.integer)):
        raise AttentionTypeError(f"scale={scale!r}: expected a positive float")
    if not (math.isfinite(scale) and scale > 0):
        raise AttentionInputError(f"scale={scale!r}: expected a finite positive float")
    return float(scale)


def _tiles(schedule, block_q, block_kv, head_dim, elem_bytes) -> Tiles | None:
    if schedule == "naive":
        if block_q is not None or block_kv is not None:
            raise AttentionInputError(f"block_q={block_q!r}, block_kv={block_kv!r}: the naive schedule has no "
                                      "tiles; expected None")
        return None
    default = default_tiles(head_dim, elem_bytes, host_l2_bytes())
    for name, b in (("block_q", block_q), ("block_kv", block_kv)):
        if b is not None and (isinstance(b, bool) or not isinstance(b, (int, np.integer)) or b < 1):
            raise AttentionInputError(f"{name}={b!r}: expected a positive integer (default from this CPU's "
                                      f"caches: {default})")
    return Tiles(int(block_q) if block_q is not None else default.block_q,
                 int(block_kv) if block_kv is not None else default.block_kv)


def available_memory() -> int:
    """Bytes this process may still allocate: MemAvailable from /proc/meminfo, else free physical pages."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def naive_bytes(seq_len: int, kv_len: int, compute_dtype=np.float32) -> int:
    """Bytes the naive schedule materializes: one head's S (reused in place for P), N x N_kv elements."""
    return seq_len * kv_len * np.dtype(compute_dtype).itemsize


def _naive(q, k, v, out, scale, causal):
    """Algorithm 0, one head at a time: S = scale Q Kᵀ; P = softmax(S) (in place); O = P V."""
    B, N, H, _ = q.shape
    Nk, group = k.shape[1], H // k.shape[2]
    for b in range(B):
        for h in range(H):
            hk = h // group
            S = (q[b, :, h, :] * q.dtype.type(scale)) @ k[b, :, hk, :].T  # (N, N_kv), materialized
            if causal:
                for i in range(N):  # row i hides keys j > i + (N_kv - N); rows with i < N - N_kv see none
                    S[i, max(0, i + Nk - N + 1):] = -np.inf
            m = S.max(axis=1, keepdims=True)
            m[~np.isfinite(m)] = 0.0  # a row of -inf: exp gives 0, its output 0
            S -= m
            np.exp(S, out=S)
            den = S.sum(axis=1, keepdims=True)
            den[den == 0] = 1.0
            S /= den
            out[b, :, h, :] = S @ v[b, :, hk, :]


def attention(q: Any, k: Any, v: Any, *, causal: bool = False, schedule: str = "flash2",
              block_q: int | None = None, block_kv: int | None = None, scale: float | None = None) -> np.ndarray:
    """softmax(scale Q Kᵀ) V on this CPU.

    q: (batch, seq_len, heads, head_dim); k, v: (batch, kv_len, kv_heads, head_dim), heads a multiple of
    kv_heads (query head h uses kv head h // (heads // kv_heads)). NumPy arrays of float32, float64, float16 or
    bfloat16 (see the module docstring for the upcast rule).
    schedule: "flash2" (tiled, numba, all cores, O(N d) memory) or "naive" (NumPy: S and P materialized, one
    head at a time; refused before allocating when one N x N_kv matrix exceeds the available memory).
    block_q, block_kv: flash2's tiles Br, Bc; default from this CPU's cache sizes (iosim.simulate_cpu.default_tiles).
    scale: default 1/sqrt(head_dim). Returns an array shaped and typed like q.
    """
    global _last
    scale = _validate(q, k, v, schedule, causal, scale)
    in_dtype = q.dtype
    cdt = _COMPUTE[in_dtype.name]
    tiles = _tiles(schedule, block_q, block_kv, q.shape[3], np.dtype(cdt).itemsize)
    B, N, H, D = q.shape
    Nk, Hk = k.shape[1], k.shape[2]
    if schedule == "naive":
        need, avail = naive_bytes(N, Nk, cdt), available_memory()
        if need > avail:
            raise NaiveMemoryError(
                f"schedule='naive': seq_len={N} x kv_len={Nk} x {np.dtype(cdt).itemsize} B = {fmt_bytes(need)} "
                f"for one head's S, but only {fmt_bytes(avail)} of memory is available; use "
                "schedule='flash2' (O(N d) memory) or a shorter sequence")
    q, k, v = (np.ascontiguousarray(x, dtype=cdt) for x in (q, k, v))
    out = np.empty(q.shape, dtype=cdt)
    if schedule == "naive":
        _naive(q, k, v, out, scale, causal)
    else:
        kernels.flash2_forward(q, k, v, out, kernels.Tiling(tiles.block_q, tiles.block_kv, scale, causal, _blas.BLAS))
    _last = Run(schedule, (B, N, Nk, H, Hk, D), in_dtype.name, np.dtype(cdt).name, causal, tiles,
                _blas.describe())
    return out if out.dtype == in_dtype else out.astype(in_dtype)
