"""iosim.gpu.attention on a real GPU against a float64 reference computed on the host from the same inputs.

Every case draws fresh random inputs (seeded by the test's id, so a failure replays), poisons the outputs (NaN)
before the kernel runs, so an element the kernel never writes fails, and compares by relative Frobenius error
||out - ref|| / ||ref||.

Tolerances (set from the rounding the kernels do; never widened to pass): fp16 1e-3 (unit roundoff 2^-11 = 4.9e-4:
the output and P are rounded once each), bf16 1e-2 (unit roundoff 2^-8 = 3.9e-3). The naive schedule stores S and P
in the input dtype (Algorithm 0); it is compared with a float64 reference of that same algorithm (S and P rounded to
the dtype).
"""

from __future__ import annotations

import math
import os
import zlib

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from iosim.launch import naive_softmax_chunks

pytestmark = pytest.mark.gpu

TOL = {"float16": 1e-3, "bfloat16": 1e-2}
DTYPES = ("float16", "bfloat16")


def _np_dtype(name: str):
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def seeded_rng() -> np.random.Generator:
    """Fresh inputs for each test, from a generator seeded by the running test's id (pytest's PYTEST_CURRENT_TEST):
    a failure replays with the same inputs when the same test runs again."""
    test = os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" ", 1)[0]
    return np.random.default_rng(zlib.crc32(test.encode()))


def _cp():
    import cupy

    return cupy


def is_hopper() -> bool:
    """Whether the GPU is sm_90 (flash3's kernels need it)."""
    try:
        return str(_cp().cuda.Device().compute_capability) == "90"
    except Exception:  # no CuPy or no GPU: conftest skips every gpu test with its reason
        return False


def rand_inputs(rng, B, N, Nk, H, Hk, D, dtype, amp=1.0):
    """Host arrays in the dtype (the reference reads these exact values) and their device copies."""
    dt = _np_dtype(dtype)
    hq = (rng.standard_normal((B, N, H, D)) * amp).astype(np.float32).astype(dt)
    hk = (rng.standard_normal((B, Nk, Hk, D)) * amp).astype(np.float32).astype(dt)
    hv = rng.standard_normal((B, Nk, Hk, D)).astype(np.float32).astype(dt)
    cp = _cp()
    return (hq, hk, hv), tuple(cp.asarray(x) for x in (hq, hk, hv))


