"""calibration.forward.step (iosim/calibrate/forward_step.py) and what the fa3 model does with it
(iosim/timing/fa3.py: fa3.measured): the measurement's arithmetic on a stand-in clock, and the step
taken only where the call runs the instantiation it was measured on."""

from __future__ import annotations

import pytest
import yaml

from iosim import AttentionProblem, simulate
from iosim.calibrate import forward_step, rates_kernels
from iosim.calibrate.rates_kernels import Measured
from iosim.hardware.gpu import PROFILES_DIR, profile_from_dict
from iosim.timing import load_kernel

STEP_S = {"bf16": {64: 0.5e-6, 128: 0.8e-6, 256: 1.0e-6}, "fp8": {64: 0.4e-6, 128: 0.9e-6, 256: 1.1e-6}}


class _Bench:
    sms = 132
    hopper = True

    def fn(self, name):
        return lambda *a: None


class _CuPy:
    int64 = int

    @staticmethod
    def get_default_memory_pool():
        return type("Pool", (), {"free_all_blocks": staticmethod(lambda: None)})()


def test_the_step_is_the_time_a_block_adds_per_kv_tile_between_the_two_lengths(monkeypatch):
    fixed = 12e-6
    monkeypatch.setattr(rates_kernels, "cupy_clock", lambda cp, spin: None)
    monkeypatch.setattr(forward_step, "REST_S", 0.0)
    monkeypatch.setattr(forward_step, "_call", lambda cp, heads, n, nk, d, fp8: (heads, n, nk, d, fp8))

    tile_fixed = 4e-6  # a Q tile beyond its steps; the call's fixed part is what is left of `fixed`

    def time_ms(call, reps, warmup, view, clock):
        heads, n, nk, d, fp8 = call
        tc = load_kernel("iosim-flash3").tiles_for(d, "fp8" if fp8 else "bf16")
        tiles = heads // _Bench.sms  # Q tiles an SM: 1, or 2 for the tile's fixed part
        assert heads in (_Bench.sms, 2 * _Bench.sms) and n == tc.block_q and nk % tc.block_kv == 0  # one kv head
        return 1e3 * (fixed + (tiles - 1) * tile_fixed + tiles * nk // tc.block_kv * STEP_S["fp8" if fp8 else "bf16"][d])

    monkeypatch.setattr(rates_kernels, "time_ms", time_ms)
    got: list[Measured] = []
    forward_step.forward_part(_Bench(), _CuPy(), report=lambda m, note: got.append(m))
    steps = {(m.path[3], m.path[4]): m.value for m in got if m.path[1] == "step"}
    assert steps == pytest.approx({(t, d): v for t, table in STEP_S.items() for d, v in table.items()}, rel=1e-9)
    assert all(m.path[2] == "iosim-flash3" for m in got)
    assert all(m.value == pytest.approx(tile_fixed, rel=1e-6) for m in got if m.path[1] == "tile_fixed")
    assert all(m.value == pytest.approx(fixed - tile_fixed, rel=1e-6) for m in got if m.path[1] == "call_fixed")
    assert len(got) == 3 * len(steps)


def test_before_hopper_nothing_is_measured(capsys):
    class Ampere(_Bench):
        hopper = False

    got: list[Measured] = []
    forward_step.forward_part(Ampere(), _CuPy(), report=lambda m, note: got.append(m))
    assert not got and "skipped" in capsys.readouterr().out


def _profile(steps: dict | None):
    data = yaml.safe_load((PROFILES_DIR / "h100-sxm5-80gb.yaml").read_text())
    data["calibration"].pop("forward", None)
    if steps is not None:
        data["calibration"]["forward"] = {"step": {"iosim-flash3": {
            t: {"value": {d: f"{v * 1e6} us" for d, v in table.items()}, "source": "a test"}
            for t, table in steps.items()}}, "tile_fixed": None, "call_fixed": None}
    return profile_from_dict(data, "test")


def _run(p, profile, **kw):
    return simulate("flash3", p, profile, kernel="iosim-flash3", **kw)


@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
def test_the_model_takes_the_measured_step_for_the_instantiation_it_was_measured_on(dtype):
    p = AttentionProblem(batch=1, heads=8, seq_len=16384, head_dim=256, dtype=dtype)
    composed = _run(p, _profile(None)).time.kernels[0]
    slow = {t: {d: 10 * v for d, v in table.items()} for t, table in STEP_S.items()}
    measured = _run(p, _profile(STEP_S)).time.kernels[0]
    slower = _run(p, _profile(slow)).time.kernels[0]
    # 1024 Q tiles on 132 SMs, 256 steps each: the busiest SM runs 8 tiles, 2048 steps
    added = slower.resources["pipeline"] - measured.resources["pipeline"]
    assert added == pytest.approx(2048 * 9 * STEP_S[dtype][256], rel=1e-6)
    assert composed.resources["pipeline"] != pytest.approx(measured.resources["pipeline"])
    assert measured.bound == "step (measured)" and composed.bound != measured.bound


def test_a_window_or_other_tiles_keep_the_composed_step():
    p = AttentionProblem(batch=1, heads=8, seq_len=4096, head_dim=128, dtype="bf16")
    slow = {t: {d: 10 * v for d, v in table.items()} for t, table in STEP_S.items()}
    for kw in ({"window": (256, 0)}, {"block_q": 128, "block_kv": 64}):
        a = _run(p, _profile(None), **kw).time.predicted_s
        b = _run(p, _profile(slow), **kw).time.predicted_s
        assert a == pytest.approx(b), kw


def test_a_tiles_and_a_calls_fixed_parts_replace_the_composed_ones_where_measured():
    """B = 1, 8 heads, N = 16384, d = 256 (1024 Q tiles, 8 on the busiest of 132 SMs): with tile_fixed measured each
    of its tiles costs that beyond its steps, and the call call_fixed beyond its tiles."""
    p = AttentionProblem(batch=1, heads=8, seq_len=16384, head_dim=256, dtype="fp8")
    data = yaml.safe_load((PROFILES_DIR / "h100-sxm5-80gb.yaml").read_text())

    def with_fixed(tile_us, call_us):
        table = lambda v: {"iosim-flash3": {"fp8": {"value": {256: f"{v} us"}, "source": "a test"}}}  # noqa: E731
        data["calibration"]["forward"] = {"step": table(1.0), "tile_fixed": table(tile_us),
                                          "call_fixed": table(call_us)}
        return _run(p, profile_from_dict(data, "test")).time.kernels[0].predicted_s

    a, b, c = with_fixed(2.0, 5.0), with_fixed(3.0, 5.0), with_fixed(2.0, 6.0)
    assert b - a == pytest.approx(8 * 1e-6, rel=1e-6)  # 8 tiles on the busiest SM, 1 us more each
    assert c - a == pytest.approx(1e-6, rel=1e-6)
