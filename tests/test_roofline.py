"""The peak roofline (``time.roofline_s``): work over datasheet rates per kernel, not at full-chip speed for a grid that
cannot fill the chip. The kernel time model beside it is tested in test_timing.py."""

from __future__ import annotations

import pytest

from iosim import AttentionProblem, get_profile, simulate
from iosim.timing.roofline import predict, utilization


def roof(schedule, problem, **kw):
    """The roofline of a simulation (hbm = global: no L2 model)."""
    r = simulate(schedule, problem, l2=False, **kw)
    hbm = [a + b for a, b in zip(r.hbm_read, r.hbm_write, strict=True)]
    return r, predict(r.counts, hbm, problem.dtype, r.profile)


def test_utilization_is_one_for_whole_waves_and_less_for_small_or_ragged_grids():
    assert utilization(132, 132) == 1.0 and utilization(264, 132) == 1.0
    assert utilization(1, 132) == pytest.approx(1 / 132)
    assert utilization(133, 132) == pytest.approx(133 / 264)  # a ragged last wave of one block


def test_a_single_head_short_sequence_is_not_predicted_at_full_chip_speed():
    # flash2 at N=512, one head: 4 thread blocks on 132 SMs
    _, one = roof("flash2", AttentionProblem(seq_len=512, head_dim=128))
    _, many = roof("flash2", AttentionProblem(seq_len=512, head_dim=128, heads=33 * 4))  # 528 blocks: 4 waves
    k1, k2 = one.kernels[0], many.kernels[0]
    assert k1.grid == 4 and k1.utilization == pytest.approx(4 / 132)
    assert k2.utilization == 1.0
    # 132x the work in 4 full waves costs only ~ (132 / 33)x the time of 4 lonely blocks
    assert many.predicted_s / one.predicted_s == pytest.approx(132 * (4 / 132), rel=1e-9)


def test_time_is_the_longest_resource_and_the_bound_names_it():
    r, t = roof("flash2", AttentionProblem(seq_len=8192, head_dim=128, heads=32, batch=4, dtype="bf16"),
                block_q=128, block_kv=64)
    k = t.kernels[0]
    assert k.bound == max(k.resources, key=k.resources.get)
    assert k.predicted_s == pytest.approx(k.resources[k.bound] / k.utilization)
    prof = get_profile()
    assert k.resources["tensor"] == pytest.approx(r.counts.flops["matmul"] / prof.compute.tensor.bf16.value)


def test_naive_is_memory_bound_and_its_arithmetic_intensity_falls_far_below_flash2s():
    p = AttentionProblem(seq_len=4096, head_dim=128, heads=32)
    assert roof("naive", p)[1].bound == "hbm"
    naive, flash = simulate("naive", p).to_json(), simulate("flash2", p).to_json()
    assert naive["time"]["arithmetic_intensity"] < flash["time"]["arithmetic_intensity"] / 1.5


def test_unpublished_rates_leave_their_resource_out_and_say_so():
    _, t = roof("flash1", AttentionProblem(seq_len=1024, head_dim=64), profile="h200-sxm-141gb")
    assert t.unmodeled == {"global": "l2.bandwidth"}
    assert "global" not in t.kernels[0].resources
    r = simulate("flash1", AttentionProblem(seq_len=1024, head_dim=64), "h200-sxm-141gb").to_json()
    assert r["time"]["unmodeled"] == {"global": "l2.bandwidth"} and r["time"]["kernel"] == "roofline"
