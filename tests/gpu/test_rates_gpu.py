"""``iosim calibrate rates`` on a real GPU: every quantity measured, written and read back, each within what the
hardware can do per SM per clock (bounds that hold on every NVIDIA GPU from sm_80 on)."""

from __future__ import annotations

import pytest

from iosim.calibrate.device import device_facts
from iosim.calibrate.rates import (
    calibration_section,
    measure_rates,
    measured_on,
    write_calibrated,
)
from iosim.gpu import GPUUnavailableError
from iosim.gpu._cupy import require_cupy

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def cal(tmp_path_factory):
    try:
        cp = require_cupy()
    except GPUUnavailableError as exc:
        pytest.skip(f"GPU test: {exc}")
    dev = device_facts(cp)
    lines: list[str] = []
    measured = measure_rates(10, lines.append, dev)
    section = calibration_section(measured, measured_on(dev, "pytest tests/gpu/test_rates_gpu.py"), dev["hopper"])
    profile = write_calibrated("h100-sxm5-80gb", section, tmp_path_factory.mktemp("rates") / "cal.yaml")
    c = profile.calibration
    per_clk = lambda x: x / (dev["sms"] * c.sm_clock.value)  # noqa: E731
    return c, dev, per_clk, lines


def test_every_quantity_is_printed_as_it_completes(cal):
    _, _, _, lines = cal
    assert sum(line.startswith(("mma_sync.", "dram.", "launch.", "smem.", "l2.", "latency.")) for line in lines) >= 22


def test_clock_and_per_sm_rates_are_within_the_hardware(cal):
    c, _, per_clk, _ = cal
    assert 0.5e9 < c.sm_clock.value < 3.5e9
    assert 100 < per_clk(c.fp32.fma.value) <= 256 * 1.02  # 64 or 128 fp32 lanes, FMA = 2 FLOPs
    assert 8 < per_clk(c.exp.throughput.value) <= 16 * 1.02  # 16 MUFU results per clock per SM
    assert 8 < c.exp.latency.value < 100
    for smem in (c.smem.ldmatrix, c.smem.ld128):
        assert 64 < per_clk(smem.value) <= 128 * 1.02  # 32 banks of 4 bytes per clock


def test_mma_sync_grows_with_warps_and_has_a_latency(cal):
    c, _, per_clk, _ = cal
    for mma in (c.mma_sync.fp16, c.mma_sync.bf16):
        t = mma.throughput.value
        assert sorted(t) == [1, 2, 4, 8, 16]
        assert t[16] > 2 * t[1] and max(t.values()) <= t[16] * 1.1
        assert per_clk(max(t.values())) <= 4096 * 1.02  # Hopper's dense peak per SM per clock
        assert 8 < mma.latency.value < 200


def test_wgmma_on_hopper_only_and_below_the_dense_peak(cal):
    c, dev, per_clk, _ = cal
    assert (c.wgmma is not None) == dev["hopper"]
    if c.wgmma is not None:
        assert c.wgmma.fp8 is not None  # every new measurement has it (null only in files calibrated before it)
        for w, peak in ((c.wgmma.fp16, 4096), (c.wgmma.bf16, 4096), (c.wgmma.fp8, 8192)):  # FLOP/clk/SM, dense
            best = max(max(w.n128.value.values()), max(w.n256.value.values()))
            assert peak / 2 < per_clk(best) <= peak * 1.02  # fp8 (k32): twice the 16-bit types' FLOPs per cycle


def test_memory_and_launch_costs_are_in_order(cal):
    c, _, _, _ = cal
    assert c.dram.read.value < c.l2.read.value < c.smem.ld128.value
    assert 0.3 * c.dram.read.value < c.dram.write.value and 0.3 * c.dram.read.value < c.dram.read_write.value
    assert 0.2e-6 < c.launch.interval.value < 50e-6 and c.launch.interval.value <= c.launch.host_interval.value * 1.5
    assert 0 < c.launch.per_block.value < 10e-6


