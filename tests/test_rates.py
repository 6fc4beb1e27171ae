"""``iosim calibrate rates`` without a GPU: the profile's calibration section (schema, label, accessor), the writer,
the refusal where no GPU is present, and kernels/rates.cu agreeing with the lists the Python side launches."""

from __future__ import annotations

import copy
import json
import re
import sys

import numpy as np
import pytest
import yaml
from helpers import run_cli

from iosim import AttentionProblem, simulate
from iosim._resources import kernels_dir
from iosim.calibrate import rates, rates_kernels, rates_wgmma
from iosim.calibrate.device import guess_profile
from iosim.calibrate.rates import Measured, calibration_section, write_calibrated
from iosim.gpu import build, build_rates
from iosim.gpu.flash3_host import _wgmma_fn
from iosim.hardware.gpu import PROFILES_DIR, ProfileError, get_profile, load_profile_file, profile_from_dict
from iosim.timing.rates import rates as timing_rates

ON = {"device": "NVIDIA H100 80GB HBM3", "driver": "580.65.06", "cuda": "13.0 (CuPy 14.0.0)", "date": "2026-11-24",
      "commit": "abc1234", "command": "iosim calibrate rates -o h100.yaml --profile h100-sxm5-80gb"}


def _measured(hopper: bool = True, fp8: bool = True) -> list[Measured]:
    """What a run on an H100 might measure (made-up but plausible numbers); ``fp8``: with the fp8 wgmma table (a
    run from before the fp8 probe had none)."""
    m = [Measured(("sm_clock",), 1.755e9, "Hz", "clock64 over globaltimer")]
    for dt in ("fp16", "bf16"):
        m += [Measured(("mma_sync", dt, "throughput", w), 40e12 * min(w, 12), "FLOP/s", "mma") for w in (1, 2, 4, 8, 16)]
        m.append(Measured(("mma_sync", dt, "latency"), 33.25, "cycles", "chain"))
        if hopper:
            m += [Measured(("wgmma", dt, f"n{n}", wg), 250e12 * wg + n * 1e9, "FLOP/s", "wgmma")
                  for n in (128, 256) for wg in (1, 2, 3)]
            m.append(Measured(("wgmma", dt, "wait"), 199.6, "cycles", "wgmma round trip"))
    if hopper and fp8:
        m += [Measured(("wgmma", "fp8", f"n{n}", wg), 500e12 * wg + n * 1e9, "FLOP/s", "wgmma e4m3")
              for n in (128, 256) for wg in (1, 2, 3)]
    m += [Measured(("exp", "throughput"), 3.7e12, "op/s", "ex2"), Measured(("exp", "latency"), 18.0, "cycles", "ex2"),
          Measured(("fp32", "fma"), 59.3e12, "FLOP/s", "fma"), Measured(("fp32", "add"), 29.6e12, "FLOP/s", "add"),
          Measured(("fp32", "max"), 14.8e12, "op/s", "max"), Measured(("smem", "ldmatrix"), 29.5e12, "B/s", "ldsm"),
          Measured(("smem", "ld128"), 29.6e12, "B/s", "lds"), Measured(("l2", "read"), 9.8e12, "B/s", "l2"),
          Measured(("l2", "write"), 8.1e12, "B/s", "l2"), Measured(("dram", "read"), 3.01e12, "B/s", "dram"),
          Measured(("dram", "write"), 2.9e12, "B/s", "dram"), Measured(("dram", "read_write"), 2.8e12, "B/s", "copy"),
          Measured(("launch", "interval"), 2.1e-6, "s", "queued"), Measured(("launch", "host_interval"), 6.3e-6, "s", "py"),
          Measured(("launch", "per_block"), 0.21e-6, "s", "blocks"),
          Measured(("latency", "l2"), 262e-9, "s", "chase"), Measured(("latency", "dram"), 531e-9, "s", "chase")]
    return m


def _with_calibration(section: dict) -> dict:
    data = yaml.safe_load((PROFILES_DIR / "h100-sxm5-80gb.yaml").read_text())
    return {**data, "calibration": section}


