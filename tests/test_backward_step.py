"""calibration.backward.step (iosim/calibrate/backward_step.py) and what the backward time models do with it
(iosim/timing/fa2_bwd.py, fa3_bwd.py): the measurement's arithmetic on a stand-in clock, the profile field, the
models' use of it (only where the call runs as it was measured), and the CLI's --steps-only."""

from __future__ import annotations

import pytest
import yaml

from iosim import AttentionProblem, simulate
from iosim.calibrate import backward_step, rates_kernels
from iosim.calibrate.rates_kernels import Measured
from iosim.hardware.gpu import PROFILES_DIR, profile_from_dict
from iosim.timing import load_kernel

STEP_S = {"iosim-flash2-bwd": {32: 3.9e-6, 64: 5.4e-6, 128: 4.6e-6, 256: 6.2e-6}, "iosim-flash3-bwd": {64: 2.7e-6, 128: 2.4e-6},
          "fa2-bwd": {64: 4.6e-6, 128: 4.2e-6, 256: 5.1e-6}, "cudnn-bwd": {64: 1.4e-6, 128: 2.2e-6, 256: 3.2e-6}}


class _Bench:
    sms = 132

    def fn(self, name):
        return lambda *a: None


class _Device:
    compute_capability = "90"


class _CuPy:
    class cuda:  # CuPy's name
        Device = _Device

    int64 = int

    @staticmethod
    def get_default_memory_pool():
        return type("Pool", (), {"free_all_blocks": staticmethod(lambda: None)})()


@pytest.fixture
def stand_in(monkeypatch):
    """The part on a stand-in clock: a call at n queries takes fixed + n / Br steps of the table's step."""
    fixed = 30e-6
    monkeypatch.setattr(rates_kernels, "cupy_clock", lambda cp, spin: None)
    monkeypatch.setattr(backward_step, "REST_S", 0.0)
    monkeypatch.setattr(backward_step, "_call", lambda cp, torch, name, n, nk, d: (name, n, nk, d))

    def time_ms(call, reps, warmup, view, clock):
        name, n, nk, d = call
        tc = load_kernel(name).tiles_for(d)
        assert nk == _Bench.sms * tc.block_kv  # one K/V block on each SM, all of one head
        return 1e3 * (fixed + n / tc.block_q * STEP_S[name][d])

    monkeypatch.setattr(rates_kernels, "time_ms", time_ms)


def test_the_step_is_the_time_a_block_adds_per_q_block_between_the_two_lengths(stand_in):
    got: list[Measured] = []
    backward_step.backward_part(_Bench(), _CuPy(), report=lambda m, note: got.append(m))
    assert {(m.path[2], m.path[3]): m.value for m in got} == pytest.approx(
        {(k, d): v for k, t in STEP_S.items() for d, v in t.items()}, rel=1e-9)
    assert all(m.path[:2] == ("backward", "step") and m.unit == "s" for m in got)


def test_a_kernel_that_refuses_is_skipped_and_said(stand_in, monkeypatch, capsys):
    def refuse(cp, torch, name, n, nk, d):
        if name == "cudnn-bwd" and d == 256:
            raise RuntimeError("No available kernel.\nmore")
        return name, n, nk, d

    monkeypatch.setattr(backward_step, "_call", refuse)
    got: list[Measured] = []
    backward_step.backward_part(_Bench(), _CuPy(), report=lambda m, note: got.append(m))
    assert ("cudnn-bwd", 256) not in {(m.path[2], m.path[3]) for m in got} and len(got) == 11
    assert "backward.step.cudnn-bwd.256: skipped (RuntimeError: No available kernel.)" in capsys.readouterr().out


def test_without_torch_the_peers_are_skipped(monkeypatch, capsys):
    with pytest.raises(backward_step._Skip):
        backward_step._call(None, None, "fa2-bwd", 1024, 16896, 128)


def _profile(steps: dict | None):
    data = yaml.safe_load((PROFILES_DIR / "h100-sxm5-80gb.yaml").read_text())
    data["calibration"].pop("backward", None)
    if steps is not None:
        data["calibration"]["backward"] = {"step": {k: {"value": {d: f"{v * 1e6} us" for d, v in t.items()},
                                                        "source": "a test"} for k, t in steps.items()}}
    return profile_from_dict(data, "test")


P = AttentionProblem(batch=4, heads=16, seq_len=4096, head_dim=128, dtype="bf16")


def _main(kernel: str, profile, p=P, **kw):
    r = simulate("flash2", p, profile, pass_="backward", kernel=kernel, **kw)
    return next(k for k in r.time.kernels if k.resources.get("step") is not None)


@pytest.mark.parametrize("kernel", ["iosim-flash2-bwd", "fa2-bwd", "cudnn-bwd", "iosim-flash3-bwd"])
def test_the_models_take_the_measured_step_where_the_profile_has_it(kernel):
    composed = _main(kernel, _profile(None))
    measured = _main(kernel, _profile(STEP_S))
    assert "step_composed" not in composed.resources and composed.bound != "step (measured)"
    assert measured.resources["step"] == pytest.approx(STEP_S[kernel][128])
    assert measured.resources["step_composed"] == pytest.approx(composed.resources["step"])
    assert measured.bound == "step (measured)"
    # 2048 work tiles (4 x 16 heads x 32 K/V blocks) of 64 steps on 132 SMs, one at a time: 16 on the busiest SM
    slower = _main(kernel, _profile({kernel: {128: 2 * STEP_S[kernel][128]}}))
    added = slower.resources["blocks"] - measured.resources["blocks"]
    assert added == pytest.approx(16 * 64 * STEP_S[kernel][128], rel=1e-6)


def test_the_measured_step_is_not_taken_where_the_call_runs_otherwise():
    """Other tiles than the description's, another head dim, or fp32: the composed step."""
    prof = _profile({"iosim-flash2-bwd": {128: 1e-6}})
    assert _main("iosim-flash2-bwd", prof, block_q=128, block_kv=64).bound != "step (measured)"
    p64 = P.model_copy(update={"head_dim": 64})
    assert _main("iosim-flash2-bwd", prof, p=p64).bound != "step (measured)"
    assert _main("iosim-flash2-bwd", prof).bound == "step (measured)"


def test_the_cli_takes_one_section_at_a_time(capsys):
    from helpers import run_cli

    code, out, err = run_cli(["calibrate", "rates", "--steps-only", "--decode-only"], capsys)
    assert code != 0 and "each measure one part" in out + err