def test_memory_latency_of_a_dependent_load(cal):
    c, _, _, lines = cal
    lat = c.latency
    assert lat is not None  # every new measurement has it
    assert 50e-9 < lat.l2.value < 1.5e-6 and 150e-9 < lat.dram.value < 3e-6  # far outside: the chase is broken
    assert lat.dram.value > 1.2 * lat.l2.value  # the DRAM chain really missed L2
    assert c.launch.interval.value > lat.dram.value  # an empty kernel costs more than one DRAM round trip
    cycles = lat.l2.value * c.sm_clock.value
    assert 100 < cycles < 2000, cycles  # an L2 hit is some hundreds of SM cycles on every GPU from sm_80 on
    assert sum(line.startswith("latency.") for line in lines) == 2


def test_backward_steps_are_bound_by_the_tensor_cores_and_measured_for_ours(cal):
    """A step runs five GEMMs of 2·Br·Bc·d FLOPs: no kernel's step beats them at the dense tensor peak (4096
    FLOP/clk/SM for 16-bit types), and none takes ten times as long; iosim's flash2 backward is measured at every
    head dim its tiles list (the peers where torch runs)."""
    from iosim.timing import load_kernel

    c, _, _, lines = cal
    assert c.backward is not None
    assert sorted(c.backward.step["iosim-flash2-bwd"].value) == sorted(load_kernel("iosim-flash2-bwd").tiles)
    for name, table in c.backward.step.items():
        desc = load_kernel(name)
        for d, seconds in table.value.items():
            tc = desc.tiles_for(d)
            floor = 5 * 2 * tc.block_q * tc.block_kv * d / (4096 * c.sm_clock.value)
            assert floor < seconds < 10 * floor, (name, d, seconds, floor)
    assert sum(line.startswith("backward.step.") for line in lines) == sum(len(t.value) for t in
                                                                            c.backward.step.values())
    # a further work tile: its start, 2·Bc·d elements in and out, the pipeline's fill: microseconds, not a step's
    # fraction of a nanosecond nor a call's worth
    fixed = c.backward.tile_fixed
    assert fixed is not None and {k: sorted(t.value) for k, t in fixed.items()} == {
        k: sorted(t.value) for k, t in c.backward.step.items()}
    for name, table in fixed.items():
        for d, seconds in table.value.items():
            assert 0.1e-6 < seconds < 50e-6, (name, d, seconds)


def test_forward_steps_are_bound_by_the_tensor_cores(cal):
    """A K/V step of iosim's flash2 forward (any GPU) and of its flash3 forward (Hopper only) runs two GEMMs of
    2·Br·Bc·d FLOPs: no step beats them at the dense tensor peak (4096 FLOP/clk/SM for bf16, 8192 for fp8), none
    takes ten times as long."""
    from iosim.timing import load_kernel
    from iosim.timing.fa3 import value_key
    from iosim.timing.mla import PREFILL_REFERENCE

    c, dev, _, _ = cal
    assert c.forward is not None and c.forward.resident_step is not None  # flash2: any GPU of cc 8.0 or more
    flash2, steps = load_kernel("iosim-flash2"), c.forward.resident_step["iosim-flash2"]
    for d in flash2.tiles:
        own = flash2.tiles_for(d)
        assert 1 in steps[f"d{d}_{own.block_q}x{own.block_kv}"].value  # the description's tiles, one block an SM
    # the dense kernel's tiles, then its varlen instantiation's and its paged one's (pages of 16 and 64)
    assert {key.partition("-")[2] for key in steps} == {"", "varlen", "paged16", "paged64"}
    for key, table in steps.items():  # k blocks an SM: k steps' GEMMs on the SM's tensor cores
        shape = key.partition("-")[0]
        d, (bq, bkv) = int(shape.split("_")[0][1:]), map(int, shape.split("_")[1].split("x"))
        for k, seconds in table.value.items():
            floor = k * 4 * bq * bkv * d / (4096 * c.sm_clock.value)
            assert floor < seconds < 10 * floor, (key, k, seconds, floor)
    # its mask pass, at the dense and varlen instantiations' tiles and residencies: more than nothing, less than two
    # steps (a pass over the scores, no GEMM)
    masked = c.forward.masked_step["iosim-flash2"]
    assert sorted(masked) == sorted(key for key in steps if "-paged" not in key)
    for key, table in masked.items():
        assert sorted(table.value) == sorted(steps[key].value)
        assert all(0 < s < 2 * steps[key].value[k] for k, s in table.value.items()), (key, table.value)
    if not dev["hopper"]:
        assert not c.forward.step
        return
    # ours by input type, its Local and Varlen instantiations; cuDNN's fp8 forward where cudnn-frontend imports here,
    # and its bf16 forward at MLA prefill's widths (keys of 192, values of 128) where torch does
    mla = value_key("bf16", 128, PREFILL_REFERENCE)
    cudnn_kinds = sorted([mla] * _imports("torch") + ["fp8"] * (_imports("cudnn") and _imports("torch")))
    for kernel, kinds in (("iosim-flash3", ["bf16", "bf16-local", "bf16-varlen", "fp8"]), ("cudnn", cudnn_kinds)):
        if not kinds:
            assert kernel not in c.forward.step
            continue
        desc = load_kernel(kernel)
        assert sorted(c.forward.step[kernel]) == kinds
        for kind, table in c.forward.step[kernel].items():
            dtype = kind.split("-")[0]
            own = [192] if kind == mla else sorted(desc.fp8_tiles if dtype == "fp8" else desc.tiles)
            assert sorted(table.value) == own
            for d, seconds in table.value.items():
                tc = PREFILL_REFERENCE if kind == mla else desc.tiles_for(d, dtype)
                width = d + 128 if kind == mla else 2 * d  # Q K^T at the keys' width, P V at the values'
                floor = 2 * tc.block_q * tc.block_kv * width / ((8192 if dtype == "fp8" else 4096) * c.sm_clock.value)
                assert floor < seconds < 10 * floor, (kernel, kind, d, seconds, floor)
                if kind.endswith("-varlen"):  # its step alone: a long sequence's tile and call parts are not kept
                    assert kind not in c.forward.tile_fixed[kernel] and kind not in c.forward.call_fixed[kernel]
                    continue
                # a tile's and a call's fixed parts: a few microseconds each (loads and stores of a tile, a launch)
                tile = c.forward.tile_fixed[kernel][kind].value[d]
                call = c.forward.call_fixed[kernel][kind].value[d]
                assert 0 < tile < 50e-6 and 0 < call < 50e-6, (kernel, kind, d, tile, call)


