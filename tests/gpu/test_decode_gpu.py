"""iosim.gpu.decode (kernels/flash_decode.cu) on a real GPU against a float64 reference computed on the host.

Every case draws fresh random inputs (seeded by the test's id, so a failure replays), poisons the outputs (NaN)
before the kernels run, and poisons the split kernel's partial outputs too (flash_decode.POISON_PARTIALS), so an
element nobody writes fails. The cache is poisoned as well: every slot past a sequence's length, and every page
no sequence owns, holds NaN, and block-table entries past a sequence's last page are -1, so a kernel that reads a
key it must not read, or a page it was not given, returns NaN. Pages are assigned in a shuffled order.

Tolerances are test_attention_gpu's (fp16 1e-3, bf16 1e-2 relative Frobenius error; P is rounded to the input
dtype once, as in the flash kernels); lse to the same tolerance relative to max(1, |lse|); rows that see no key
(q_len > n_b) must be exactly 0 with lse exactly -inf.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from test_attention_gpu import TOL, _cp, _np_dtype, rel_err, seeded_rng

from iosim.gpu import flash_decode

pytestmark = pytest.mark.gpu

DTYPES = ("float16", "bfloat16")
GQA = {"1:1": (4, 4), "4:1": (8, 2), "8:1": (16, 2)}  # (heads, kv_heads)
LAYOUTS = ("contiguous", "page16", "page64", "page256")


@pytest.fixture(autouse=True)
def _poison_partials(monkeypatch):
    monkeypatch.setattr(flash_decode, "POISON_PARTIALS", True)


def make_case(rng, lens, q_len, heads, d, dtype, layout, amp=1.0):
    """Host values (q, per-sequence K and V, all rounded to the dtype) and the device arguments of decode():
    q, k_cache, v_cache, seqlens_k (CuPy int32) and block_table (CuPy int32 or None); heads = (query heads,
    kv heads)."""
    (heads, kv_heads), cp, dt = heads, _cp(), _np_dtype(dtype)
    B = len(lens)
    q = (rng.standard_normal((B, q_len, heads, d)) * amp).astype(np.float32).astype(dt)
    ks = [(rng.standard_normal((n, kv_heads, d)) * amp).astype(np.float32).astype(dt) for n in lens]
    vs = [rng.standard_normal((n, kv_heads, d)).astype(np.float32).astype(dt) for n in lens]
    if layout == "contiguous":
        cap = max(max(lens), 1) + 3  # a few slots past the longest: all NaN
        kc = np.full((B, cap, kv_heads, d), np.nan, dtype=dt)
        vc = kc.copy()
        for b, n in enumerate(lens):
            kc[b, :n], vc[b, :n] = ks[b], vs[b]
        table = None
    else:
        page = int(layout.removeprefix("page"))
        used = [-(-n // page) for n in lens]
        num_pages = sum(used) + 3  # three pages no sequence owns
        order = rng.permutation(num_pages)  # pages in any order
        table = np.full((B, max(used) + 1), -1, dtype=np.int64)  # -1 past every sequence's last page
        kc = np.full((num_pages, page, kv_heads, d), np.nan, dtype=dt)
        vc = kc.copy()
        nxt = 0
        for b, n in enumerate(lens):
            for p in range(used[b]):
                phys = int(order[nxt])
                nxt += 1
                table[b, p] = phys
                rows = slice(p * page, min(n, (p + 1) * page))
                kc[phys, : rows.stop - rows.start], vc[phys, : rows.stop - rows.start] = ks[b][rows], vs[b][rows]
    dev = dict(q=cp.asarray(q), k=cp.asarray(kc), v=cp.asarray(vc), lens=cp.asarray(np.array(lens, np.int32)),
               table=None if table is None else cp.asarray(table.astype(np.int32)))
    return (q, ks, vs), dev


def reference(q, ks, vs, scale=None):
    """float64 O (B, L, H, d) and lse (B, H, L): token i of sequence b sees keys 0 .. n_b - L + i."""
    B, L, H, D = q.shape
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    o, lse = np.zeros((B, L, H, D)), np.full((B, H, L), -np.inf)
    for b in range(B):
        n, Hk = ks[b].shape[0], ks[b].shape[1]
        k = np.repeat(ks[b].astype(np.float64), H // Hk, axis=1)  # query head h reads kv head h // (H // Hk)
        v = np.repeat(vs[b].astype(np.float64), H // Hk, axis=1)
        s = np.einsum("lhd,nhd->hln", q[b].astype(np.float64), k) * scale  # (H, L, n)
        visible = np.arange(n)[None, :] <= (n - L + np.arange(L))[:, None]  # (L, n)
        s = np.where(visible[None], s, -np.inf)
        m = s.max(axis=-1, keepdims=True) if n else np.full((H, L, 1), -np.inf)
        m_safe = np.where(np.isfinite(m), m, 0.0)
        e = np.exp(s - m_safe)
        tot = e.sum(axis=-1, keepdims=True)
        p = np.divide(e, tot, out=np.zeros_like(e), where=tot > 0)
        o[b] = np.einsum("hln,nhd->lhd", p, v)
        with np.errstate(divide="ignore"):
            lse[b] = np.where(tot[..., 0] > 0, m_safe[..., 0] + np.log(tot[..., 0]), -np.inf)
    return o, lse


def run(dev, **kw):
    """decode() into NaN-poisoned outputs, synchronized (asynchronous CUDA errors surface here); host float64."""
    from iosim import gpu

    cp = _cp()
    q = dev["q"]
    B, L, H, _ = q.shape
    o = cp.full(q.shape, np.nan, dtype=np.float32).astype(q.dtype)
    lse = cp.full((B, H, L), np.nan, dtype=cp.float32)
    got = gpu.decode(q, dev["k"], dev["v"], seqlens_k=dev["lens"], block_table=dev["table"], out=(o, lse), **kw)
    assert got.o is o and got.lse is lse
    cp.cuda.runtime.deviceSynchronize()
    return cp.asnumpy(o).astype(np.float64), cp.asnumpy(lse).astype(np.float64)


def check(o, lse, ref_o, ref_lse, dtype, what):
    assert not np.isnan(o).any(), f"{what}: NaN in O (unwritten, or a key/page read that must not be) at " \
                                  f"{np.argwhere(np.isnan(o))[:3].tolist()}"
    assert not np.isnan(lse).any(), f"{what}: NaN in lse at {np.argwhere(np.isnan(lse))[:3].tolist()}"
    err = rel_err(o, ref_o)
    assert err < TOL[dtype], f"{what}: relative error {err:.3g} >= {TOL[dtype]} ({dtype})"
    dead = ~np.isfinite(ref_lse)  # (B, H, L): rows that see no key
    assert np.array_equal(np.isneginf(lse), dead), f"{what}: lse = -inf exactly on the rows that see no key"
    assert (o.transpose(0, 2, 1, 3)[dead] == 0).all(), f"{what}: rows that see no key must be exactly 0"
    if (~dead).any():
        lerr = np.abs(lse[~dead] - ref_lse[~dead]).max() / max(1.0, np.abs(ref_lse[~dead]).max())
        assert lerr < TOL[dtype], f"{what}: lse error {lerr:.3g}"


def ragged_lengths(rng):
    """1 (with q_len > 1: rows that see no key), and two odd lengths (never a multiple of a tile or a page), one
    spanning several splits."""
    return [1, 2 * int(rng.integers(20, 160)) + 1, 2 * int(rng.integers(500, 700)) + 1]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("gqa", list(GQA))
@pytest.mark.parametrize("q_len", [1, 2, 4, 16])
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("dtype", DTYPES)
def test_decode_equals_float64_reference(dtype, d, q_len, gqa, layout):
    rng = seeded_rng()
    H, Hk = GQA[gqa]
    lens = ragged_lengths(rng)
    host, dev = make_case(rng, lens, q_len, (H, Hk), d, dtype, layout)
    o, lse = run(dev)
    check(o, lse, *reference(*host), dtype, f"{layout} {gqa} q_len={q_len} d={d} lens={lens}")


@pytest.mark.parametrize("splits", [1, 2, 7, 128])
@pytest.mark.parametrize("layout", ["contiguous", "page16"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_forced_splits_give_the_same_result(dtype, layout, splits):
    from iosim import gpu

    rng = seeded_rng()
    lens = [1, 501, 3001]
    host, dev = make_case(rng, lens, 4, (16, 2), 128, dtype, layout)
    o, lse = run(dev, splits=splits)
    check(o, lse, *reference(*host), dtype, f"splits={splits}")
    plan = gpu.plan_decode(dev["q"], dev["k"], dev["v"], seqlens_k=dev["lens"], block_table=dev["table"],
                           splits=splits)
    # 3001 keys: 188 tiles of 16; forced 128 -> chunks of 32 keys -> 94 splits
    assert plan.splits == {1: 1, 2: 2, 7: 7, 128: 94}[splits]
    assert len(plan.launches) == (1 if splits == 1 else 2)
    assert plan.launches[0].grid == (1, plan.splits, 3 * 2)  # 32 rows: one block of 2 stripes


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_chosen_splits_split_a_long_sequence_as_the_simulator_does(dtype):
    from iosim import AttentionProblem, gpu, simulate

    rng = seeded_rng()
    host, dev = make_case(rng, [20000], 1, (32, 4), 128, dtype, "page64")
    plan = gpu.plan_decode(dev["q"], dev["k"], dev["v"], seqlens_k=dev["lens"], block_table=dev["table"])
    assert plan.splits > 1
    if plan.split_rule.startswith("time model ("):  # this GPU has a calibrated built-in profile
        profile = plan.split_rule.removeprefix("time model (").removesuffix(")")
        p = AttentionProblem(batch=1, heads=32, kv_heads=4, seq_len=1, kv_len=dev["table"].shape[1] * 64,
                             head_dim=128, dtype={"float16": "fp16", "bfloat16": "bf16"}[dtype])
        r = simulate("flash-decoding", p, profile, kernel="iosim-decode", kv_lens=[20000], page_size=64)
        assert (r.tiles.splits, r.tiles.chunk) == (plan.splits, plan.split.chunk)
    else:
        assert plan.split_rule == "occupancy" and plan.split.chunk >= 256
    o, lse = run(dev)
    check(o, lse, *reference(*host), dtype, f"{plan.split_rule} splits={plan.splits}")


@pytest.mark.parametrize("layout", ["contiguous", "page16"])
def test_sequences_of_no_keys_give_zero_and_minus_inf(layout):
    rng = seeded_rng()
    lens = [0, 37, 0]
    host, dev = make_case(rng, lens, 2, (8, 2), 64, "float16", layout)
    for splits in (None, 1, 3):
        o, lse = run(dev, splits=splits)
        ref_o, ref_lse = reference(*host)
        assert np.isneginf(ref_lse[[0, 2]]).all()
        check(o, lse, ref_o, ref_lse, "float16", f"zero-length splits={splits}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("splits", [1, 5])
def test_large_logits(dtype, splits):
    # inputs scaled by 30: logits ~ 1e3, where an exp without the running max overflows; the splits' lse merge too
    rng = seeded_rng()
    host, dev = make_case(rng, [700, 1300], 2, (8, 2), 128, dtype, "page64", amp=30.0)
    ref_o, ref_lse = reference(*host)
    assert np.abs(ref_lse[np.isfinite(ref_lse)]).max() > 500
    o, lse = run(dev, splits=splits)
    check(o, lse, ref_o, ref_lse, dtype, "large logits")


def test_scale_is_applied():
    rng = seeded_rng()
    host, dev = make_case(rng, [300, 77], 1, (8, 8), 64, "float16", "contiguous")
    o, lse = run(dev, scale=0.05)
    check(o, lse, *reference(*host, scale=0.05), "float16", "scale=0.05")


def test_a_plan_runs_again_on_new_values_of_the_same_layout():
    from iosim import gpu

    cp = _cp()
    rng = seeded_rng()
    host1, dev1 = make_case(rng, [100, 900], 1, (16, 2), 128, "bfloat16", "page16")
    plan = gpu.plan_decode(dev1["q"], dev1["k"], dev1["v"], seqlens_k=dev1["lens"], block_table=dev1["table"])
    for _ in range(2):
        o, lse = plan.run(dev1["q"], dev1["k"], dev1["v"])  # outputs allocated: CuPy in, CuPy out
        cp.cuda.runtime.deviceSynchronize()
        assert isinstance(o, cp.ndarray) and o.dtype == dev1["q"].dtype and lse.dtype == cp.float32
        check(cp.asnumpy(o).astype(np.float64), cp.asnumpy(lse).astype(np.float64), *reference(*host1),
              "bfloat16", "plan run")
    # new values in the same pages: another layer of the same batch
    q2 = (rng.standard_normal(dev1["q"].shape)).astype(np.float32).astype(_np_dtype("bfloat16"))
    o, lse = plan.run(cp.asarray(q2), dev1["k"], dev1["v"])
    cp.cuda.runtime.deviceSynchronize()
    check(cp.asnumpy(o).astype(np.float64), cp.asnumpy(lse).astype(np.float64), *reference(q2, *host1[1:]),
          "bfloat16", "plan run, new q")
    with pytest.raises(gpu.AttentionInputError, match="expected the plan's"):
        plan.run(dev1["q"][:, :, :8].copy(), dev1["k"], dev1["v"])


def test_out_pair_must_fit():
    from iosim import gpu

    cp = _cp()
    rng = seeded_rng()
    _, dev = make_case(rng, [40], 1, (4, 4), 64, "float16", "contiguous")
    with pytest.raises(gpu.AttentionInputError, match=r"out: lse \(1, 1, 4\) float32"):
        gpu.decode(dev["q"], dev["k"], dev["v"], out=(None, cp.zeros((1, 1, 4), cp.float32)))
    with pytest.raises(gpu.AttentionInputError, match="out: o"):
        gpu.decode(dev["q"], dev["k"], dev["v"], out=(cp.zeros(dev["q"].shape, cp.float32), None))


def test_device_arrays_are_checked_like_host_ones():
    from iosim import gpu

    cp = _cp()
    rng = seeded_rng()
    _, dev = make_case(rng, [40, 70], 1, (8, 2), 64, "float16", "page16")
    bad = dev["table"].copy()
    bad[1, 0] = 10_000
    with pytest.raises(gpu.AttentionInputError, match=r"block_table\[1, 0\] = 10000; expected a page of k_cache"):
        gpu.decode(dev["q"], dev["k"], dev["v"], seqlens_k=dev["lens"], block_table=bad)
    with pytest.raises(gpu.AttentionInputError, match=r"seqlens_k\[0\] = 1000; expected 0 to"):
        gpu.decode(dev["q"], dev["k"], dev["v"], seqlens_k=cp.asarray([1000, 70], cp.int32), block_table=dev["table"])
    with pytest.raises(gpu.AttentionInputError, match="page_size=24"):
        k = cp.zeros((8, 24, 2, 64), cp.float16)
        gpu.decode(dev["q"], k, k, seqlens_k=[1, 1], block_table=cp.zeros((2, 1), cp.int32))
    with pytest.raises(gpu.AttentionInputError, match="splits=0"):
        gpu.decode(dev["q"], dev["k"], dev["v"], seqlens_k=dev["lens"], block_table=dev["table"], splits=0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("q_len", [1, 4])
def test_torch_tensors_in_and_agreement_with_torch_sdpa(dtype, q_len):
    torch = pytest.importorskip("torch", reason="torch is not importable: the SDPA comparison needs it")
    import torch.nn.functional as F

    from iosim import gpu

    tdt = getattr(torch, dtype)
    B, N, H, Hk, D = 3, 1000, 32, 4, 128
    q = torch.randn(B, q_len, H, D, device="cuda", dtype=tdt)
    k = torch.randn(B, N, Hk, D, device="cuda", dtype=tdt)  # contiguous cache, every sequence full
    v = torch.randn(B, N, Hk, D, device="cuda", dtype=tdt)
    o, lse = gpu.decode(q, k, v)  # torch in, torch out
    assert isinstance(o, torch.Tensor) and o.dtype == tdt and o.shape == q.shape
    assert isinstance(lse, torch.Tensor) and lse.dtype == torch.float32 and lse.shape == (B, H, q_len)
    host = [x.float().cpu().numpy() for x in (q, k, v)]
    ref_o, _ = reference(host[0], list(host[1]), list(host[2]))
    # torch's is_causal is top-left aligned: pass the bottom-right mask of the new tokens
    mask = torch.arange(N, device="cuda")[None, :] <= (N - q_len + torch.arange(q_len, device="cuda"))[:, None]
    t = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask,
                                       enable_gqa=True).transpose(1, 2)
    err_ours, err_torch = rel_err(o.double().cpu().numpy(), ref_o), rel_err(t.double().cpu().numpy(), ref_o)
    assert err_ours < TOL[dtype] and rel_err(o.double().cpu().numpy(), t.double().cpu().numpy()) < 2 * TOL[dtype], \
        (err_ours, err_torch)


def test_a_torch_call_runs_in_order_on_torchs_current_stream():
    torch = pytest.importorskip("torch", reason="torch is not importable")
    from iosim import gpu

    side = torch.cuda.Stream()
    with torch.cuda.stream(side):  # inputs made, the call made and its output read on a side stream, no sync
        q = torch.randn(4, 1, 32, 128, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(4, 4096, 4, 128, device="cuda", dtype=torch.bfloat16)
        v = torch.randn_like(k)
        o, _ = gpu.decode(q, k, v)
        ref = torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                                               v.transpose(1, 2), enable_gqa=True)
        diff = (o.float() - ref.transpose(1, 2).float()).abs().max()
    side.synchronize()
    assert diff.item() < 2e-2


@pytest.mark.parametrize("splits", [1, 3])
def test_a_plan_runs_under_cuda_graph_capture(splits):
    """A plan's calls allocate nothing (its partials are its own) and launch on torch's stream, the combine as the
    split kernel's programmatic dependent on sm_90: a torch CUDA graph captures a call, and its replay on new values
    of q and the cache gives what an eager call gives, bit for bit."""
    torch = pytest.importorskip("torch", reason="torch is not importable")
    from iosim import gpu

    q = torch.randn(2, 1, 32, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(2, 4096, 4, 128, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    plan = gpu.plan_decode(q, k, v, splits=splits)
    out = (torch.empty_like(q), torch.empty(2, 32, 1, device="cuda", dtype=torch.float32))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up (compile, upload) off the capture
        plan.run(q, k, v, out=out)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        plan.run(q, k, v, out=out)
    for x in (q, k, v):
        x.copy_(torch.randn_like(x))
    out[0].fill_(float("nan"))
    out[1].fill_(float("nan"))
    graph.replay()
    o, lse = plan.run(q, k, v)
    torch.cuda.synchronize()
    assert plan.splits == splits
    assert torch.equal(out[0], o) and torch.equal(out[1], lse)
