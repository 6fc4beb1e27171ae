"""The time model (iosim.timing): kernel descriptions as data, the FA2 step model, split-KV decode, the JSON fields."""

from __future__ import annotations

import pytest

from iosim import AttentionProblem, get_profile, simulate, timing
from iosim.timing import KernelError, builtin_kernel_names, load_kernel
from iosim.timing.decode import num_splits, split_geometry


def test_the_built_in_kernels_are_the_issues_names():
    assert builtin_kernel_names() == ["cudnn", "cudnn-bwd", "fa2", "fa2-bwd", "fa3", "iosim-decode", "iosim-flash2",
                                      "iosim-flash2-bwd", "iosim-flash3", "iosim-flash3-bwd", "iosim-naive"]
    for name in builtin_kernel_names():
        assert load_kernel(name).name == name and load_kernel(name).source


def test_a_users_kernel_is_a_yaml_file_with_the_same_fields(tmp_path):
    f = tmp_path / "mine.yaml"
    f.write_text("name: mine\nfamily: fa2\nsource: my notes\nwarps: 8\ntiles:\n  128: {block_q: 128, block_kv: 128, "
                 "registers: 128, smem: qkv}\n")
    r = simulate("flash2", AttentionProblem(seq_len=4096, head_dim=128, heads=16, dtype="bf16"), kernel=str(f))
    assert r.time.kernel == "mine" and (r.tiles.block_q, r.tiles.block_kv) == (128, 128)


def test_bad_kernels_are_refused_with_what_to_do(tmp_path):
    with pytest.raises(KernelError, match=r"no such built-in .*fa2"):
        load_kernel("fa9")
    f = tmp_path / "bad.yaml"
    f.write_text("name: bad\nfamily: fa2\nsource: x\nwarps: 4\nwarp: 3\n")
    with pytest.raises(KernelError, match="warp: unknown key"):
        load_kernel(str(f))
    with pytest.raises(KernelError, match="runs the schedules naive, not 'flash2'"):
        simulate("flash2", AttentionProblem(seq_len=1024, head_dim=64), kernel="iosim-naive")
    with pytest.raises(KernelError, match="no tiles for head_dim=512"):
        load_kernel("fa2").tiles_for(512)


def test_json_says_which_kernel_what_calibration_and_the_roofline_beside():
    j = simulate("flash2", AttentionProblem(seq_len=4096, head_dim=128, heads=16), "a100-sxm4-80gb",
                 kernel="fa2", l2=True).to_json()["time"]
    assert j["kernel"] == "fa2" and j["calibration"] == "uncalibrated"
    assert 0 < j["roofline_s"] < j["predicted_s"]  # peaks are what no kernel reaches
    j = simulate("flash1", AttentionProblem(seq_len=1024, head_dim=64)).to_json()["time"]
    assert j["kernel"] == "roofline" and j["roofline_s"] == j["predicted_s"]


def test_full_waves_scale_with_the_work_and_causal_costs_about_half():
    def t(**kw):
        p = AttentionProblem(seq_len=8192, head_dim=128, dtype="bf16", **kw)
        return simulate("flash2", p, kernel="fa2").time.predicted_s

    one, two = t(heads=64), t(heads=128)
    assert two / one == pytest.approx(2, rel=0.02)
    assert 0.45 < t(heads=128, causal=True) / two < 0.6  # half the tiles, plus the diagonal and the imbalance


def test_a_grid_under_one_wave_leaves_the_chip_idle():
    r = simulate("flash2", AttentionProblem(seq_len=2048, head_dim=128, dtype="bf16"), kernel="iosim-flash2")
    assert r.time.kernels[0].grid == 16 and r.time.kernels[0].utilization < 16 / 132 + 1e-9


def test_fa2_splits_a_grid_that_would_not_fill_the_gpu_as_torch_launches_it():
    # measured on the H100 (data/validation/h100-time.json): torch's flash backend ran flash_fwd_splitkv_kernel with
    # grid (32, 8, 1) for one head of N = 2048, d = 128: 32 Q blocks of 64 rows x 8 splits of the 16 K/V blocks
    p = AttentionProblem(seq_len=2048, head_dim=128, dtype="bf16")
    rates = timing.rates(get_profile("h100-sxm5-80gb"), "bf16")
    rows, heads, block_kv, n_blocks, splits = split_geometry(p, load_kernel("fa2"), rates)
    assert (rows, heads, block_kv, n_blocks, splits) == (2048, 1, 128, 16, 8)
    r = simulate("flash2", p, "h100-sxm5-80gb", kernel="fa2").to_json()["time"]["kernels"][0]
    assert r["resource_s"]["combine"] > 0  # the split kernel, then the combine kernel
    # decode, grouped-query: 4 query heads per kv head folded into rows; measured grid (1, 4, 64): 4 splits
    d = AttentionProblem(batch=8, heads=32, kv_heads=8, seq_len=1, kv_len=4096, head_dim=128, dtype="bf16")
    assert split_geometry(d, load_kernel("fa2"), rates)[4] == 4