def test_torchs_flashattention2_forward_step_and_masked_step(cal):
    """torch's FlashAttention-2 forward (the fa2 description) where torch runs: its step at every head dim, dense and
    varlen, bound by the tensor cores as ours; a step of its masking loop costs more than none and less than two
    plain steps (one mask pass over the scores, not a second GEMM). Its split-KV path: a step at two blocks an SM at
    every head dim, bound the same way, and a call part of microseconds (two launches and a combine's chain)."""
    from iosim.timing import load_kernel

    c, _, _, _ = cal
    if not _imports("torch"):
        assert "fa2" not in (c.forward.resident_step or {})
        return
    desc, steps, masked = load_kernel("fa2"), c.forward.resident_step["fa2"], c.forward.masked_step["fa2"]
    split = {key: t for key, t in steps.items() if key.endswith("-splitkv")}
    steps = {key: t for key, t in steps.items() if key not in split}
    assert sorted(steps) == sorted(masked) and {key.partition("-")[2] for key in steps} == {"", "varlen"}
    assert {int(key.split("_")[0][1:]) for key in steps} == set(desc.tiles)
    for key, table in steps.items():
        d = int(key.split("_")[0][1:])
        tc = desc.tiles_for(d)
        for k, seconds in table.value.items():
            floor = k * 4 * tc.block_q * tc.block_kv * d / (4096 * c.sm_clock.value)
            assert floor < seconds < 10 * floor, (key, k, seconds, floor)
            assert 0 < masked[key].value[k] < 2 * seconds, (key, k, masked[key].value[k], seconds)
    assert sorted(split) == sorted(f"d{d}_64x{desc.split_kv.block_kv[d]}-splitkv" for d in desc.tiles)
    for key, table in split.items():
        d = int(key.split("_")[0][1:])
        assert list(table.value) == [2], key  # one wave of two blocks an SM
        floor = 2 * 4 * 64 * desc.split_kv.block_kv[d] * d / (4096 * c.sm_clock.value)
        assert floor < table.value[2] < 10 * floor, (key, table.value[2], floor)
    fixed = c.forward.call_fixed["fa2"]["bf16-splitkv"].value
    assert sorted(fixed) == sorted(desc.tiles) and all(1e-6 < s < 100e-6 for s in fixed.values()), fixed


def _imports(module: str) -> bool:
    try:
        __import__(module)
    except ImportError:
        return False
    return True
