"""calibration.backward.step (iosim/calibrate/backward_step.py) and what the backward time models do with it
(iosim/timing/fa2_bwd.py, fa3_bwd.py): the measurement's arithmetic on a stand-in clock, the profile field, the
models' use of it (only where the call runs as it was measured), and the CLI's --steps-only."""

from __future__ import annotations

import numpy as np
import pytest
import yaml

from iosim import AttentionProblem, simulate
from iosim.blocks import makespan
from iosim.calibrate import backward_step, rates_kernels
from iosim.calibrate.rates_kernels import Measured
from iosim.hardware.gpu import PROFILES_DIR, profile_from_dict
from iosim.timing import load_kernel
from iosim.timing.fa2_bwd import block_steps

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


TILE_S = 3.5e-6  # the stand-in's work tile beyond its steps


@pytest.fixture
def stand_in(monkeypatch):
    """The part on a stand-in clock: a call at n queries with m K/V blocks on each SM takes a fixed part and m tiles
    of TILE_S + n / Br steps of the table's step."""
    fixed = 30e-6
    monkeypatch.setattr(rates_kernels, "cupy_clock", lambda cp, spin: None)
    monkeypatch.setattr(backward_step, "REST_S", 0.0)
    monkeypatch.setattr(backward_step, "_call", lambda cp, torch, name, n, nk, d: (name, n, nk, d))

    def time_ms(call, reps, warmup, view, clock):
        name, n, nk, d = call
        tc = load_kernel(name).tiles_for(d)
        tiles, rest = divmod(nk, _Bench.sms * tc.block_kv)  # K/V blocks on each SM, all of one head
        assert rest == 0 and tiles in (1, 2)
        return 1e3 * (fixed + tiles * (TILE_S + n / tc.block_q * STEP_S[name][d]))

    monkeypatch.setattr(rates_kernels, "time_ms", time_ms)


def test_the_step_is_the_time_a_block_adds_per_q_block_between_the_two_lengths(stand_in):
    got: list[Measured] = []
    backward_step.backward_part(_Bench(), _CuPy(), report=lambda m, note: got.append(m))
    steps = {(m.path[2], m.path[3]): m.value for m in got if m.path[:2] == ("backward", "step")}
    assert steps == pytest.approx({(k, d): v for k, t in STEP_S.items() for d, v in t.items()}, rel=1e-9)
    assert all(m.unit == "s" for m in got)


def test_the_tile_fixed_is_what_a_second_tile_adds_beyond_its_steps(stand_in):
    got: list[Measured] = []
    backward_step.backward_part(_Bench(), _CuPy(), report=lambda m, note: got.append(m))
    fixed = {(m.path[2], m.path[3]): m.value for m in got if m.path[:2] == ("backward", "tile_fixed")}
    assert fixed == pytest.approx({(k, d): TILE_S for k, t in STEP_S.items() for d in t}, rel=1e-6)


