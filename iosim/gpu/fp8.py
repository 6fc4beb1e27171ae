"""FP8 (e4m3) attention forward on Hopper: block quantization and the fp8 instantiations of kernels/flash3_fwd.cu,
FlashAttention-3's design (Shah et al. 2024, section 3.3).

    >>> from iosim import gpu
    >>> o = gpu.attention_fp8(q, k, v, causal=True, incoherent=0)     # bf16 in, quantize, attend, bf16 O out
    >>> qf = gpu.quantize_fp8(q, block=128, incoherent=0)              # or quantize once, attend many times
    >>> kf = gpu.quantize_fp8(k, block=gpu.fp8_blocks(128)[1], incoherent=0)
    >>> vf = gpu.quantize_fp8(v, block=gpu.fp8_blocks(128)[1], transpose=True)
    >>> o = gpu.attention(qf, kf, vf, schedule="flash3")

Quantization (kernels/quantize_fp8.cu): one fp32 scale per block of ``block`` rows of one (batch, head), scale =
amax / 448, values = e4m3(x / scale) rounded to nearest even and saturated; ``per_tensor=True`` gives every block the
tensor's scale (the baseline FlashAttention-3 compares with). ``incoherent=seed``: Q and K are multiplied along d by a
random +-1 diagonal (:func:`rotation_signs`) and a normalized Walsh-Hadamard matrix first; the rotation is orthogonal,
so Q K^T is unchanged, and it spreads outliers. Q and K must use the same seed; V is never rotated.

Layouts: Q and K stay (B, N, H, d) in e4m3 bytes. The P V wgmma takes 8-bit operands K-major only, so V is stored as
V^T (B, H_kv, d, N_kv padded to 16) with the keys of each group of 16 in the order P's register fragment holds them
(:func:`fp8_key_of`): the kernel needs no transpose and no register shuffle. The kernel reads one scale per Q tile
(128 rows) and per K/V tile (``block_kv``): Q must be quantized in blocks of 128 rows and K and V in blocks of
``block_kv`` (:func:`fp8_blocks`). O is bf16 (as FlashAttention-3's fp8 forward), lse fp32.
"""

from __future__ import annotations

import sys
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import numpy as np

from iosim import launch
from iosim.gpu import build, build_fp8, flash3_host
from iosim.gpu._cupy import require_cupy
from iosim.gpu.attention import KernelLaunch, LaunchRecord, _record
from iosim.gpu.compiled import _kernel
from iosim.gpu.inputs import (
    AttentionInputError,
    AttentionTypeError,
    _as_cupy,
    check_scale,
    dtype_name,
    torch_of,
    torch_stream,
)
from iosim.numeric.fp8 import random_signs

E4M3_MAX = 448.0
_LOG2E = 1.4426950408889634
_QUANT_THREADS = 256  # kernels/quantize_fp8.cu kQuantThreads


@dataclass(frozen=True)
class Fp8Tensor:
    """A tensor quantized by :func:`quantize_fp8`: ``values`` e4m3 bytes (uint8), (B, N, H, d), or V^T (B, H, d,
    N padded to 16) when ``transposed``; ``scales`` fp32 (B, H, ceil(N / block)), x ~= e4m3(values) * scale of its
    block. ``shape`` is the logical (B, N, H, d); ``incoherent`` the rotation's seed (None: not rotated);
    ``per_tensor``: every block carries the tensor's scale; ``torch``: made from a torch tensor (attention returns
    torch)."""

    values: Any
    scales: Any
    shape: tuple[int, int, int, int]
    block: int
    transposed: bool = False
    incoherent: int | None = None
    per_tensor: bool = False
    torch: bool = False


def fp8_blocks(head_dim: int) -> tuple[int, int]:
    """(Q's block, K's and V's block) in rows: the fp8 kernel's tiles (block_q, block_kv) at ``head_dim``."""
    if head_dim not in launch.FLASH3_FP8_TILES:
        raise AttentionInputError(f"head_dim={head_dim}: the fp8 forward has head dims {list(launch.FLASH3_FP8_TILES)}")
    return launch.FLASH3_FP8_TILES[head_dim]