def reference(hq, hk, hv, causal, scale=None, round_to=None):
    """float64 softmax(scale Q K^T) V, (B, N, H, D) and lse (B, H, N); rows with no visible key -> 0 and -inf.

    round_to: a NumPy dtype to round S and P to (the naive schedule's materialized intermediates), or None.
    """
    q, k, v = (x.astype(np.float64) for x in (hq, hk, hv))
    _, N, H, D = q.shape
    Nk, Hk = k.shape[1], k.shape[2]
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    k = np.repeat(k, H // Hk, axis=2)  # query head h reads kv head h // (H // Hk)
    v = np.repeat(v, H // Hk, axis=2)
    s = (q.transpose(0, 2, 1, 3) @ k.transpose(0, 2, 3, 1)) * scale  # (B, H, N, Nk)
    if round_to is not None:
        s = s.astype(round_to).astype(np.float64)
    if causal:
        i = np.arange(N)[:, None]
        j = np.arange(Nk)[None, :]
        s = np.where(j <= i + (Nk - N), s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    m_safe = np.where(np.isfinite(m), m, 0.0)
    e = np.exp(s - m_safe)
    row_sum = e.sum(axis=-1, keepdims=True)
    p = np.divide(e, row_sum, out=np.zeros_like(e), where=row_sum > 0)
    if round_to is not None:
        p = p.astype(round_to).astype(np.float64)
    o = (p @ v.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3)  # (B, N, H, D)
    with np.errstate(divide="ignore"):
        lse = np.where(row_sum[..., 0] > 0, m_safe[..., 0] + np.log(row_sum[..., 0]), -np.inf)
    return o, lse


def run(q, k, v, dtype, *, block_q=None, block_kv=None, block_trace=None, **kw):
    """attention() with NaN-poisoned out and lse_out, synchronized; returns host float64 copies. ``kw``: schedule,
    causal, scale; the others go into its options."""
    from iosim import gpu

    cp = _cp()
    B, N, H, D = q.shape
    out = cp.full((B, N, H, D), np.nan, dtype=np.float32).astype(q.dtype)
    lse_out = cp.full((B, H, N), np.nan, dtype=cp.float32)
    options = gpu.AttentionOptions(block_q=block_q, block_kv=block_kv, out=out, lse_out=lse_out,
                                   block_trace=block_trace)
    o, lse = gpu.attention(q, k, v, return_lse=True, options=options, **kw)
    assert o is out and lse is lse_out
    cp.cuda.runtime.deviceSynchronize()  # surfaces asynchronous CUDA errors here
    return cp.asnumpy(o).astype(np.float64), cp.asnumpy(lse).astype(np.float64)


def rel_err(a, b):
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def check(o, lse, ref_o, ref_lse, dtype, what=""):
    assert not np.isnan(o).any(), (
        f"{what}: NaN in O (unwritten or NaN-producing) at {np.argwhere(np.isnan(o))[:3]}"
    )
    assert not np.isnan(lse).any(), f"{what}: NaN in lse at {np.argwhere(np.isnan(lse))[:3]}"
    if np.linalg.norm(ref_o) > 0:
        err = rel_err(o, ref_o)
        assert err < TOL[dtype], f"{what}: relative error {err:.3g} >= {TOL[dtype]} ({dtype})"
    dead = ~np.isfinite(ref_lse)  # rows with no visible key
    assert np.array_equal(np.isneginf(lse), dead), f"{what}: lse = -inf exactly on rows that see no key"
    assert (o.transpose(0, 2, 1, 3)[dead] == 0).all(), f"{what}: rows that see no key must be exactly 0"
    if (~dead).any():
        lerr = np.abs(lse[~dead] - ref_lse[~dead]).max() / max(1.0, np.abs(ref_lse[~dead]).max())
        assert lerr < TOL[dtype], f"{what}: lse error {lerr:.3g}"


SHAPES = [  # (batch, seq_len, kv_len, heads, kv_heads)
    (1, 1, 1, 2, 2),
    (2, 17, 33, 4, 4),
    (1, 17, 1, 2, 2),
    (1, 1, 4097, 2, 2),
    (1, 1000, 999, 2, 1),  # multi-query
    (1, 4097, 1000, 8, 1),  # grouped-query 8:1, seq_len > kv_len: causal rows with no key
    (1, 1000, 4097, 8, 8),
]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "B{}-N{}-Nk{}-H{}-Hk{}".format(*s))
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("dtype", DTYPES)
def test_flash2_equals_float64_reference(shape, causal, D, dtype):
    rng = seeded_rng()
    B, N, Nk, H, Hk = shape
    host, dev = rand_inputs(rng, B, N, Nk, H, Hk, D, dtype)
    o, lse = run(*dev, dtype, causal=causal)
    check(o, lse, *reference(*host, causal), dtype, f"flash2 {shape} d={D} causal={causal}")


@pytest.mark.parametrize(
    "D,tiles", [(d, t) for d, ts in __import__("iosim.gpu.build").gpu.build.FLASH_TILES.items() for t in ts]
)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
def test_flash2_every_compiled_tile_is_exact(D, tiles, causal, dtype):
    rng = seeded_rng()
    host, dev = rand_inputs(rng, 2, 300, 257, 4, 2, D, dtype)
    o, lse = run(*dev, dtype, causal=causal, block_q=tiles[0], block_kv=tiles[1])
    check(o, lse, *reference(*host, causal), dtype, f"tiles {tiles} d={D}")
    from iosim import gpu

    rec = gpu.last_launch()
    assert rec.tiles == {"block_q": tiles[0], "block_kv": tiles[1]}
    assert rec.launches[0].grid == (-(-300 // tiles[0]), 4, 2)


@pytest.mark.parametrize("schedule", ["flash2", "naive"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_rows_that_see_no_key_are_zero_with_lse_minus_inf(schedule, dtype):
    rng = seeded_rng()
    host, dev = rand_inputs(rng, 1, 100, 10, 2, 2, 64, dtype)  # causal: rows 0..89 see no key
    o, lse = run(*dev, dtype, causal=True, schedule=schedule)
    ref_o, ref_lse = reference(*host, True, round_to=_np_dtype(dtype) if schedule == "naive" else None)
    assert np.isneginf(ref_lse[:, :, :90]).all()
    check(o, lse, ref_o, ref_lse, dtype, schedule)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("dtype", DTYPES)
def test_flash2_large_logits(causal, D, dtype):
    # inputs scaled by 30: logits scale*q.k ~ 30^2 ~ 1e3 in fp32, far beyond where a non-max-subtracted exp overflows
    rng = seeded_rng()
    host, dev = rand_inputs(rng, 1, 513, 700, 4, 2, D, dtype, amp=30.0)
    ref_o, ref_lse = reference(*host, causal)
    assert np.abs(ref_lse[np.isfinite(ref_lse)]).max() > 500
    o, lse = run(*dev, dtype, causal=causal)
    check(o, lse, ref_o, ref_lse, dtype, "large logits")


NAIVE_SHAPES = [
    (1, 1, 1, 2, 2),
    (2, 17, 33, 4, 4),
    (1, 1000, 999, 2, 1),
    (1, 4097, 1000, 8, 1),
    (1, 70, 4097, 2, 2),
    # naive.cu v2's paths: softmax rows in registers with 8 rows per block (264 keys: 2 chunks per thread; 1000 keys
    # above: 4), 256 threads per row (16384 keys: 8) and in shared memory with 16-byte loads (20000 keys); P tiles by
    # cp.async; ragged last tiles of 128
    (2, 300, 264, 4, 2),
    (1, 130, 16384, 2, 1),
    (1, 33, 20000, 2, 2),
    # v2.1: rows of S and P at a pitch of 8 elements; a ragged row's pad columns masked, in registers (777, and 999
    # and 4097 above) and in shared memory (16385)
    (2, 777, 777, 2, 2),
    (1, 33, 16385, 2, 1),
]


@pytest.mark.parametrize("shape", NAIVE_SHAPES, ids=lambda s: "B{}-N{}-Nk{}-H{}-Hk{}".format(*s))
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("dtype", DTYPES)
def test_naive_equals_float64_algorithm0(shape, causal, D, dtype):
    rng = seeded_rng()
    B, N, Nk, H, Hk = shape
    host, dev = rand_inputs(rng, B, N, Nk, H, Hk, D, dtype)
    o, lse = run(*dev, dtype, causal=causal, schedule="naive")
    check(o, lse, *reference(*host, causal, round_to=_np_dtype(dtype)), dtype, f"naive {shape}")
    from iosim import gpu

    rec = gpu.last_launch()
    assert [launch.kernel.split("<")[0] for launch in rec.launches] == [
        "iosim::naive_qk_kernel",
        "iosim::naive_softmax_kernel",
        "iosim::naive_pv_kernel",
    ]
    assert rec.launches[1].kernel.endswith(f", {naive_softmax_chunks(Nk, 2)}>")  # chunks of a row per thread
    assert rec.tiles == gpu.NAIVE_TILES


@given(
    B=st.integers(1, 2),
    N=st.integers(1, 80),
    Nk=st.integers(1, 80),
    Hk=st.integers(1, 3),
    group=st.integers(1, 3),
    D=st.sampled_from([32, 64, 128, 256]),
    dtype=st.sampled_from(DTYPES),
    causal=st.booleans(),
    schedule=st.sampled_from(["flash2", "naive"]),
    seed=st.integers(0, 2**32 - 1),
)
def test_any_small_shape_equals_reference(B, N, Nk, Hk, group, D, dtype, causal, schedule, seed):
    rng = np.random.default_rng(seed)
    host, dev = rand_inputs(rng, B, N, Nk, Hk * group, Hk, D, dtype)
    o, lse = run(*dev, dtype, causal=causal, schedule=schedule)
    ref = reference(*host, causal, round_to=_np_dtype(dtype) if schedule == "naive" else None)
    check(o, lse, *ref, dtype, f"{schedule} B={B} N={N} Nk={Nk} H={Hk * group} Hk={Hk} d={D}")


def test_default_output_allocation_and_return_without_lse():
    from iosim import gpu

    rng = seeded_rng()
    host, dev = rand_inputs(rng, 1, 65, 65, 2, 2, 64, "float16")
    o = gpu.attention(*dev)
    assert o.shape == dev[0].shape and o.dtype == dev[0].dtype
    err = rel_err(_cp().asnumpy(o).astype(np.float64), reference(*host, False)[0])
    assert err < TOL["float16"]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [False, True])
def test_torch_tensors_in_and_agreement_with_torch_sdpa(dtype, causal):
    torch = pytest.importorskip("torch", reason="torch is not importable: the SDPA comparison needs it")
    import torch.nn.functional as F

    from iosim import gpu

    tdt = getattr(torch, dtype)
    B, N, Nk, H, Hk, D = 2, 300, 400, 8, 2, 128
    q = torch.randn(B, N, H, D, device="cuda", dtype=tdt)  # (B, N, H, d): our layout
    k = torch.randn(B, Nk, Hk, D, device="cuda", dtype=tdt)
    v = torch.randn(B, Nk, Hk, D, device="cuda", dtype=tdt)
    o = gpu.attention(q, k, v, causal=causal)  # torch in (viewed without DLPack), torch out
    assert isinstance(o, torch.Tensor) and o.dtype == tdt and o.shape == q.shape and o.device == q.device
    ours = o.double()
    ref_o, _ = reference(*(x.float().cpu().numpy() for x in (q, k, v)), causal)
    ref_o = torch.from_numpy(ref_o).cuda()
    # torch wants (B, H, N, d); causal with N != Nk: torch's is_causal is top-left aligned, so pass our mask
    i = torch.arange(N, device="cuda")[:, None]
    j = torch.arange(Nk, device="cuda")[None, :]
    mask = (j <= i + (Nk - N)) if causal else None
    t = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask, enable_gqa=True
    ).transpose(1, 2)
    theirs = t.double()
    alive = ~torch.isnan(theirs)  # rows with no visible key: torch gives NaN with a boolean mask, we give 0
    err_ours = ((ours - ref_o)[alive].norm() / ref_o[alive].norm()).item()
    err_torch = ((theirs - ref_o)[alive].norm() / ref_o[alive].norm()).item()
    diff = ((ours - theirs)[alive].norm() / ref_o[alive].norm()).item()
    assert err_ours < TOL[dtype] and diff < 2 * TOL[dtype], (err_ours, err_torch, diff)


def test_torch_outputs_lse_and_preallocated_outputs_come_back_as_torch_tensors():
    torch = pytest.importorskip("torch", reason="torch is not importable")
    from iosim import gpu

    q = torch.randn(1, 70, 4, 64, device="cuda", dtype=torch.float16)
    k = torch.randn(1, 90, 2, 64, device="cuda", dtype=torch.float16)
    v = torch.randn(1, 90, 2, 64, device="cuda", dtype=torch.float16)
    host = tuple(x.cpu().numpy() for x in (q, k, v))
    ref_o, ref_lse = reference(*host, True)
    for schedule in ("flash2", "naive"):
        o, lse = gpu.attention(q, k, v, causal=True, return_lse=True, schedule=schedule)
        assert isinstance(o, torch.Tensor) and isinstance(lse, torch.Tensor) and lse.dtype == torch.float32
        ref = reference(*host, True, round_to=np.float16) if schedule == "naive" else (ref_o, ref_lse)
        check(o.double().cpu().numpy(), lse.double().cpu().numpy(), *ref, "float16", schedule)
    out, lse_out = torch.full_like(q, float("nan")), torch.full((1, 4, 70), float("nan"), device="cuda")
    o, lse = gpu.attention(q, k, v, causal=True, return_lse=True,
                           options=gpu.AttentionOptions(out=out, lse_out=lse_out))
    assert o is out and lse is lse_out
    check(out.double().cpu().numpy(), lse_out.double().cpu().numpy(), ref_o, ref_lse, "float16")


def test_a_torch_call_runs_in_order_on_torchs_current_stream():
    torch = pytest.importorskip("torch", reason="torch is not importable")
    from iosim import gpu

    side = torch.cuda.Stream()
    with torch.cuda.stream(side):  # inputs made, the call made and its output read on a side stream, no sync
        q = torch.randn(2, 512, 8, 128, device="cuda", dtype=torch.bfloat16)
        k, v = torch.randn_like(q), torch.randn_like(q)
        o = gpu.attention(q, k, v)
        ref = torch.nn.functional.scaled_dot_product_attention(*(x.transpose(1, 2) for x in (q, k, v)))
        diff = (o.float() - ref.transpose(1, 2).float()).abs().max()
    side.synchronize()
    assert diff.item() < 2e-2


def test_torch_input_errors_are_the_same_as_through_dlpack():
    torch = pytest.importorskip("torch", reason="torch is not importable")
    from iosim import gpu

    q = torch.zeros(1, 8, 2, 64, device="cuda", dtype=torch.float16)
    with pytest.raises(gpu.AttentionInputError, match="k: strides"):
        gpu.attention(q, torch.zeros(1, 2, 8, 64, device="cuda", dtype=torch.float16).transpose(1, 2), q)
    with pytest.raises(gpu.AttentionTypeError, match="q: dtype float32"):
        gpu.attention(q.float(), q, q)
    with pytest.raises(gpu.AttentionInputError, match="q: tensor is on the CPU"):
        gpu.attention(q.cpu(), q, q)
    # a tensor that requires grad is no error since the backward pass exists: the call is differentiable
    assert gpu.attention(q.clone().requires_grad_(), q, q).requires_grad
    with pytest.raises(gpu.AttentionInputError, match=r"out: \(1, 8, 2, 32\)"):
        gpu.attention(q, q, q, options=gpu.AttentionOptions(out=q[..., :32].contiguous()))


def test_input_errors_name_the_argument():
    from iosim import gpu

    cp = _cp()
    q = cp.zeros((1, 8, 2, 64), dtype=cp.float16)
    with pytest.raises(gpu.AttentionTypeError, match="q: dtype float32"):
        gpu.attention(q.astype(cp.float32), q, q)
    with pytest.raises(gpu.AttentionInputError, match="k: strides"):
        gpu.attention(q, cp.zeros((1, 2, 8, 64), dtype=cp.float16).transpose(0, 2, 1, 3), q)
    with pytest.raises(gpu.AttentionInputError, match="kv_heads=3"):
        k = cp.zeros((1, 8, 3, 64), dtype=cp.float16)
        gpu.attention(q, k, k)
    with pytest.raises(gpu.AttentionInputError, match="head_dim=48"):
        x = cp.zeros((1, 8, 2, 48), dtype=cp.float16)
        gpu.attention(x, x, x)
    with pytest.raises(gpu.AttentionInputError, match=r"\(block_q, block_kv\)=\(256, 256\)"):
        gpu.attention(q, q, q, options=gpu.AttentionOptions(block_q=256, block_kv=256))
    with pytest.raises(gpu.AttentionInputError, match="schedule='flash4'"):
        gpu.attention(q, q, q, schedule="flash4")
    with pytest.raises(gpu.AttentionTypeError, match="q: got list"):
        gpu.attention([1], q, q)


def test_naive_softmax_row_that_does_not_fit_shared_memory_says_needed_and_available_bytes():
    from iosim import gpu

    cp = _cp()
    q = cp.zeros((1, 1, 1, 64), dtype=cp.float16)
    k = cp.zeros((1, 120_000, 1, 64), dtype=cp.float16)
    with pytest.raises(gpu.SharedMemoryError, match=r"240000 B.*allows \d+ B"):
        gpu.attention(q, k, k, schedule="naive")


@pytest.mark.parametrize("causal", [False, True])
def test_block_trace_records_every_block_and_leaves_the_result_unchanged(causal):
    """The -DIOSIM_BLOCK_TRACE build (the L2 model's drift input) is as exact as the plain one, and every thread
    block leaves one record: start < end, a valid SM id, all inside the kernel's span."""
    from iosim import gpu

    cp = _cp()
    rng = seeded_rng()
    host, dev = rand_inputs(rng, 2, 1000, 777, 4, 2, 128, "float16")
    run(*dev, "float16", causal=causal)
    grid = gpu.last_launch().launches[0].grid
    n_blocks = grid[0] * grid[1] * grid[2]
    buf = cp.zeros(4 * n_blocks + 4, dtype=cp.uint64)  # one spare record: must stay untouched
    o, lse = run(*dev, "float16", causal=causal, block_trace=buf)
    check(o, lse, *reference(*host, causal), "float16", f"traced causal={causal}")
    rec = cp.asnumpy(buf).reshape(-1, 4)
    blocks, spare = rec[:n_blocks], rec[n_blocks]
    assert (blocks[:, 0] > 0).all() and (blocks[:, 1] > blocks[:, 0]).all(), "a block without a start/end"
    assert (blocks[:, 2] < cp.cuda.Device().attributes["MultiProcessorCount"]).all()
    assert blocks[:, 1].max() - blocks[:, 0].min() < 10**9, "records from one launch span under a second"
    assert (spare == 0).all()
    with pytest.raises(ValueError, match="uint64 array of at least"):
        gpu.attention(*dev, options=gpu.AttentionOptions(block_trace=cp.zeros(4, dtype=cp.uint64)))
    with pytest.raises(ValueError, match="supported by schedule='flash2' only"):
        gpu.attention(*dev, schedule="naive", options=gpu.AttentionOptions(block_trace=buf))


@pytest.mark.parametrize("causal", [False, True])
def test_naive_kernels_one_at_a_time_write_what_the_naive_call_writes(causal):
    """iosim.gpu.naive_kernels (what iosim calibrate rates times kernel by kernel): its three calls in order write,
    into a poisoned O, exactly the naive call's output (the same kernels on the same inputs)."""
    from iosim import gpu

    cp, rng, dt = _cp(), seeded_rng(), _np_dtype("bfloat16")
    q = cp.asarray(rng.standard_normal((2, 300, 8, 64)).astype(dt))
    k, v = (cp.asarray(rng.standard_normal((2, 420, 2, 64)).astype(dt)) for _ in range(2))
    runs, o = gpu.naive_kernels(q, k, v, causal=causal)
    o.fill(float("nan"))
    for run in runs:
        run()
    got, want = (cp.asnumpy(x) for x in (o, gpu.attention(q, k, v, causal=causal, schedule="naive")))
    assert not np.isnan(got.astype(np.float32)).any()
    assert (got.view(np.uint16) == want.view(np.uint16)).all()
