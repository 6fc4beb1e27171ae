"""Issue 30 item 1, "one answer for one question": the Python API and the CLI give the same numbers by default,
and the API's signature names every option a schedule takes."""

from __future__ import annotations

import inspect
import json

import pytest
from helpers import run_cli

from iosim import AttentionProblem, simulate
from iosim.schedules import SCHEDULES

# one small problem per schedule, in the shape it is meant for (flash-decoding: one query against a cache)
PROBLEMS = {
    "naive": dict(batch=1, heads=4, seq_len=1024, head_dim=64),
    "flash1": dict(batch=1, heads=4, seq_len=1024, head_dim=64, causal=True),
    "flash2": dict(batch=2, heads=8, kv_heads=2, seq_len=2048, head_dim=128, dtype="bf16"),
    "flash3": dict(batch=1, heads=4, seq_len=2048, head_dim=128, causal=True),
    "flash-decoding": dict(batch=4, heads=8, seq_len=1, kv_len=8192, head_dim=128),
    "block-sparse": dict(batch=1, heads=2, seq_len=1024, head_dim=64),
}


def _flags(problem: dict) -> list[str]:
    out = []
    for k, v in problem.items():
        flag = "--" + k.replace("_", "-")
        out += [flag] if v is True else [flag, str(v)]
    return out


def _cli_json(schedule: str, problem: dict, capsys, *extra: str) -> dict:
    code, out, err = run_cli(["simulate", schedule, *_flags(problem), "--json", *extra], capsys)
    assert code == 0, err
    return json.loads(out)


def test_every_schedule_is_covered():
    assert set(PROBLEMS) == set(SCHEDULES)


@pytest.mark.parametrize("schedule", list(PROBLEMS))
def test_python_and_cli_agree_byte_for_byte_by_default(schedule, capsys):
    """The same call from Python and from ``iosim simulate --json``, both with their defaults: the same traffic at
    every boundary (hbm included: both take it from the L2 model where it applies), the same view, the same time."""
    j = _cli_json(schedule, PROBLEMS[schedule], capsys)
    r = simulate(schedule, AttentionProblem(**PROBLEMS[schedule])).to_json()
    assert r["traffic"] == j["traffic"]
    assert r["kernels"] == j["kernels"]
    assert r["hbm_model"] == j["hbm_model"]
    assert r["time"]["predicted_s"] == j["time"]["predicted_s"]


@pytest.mark.parametrize("schedule", ["naive", "flash1", "flash2", "flash3"])
def test_the_default_is_the_l2_model_where_it_applies(schedule):
    r = simulate(schedule, AttentionProblem(**PROBLEMS[schedule]))
    assert r.hbm_model.startswith("l2-lru"), r.hbm_model
    assert r.l2 is not None


@pytest.mark.parametrize("schedule", list(PROBLEMS))
def test_no_l2_agrees_too_and_gives_the_two_level_view(schedule, capsys):
    j = _cli_json(schedule, PROBLEMS[schedule], capsys, "--no-l2")
    r = simulate(schedule, AttentionProblem(**PROBLEMS[schedule]), l2=False).to_json()
    assert r["traffic"] == j["traffic"] and r["hbm_model"] == j["hbm_model"]
    assert r["traffic"]["hbm"] == r["traffic"]["global"] and r["hbm_model"].startswith("none")


def test_the_backward_pass_has_the_l2_model_for_flash2_and_says_why_not_elsewhere():
    r = simulate("flash2", AttentionProblem(seq_len=1024, heads=4), pass_="backward")
    assert r.hbm_model.startswith("l2-lru") and r.l2 is not None and len(r.l2.kernels) == len(r.counts.kernels)
    r = simulate("naive", AttentionProblem(seq_len=1024, heads=4), pass_="backward")
    assert r.hbm_model.startswith("none: pass 'backward'") and r.traffic["hbm"] == r.traffic["global"]


# -- the schedules' options are simulate's own keyword parameters ---------------------------------------------------

OPTIONS = ("splits", "density", "mask", "seed", "gqa", "window", "seqlens")


def test_the_signature_names_every_schedule_option():
    params = inspect.signature(simulate).parameters
    assert not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    for name in OPTIONS:
        assert params[name].kind is inspect.Parameter.KEYWORD_ONLY and params[name].default is None


@pytest.mark.parametrize("typo", ["split", "densty", "masks", "sead", "GQA"])
def test_a_misspelled_option_is_pythons_own_type_error(typo):
    with pytest.raises(TypeError, match=rf"^simulate\(\) got an unexpected keyword argument '{typo}'$"):
        simulate("flash-decoding", AttentionProblem(seq_len=1, kv_len=4096), **{typo: 4})


def test_options_reach_the_schedules_as_before():
    p = AttentionProblem(seq_len=1, kv_len=65536)
    assert simulate("flash-decoding", p, splits=8, l2=False).tiles.splits == 8
    a, b = (simulate("block-sparse", AttentionProblem(seq_len=1024), density=0.25, seed=s) for s in (1, 2))
    assert a.tiles.mask != b.tiles.mask


# -- warm calls: the DRAM bytes the time prices, beside the cold bytes -----------------------------------------------

def test_warm_time_says_it_prices_no_dram_bytes_beside_the_cold_hbm_bytes():
    p = AttentionProblem(seq_len=4096, heads=8, head_dim=128)  # 33.6 MB of Q, K, V, O: within 80% of the 50 MB L2
    cold, warm = (simulate("flash2", p, warm=w).to_json() for w in (False, True))
    assert warm["traffic"] == cold["traffic"] and warm["traffic"]["hbm"]["read_bytes"] > 0  # hbm: a cold L2
    assert warm["time"]["warm"] is True and warm["time"]["hbm"] == {"read_bytes": 0, "write_bytes": 0}
    assert cold["time"]["warm"] is False and cold["time"]["hbm"] == cold["traffic"]["hbm"]
    assert warm["time"]["predicted_s"] < cold["time"]["predicted_s"]


@pytest.mark.parametrize("schedule,problem", [
    ("flash2", dict(seq_len=65536, heads=32)),  # 2.1 GB of inputs: they cannot stay in L2
    ("flash1", dict(seq_len=4096, heads=8)),  # no kernel model: the peak roofline, on the cold bytes
])
def test_warm_time_prices_the_cold_bytes_where_the_inputs_do_not_stay_in_l2(schedule, problem):
    j = simulate(schedule, AttentionProblem(**problem), warm=True).to_json()
    assert j["time"]["warm"] is True and j["time"]["hbm"] == j["traffic"]["hbm"]


def test_the_cli_says_what_warm_calls_price(capsys):
    code, out, _ = run_cli(["simulate", "flash2", "--seq-len", "4096", "--heads", "8", "--warm"], capsys)
    assert code == 0 and "warm calls: the inputs stay in L2: the time prices no DRAM bytes" in out
    j = _cli_json("flash2", dict(seq_len=4096, heads=8), capsys, "--warm")
    assert j["time"]["hbm"] == {"read_bytes": 0, "write_bytes": 0} and j["traffic"]["hbm"]["read_bytes"] > 0


def test_every_built_in_scenario_states_which_hbm_view_it_uses():
    """A scenario's default (no L2 model: sweeps stay fast) differs from simulate()'s, so each file says."""
    from iosim._resources import scenarios_dir
    from iosim.yaml_io import read_data

    files = sorted(scenarios_dir().glob("*.yaml"))
    assert files
    for f in files:
        assert isinstance(read_data(f).get("l2_model"), bool), f"{f.name} does not state l2_model"