def rotation_signs(head_dim: int, seed: int) -> np.ndarray:
    """The random +-1 diagonal of incoherent processing as float32: iosim.numeric.fp8's, so the kernels and the
    emulation rotate alike."""
    return random_signs(head_dim, seed).astype(np.float32)


def fp8_key_of(p: np.ndarray | int) -> np.ndarray | int:
    """Which key (0..15 within its group of 16) V^T's column ``p`` of the group holds: P's fp8 register fragment has,
    at k position 4t + e, the accumulator's key (e // 2) * 8 + 2t + e % 2."""
    e, t = np.asarray(p) & 3, np.asarray(p) >> 2
    return (e >> 1) * 8 + 2 * t + (e & 1)


def _check_x(cp: Any, x: Any, block: int, transpose: bool, incoherent: int | None) -> tuple[Any, str]:
    xa = _as_cupy(cp, x, "x")
    dt = dtype_name(xa.dtype)
    if dt not in build.CUDA_TYPES:
        raise AttentionTypeError(f"x: dtype {xa.dtype}; expected float16 or bfloat16")
    if xa.ndim != 4 or not xa.flags.c_contiguous:
        raise AttentionInputError(f"x: shape {tuple(xa.shape)}; expected a contiguous (batch, seq_len, heads, "
                                  "head_dim) array")
    fp8_blocks(int(xa.shape[3]))
    if not (isinstance(block, int) and 16 <= block <= 256 and block % 16 == 0):
        raise AttentionInputError(f"block={block!r}: expected a multiple of 16 in 16..256 rows")
    if transpose and int(xa.shape[3]) * block > 48 * 1024:
        raise AttentionInputError(f"block={block}: V^T of a block is staged in 48 KB of shared memory; expected "
                                  f"block <= {48 * 1024 // int(xa.shape[3])} at head_dim={int(xa.shape[3])}")
    if transpose and incoherent is not None:
        raise AttentionInputError("incoherent: V is never rotated (O would need the inverse rotation); expected None "
                                  "with transpose=True")
    return xa, dt


def quantize_fp8(x: Any, *, block: int = 128, per_tensor: bool = False, incoherent: int | None = None,
                 transpose: bool = False) -> Fp8Tensor:
    """Quantize ``x`` (B, N, H, d), fp16 or bf16 on a Hopper GPU, to e4m3 with one fp32 scale per ``block`` rows of
    each (batch, head); see the module's docstring. ``transpose=True`` writes V's layout for the fp8 kernel."""
    cp = require_cupy()
    flash3_host.require_hopper(cp)
    xa, dt = _check_x(cp, x, block, transpose, incoherent)
    torch = torch_of(x)
    B, N, H, D = (int(s) for s in xa.shape)
    with cp.cuda.Device(xa.device.id), _stream(cp, torch, xa.device.id):
        run, out, scales = quantize_launcher(cp, xa, dt, block, transpose, incoherent)
        fixed = None
        if per_tensor:
            amax = run(None, True)
            m = amax.max()
            fixed = cp.full(H, 1.0, dtype=cp.float32)  # the tensor's scale for every head
            fixed *= cp.where(m > 0, m / cp.float32(E4M3_MAX), cp.float32(1.0)).astype(cp.float32)
        run(fixed, False)
    return Fp8Tensor(out, scales, (B, N, H, D), block, transpose, incoherent, per_tensor, torch is not None)


