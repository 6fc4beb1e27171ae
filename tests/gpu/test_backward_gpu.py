"""iosim.gpu.attention_backward and the differentiable torch path on a real GPU, against float64 gradients.

Every case draws fresh random inputs from a seeded generator (the seed is in the test id, so a failure replays),
poisons the gradient outputs (NaN) before the kernels run, so an element they never write fails, and compares each
gradient by relative Frobenius error ||g - ref|| / ||ref||.

Tolerances, set from the rounding the kernels do (never widened to pass): the backward rounds four times on the way
to each gradient (O in Delta = rowsum(dO o O), P and dS as GEMM operands, the result), each at most the dtype's unit
roundoff u, so 4u: fp16 2e-3 (u = 2^-11), bf16 1.6e-2 (u = 2^-8). The reference is the float64 gradient of the same
dtype-valued q, k, v, dO, and the kernels' inputs O and lse come from iosim's own forward.
"""

from __future__ import annotations

import math
import zlib

import numpy as np
import pytest
from test_attention_gpu import _cp, _np_dtype

from iosim.launch import FLASH_BWD_TILES

pytestmark = pytest.mark.gpu

TOL = {"float16": 2e-3, "bfloat16": 1.6e-2}

# (B, N, N_kv, H, H_kv, d): ragged lengths, kv_len != seq_len both ways (causal rows with no key where N > N_kv),
# grouped-query (2:1, 4:1) and multi-query heads, every head dim the kernels take
SHAPES = [
    (1, 128, 128, 2, 2, 64),
    (2, 100, 77, 4, 2, 64),
    (1, 77, 200, 4, 1, 128),
    (1, 300, 130, 8, 2, 128),
    (2, 129, 129, 2, 2, 256),
    (1, 64, 190, 2, 1, 32),
    (1, 520, 520, 4, 4, 128),
]


def reference_grads(q, k, v, do, causal, scale):
    """float64 dQ, dK, dV of L = sum(O o dO), O = softmax(scale Q K^T) V (bottom-right causal), kv heads summed over
    their query heads."""
    q, k, v, do = (x.astype(np.float64) for x in (q, k, v, do))
    _, N, H, _ = q.shape
    Nk, Hk = k.shape[1], k.shape[2]
    G = H // Hk
    kk, vv = np.repeat(k, G, axis=2), np.repeat(v, G, axis=2)
    qt, kt, vt, dot = (x.transpose(0, 2, 1, 3) for x in (q, kk, vv, do))  # (B, H, ., d)
    s = scale * qt @ kt.transpose(0, 1, 3, 2)
    if causal:
        s = np.where(np.arange(Nk)[None, :] <= np.arange(N)[:, None] + (Nk - N), s, -np.inf)
    m = s.max(-1, keepdims=True)
    e = np.exp(s - np.where(np.isfinite(m), m, 0.0))
    tot = e.sum(-1, keepdims=True)
    p = np.divide(e, tot, out=np.zeros_like(e), where=tot > 0)
    o = p @ vt
    dv = p.transpose(0, 1, 3, 2) @ dot
    dp = dot @ vt.transpose(0, 1, 3, 2)
    ds = p * (dp - (dot * o).sum(-1, keepdims=True))
    dq = scale * ds @ kt
    dk = scale * ds.transpose(0, 1, 3, 2) @ qt
    B, D = q.shape[0], q.shape[3]

    def per_kv_head(x):  # (B, H, Nk, D) -> (B, Nk, Hk, D), summed over each group
        return x.reshape(B, Hk, G, Nk, D).sum(2).transpose(0, 2, 1, 3)

    return dq.transpose(0, 2, 1, 3), per_kv_head(dk), per_kv_head(dv)


def _seed(*case) -> int:
    """A seed fixed by the case (the same in every process: str hashes are salted, crc32 is not)."""
    return zlib.crc32(repr(case).encode())


