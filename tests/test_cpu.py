"""iosim.cpu.attention: the tiled numba kernel and NumPy's naive steps equal a float64 reference; errors are clear."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import iosim.cpu as cpu
from iosim.cpu import kernels
from iosim.cpu.attention import AttentionInputError, AttentionTypeError, NaiveMemoryError
from iosim.cpu.compare import measure_pair

EPS32 = float(np.finfo(np.float32).eps)


@pytest.fixture(scope="module", autouse=True)
def _compiled():
    """numba compiles the kernels on their first call (15 s on a busy 2-core machine): here, once, not inside an
    example, which CI's hypothesis profile times against a deadline (tests/conftest.py)."""
    for dtype in (np.float32, np.float64):
        q = np.ones((1, 2, 1, 8), dtype)
        cpu.attention(q, q, q, causal=True, block_q=1, block_kv=1)
        kernels.flash2_forward(q, q, q, np.empty_like(q), kernels.Tiling(1, 1, 0.5, True, False))


def reference(q, k, v, causal, scale=None):
    """softmax(scale Q Kᵀ) V in float64, bottom-right causal, rows that see no key = 0."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    B, N, H, d = q.shape
    Nk, group = k.shape[1], H // k.shape[2]
    scale = 1 / math.sqrt(d) if scale is None else scale
    out = np.zeros(q.shape)
    visible = np.arange(Nk)[None, :] <= np.arange(N)[:, None] + (Nk - N) if causal else np.ones((N, Nk), bool)
    for b in range(B):
        for h in range(H):
            s = np.where(visible, scale * q[b, :, h] @ k[b, :, h // group].T, -np.inf)
            m = s.max(axis=1, keepdims=True)
            p = np.where(visible, np.exp(s - np.where(np.isfinite(m), m, 0)), 0.0)
            den = p.sum(axis=1, keepdims=True)
            out[b, :, h] = (p / np.where(den > 0, den, 1)) @ v[b, :, h // group]
    return out


def fp32_bound(v, kv_len, head_dim):
    """|O - O_ref| for fp32 inputs: scores carry ~d ulps, P ~N_kv ulps through the sums; 8x that, times max|V|."""
    return 8 * EPS32 * (head_dim + kv_len) * float(np.abs(v).max())


@st.composite
def inputs(draw, dtype=np.float32):
    kv_heads = draw(st.integers(1, 2))
    B, H = draw(st.integers(1, 2)), kv_heads * draw(st.integers(1, 3))
    N, Nk, d = draw(st.integers(1, 80)), draw(st.integers(1, 80)), draw(st.sampled_from([1, 8, 16, 33, 64]))
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    q = rng.standard_normal((B, N, H, d)).astype(dtype)
    k, v = (rng.standard_normal((B, Nk, kv_heads, d)).astype(dtype) for _ in range(2))
    return q, k, v, draw(st.booleans()), draw(st.integers(1, 40)), draw(st.integers(1, 40))


@given(inputs())
def test_tiled_fp32_equals_float64_reference_within_fp32_bounds(case):
    q, k, v, causal, Br, Bc = case
    o = cpu.attention(q, k, v, causal=causal, block_q=Br, block_kv=Bc)
    assert o.dtype == np.float32 and o.shape == q.shape
    assert np.abs(o - reference(q, k, v, causal)).max() <= fp32_bound(v, k.shape[1], q.shape[3])


@given(inputs())
def test_tiled_loop_gemms_equal_reference_without_blas(case):
    q, k, v, causal, Br, Bc = case
    o = np.empty_like(q)
    kernels.flash2_forward(q, k, v, o, kernels.Tiling(Br, Bc, 1 / math.sqrt(q.shape[3]), causal, False))
    assert np.abs(o - reference(q, k, v, causal)).max() <= fp32_bound(v, k.shape[1], q.shape[3])


@given(inputs(np.float64))
def test_tiled_fp64_equals_reference_to_fp64_rounding(case):
    q, k, v, causal, Br, Bc = case
    o = cpu.attention(q, k, v, causal=causal, block_q=Br, block_kv=Bc)
    assert o.dtype == np.float64
    assert np.abs(o - reference(q, k, v, causal)).max() <= 1e-12 * np.abs(v).max()


@given(inputs())
def test_naive_equals_reference(case):
    q, k, v, causal, _, _ = case
    o = cpu.attention(q, k, v, causal=causal, schedule="naive")
    assert np.abs(o - reference(q, k, v, causal)).max() <= fp32_bound(v, k.shape[1], q.shape[3])


@pytest.mark.parametrize("schedule", ["flash2", "naive"])
def test_rows_that_see_no_key_give_zero(schedule):
    rng = np.random.default_rng(3)
    q = rng.standard_normal((1, 50, 2, 16)).astype(np.float32)
    k, v = (rng.standard_normal((1, 20, 1, 16)).astype(np.float32) for _ in range(2))
    o = cpu.attention(q, k, v, causal=True, schedule=schedule)
    assert np.all(o[:, :30] == 0)  # row i sees key j iff j <= i - 30
    assert np.all(np.abs(o[:, 30:]).sum(axis=-1) > 0)
    assert np.abs(o - reference(q, k, v, True)).max() <= fp32_bound(v, 20, 16)



@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("tensor,nan", [("q", np.nan), ("k", np.nan), ("k", -np.nan), ("v", np.nan)])
@pytest.mark.parametrize("blas", [True, False])
def test_nan_in_the_inputs_gives_nan_where_naive_does(dtype, tensor, nan, blas):
    """A NaN score makes its row's softmax NaN; the online softmax's max must not drop it (it once gave 0).
    Q and K: the same rows are NaN as naive's. V: every row that attends to the NaN key is NaN (each schedule
    also spreads it as 0·NaN to rows of the tiles it multiplies: naive's whole P, flash2's visited blocks)."""
    rng = np.random.default_rng(5)
    q = rng.standard_normal((1, 40, 1, 16)).astype(dtype)
    k, v = (rng.standard_normal((1, 40, 1, 16)).astype(dtype) for _ in range(2))
    {"q": q, "k": k, "v": v}[tensor][0, 25, 0, 3] = nan
    for causal in (False, True):
        naive = cpu.attention(q, k, v, causal=causal, schedule="naive")
        tiled = np.empty_like(q)
        kernels.flash2_forward(q, k, v, tiled, kernels.Tiling(16, 8, 0.25, causal, blas))
        if tensor == "v":
            seeing = slice(25, None) if causal else slice(None)
            assert np.isnan(tiled[0, seeing, 0, 3]).all() and np.isnan(naive[0, seeing, 0, 3]).all()
        else:
            assert np.isnan(naive).any()
            np.testing.assert_array_equal(np.isnan(tiled), np.isnan(naive))

def test_default_tiles_on_a_long_causal_grouped_problem():
    rng = np.random.default_rng(4)
    q = rng.standard_normal((1, 1500, 4, 64)).astype(np.float32)
    k, v = (rng.standard_normal((1, 1700, 2, 64)).astype(np.float32) for _ in range(2))
    o = cpu.attention(q, k, v, causal=True, scale=0.3)
    assert np.abs(o - reference(q, k, v, True, 0.3)).max() <= fp32_bound(v, 1700, 64)
    assert cpu.last_run().tiles.block_q >= 16


def test_fp16_is_upcast_and_returned_as_fp16():
    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal((1, 40, 1, 32)).astype(np.float16) for _ in range(3))
    o = cpu.attention(q, k, v)
    assert o.dtype == np.float16 and cpu.last_run().compute_dtype == "float32"
    assert np.abs(o.astype(np.float64) - reference(q, k, v, False)).max() <= 2 * float(np.finfo(np.float16).eps)


def test_bfloat16_is_upcast_and_returned_as_bfloat16():
    ml_dtypes = pytest.importorskip("ml_dtypes", reason="bfloat16 arrays need ml_dtypes")
    rng = np.random.default_rng(6)
    q, k, v = (rng.standard_normal((1, 24, 1, 16)).astype(ml_dtypes.bfloat16) for _ in range(3))
    o = cpu.attention(q, k, v)
    assert o.dtype == q.dtype
    assert np.abs(o.astype(np.float64) - reference(q, k, v, False)).max() <= 2 * 2.0**-8


@pytest.mark.parametrize("args, kwargs, err, words", [
    ((np.zeros((2, 3, 4)),) * 3, {}, AttentionInputError, ["q", "(2, 3, 4)", "4 dims"]),
    ((np.zeros((1, 4, 2, 8), np.int32),) * 3, {}, AttentionTypeError, ["q", "int32", "float32"]),
    ((np.zeros((1, 4, 2, 8), np.float32), np.zeros((1, 4, 2, 8)), np.zeros((1, 4, 2, 8))), {},
     AttentionTypeError, ["k", "float64", "q's float32"]),
    ((np.zeros((1, 4, 3, 8), np.float32), np.zeros((1, 4, 2, 8), np.float32), np.zeros((1, 4, 2, 8), np.float32)),
     {}, AttentionInputError, ["kv_heads=2", "heads=3"]),
    ((np.zeros((1, 4, 2, 8), np.float32), np.zeros((1, 4, 2, 4), np.float32), np.zeros((1, 4, 2, 4), np.float32)),
     {}, AttentionInputError, ["head_dim 4", "head_dim 8"]),
    (([[1.0]],) * 3, {}, AttentionTypeError, ["q", "list", "NumPy array"]),
    ((np.zeros((1, 4, 2, 8), np.float32),) * 3, {"scale": -1.0}, AttentionInputError, ["scale=-1.0", "positive"]),
    ((np.zeros((1, 4, 2, 8), np.float32),) * 3, {"schedule": "flash9"}, AttentionInputError, ["flash9", "naive"]),
    ((np.zeros((1, 4, 2, 8), np.float32),) * 3, {"block_q": 0}, AttentionInputError, ["block_q=0", "positive"]),
    ((np.zeros((1, 4, 2, 8), np.float32),) * 3, {"schedule": "naive", "block_q": 16}, AttentionInputError,
     ["naive", "no tiles"]),
    ((np.zeros((1, 0, 2, 8), np.float32),) * 3, {}, AttentionInputError, ["empty"]),
])
def test_bad_inputs_get_errors_naming_the_argument_and_value(args, kwargs, err, words):
    with pytest.raises(err) as e:
        cpu.attention(*args, **kwargs)
    for w in words:
        assert w in str(e.value)


def test_naive_refuses_before_allocating_a_matrix_that_does_not_fit():
    n = 1 << 20  # one head's S: 2^40 x 4 B = 4.4 TB
    q = np.zeros((1, n, 1, 1), np.float32)
    with pytest.raises(NaiveMemoryError) as e:
        cpu.attention(q, q, q, schedule="naive")
    msg = str(e.value)
    assert "seq_len=1048576" in msg and "4.398 TB" in msg and "flash2" in msg


def _peak_rss_mb(n, d):
    code = ("import resource, numpy as np, iosim.cpu as c\n"
            f"q = np.ones((1, {n}, 1, {d}), np.float32)\n"
            "c.attention(q[:, :64], q[:, :64], q[:, :64])\n"
            "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
            "c.attention(q, q, q)\n"
            "print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(out.stdout.split()[-1])


def test_tiled_memory_grows_like_n_d_not_n_squared():
    n, d = 16384, 64  # naive's S alone would be 1074 MB
    grown = _peak_rss_mb(n, d)
    assert grown < 64, f"the tiled call grew the peak RSS by {grown:.0f} MB; O(N d) inputs are {4 * n * d * 4 / 1e6} MB"


@pytest.mark.slow
@pytest.mark.parametrize("n", [32768, 65536])
def test_tiled_runs_long_sequences_in_o_n_d_memory(n):
    grown = _peak_rss_mb(n, 64)  # naive's S would be 4.3 / 17.2 GB
    assert grown < 128


def test_measure_pair_times_both_schedules_on_the_same_inputs():
    m = measure_pair(256, 32, reps=3, idle=False)
    assert m.naive_s > 0 and m.tiled_s > 0 and m.ratio_median > 0 and m.naive_first_s is None
    m = measure_pair(256, 32, reps=1, idle=False, first_call_pause_s=0.0)
    assert m.naive_first_s > 0
    m = measure_pair(256, 32, reps=1, run_naive=False, idle=False, first_call_pause_s=0.0)
    assert m.naive_s is None and m.ratio_median is None and m.naive_first_s is None and m.tiled_s > 0