def test_a_profile_with_a_calibration_section_loads_and_says_where_it_was_measured():
    p = profile_from_dict(_with_calibration(calibration_section(_measured(), ON, hopper=True)))
    c = p.calibration
    assert c.sm_clock.value == pytest.approx(1.755e9)
    assert c.mma_sync.bf16.throughput.value == {1: 40e12, 2: 80e12, 4: 160e12, 8: 320e12, 16: 480e12}
    assert c.wgmma.bf16.n256.value[3] == pytest.approx(750.3e12, rel=1e-3)
    assert c.launch.interval.value == pytest.approx(2.1e-6)
    assert c.dram.read_write.value == pytest.approx(2.8e12)
    assert c.exp.throughput.source.startswith("measured on NVIDIA H100 80GB HBM3, 2026-11-24, iosim calibrate rates: ")
    assert p.calibration_label() == ("measured on NVIDIA H100 80GB HBM3, driver 580.65.06, CUDA 13.0 (CuPy 14.0.0), "
                                     "2026-11-24, commit abc1234")
    assert p.measured("dram.read") == pytest.approx(3.01e12)
    assert p.measured("mma_sync.fp16.latency") == pytest.approx(33.25)
    assert p.measured("mma_sync.bf16.throughput")[16] == pytest.approx(480e12)
    assert p.measured("latency.l2") == pytest.approx(262e-9) and p.measured("latency.dram") == pytest.approx(531e-9)


def test_the_wgmma_wait_is_the_intercept_of_the_round_trip_and_lands_in_the_profile_and_the_rates():
    """rates_wgmma_chain's cycles per round trip against the chain's length: a line whose intercept is the wait."""
    assert rates_wgmma.wgmma_round_trip({1: 300.0, 2: 400.0, 4: 600.0, 8: 1000.0}) == pytest.approx((200.0, 100.0))
    p = profile_from_dict(_with_calibration(calibration_section(_measured(), ON, hopper=True)))
    assert float(p.calibration.wgmma.bf16.wait.value) == pytest.approx(199.6)
    assert timing_rates(p, "bf16").wgmma_wait_s == pytest.approx(199.6 / 1.755e9)
    assert timing_rates(p, "fp8").wgmma_wait_s == pytest.approx(199.6 / 1.755e9)  # fp16's: no fp8 backward here


