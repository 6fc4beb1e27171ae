"""iosim.gpu.attention_varlen (packed sequences) and sliding windows (``AttentionOptions(window=...)`` on
iosim.gpu.attention, ``window=`` on attention_varlen) on a real GPU, against a float64 reference computed on the host
sequence by sequence from the same inputs.

Every case draws fresh random inputs (seeded by the test's id, so a failure replays) and poisons the outputs (NaN)
before the kernel runs, so an element the kernel never writes fails. Tolerances are test_attention_gpu's (fp16 1e-3,
bf16 1e-2 relative Frobenius error; lse to the same tolerance relative to max(1, |lse|)); rows that see no key must
be exactly 0 with lse exactly -inf. Where the varlen kernel and the dense kernel compute the same tiles (equal
lengths, the same tile sizes), their outputs must be bit-identical.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from test_attention_gpu import TOL, _cp, _np_dtype, is_hopper, rel_err, seeded_rng

from iosim.launch import varlen as geo

pytestmark = pytest.mark.gpu

DTYPES = ("float16", "bfloat16")
GQA = {"1:1": (4, 4), "4:1": (8, 2)}  # (heads, kv_heads)


def visible(n: int, n_k: int, causal: bool, window) -> np.ndarray:
    """(n, n_k) bool: query i sees key j (bottom-right alignment, off = n_k - n)."""
    i, j, off = np.arange(n)[:, None], np.arange(n_k)[None, :], n_k - n
    ok = np.ones((n, n_k), dtype=bool)
    if causal:
        ok &= j <= i + off
    if window is not None:
        left, right = window
        if left is not None:
            ok &= j >= i + off - left
        if right is not None:
            ok &= j <= i + off + right
    return ok


def reference(q, k, v, causal, window, scale=None):
    """float64 O (n, H, d) and lse (H, n) of one sequence: q (n, H, d), k and v (n_k, H_kv, d)."""
    n, H, D = q.shape
    Hk = k.shape[1]
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    kk = np.repeat(k.astype(np.float64), H // Hk, axis=1)  # query head h reads kv head h // (H // Hk)
    vv = np.repeat(v.astype(np.float64), H // Hk, axis=1)
    s = np.einsum("ihd,jhd->hij", q.astype(np.float64), kk) * scale
    s = np.where(visible(n, k.shape[0], causal, window)[None], s, -np.inf)
    m = s.max(axis=-1, keepdims=True) if k.shape[0] else np.full((H, n, 1), -np.inf)
    m_safe = np.where(np.isfinite(m), m, 0.0)
    e = np.exp(s - m_safe)
    tot = e.sum(axis=-1, keepdims=True)
    p = np.divide(e, tot, out=np.zeros_like(e), where=tot > 0)
    with np.errstate(divide="ignore"):
        lse = np.where(tot[..., 0] > 0, m_safe[..., 0] + np.log(tot[..., 0]), -np.inf)
    return np.einsum("hij,jhd->ihd", p, vv), lse


def packed(rng, lens_q, lens_k, heads, d, dtype):
    """Host q, k, v of each sequence (rounded to the dtype) and the packed device arrays with cu_seqlens."""
    (H, Hk), dt = heads, _np_dtype(dtype)
    qs = [rng.standard_normal((n, H, d)).astype(np.float32).astype(dt) for n in lens_q]
    ks = [rng.standard_normal((n, Hk, d)).astype(np.float32).astype(dt) for n in lens_k]
    vs = [rng.standard_normal((n, Hk, d)).astype(np.float32).astype(dt) for n in lens_k]
    cp = _cp()
    cu = [cp.asarray(np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)) for lens in (lens_q, lens_k)]
    dev = [cp.asarray(np.concatenate(xs)) for xs in (qs, ks, vs)]
    return (qs, ks, vs), dev, cu


def run_varlen(dev, cu, **kw):
    """attention_varlen into NaN-poisoned outputs, synchronized; host float64 O (total_q, H, d), lse (H, total_q)."""
    from iosim import gpu

    cp = _cp()
    q = dev[0]
    out = cp.full(q.shape, np.nan, dtype=np.float32).astype(q.dtype)
    lse_out = cp.full((q.shape[1], q.shape[0]), np.nan, dtype=cp.float32)
    opts = gpu.AttentionOptions(out=out, lse_out=lse_out, block_q=kw.pop("block_q", None),
                                block_kv=kw.pop("block_kv", None))
    got = gpu.attention_varlen(*dev, gpu.varlen_batch(*cu), options=opts, **kw)
    assert got.o is out and got.lse is lse_out
    assert gpu.last_launch().schedule == kw.get("schedule", "flash2")
    cp.cuda.runtime.deviceSynchronize()  # surfaces asynchronous CUDA errors here
    return cp.asnumpy(out).astype(np.float64), cp.asnumpy(lse_out).astype(np.float64)


def check(o, lse, ref_o, ref_lse, dtype, what):
    """o (n, H, d), lse (H, n) of one sequence (or several, concatenated) against the reference."""
    assert not np.isnan(o).any(), f"{what}: NaN in O (unwritten, or NaN-producing) at {np.argwhere(np.isnan(o))[:3]}"
    assert not np.isnan(lse).any(), f"{what}: NaN in lse at {np.argwhere(np.isnan(lse))[:3]}"
    if np.linalg.norm(ref_o) > 0:
        err = rel_err(o, ref_o)
        assert err < TOL[dtype], f"{what}: relative error {err:.3g} >= {TOL[dtype]} ({dtype})"
    dead = ~np.isfinite(ref_lse)  # (H, n): rows that see no key
    assert np.array_equal(np.isneginf(lse), dead), f"{what}: lse = -inf exactly on the rows that see no key"
    assert (o.transpose(1, 0, 2)[dead] == 0).all(), f"{what}: rows that see no key must be exactly 0"
    if (~dead).any():
        lerr = np.abs(lse[~dead] - ref_lse[~dead]).max() / max(1.0, np.abs(ref_lse[~dead]).max())
        assert lerr < TOL[dtype], f"{what}: lse error {lerr:.3g}"


def check_varlen(host, lens_q, o, lse, dtype, causal, window, what):
    qs, ks, vs = host
    ends = np.cumsum([0, *lens_q])
    for b in range(len(lens_q)):
        ref_o, ref_lse = reference(qs[b], ks[b], vs[b], causal, window)
        rows = slice(int(ends[b]), int(ends[b + 1]))
        check(o[rows], lse[:, rows], ref_o, ref_lse, dtype, f"{what}, sequence {b} (n={lens_q[b]})")


# (lens_q, lens_k): self-attention prefill; keys longer (a chunk of queries after a prefix: chunked prefill); keys
# shorter (causal rows that see no key); empty sequences among them
BATCHES = {
    "prefill": ([1, 17, 128, 1000], [1, 17, 128, 1000]),
    "chunked": ([1, 17, 128, 1000], [33, 17, 400, 1024]),
    "short-keys": ([1000, 128, 17], [999, 1, 16]),
    "empty": ([0, 65, 0, 300, 1], [5, 65, 0, 300, 0]),
}


def need_schedule(schedule: str) -> None:
    if schedule == "flash3" and not is_hopper():
        pytest.skip("schedule='flash3' needs a Hopper GPU (sm_90)")


@pytest.mark.parametrize("batch", BATCHES, ids=str)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("gqa", GQA)
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("schedule", ["flash2", "flash3"])
def test_varlen_equals_float64_reference_per_sequence(batch, causal, gqa, D, dtype, schedule):
    need_schedule(schedule)
    lens_q, lens_k = BATCHES[batch]
    host, dev, cu = packed(seeded_rng(), lens_q, lens_k, GQA[gqa], D, dtype)
    o, lse = run_varlen(dev, cu, causal=causal, schedule=schedule)
    check_varlen(host, lens_q, o, lse, dtype, causal, None, f"{schedule} {batch} causal={causal} {gqa} d={D}")


@pytest.mark.parametrize("batch", BATCHES, ids=str)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
def test_flash3_varlen_at_head_dim_256_equals_float64_reference(batch, causal, dtype):
    need_schedule("flash3")
    lens_q, lens_k = BATCHES[batch]
    host, dev, cu = packed(seeded_rng(), lens_q, lens_k, GQA["4:1"], 256, dtype)
    o, lse = run_varlen(dev, cu, causal=causal, schedule="flash3")
    check_varlen(host, lens_q, o, lse, dtype, causal, None, f"flash3 {batch} causal={causal} d=256")


@pytest.mark.parametrize("causal", [False, True])
def test_flash3_varlen_of_many_sequences_more_tiles_than_sms_equals_float64_reference(causal):
    need_schedule("flash3")
    rng = seeded_rng()
    lens = [int(n) for n in rng.integers(0, 700, size=48)]  # ~150 Q tiles x 8 heads: several rounds of the grid
    host, dev, cu = packed(rng, lens, lens, GQA["4:1"], 128, "bfloat16")
    o, lse = run_varlen(dev, cu, causal=causal, schedule="flash3")
    check_varlen(host, lens, o, lse, "bfloat16", causal, None, f"flash3 48 sequences causal={causal}")


# windows: the diagonal alone, small ones, one tile wide, wider than every sequence, looking ahead, one-sided
WINDOWS = [(0, 0), (1, 0), (16, 0), (127, 0), (128, 0), (5000, 0), (0, 1), (5, 7), (64, 64), (0, None), (None, 3),
           (300, None)]


@pytest.mark.parametrize("window", WINDOWS, ids=str)
@pytest.mark.parametrize("shape", [(2, 300, 300), (1, 257, 700), (1, 700, 257)], ids=lambda s: "B{}-N{}-Nk{}".format(*s))
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("schedule", ["flash2", "flash3"])
def test_dense_window_equals_float64_reference(window, shape, D, dtype, schedule):
    from iosim import gpu

    if schedule == "flash3" and not is_hopper():
        pytest.skip("schedule='flash3' needs a Hopper GPU (sm_90)")
    B, N, Nk = shape
    rng = seeded_rng()
    dt, cp = _np_dtype(dtype), _cp()
    q = rng.standard_normal((B, N, 8, D)).astype(np.float32).astype(dt)
    k = rng.standard_normal((B, Nk, 2, D)).astype(np.float32).astype(dt)
    v = rng.standard_normal((B, Nk, 2, D)).astype(np.float32).astype(dt)
    out = cp.full(q.shape, np.nan, dtype=np.float32).astype(q.dtype)
    lse_out = cp.full((B, 8, N), np.nan, dtype=cp.float32)
    causal = window[1] == 0  # a causal window: the same as right = 0 without causal (checked below)
    opts = gpu.AttentionOptions(out=out, lse_out=lse_out, window=window)
    gpu.attention(cp.asarray(q), cp.asarray(k), cp.asarray(v), schedule=schedule, causal=causal, return_lse=True,
                  options=opts)
    cp.cuda.runtime.deviceSynchronize()
    assert gpu.last_launch().window == window and gpu.last_launch().schedule == schedule
    o, lse = cp.asnumpy(out).astype(np.float64), cp.asnumpy(lse_out).astype(np.float64)
    for b in range(B):
        ref_o, ref_lse = reference(q[b], k[b], v[b], causal, window)
        check(o[b], lse[b], ref_o, ref_lse, dtype, f"window={window} batch entry {b}")


@pytest.mark.parametrize("window", [(0, 0), (31, 0), (256, 0), (2000, 0), (100, 50), (0, 5)], ids=str)
@pytest.mark.parametrize("batch", ["prefill", "chunked", "empty"], ids=str)
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("schedule", ["flash2", "flash3"])
def test_varlen_window_equals_float64_reference(window, batch, D, dtype, schedule):
    need_schedule(schedule)
    lens_q, lens_k = BATCHES[batch]
    causal = window[1] == 0
    host, dev, cu = packed(seeded_rng(), lens_q, lens_k, GQA["4:1"], D, dtype)
    o, lse = run_varlen(dev, cu, causal=causal, window=window, schedule=schedule)
    check_varlen(host, lens_q, o, lse, dtype, causal, window, f"{schedule} {batch} window={window} d={D}")


def _every_tile():
    """(head_dim, (block_q, block_kv), local) of every varlen instantiation the library launches."""
    return [(d, t, local) for local, table in ((False, geo.FLASH_VARLEN_TILES), (True, geo.FLASH_LOCAL_TILES))
            for d, tiles in table.items() for t in tiles]


@pytest.mark.parametrize("d,tiles,local", _every_tile(), ids=lambda x: str(x))
def test_every_varlen_tile_equals_float64_reference(d, tiles, local):
    lens_q, lens_k = [1, 77, 300], [40, 77, 333]
    window = (60, 0) if local else None
    host, dev, cu = packed(seeded_rng(), lens_q, lens_k, GQA["4:1"], d, "bfloat16")
    o, lse = run_varlen(dev, cu, causal=True, window=window, block_q=tiles[0], block_kv=tiles[1])
    check_varlen(host, lens_q, o, lse, "bfloat16", True, window, f"d={d} tiles={tiles} window={window}")


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("D", [64, 128])
def test_varlen_of_equal_lengths_is_bit_identical_to_the_dense_kernel(causal, D):
    from iosim import gpu

    B, N, Nk, (H, Hk) = 3, 200, 333, GQA["4:1"]
    rng, cp = seeded_rng(), _cp()
    q, k, v = (cp.asarray(rng.standard_normal(s).astype(np.float32)).astype(cp.float16)
               for s in ((B, N, H, D), (B, Nk, Hk, D), (B, Nk, Hk, D)))
    o_dense, lse_dense = gpu.attention(q, k, v, causal=causal, return_lse=True)
    cu = (np.arange(B + 1) * N, np.arange(B + 1) * Nk)
    o, lse = gpu.attention_varlen(q.reshape(B * N, H, D), k.reshape(B * Nk, Hk, D), v.reshape(B * Nk, Hk, D), cu,
                                  causal=causal)
    assert bool((o.reshape(B, N, H, D) == o_dense).all()), "varlen O differs from the dense kernel's"
    assert bool((lse.reshape(H, B, N).transpose(1, 0, 2) == lse_dense).all()), "varlen lse differs"


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("D", [64, 128, 256])
def test_flash3_varlen_of_equal_lengths_is_bit_identical_to_the_dense_flash3_kernel(causal, D):
    from iosim import gpu

    need_schedule("flash3")
    B, N, Nk, (H, Hk) = 3, 200, 333, GQA["4:1"]
    rng, cp = seeded_rng(), _cp()
    q, k, v = (cp.asarray(rng.standard_normal(s).astype(np.float32)).astype(cp.float16)
               for s in ((B, N, H, D), (B, Nk, Hk, D), (B, Nk, Hk, D)))
    o_dense, lse_dense = gpu.attention(q, k, v, causal=causal, return_lse=True, schedule="flash3")
    cu = (np.arange(B + 1) * N, np.arange(B + 1) * Nk)
    o, lse = gpu.attention_varlen(q.reshape(B * N, H, D), k.reshape(B * Nk, Hk, D), v.reshape(B * Nk, Hk, D), cu,
                                  causal=causal, schedule="flash3")
    assert gpu.last_launch().schedule == "flash3" and ", true>" in gpu.last_launch().launches[0].kernel
    assert bool((o.reshape(B, N, H, D) == o_dense).all()), "flash3 varlen O differs from the dense flash3 kernel's"
    assert bool((lse.reshape(H, B, N).transpose(1, 0, 2) == lse_dense).all()), "flash3 varlen lse differs"


def test_flash3_varlen_refuses_other_tiles_and_head_dims_with_one_clear_error():
    from iosim import gpu

    need_schedule("flash3")
    cp = _cp()
    q = cp.zeros((10, 4, 32), dtype=cp.float16)
    with pytest.raises(gpu.AttentionInputError, match=r"head_dim=32 with schedule='flash3': expected one of"):
        gpu.attention_varlen(q, q, q, ([0, 10], [0, 10]), schedule="flash3")
    q = cp.zeros((10, 4, 64), dtype=cp.float16)
    with pytest.raises(gpu.AttentionInputError, match=r"with schedule='flash3': its tiles are fixed"):
        gpu.attention_varlen(q, q, q, ([0, 10], [0, 10]), schedule="flash3",
                             options=gpu.AttentionOptions(block_q=64, block_kv=64))


def test_a_causal_window_unbounded_on_the_left_is_the_causal_kernel_bit_for_bit():
    from iosim import gpu

    rng, cp = seeded_rng(), _cp()
    q, k, v = (cp.asarray(rng.standard_normal((2, 150, 4, 64)).astype(np.float32)).astype(cp.float16)
               for _ in range(3))
    o_causal = gpu.attention(q, k, v, causal=True)
    o_window = gpu.attention(q, k, v, options=gpu.AttentionOptions(window=(None, 0)))
    assert "true>" in gpu.last_launch().launches[0].kernel  # the dense causal kernel ran
    assert bool((o_causal == o_window).all())
    # a window wider than the sequence, through the Local kernel: the same values (to rounding: other tiles)
    o_wide = gpu.attention(q, k, v, options=gpu.AttentionOptions(window=(10**6, 0)))
    assert ", true, true>" in gpu.last_launch().launches[0].kernel
    assert rel_err(cp.asnumpy(o_wide).astype(np.float64), cp.asnumpy(o_causal).astype(np.float64)) < TOL["float16"]


def test_torch_tensors_in_torch_tensors_out_on_torchs_stream():
    torch = pytest.importorskip("torch")
    from iosim import gpu

    lens = [3, 130, 64]
    cu = torch.tensor(np.concatenate([[0], np.cumsum(lens)]), dtype=torch.int32, device="cuda")
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(sum(lens), 8, 64, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(sum(lens), 2, 64, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(sum(lens), 2, 64, device="cuda", dtype=torch.bfloat16, generator=g)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        o, lse = gpu.attention_varlen(q, k, v, (cu, cu), causal=True)
    stream.synchronize()
    assert isinstance(o, torch.Tensor) and o.shape == q.shape and o.dtype == q.dtype
    assert isinstance(lse, torch.Tensor) and lse.shape == (8, sum(lens)) and lse.dtype == torch.float32
    ends = np.cumsum([0, *lens])
    for b in range(len(lens)):
        s = slice(int(ends[b]), int(ends[b + 1]))
        ref = torch.nn.functional.scaled_dot_product_attention(
            q[s].transpose(0, 1).double(), k[s].transpose(0, 1).double().repeat_interleave(4, 0),
            v[s].transpose(0, 1).double().repeat_interleave(4, 0), is_causal=True).transpose(0, 1)
        err = float((o[s].double() - ref).norm() / ref.norm())
        assert err < TOL["bfloat16"], f"sequence {b}: relative error {err:.3g}"


def test_a_varlen_batch_on_another_device_and_lengths_that_do_not_add_up_are_errors():
    from iosim import gpu

    cp = _cp()
    q = cp.zeros((10, 4, 64), dtype=cp.float16)
    k = cp.zeros((12, 4, 64), dtype=cp.float16)
    batch = gpu.varlen_batch([0, 4, 10], [0, 6, 12])
    with pytest.raises(gpu.AttentionInputError, match=r"cu_seqlens_k\[-1\] = 12; expected 11"):
        gpu.attention_varlen(q, k[:11], k[:11], batch)
    with pytest.raises(gpu.AttentionInputError, match="a VarlenBatch on device"):
        gpu.attention_varlen(q, k, k, dataclasses.replace(batch, device=batch.device + 1))
