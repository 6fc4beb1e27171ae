"""Numeric execution of the very tile programs that are costed equals softmax(scale·QKᵀ)V.

Tolerances are Frobenius errors set by the dtype's unit roundoff u (fp16 2^-11, bf16 2^-8), relative to
softmax(scale·QKᵀ)|V| (each row's weights on the magnitudes of V, what a rounding of P or of a partial sum is
relative to; it equals |O| where no cancellation happens): the inputs, P (naive) and the output are each rounded
once to the dtype, so the error is a few u; we allow 4u. (Relative to |O| itself no such bound holds: one query on
12 keys whose weighted values cancel to |O| ~ 0.1 of |V| measured 4.7u in fp16 (CI's hypothesis seed, 2026-11-27),
0.39u relative to the weights on |V|.)
FlashAttention-1 is the exception (and block-sparse, its Algorithm 5): Algorithm 1 line 12 writes O_i back to
HBM, in the dtype, after every K/V block, so its output carries up to Tc = ceil(N_kv / Bc) more roundings (each at most u relative; the rescale
factors are <= 1 and do not amplify them): (4 + Tc)·u. fp32 is held to 1e-5 (fp32 accumulation over at most a
few hundred terms).
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import random_inputs, rel_err
from hypothesis import given
from hypothesis import strategies as st

from iosim import AttentionProblem
from iosim.blocks import cdiv
from iosim.numeric import execute, reference, round_to_dtype
from iosim.schedules import SCHEDULES, Tiles

TOL = {"fp32": 1e-5, "fp16": 4 * 2**-11, "bf16": 4 * 2**-8}
UNIT_ROUNDOFF = {"fp16": 2**-11, "bf16": 2**-8}


def tolerance(schedule: str, p: AttentionProblem, tiles: Tiles) -> float:
    if schedule in ("flash1", "block-sparse") and p.dtype != "fp32":
        return (4 + cdiv(p.kv_len, tiles.block_kv)) * UNIT_ROUNDOFF[p.dtype]
    return TOL[p.dtype]


@st.composite
def cases(draw):
    kv_heads = draw(st.integers(1, 2))
    p = AttentionProblem(
        batch=draw(st.integers(1, 2)),
        heads=kv_heads * draw(st.integers(1, 3)),
        kv_heads=kv_heads,
        seq_len=draw(st.integers(1, 70)),
        kv_len=draw(st.integers(1, 70)),
        head_dim=draw(st.sampled_from([4, 8, 16, 32])),
        dtype=draw(st.sampled_from(["fp32", "fp16", "bf16"])),
        causal=draw(st.booleans()),
    )
    tiles = Tiles(draw(st.integers(1, 40)), draw(st.integers(1, 40)))
    return p, tiles, draw(st.integers(0, 2**32 - 1))


@pytest.mark.parametrize("schedule", list(SCHEDULES))
@given(case=cases())
def test_numeric_execution_equals_float64_softmax_attention(schedule, case):
    p, tiles, seed = case
    q, k, v = random_inputs(p, seed)
    O, _ = execute(schedule, p, q, k, v, tiles)
    assert not np.isnan(O).any(), "an output element was never written (outputs start as NaN)"
    magnitude = np.linalg.norm(reference(p, q, k, np.abs(v)))  # the weights on |V| (module docstring)
    assert np.linalg.norm(O - reference(p, q, k, v)) / max(magnitude, 1e-300) <= tolerance(schedule, p, tiles)


@pytest.mark.parametrize("schedule", list(SCHEDULES))
def test_logits_large_enough_to_overflow_a_naive_exp_are_exact(schedule):
    p = AttentionProblem(seq_len=48, kv_len=40, head_dim=16, dtype="fp32", causal=True)
    q, k, v = random_inputs(p, seed=7, scale=400.0)
    logits = np.einsum("nd,md->nm", q[0, :, 0], k[0, :, 0]) * p.scale
    with np.errstate(over="ignore"):
        assert np.isinf(np.exp(logits)).any()  # exp without the max subtraction overflows
    O, _ = execute(schedule, p, q, k, v, Tiles(16, 8))
    assert np.isfinite(O).all()
    assert rel_err(O, reference(p, q, k, v)) <= TOL["fp32"]


@pytest.mark.parametrize("schedule", ["flash1", "flash2"])
@given(case=cases(), order_seed=st.integers(0, 1000))
def test_online_softmax_merge_does_not_depend_on_the_order_of_kv_blocks(schedule, case, order_seed):
    p, tiles, seed = case
    p = p.model_copy(update={"dtype": "fp32"})
    q, k, v = random_inputs(p, seed)
    shuffle = np.random.default_rng(order_seed).permutation
    O1, _ = execute(schedule, p, q, k, v, tiles)
    O2, _ = execute(schedule, p, q, k, v, tiles, kv_order=lambda blocks: [blocks[i] for i in shuffle(len(blocks))])
    assert rel_err(O2, O1) <= 1e-5


@pytest.mark.parametrize("schedule", list(SCHEDULES))
def test_causal_rows_that_see_no_key_give_zeros_when_seq_len_exceeds_kv_len(schedule):
    p = AttentionProblem(seq_len=50, kv_len=20, head_dim=8, dtype="fp32", causal=True)
    q, k, v = random_inputs(p, seed=3)
    O, stats = execute(schedule, p, q, k, v, Tiles(16, 8))
    # bottom-right alignment: row r sees keys c <= r - 30, so rows 0..29 see none
    assert np.array_equal(O[0, :30, 0], np.zeros((30, 8), np.float32))
    assert (np.abs(O[0, 30:, 0]) > 0).any(axis=1).all()
    if schedule == "flash2":
        assert np.isneginf(stats["lse"][0, 0, :30]).all() and np.isfinite(stats["lse"][0, 0, 30:]).all()
    assert rel_err(O, reference(p, q, k, v)) <= TOL["fp32"]


def test_flash2_logsumexp_is_the_log_of_the_softmax_denominator():
    p = AttentionProblem(seq_len=33, kv_len=65, head_dim=16, dtype="fp32", causal=True)
    q, k, v = random_inputs(p, seed=11)
    _, stats = execute("flash2", p, q, k, v, Tiles(16, 16))
    S = np.einsum("nd,md->nm", q[0, :, 0].astype(np.float64), k[0, :, 0]) * p.scale
    r, c = np.arange(33)[:, None], np.arange(65)[None, :]
    S = np.where(c > r + 32, -np.inf, S)
    lse = np.log(np.exp(S - S.max(1, keepdims=True)).sum(1)) + S.max(1)
    np.testing.assert_allclose(stats["lse"][0, 0], lse, rtol=1e-5)


def test_bf16_rounding_is_round_to_nearest_even():
    x = np.array([1.0, 1.00390625, 1.01171875, 1 + 2**-9, -3.14159, 65504.0], np.float32)
    got = round_to_dtype(x, "bf16")
    # bf16 keeps 8 significant bits: 1 + 2^-8 is a tie between 1 and 1 + 2^-7 -> even (1.0)
    assert got[1] == 1.0 and got[2] == np.float32(1.015625) and got[3] == 1.0
    assert got[4] == np.float32(-3.140625)
    assert (got.view(np.uint32) & 0xFFFF == 0).all()
