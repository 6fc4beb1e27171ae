"""The sliding-window part of the time record without a GPU (benchmarks/time_record_window.py, time_judge.py): its
shapes, each row predicted with its window by the fa2 and fa3 models (not the roofline), the judge keeping windowed
rows a group of their own, and the uncertainty bands giving them their own regime."""

from __future__ import annotations

import pytest
from helpers import load_benchmark

from iosim import AttentionProblem, simulate
from iosim.timing import uncertainty

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
    p = AttentionProblem(seq_len=4096, heads=8, head_dim=128, causal=True, dtype="bf16")
    for kernel in ("iosim-flash2", "iosim-flash3"):
        full = simulate("flash2" if kernel == "iosim-flash2" else "flash3", p, H100, kernel=kernel, window=(4095, 0))
        dense = simulate("flash2" if kernel == "iosim-flash2" else "flash3", p, H100, kernel=kernel)
        assert full.time.predicted_s == pytest.approx(dense.time.predicted_s, rel=1e-9)


def test_windowed_rows_are_their_own_regime():
    assert uncertainty.regime("iosim-flash2", 4096, 4096, True, windowed=True) == "window"
    assert uncertainty.regime("iosim-flash2", 4096, 4096, True) == "causal"