def quantize_launcher(cp: Any, xa: Any, dt: str, block: int, transpose: bool = False,
                      incoherent: int | None = None) -> tuple[Any, Any, Any]:
    """(run, values, scales) for kernels/quantize_fp8.cu on the checked CuPy array ``xa`` (B, N, H, d):
    ``run(fixed, amax)`` launches it on the current stream: ``amax`` True returns each block's amax (B, H, blocks)
    and writes nothing else; else it writes ``values`` and ``scales``, every block of head h with scale
    ``fixed[h]`` (a CuPy float32 (H,) array) or, where ``fixed`` is None, its own."""
    B, N, H, D = (int(s) for s in xa.shape)
    nb, rows_pad = -(-N // block), -(-N // launch.FP8_KEY_GROUP) * launch.FP8_KEY_GROUP
    out = cp.empty((B, H, D, rows_pad) if transpose else (B, N, H, D), dtype=cp.uint8)
    scales = cp.empty((B, H, nb), dtype=cp.float32)
    signs = cp.asarray(rotation_signs(D, incoherent)) if incoherent is not None else None
    smem = D * block if transpose else 0
    fn = _kernel(cp, build_fp8.QuantizeInstance(dt, D, transpose), smem)
    null = cp.uint64(0)

    def run(fixed: Any, amax: bool) -> Any:
        amax_out = cp.empty((B, H, nb), dtype=cp.float32) if amax else None
        fn((nb, H, B), (_QUANT_THREADS, 1, 1), (xa, out, scales, signs if signs is not None else null,
                                                fixed if fixed is not None else null,
                                                amax_out if amax_out is not None else null, cp.int32(N), cp.int32(H),
                                                cp.int32(block), cp.int32(rows_pad)), shared_mem=smem)
        return amax_out

    return run, out, scales


def _stream(cp: Any, torch: Any, device: int) -> Any:
    return torch_stream(cp, torch, device) if torch is not None else nullcontext()


def _check_fp8(q: Any, k: Any, v: Any) -> None:
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, Fp8Tensor):
            raise AttentionTypeError(f"{name}: got {type(x).__name__}; fp8 attention takes q, k, v from "
                                     "iosim.gpu.quantize_fp8 (or use iosim.gpu.attention_fp8 on fp16/bf16 tensors)")
    B, _, H, D = q.shape
    Bk, _, Hk, Dk = k.shape
    if v.shape != k.shape or (B, D) != (Bk, Dk) or H % Hk:
        raise AttentionInputError(f"shapes q {q.shape}, k {k.shape}, v {v.shape}: expected k and v alike, the same "
                                  "batch and head_dim as q, and heads a multiple of kv_heads")
    bq, bkv = fp8_blocks(D)
    if (q.block, k.block, v.block) != (bq, bkv, bkv):
        raise AttentionInputError(f"blocks q {q.block}, k {k.block}, v {v.block}: the kernel reads one scale per tile; "
                                  f"expected q in blocks of {bq} rows, k and v of {bkv} (iosim.gpu.fp8_blocks({D}))")
    if q.transposed or k.transposed or not v.transposed:
        raise AttentionInputError("layouts: expected q and k quantized with transpose=False and v with transpose=True")
    if q.incoherent != k.incoherent:
        raise AttentionInputError(f"incoherent: q rotated with seed {q.incoherent}, k with {k.incoherent}; Q K^T is "
                                  "kept only when both use the same rotation")


def _outputs(cp: Any, out: tuple[Any, Any] | None, B: int, N: int, H: int, D: int) -> tuple[Any, Any]:
    if out is None:
        return cp.empty((B, N, H, D), dtype=_bf16(cp)), cp.empty((B, H, N), dtype=cp.float32)
    o, lse = out
    want = ((B, N, H, D), _bf16(cp)), ((B, H, N), cp.float32)
    for name, x, (shape, dt) in zip(("o", "lse"), out, want, strict=True):
        if not (isinstance(x, cp.ndarray) and x.shape == shape and x.dtype == dt and x.flags.c_contiguous):
            raise AttentionInputError(f"out: {name} must be a contiguous CuPy array of shape {shape} and dtype "
                                      f"{np.dtype(dt).name}; got {type(x).__name__} {getattr(x, 'shape', '')} "
                                      f"{getattr(x, 'dtype', '')}")
    return o, lse


