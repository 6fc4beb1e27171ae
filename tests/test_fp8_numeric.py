"""FP8 quantization and the FP8 forward's emulation (iosim.numeric.fp8, issue 27): the rotation of incoherent
processing is orthogonal, block scales are amax / 448, quantization errors stay within e4m3's half ulp, and on
FlashAttention-3's outlier inputs block quantization with incoherent processing beats the per-tensor baseline."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from helpers import load_benchmark
from hypothesis import given, settings
from hypothesis import strategies as st

from iosim import AttentionProblem
from iosim.numeric import reference, round_to_dtype
from iosim.numeric.fp8 import (
    MODES,
    dequantize_blocks,
    fp8_attention,
    fwht,
    hadamard,
    incoherent,
    outlier_inputs,
    quantize_blocks,
    quantize_tensor,
    random_signs,
    rmse,
    round_e4m3,
)

EPS64 = 2.0**-52  # float64's unit roundoff is 2^-53; one ulp of a number in [1, 2)
U32 = 2.0**-24  # float32's unit roundoff
E4M3_HALF_ULP = 2.0**-4  # 3 mantissa bits: in [2^e, 2^(e+1)) the spacing is 2^(e-3), half of it <= 2^-4 |y|
E4M3_SUBNORMAL_HALF_ULP = 2.0**-10  # below 2^-6 the spacing is 2^-9

seeds = st.integers(0, 2**32 - 1)
dims = st.sampled_from([16, 32, 64, 128, 256])


@given(d=dims)
def test_the_hadamard_matrix_is_orthogonal_and_the_fast_transform_is_its_product(d):
    h = hadamard(d)
    assert np.abs(h @ h.T - np.eye(d)).max() <= 4 * d * EPS64
    assert np.array_equal(h, h.T)
    assert np.all(np.abs(h) == 1 / math.sqrt(d))
    x = np.random.default_rng(d).standard_normal((3, d))
    # two ways of summing d terms of size |x|/sqrt(d): each is within (log2(d) + 2) ulps of |x|_2 per entry
    assert np.abs(fwht(x) - x @ h).max() <= 4 * (math.log2(d) + 2) * EPS64 * np.linalg.norm(x, axis=1).max()


@given(seed=seeds, d=dims, n=st.integers(1, 40))
def test_incoherent_processing_keeps_q_kt_to_float64_rounding(seed, d, n):
    rng = np.random.default_rng(seed)
    q, k = outlier_inputs((n, d), rng).astype(np.float64), outlier_inputs((n + 3, d), rng).astype(np.float64)
    qr, kr = incoherent(q, seed), incoherent(k, seed)
    norms = np.linalg.norm(q, axis=1)[:, None] * np.linalg.norm(k, axis=1)[None, :]
    # the rotation's rounding (log2(d) butterfly stages, the signs exact) changes each row by at most
    # (log2(d) + 2) ulps of its norm; the two products' own rounding is at most d ulps of |q||k| each
    bound = (2 * (math.log2(d) + 2) + 2 * d) * EPS64 * norms
    assert np.all(np.abs(qr @ kr.T - q @ k.T) <= bound)
    assert np.allclose(np.linalg.norm(qr, axis=1), np.linalg.norm(q, axis=1), rtol=(math.log2(d) + 2) * EPS64)
    # the bound is tight enough to see a wrong rotation: K rotated with other signs changes Q Kᵀ far past it
    other = next(s for s in range(seed + 1, seed + 100) if abs(random_signs(d, s) @ random_signs(d, seed)) < d)
    assert np.any(np.abs(qr @ incoherent(k, other).T - q @ k.T) > bound)


@given(seed=seeds, block=st.sampled_from([1, 16, 64, 128]), n=st.integers(1, 300), zero_rows=st.integers(0, 200))
def test_block_scales_are_amax_over_448_and_use_the_full_e4m3_range(seed, block, n, zero_rows):
    rng = np.random.default_rng(seed)
    x = outlier_inputs((2, n, 3, 16), rng)
    x[:, : min(zero_rows, n)] = 0  # whole blocks of zeros take scale 1
    values, scales = quantize_blocks(x, block, axis=1)
    nb = -(-n // block)
    assert values.shape == x.shape and values.dtype == np.float32 and scales.shape == (2, 3, nb)
    for b in range(2):
        for h in range(3):
            for j in range(nb):
                rows = slice(j * block, (j + 1) * block)
                amax = np.float32(np.abs(x[b, rows, h]).max())
                want = np.float32(1) if amax == 0 else amax / np.float32(448)
                assert scales[b, h, j] == want  # exactly, in fp32
                assert np.abs(values[b, rows, h]).max() == (0 if amax == 0 else 448)
    assert np.array_equal(round_e4m3(values), values)  # e4m3 numbers


def _within_half_ulp(x, deq, scale):
    """|s·q - x| <= max(2^-4 |x|, 2^-10 s) + 2^-22 (|x| + s), derived: y = fl32(x / s) is within 2^-24 |x / s|;
    e4m3 rounds y to q within 2^-4 |y| (normal numbers; saturation at 448 is closer still, since |y| <= 448 (1 +
    2^-23)) or within 2^-10 (subnormals); fl32(s·q) adds 2^-24 |s q| <= 2^-24 (2 |x| + s). Each element's error is
    therefore at most e4m3's half ulp relative error times the block amax (2^-4 amax), plus fp32's rounding."""
    x, deq = x.astype(np.float64), deq.astype(np.float64)
    bound = np.maximum(E4M3_HALF_ULP * np.abs(x), E4M3_SUBNORMAL_HALF_ULP * scale) + 4 * U32 * (np.abs(x) + scale)
    return np.abs(deq - x) <= bound


@given(seed=seeds, block=st.sampled_from([1, 16, 128]), n=st.integers(1, 300), tiny=st.booleans())
def test_quantize_then_dequantize_is_within_e4m3s_half_ulp(seed, block, n, tiny):
    rng = np.random.default_rng(seed)
    x = outlier_inputs((1, n, 2, 32), rng)
    if tiny:  # a block whose small entries fall into e4m3's subnormals next to its outliers
        x = x * np.float32(rng.choice([1e-3, 1.0], size=(1, n, 2, 32)))
    values, scales = quantize_blocks(x, block, axis=1)
    deq = dequantize_blocks(values, scales, block, axis=1)
    per_row = np.repeat(scales, block, axis=-1)[..., :n].transpose(0, 2, 1)[..., None]  # (1, n, 2, 1)
    assert np.all(_within_half_ulp(x, deq, per_row))
    amax = np.repeat(scales * 448, block, axis=-1)[..., :n].transpose(0, 2, 1)[..., None]
    assert np.all(np.abs(deq - x) <= E4M3_HALF_ULP * amax * (1 + 2**-20))
    tv, ts = quantize_tensor(x)
    assert ts == np.float32(np.abs(x).max()) / np.float32(448)
    assert np.all(_within_half_ulp(x, tv * ts, np.float64(ts)))


def test_the_half_ulp_bound_sees_a_coarser_format():
    """The bound above is e4m3's: values rounded to 2 mantissa bits (e5m2's) break it."""
    x = np.linspace(1.0, 2.0, 1001, dtype=np.float32)[None, :, None, None]
    values, scales = quantize_blocks(x, 1001, axis=1)
    coarse = np.round(values / 64) * 64  # values in [224, 448]: spacing 64 instead of e4m3's 16 and 32
    assert np.all(_within_half_ulp(x, values * scales[..., None], scales))
    assert not np.all(_within_half_ulp(x, coarse * scales[..., None], scales))


def _errors(seed, n, d, heads, causal):
    rng = np.random.default_rng(seed)
    q, k, v = (outlier_inputs((1, n, heads, d), rng) for _ in range(3))
    exact = reference(AttentionProblem(seq_len=n, head_dim=d, heads=heads, dtype="fp32", causal=causal), q, k, v)
    rotation = int(rng.integers(2**32))
    return {m: rmse(fp8_attention(q, k, v, causal=causal, block_kv=128, mode=m, seed=rotation), exact)
            for m in ("per-tensor", "block+incoherent")}


# N = 512, 4 heads, not causal: over 400 seeds each for d = 64 and d = 128 the ratio RMSE(block+incoherent) /
# RMSE(per-tensor) had median 0.65, standard deviation 0.05, largest 0.84 (docs/fp8.md). Fewer heads or rows, or
# the causal mask (its first rows see few keys), bring single seeds closer to 1: N = 256, d = 64, one head failed on
# 13 of 300 seeds; N = 512, 4 heads, causal reached 0.97 in 150 seeds. The paper's N = 4096 separates them further.
@settings(max_examples=20, deadline=None)
@given(seed=seeds, d=st.sampled_from([64, 128]))
def test_block_quantization_with_incoherent_processing_beats_per_tensor_on_outliers(seed, d):
    err = _errors(seed, 512, d, 4, causal=False)
    assert err["block+incoherent"] < err["per-tensor"], err


@pytest.mark.parametrize("mode", sorted(MODES))
def test_fp8_attention_without_outliers_is_close_to_exact_and_bf16(mode):
    """On N(0, 1) inputs every mode is within a few percent of exact (e4m3 has 3 mantissa bits) and returns bf16."""
    rng = np.random.default_rng(27)
    q, k, v = (rng.standard_normal((1, 256, 2, 64)).astype(np.float32) for _ in range(3))
    exact = reference(AttentionProblem(seq_len=256, head_dim=64, heads=2, dtype="fp32", causal=True), q, k, v)
    o = fp8_attention(q, k, v, causal=True, block_kv=128, mode=mode, seed=1)
    assert o.shape == q.shape and o.dtype == np.float32 and np.array_equal(round_to_dtype(o, "bf16"), o)
    assert rmse(o, exact) < 0.05 * math.sqrt(np.mean(exact**2))
    assert rmse(o, exact) > 0  # fp8 is not exact


def test_outlier_inputs_have_the_papers_share_of_outliers():
    x = outlier_inputs((4096, 128), np.random.default_rng(0))
    assert x.dtype == np.float32 and x.shape == (4096, 128)
    # 524 entries (0.1 %) drawn N(0, 10²), of which P(|N(0, 1)| > 0.5) = 0.617 exceed 5: 323 ± 11; the other
    # 523,764 exceed 5 with probability 5.7e-7 (0.3 expected)
    assert 280 <= np.sum(np.abs(x) > 5) <= 370
    assert np.abs(x).max() > 20


def test_fp8_attention_refuses_unknown_modes_and_shapes():
    q = np.zeros((1, 8, 2, 16), np.float32)
    with pytest.raises(ValueError, match="mode"):
        fp8_attention(q, q, q, block_kv=8, mode="int8")
    with pytest.raises(ValueError, match="kv heads"):
        fp8_attention(q, q[:, :, :1], q, block_kv=8)
    with pytest.raises(ValueError, match="power of two"):
        hadamard(24)


def test_the_accuracy_benchmark_writes_its_rows_and_its_check_fails_where_the_issue_says(tmp_path, capsys):
    """benchmarks/bench_fp8_accuracy.py end to end on a small shape; then its check on made-up rows."""
    bench = load_benchmark("bench_fp8_accuracy")
    path = tmp_path / "rows.json"
    bench.main(["--seq-len", "256", "--head-dim", "64", "--seeds", "3", "--json", str(path)])
    rows = json.loads(path.read_text())["rows"]
    assert {r["mode"] for r in rows} == set(bench.ROWS) and {r["source"] for r in rows} == {"emulated"}
    assert all(r["N"] == 256 and r["d"] == 64 and r["seed"] == 3 and 0 < r["rmse"] < 0.1 for r in rows)
    assert "block+incoherent" in capsys.readouterr().out

    def made_up(ours, base):
        return [{"source": "emulated", "seed": 0, "mode": "block+incoherent", "rmse": ours},
                {"source": "emulated", "seed": 0, "mode": "per-tensor", "rmse": base}]
    assert bench.failures(made_up(8e-3, 2e-2)) == []
    equal = bench.failures(made_up(2e-2, 2e-2))  # not below the baseline, and over the bar
    assert len(equal) == 2 and "not below" in equal[0] and "exceeds" in equal[1]
    over = bench.failures(made_up(9.2e-3, 2e-2))
    assert len(over) == 1 and "exceeds the paper's 9.1e-03" in over[0]
