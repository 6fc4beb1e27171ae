"""iosim.gpu.decode on an fp8 (e4m3) KV cache, and iosim.gpu.quantize_kv_fp8, on a real GPU.

The decode cases are test_decode_gpu's (fresh random inputs, NaN-poisoned outputs and partials, pages in a shuffled
order, block-table entries past a sequence's last page -1), with the cache quantized on the host: one scale per kv
head (amax / 448), e4m3 bits by ml_dtypes (round to nearest even). The reference is float64 on the dequantized cache,
the values the kernel computes on (its e4m3 -> fp16/bf16 conversion is exact), so the tolerances are the 16-bit
cache's. An e4m3 byte has no NaN the kernel keeps, so the poison of an fp8 cache is its largest value (0x7e, 448):
a slot or page read that must not be swamps its row's softmax and output, which the tolerance catches.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from test_attention_gpu import TOL, _cp, rel_err, seeded_rng
from test_decode_gpu import check, make_case, ragged_lengths, reference

from iosim.gpu import flash_decode

pytestmark = pytest.mark.gpu

E4M3_MAX = 448.0
POISON = 0x7E  # e4m3 448: what every slot no sequence owns holds


@pytest.fixture(autouse=True)
def _poison_partials(monkeypatch):
    monkeypatch.setattr(flash_decode, "POISON_PARTIALS", True)


def quantize_case(host, dev):
    """The case's cache as e4m3 bits (CuPy uint8, poison where the 16-bit cache held NaN), its (k_scale, v_scale)
    per kv head, and the per-sequence dequantized K and V for the reference."""
    cp = _cp()
    _, ks, vs = host
    out = {}
    for name, seqs in (("k", ks), ("v", vs)):
        amax = np.max([np.abs(s.astype(np.float32)).max(axis=(0, 2)) for s in seqs if len(s)], axis=0)
        scale = np.where(amax > 0, amax / np.float32(E4M3_MAX), 1).astype(np.float32)  # (kv_heads,)
        cache = cp.asnumpy(dev[name]).astype(np.float32)
        bits = np.clip(cache / scale[:, None], -E4M3_MAX, E4M3_MAX).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
        bits[np.isnan(cache)] = POISON
        deq = [(np.clip(s.astype(np.float32) / scale[:, None], -E4M3_MAX, E4M3_MAX).astype(ml_dtypes.float8_e4m3fn)
                .astype(np.float64) * scale[:, None]) for s in seqs]
        out[name] = (cp.asarray(bits), scale, deq)
    from iosim import gpu

    dev8 = dict(dev, k=gpu.QuantizedKV(out["k"][0], out["k"][1]), v=gpu.QuantizedKV(out["v"][0], out["v"][1]))
    return dev8, (out["k"][1], out["v"][1]), (out["k"][2], out["v"][2])


def run8(dev, **kw):
    from test_decode_gpu import run

    return run(dev, **kw)


@pytest.mark.parametrize("layout", ["contiguous", "page16", "page256"])
@pytest.mark.parametrize("gqa", ["1:1", "8:1"])
@pytest.mark.parametrize("q_len", [1, 16])
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_fp8_cache_equals_float64_on_the_dequantized_cache(dtype, d, q_len, gqa, layout):
    from test_decode_gpu import GQA

    rng = seeded_rng()
    lens = ragged_lengths(rng)
    host, dev = make_case(rng, lens, q_len, GQA[gqa], d, dtype, layout)
    dev8, _, (kd, vd) = quantize_case(host, dev)
    o, lse = run8(dev8)
    check(o, lse, *reference(host[0], kd, vd), dtype, f"fp8 {layout} {gqa} q_len={q_len} d={d} lens={lens}")


@pytest.mark.parametrize("splits", [1, 7])
def test_fp8_cache_across_splits_and_large_logits(splits):
    # v_scale reaches the split partials before the combine; logits ~ 1e3 keep the running max honest
    rng = seeded_rng()
    host, dev = make_case(rng, [700, 1300], 2, (16, 2), 128, "bfloat16", "page64", amp=30.0)
    dev8, _, (kd, vd) = quantize_case(host, dev)
    o, lse = run8(dev8, splits=splits)
    check(o, lse, *reference(host[0], kd, vd), "bfloat16", f"fp8 splits={splits}")


def test_scales_are_checked_and_a_plan_takes_another_layers_scales():
    from iosim import gpu

    cp = _cp()
    rng = seeded_rng()
    host, dev = make_case(rng, [200, 90], 1, (8, 2), 64, "float16", "page16")
    dev8, (ks, vs), (kd, vd) = quantize_case(host, dev)
    k8, v8 = dev8["k"].values, dev8["v"].values
    args = dict(seqlens_k=dev8["lens"], block_table=dev8["table"])
    with pytest.raises(gpu.AttentionInputError, match="k_cache: e4m3 values without their scale"):
        gpu.decode(dev8["q"], k8, dev8["v"], **args)
    with pytest.raises(gpu.AttentionInputError, match=r"v_cache.scale\[1\] = -1.0; expected a finite scale > 0"):
        gpu.decode(dev8["q"], dev8["k"], gpu.QuantizedKV(v8, [1.0, -1.0]), **args)
    with pytest.raises(gpu.AttentionInputError, match="k_cache: a QuantizedKV of float16 values"):
        gpu.decode(dev["q"], gpu.QuantizedKV(dev["k"], 1.0), dev["v"], **args)
    with pytest.raises(gpu.AttentionTypeError, match="v_cache: dtype float16 while k_cache is fp8"):
        gpu.decode(dev8["q"], dev8["k"], dev["v"], **args)
    plan = gpu.plan_decode(dev8["q"], gpu.QuantizedKV(k8, 1.0), gpu.QuantizedKV(v8, 1.0), **args)
    o, lse = plan.run(dev8["q"], gpu.QuantizedKV(k8, cp.asarray(ks)), gpu.QuantizedKV(v8, cp.asarray(vs)))
    cp.cuda.runtime.deviceSynchronize()
    check(cp.asnumpy(o).astype(np.float64), cp.asnumpy(lse).astype(np.float64), *reference(host[0], kd, vd),
          "float16", "plan with this layer's scales")
    with pytest.raises(gpu.AttentionInputError, match=r"k_cache.scale: float32 \(3,\) on device 0; expected float32 "
                                                      r"\(2,\)"):
        plan.run(dev8["q"], gpu.QuantizedKV(k8, cp.ones(3, cp.float32)), dev8["v"])


def _hopper() -> bool:
    cp = _cp()
    return int(cp.cuda.Device().compute_capability) >= 90


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_quantize_kv_fp8_matches_the_host_rounding(dtype):
    if not _hopper():
        pytest.skip("quantize_kv_fp8 is compiled for Hopper (sm_90a), like quantize_fp8")
    from iosim import gpu

    cp = _cp()
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((3, 80, 4, 128)) * rng.uniform(0.1, 20, (1, 1, 4, 1))).astype(np.float32)
    xd = cp.asarray(x).astype(cp.float16 if dtype == "float16" else ml_dtypes.bfloat16)
    xs = cp.asnumpy(xd).astype(np.float32)
    got = gpu.quantize_kv_fp8(xd)
    amax = np.abs(xs).max(axis=(0, 1, 3))
    scale = (amax / np.float32(E4M3_MAX)).astype(np.float32)
    assert np.array_equal(cp.asnumpy(got.scale), scale)
    inv = (np.float32(1) / scale).astype(np.float32)
    want = np.clip(xs * inv[:, None], -E4M3_MAX, E4M3_MAX).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    assert got.values.dtype == cp.uint8 and np.array_equal(cp.asnumpy(got.values), want)
    given = gpu.quantize_kv_fp8(xd, scale=2.0)
    assert np.array_equal(cp.asnumpy(given.scale), np.full(4, 2.0, np.float32))
    with pytest.raises(gpu.AttentionInputError, match="scale"):
        gpu.quantize_kv_fp8(xd, scale=[1.0, 2.0])


def test_torch_fp8_cache_end_to_end():
    torch = pytest.importorskip("torch", reason="torch is not importable")
    if not _hopper():
        pytest.skip("quantize_kv_fp8 is compiled for Hopper (sm_90a)")
    from iosim import gpu

    B, N, H, Hk, D = 4, 3000, 32, 4, 128
    q = torch.randn(B, 1, H, D, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(B, N, Hk, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    kq, vq = gpu.quantize_kv_fp8(k), gpu.quantize_kv_fp8(v)
    assert kq.values.dtype == torch.float8_e4m3fn and kq.scale.shape == (Hk,)
    o, _ = gpu.decode(q, kq, vq)
    assert isinstance(o, torch.Tensor) and o.dtype == torch.bfloat16
    kd, vd = (x.values.double() * x.scale.double().view(1, 1, Hk, 1) for x in (kq, vq))
    ref_o, _ = reference(q.float().cpu().numpy(), list(kd.cpu().numpy()), list(vd.cpu().numpy()))
    assert rel_err(o.double().cpu().numpy(), ref_o) < TOL["bfloat16"]
    full, _ = reference(q.float().cpu().numpy(), list(k.float().cpu().numpy()), list(v.float().cpu().numpy()))
    assert rel_err(o.double().cpu().numpy(), full) < 0.08  # e4m3's 3 mantissa bits: a few % of O's norm
