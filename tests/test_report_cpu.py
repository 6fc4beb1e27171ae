"""The report's "Attention on a CPU" section: drawn from a committed record (the default report) or from data
measured by `iosim report --cpu` (here a fixed dict: these tests never measure), with the measured ratio, the
predicted ratio and the seeds' claim in one figure whose data goes to CSV like the others."""

from __future__ import annotations

import csv
import json

import pytest
from helpers import run_cli

import iosim.cli.report
from iosim import plots
from iosim.report import committed_cpu_record, cpu_section, read_cpu_record, render_report
from iosim.scenario import ScenarioError

ROWS = [
    {"seq_len": 1024, "head_dim": 64, "causal": False, "naive_ms": 6.0, "tiled_ms": 4.0, "ratio": 1.5,
     "ratio_median": 1.4, "naive_pred_ms": 5.0, "tiled_pred_ms": 4.0, "naive_gb": 0.004, "naive_fits": True,
     "seeds_claim": 2.0},
    {"seq_len": 2048, "head_dim": 64, "causal": False, "naive_ms": 30.0, "tiled_ms": 12.0, "ratio": 2.5,
     "ratio_median": 2.4, "naive_pred_ms": 27.0, "tiled_pred_ms": 10.0, "naive_gb": 0.017, "naive_fits": True,
     "seeds_claim": 2.0},
]
LIVE = {"machine": "Test CPU 9000", "logical_cpus": 2, "gemm": "test BLAS", "profile": "this-machine",
        "seeds_claim": 2.0, "rows": ROWS}
RECORD = {**LIVE, "machine": "Recorded CPU 42", "measured_at": "2025-01-02 03:04 UTC",
          "command": "python benchmarks/bench_cpu.py --record --n 1024 2048 --d 64"}

SMALL = """\
schema_version: 1
name: small
title: "Small sweep"
description: a tiny scenario
profiles: [h100-sxm5-80gb]
schedules: [naive, flash2]
problems:
  - {seq_len: [128, 256], heads: 1, head_dim: 64}
tables:
  - {kind: summary}
"""


def test_figure_has_the_measured_and_predicted_ratios_and_the_claim_line(tmp_path):
    fig = plots.cpu_ratio(ROWS, seeds_claim=2.0, machine="Test CPU 9000")
    by_name = {tr.name: tr for tr in fig.data}
    assert list(by_name["measured"].y) == [1.5, 2.5]
    assert list(by_name["predicted (CPU model)"].y) == pytest.approx([1.25, 2.7])
    claim = by_name["seeds' claim (2×)"]
    assert list(claim.y) == [2.0, 2.0] and list(claim.x) == [1024, 2048]
    assert "Test CPU 9000" in fig.layout.title.text
    rows = list(csv.DictReader(open(plots.write_figure_csv(fig, tmp_path / "cpu.csv"))))
    assert {r["trace"] for r in rows} == set(by_name) and len(rows) == 6


def test_section_renders_from_a_committed_format_record(tmp_path):
    (tmp_path / "cpu-recorded-cpu-42-2cpu.json").write_text(json.dumps(RECORD))
    m = committed_cpu_record(tmp_path)
    assert m.file == "docs/benchmarks/cpu-recorded-cpu-42-2cpu.json"
    page, n_fig = cpu_section(m)
    assert n_fig == 1 and 'class="plotly-graph-div"' in page
    assert "Recorded CPU 42, 2 logical CPUs" in page and "2025-01-02 03:04 UTC" in page
    assert "<code>iosim report --cpu</code> measures this machine" in page
    assert "<b>2.50×</b>" in page and "2.70×" in page  # measured and predicted ratio at N = 2048


def test_the_committed_record_is_found_and_readable():
    m = committed_cpu_record()
    assert m is not None and m.file.startswith("docs/benchmarks/cpu-")
    assert m.data["machine"] and m.data["measured_at"] and m.data["rows"]
    assert {r["head_dim"] for r in m.data["rows"]} == {64}


def test_a_record_without_rows_is_refused_with_its_name(tmp_path):
    bad = tmp_path / "cpu-bad.json"
    bad.write_text(json.dumps({"machine": "x", "rows": [{"seq_len": 1024}]}))
    with pytest.raises(ScenarioError, match=r"cpu-bad.json: not a CPU measurement record.*rows\[0\].tiled_ms"):
        read_cpu_record(bad)


def test_report_cpu_passes_the_measured_data_through(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(iosim.cli.report, "scenario_data", lambda: LIVE)  # no measuring in tests
    small = tmp_path / "small.yaml"
    small.write_text(SMALL)
    out = tmp_path / "r.html"
    code, stdout, err = run_cli(["report", str(small), "-o", str(out), "--cpu"], capsys)
    assert code == 0, err
    page = out.read_text()
    assert "Measured now, while this report was written, on this machine: <b>Test CPU 9000, 2 logical CPUs" in page
    assert "Recorded CPU" not in page and "committed record" not in page
    assert '<a href="#attention-on-a-cpu">Attention on a CPU</a>' in page
    assert "1 scenario, 1 figure)" in stdout


def test_named_scenarios_without_cpu_have_no_cpu_section(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(iosim.cli.report, "scenario_data", lambda: pytest.fail("measured without --cpu"))
    small = tmp_path / "small.yaml"
    small.write_text(SMALL)
    code, _, err = run_cli(["report", str(small), "-o", str(tmp_path / "r.html"), "-q"], capsys)
    assert code == 0, err
    assert "Attention on a CPU" not in (tmp_path / "r.html").read_text()


def test_the_default_report_shows_the_committed_record_without_measuring(monkeypatch):
    monkeypatch.setattr(iosim.cli.report, "scenario_data", lambda: pytest.fail("measured without --cpu"))
    m = iosim.cli.report._cpu_measurement(False, default=True, quiet=True)
    page = render_report([], cpu=m)
    assert m.file in page and m.data["machine"] in page and "iosim report --cpu" in page