def test_flash_attention_2s_split_heuristic():
    assert num_splits(300, 264, 512) == 1  # the grid already fills 80% of the slots
    # 64 blocks on 264 slots: 4 splits fill 97% of a wave, the first split count within 85% of the best
    assert num_splits(64, 264, 512) == 4
    assert num_splits(64, 264, 2) == 2  # never more splits than K/V blocks


def test_decode_takes_the_split_kv_kernel_and_is_memory_bound_at_long_kv():
    p = AttentionProblem(batch=8, heads=32, kv_heads=8, seq_len=1, kv_len=65536, head_dim=128, dtype="bf16")
    r = simulate("flash2", p, kernel="fa2", l2=True)
    k = r.time.kernels[0]
    assert k.bound == "dram"
    kv = 2 * 8 * 8 * 65536 * 128 * 2
    assert r.time.predicted_s >= kv / r.profile.dram.bandwidth.value


def test_warm_calls_on_inputs_that_fit_in_l2_move_no_dram_bytes():
    p = AttentionProblem(batch=1, heads=4, seq_len=1024, head_dim=64, dtype="bf16")
    cold = simulate("naive", p, l2=True).time.predicted_s
    warm = simulate("naive", p, l2=True, warm=True).time.predicted_s
    assert warm < cold


def test_dram_time_pays_for_mixing_reads_and_writes_as_the_measured_copy_does():
    r = timing.rates(get_profile("h100-sxm5-80gb"), "bf16")
    cal = get_profile("h100-sxm5-80gb").calibration.dram
    x = 1e9
    assert r.dram_s(x, 0) == pytest.approx(x / float(cal.read.value))  # a pure stream pays nothing
    assert r.dram_s(0, x) == pytest.approx(x / float(cal.write.value))
    assert r.dram_s(x, x) == pytest.approx(2 * x / float(cal.read_write.value))  # a copy runs at the copy's rate
    alone = x / float(cal.read.value) + 0.25 * x / float(cal.write.value)
    assert alone < r.dram_s(x, 0.25 * x) < r.dram_s(x, x)


def test_a_calls_first_kernel_and_each_further_kernel_cost_what_the_calibration_measured():
    r = timing.rates(get_profile("h100-sxm5-80gb"), "bf16")
    cal = get_profile("h100-sxm5-80gb").calibration.launch
    call, dependent = float(cal.call.value), float(cal.dependent.value)
    assert r.first_launch_s() == pytest.approx(call - r.l2_latency_s)  # the tiny kernel's own L2 load is the model's
    assert r.next_launch_s() == pytest.approx(dependent - r.l2_latency_s)
    prof = get_profile("h100-sxm5-80gb")
    launch = prof.calibration.launch.model_copy(update={"call": None, "dependent": None})  # calibrated before them
    older = prof.model_copy(update={"calibration": prof.calibration.model_copy(update={"launch": launch})})
    r_old = timing.rates(older, "bf16")
    assert r_old.first_launch_s() == r_old.next_launch_s() == r_old.launch_s
    p = AttentionProblem(batch=8, heads=32, kv_heads=8, seq_len=1, kv_len=256, head_dim=128, dtype="bf16")
    two = simulate("flash2", p, "h100-sxm5-80gb", kernel="fa2", warm=True).time.predicted_s  # split-KV + combine
    assert two > call + dependent - 2 * r.l2_latency_s


def test_an_fa3_kernel_runs_whole_tiles_past_a_ragged_end():
    """wgmma's shapes are fixed and both consumer warpgroups run every step of a Q tile: 777 tokens (7 tiles of 128,
    the last with 9 rows and 9 keys) cost the tensor cores and the softmax what 896 do; the loads move what is there."""
    def parts(n):
        p = AttentionProblem(batch=8, heads=16, seq_len=n, head_dim=64, dtype="bf16")
        return simulate("flash3", p, "h100-sxm5-80gb", kernel="cudnn", l2=False, run="single").time.kernels[0].resources

    ragged, whole = parts(777), parts(896)
    assert ragged["tensor"] == pytest.approx(whole["tensor"]) and ragged["softmax"] == pytest.approx(whole["softmax"])
    assert ragged["load"] < whole["load"]


def test_an_fa3_kernels_energy_prices_the_whole_tiles_it_runs():
    """The tensor FLOPs the energy prices are the tiles' (777 tokens: 896's), not the counts' (777²'s)."""
    p = AttentionProblem(batch=8, heads=16, seq_len=777, head_dim=64, dtype="bf16")
    r = simulate("flash3", p, "h100-sxm5-80gb", kernel="cudnn", l2=False, run="single")
    assert r.time.kernels[0].tensor_flops == 8 * 16 * 7 * 7 * 4 * 128 * 128 * 64 > r.counts.flops["matmul"]


