"""Closed forms evaluated on arrays (one call per sweep) equal the scalar closed forms point by point."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from iosim import AttentionProblem
from iosim.schedules import ScheduleError, Tiles
from iosim.simulate import closed
from iosim.sweep import sweep

sizes = st.lists(st.integers(1, 5000), min_size=1, max_size=6)


@pytest.mark.parametrize("schedule,tiles", [("naive", (None, None)), ("naive", (64, 32)), ("flash1", (64, 200)),
                                            ("flash2", (128, 64)), ("flash2", (64, 16))])
@given(seq=sizes, kv=sizes, d=st.sampled_from([32, 64, 128]), heads=st.integers(1, 4), causal=st.booleans(),
       dtype=st.sampled_from(["fp16", "fp32"]))
def test_sweep_equals_the_scalar_closed_form_at_every_point(schedule, tiles, seq, kv, d, heads, causal, dtype):
    n = min(len(seq), len(kv))
    seq, kv = np.array(seq[:n]), np.array(kv[:n])
    cols = sweep(schedule, dict(seq_len=seq, kv_len=kv, head_dim=d, heads=heads, causal=causal, dtype=dtype),
                 block_q=tiles[0], block_kv=tiles[1])
    for i in range(n):
        p = AttentionProblem(seq_len=int(seq[i]), kv_len=int(kv[i]), head_dim=d, heads=heads, causal=causal,
                             dtype=dtype)
        c = closed(schedule, p, Tiles(*tiles))
        assert cols["global_read_bytes"][i] == c.global_read_bytes
        assert cols["global_write_bytes"][i] == c.global_write_bytes
        assert cols["sram_read_bytes"][i] == c.sram_read_bytes and cols["sram_write_bytes"][i] == c.sram_write_bytes
        for f in ("matmul", "exp", "other"):
            assert cols[f"flops_{f}"][i] == c.flops[f]
        for t, v in c.global_read.items():
            assert cols[f"{t}_global_read_bytes"][i] == v


def test_sweep_broadcasts_tiles_against_sequence_lengths():
    cols = sweep("flash1", dict(seq_len=1024, head_dim=64, heads=16, batch=64), block_q=64,
                 block_kv=np.array([64, 128, 256, 512]))
    assert cols["global_read_bytes"].shape == (4,)
    assert (np.diff(cols["global_read_bytes"]) < 0).all()  # fewer passes over Q and O with bigger K/V blocks


def test_tiled_sweeps_need_their_tiles():
    with pytest.raises(ScheduleError, match="explicit block_q and block_kv"):
        sweep("flash2", dict(seq_len=[128]))


@pytest.mark.parametrize("schedule,tiles", [("flash2", (128, 64)), ("flash2", (64, 16)), ("flash1", (64, 16)),
                                            ("naive", (None, None)), ("naive", (64, 16))])
@pytest.mark.parametrize("dtype", ["fp16", "fp32"])
def test_sweep_counts_stay_exact_past_64_bits(schedule, tiles, dtype):
    """N = 8,388,608, 128 heads, batch 16: 7.38e19 matmul FLOPs, past int64; every column equals the scalar
    closed form (Python ints), none wraps to 0 or below."""
    kw = dict(seq_len=8_388_608, heads=128, batch=16, dtype=dtype)
    cols = sweep(schedule, kw, block_q=tiles[0], block_kv=tiles[1])
    c = closed(schedule, AttentionProblem(**kw), Tiles(*tiles))
    assert int(cols["flops_matmul"]) == c.flops["matmul"] == 4 * 8_388_608**2 * 128 * 128 * 16
    assert int(cols["global_read_bytes"]) == c.global_read_bytes
    assert int(cols["global_write_bytes"]) == c.global_write_bytes
    assert int(cols["sram_read_bytes"]) == c.sram_read_bytes and int(cols["sram_write_bytes"]) == c.sram_write_bytes
    for f in ("matmul", "exp", "other"):
        assert int(cols[f"flops_{f}"]) == c.flops[f]
    assert all(int(v) >= 0 for v in cols.values())


def test_sweep_columns_are_int64_wherever_they_fit():
    cols = sweep("flash2", dict(seq_len=[1024, 8_388_608], heads=128, batch=16), block_q=128, block_kv=64)
    assert cols["global_read_bytes"].dtype == np.int64  # fits: int64, as before
    assert cols["flops_matmul"].dtype == object and cols["flops_matmul"][1] == 73_786_976_294_838_206_464


@pytest.mark.parametrize("kw,message", [
    (dict(seq_len=[2**31 + 1]), r"seq_len=2147483649 in the sweep: at most"),
    (dict(seq_len=[128, 0]), r"seq_len=0 in the sweep: every size must be >= 1"),
    (dict(seq_len=[128.5]), r"seq_len: expected whole numbers"),
    (dict(seq_len=[128], dtype="fp64"), r"dtype='fp64': expected one of fp32, fp16, bf16, fp8"),
    (dict(seq_len=[]), r"seq_len=\[\] in the sweep: empty; expected at least one size"),
    (dict(seq_len=[128], head_dim=np.array([], dtype=int)), r"head_dim=\[\] in the sweep: empty"),
    (dict(seq_len=[128], causal="no"), r"causal='no': expected True or False \(a bool"),
    (dict(seq_len=[128], causal="False"), r"causal='False': expected True or False"),
    (dict(seq_len=[128], causal=1), r"causal=1: expected True or False"),
    (dict(seq_len=[128], causal=[True, False]), r"causal=\[True, False\]: expected True or False"),
])
def test_sweep_refuses_what_it_cannot_count_naming_the_field(kw, message):
    with pytest.raises(ScheduleError, match=message):
        sweep("naive", kw)


def test_sweep_names_a_field_it_does_not_take_and_the_one_it_needs():
    with pytest.raises(ScheduleError, match=r"'seqlen': not a field a sweep takes; expected seq_len, kv_len"):
        sweep("naive", dict(seqlen=[128]))
    with pytest.raises(ScheduleError, match=r"seq_len: required"):
        sweep("naive", dict(heads=4))
    with pytest.raises(TypeError, match=r"problem: expected a dict of AttentionProblem's fields"):
        sweep("naive", [128])


@pytest.mark.parametrize("schedule,tiles", [("flash2", (128, 64)), ("flash1", (64, 128)), ("naive", (64, 64))])
@pytest.mark.parametrize("causal", [False, True])
def test_sweep_counts_stay_exact_at_the_longest_length(schedule, tiles, causal):
    """N = 2^31 (the largest taken), 128 heads, batch 16: the visit sums reach 2^62 and a product of them
    with d passes 2^63; each column equals the scalar closed form of one head times the 2,048 heads, none wraps."""
    big = dict(seq_len=2**31, head_dim=128, causal=causal)
    cols = sweep(schedule, {**big, "seq_len": [2**31], "heads": 128, "batch": 16}, block_q=tiles[0],
                 block_kv=tiles[1])  # a list: the array path
    c = closed(schedule, AttentionProblem(**big), Tiles(*tiles))
    for f in ("matmul", "exp", "other"):
        assert cols[f"flops_{f}"][0] == 2048 * c.flops[f]
    assert cols["sram_read_bytes"][0] == 2048 * c.sram_read_bytes
    assert cols["global_read_bytes"][0] == 2048 * c.global_read_bytes
    if not causal:
        assert cols["flops_matmul"][0] == 4 * (2**31) ** 2 * 128 * 2048


def test_sweep_takes_numpy_bools_for_causal():
    tiles = dict(block_q=128, block_kv=64)
    want = sweep("flash2", dict(seq_len=[1024], causal=True), **tiles)["flops_matmul"]
    assert (sweep("flash2", dict(seq_len=[1024], causal=np.bool_(True)), **tiles)["flops_matmul"] == want).all()
    assert (sweep("flash2", dict(seq_len=[1024], causal=np.bool_(False)), **tiles)["flops_matmul"] > want).all()
