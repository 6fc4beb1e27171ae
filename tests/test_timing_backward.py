"""The backward pass's time model (iosim/timing/fa2_bwd.py, fa3_bwd.py) and its kernel descriptions."""

import dataclasses
import math

import pytest

from iosim import AttentionProblem, simulate
from iosim.hardware.gpu import get_profile
from iosim.timing import KernelError, kernel_for, load_kernel, rates
from iosim.timing.fa2_bwd import block_steps, smem_step_bytes, step
from iosim.timing.fa3_bwd import step_parts

H100 = "h100-sxm5-80gb"
BACKWARD = ("iosim-flash2-bwd", "fa2-bwd", "cudnn-bwd", "iosim-flash3-bwd")


def test_backward_descriptions_name_their_pass_and_forward_ones_refuse_the_backward():
    for name in BACKWARD:
        assert load_kernel(name).pass_ == "backward"
    with pytest.raises(KernelError, match="describes the backward pass, not the forward pass"):
        kernel_for("flash2", "fa2-bwd", "forward")
    with pytest.raises(KernelError, match="describes the forward pass, not the backward pass"):
        kernel_for("flash2", "fa2", "backward")
    assert kernel_for("flash2", None, "backward").name == "fa2-bwd"  # the schedule's default tiles are FA2's
    assert kernel_for("flash2", None, "both") is None


def test_shared_memory_bytes_of_a_step_follow_the_warp_grid_by_hand():
    """d = 128, Br = 64, Bc = 128, 8 warps, warp grid (2, 4, 2): S and dP read (4·64 + 2·128)·128 elements each, dV
    and dK (2·128 + 4·128)·64, dQ (4·64 + 2·128)·128; P and dS stored, Q and dO staged: 64·128 elements each; 2 B
    an element."""
    tc = load_kernel("iosim-flash2-bwd").tiles_for(128)
    assert (tc.block_q, tc.block_kv, tc.warp_grid) == (64, 128, (2, 4, 2))
    by_hand = 2 * (2 * 512 * 128 + 2 * 768 * 64 + 512 * 128 + 2 * 64 * 128 + 2 * 64 * 128)
    assert smem_step_bytes(64, 128, 128, 2, 8, tc) == by_hand == 655360


def test_a_step_adds_the_phases_of_one_block_and_prices_reductions_at_the_calibrated_rate():
    p = AttentionProblem(batch=4, heads=16, seq_len=4096, head_dim=128, dtype="bf16")
    r = rates(get_profile(H100), "bf16")
    assert set(r.l2_reduce) == {1, 2} and r.l2_reduce[2] > r.l2_reduce[1] > 0
    ours, fa2 = load_kernel("iosim-flash2-bwd"), load_kernel("fa2-bwd")
    a = step(p, ours.tiles_for(128), ours, 1, r)
    b = step(p, fa2.tiles_for(128), fa2, 1, r)
    assert a.step_s == pytest.approx(a.ldmatrix_s + a.mma_s + a.elementwise_s)  # one block per SM: the sequence
    assert b.reduce_s / a.reduce_s == pytest.approx(r.l2_reduce[2] / r.l2_reduce[1])  # atomicAdd vs .v2
    assert a.mma_s == pytest.approx(5 * 2 * 64 * 128 * 128 / 8 * 2 / (r.mma_at(8) / r.sms / 4))


