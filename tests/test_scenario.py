"""Scenario files: validation errors name the file, the field and the fix; sweeps expand as written; the
built-in scenarios load and their claims (the seeds' numbers) match the simulator."""

from __future__ import annotations

import pytest

import iosim.scenario.run
from iosim.scenario import (
    ScenarioError,
    builtin_paths,
    check_claims,
    expand,
    format_sig,
    load_scenario,
    run_scenario,
    run_scenarios,
    scenario_from_dict,
    tiles_from_sram,
)


def _write(tmp_path, text: str):
    p = tmp_path / "bad.yaml"
    p.write_text(text)
    return p


BASE = "schema_version: 1\nname: t\ntitle: t\nschedules: [naive]\n"


def test_unknown_key_error_names_file_field_and_accepted_keys(tmp_path):
    p = _write(tmp_path, BASE + "problems:\n  - {seq_len: 128, hedas: 2}\n")
    with pytest.raises(ScenarioError) as e:
        load_scenario(p)
    msg = str(e.value)
    assert str(p) in msg
    assert "problems[0].hedas: unknown key" in msg
    assert "accepted: batch, heads" in msg


def test_unknown_schedule_is_rejected_at_validation_time(tmp_path):
    p = _write(tmp_path, "schema_version: 1\nname: t\ntitle: t\nschedules: [naive, flash9]\n"
                         "problems: [{seq_len: 128}]\n")
    with pytest.raises(ScenarioError, match=r"schedules: item 1: unknown schedule 'flash9': expected one of naive"):
        load_scenario(p)


def test_bad_range_says_how_to_write_one(tmp_path):
    p = _write(tmp_path, BASE + "problems:\n  - {seq_len: {start: 1, stop: 8, fator: 2}}\n")
    with pytest.raises(ScenarioError, match=r"problems\[0\]\.seq_len: a sweep mapping .*\{start, stop, factor\}"):
        load_scenario(p)


def test_invalid_problem_combination_names_the_block_and_values(tmp_path):
    p = _write(tmp_path, BASE + "problems:\n  - {seq_len: 128, heads: 3, kv_heads: [1, 2]}\n")
    with pytest.raises(ScenarioError, match=r"problems\[0\]: heads=3 is not divisible by kv_heads=2"):
        load_scenario(p)


def test_unknown_profile_names_the_list_item(tmp_path):
    p = _write(tmp_path, BASE + "profiles: [h100-sxm5-80gb, no-such-gpu]\nproblems: [{seq_len: 128}]\n")
    with pytest.raises(ScenarioError, match=r"profiles\[1\]: unknown profile 'no-such-gpu'"):
        load_scenario(p)


def test_missing_required_field_says_add_it(tmp_path):
    p = _write(tmp_path, "schema_version: 1\nname: t\nschedules: [naive]\nproblems: [{seq_len: 128}]\n")
    with pytest.raises(ScenarioError, match=r"title: required field is missing: add it"):
        load_scenario(p)


def test_wrong_schema_version_is_named(tmp_path):
    p = _write(tmp_path, BASE.replace("schema_version: 1", "schema_version: 7") + "problems: [{seq_len: 128}]\n")
    with pytest.raises(ScenarioError, match=r"schema_version: got 7"):
        load_scenario(p)


def test_yaml_syntax_error_names_the_file(tmp_path):
    p = _write(tmp_path, BASE + "problems: [{seq_len: 128\n")
    with pytest.raises(ScenarioError, match=r"bad\.yaml: not valid YAML"):
        load_scenario(p)


def test_tiles_take_exactly_one_mode():
    with pytest.raises(ScenarioError, match=r"tiles: give exactly one of"):
        scenario_from_dict({"schema_version": 1, "name": "t", "title": "t", "schedules": ["flash2"],
                            "problems": [{"seq_len": 128}], "tiles": {"block": 64, "sram_elements": 4096}})


def test_backward_pass_runs():
    data = {"schema_version": 1, "name": "t", "title": "t", "schedules": ["flash2"],
            "problems": [{"seq_len": 256, "head_dim": 64}], "pass": "backward"}
    rec = run_scenario(scenario_from_dict(data)).records[0]
    assert rec["pass"] == "backward" and rec["global_bytes"] > 0


