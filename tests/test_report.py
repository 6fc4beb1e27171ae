"""`iosim run`, `iosim plot` and `iosim report` through the real entry point: files written, figures redrawn
without simulating, one self-contained HTML report with the seeds' numbers, errors with exit code 2."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import pytest
from helpers import run_cli

import iosim.scenario.cases
import iosim.scenario.run
from iosim._resources import scenarios_dir
from iosim.report import load_measured

SMALL = """\
schema_version: 1
name: small
title: "Small sweep"
description: |
  A **tiny** scenario for tests: `naive` against flash2.
profiles: [h100-sxm5-80gb]
schedules: [naive, flash2]
problems:
  - {seq_len: {start: 128, stop: 1024, factor: 2}, heads: 2, head_dim: 64}
figures:
  - {kind: traffic_vs_n, compulsory: true}
  - {kind: time_vs_n}
  - {kind: roofline}
tables:
  - {kind: summary}
"""


@pytest.fixture
def small(tmp_path):
    p = tmp_path / "small.yaml"
    p.write_text(SMALL)
    return p


def test_run_writes_tidy_csv_json_and_a_figure_with_its_data(small, tmp_path, capsys):
    out = tmp_path / "out"
    code, stdout, _ = run_cli(["run", str(small), "-o", str(out)], capsys)
    assert code == 0, stdout
    d = out / "small"
    data = json.loads((d / "results.json").read_text())
    assert len(data["records"]) == 8 and len(data["results"]) == 8
    assert data["results"][0]["traffic"]["global"]["read_bytes"] == data["records"][0]["global_read_bytes"]
    rows = list(csv.DictReader(open(d / "results.csv")))
    assert len(rows) == 8 and {"schedule", "seq_len", "global_bytes", "predicted_s", "energy_j"} <= set(rows[0])
    assert float(rows[0]["energy_j"]) == pytest.approx(data["results"][0]["time"]["energy_j"])  # a call's joules
    assert float(rows[0]["clock_hz"]) == data["results"][0]["time"]["clock"]["start_hz"]  # short: before the limiter
    tidy = list(csv.DictReader(open(d / "traffic.csv")))
    assert len(tidy) == 8 * 3 * 2  # cases x boundaries x directions
    assert {r["boundary"] for r in tidy} == {"global", "hbm", "sram"}
    figs = sorted(p.name for p in (d / "figures").iterdir())
    assert "small-1-traffic-vs-n.html" in figs and "small-1-traffic-vs-n.csv" in figs
    assert "plotly.min.js" in figs  # written once beside the figures, so they open offline
    fig_rows = list(csv.DictReader(open(d / "figures" / "small-1-traffic-vs-n.csv")))
    assert {"trace", "x", "y", "hover"} <= set(fig_rows[0])


def test_plot_redraws_figures_without_simulating(small, tmp_path, capsys, monkeypatch):
    out = tmp_path / "out"
    assert run_cli(["run", str(small), "-o", str(out), "-q"], capsys)[0] == 0
    figdir = out / "small" / "figures"
    for p in figdir.glob("*.html"):
        p.unlink()

    def boom(*a, **k):
        raise AssertionError("iosim plot must not simulate")

    monkeypatch.setattr(iosim.scenario.cases, "simulate", boom)
    monkeypatch.setattr(iosim.scenario.run, "run_case", boom)
    code, stdout, err = run_cli(["plot", str(out)], capsys)
    assert code == 0, err
    assert "3 figures redrawn" in stdout
    assert len(list(figdir.glob("*.html"))) == 3


def test_report_is_one_self_contained_html_file(small, tmp_path, capsys):
    out = tmp_path / "r.html"
    code, stdout, err = run_cli(["report", str(small), "-o", str(out)], capsys)
    assert code == 0, err
    page = out.read_text()
    assert page.count('class="plotly-graph-div"') == 3
    assert '<script src="http' not in page and "cdn.plot.ly/plotly" not in page.split("</head>")[1]
    assert page.count("Plotly.newPlot") == 3
    assert "<strong>tiny</strong>" in page and "<code>naive</code>" in page
    assert "3 figures" in stdout
    assert "<th>energy a call</th>" in page and re.search(r"[0-9.]+ [mµn]?J \([0-9]+ W\)", page)  # the summary's joules


def test_default_report_has_the_seed_numbers_and_at_least_five_figures(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # any folder: the built-in scenarios are found from the package
    code, _stdout, err = run_cli(["report", "-o", "report.html", "-q"], capsys)
    assert code == 0, err
    page = (tmp_path / "report.html").read_text()
    for seed in ("138.4 MB", "4.43 GB", "134 MB", "33x", "4.2 MB", "256 MiB", "32 GiB"):
        assert f"<b>{seed}</b>" in page, seed  # shown as the simulator's rounded value in a claims table
    assert "✗" not in page  # every claim matches
    assert page.count('class="plotly-graph-div"') >= 5
    # issue 17 item 7: the measured speedups from the committed records, and predicted times that say whose they are
    assert '<li><a href="#measured-speedups">Measured speedups</a></li>' in page
    speedups = page.split('<section id="measured-speedups">')[1].split("</section>")[0]
    assert 'id="fig-measured-speedups-h100"' in speedups and "<h3>H200</h3>" in speedups
    assert "docs/validation/h100-time.csv is missing" not in speedups
    assert "rates measured on NVIDIA H100 80GB HBM3" in page and "peak roofline, uncalibrated" in page


def test_bad_scenario_exits_2_with_one_clear_message(tmp_path, capsys):
    p = tmp_path / "bad.yaml"
    p.write_text("schema_version: 1\nname: b\ntitle: b\nschedules: [naive]\nproblems: [{seq_len: -4}]\n")
    code, _, err = run_cli(["report", str(p), "-o", str(tmp_path / "x.html")], capsys)
    assert code == 2
    assert err.startswith("iosim: error: ") and "bad.yaml" in err and "seq_len" in err
    assert "Traceback" not in err


def test_missing_scenario_and_missing_results_exit_2(tmp_path, capsys):
    code, _, err = run_cli(["run", str(tmp_path / "nope.yaml"), "-o", str(tmp_path)], capsys)
    assert code == 2 and "no such scenario file or built-in scenario" in err
    code, _, err = run_cli(["plot", str(tmp_path)], capsys)
    assert code == 2 and "no results.json" in err


def test_builtin_scenarios_run_by_name(tmp_path, capsys):
    code, stdout, err = run_cli(["run", "footprint", "-o", str(tmp_path)], capsys)
    assert code == 0, err
    assert "claims 3/3 match" in stdout


def test_parity_table_and_figure_read_measurement_files_beside_the_scenario_file(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "m").mkdir()
    header = ("kernel,device,profile,batch,heads,kv_heads,seq_len,kv_len,head_dim,dtype,causal,block_q,block_kv,"
              "boundary,direction,simulated_bytes,measured_bytes\n")
    row = "flash2,H200,h200-sxm-141gb,1,32,32,4096,4096,128,fp16,False,128,64,hbm,read,{s},{m}\n"
    (tmp_path / "m" / "a.csv").write_text(header + row.format(s=100, m=110) + row.format(s=100, m=90)
                                          + row.format(s=100, m=100))
    (tmp_path / "m" / "other.csv").write_text("kind,seq_len\nx,1\n")
    scn = tmp_path / "v.yaml"
    scn.write_text("schema_version: 1\nname: v\ntitle: v\nschedules: [flash2]\nproblems: [{seq_len: 128}]\n"
                   "tables: [{kind: parity, files: 'm/*.csv'}]\nfigures: [{kind: parity, files: 'm/*.csv'}]\n")
    code, _, err = run_cli(["report", str(scn), "-o", "v.html", "-q"], capsys)
    assert code == 0, err
    page = (tmp_path / "v.html").read_text()
    assert "<td class=num><b>1.000</b></td><td class=num>0.900</td><td class=num>1.100</td>" in page
    assert "Read m/a.csv." in page and "m/other.csv (no columns kernel" in page
    assert page.count('class="plotly-graph-div"') == 1


def test_check_flag_exits_1_when_a_published_number_does_not_match(tmp_path, capsys):
    p = tmp_path / "c.yaml"
    p.write_text("schema_version: 1\nname: c\ntitle: c\nschedules: [naive]\nproblems: [{seq_len: 4096}]\n"
                 "claims:\n  - {label: wrong, quantity: global_bytes, digits: 4, expect: '139.0 MB'}\n"
                 "  - {label: right, quantity: global_bytes, digits: 4, expect: '138.4 MB'}\n")
    code, _, err = run_cli(["report", str(p), "-o", str(tmp_path / "c.html"), "-q"], capsys)
    assert code == 0 and "claim 'wrong': simulated 138.4 MB, published 139.0 MB" in err
    code, _, err = run_cli(["run", str(p), "-o", str(tmp_path / "o"), "--check"], capsys)
    assert code == 1 and "'right'" not in err


def _validation_section(page: str) -> str:
    return page.split('<section id="validation">')[1].split("</section>")[0]


def test_measured_section_reads_the_repository_records_from_any_working_folder(tmp_path, capsys, monkeypatch):
    """Issue 20 item 7: a folder of the same name in the working directory is not read instead."""
    decoy = tmp_path / "docs" / "validation"
    decoy.mkdir(parents=True)
    (decoy / "decoy.csv").write_text("kernel,boundary,simulated_bytes,measured_bytes\nflash2,hbm,1,1\n")
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(["report", "validation", "-o", "v.html", "-q"], capsys)
    assert code == 0, err
    section = _validation_section((tmp_path / "v.html").read_text())
    assert "decoy.csv" not in section
    records = load_measured("docs/validation/*.csv")  # the built-in scenario's files, from iosim's data root
    assert records.read and all(name in section for name in records.read)
    assert section.count('class="plotly-graph-div"') == 1


def test_measured_section_names_files_without_absolute_local_paths(tmp_path, capsys, monkeypatch):
    """Issue 20 item 11: the note under the parity figure names files as the scenario does, also the files it
    leaves out, from any working folder."""
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "a.csv").write_text("kernel,boundary,simulated_bytes,measured_bytes\nflash2,hbm,100,90\n")
    (tmp_path / "m" / "other.csv").write_text("kind,seq_len\nx,1\n")
    scn = tmp_path / "v.yaml"
    scn.write_text("schema_version: 1\nname: v\ntitle: v\nschedules: [flash2]\nproblems: [{seq_len: 128}]\n"
                   "figures: [{kind: parity, files: 'm/*.csv'}]\n")
    for cwd in (tmp_path, tmp_path.parent):
        monkeypatch.chdir(cwd)
        code, _, err = run_cli(["report", str(scn), "-o", str(tmp_path / "v.html"), "-q"], capsys)
        assert code == 0, err
        note = (tmp_path / "v.html").read_text().split("<figcaption>")[1].split("</figcaption>")[0]
        assert "Read m/a.csv." in note and "m/other.csv (no columns kernel" in note
        assert str(tmp_path) not in note
    code, _, err = run_cli(["report", "validation", "-o", str(tmp_path / "b.html"), "-q"], capsys)
    assert code == 0, err
    section = _validation_section((tmp_path / "b.html").read_text())
    assert "Read docs/validation/" in section and str(scenarios_dir().parent.resolve()) not in section


@pytest.mark.parametrize("command", ["report", "run"])
def test_unwritable_output_is_refused_before_any_simulation(tmp_path, capsys, monkeypatch, command):
    """Issue 20 item 8: exit 2 at once, naming the path and the fix, instead of a raw errno after the work."""
    def boom(*a, **k):
        raise AssertionError("the output path must be checked before simulating")

    monkeypatch.setattr(iosim.scenario.run, "run_case", boom)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    out = blocker / ("r.html" if command == "report" else "results")
    code, _, err = run_cli([command, "footprint", "-o", str(out), "-q"], capsys)
    assert code == 2
    assert str(out) in err and "is a file, not a folder" in err and "choose another path with -o" in err
    assert "Traceback" not in err and "Errno" not in err


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc, where no one may make a folder")
def test_output_in_a_folder_that_cannot_be_made_is_refused_before_any_simulation(tmp_path, capsys, monkeypatch):
    def boom(*a, **k):
        raise AssertionError("the output path must be checked before simulating")

    monkeypatch.setattr(iosim.scenario.run, "run_case", boom)
    out = Path("/proc/iosim-no-such-folder/r.html")
    code, _, err = run_cli(["report", "footprint", "-o", str(out), "-q"], capsys)
    assert code == 2 and str(out) in err and "choose another path with -o" in err
    assert "Traceback" not in err and "Errno" not in err


def test_counts_of_one_are_singular(tmp_path, capsys):
    """Issue 30 item 10: "1 figures redrawn"."""
    one = tmp_path / "one.yaml"
    one.write_text(SMALL.replace("{start: 128, stop: 1024, factor: 2}", "[128]").replace("schedules: [naive, flash2]",
                   "schedules: [naive]").split("figures:")[0] + "figures:\n  - {kind: traffic_vs_n}\n")
    code, stdout, err = run_cli(["run", str(one), "-o", str(tmp_path / "out")], capsys)
    assert code == 0, err
    assert "small: 1 case, " in stdout
    code, stdout, err = run_cli(["plot", str(tmp_path / "out")], capsys)
    assert code == 0, err
    assert ": 1 figure redrawn in " in stdout
    code, stdout, err = run_cli(["report", str(one), "-o", str(tmp_path / "r.html")], capsys)
    assert code == 0, err
    assert "1 scenario, 1 figure)" in stdout

def test_a_report_in_a_folder_that_does_not_exist_is_refused_not_made(tmp_path, capsys, monkeypatch):
    """Issue 30 item 9: -o /missing/dir/report.html made the folders silently; now it names the missing one."""
    def boom(*a, **k):
        raise AssertionError("the output path must be checked before simulating")

    monkeypatch.setattr(iosim.scenario.run, "run_case", boom)
    out = tmp_path / "missing" / "dir" / "r.html"
    code, _, err = run_cli(["report", "footprint", "-o", str(out), "-q"], capsys)
    assert code == 2 and "Traceback" not in err
    assert f"the folder {tmp_path / 'missing' / 'dir'} does not exist" in err and "choose another path with -o" in err
    assert not (tmp_path / "missing").exists()

def test_measured_time_table_puts_each_cases_prediction_beside_the_record_of_its_kernel(tmp_path, capsys,
                                                                                      monkeypatch):
    monkeypatch.chdir(tmp_path)
    header = ("kernel,device,profile,batch,heads,kv_heads,seq_len,kv_len,head_dim,dtype,causal,block_q,block_kv,"
              "predicted_s,measured_s\n")
    row = "{k},H100,h100-sxm5-80gb,1,16,16,4096,4096,128,fp16,false,128,64,1e-3,{m}\n"
    (tmp_path / "t-time.csv").write_text(header + row.format(k="fa2", m=2e-3) + row.format(k="cudnn", m=9e-3))
    scn = tmp_path / "t.yaml"
    scn.write_text("schema_version: 1\nname: t\ntitle: t\nschedules: [flash2]\nkernel: {flash2: fa2}\n"
                   "problems: [{seq_len: [4096, 8192], heads: 16}]\n"
                   "tables: [{kind: measured_time, files: '*-time.csv'}]\n")
    code, _, err = run_cli(["report", str(scn), "-o", "t.html", "-q"], capsys)
    assert code == 0, err
    page = (tmp_path / "t.html").read_text()
    rec, = (r for r in iosim.scenario.run_scenario(iosim.scenario.load_scenario(scn)).records
            if r["seq_len"] == 4096)
    err_pct = f"{(rec['predicted_s'] - 2e-3) / 2e-3:+.1%}"
    assert f"<b>{err_pct}</b>" in page and "Measured: t-time.csv" in page
    assert page.count("<td>fa2</td>") == 1  # N = 8192 has no measurement; cudnn's row is another kernel's


def test_the_decoding_measured_scenario_finds_every_case_in_the_committed_time_records(tmp_path, capsys):
    code, _, err = run_cli(["report", "decoding-measured", "-o", str(tmp_path / "d.html"), "-q"], capsys)
    assert code == 0, err
    page = (tmp_path / "d.html").read_text()
    table = page.split("Predicted against measured", 1)[1].split("</table>", 1)[0]
    assert table.count("<td>fa2</td>") == 10  # 5 cache lengths × H100 and H200, each matched to a measured row


def test_long_tables_are_folded_behind_their_title_and_short_ones_shown():
    from iosim.report.page import FOLD_ROWS, _table_html

    def table(rows: int) -> str:
        return "<table><tr><th>N</th></tr>" + "".join(f"<tr><td>{i}</td></tr>" for i in range(rows)) + "</table>"

    short = _table_html("Short", None, table(FOLD_ROWS))
    assert short.startswith("<h3>Short</h3>") and "<details>" not in short
    long_ = _table_html("Long", "a caption", table(FOLD_ROWS + 1))
    assert long_.startswith("<details><summary><b>Long</b> (13 rows)</summary>") and "a caption" in long_
