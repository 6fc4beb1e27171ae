"""The JSON iosim writes is a typed model with a published schema (issue 30 item 2): the committed schema files are
what the models generate today, ``iosim schema`` prints them, every result reads back into its model unchanged, and
``iosim plot`` refuses a damaged results.json naming the file and the field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import run_cli

from iosim import AttentionProblem, simulate
from iosim.cli.schema import SCHEMAS, schema_text
from iosim.hardware.cpu import get_cpu_profile
from iosim.report import load_run
from iosim.result import ResultJSON
from iosim.scenario import SavedRun, ScenarioError
from iosim.simulate_cpu import CpuResultJSON, simulate_cpu

SCHEMA_DIR = Path(__file__).resolve().parents[1] / "docs" / "schema"
SMALL = """\
schema_version: 1
name: small
title: "Small sweep"
profiles: [h100-sxm5-80gb]
schedules: [naive, flash2]
problems:
  - {seq_len: [128, 256], heads: 2, head_dim: 64}
figures:
  - {kind: traffic_vs_n}
"""


@pytest.mark.parametrize("name", list(SCHEMAS))
def test_the_committed_schema_is_the_models_schema(name):
    committed = (SCHEMA_DIR / f"{name}.schema.json").read_text()
    assert committed == schema_text(name), f"docs/schema/{name}.schema.json is stale: iosim schema {name} > it"


@pytest.mark.parametrize("name", list(SCHEMAS))
def test_iosim_schema_prints_it(name, capsys):
    code, out, _ = run_cli(["schema", name], capsys)
    assert code == 0 and out == schema_text(name)
    assert json.loads(out)["$schema"] == "https://json-schema.org/draft/2020-12/schema"


CASES = [
    ("naive", {}, {}), ("flash1", {}, {"pass_": "both"}), ("flash2", {"kv_heads": 2, "causal": True}, {"warm": True}),
    ("flash2", {"kv_heads": 2}, {"pass_": "backward", "gqa": "grouped"}), ("flash3", {}, {"kernel": "fa3"}),
    ("flash-decoding", {"seq_len": 1, "kv_len": 4096}, {"splits": 4}),
    ("block-sparse", {}, {"density": 0.5, "seed": 3, "l2": False}),
]


@pytest.mark.parametrize(("schedule", "problem", "options"), CASES, ids=[c[0] for c in CASES])
def test_a_result_reads_back_into_its_model_unchanged(schedule, problem, options):
    p = AttentionProblem(**{"seq_len": 512, "heads": 4, "head_dim": 64, **problem})
    written = json.dumps(simulate(schedule, p, **options).to_json(), indent=2)
    assert json.dumps(ResultJSON.model_validate_json(written).to_json(), indent=2) == written


@pytest.mark.parametrize("schedule", ["naive", "flash2"])
def test_a_cpu_result_reads_back_into_its_model_unchanged(schedule):
    p = AttentionProblem(seq_len=1000, kv_len=300, head_dim=64, causal=True)
    written = simulate_cpu(schedule, p, get_cpu_profile("amd-epyc-9654")).to_json()
    assert json.dumps(CpuResultJSON.model_validate_json(written).model_dump(), indent=2) == written


@pytest.fixture
def saved(tmp_path, capsys) -> Path:
    scenario = tmp_path / "small.yaml"
    scenario.write_text(SMALL)
    code, _, err = run_cli(["run", str(scenario), "-o", str(tmp_path / "out"), "-q"], capsys)
    assert code == 0, err
    return tmp_path / "out" / "small"


def test_a_saved_run_validates_and_reads_back_as_written(saved):
    text = (saved / "results.json").read_text()
    assert json.dumps(SavedRun.model_validate_json(text).to_json(), indent=1) == text
    run = load_run(saved)
    assert run.records == json.loads(text)["records"] and [c.result for c in run.cases] == json.loads(text)["results"]


def test_plot_refuses_a_damaged_results_file_naming_the_file_and_each_field(saved, capsys):
    path = saved / "results.json"
    data = json.loads(path.read_text())
    data["records"][1]["seq_len"] = "long"
    del data["results"][0]["traffic"]["hbm"]["read_bytes"]
    path.write_text(json.dumps(data))
    code, _, err = run_cli(["plot", str(saved)], capsys)
    assert code == 2 and "Traceback" not in err
    assert f"{path}: invalid results file" in err
    assert "records[1].seq_len: 'long': Input should be a valid integer" in err
    assert "results[0].traffic.hbm.read_bytes: required field is missing" in err


def test_a_results_file_with_a_record_short_of_its_result_is_refused(saved):
    path = saved / "results.json"
    data = json.loads(path.read_text())
    data["results"].pop()
    path.write_text(json.dumps(data))
    with pytest.raises(ScenarioError, match=r"results\.json: 4 records but 3 results"):
        load_run(saved)