def _rel(x, ref) -> float:
    x = np.asarray(x, dtype=np.float64)
    return float(np.linalg.norm(x - ref) / max(np.linalg.norm(ref), 1e-30))


def _run(shape, dtype, causal, deterministic, seed):
    from iosim import gpu

    cp = _cp()
    B, N, Nk, H, Hk, D = shape
    rng = np.random.default_rng(seed)
    dt = _np_dtype(dtype)
    hq, hk, hv = (rng.standard_normal(s).astype(np.float32).astype(dt)
                  for s in ((B, N, H, D), (B, Nk, Hk, D), (B, Nk, Hk, D)))
    hdo = rng.standard_normal((B, N, H, D)).astype(np.float32).astype(dt)
    q, k, v, do = (cp.asarray(x) for x in (hq, hk, hv, hdo))
    o, lse = gpu.attention(q, k, v, causal=causal, return_lse=True)
    out = tuple(cp.full(x.shape, cp.nan, dtype=x.dtype) for x in (q, k, v))  # poisoned
    grads = gpu.attention_backward(q, k, v, o, do, lse, causal=causal,
                                   options=gpu.BackwardOptions(deterministic=deterministic, out=out))
    assert all(g is o_ for g, o_ in zip(grads, out, strict=True))
    refs = reference_grads(hq, hk, hv, hdo, causal, 1.0 / math.sqrt(D))
    return [cp.asnumpy(g.astype(cp.float32)) for g in grads], refs


@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "deterministic"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "B{}N{}Nk{}H{}Hk{}d{}".format(*s))
def test_backward_matches_float64_gradients(shape, dtype, causal, deterministic):
    seed = _seed(shape, dtype, causal, deterministic)
    grads, refs = _run(shape, dtype, causal, deterministic, seed)
    for name, g, ref in zip(("dq", "dk", "dv"), grads, refs, strict=True):
        assert np.isfinite(g).all(), f"{name}: an element was not written (NaN poison) or overflowed"
        err = _rel(g, ref)
        assert err < TOL[dtype], f"{name}: relative error {err:.2e} >= {TOL[dtype]:.0e} (seed {seed})"


def test_deterministic_mode_gives_identical_bits():
    from iosim import gpu

    cp = _cp()
    rng = cp.random.default_rng(7)
    q, do = (rng.standard_normal((2, 333, 8, 128), dtype=cp.float32).astype(cp.float16) for _ in range(2))
    k, v = (rng.standard_normal((2, 333, 2, 128), dtype=cp.float32).astype(cp.float16) for _ in range(2))
    o, lse = gpu.attention(q, k, v, causal=True, return_lse=True)
    a = gpu.attention_backward(q, k, v, o, do, lse, causal=True, options=gpu.BackwardOptions(deterministic=True))
    assert gpu.last_launch().schedule == "flash2_bwd_deterministic"
    b = gpu.attention_backward(q, k, v, o, do, lse, causal=True, options=gpu.BackwardOptions(deterministic=True))
    for x, y in zip(a, b, strict=True):
        assert bool((x.view(cp.uint16) == y.view(cp.uint16)).all())