def test_the_fp8_wgmma_table_lands_in_the_profile_and_the_fp8_time_model_uses_it():
    p = profile_from_dict(_with_calibration(calibration_section(_measured(), ON, hopper=True)))
    table = p.calibration.wgmma.fp8.n128.value
    assert table == pytest.approx({1: 500.128e12, 2: 1000.128e12, 3: 1500.128e12}, rel=1e-3)  # 4 digits written
    assert p.measured("wgmma.fp8.n256")[3] == pytest.approx(1500.256e12, rel=1e-3)
    assert p.calibration.wgmma.fp8.n256.source.endswith("iosim calibrate rates: wgmma e4m3")
    problem = AttentionProblem(batch=4, heads=16, seq_len=4096, head_dim=128, dtype="fp8")
    r = simulate("flash3", problem, p, kernel="iosim-flash3", l2=False)
    br, bc = r.tiles.block_q, r.tiles.block_kv  # whole tiles (the fp8 kernel's 176-key tiles leave a ragged last one)
    tiles = problem.batch * problem.heads * -(-problem.seq_len // br) * -(-problem.kv_len // bc)
    assert r.time.kernels[0].resources["tensor"] == pytest.approx(tiles * 4 * br * bc * 128 / table[3], rel=1e-9)
    assert "fp8 wgmma not measured" not in r.time.calibration


def test_a_calibration_from_before_the_fp8_wgmma_probe_still_loads_and_says_fp8_is_estimated():
    p = profile_from_dict(_with_calibration(calibration_section(_measured(fp8=False), ON, hopper=True)))
    assert p.calibration.wgmma.fp8 is None and p.measured("wgmma.fp8.n128") is None
    assert p.measured("wgmma.bf16.n128")[1] == pytest.approx(250.128e12, rel=1e-3)
    problem = AttentionProblem(batch=4, heads=16, seq_len=4096, head_dim=128, dtype="fp8")
    assert "fp8 wgmma not measured" in simulate("flash3", problem, p, kernel="iosim-flash3", l2=False).time.calibration


def test_a_calibration_from_before_the_memory_latencies_still_loads():
    section = calibration_section(_measured(), ON, hopper=True)
    del section["latency"]
    p = profile_from_dict(_with_calibration(section))
    assert p.calibration.latency is None and p.measured("latency.l2") is None
    assert p.measured("dram.read") == pytest.approx(3.01e12)
    builtin = get_profile("h100-sxm5-80gb")  # its calibration section (2026-11-24) predates them
    assert builtin.calibration is not None and builtin.measured("launch.interval") > 0


def test_a_new_measurement_needs_the_memory_latencies():
    with pytest.raises(rates.RatesError, match=r"latency\.dram"):
        calibration_section([m for m in _measured() if m.path != ("latency", "dram")], ON, hopper=True)


def test_without_a_calibration_a_profile_stays_valid_and_uncalibrated():
    p = get_profile("a100-sxm4-80gb")
    assert p.calibration is None and p.calibration_label() == "uncalibrated"
    assert p.measured("dram.read") is None
    other = profile_from_dict(_with_calibration(calibration_section(_measured(hopper=False), ON, hopper=False)))
    assert other.calibration.wgmma is None and other.measured("wgmma.bf16.n128") is None


def test_a_profile_dump_validates_again():
    p = profile_from_dict(_with_calibration(calibration_section(_measured(), ON, hopper=True)))
    assert profile_from_dict(p.model_dump()) == p
    assert profile_from_dict(json.loads(p.model_dump_json())) == p


@pytest.mark.parametrize(
    ("change", "field", "words"),
    [
        (lambda c: c["mma_sync"]["bf16"]["throughput"]["value"].update({0: "1 TFLOP/s"}),
         "calibration.mma_sync.bf16.throughput.value[0] (key)", "greater than or equal to 1"),
        (lambda c: c["dram"]["read"].update(value="-3 TB/s"), "calibration.dram.read.value", "-3 TB/s"),
        (lambda c: c["launch"]["interval"].update(value="2 parsecs"), "calibration.launch.interval.value", "2 parsecs"),
        (lambda c: c["launch"]["per_block"].update(value=0), "calibration.launch.per_block.value", "positive"),
        (lambda c: c["exp"]["latency"].update(value=-1), "calibration.exp.latency.value", "greater than 0"),
        (lambda c: c["measured_on"].update(date="yesterday"), "calibration.measured_on.date", "yesterday"),
        (lambda c: c["wgmma"]["fp16"].pop("n256"), "calibration.wgmma.fp16.n256", "required field is missing"),
        (lambda c: c["l2"].update(bandwidth=c["l2"]["read"]), "calibration.l2.bandwidth", "unknown key"),
        (lambda c: c.pop("measured_on"), "calibration.measured_on", "required field is missing"),
        (lambda c: c["latency"]["dram"].update(value="-1 ns"), "calibration.latency.dram.value", "-1 ns"),
        (lambda c: c["latency"].pop("l2"), "calibration.latency.l2", "required field is missing"),
        (lambda c: c["latency"].update(l1=c["latency"]["l2"]), "calibration.latency.l1", "unknown key"),
    ],
)
def test_bad_calibration_values_are_refused_with_the_field_named(change, field, words):
    section = copy.deepcopy(calibration_section(_measured(), ON, hopper=True))
    change(section)
    with pytest.raises(ProfileError) as info:
        profile_from_dict(_with_calibration(section), "h100.yaml")
    line = next(x for x in str(info.value).splitlines() if x.strip().startswith(field + ":"))
    assert words in line


def test_times_read_as_people_write_them():
    section = calibration_section(_measured(), ON, hopper=True)
    for text, seconds in (("2.5 us", 2.5e-6), ("2.5µs", 2.5e-6), ("40 ns", 40e-9), ("1.5e-3", 1.5e-3), (3e-6, 3e-6)):
        section["launch"]["interval"]["value"] = text
        assert profile_from_dict(_with_calibration(section)).calibration.launch.interval.value == pytest.approx(seconds)


def test_the_writer_keeps_the_base_text_and_its_output_loads_back(tmp_path):
    section = calibration_section(_measured(), ON, hopper=True)
    out = tmp_path / "h200-calibrated.yaml"
    written = write_calibrated("a100-sxm4-80gb", section, out)  # a built-in without a calibration section
    text = out.read_text()
    assert text.startswith((PROFILES_DIR / "a100-sxm4-80gb.yaml").read_text().rstrip("\n"))  # comments kept
    loaded = load_profile_file(out)
    assert loaded == written and loaded.name == "a100-sxm4-80gb"
    assert loaded.calibration.l2.read.value == pytest.approx(9.8e12)
    assert loaded.calibration.mma_sync.fp16.throughput.value[8] == pytest.approx(320e12)
    assert loaded.calibration.latency.dram.value == pytest.approx(531e-9)
    assert "\n  latency:\n    l2:\n      value: 262 ns\n" in text
    assert loaded.dram.bandwidth.value == get_profile("a100-sxm4-80gb").dram.bandwidth.value  # the rest unchanged
    # calibrating a calibrated file replaces its section; JSON out works too
    again = write_calibrated(str(out), calibration_section(_measured(hopper=False), ON, hopper=False),
                             tmp_path / "again.json")
    assert again.calibration.wgmma is None and load_profile_file(tmp_path / "again.json") == again


def test_values_are_written_in_units_people_read():
    section = calibration_section(_measured(), ON, hopper=True)
    assert section["dram"]["read"]["value"] == "3.01 TB/s"
    assert section["mma_sync"]["bf16"]["throughput"]["value"][16] == "480 TFLOP/s"
    assert section["launch"]["interval"]["value"] == "2.1 us"
    assert section["sm_clock"]["value"] == "1.755 GHz"
    assert section["exp"]["latency"]["value"] == 18.0
    assert section["latency"]["l2"]["value"] == "262 ns" and section["latency"]["dram"]["value"] == "531 ns"


def test_without_a_gpu_the_command_refuses_in_one_line(monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(sys.modules, "cupy", None)  # `import cupy` raises ImportError
    code, _out, err = run_cli(["calibrate", "rates", "-o", str(tmp_path / "x.yaml")], capsys)
    assert code != 0 and not (tmp_path / "x.yaml").exists()
    assert len(err.strip().splitlines()) == 1 and err.startswith("iosim: error: ") and "CuPy" in err


@pytest.mark.parametrize(
    ("device", "name"),
    [("NVIDIA H100 80GB HBM3", "h100-sxm5-80gb"), ("NVIDIA H200", "h200-sxm-141gb"),
     ("NVIDIA A100-SXM4-40GB", "a100-sxm4-40gb"), ("NVIDIA A100-SXM4-80GB", "a100-sxm4-80gb")],
)
def test_the_base_profile_is_found_by_the_device_name(device, name):
    assert guess_profile(device) == name


def test_an_unknown_device_needs_a_profile():
    with pytest.raises(rates.RatesError, match="--profile"):
        guess_profile("Some Accelerator")


def test_rates_cu_agrees_with_what_python_launches():
    src = (kernels_dir() / build_rates.RATES_SOURCE).read_text()
    assert f"kChains = {rates.CHAINS};" in src and f"kAluUnroll = {rates.ALU_UNROLL};" in src
    for ctype in ("__half", "__nv_bfloat16", "e4m3"):  # the m64n256 wrappers are flash3's generator's text
        assert _wgmma_fn("ss", 256, ctype) in src
    header = (kernels_dir() / "flash3_wgmma.cuh").read_text()
    for n in build_rates.RATES_WGMMA_N:  # every wrapper rates_wgmma uses is defined once: in flash3's header or here
        for ctype in ("__half", "__nv_bfloat16", "e4m3"):
            assert (_wgmma_fn("ss", n, ctype) in src) + (_wgmma_fn("ss", n, ctype) in header) == 1, (n, ctype)
    # one instruction's K: 16 for 16-bit inputs, 32 for e4m3, 32 bytes of a row either way (the kernel's k-step)
    assert [(dt, k) for dt, _, k in rates_wgmma.WGMMA_TYPES] == [("float16", 16), ("bfloat16", 16), ("e4m3", 32)]
    assert {dt for dt, _, _ in rates_wgmma.WGMMA_TYPES} == set(build_rates.RATES_WGMMA_TYPES)
    assert "m64n256k32.f32.e4m3.e4m3" in _wgmma_fn("ss", 256, "e4m3")
    kernels = set(re.findall(r"__global__ void(?: __launch_bounds__\([^)]*\))?\s+(rates_\w+)", src))
    assert {"rates_alu", "rates_alu_latency", "rates_mma", "rates_mma_latency", "rates_wgmma", "rates_smem",
            "rates_read", "rates_write", "rates_copy", "rates_empty", "rates_spin", "rates_chase_link",
            "rates_chase", "rates_wgmma_chain"} <= kernels
    assert f"kChaseMax = {rates_kernels.CHASE_LOADS};" in src
    names = build_rates.RatesSource(wgmma=True).name_expressions
    chains = len(build_rates.RATES_CHAIN_N) * len(build.CUDA_TYPES) * len(build_rates.RATES_CHAIN_WARPGROUPS)
    assert len(names) == 4 + 3 * len(build_rates.RATES_WGMMA_N) * len(build_rates.RATES_WARPGROUPS) + chains
    assert "rates_wgmma_chain<64, __nv_bfloat16, 2>" in names
    assert "rates_wgmma<256, iosim::e4m3, 3>" in names and "float16" in build.CUDA_TYPES
    assert "e4m3" not in build.CUDA_TYPES  # the flash2, naive and decode kernels instantiate every CUDA_TYPES entry
    assert build_rates.RatesSource().nvrtc_extra == () and "-arch=sm_90a" in build_rates.RatesSource(wgmma=True).nvrtc_extra


# -- the whole command on a stand-in for CuPy: every kernel "runs" in a time that grows with its work ------------------


class _Array(np.ndarray):
    def get(self):
        return np.asarray(self)


class _FakeCupy:
    """Just what iosim.calibrate.rates uses of CuPy; a kernel's time is 3 us + 1 ps per thread-iteration."""

    __version__ = "0-fake"
    int32, int64, float32, uint32, uint64 = np.int32, np.int64, np.float32, np.uint32, np.uint64

    def __init__(self, hopper: bool):
        self.now, self.hopper, self.launched, self.calls = 0.0, hopper, [], []
        fake = self

        class Event:
            def record(self):
                self.t = fake.now

            def synchronize(self):
                pass

        class Device:
            def __init__(self, i=0):
                self.compute_capability = "90" if hopper else "80"
                self.attributes = {"MultiProcessorCount": 4, "L2CacheSize": 4 << 20, "MaxSharedMemoryPerBlockOptin":
                                   227 << 10, "MaxSharedMemoryPerMultiprocessor": 228 << 10}

        class Runtime:
            getDeviceCount = staticmethod(lambda: 1)
            memGetInfo = staticmethod(lambda: (24 << 20, 80 << 30))
            driverGetVersion = runtimeGetVersion = staticmethod(lambda: 13000)
            deviceSynchronize = staticmethod(lambda: None)
            getDeviceProperties = staticmethod(lambda i: {"name": b"NVIDIA H100 80GB HBM3", "multiProcessorCount": 4,
                                                          "major": 9 if hopper else 8, "minor": 0})

        class Stream:
            null = type("Null", (), {"synchronize": staticmethod(lambda: None)})()

        self.cuda = type("cuda", (), {"Event": Event, "Device": Device, "runtime": Runtime, "Stream": Stream,
                                      "get_elapsed_time": staticmethod(lambda a, b: (b.t - a.t) * 1e3)})
        self.RawModule = lambda code, options, name_expressions: _FakeModule(fake, options, name_expressions)

    def zeros(self, n, dtype):
        return np.zeros(n, dtype).view(_Array)

    def ones(self, n, dtype):
        return np.ones(n, dtype).view(_Array)

    def empty(self, n, dtype):
        return np.zeros(n, dtype).view(_Array)

    class random:  # cupy.random
        class RandomState:
            def __init__(self, seed):
                self.rng = np.random.default_rng(seed)

            def uniform(self, lo, hi, n, dtype):
                return self.rng.uniform(lo, hi, n).astype(dtype).view(_Array)

    asnumpy = staticmethod(np.asarray)
    asarray = staticmethod(lambda a: np.asarray(a).view(_Array))
    get_default_memory_pool = staticmethod(lambda: type("Pool", (), {"free_all_blocks": lambda self: None})())


class _FakeModule:
    def __init__(self, cp, options, names):
        self.cp, self.names = cp, set(names)
        assert ("-DIOSIM_RATES_WGMMA" in options) == cp.hopper == any("wgmma" in n for n in names)

    def compile(self):
        pass

    def get_function(self, name):
        assert name.startswith("rates_") and ("<" not in name or name in self.names), name
        cp = self.cp

        class Kernel:
            max_dynamic_shared_size_bytes = 0

            def __call__(self, grid, block, args, shared_mem=0):
                ints = [int(a) for a in args if isinstance(a, (np.int32, np.int64))]
                cp.calls.append((name, ints))
                if name.startswith(("rates_mma<", "rates_wgmma<")):  # (iters, random, ...): time by the iterations
                    ints = ints[:1]
                if name.startswith("rates_chase"):  # memory latency: 600 cycles per load at 1.5 GHz
                    cp.launched.append(name)
                    if name == "rates_chase":
                        _head, _warm, n, cycles, stamps = args
                        cycles[:n] = 600
                        stamps[:4] = [0, 600 * n, 0, 400 * n]
                    return
                work = grid[0] * block[0] * max([1, *ints[-1:]])  # the last int is the loop count or size
                t = 3e-6 + 1e-12 * work
                cp.now += t
                cp.launched.append(name)
                for a in args:
                    if isinstance(a, np.ndarray) and a.dtype == np.uint64:  # stamps: 1.755 GHz
                        a[: 4 * grid[0]] = np.tile([0, int(1.755 * 1e9 * t), 0, int(1e9 * t)], grid[0])
                    if isinstance(a, np.ndarray) and a.dtype == np.int64 and a.size == 1:  # latency: 30 cycles each
                        a[0] = 30 * 16 * ints[-1]

        return Kernel()


@pytest.mark.parametrize("hopper", [True, False])
def test_the_command_measures_and_writes_a_profile_on_a_stand_in_gpu(monkeypatch, capsys, tmp_path, hopper):
    fake = _FakeCupy(hopper)
    monkeypatch.setitem(sys.modules, "cupy", fake)
    monkeypatch.setattr(rates, "decode_part", lambda b, cp, report: report(  # our decode kernel, not a stand-in
        Measured(("decode", "tile", "16bit", "d128x1", 1), 0.9e-6, "s", "stand-in"), ""))
    out = tmp_path / "calibrated.yaml"
    code, text, err = run_cli(["calibrate", "rates", "-o", str(out), "--repeats", "10"], capsys)
    assert code == 0, err
    p = load_profile_file(out)
    assert p.name == "h100-sxm5-80gb"  # found by the device name
    assert p.calibration_label().startswith("measured on NVIDIA H100 80GB HBM3, driver ")
    assert p.calibration.measured_on.command == f"iosim calibrate rates -o {out} --profile h100-sxm5-80gb --repeats 10"
    assert p.measured("sm_clock") == pytest.approx(1.755e9, rel=1e-3)
    assert p.measured("mma_sync.bf16.latency") == pytest.approx(30)
    assert set(p.measured("mma_sync.fp16.throughput")) == set(rates.MMA_WARPS)
    assert (p.calibration.wgmma is not None) == hopper
    if hopper:
        assert set(p.measured("wgmma.bf16.n256")) == {1, 2, 3} and set(p.measured("wgmma.fp8.n128")) == {1, 2, 3}
        for n, wg in ((128, 1), (256, 3)):  # the same loop and time; each e4m3 instruction does twice the FLOPs (k32)
            fp8, bf16 = p.measured(f"wgmma.fp8.n{n}")[wg], p.measured(f"wgmma.bf16.n{n}")[wg]
            assert fp8 == pytest.approx(2 * bf16, rel=2e-3)
        assert re.search(r"^wgmma\.fp8\.n128\.1\s.*dense peak 1979", text, re.M)
        assert re.search(r"^wgmma\.bf16\.n128\.1\s.*best 750-800", text, re.M)
    else:
        assert not any("wgmma" in name for name in fake.launched)
    assert all(v > 0 for v in (p.measured("dram.read_write"), p.measured("launch.per_block"), p.measured("smem.ld128")))
    assert p.measured("latency.l2") == pytest.approx(400e-9) and p.measured("latency.dram") == pytest.approx(400e-9)
    assert fake.launched.count("rates_chase") == 2 * rates_kernels.CHASE_LAUNCHES
    for label in ("sm_clock", "mma_sync.bf16.throughput.16", "exp.latency", "dram.read", "launch.interval",
                  "latency.l2", "latency.dram"):
        assert re.search(rf"^{re.escape(label)}\s", text, re.M), label  # each printed as it completes
    assert p.calibration.decode.tile["16bit"]["d128x1"].value[1] == pytest.approx(0.9e-6)  # the decode part measured too
    assert f"wrote {out}" in text


class _FakeNvml:
    """Just what iosim.calibrate.power uses of pynvml: an energy counter (mJ) that steps at every read."""

    def __init__(self):
        self.mj = 0

    def nvmlInit(self):
        pass

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetTotalEnergyConsumption(self, handle):
        self.mj += 1000
        return self.mj

    def nvmlDeviceGetEnforcedPowerLimit(self, handle):
        return 700_000


def test_only_the_power_bursts_take_random_operands(monkeypatch):
    """The rates the time model uses are measured on fixed operands; the power section's bursts on random ones
    (kernels/rates.cu's ``random`` argument of rates_mma and rates_wgmma, rates_smem's mode bit 2)."""
    from iosim.calibrate import power

    fake = _FakeCupy(hopper=True)
    monkeypatch.setitem(sys.modules, "cupy", fake)
    monkeypatch.setitem(sys.modules, "pynvml", _FakeNvml())
    monkeypatch.setattr(power, "BURST_S", 1e-3)
    monkeypatch.setattr(power, "REST_S", 0.0)
    monkeypatch.setattr(power, "IDLE_S", 1e-3)
    for name, value in (("LIMITER_S", 1e-3), ("LIMITER_LONG_S", 1e-3), ("LIMITER_REST_S", 0.0), ("ENGAGE_S", 1e-3),
                        ("FAST_WINDOW", (0.0, 1.0)), ("STEADY_WINDOW", (0.0, 1.0)), ("ENGAGE_HELD", (0.0, 1.0))):
        monkeypatch.setattr(power, name, value)
    monkeypatch.setattr(power, "_counter_watts", lambda samples, start, end: 700.0)  # fake launches take no time
    b = rates_kernels.Bench(fake, 10)

    def operands(part) -> dict[str, set[int]]:
        fake.calls.clear()
        part(b, fake, lambda m, note: None)
        out: dict[str, set[int]] = {}
        for name, ints in fake.calls:
            if name.startswith(("rates_mma<", "rates_wgmma<")):
                out.setdefault(name.split("<")[0], set()).add(ints[1])
            elif name == "rates_smem":
                out.setdefault(name, set()).add(ints[0] & 2)
        return out

    assert operands(rates._compute) == {"rates_mma": {0}, "rates_wgmma": {0}}
    assert operands(rates._memory)["rates_smem"] == {0}
    assert operands(power.measure_power) == {"rates_mma": {1}, "rates_wgmma": {1}, "rates_smem": {2}}



def test_limiter_bursts_are_read_launch_by_launch():
    """The limiter's readings (iosim.calibrate.power): the energy counter's watts between its first and last steps
    in a window, the clock averaged over time (equal work per launch: the harmonic mean), and the first launch
    below a level."""
    from iosim.calibrate import power

    samples = [(0.0, 0.0), (0.05, 0.0), (0.1, 70.0), (0.15, 70.0), (0.2, 140.0), (0.3, 210.0), (0.35, 210.0)]
    assert power._counter_watts(samples, 0.0, 1.0) == pytest.approx(700.0)  # 210 J - 70 J over 0.3 s - 0.1 s
    assert power._counter_watts(samples, 0.15, 1.0) == pytest.approx(700.0)  # steps at 0.2 and 0.3 s
    with pytest.raises(rates_kernels.RatesError, match="did not step twice"):
        power._counter_watts(samples, 0.25, 1.0)
    t = np.array([0.0, 0.1, 0.2, 0.3])
    clock = np.array([2.0e9, 1.0e9, 2.0e9, 1.0e9])
    assert power._mean_in(t, clock, (0.0, 1.0)) == pytest.approx(4.0e9 / 3)  # 2 GHz half the launches, 1 GHz half
    assert power._median_in(t, clock, (0.15, 0.25)) == 2.0e9
    assert power._first_below(t, clock, 0.15, 1.5e9) == pytest.approx(0.3)
    assert power._first_below(t, clock, 0.0, 0.5e9) is None
    with pytest.raises(rates_kernels.RatesError, match="no launch"):
        power._median_in(t, clock, (2.0, 3.0))


def _power_measured() -> list[Measured]:
    """A power section as iosim calibrate rates prints it (made-up but plausible H100 numbers)."""
    m = [Measured(("power", k), v, "W", k) for k, v in (("limit", 700.0), ("idle", 131.0), ("base", 141.0))]
    m += [Measured(("power", u), v, unit, u) for u, v, unit in (
        ("mma_sync", 1.0e-12, "J/FLOP"), ("wgmma", 7.4e-13, "J/FLOP"), ("exp", 4.7e-12, "J/op"),
        ("fp32", 5.7e-12, "J/FLOP"), ("smem", 6.4e-12, "J/B"), ("l2", 4.7e-11, "J/B"), ("dram", 1.2e-10, "J/B"))]
    m += [Measured(("power", "at", u), f, "Hz", "clock") for u, f in (("mma_sync", 1.785e9), ("wgmma", 1.665e9),
                                                                     ("exp", 1.98e9))]
    for n, f, w in ((132, 1.664e9, 767.7), (99, 1.83e9, 760.7), (66, 1.859e9, 595.5), (33, 1.86e9, 358.9)):
        m += [Measured(("power", "limiter", "clocks", n), f, "Hz", "held"),
              Measured(("power", "limiter", "watts", n), w, "W", "held")]
    m += [Measured(("power", "limiter", k), v, u, k) for k, v, u in (
        ("clock", 1.777e9, "Hz"), ("steady", 1.599e9, "Hz"), ("steady_watts", 699.1, "W"), ("engage", 0.068, "s"),
        ("settle", 0.823, "s"))]
    return m


def test_the_limiter_lands_in_the_profile_and_the_time_model_uses_it():
    """The power section's limiter (tables by SMs busy, each unit's clock) as the writer nests it loads back, and
    the time model takes its clocks: a heavy call's record is slower than one call from rest."""
    section = {**calibration_section(_measured(), ON, hopper=True),
               "power": rates.nest({}, _power_measured(), ON)["power"]}
    p = profile_from_dict(_with_calibration(section))
    lim = p.calibration.power.limiter
    assert lim.clocks.value == {132: 1.664e9, 99: 1.83e9, 66: 1.859e9, 33: 1.86e9}
    assert lim.watts.value[132] == 767.7 and lim.engage.value == pytest.approx(0.068)
    assert p.calibration.power.at["wgmma"].value == 1.665e9
    problem = AttentionProblem(seq_len=32768, heads=32, head_dim=128, causal=True, dtype="bf16")
    one, record = (simulate("flash3", problem, p, kernel="cudnn", warm=True, run=r) for r in ("single", "record"))
    assert record.time.clock.fast_hz < one.time.clock.start_hz == 1.777e9
    assert record.time.predicted_s > one.time.predicted_s
