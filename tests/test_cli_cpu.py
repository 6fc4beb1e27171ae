"""The CLI with CPU profiles: `iosim simulate --profile <cpu>` runs the CPU model, `iosim profiles` lists, shows and
validates CPU profiles, and options that only mean something on a GPU are refused by name."""

from __future__ import annotations

import json

from click.testing import CliRunner
from helpers import run_cli

from iosim.cli import cli
from iosim.hardware.cpu import builtin_cpu_profile_names, get_cpu_profile
from iosim.problem import AttentionProblem
from iosim.simulate_cpu import simulate_cpu

CPU = builtin_cpu_profile_names()[0]


def test_simulate_with_a_cpu_profile_gives_the_cpu_models_json():
    res = CliRunner().invoke(cli, ["simulate", "flash2", "--seq-len", "8192", "--head-dim", "64", "--dtype", "fp32",
                                   "--profile", CPU, "--json"])
    assert res.exit_code == 0, res.output
    j = json.loads(res.output)
    p = AttentionProblem(seq_len=8192, head_dim=64, dtype="fp32")
    want = simulate_cpu("flash2", p, get_cpu_profile(CPU))
    assert j["device"] == "cpu" and j["traffic"] == want.traffic and j["flops"] == want.flops


def test_gpu_only_options_and_unknown_schedules_are_refused_with_exit_2(capsys):
    code, _, err = run_cli(["simulate", "flash2", "--seq-len", "1024", "--profile", CPU, "--pass", "both"], capsys)
    assert code == 2 and "--pass: not for a CPU profile" in err
    code, _, err = run_cli(["simulate", "flash1", "--seq-len", "1024", "--profile", CPU], capsys)
    assert code == 2 and "the CPU model knows naive, flash2" in err


def test_profiles_list_show_and_validate_know_cpu_profiles(tmp_path):
    r = CliRunner()
    assert CPU in r.invoke(cli, ["profiles", "list"]).output
    shown = r.invoke(cli, ["profiles", "show", CPU])
    assert shown.exit_code == 0 and "kind: cpu" in shown.output
    f = tmp_path / "mine.yaml"
    f.write_text(shown.output)
    ok = r.invoke(cli, ["profiles", "validate", str(f)])
    assert ok.exit_code == 0 and ": ok" in ok.output
    f.write_text(shown.output.replace("kind: cpu", "kind: cpu\nbogus: 1"))
    assert r.invoke(cli, ["profiles", "validate", str(f)]).exit_code == 2
