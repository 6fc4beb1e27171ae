"""``iosim.gpu.attention``: the forward kernels (:mod:`iosim.gpu.attention`), differentiable on torch tensors that
require grad through the custom ops of :mod:`iosim.gpu.autograd`. This module sits above both, so the forward
module never imports the autograd one (which imports it)."""

from __future__ import annotations

from typing import Any

from iosim.gpu.attention import attention as _forward
from iosim.gpu.fp8 import Fp8Tensor, attention_fp8_quantized
from iosim.gpu.inputs import (
    AttentionInputError,
    AttentionOptions,
    AttentionTypeError,
    check_options,
    check_scale,
    options_of,
    torch_of,
)


def _wants_grad(q: Any, k: Any, v: Any) -> bool:
    torch = torch_of(q)
    return torch is not None and torch.is_grad_enabled() and any(getattr(x, "requires_grad", False) for x in (q, k, v))


def _differentiable(q, k, v, schedule, causal, scale, return_lse, options: AttentionOptions) -> Any:
    if any(x is not None for x in (options.block_q, options.block_kv, options.out, options.lse_out,
                                   options.block_trace, options.window)):
        raise AttentionInputError("options: block_q, block_kv, out, lse_out, block_trace, window are not taken by a "
                                  "differentiable call (torch tensors that require grad: the backward has no window); "
                                  "expected None")
    check_options(schedule, causal)
    deterministic = options.deterministic
    if deterministic is not None and not isinstance(deterministic, bool):
        raise AttentionTypeError(f"deterministic={deterministic!r}: expected True, False or None")
    from iosim.gpu import autograd  # registers the torch custom ops: only once a differentiable call arrives

    scale = check_scale(scale, int(q.shape[-1]))
    return autograd.differentiable_attention(q, k, v, schedule=schedule, causal=causal, scale=scale,
                                             return_lse=return_lse, deterministic=deterministic)


def attention(q: Any, k: Any, v: Any, *, schedule: str = "flash2", causal: bool = False, scale: float | None = None,
              return_lse: bool = False, options: AttentionOptions | None = None) -> Any:
    """softmax(scale * Q K^T) V on the GPU with iosim's kernels.

    q: (batch, seq_len, heads, head_dim); k, v: (batch, kv_len, kv_heads, head_dim), heads a multiple of kv_heads
    (query head h uses kv head h // (heads // kv_heads)); contiguous, float16 or bfloat16, one device. CuPy arrays,
    torch tensors (viewed without copying or DLPack) or anything with ``__dlpack__`` / ``__cuda_array_interface__``.
    schedule: "flash2" (FlashAttention-2 forward, one kernel), "naive" (S and P materialized, three kernels) or
    "flash3" (FlashAttention-3-style forward: TMA, wgmma, warp specialization; Hopper (sm_90) only, head_dim 64,
    128 or 256, tiles :data:`iosim.launch.FLASH3_TILES`; raises :class:`iosim.gpu.HopperRequiredError` elsewhere).
    causal: query row i sees key j iff j <= i + kv_len - seq_len (bottom-right aligned); a row that sees no key
    gets O = 0 and lse = -inf.
    scale: default 1/sqrt(head_dim). return_lse: also return lse (batch, heads, seq_len) fp32, natural log.
    options: :class:`iosim.gpu.AttentionOptions`, what a call takes beyond the math: flash2's tiles (``block_q``,
    ``block_kv``), preallocated outputs (``out``, ``lse_out``), the block trace (``block_trace``: the timeline the L2
    model's drift input is read from), the backward's ``deterministic`` mode, flash2's sliding ``window`` (left,
    right) (FlashAttention's window_size; causal means right = 0; not differentiable).
    Returns an array like q (and lse when asked): torch tensors where q is a torch tensor (torch in, torch out; the
    kernels then run on torch's current stream, in order with the torch work around the call), else CuPy arrays.
    Differentiable: torch tensors that require grad (grad mode on) go through the custom op ``iosim::attention``
    (:mod:`iosim.gpu.autograd`), whose backward runs :func:`iosim.gpu.attention_backward` on the saved O and lse;
    ``torch.compile`` traces through it. That path takes no tiles, outputs or block trace.
    fp8: q, k, v from :func:`iosim.gpu.quantize_fp8` (e4m3 values and block scales) with schedule="flash3" run the
    FlashAttention-3-design kernel's fp8 instantiations and return bf16 O (:mod:`iosim.gpu.fp8`; not differentiable).
    """
    if isinstance(q, Fp8Tensor):  # fp8 inputs from iosim.gpu.quantize_fp8: the fp8 instantiations of flash3
        if schedule != "flash3" or options is not None:
            raise AttentionInputError(f"fp8 inputs (iosim.gpu.quantize_fp8) run schedule='flash3' without options; got "
                                      f"schedule={schedule!r}, options={options!r}")
        return attention_fp8_quantized(q, k, v, causal=causal, scale=scale, return_lse=return_lse)
    options = options_of(options, AttentionOptions)
    if _wants_grad(q, k, v):
        return _differentiable(q, k, v, schedule, causal, scale, return_lse, options)
    return _forward(q, k, v, schedule=schedule, causal=causal, scale=scale, return_lse=return_lse, options=options)
