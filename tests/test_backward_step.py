"""calibration.backward.step (iosim/calibrate/backward_step.py) and what the backward time models do with it
(iosim/timing/fa2_bwd.py, fa3_bwd.py): the measurement's arithmetic on a stand-in clock, the profile field, the
models' use of it (only where the call runs as it was measured), and the CLI's --backward-only."""

from __future__ import annotations

import pytest
import yaml

from iosim import AttentionProblem, simulate
from iosim.calibrate import backward_step
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


DIAGONAL_S = 1.5e-6  # what a diagonal step adds, every kernel


@pytest.fixture
def stand_in(monkeypatch):
    """The part on a stand-in clock: a call takes fixed + its blocks' steps at the table's step, each diagonal step
    DIAGONAL_S more; the square calls' blocks are all diagonal (Bc / Br steps, or one where Br >= Bc)."""
    fixed = 30e-6
    monkeypatch.setattr(backward_step, "cupy_clock", lambda cp, spin: None)
    monkeypatch.setattr(backward_step, "REST_S", 0.0)
    monkeypatch.setattr(backward_step, "_call", lambda cp, torch, name, s: (name, s))

    def time_ms(call, reps, warmup, view, clock):
        name, s = call
        tc = load_kernel(name).tiles_for(s.d)
        steps = -(-s.n // tc.block_q)
        if s.heads == 1:  # the step's calls: one K/V block on each SM, all of one head
            assert s.nk == _Bench.sms * tc.block_kv and not s.causal
        else:  # the diagonal's: a K/V block a head, a head a SM, as many queries as keys
            assert (s.heads, s.n, s.nk) == (_Bench.sms, tc.block_kv, tc.block_kv)
        return 1e3 * (fixed + steps * (STEP_S[name][s.d] + (DIAGONAL_S if s.causal else 0.0)))

    monkeypatch.setattr(backward_step, "time_ms", time_ms)


def test_the_step_is_the_time_a_block_adds_per_q_block_between_the_two_lengths(stand_in):
    got: list[Measured] = []
    backward_step.backward_part(_Bench(), _CuPy(), report=lambda m, note: got.append(m))
    steps = {(m.path[2], m.path[3]): m.value for m in got if m.path[1] == "step"}
    assert steps == pytest.approx({(k, d): v for k, t in STEP_S.items() for d, v in t.items()}, rel=1e-9)
    assert all(m.path[0] == "backward" and m.unit == "s" for m in got)


def test_the_diagonal_is_what_the_mask_adds_to_each_diagonal_step(stand_in):
    got: list[Measured] = []
    backward_step.backward_part(_Bench(), _CuPy(), report=lambda m, note: got.append(m))
    diagonal = [m for m in got if m.path[1] == "diagonal"]
    assert len(diagonal) == 12 and all(m.value == pytest.approx(DIAGONAL_S, rel=1e-9) for m in diagonal)
    assert backward_step.diagonal_from(10e-6, 9e-6, 2) == 0.0  # a mask that saves time adds nothing


def test_a_kernel_that_refuses_is_skipped_and_said(stand_in, monkeypatch, capsys):
    def refuse(cp, torch, name, s):
        if name == "cudnn-bwd" and s.d == 256:
            raise RuntimeError("No available kernel.\nmore")
        return name, s

    monkeypatch.setattr(backward_step, "_call", refuse)
    got: list[Measured] = []
    backward_step.backward_part(_Bench(), _CuPy(), report=lambda m, note: got.append(m))
    assert ("cudnn-bwd", 256) not in {(m.path[2], m.path[3]) for m in got} and len(got) == 2 * 11
    assert "backward.step.cudnn-bwd.256: skipped (RuntimeError: No available kernel.)" in capsys.readouterr().out


def test_without_torch_the_peers_are_skipped():
    with pytest.raises(backward_step._Skip):
        backward_step._call(None, None, "fa2-bwd", backward_step.Shape(1, 1024, 16896, 128))


def _table(steps: dict) -> dict:
    return {k: {"value": {d: f"{v * 1e6} us" for d, v in t.items()}, "source": "a test"} for k, t in steps.items()}


def _profile(steps: dict | None, diagonal: dict | None = None):
    data = yaml.safe_load((PROFILES_DIR / "h100-sxm5-80gb.yaml").read_text())
    data["calibration"].pop("backward", None)
    if steps is not None:
        data["calibration"]["backward"] = {"step": _table(steps), "diagonal": _table(diagonal) if diagonal else None}
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

    code, out, err = run_cli(["calibrate", "rates", "--backward-only", "--decode-only"], capsys)
    assert code != 0 and "each measure one section" in out + err


def test_diagonal_steps_are_the_q_blocks_whose_first_row_misses_keys():
    from iosim.timing.fa2_bwd import diagonal_steps
    from iosim.timing.kernels import TileConfig

    tc = TileConfig(block_q=64, block_kv=128)

    def diag(n, nk, causal=True, heads=1, kv_heads=1, grouped=False):
        p = AttentionProblem(seq_len=n, kv_len=nk, head_dim=128, causal=causal, heads=heads, kv_heads=kv_heads)
        return diagonal_steps(p, tc, grouped).tolist()

    assert diag(4096, 4096) == [2] * 32  # Bc / Br Q blocks straddle each K/V block's diagonal
    assert diag(1000, 1000) == [2] * 8  # the ragged last block too (keys 896-999, rows 896-999)
    assert diag(1024, 4096) == [0] * 24 + [2] * 8  # bottom-right: the first 3072 keys are seen by every row
    assert diag(4096, 4096, causal=False) == [0] * 32
    assert diag(256, 256, heads=8, kv_heads=2, grouped=True) == [8, 8]  # a kv head's block visits 4 query heads
    assert diag(64, 64) == [1]  # a K/V block shorter than Bc: one Q block


@pytest.mark.parametrize("kernel", ["iosim-flash2-bwd", "fa2-bwd", "cudnn-bwd", "iosim-flash3-bwd"])
def test_a_causal_calls_diagonal_steps_cost_the_measured_extra(kernel):
    """Each K/V block's time grows by its diagonal steps x the measured extra; without a mask nothing changes."""
    from iosim.timing.fa2_bwd import block_steps, diagonal_steps, measured_blocks
    from iosim.timing.rates import rates

    causal = P.model_copy(update={"causal": True})
    extra = 1e-6
    without = _main(kernel, _profile(STEP_S), p=causal)
    with_diag = _main(kernel, _profile(STEP_S, {kernel: {128: extra}}), p=causal)
    added = with_diag.resources["blocks"] - without.resources["blocks"]
    assert 0 < added <= 16 * 2 * extra * (1 + 1e-9)  # at most 16 tiles on an SM, 2 diagonal steps each
    desc = load_kernel(kernel)
    tc = desc.tiles_for(128)
    prof = _profile(STEP_S, {kernel: {128: extra}})
    from iosim.timing.estimate import Conditions

    c = Conditions(causal, desc, prof, rates(prof, "bf16"))
    grouped = desc.gqa == "grouped"
    assert measured_blocks(c, tc, grouped) == pytest.approx(
        block_steps(causal, tc, grouped) * STEP_S[kernel][128] + diagonal_steps(causal, tc, grouped) * extra)
    plain = _main(kernel, _profile(STEP_S, {kernel: {128: extra}}))  # no mask, no diagonal
    assert plain.resources["blocks"] == pytest.approx(_main(kernel, _profile(STEP_S)).resources["blocks"])
