"""iosim's attention as a differentiable torch operator: ``torch.autograd`` and ``torch.compile`` see two custom ops,
``iosim::attention`` (forward: O and lse) and ``iosim::attention_backward`` (dQ, dK, dV from our backward kernels).

:func:`iosim.gpu.attention` routes here when it is given torch tensors that require grad with grad mode on; use it
as any torch function:

    >>> o = gpu.attention(q, k, v, causal=True)          # q, k, v: CUDA tensors with requires_grad=True
    >>> o.sum().backward()                               # q.grad, k.grad, v.grad from kernels/flash_bwd.cu
                                                         # (schedule="flash3": kernels/flash3_bwd.cu)

The forward saves O and lse (as FlashAttention does), never S or P. This module imports torch, so it is imported
only when a torch tensor arrives.
"""

from __future__ import annotations

import torch

from iosim.gpu.attention import attention
from iosim.gpu.backward import attention_backward
from iosim.gpu.inputs import BackwardOptions


@torch.library.custom_op("iosim::attention", mutates_args=(), device_types="cuda")
def attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, schedule: str, causal: bool, scale: float,
                 deterministic: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """O and lse of iosim.gpu.attention (q, k, v do not require grad here: autograd wraps the op);
    ``deterministic`` is the backward's mode, kept for it."""
    o, lse = attention(q.detach(), k.detach(), v.detach(), schedule=schedule, causal=causal, scale=scale,
                       return_lse=True)
    return o, lse


@attention_op.register_fake
def _(q, k, v, schedule, causal, scale, deterministic):
    B, N, H, _ = q.shape
    return torch.empty_like(q), q.new_empty((B, H, N), dtype=torch.float32)


# A torch.library custom op's signature is torch's, not ours: its schema takes tensors and scalars one by one (no
# dataclass reaches torch.compile's graph), so this op and its fake take ten parameters (tests/test_architecture.py
# lists them as foreign signatures).
@torch.library.custom_op("iosim::attention_backward", mutates_args=(), device_types="cuda")
def attention_backward_op(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                          lse: torch.Tensor, causal: bool, scale: float, deterministic: bool,
                          schedule: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dQ, dK, dV of iosim.gpu.attention_backward; ``schedule``: the backward's ("flash3" after a flash3 forward,
    else "flash2")."""
    options = BackwardOptions(schedule=schedule, scale=scale, deterministic=deterministic)
    return attention_backward(q.detach(), k.detach(), v.detach(), o, do, lse, causal=causal, options=options)


@attention_backward_op.register_fake
def _(do, q, k, v, o, lse, causal, scale, deterministic, schedule):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup_context(ctx, inputs, output):
    q, k, v, schedule, causal, scale, deterministic = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse)
    ctx.causal, ctx.scale, ctx.deterministic = causal, scale, deterministic
    ctx.schedule = "flash3" if schedule == "flash3" else "flash2"  # naive's backward is flash2's
    ctx.mark_non_differentiable(lse)


def _backward(ctx, do, _dlse):
    q, k, v, o, lse = ctx.saved_tensors
    dq, dk, dv = attention_backward_op(do.contiguous(), q, k, v, o, lse, ctx.causal, ctx.scale, ctx.deterministic,
                                       ctx.schedule)
    return dq, dk, dv, None, None, None, None


attention_op.register_autograd(_backward, setup_context=_setup_context)


def differentiable_attention(q, k, v, *, schedule: str, causal: bool, scale: float, return_lse: bool,
                             deterministic: bool | None):
    """The autograd path of iosim.gpu.attention (arguments already checked there); ``deterministic=None`` follows
    ``torch.are_deterministic_algorithms_enabled()``."""
    if deterministic is None:
        deterministic = torch.are_deterministic_algorithms_enabled()
    o, lse = attention_op(q, k, v, schedule, causal, scale, bool(deterministic))
    return (o, lse) if return_lse else o
