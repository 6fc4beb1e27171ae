"""An fp8 (e4m3) KV cache for :func:`iosim.gpu.decode`: one fp32 scale per kv head, as serving engines keep them.

    >>> from iosim import gpu
    >>> kq = gpu.quantize_kv_fp8(k_cache)                # scale = the head's amax / 448 over the whole cache
    >>> vq = gpu.quantize_kv_fp8(v_cache, scale=vs)      # or a given scale (a number or one per kv head)
    >>> o, lse = gpu.decode(q, kq, vq, seqlens_k=lens)    # QuantizedKV(values, scale) pairs

Values are e4m3(x / scale[h]), rounded to nearest even and saturated at +-448 (kernels/quantize_fp8.cu, the fp8
forward's quantizer with a fixed scale per head), so x ~= scale[h] * e4m3. A paged cache (num_pages, page_size,
kv_heads, d) and a contiguous one (batch, max_len, kv_heads, d) quantize alike: every page or sequence of the array
counts for the amax, written to or not (pass ``scale`` to leave free pages out). Per-head scales are fixed when the
cache is written, so tokens appended later use the same scale (a token past it saturates at 448 · scale).

Quantizing needs cvt to e4m3 (sm_89+; the library compiles it for Hopper, like :func:`iosim.gpu.quantize_fp8`);
decoding an fp8 cache runs on any sm_80+ GPU (the kernel converts e4m3 to fp16 with cvt on sm_89+, with integer
instructions before), so a cache quantized elsewhere (torch's ``float8_e4m3fn``) decodes anywhere.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

from iosim.gpu import build, flash3_host
from iosim.gpu._cupy import require_cupy
from iosim.gpu.decode_inputs import QuantizedKV, host_scales
from iosim.gpu.fp8 import E4M3_MAX, quantize_launcher
from iosim.gpu.inputs import (
    AttentionInputError,
    AttentionTypeError,
    _as_cupy,
    dtype_name,
    torch_of,
    torch_stream,
)
from iosim.launch import decode as geo

_AMAX_ROWS = 256  # rows of one (array row, kv head) a block of the amax pass reduces


def quantize_kv_fp8(cache: Any, *, scale: Any = None) -> QuantizedKV:
    """Quantize a K or V cache, fp16 or bf16 (any of the 4-d layouts :func:`iosim.gpu.decode` takes, contiguous in
    memory), to e4m3 with one scale per kv head: ``scale`` None: amax / 448 of each head over the whole array (1
    for a head of zeros); else a number or (kv_heads,) floats, finite and > 0. Returns ``QuantizedKV(values,
    scale)``: values torch float8_e4m3fn for a torch input, else a CuPy uint8 array of e4m3 bits, the input's
    shape; scale float32 (kv_heads,) on the same device."""
    cp = require_cupy()
    flash3_host.require_hopper(cp)
    xa = _as_cupy(cp, cache, "cache")
    dt = dtype_name(xa.dtype)
    if dt not in build.CUDA_TYPES:
        raise AttentionTypeError(f"cache: dtype {xa.dtype}; expected float16 or bfloat16")
    if xa.ndim != 4 or not xa.flags.c_contiguous or int(xa.shape[3]) not in geo.DECODE_HEAD_DIMS:
        raise AttentionInputError(f"cache: shape {tuple(xa.shape)}; expected a contiguous (pages or batch, tokens, "
                                  f"kv_heads, head_dim) array, head_dim one of {list(geo.DECODE_HEAD_DIMS)}")
    heads = int(xa.shape[2])
    torch = torch_of(cache)
    dev = xa.device.id
    with cp.cuda.Device(dev), (torch_stream(cp, torch, dev) if torch is not None else nullcontext()):
        run, values, _ = quantize_launcher(cp, xa, dt, min(_AMAX_ROWS, int(xa.shape[1])))
        if scale is None:
            amax = run(None, True).max(axis=(0, 2))  # (kv_heads,)
            fixed = cp.where(amax > 0, amax / cp.float32(E4M3_MAX), cp.float32(1.0)).astype(cp.float32)
        else:
            fixed = cp.asarray(host_scales(scale, "scale", heads))
        run(fixed, False)
    if torch is not None:
        return QuantizedKV(torch.from_dlpack(values).view(torch.float8_e4m3fn), torch.from_dlpack(fixed))
    return QuantizedKV(values, fixed)

