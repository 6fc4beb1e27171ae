"""attention_backward(..., schedule="flash3") (kernels/flash3_bwd.cu, Hopper only) against float64 gradients.

Same method and tolerances as test_backward_gpu.py (whose float64 reference this file reuses): fresh random inputs
seeded by the case, gradient outputs poisoned with NaN before the kernels run (an unwritten element fails), relative
Frobenius error per gradient within 4u of the dtype (fp16 2e-3, bf16 1.6e-2; never widened to pass). O and lse come
from iosim's flash3 forward. Shape classes: ragged N and N_kv (not multiples of the tiles), N_kv != N both ways
(causal rows with no visible key where N > N_kv), grouped-query and multi-query heads, head dims 64 and 128, both
dtypes, atomic (TMA bulk reduce-add) and deterministic dQ. On a GPU that is not Hopper the tests check the error.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from test_attention_gpu import _cp, _np_dtype
from test_backward_gpu import TOL, _rel, _seed, _torch, _torch_case, _torch_reference, reference_grads
from test_flash3_gpu import HOPPER, needs_hopper

from iosim.launch import FLASH3_BWD_TILES

pytestmark = pytest.mark.gpu

SHAPES = [  # (B, N, N_kv, H, H_kv, d)
    (1, 128, 128, 2, 2, 64),  # exact tiles
    (2, 100, 77, 4, 2, 64),  # ragged, N > N_kv, grouped-query 2:1
    (1, 77, 200, 4, 1, 128),  # N < N_kv, multi-query
    (1, 300, 130, 8, 2, 128),  # N > N_kv: causal rows with no key, grouped-query 4:1
    (1, 520, 520, 4, 4, 128),  # several Q and K/V blocks, a ragged last one
    (2, 1000, 1000, 2, 1, 64),
]


def _inputs(shape, dtype, seed):
    B, N, Nk, H, Hk, D = shape
    rng = np.random.default_rng(seed)
    dt = _np_dtype(dtype)
    return [rng.standard_normal(s).astype(np.float32).astype(dt)
            for s in ((B, N, H, D), (B, Nk, Hk, D), (B, Nk, Hk, D), (B, N, H, D))]


def _run(shape, dtype, causal, deterministic, seed):
    from iosim import gpu

    cp = _cp()
    hq, hk, hv, hdo = _inputs(shape, dtype, seed)
    q, k, v, do = (cp.asarray(x) for x in (hq, hk, hv, hdo))
    o, lse = gpu.attention(q, k, v, causal=causal, return_lse=True, schedule="flash3")
    out = tuple(cp.full(x.shape, cp.nan, dtype=x.dtype) for x in (q, k, v))  # poisoned
    options = gpu.BackwardOptions(schedule="flash3", deterministic=deterministic, out=out)
    grads = gpu.attention_backward(q, k, v, o, do, lse, causal=causal, options=options)
    assert all(g is o_ for g, o_ in zip(grads, out, strict=True))
    assert gpu.last_launch().schedule == "flash3_bwd" + ("_deterministic" if deterministic else "")
    refs = reference_grads(hq, hk, hv, hdo, causal, 1.0 / math.sqrt(shape[-1]))
    return [cp.asnumpy(g.astype(cp.float32)) for g in grads], refs


@needs_hopper
@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "deterministic"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "B{}N{}Nk{}H{}Hk{}d{}".format(*s))
def test_flash3_backward_matches_float64_gradients(shape, dtype, causal, deterministic):
    seed = _seed("flash3", shape, dtype, causal, deterministic)
    grads, refs = _run(shape, dtype, causal, deterministic, seed)
    for name, g, ref in zip(("dq", "dk", "dv"), grads, refs, strict=True):
        assert np.isfinite(g).all(), f"{name}: an element was not written (NaN poison) or overflowed"
        err = _rel(g, ref)
        assert err < TOL[dtype], f"{name}: relative error {err:.2e} >= {TOL[dtype]:.0e} (seed {seed})"


@needs_hopper
def test_flash3_backward_deterministic_mode_gives_identical_bits():
    from iosim import gpu

    cp = _cp()
    rng = cp.random.default_rng(11)
    q, do = (rng.standard_normal((2, 333, 8, 128), dtype=cp.float32).astype(cp.float16) for _ in range(2))
    k, v = (rng.standard_normal((2, 333, 2, 128), dtype=cp.float32).astype(cp.float16) for _ in range(2))
    o, lse = gpu.attention(q, k, v, causal=True, return_lse=True, schedule="flash3")
    options = gpu.BackwardOptions(schedule="flash3", deterministic=True)
    a = gpu.attention_backward(q, k, v, o, do, lse, causal=True, options=options)
    b = gpu.attention_backward(q, k, v, o, do, lse, causal=True, options=options)
    for x, y in zip(a, b, strict=True):
        assert bool((x.view(cp.uint16) == y.view(cp.uint16)).all())


@needs_hopper
def test_flash3_backward_launch_record_names_its_kernels():
    from iosim import gpu

    cp = _cp()
    q = cp.ones((1, 200, 4, 128), dtype=cp.float16)
    k = cp.ones((1, 150, 2, 128), dtype=cp.float16)
    o, lse = gpu.attention(q, k, k, return_lse=True, schedule="flash3")
    gpu.attention_backward(q, k, k, o, q, lse, options=gpu.BackwardOptions(schedule="flash3"))
    rec = gpu.last_launch()
    Br, Bc = FLASH3_BWD_TILES[128]
    assert rec.schedule == "flash3_bwd" and rec.tiles == {"block_q": Br, "block_kv": Bc}
    names = [x.kernel.split("<")[0] for x in rec.launches]
    assert names == ["iosim::flash_bwd_preprocess_kernel", "iosim::flash3_bwd_kernel",
                     "iosim::flash_bwd_convert_dq_kernel"]
    # 1-D grid of K/V blocks x kv heads x batch (the kernel orders them; causal: longest first)
    assert rec.launches[1].grid == (-(-150 // Bc) * 2 * 1, 1, 1) and rec.launches[1].block == (384, 1, 1)


@needs_hopper
def test_flash3_backward_refuses_head_dim_256_with_the_numbers():
    from iosim import gpu

    cp = _cp()
    q = cp.ones((1, 64, 2, 256), dtype=cp.float16)
    o, lse = gpu.attention(q, q, q, return_lse=True, schedule="flash3")
    with pytest.raises(gpu.AttentionInputError, match=r"head_dim=256 is not supported .* 256 registers a thread"):
        gpu.attention_backward(q, q, q, o, q, lse, options=gpu.BackwardOptions(schedule="flash3"))


@pytest.mark.skipif(HOPPER, reason="checks the error on a non-Hopper GPU")
def test_flash3_backward_says_clearly_it_needs_hopper():
    from iosim import gpu

    cp = _cp()
    q = cp.ones((1, 64, 2, 128), dtype=cp.float16)
    o, lse = gpu.attention(q, q, q, return_lse=True)
    with pytest.raises(gpu.HopperRequiredError, match="needs a Hopper GPU"):
        gpu.attention_backward(q, q, q, o, q, lse, options=gpu.BackwardOptions(schedule="flash3"))


@needs_hopper
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_flash3_autograd_runs_the_flash3_backward(causal):
    torch = _torch()
    from iosim import gpu

    shape = (1, 300, 130, 8, 2, 128)
    q, k, v, do = _torch_case(torch, shape, "bfloat16", causal, seed=_seed("flash3-autograd", causal))
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    o = gpu.attention(*leaves, causal=causal, schedule="flash3")
    o.backward(do)
    assert gpu.last_launch().schedule == "flash3_bwd"
    refs = _torch_reference(torch, q, k, v, do, causal)
    for name, leaf, ref in zip(("dq", "dk", "dv"), leaves, refs, strict=True):
        err = float((leaf.grad.double() - ref).norm() / ref.norm())
        assert err < TOL["bfloat16"], f"{name}: relative error {err:.2e}"