def test_sweeps_expand_lists_linear_and_geometric_ranges_as_a_product():
    scn = scenario_from_dict({
        "schema_version": 1, "name": "t", "title": "t", "schedules": ["naive", "flash2"],
        "profiles": ["a100-sxm4-80gb", "h100-sxm5-80gb"],
        "problems": [{"seq_len": {"start": 128, "stop": 1024, "factor": 2}, "head_dim": [64, 128],
                      "causal": [False, True]},
                     {"seq_len": {"start": 64, "stop": 256, "step": 64}}],
    })
    assert scn.problems[0].seq_len == [128, 256, 512, 1024]
    assert scn.problems[1].seq_len == [64, 128, 192, 256]
    cases = expand(scn)
    assert len(cases) == 2 * (4 * 2 * 2 + 4) * 2  # profiles x problems x schedules
    assert [c.index for c in cases] == list(range(len(cases)))
    assert {c.problem["seq_len"] for c in cases} == {64, 128, 192, 256, 512, 1024}


def test_geometric_range_with_a_fractional_factor_has_no_duplicates():
    scn = scenario_from_dict({"schema_version": 1, "name": "t", "title": "t", "schedules": ["naive"],
                              "problems": [{"seq_len": {"start": 2, "stop": 10, "factor": 1.5}}]})
    assert scn.problems[0].seq_len == [2, 3, 4, 7, 10]  # 2, 3, 4.5 -> 4, 6.75 -> 7, 10.125 -> 10


def test_tiles_from_sram_follow_fa1_line_1_and_swap_roles_for_flash2():
    assert tiles_from_sram("flash1", 98304, 128) == (128, 192)  # Br = min(Bc, d), Bc = ceil(M/4d)
    assert tiles_from_sram("flash1", 98304, 64) == (64, 384)
    assert tiles_from_sram("flash2", 98304, 64) == (384, 64)


def test_format_sig_rounds_to_the_published_digits():
    assert format_sig(138_412_032, 4, "decimal") == "138.4 MB"
    assert format_sig(4_429_185_024, 3, "decimal") == "4.43 GB"
    assert format_sig(134_217_728, 3, "decimal") == "134 MB"
    assert format_sig(4_194_304, 2, "decimal") == "4.2 MB"
    assert format_sig(33.0, 2, "ratio") == "33x"
    assert format_sig(2**28, 3, "binary") == "256 MiB"
    assert format_sig(2**35, 2, "binary") == "32 GiB"


@pytest.mark.parametrize("path", builtin_paths(), ids=lambda p: p.stem)
def test_builtin_scenario_loads_and_every_claim_matches(path):
    scn = load_scenario(path)
    run = run_scenario(scn)
    assert run.records
    for c in check_claims(run, scn.claims):
        assert c.ok, f"{path.name}: claim {c.claim.label!r}: simulated {c.shown}, published {c.claim.expect} {c.error}"


def test_seed_claims_are_computed_not_typed():
    """The seeds' scenario carries the published text only; the values come from simulated counts."""
    run = run_scenario(load_scenario(next(p for p in builtin_paths() if p.stem == "seeds-traffic")))
    by = {c.claim.label: c for c in check_claims(run, run.scenario.claims)}
    assert by["naive, one head: global read + write"].value == 138_412_032
    assert by["compulsory, 32 heads"].value == 134_217_728
    assert by["naive, 32 heads"].value == 4_429_185_024
    naive1 = next(r for r in run.records if r["schedule"] == "naive" and r["heads"] == 1)
    assert naive1["by_tensor"]["S"] == {"global_read_bytes": 33_554_432, "global_write_bytes": 33_554_432}
    assert naive1["by_tensor"]["P"] == {"global_read_bytes": 33_554_432, "global_write_bytes": 33_554_432}


def test_run_scenario_is_quiet_and_reports_progress_through_the_callback(capsys):
    scn = scenario_from_dict({"schema_version": 1, "name": "t", "title": "t", "schedules": ["naive", "flash2"],
                              "problems": [{"seq_len": [128, 256]}]})
    seen = []
    run_scenario(scn, progress=lambda done, total: seen.append((done, total)))
    assert seen == [(1, 4), (2, 4), (3, 4), (4, 4)]
    out = capsys.readouterr()
    assert out.out == "" and out.err == ""


