"""CPU profiles load with a source for every number; the CPU cache model counts what the CPU code executes."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from iosim import AttentionProblem, ProfileError
from iosim.cpu.detect import detect_profile
from iosim.cpu.host import host_caches
from iosim.hardware.cpu import (
    builtin_cpu_profile_names,
    cpu_profile_from_dict,
    get_cpu_profile,
    is_cpu_profile,
)
from iosim.schedules import Tiles
from iosim.simulate_cpu import (
    NAIVE_PASSES,
    CpuModelError,
    _visits,
    default_tiles,
    simulate_cpu,
)


def _numbers(obj, path=""):
    if isinstance(obj, dict):
        if "value" in obj and "source" in obj:
            yield path, obj
        for k, v in obj.items():
            yield from _numbers(v, f"{path}.{k}")
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _numbers(v, f"{path}[{i}]")


@pytest.mark.parametrize("name", builtin_cpu_profile_names())
def test_every_builtin_number_has_a_source(name):
    p = get_cpu_profile(name)
    found = list(_numbers(p.model_dump()))
    assert len(found) >= 16
    assert all(n["source"].strip() for _, n in found)
    assert is_cpu_profile(name)


def test_builtins_cover_an_epyc_a_xeon_and_a_neoverse_v2():
    names = builtin_cpu_profile_names()
    assert {"amd-epyc-9654", "intel-xeon-8480plus", "nvidia-grace"} <= set(names)


def test_unknown_key_and_misordered_caches_are_rejected_naming_the_field():
    data = get_cpu_profile("amd-epyc-9654").model_dump(mode="json")
    with pytest.raises(ProfileError, match=r"dram.colour: unknown key"):
        cpu_profile_from_dict({**data, "dram": {**data["dram"], "colour": 1}})
    with pytest.raises(ProfileError, match="innermost first"):
        cpu_profile_from_dict({**data, "caches": data["caches"][::-1]})


def test_a_missing_measured_rate_names_the_field_and_detect():
    p = get_cpu_profile("nvidia-grace")
    with pytest.raises(ProfileError, match=r"compute\.gemm has no 'tile' rate.*detect"):
        p.gemm_rate("tile", 64)


@given(st.sampled_from([16, 32, 64, 96, 128, 256]), st.sampled_from([4, 8]),
       st.sampled_from([256 << 10, 1 << 20, 2 << 20]))
def test_default_tiles_fill_at_most_half_the_l2(d, e, l2):
    t = default_tiles(d, e, l2)
    B = t.block_q
    assert t.block_kv == B and 16 <= B <= 512
    assert B == 16 or e * (B * B + 4 * B * d) <= l2 // 2
    assert B == 512 or e * (4 * B * B + 8 * B * d) > l2 // 2  # twice as large would not fit


def test_default_tiles_on_a_1_mib_l2():
    assert default_tiles(64, 4, 1 << 20) == Tiles(256, 256)
    assert default_tiles(128, 4, 1 << 20) == Tiles(128, 128)


@given(st.integers(1, 300), st.integers(1, 300), st.integers(1, 64), st.integers(1, 64), st.booleans())
def test_visits_count_the_score_elements_the_kernel_computes(N, Nk, Br, Bc, causal):
    p = AttentionProblem(seq_len=N, kv_len=Nk, head_dim=8, dtype="fp32", causal=causal)
    # brute force, the kernel's loop: each Q block walks K/V blocks while some row sees a key in them
    s_elems = 0
    for r0 in range(0, N, Br):
        nr = min(Br, N - r0)
        for c0 in range(0, Nk, Bc):
            if not causal or c0 <= r0 + nr - 1 + (Nk - N):
                s_elems += nr * min(Bc, Nk - c0)
    assert _visits(p, Tiles(Br, Bc))[2] == s_elems


def test_flash2_reaches_dram_with_compulsory_bytes_when_k_v_fit_the_l3():
    prof = get_cpu_profile("amd-epyc-9654")
    p = AttentionProblem(seq_len=8192, head_dim=64, heads=2, dtype="fp32")
    r = simulate_cpu("flash2", p, prof)
    assert r.traffic["dram"] == 2 * 4 * 8192 * 64 * 4  # Q, K, V, O once per head
    assert r.flops["matmul"] == 4 * 8192 * 8192 * 64 * 2


def test_naive_passes_over_s_cross_dram_once_s_exceeds_the_l3():
    prof = get_cpu_profile("amd-epyc-9654")
    small = simulate_cpu("naive", AttentionProblem(seq_len=1024, head_dim=64, dtype="fp32"), prof)
    big = simulate_cpu("naive", AttentionProblem(seq_len=8192, head_dim=64, dtype="fp32"), prof)
    s = 8192 * 8192 * 4
    passes = sum(r + w for _, r, w in NAIVE_PASSES)
    assert small.traffic["dram"] == 4 * 1024 * 64 * 4
    assert big.traffic["dram"] == 4 * 8192 * 64 * 4 + passes * s
    flash = simulate_cpu("flash2", AttentionProblem(seq_len=8192, head_dim=64, dtype="fp32"), prof)
    assert all(flash.traffic[b] < big.traffic[b] for b in ("dram", "l3"))


def test_causal_flash2_skips_blocks_past_the_diagonal():
    prof = get_cpu_profile("intel-xeon-8480plus")
    full = simulate_cpu("flash2", AttentionProblem(seq_len=4096, head_dim=128, dtype="fp32"), prof)
    causal = simulate_cpu("flash2", AttentionProblem(seq_len=4096, head_dim=128, dtype="fp32", causal=True), prof)
    assert 0.5 < causal.flops["matmul"] / full.flops["matmul"] < 0.6


def test_builtin_profiles_give_a_bound_but_no_prediction_and_json_round_trips():
    r = simulate_cpu("flash2", AttentionProblem(seq_len=4096, head_dim=64, dtype="fp32"), get_cpu_profile("nvidia-grace"))
    assert r.time.predicted_s is None and r.time.bound_s > 0
    d = json.loads(r.to_json())
    assert d["device"] == "cpu" and d["traffic"] == r.traffic and d["tiles"] == {"block_q": 256, "block_kv": 256}


def test_model_errors_name_the_field():
    prof = get_cpu_profile("amd-epyc-9654")
    with pytest.raises(CpuModelError, match="schedule='flash1'"):
        simulate_cpu("flash1", AttentionProblem(seq_len=64, dtype="fp32"), prof)
    with pytest.raises(CpuModelError, match="dtype='fp8'"):
        simulate_cpu("flash2", AttentionProblem(seq_len=64, dtype="fp8"), prof)


def _measured(**dram) -> object:
    """A profile with the measured rates detect writes (round numbers, not this machine's)."""
    data = get_cpu_profile("amd-epyc-9654").model_dump(mode="json")
    src = "test"
    data["dram"].update({"bandwidth_one_core": {"value": 20e9, "source": src},
                         "first_touch": {"value": 10e9, "source": src}}, **dram)
    data["compute"].update({
        "gemm": [{"kind": k, "head_dim": 64, "value": r, "source": src}
                 for k, r in (("qk", 100e9), ("pv", 80e9), ("tile", 120e9))],
        "softmax_fp32": {"value": 2e9, "source": src}, "numpy_exp_fp32": {"value": 1e9, "source": src}})
    return cpu_profile_from_dict(data)


def test_naive_first_call_touches_s_at_the_cold_rate_and_a_warm_call_at_the_recycled_rate():
    cold = {"first_touch_cold": {"value": 0.5e9, "source": "test"}}
    p = AttentionProblem(seq_len=8192, head_dim=64, heads=2, dtype="fp32")
    s = 2 * 8192 * 8192 * 4  # both heads' S, bytes
    t = simulate_cpu("naive", p, _measured(**cold)).time
    assert t.terms["first_touch_s"] == pytest.approx(s / 10e9)
    assert t.predicted_s == pytest.approx(sum(t.terms.values()))
    assert t.first_call_s == pytest.approx(t.predicted_s - s / 10e9 + s / 0.5e9)
    assert "first call" in simulate_cpu("naive", p, _measured(**cold)).describe()
    # flash2 allocates O(N d): its first call is predicted like a warm one
    f = simulate_cpu("flash2", p, _measured(**cold)).time
    assert f.first_call_s == f.predicted_s is not None
    # a profile without the cold rate (detected before it was measured) predicts warm calls only
    assert simulate_cpu("naive", p, _measured()).time.first_call_s is None
    assert json.loads(simulate_cpu("naive", p, _measured(**cold)).to_json())["time"]["first_call_s"] > 0


def test_sysfs_lists_this_machines_data_caches_innermost_first():
    levels = [c.level for c in host_caches()]
    if not levels:
        pytest.skip("no sysfs cache information on this OS")
    assert levels[:3] == ["l1d", "l2", "l3"] or levels[:2] == ["l1d", "l2"]
    assert all(c.size > 0 and c.line_size > 0 for c in host_caches())


@pytest.mark.slow
def test_detect_builds_a_profile_whose_prediction_is_calibrated():
    prof = detect_profile()
    assert prof.require("dram.bandwidth") > 0 and {g.kind for g in prof.compute.gemm} == {"qk", "pv", "tile"}
    for s in ("naive", "flash2"):
        r = simulate_cpu(s, AttentionProblem(seq_len=4096, head_dim=64, dtype="fp32"), prof)
        assert r.time.predicted_s is not None and r.time.predicted_s >= r.time.bound_s * 0.999
        assert r.time.first_call_s >= r.time.predicted_s
    assert prof.require("dram.first_touch_cold") > 0 and prof.require("dram.first_touch") > 0