def test_backward_launch_record_names_its_kernels():
    from iosim import gpu

    cp = _cp()
    q = cp.ones((1, 200, 4, 128), dtype=cp.float16)
    k = cp.ones((1, 150, 2, 128), dtype=cp.float16)
    o, lse = gpu.attention(q, k, k, return_lse=True)
    gpu.attention_backward(q, k, k, o, q, lse)
    rec = gpu.last_launch()
    Br, Bc = FLASH_BWD_TILES[128]
    assert rec.schedule == "flash2_bwd" and rec.tiles == {"block_q": Br, "block_kv": Bc}
    names = [x.kernel.split("<")[0] for x in rec.launches]
    assert names == ["iosim::flash_bwd_preprocess_kernel", "iosim::flash_bwd_kernel",
                     "iosim::flash_bwd_convert_dq_kernel"]
    assert rec.launches[1].grid == (-(-150 // Bc), 2, 1)  # one block per K/V block of each kv head


# ------------------------------------------------------------------------------------------------------------------
# torch: autograd, torch.library, torch.compile


def _torch():
    return pytest.importorskip("torch", reason="the differentiable path needs torch")


def _torch_case(torch, shape, dtype, causal, seed):
    B, N, Nk, H, Hk, D = shape
    g = torch.Generator(device="cuda").manual_seed(seed)
    dt = getattr(torch, dtype)
    mk = lambda *s: torch.randn(*s, generator=g, device="cuda", dtype=torch.float32).to(dt)  # noqa: E731
    q, k, v, do = mk(B, N, H, D), mk(B, Nk, Hk, D), mk(B, Nk, Hk, D), mk(B, N, H, D)
    return q, k, v, do


def _torch_reference(torch, q, k, v, do, causal):
    """float64 autograd of torch's math attention (bottom-right causal, kv heads repeated for their group)."""
    q64, k64, v64 = (x.detach().double().requires_grad_() for x in (q, k, v))
    G = q.shape[2] // k.shape[2]
    qt, kt, vt = q64.transpose(1, 2), k64.repeat_interleave(G, 2).transpose(1, 2), v64.repeat_interleave(G, 2).transpose(1, 2)
    s = qt @ kt.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        N, Nk = q.shape[1], k.shape[1]
        keep = torch.arange(Nk, device="cuda")[None, :] <= torch.arange(N, device="cuda")[:, None] + (Nk - N)
        s = s.masked_fill(~keep, float("-inf"))
    p = torch.nan_to_num(torch.softmax(s, -1), nan=0.0)
    o = (p @ vt).transpose(1, 2)
    o.backward(do.double())
    return q64.grad, k64.grad, v64.grad


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", SHAPES[1:5], ids=lambda s: "B{}N{}Nk{}H{}Hk{}d{}".format(*s))
def test_autograd_matches_float64_autograd(shape, causal):
    torch = _torch()
    from iosim import gpu

    q, k, v, do = _torch_case(torch, shape, "bfloat16", causal, seed=_seed(shape, causal))
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    o = gpu.attention(*leaves, causal=causal)
    assert o.requires_grad and o.dtype == torch.bfloat16
    o.backward(do)
    refs = _torch_reference(torch, q, k, v, do, causal)
    for name, leaf, ref in zip(("dq", "dk", "dv"), leaves, refs, strict=True):
        err = float((leaf.grad.double() - ref).norm() / ref.norm())
        assert err < TOL["bfloat16"], f"{name}: relative error {err:.2e}"


def test_custom_op_passes_torch_opcheck():
    torch = _torch()
    from iosim.gpu.autograd import attention_op

    q, k, v, _ = _torch_case(torch, (1, 96, 96, 4, 2, 64), "float16", True, seed=3)
    args = (q.requires_grad_(), k.requires_grad_(), v.requires_grad_(), "flash2", True, 0.125, False)
    torch.library.opcheck(attention_op, args)


def test_torch_compile_fullgraph_trains_through_it():
    torch = _torch()
    from iosim import gpu

    q, k, v, do = _torch_case(torch, (2, 256, 256, 4, 4, 64), "bfloat16", True, seed=5)

    def loss(q, k, v):
        return (gpu.attention(q, k, v, causal=True).float() * do.float()).sum()

    compiled = [x.clone().requires_grad_() for x in (q, k, v)]
    torch.compile(loss, fullgraph=True)(*compiled).backward()
    refs = _torch_reference(torch, q, k, v, do, True)
    for name, leaf, ref in zip(("dq", "dk", "dv"), compiled, refs, strict=True):
        err = float((leaf.grad.double() - ref).norm() / ref.norm())
        assert err < TOL["bfloat16"], f"{name}: relative error {err:.2e}"
