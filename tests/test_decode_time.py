"""iosim-decode's time model (iosim.timing.flash_decode): the blocks' shared stream, partial waves, small grids,
the combine kernel."""

from __future__ import annotations

import numpy as np
import pytest

from iosim import AttentionProblem, get_profile, simulate
from iosim.timing._fluid import shares
from iosim.timing.flash_decode import fluid
from iosim.timing.rates import rates

H100 = "h100-sxm5-80gb"


def _decode(batch, n, kv_heads=4, heads=32, d=128, L=1, **kw):
    p = AttentionProblem(batch=batch, heads=heads, kv_heads=kv_heads, seq_len=L, kv_len=n, head_dim=d, dtype="bf16",
                         causal=L > 1)
    return simulate("flash-decoding", p, H100, kernel="iosim-decode", warm=True, **kw)


# -- the walk of blocks sharing the stream -------------------------------------------------------------------------


def _one_an_sm(stream, fixed, slots, bandwidth, cap):
    """The walk with every block alone on an SM (``slots`` SMs of one slot): ``cap`` bytes/s a block."""
    return fluid(np.asarray(stream, dtype=float), np.asarray(fixed, dtype=float), slots, 1, bandwidth, [np.inf, cap])


def test_blocks_that_fit_the_slots_share_the_bandwidth_and_end_together():
    assert _one_an_sm(np.full(4, 10.0), np.zeros(4), 8, 2.0, np.inf) == pytest.approx(20.0)  # 40 B at 2 B/s


def test_a_block_that_waits_for_a_slot_streams_alone_at_its_cap():
    # 3 blocks of 1 B on 2 slots, 1 B/s: two share (0.5 B/s each, end at 2 s), the third runs alone
    assert _one_an_sm(np.ones(3), np.zeros(3), 2, 1.0, np.inf) == pytest.approx(3.0)
    # capped at 0.4 B/s each: the two end at 2.5 s, the third at 5 s (the tail of a partial wave)
    assert _one_an_sm(np.ones(3), np.zeros(3), 2, 1.0, 0.4) == pytest.approx(5.0)


def test_fixed_time_holds_a_slot_without_streaming():
    assert _one_an_sm([0.0, 4.0], [1.0, 0.0], 1, 2.0, np.inf) == pytest.approx(3.0)
    # two slots: the second streams alone while the first is busy, then nothing is left
    assert _one_an_sm([0.0, 4.0], [1.0, 0.0], 2, 2.0, np.inf) == pytest.approx(2.0)


def test_blocks_dealt_to_one_sm_stream_at_its_shared_pace():
    """2 SMs of 2 slots, a block's cap 1 B/s alone on its SM, 0.5 B/s beside another. Blocks 0 and 2 are dealt to
    SM 0 (breadth first: 0, 1, 0, 1), so the two streaming blocks share it and take 4 s, not 2."""
    caps = [np.inf, 1.0, 0.5]
    assert fluid(np.array([2.0, 0.0, 2.0, 0.0]), np.zeros(4), 2, 2, np.inf, caps) == pytest.approx(4.0)
    # a later block takes the slot that freed first, on its SM: block 1's (SM 1), so blocks 0 and 4 run apart
    assert fluid(np.array([2.0, 0.0, 0.0, 0.0, 2.0]), np.zeros(5), 2, 2, np.inf, caps) == pytest.approx(2.0)


def test_capped_blocks_leave_the_rest_of_the_bandwidth_to_the_others():
    # 5 B/s over caps 1, 3, 3: the first takes its 1, the other two share 4 (water-filling)
    assert shares(np.array([3.0, 1.0, 3.0]), 5.0) == pytest.approx([2.0, 1.0, 2.0])
    assert shares(np.array([1.0, 2.0]), 5.0) == pytest.approx([1.0, 2.0])  # under the bandwidth: at their caps


# -- the kernels -------------------------------------------------------------------------------------------------------


def test_a_full_grid_streams_the_cache_at_the_calibrated_dram_read_rate():
    r = _decode(64, 8192)
    rt = rates(get_profile(H100), "bf16")
    (split,) = r.time.kernels  # batch 64 fills the 264 slots unsplit: no combine kernel
    assert r.tiles.splits == 1 and split.bound == "dram" and split.grid == 256
    kv = 2 * 64 * 8192 * 4 * 128 * 2
    floor = kv / rt.dram_read + rt.first_launch_s()
    assert floor < split.predicted_s < floor * 1.02  # one launch, a block's fixed costs and the drain on top


def test_splits_add_the_combine_kernel_at_a_dependent_launch():
    r = _decode(16, 8192, splits=4)
    rt = rates(get_profile(H100), "bf16")
    _, combine = r.time.kernels
    assert r.tiles.splits == 4 and combine.name == "flash_decode_combine"
    assert rt.next_launch_s() < combine.predicted_s < rt.next_launch_s() + 2e-6  # a few dependent L2 loads


def test_a_grid_far_under_a_wave_runs_at_the_blocks_own_rate_not_dram():
    r = _decode(1, 4096, kv_heads=1, heads=8, splits=16)
    split = r.time.kernels[0]
    rt = rates(get_profile(H100), "bf16")
    assert split.bound == "blocks" and split.grid == r.tiles.splits == 16
    assert split.predicted_s > 4 * (2 * 4096 * 128 * 2) / rt.dram_read  # far slower than the stream


def test_a_partial_wave_costs_more_per_byte_than_a_whole_one():
    one = _decode(66, 8192, splits=1)  # 264 blocks: the H100's 132 SMs x 2
    more = _decode(68, 8192, splits=1)  # 272: 8 blocks wait for a slot and then run alone
    t1, t2 = (r.time.kernels[0].predicted_s for r in (one, more))
    assert t2 / t1 > 1.02 * 68 / 66


def test_warm_calls_on_a_cache_that_fits_in_l2_stream_from_l2():
    cold, warm = (simulate("flash-decoding", AttentionProblem(batch=8, heads=32, kv_heads=4, seq_len=1, kv_len=2048,
                                                              head_dim=128, dtype="bf16"), H100,
                           kernel="iosim-decode", warm=w) for w in (False, True))
    assert warm.time.dram_free and warm.time.kernels[0].bound in ("l2", "blocks")
    assert warm.time.predicted_s < cold.time.predicted_s


def test_pages_change_the_bytes_not_the_time_model_of_the_stream():
    contig, paged = _decode(32, 16384), _decode(32, 16384, page_size=16)
    assert paged.counts.global_read["block_table"] > 0 == contig.counts.global_read["block_table"]
    assert paged.time.predicted_s == pytest.approx(contig.time.predicted_s, rel=1e-3)
