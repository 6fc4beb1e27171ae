"""The sliding-window part of the time record without a GPU (benchmarks/time_record_window.py, time_judge.py): its
shapes, each row predicted with its window by the fa2 and fa3 models (not the roofline), the judge keeping windowed
rows a group of their own, the uncertainty bands giving them their own regime; and the fa3 model's mask passes
counted as the kernel decides them."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import composed_flash2_profile, load_benchmark
from hypothesis import example, given, settings
from hypothesis import strategies as st

from iosim import AttentionProblem, simulate
from iosim.blocks import kv_block_range
from iosim.timing import fa3, uncertainty

H100 = "h100-sxm5-80gb"


@pytest.fixture(scope="module")
def tw():
    return load_benchmark("time_record_window")


@pytest.fixture(scope="module")
def judge(tw):
    return load_benchmark("time_judge")


def test_the_sweep_takes_causal_two_sided_grouped_and_ragged_windows(tw):
    shapes = tw.sweep()
    assert len({s.key for s in shapes}) == len(shapes)
    assert {s.causal for s in shapes} == {False, True} and {s.head_dim for s in shapes} == {64, 128}
    assert all(s.window[1] == 0 for s in shapes if s.causal)  # causal means right = 0
    assert any(s.heads != s.kv_heads for s in shapes) and any(s.seq_len % 128 for s in shapes)


def test_each_row_is_predicted_with_its_window_by_the_kernels_model(tw, judge):
    s = tw.sweep()[0]
    for kernel in tw.KERNELS:
        row = tw.row_of(s, kernel)
        assert judge.group(row) == f"{kernel} window"
        windowed = judge.simulate_row(row, H100)
        dense = judge.simulate_row({**row, "window": None}, H100)
        assert windowed.time.kernel == kernel and windowed.tiles.window == s.window
        # a 1024-key window of 8192 causal keys: about a quarter of the dense causal steps
        assert 0.15 < windowed.time.predicted_s / dense.time.predicted_s < 0.4


def test_a_window_that_covers_every_key_is_the_dense_problem():
    """The same tiles and steps. flash2's time is the dense one's (at the composed step: its measured steps are the
    dense instantiation's); the fa3 model's (placed as a dynamic scheduler
    does: cuDNN's description) differs only by the Local instantiation's dearer mask pass on the diagonal steps.
    (iosim's flash3 also places the tiles otherwise: a window runs in forward order in the snake, where the causal
    kernel reverses them and may take the host's schedule.)"""
    p = AttentionProblem(seq_len=4096, heads=8, head_dim=128, causal=True, dtype="bf16")
    composed = composed_flash2_profile(H100)  # the same step for both (iosim-flash2's measured steps are the dense instantiation's)
    full = simulate("flash2", p, composed, kernel="iosim-flash2", window=(4095, 0))
    dense = simulate("flash2", p, composed, kernel="iosim-flash2")
    assert full.time.predicted_s == pytest.approx(dense.time.predicted_s, rel=1e-9)
    full = simulate("flash3", p, H100, kernel="cudnn", window=(4095, 0))
    dense = simulate("flash3", p, H100, kernel="cudnn")
    assert dense.time.predicted_s < full.time.predicted_s < 1.02 * dense.time.predicted_s


def test_windowed_rows_are_their_own_regime():
    assert uncertainty.regime("iosim-flash2", 4096, 4096, True, windowed=True) == "window"
    assert uncertainty.regime("iosim-flash2", 4096, 4096, True) == "causal"


@given(n=st.integers(1, 900), nk=st.integers(1, 900), bc=st.sampled_from([64, 128, 192]), causal=st.booleans(),
       left=st.one_of(st.none(), st.integers(0, 700)), right=st.one_of(st.none(), st.integers(0, 700)),
       windowed=st.booleans())
@example(n=127, nk=64, bc=64, causal=False, left=0, right=None, windowed=True)  # right unbounded: seq_len, not kv_len
@settings(max_examples=200, deadline=None)
def test_masked_steps_are_the_kernels_need_mask_counted(n, nk, bc, causal, left, right, windowed):
    """fa3.masked_steps against kernels/flash3_fwd.cu's need_mask evaluated for every (Q tile, K/V tile, warpgroup)."""
    p = AttentionProblem(seq_len=n, kv_len=nk, head_dim=64, causal=causal)
    window = (left, 0 if causal else right) if windowed else None
    br, off = 128, nk - n
    lo, hi = np.array([kv_block_range(i, br, bc, n, nk, causal, window) for i in range(-(-n // br))]).reshape(-1, 2).T
    got = fa3.masked_steps(p, br, bc, window, lo, hi)
    # iosim.launch.varlen.mask_of: (None, None) is the plain mask, (None, 0) the causal one, others Local; an
    # unbounded side reaches the kernel as UNBOUNDED, which it caps at kv_len (left) and seq_len (right)
    local = window is not None and window not in ((None, None), (None, 0))
    dense_causal = causal or window == (None, 0)
    wl, wr = (min(cap if w is None else w, cap) for w, cap in zip(window, (nk, n))) if local else (0, 0)
    for i in range(len(lo)):
        want = 0
        for j in range(lo[i], hi[i]):
            for cw in (0, 1):
                n0, r0 = j * bc, i * br + cw * 64
                want += (n0 + bc > nk) or (not local and dense_causal and n0 + bc - 1 > r0 + off) or \
                    (local and (n0 + bc - 1 > r0 + off + wr or n0 < r0 + 63 + off - wl))
        assert got[i] == want, (i, lo[i], hi[i])
