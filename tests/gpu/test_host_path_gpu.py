"""The repeat-call path of iosim.gpu.attention on torch tensors (a flash2 call validated once, launched again from
its plan): the same outputs as the checked path, and every check still made where a plan cannot vouch for a call."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu


def _torch():
    return pytest.importorskip("torch", reason="the repeat-call path is for torch tensors")


def test_a_repeat_call_gives_the_checked_calls_output():
    torch = _torch()
    from iosim import gpu

    g = torch.Generator(device="cuda").manual_seed(11)
    q, k, v = (torch.randn(2, 300, 4, 64, generator=g, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    first, lse1 = gpu.attention(q, k, v, causal=True, return_lse=True)  # checked, then remembered
    rec = gpu.last_launch()
    again, lse2 = gpu.attention(q, k, v, causal=True, return_lse=True)  # from the plan
    assert torch.equal(first, again) and torch.equal(lse1, lse2)
    assert gpu.last_launch() == rec
    q2 = torch.randn_like(q)  # new values, same shapes: the plan launches on the new pointers
    tiles = gpu.AttentionOptions(block_q=64, block_kv=64)
    ref = gpu.attention(q2.clone(), k, v, causal=True, options=tiles)  # another key: the checked path
    assert float((gpu.attention(q2, k, v, causal=True).float() - ref.float()).abs().max()) < 2e-2


def test_a_call_a_plan_cannot_vouch_for_is_checked_again():
    torch = _torch()
    from iosim import gpu

    q, k, v = (torch.randn(1, 128, 2, 64, device="cuda", dtype=torch.float16) for _ in range(3))
    gpu.attention(q, k, v)  # remembered
    strided = torch.randn(1, 2, 128, 64, device="cuda", dtype=torch.float16).transpose(1, 2)  # same shape
    with pytest.raises(gpu.AttentionInputError, match="not C-contiguous"):
        gpu.attention(strided, k, v)
    offset = torch.randn(1 * 128 * 2 * 64 + 1, device="cuda", dtype=torch.float16)[1:].view(1, 128, 2, 64)
    with pytest.raises(gpu.AttentionInputError, match="16-byte aligned"):
        gpu.attention(offset, k, v)