def test_the_tile_fixed_is_measured_on_short_tiles(stand_in, monkeypatch):
    """What a tile costs beyond its steps shrinks as tiles grow (a kernel hides part of it under a long tile's
    steps): on a stand-in whose tiles of the step's lengths (N1 queries and more) hide three quarters of it, the
    part is what a SHORT_STEPS-step tile pays, and the step is unchanged."""
    inner = rates_kernels.time_ms

    def time_ms(call, reps, warmup, view, clock):
        name, n, nk, d = call
        tc = load_kernel(name).tiles_for(d)
        hidden = 0.75 * TILE_S * (nk // (_Bench.sms * tc.block_kv)) if n >= backward_step.N1 else 0.0
        return inner(call, reps, warmup, view, clock) - 1e3 * hidden

    monkeypatch.setattr(rates_kernels, "time_ms", time_ms)
    assert backward_step.SHORT_STEPS * 128 < backward_step.N1  # Br <= 128: the short tiles hide nothing
    got: list[Measured] = []
    backward_step.backward_part(_Bench(), _CuPy(), report=lambda m, note: got.append(m))
    parts = {(m.path[1], m.path[2], m.path[3]): m.value for m in got}
    for k, t in STEP_S.items():
        for d, step in t.items():
            assert parts["tile_fixed", k, d] == pytest.approx(TILE_S, rel=1e-6)
            assert parts["step", k, d] == pytest.approx(step, rel=1e-9)


def test_a_kernel_that_refuses_is_skipped_and_said(stand_in, monkeypatch, capsys):
    def refuse(cp, torch, name, n, nk, d):
        if name == "cudnn-bwd" and d == 256:
            raise RuntimeError("No available kernel.\nmore")
        return name, n, nk, d

    monkeypatch.setattr(backward_step, "_call", refuse)
    got: list[Measured] = []
    backward_step.backward_part(_Bench(), _CuPy(), report=lambda m, note: got.append(m))
    assert ("cudnn-bwd", 256) not in {(m.path[2], m.path[3]) for m in got} and len(got) == 2 * 11
    assert "backward.step.cudnn-bwd.256: skipped (RuntimeError: No available kernel.)" in capsys.readouterr().out


def test_without_torch_the_peers_are_skipped(monkeypatch, capsys):
    with pytest.raises(backward_step._Skip):
        backward_step._call(None, None, "fa2-bwd", 1024, 16896, 128)


def _table(t: dict) -> dict:
    return {k: {"value": {d: f"{v * 1e6} us" for d, v in x.items()}, "source": "a test"} for k, x in t.items()}


def _profile(steps: dict | None, tile_fixed: dict | None = None):
    data = yaml.safe_load((PROFILES_DIR / "h100-sxm5-80gb.yaml").read_text())
    data["calibration"].pop("backward", None)
    if steps is not None:
        data["calibration"]["backward"] = {"step": _table(steps), **({"tile_fixed": _table(tile_fixed)}
                                                                      if tile_fixed else {})}
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


@pytest.mark.parametrize("kernel", ["iosim-flash2-bwd", "fa2-bwd", "cudnn-bwd", "iosim-flash3-bwd"])
def test_a_measured_tile_fixed_replaces_the_composed_prologue_and_epilogue(kernel):
    """Each of the busiest SM's 16 work tiles (B = 4, H = 16, 32 K/V blocks a head on 132 SMs) takes tile_fixed
    beyond its steps; from DRAM (the inputs do not fit L2) K_j and V_j take longer than the measurement's L2."""
    steps_only = _main(kernel, _profile(STEP_S, {kernel: {128: 1e-12}}))
    fixed = _main(kernel, _profile(STEP_S, {kernel: {128: 4e-6}}))
    added = fixed.resources["blocks"] - steps_only.resources["blocks"]
    assert added == pytest.approx(16 * (4e-6 - 1e-12), rel=1e-6)
    assert fixed.resources["tile_fixed"] > 4e-6  # 4 us measured with K_j, V_j in L2, read here from DRAM
    without = _main(kernel, _profile(STEP_S))
    assert "tile_fixed" not in without.resources  # the composed parts where the profile has none


def test_cudnns_backward_hands_its_tiles_out_in_the_grids_order():
    """Causal: each head's K/V blocks shrink from the first to the last; a tile counter handing them out head after
    head (cuDNN's, launch_order persistent-in-order) ends later than one handing out the longest first."""
    causal = AttentionProblem(batch=1, heads=8, seq_len=4096, head_dim=128, dtype="bf16", causal=True)
    prof = _profile(STEP_S, {k: {128: 2e-6} for k in STEP_S})
    desc = load_kernel("cudnn-bwd")
    assert desc.launch_order == "persistent-in-order"
    in_order = _main(desc, prof, p=causal).resources["blocks"]
    longest_first = _main(desc.model_copy(update={"launch_order": "persistent"}), prof, p=causal).resources["blocks"]
    steps = block_steps(causal, desc.tiles_for(128), False)  # 8 heads x 64 K/V blocks, in the grid's order
    tiles = np.tile(2e-6 + steps * STEP_S["cudnn-bwd"][128], 8)
    assert in_order - longest_first == pytest.approx(makespan(tiles, 132) - makespan(tiles, 132, True), rel=1e-6)
    assert in_order > 1.3 * longest_first


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
