"""The decode kernel's split count (iosim.timing.decode_split): candidates, the time model's choice, and which rule
the kernel and the simulator take."""

from __future__ import annotations

import warnings
from dataclasses import astuple

import pytest

from iosim import AttentionProblem, get_profile, simulate
from iosim.launch import decode as geo
from iosim.problem import InputWarning
from iosim.schedules import decode_layout
from iosim.timing import load_kernel
from iosim.timing.decode_split import calibrated, candidates, choose_splits, kernel_split, predicted_s

DESC = load_kernel("iosim-decode")
RAGGED = [32768, 512, 4096, 100, 8192, 2000, 16, 12000]
CASES = [  # (problem, kv_lens, page_size, kv_dtype)
    (dict(batch=16, heads=32, kv_heads=4, seq_len=1, kv_len=8192, head_dim=128, dtype="bf16"), None, None, None),
    (dict(batch=8, heads=32, kv_heads=4, seq_len=1, kv_len=32768, head_dim=128, dtype="bf16"), RAGGED, 16, None),
    (dict(batch=32, heads=32, kv_heads=4, seq_len=1, kv_len=8192, head_dim=128, dtype="bf16"), None, 64, "fp8"),
    (dict(batch=1, heads=8, kv_heads=1, seq_len=1, kv_len=4096, head_dim=128, dtype="bf16"), None, 16, None),
    (dict(batch=4, heads=32, kv_heads=8, seq_len=4, kv_len=16384, head_dim=128, dtype="bf16", causal=True), None, 64,
     None),
]


def test_candidates_run_one_to_eight_then_a_quarter_apart_to_the_cap():
    assert candidates(16) == [1]  # one tile of 16 keys: one split
    assert candidates(100) == [1, 2, 3, 4, 5, 6, 7]  # 7 tiles
    assert candidates(8192) == [1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 15, 19, 24, 30, 38, 48, 60, 75, 94, 118, 128]
    assert candidates(0) == [1]


@pytest.mark.parametrize("profile", ["h100-sxm5-80gb", "h200-sxm-141gb"])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_the_choice_is_the_fastest_candidate(profile, case):
    kw, lens, page, kv = CASES[case]
    p, prof = AttentionProblem(**kw), get_profile(profile)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InputWarning)
        chosen = choose_splits(p, prof, DESC, lens, page, kv)
        every = {}  # every candidate, no early stop: the search's stop must not miss the fastest
        for s in candidates(max(lens or [p.kv_len])):
            t = decode_layout.make_tiles(p, lens, page, s, kv)
            every.setdefault(t.splits, predicted_s(p, prof, DESC, t))
    assert every[chosen] == min(every.values())
    assert chosen == min(s for s, t in every.items() if t == every[chosen])  # the fewest among equals


def test_the_kernel_takes_a_forced_count_the_model_where_calibrated_else_occupancy():
    p = AttentionProblem(batch=16, heads=32, kv_heads=4, seq_len=1, kv_len=8192, head_dim=128, dtype="bf16")
    h200, a100 = get_profile("h200-sxm-141gb"), get_profile("a100-sxm4-80gb")
    assert calibrated(h200, 128, 1, False) and calibrated(h200, 128, 1, True) and not calibrated(a100, 128, 1, False)
    # an fp8 cache's blocks fit three an SM at d = 128: the H200's pace is measured at 1-3, the H100's at 1-2 only
    h100 = get_profile("h100-sxm5-80gb")
    assert calibrated(h200, 128, 1, True, 3) and calibrated(h100, 128, 1, True, 2) and not calibrated(h100, 128, 1, True, 3)
    fp8 = kernel_split(p, h100, DESC, 264, kv_dtype="fp8")
    assert fp8[1] == "occupancy" and astuple(fp8[0]) == astuple(geo.decode_split([8192] * 16, 4, 264))
    split, rule = kernel_split(p, h200, DESC, 264, splits=3)
    assert rule == "forced" and astuple(split) == astuple(geo.decode_split([8192] * 16, 4, 264, 3))
    split, rule = kernel_split(p, h200, DESC, 264)
    assert rule == "time model" and split.splits == choose_splits(p, h200, DESC)
    split, rule = kernel_split(p, a100, DESC, 108)
    assert rule == "occupancy" and astuple(split) == astuple(geo.decode_split([8192] * 16, 4, 108))
    with pytest.raises(geo.DecodeGeometryError, match="splits=0"):
        kernel_split(p, h200, DESC, 264, splits=0)


def test_simulate_counts_the_split_the_kernel_launches():
    p = AttentionProblem(batch=8, heads=32, kv_heads=4, seq_len=1, kv_len=32768, head_dim=128, dtype="bf16")
    r = simulate("flash-decoding", p, "h200-sxm-141gb", kernel="iosim-decode", kv_lens=RAGGED, page_size=16)
    want, _ = kernel_split(p, get_profile("h200-sxm-141gb"), DESC, 264, RAGGED, 16)
    assert (r.tiles.splits, r.tiles.chunk) == astuple(want)


def test_a_batch_with_no_key_runs_one_split_and_simulates():
    """Every sequence empty (legal: O = 0, lse = -inf): one split, no model search, and the time model prices the
    blocks that only start and exit (it divided by a zero bandwidth before)."""
    p = AttentionProblem(batch=2, heads=8, kv_heads=1, seq_len=1, kv_len=64, head_dim=64, dtype="fp16")
    assert choose_splits(p, get_profile("h200-sxm-141gb"), DESC, [0, 0]) == 1
    r = simulate("flash-decoding", p, "h200-sxm-141gb", kernel="iosim-decode", kv_lens=[0, 0])
    assert r.tiles.splits == 1 and 0 < r.time.predicted_s < 20e-6