def attention_fp8_quantized(q: Fp8Tensor, k: Fp8Tensor, v: Fp8Tensor, *, causal: bool = False,
                            scale: float | None = None, return_lse: bool = False,
                            out: tuple[Any, Any] | None = None) -> Any:
    """The fp8 kernel on tensors from :func:`quantize_fp8` (``iosim.gpu.attention(q, k, v, schedule="flash3")``
    lands here). Returns O (B, N, H, d) bf16 (and lse (B, H, N) fp32): torch tensors where q came from torch.
    ``out``: preallocated (O, lse) CuPy arrays, every element overwritten (returned as given)."""
    _check_fp8(q, k, v)
    cp = require_cupy()
    flash3_host.require_hopper(cp)
    B, N, H, D = q.shape
    Nk, Hk = k.shape[1], k.shape[2]
    scale = check_scale(scale, D)
    block_q, block_kv = fp8_blocks(D)
    torch = _torch_module() if q.torch and out is None else None
    dev = q.values.device.id
    with cp.cuda.Device(dev), _stream(cp, torch, dev):
        o, lse = _outputs(cp, out, B, N, H, D)
        smem = launch.flash3_smem_bytes(D, block_q, block_kv, 1)
        inst = build.Flash3Instance(D, block_kv, build.FP8_DTYPE, bool(causal))
        grid, block = flash3_host.launch_kernel(cp, _kernel(cp, inst, smem), q.values, k.values, v.values, o, lse,
                                                causal=bool(causal), scale_log2=scale * _LOG2E, dtype=build.FP8_DTYPE,
                                                block_q=block_q, block_kv=block_kv, smem=smem,
                                                scales=(q.scales, k.scales, v.scales))
    tiles = {"block_q": block_q, "block_kv": block_kv, "stages": launch.FLASH3_STAGES}
    _record(LaunchRecord("flash3", B, N, Nk, H, Hk, D, build.FP8_DTYPE, bool(causal), tiles,
                         (KernelLaunch(inst.name_expression, grid, block, smem),)))
    if torch is not None:
        o, lse = torch.from_dlpack(o), torch.from_dlpack(lse)
    return (o, lse) if return_lse else o


def attention_fp8(q: Any, k: Any, v: Any, *, causal: bool = False, scale: float | None = None,
                  incoherent: int | None = None, per_tensor: bool = False, return_lse: bool = False) -> Any:
    """softmax(scale Q K^T) V with fp8 tensor cores: quantize fp16/bf16 ``q``, ``k``, ``v`` (B, N, H, d) as the
    module's docstring says (``incoherent``: the rotation's seed for Q and K; ``per_tensor``: one scale a tensor),
    then run the fp8 kernel. Hopper only; head_dim 64, 128 or 256. Returns bf16 O (and lse)."""
    D = int(q.shape[3])
    bq, bkv = fp8_blocks(D)
    qf = quantize_fp8(q, block=bq, per_tensor=per_tensor, incoherent=incoherent)
    kf = quantize_fp8(k, block=bkv, per_tensor=per_tensor, incoherent=incoherent)
    vf = quantize_fp8(v, block=bkv, per_tensor=per_tensor, transpose=True)
    return attention_fp8_quantized(qf, kf, vf, causal=causal, scale=scale, return_lse=return_lse)


def dequantize(x: Fp8Tensor) -> Any:
    """float32 (B, N, H, d) of what ``x`` holds, V^T put back in key order: e4m3 bytes decoded exactly, times scales
    (for checks against the unquantized input)."""
    cp = require_cupy()
    table = cp.asarray(_E4M3_TABLE)
    vals = table[x.values]
    N = x.shape[1]
    if x.transposed:
        pad = vals.shape[3]
        cols = np.arange(pad)
        keys = (cols & ~15) + fp8_key_of(cols & 15)  # column -> key
        order = np.empty(pad, dtype=np.int64)
        order[keys] = cols
        vals = vals[..., cp.asarray(order)][..., :N].transpose(0, 3, 1, 2)  # (B, N, H, D)
    s = cp.repeat(x.scales, x.block, axis=2)[:, :, :N]  # (B, H, N)
    return vals * s.transpose(0, 2, 1)[..., None]


def _e4m3_table() -> np.ndarray:
    """The float32 value of every e4m3 byte (sign, 4 exponent bits biased by 7, 3 mantissa bits; 0x7f/0xff NaN)."""
    b = np.arange(256)
    sign = np.where(b & 0x80, -1.0, 1.0)
    exp, man = (b >> 3) & 0xF, b & 7
    val = np.where(exp == 0, man / 8.0 * 2.0 ** -6, (1 + man / 8.0) * 2.0 ** (exp - 7.0))
    val = np.where((b & 0x7F) == 0x7F, np.nan, val)
    return (sign * val).astype(np.float32)


_E4M3_TABLE = _e4m3_table()


def _bf16(cp: Any) -> Any:
    """CuPy 14's bfloat16 dtype (ml_dtypes', which CuPy depends on)."""
    import ml_dtypes

    return ml_dtypes.bfloat16


def _torch_module() -> Any:
    return sys.modules.get("torch")