def test_tiles_that_do_not_fit_are_an_error_in_the_record_unless_overfill_is_allowed():
    base = {"schema_version": 1, "name": "t", "title": "t", "schedules": ["flash1"], "profiles": ["a100-sxm4-40gb"],
            "problems": [{"seq_len": 1024, "head_dim": 64}]}
    strict = run_scenario(scenario_from_dict({**base, "tiles": {"block": [64, 512]}})).records
    assert strict[0]["fits"] and strict[0]["global_bytes"]
    assert strict[1]["global_bytes"] is None and "need" in strict[1]["error"]
    loose = run_scenario(scenario_from_dict({**base, "tiles": {"block": [64, 512], "allow_overfill": True}})).records
    assert loose[1]["fits"] is False and loose[1]["global_bytes"] < loose[0]["global_bytes"]


def _two_sharing_scenarios():
    base = {"schema_version": 1, "title": "t", "schedules": ["naive", "flash2"], "l2_model": True}
    a = scenario_from_dict({**base, "name": "a", "problems": [{"seq_len": [256, 512], "heads": 2}]})
    b = scenario_from_dict({**base, "name": "b", "problems": [{"seq_len": [512, 1024], "heads": 2}]})
    return a, b


def test_cases_that_scenarios_share_are_simulated_once(monkeypatch):
    calls = []
    real = iosim.scenario.run.run_case
    monkeypatch.setattr(iosim.scenario.run, "run_case", lambda case, *s: calls.append(case) or real(case, *s))
    a, b = _two_sharing_scenarios()
    seen = []
    runs = run_scenarios([a, b], progress=lambda done, total: seen.append((done, total)))
    assert len(calls) == 6  # 8 cases, 2 of them (N = 512) in both
    assert seen[-1] == (8, 8)
    for run, scn in zip(runs, (a, b)):
        assert [r["case"] for r in run.records] == list(range(4))
        alone = run_scenario(scn).records
        assert run.records == alone


def test_runs_on_several_processes_give_the_same_records():
    a, b = _two_sharing_scenarios()
    serial = [run.records for run in run_scenarios([a, b], workers=1)]
    parallel = [run.records for run in run_scenarios([a, b], workers=2)]
    assert parallel == serial


def test_a_scenario_names_the_time_models_kernel_per_schedule_and_warm_calls():
    base = {"schema_version": 1, "name": "k", "title": "k", "profiles": ["h100-sxm5-80gb"], "schedules": ["flash2"],
            "problems": [{"seq_len": 4096, "heads": 16}]}
    own, = run_scenario(scenario_from_dict(base)).records
    fa2, = run_scenario(scenario_from_dict({**base, "kernel": {"flash2": "fa2"}})).records
    assert (own["time_kernel"], fa2["time_kernel"]) == ("iosim-flash2", "fa2")
    assert own["predicted_s"] != fa2["predicted_s"]  # FA2's tiles and warps, not ours
    small = {**base, "problems": [{"seq_len": 1024, "heads": 2}], "l2_model": True}
    cold, = run_scenario(scenario_from_dict(small)).records
    warm, = run_scenario(scenario_from_dict({**small, "warm": True})).records
    assert warm["predicted_s"] < cold["predicted_s"]  # 2 MB of inputs stay in L2 between calls


def test_a_kernel_for_a_schedule_the_scenario_lacks_or_of_another_family_is_rejected():
    base = {"schema_version": 1, "name": "k", "title": "k", "schedules": ["flash2"], "problems": [{"seq_len": 128}]}
    with pytest.raises(ScenarioError, match="kernel: 'naive' is not one of this scenario's schedules"):
        scenario_from_dict({**base, "kernel": {"naive": "iosim-naive"}})
    with pytest.raises(ScenarioError, match=r"kernel.flash2: kernel 'iosim-naive' \(family naive, forward pass\)"):
        scenario_from_dict({**base, "kernel": {"flash2": "iosim-naive"}})


def test_a_kernel_file_is_found_beside_the_scenario_file(tmp_path):
    (tmp_path / "k").mkdir()
    (tmp_path / "k" / "mine.yaml").write_text("name: mine\nfamily: fa2\nsource: test\nwarps: 4\n"
                                              "tiles: {128: {block_q: 128, block_kv: 64, registers: 255, smem: qkv}}\n")
    p = tmp_path / "s.yaml"
    p.write_text("schema_version: 1\nname: s\ntitle: s\nschedules: [flash2]\nkernel: {flash2: k/mine.yaml}\n"
                 "problems: [{seq_len: 4096, heads: 8}]\n")
    rec, = run_scenario(load_scenario(p)).records
    assert rec["time_kernel"] == "mine"