def test_steps_per_kv_block_count_causal_visits_and_the_group_of_a_grouped_kernel():
    tc = load_kernel("iosim-flash2-bwd").tiles_for(128)  # Br 64, Bc 128
    full = AttentionProblem(heads=8, kv_heads=2, seq_len=1000, head_dim=128)
    assert list(block_steps(full, tc, grouped=False)) == [16] * 8  # ceil(1000 / 64) Q blocks, 8 K/V blocks
    assert list(block_steps(full, tc, grouped=True)) == [64] * 8  # four query heads per block
    causal = AttentionProblem(seq_len=1000, head_dim=128, causal=True)
    assert list(block_steps(causal, tc, grouped=False)) == [16 - (j * 128) // 64 for j in range(8)]


def test_simulate_times_each_backward_kernel_with_the_description_named():
    p = AttentionProblem(batch=2, heads=16, seq_len=2048, head_dim=128, dtype="bf16", causal=True)
    for name in BACKWARD:
        schedule = "flash3" if name == "iosim-flash3-bwd" else "flash2"
        r = simulate(schedule, p, H100, pass_="backward", kernel=name, warm=True)
        assert r.time.kernel == name and len(r.time.kernels) == 3
        assert r.time.predicted_s == pytest.approx(sum(k.predicted_s for k in r.time.kernels))
        assert all(math.isfinite(k.predicted_s) and k.predicted_s > 0 for k in r.time.kernels)
        assert r.time.predicted_s > r.time.roofline_s
    default = simulate("flash2", p, H100, pass_="backward")
    assert default.time.kernel == "fa2-bwd"


def test_a_grouped_kernel_brings_its_design_to_the_count():
    p = AttentionProblem(heads=8, kv_heads=2, seq_len=1024, head_dim=64)
    ours = simulate("flash2", p, H100, pass_="backward", kernel="iosim-flash2-bwd", l2=False)
    grouped = simulate("flash2", p, H100, pass_="backward", gqa="grouped", l2=False,
                       block_q=ours.tiles.block_q, block_kv=ours.tiles.block_kv)
    assert ours.traffic == grouped.traffic
    assert [k.name for k in ours.counts.kernels] == ["flash2_bwd_preprocess", "flash2_bwd", "flash2_bwd_convert_dq"]


def test_a_kernel_whose_schedule_takes_no_gqa_option_times_grouped_heads():
    """flash3's backward is grouped by construction (no gqa option): its kernel must not hand it one."""
    p = AttentionProblem(heads=8, kv_heads=2, seq_len=1024, head_dim=128, dtype="bf16")
    r = simulate("flash3", p, H100, pass_="backward", kernel="iosim-flash3-bwd", l2=False)
    assert r.time.kernel == "iosim-flash3-bwd" and r.time.predicted_s > 0



def test_a_hopper_step_is_its_phases_in_sequence_plus_two_measured_wgmma_waits():
    """fa3_bwd: both consumer warpgroups in the same phase, so the step adds its GEMMs, elementwise work, shared-memory
    stores (dS in the input type, dQ_i staged in fp32) and two wgmma round trips at the calibrated wait (cycles over
    the calibrated SM clock); a profile without the wait adds none."""
    p = AttentionProblem(batch=4, heads=16, seq_len=4096, head_dim=128, dtype="bf16")
    prof = get_profile(H100)
    r = rates(prof, "bf16")
    cal = prof.calibration
    assert r.wgmma_wait_s == pytest.approx(float(cal.wgmma.bf16.wait.value) / float(cal.sm_clock.value))
    assert 50e-9 < r.wgmma_wait_s < 200e-9  # about 200 cycles
    tc = load_kernel("iosim-flash3-bwd").tiles_for(128)  # Br 64, Bc 128
    parts = step_parts(p, tc, r)
    sm = r.sms
    assert parts["step_gemm"] == pytest.approx(5 * 2 * 64 * 128 * 128 / (r.wgmma / sm))
    assert parts["step_smem"] == pytest.approx((64 * 128 * 2 + 64 * 128 * 4) / (r.smem / sm))
    assert parts["step_waits"] == pytest.approx(2 * r.wgmma_wait_s)
    assert parts["step_compute"] == pytest.approx(parts["step_gemm"] + parts["step_elementwise"] + parts["step_smem"]
                                                  + parts["step_waits"])
    assert parts["step"] == max(parts["step_compute"], parts["step_load"] + parts["step_reduce"])
    unmeasured = step_parts(p, tc, dataclasses.replace(r, wgmma_wait_s=0.0))
    assert unmeasured["step_waits"] == 0 and unmeasured["step_compute"] < parts["step_compute"]


def test_a_hopper_work_tile_loads_its_kv_block_at_the_sms_share_of_dram_unless_it_stays_in_l2():
    """fa3_bwd: K_j and V_j are read by one work tile only, so a problem whose inputs spill L2 loads them at the SM's
    share of the DRAM read rate; warm calls of a small problem find them in L2."""
    r = rates(get_profile(H100), "bf16")
    big = AttentionProblem(batch=4, heads=16, seq_len=4096, head_dim=128, dtype="bf16")
    small = AttentionProblem(batch=1, heads=2, seq_len=1024, head_dim=128, dtype="bf16")
    kv = 2 * 128 * 128 * 2  # Bc = 128 keys of K and V at d = 128, 2 bytes
    for p, rate in ((big, r.dram_read), (small, r.l2)):
        res = simulate("flash2", p, H100, pass_="backward", kernel="cudnn-bwd", warm=True)
        (main,) = [k for k in res.time.kernels if k.name.endswith("_bwd")]
        assert main.resources["tile_load"] == pytest.approx(kv / (rate / r.sms))