def test_cudnns_forward_hands_its_q_tiles_out_in_the_grids_order_its_fp8_kernel_longest_first():
    """A causal forward's Q tiles grow from the first of a head to the last: cuDNN's tile counter hands them out in
    the grid's order (launch_order persistent-in-order), so the long ones come last and end later than placed
    longest first, as its fp8 instantiation is described (fp8_launch_order persistent); non-causal tiles are alike,
    and the order changes nothing."""
    desc = load_kernel("cudnn")
    assert (desc.order_for("bf16"), desc.order_for("fp8")) == ("persistent-in-order", "persistent")

    def pipeline(kernel, dtype="bf16", causal=True):
        p = AttentionProblem(batch=1, heads=8, seq_len=4096, head_dim=128, dtype=dtype, causal=causal)
        return simulate("flash3", p, "h100-sxm5-80gb", kernel=kernel, l2=False, run="single").time.kernels[0]

    longest = desc.model_copy(update={"launch_order": "persistent"})
    assert pipeline(desc).predicted_s > 1.3 * pipeline(longest).predicted_s
    assert pipeline(desc, causal=False).predicted_s == pytest.approx(pipeline(longest, causal=False).predicted_s)
    fp8_in_order = desc.model_copy(update={"fp8_launch_order": None})
    assert pipeline(fp8_in_order, "fp8").predicted_s > 1.3 * pipeline(desc, "fp8").predicted_s


def test_cudnns_tiles_are_the_ones_its_launches_name():
    """cuDNN's forward kernels name their tiles (..._{64}x{Bc}x{d}_..., Nsight Compute's wgmma instruction counts
    agree: iosim/timing/kernels/cudnn.yaml): every launch in the time records runs the description's Bc, but bf16 at
    d = 256, whose Bc = 128 (Q, K and V held once) the flash3 schedule's two K/V stages cannot hold."""
    import json
    import re
    from pathlib import Path

    from iosim.schedules import get_schedule
    from iosim.schedules.base import Tiles
    from iosim.schedules.fit import fits

    desc, seen = load_kernel("cudnn"), set()
    for name in ("h100-time", "h100-time-fp8", "h100-time-heldout", "h200-time-fp8"):
        rows = json.loads((Path(__file__).parent.parent / "data/validation" / f"{name}.json").read_text())["rows"]
        for r in rows:
            for launch in (r.get("launches") or []) if r["kernel"] == "cudnn" else []:
                m = re.search(r"flash_fprop_wgmma_f(?:16|8)_knob_\d+_64x(\d+)x\d+_", launch["name"])
                if m:
                    seen.add((r["dtype"], r["head_dim"], int(m.group(1))))
    assert {(t, d) for t, d, _ in seen} >= {("bf16", 64), ("bf16", 128), ("bf16", 256), ("fp8", 64), ("fp8", 256)}
    for dtype, d, bc in seen:
        if (dtype, d) == ("bf16", 256):
            p = AttentionProblem(seq_len=4096, head_dim=256, dtype="bf16")
            assert not fits(get_schedule("flash3"), p, Tiles(128, bc), get_profile("h100-sxm5-80gb"))
            continue
        assert desc.tiles_for(d, dtype).block_kv == bc, (dtype, d, bc)


def test_the_fa3_model_takes_values_of_their_own_width():
    """Values as wide as the keys are the model as it was; narrower ones shorten P V, the loads and O's store."""
    from iosim.timing import fa3

    prof = get_profile("h100-sxm5-80gb")
    p = AttentionProblem(batch=1, heads=16, seq_len=2048, head_dim=192, dtype="bf16", causal=True)
    same, same_parts = fa3.block_times(p, 128, 128, prof)
    given, given_parts = fa3.block_times(p, 128, 128, prof, value_dim=192)
    assert (same == given).all() and same_parts == given_parts
    narrow, parts = fa3.block_times(p, 128, 128, prof, value_dim=128)
    assert (narrow < same).all()
    assert parts["tensor"] == pytest.approx(same_parts["tensor"] * (192 + 128) / (2 * 192))


def test_values_of_their_own_width_only_through_the_fa3_family():
    from dataclasses import replace

    from iosim.schedules.base import Tiles
    from iosim.timing import KernelError, Workload, predict

    prof = get_profile("h100-sxm5-80gb")
    p = AttentionProblem(batch=1, heads=16, seq_len=1024, head_dim=192, dtype="bf16")
    r = simulate("flash3", p, prof, kernel="cudnn", l2=False)
    work = Workload("flash3", "forward", p, Tiles(128, 128), r.counts, [(0.0, 0.0)])
    narrow = predict(replace(work, value_dim=128), prof, "cudnn")
    assert narrow.predicted_s < predict(work, prof, "cudnn").predicted_s
    with pytest.raises(KernelError, match="only the fa3 family's forward model"):
        predict(replace(work, value_dim=128, schedule="flash2"), prof, "fa2")
