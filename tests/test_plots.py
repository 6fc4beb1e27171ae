"""Figures: each returns a plotly figure with units on its axes and exact numbers in hover text, and its data
can be written as CSV."""

from __future__ import annotations

import csv
import re

import numpy as np
import pytest

from iosim import plots
from iosim.hardware.gpu import get_profile
from iosim.scenario import profile_summary, run_scenario, scenario_from_dict


def _records(**over):
    data = {"schema_version": 1, "name": "t", "title": "t", "schedules": ["naive", "flash1", "flash2"],
            "problems": [{"seq_len": [256, 1024, 4096], "head_dim": 64}]}
    data.update(over)
    return run_scenario(scenario_from_dict(data)).records


def test_traffic_vs_n_is_log_log_with_one_line_per_schedule_and_boundary():
    recs = _records()
    fig = plots.traffic_vs_n(recs, boundaries=("global", "sram"), compulsory=True)
    names = [t.name for t in fig.data]
    assert len(names) == 3 * 2 + 1
    assert fig.layout.xaxis.type == "log" and fig.layout.yaxis.type == "log"
    assert "sequence length" in fig.layout.xaxis.title.text and "bytes" in fig.layout.yaxis.title.text
    naive = next(t for t in fig.data if t.name == "naive · global")
    assert list(naive.y) == [r["global_bytes"] for r in recs if r["schedule"] == "naive"]
    assert f"{recs[0]['global_bytes']:,} B" in naive.text[0]  # the exact integer in the hover text


def test_roofline_has_ceilings_from_the_profile():
    recs = _records()
    prof = profile_summary(get_profile("h100-sxm5-80gb"))
    fig = plots.roofline(recs, {prof["name"]: prof})
    peak = next(t for t in fig.data if t.name == "matmul peak (fp16)")
    assert peak.y[0] == prof["matmul"]["fp16"]
    dram = next(t for t in fig.data if t.name.startswith("DRAM bandwidth"))
    assert np.allclose(np.asarray(dram.y) / np.asarray(dram.x), prof["dram_bandwidth"])


def test_traffic_vs_block_marks_tiles_that_do_not_fit_and_shows_references():
    recs = _records(schedules=["flash1"], profiles=["a100-sxm4-40gb"],
                    problems=[{"seq_len": 1024, "head_dim": 64}], tiles={"block": [64, 512], "allow_overfill": True})
    refs = [{"label": "r", "value": 1e9, "x": 64, "tag": "T", "source": "s", "unit": "bytes"}]
    fig = plots.traffic_vs_block(recs, refs)
    sim = fig.data[0]
    assert list(sim.marker.symbol) == ["circle", "circle-open"]
    assert "third-party transcription" in fig.data[1].name


def test_traffic_vs_sram_draws_the_lower_bound_below_both_schedules():
    recs = _records(schedules=["flash1", "flash2"], problems=[{"seq_len": 1024, "head_dim": 64}],
                    tiles={"sram_elements": {"start": 256, "stop": 65536, "factor": 4}})
    fig = plots.traffic_vs_sram(recs)
    bound = next(t for t in fig.data if t.name.startswith("I/O lower bound"))
    for tr in fig.data:
        if tr is bound:
            continue
        lb = plots.lower_bound_elements(1024, 1024, 64, np.asarray(tr.x)) * 2
        assert np.all(np.asarray(tr.y) >= lb)
    assert any("M = d²" in (a.text or "") for a in fig.layout.annotations)
    # at M = d^2 both terms of the bound equal N^2
    assert plots.lower_bound_elements(1024, 1024, 64, 64 * 64) == pytest.approx(1024 * 1024)


def test_every_figure_data_can_be_written_as_csv(tmp_path):
    recs = _records()
    fig = plots.time_vs_n(recs)
    path = plots.write_figure_csv(fig, tmp_path / "t.csv")
    rows = [r for r in csv.DictReader(open(path)) if ": band " not in r["trace"]]  # bands: upper, lower edge
    assert len(rows) == 9
    assert "<" not in rows[0]["hover"]


def test_parity_reads_measurement_files(tmp_path):
    p = tmp_path / "m.csv"
    with open(p, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=plots.MEASUREMENT_COLUMNS)
        w.writeheader()
        w.writerow({"kernel": "flash2", "device": "H200", "profile": "h200-sxm-141gb", "batch": 1, "heads": 32,
                    "kv_heads": 32, "seq_len": 4096, "kv_len": 4096, "head_dim": 128, "dtype": "fp16",
                    "causal": "false", "block_q": 128, "block_kv": 64, "boundary": "hbm", "direction": "read",
                    "simulated_bytes": 100663296, "measured_bytes": 105000000})
    rows = plots.read_measurements([p])
    fig = plots.parity(rows)
    assert fig.data[0].x[0] == 100663296 and fig.data[-1].name == "measured = simulated"


def test_parity_skips_files_that_are_not_measurement_tables(tmp_path):
    p = tmp_path / "other.csv"
    p.write_text("kind,seq_len\nflash2,4096\n")
    skipped: list[str] = []
    assert plots.read_measurements([p], skipped) == []
    assert "no columns kernel" in skipped[0]


def test_time_relative_to_a_schedule_is_one_for_that_schedule():
    recs = _records()
    fig = plots.time_vs_n(recs, relative_to="flash2")
    f2 = next(t for t in fig.data if t.name == "flash2")
    assert list(f2.y) == [1.0, 1.0, 1.0]
    naive = next(t for t in fig.data if t.name == "naive")
    want = [a["predicted_s"] / b["predicted_s"] for a, b in zip(
        [r for r in recs if r["schedule"] == "naive"], [r for r in recs if r["schedule"] == "flash2"])]
    assert list(naive.y) == want


def _decoding_records():
    """Flash-Decoding's sweep: batch × kv_len fixed, so batch moves with kv_len."""
    return _records(schedules=["flash2", "flash-decoding"], profiles=["a100-sxm4-40gb"], problems=[
        {"batch": 64 // n, "seq_len": 1, "kv_len": n * 256, "heads": 16, "kv_heads": 2} for n in (1, 4, 16, 64)])


def test_bars_keep_one_series_per_schedule_when_a_field_moves_with_x():
    recs = _decoding_records()
    fig = plots.bars(recs, "kv_len", "predicted_s")
    assert [t.name for t in fig.data] == ["flash2", "flash-decoding"]
    assert list(fig.data[0].x) == [f"kv_len={r['kv_len']}<br>batch={r['batch']}" for r in recs
                                   if r["schedule"] == "flash2"]


def test_bars_spanning_ten_times_go_on_a_log_axis():
    recs = _decoding_records()
    times = [r["predicted_s"] for r in recs]
    assert max(times) >= 10 * min(times)
    assert plots.bars(recs, "kv_len", "predicted_s").layout.yaxis.type == "log"
    flat = [r for r in recs if r["schedule"] == "flash-decoding"]
    assert plots.bars(flat, "kv_len", "compulsory_bytes").layout.yaxis.type == "linear"


def test_relative_time_draws_one_line_per_schedule_and_mask_and_says_it_is_a_ratio():
    """FA3's sweep: batch × N fixed; one line per schedule and causal, not one trace per point."""
    recs = _records(schedules=["flash3", "flash2"], problems=[
        {"batch": 16384 // n, "seq_len": n, "heads": 16, "head_dim": 128, "causal": [False, True]}
        for n in (512, 1024, 2048)])
    fig = plots.time_vs_n(recs, title="Predicted time vs sequence length", relative_to="flash2")
    assert len(fig.data) == 4 and all(len(t.x) == 3 for t in fig.data)
    assert "÷ flash2" in fig.layout.title.text and "÷ flash2" in fig.layout.yaxis.title.text


def test_roofline_has_one_x_axis_title_under_all_panels():
    recs = _records(profiles=["a100-sxm4-80gb", "h100-sxm5-80gb", "h200-sxm-141gb"])
    summaries = {p["name"]: p for p in (profile_summary(get_profile(n)) for n in
                                        ("a100-sxm4-80gb", "h100-sxm5-80gb", "h200-sxm-141gb"))}
    fig = plots.roofline(recs, summaries)
    axes = [fig.layout[k] for k in fig.layout.to_plotly_json() if k.startswith("xaxis")]
    assert len(axes) == 3 and all(a.title.text is None for a in axes)
    assert [a.text for a in fig.layout.annotations].count("arithmetic intensity (FLOP per DRAM byte)") == 1


def test_log_axes_are_labelled_at_1_2_5_steps_in_one_format():
    recs = _records(profiles=["h100-sxm5-80gb"])
    prof = profile_summary(get_profile("h100-sxm5-80gb"))
    figs = [plots.traffic_vs_n(recs, compulsory=True), plots.time_vs_n(recs), plots.roofline(recs, {prof["name"]: prof})]
    label = re.compile(r"^[125]0{0,2}(\.\d+)? ?[fpnµmkMGTPEZ]?(B|s)?$")
    for fig in figs:
        for key in fig.layout.to_plotly_json():
            axis = fig.layout[key]
            if key.startswith(("xaxis", "yaxis")) and axis.type == "log":
                assert axis.tickvals is not None and len(axis.tickvals) >= 2, key
                assert all(label.match(t) for t in axis.ticktext), axis.ticktext
    peak = next(t for t in figs[2].data if t.name == "matmul peak (fp16)").y[0]
    assert peak > 1e14 and any(t.endswith(("P", "T")) for t in figs[2].layout.yaxis.ticktext)


def test_records_carry_the_time_model_kernel_and_its_calibration():
    """Issue 17 item 7: whose time predicted_s is, and on what its rates were measured, travel with the record."""
    recs = _records(profiles=["h100-sxm5-80gb", "a100-sxm4-80gb"])
    by = {(r["profile"], r["schedule"]): r for r in recs if r["seq_len"] == 1024}
    h100 = by[("h100-sxm5-80gb", "flash2")]
    assert h100["time_kernel"] == "iosim-flash2" and by[("h100-sxm5-80gb", "naive")]["time_kernel"] == "iosim-naive"
    assert h100["time_calibration"].startswith("measured on NVIDIA H100") and h100["roofline_s"] > 0
    assert h100["roofline_s"] < h100["predicted_s"]  # the peak bound is the ideal, the model is not
    assert by[("a100-sxm4-80gb", "flash2")]["time_calibration"] == "uncalibrated"
    flash1 = by[("h100-sxm5-80gb", "flash1")]  # no kernel model: the peak roofline, whatever the profile
    assert (flash1["time_kernel"], flash1["time_calibration"]) == ("roofline", "uncalibrated")
    assert flash1["roofline_s"] == flash1["predicted_s"]


def test_calibration_labels_shorten_to_device_and_date():
    cal = ("measured on NVIDIA H100 80GB HBM3, driver 580.159.04, CUDA 13.2 (CuPy 14.2.0), 2026-11-24, "
           "commit c7464d1+dirty")
    assert plots.calibrated_on(cal) == "rates measured on NVIDIA H100 80GB HBM3, 2026-11-24"
    assert plots.calibrated_on("uncalibrated") == plots.calibrated_on(None) == "datasheet rates, uncalibrated"


def test_predicted_time_figures_say_which_model_and_calibration():
    """time_vs_n and bars of predicted_s carry a subtitle; the roofline's and time_vs_n's hover name the model."""
    h100 = _records(schedules=["naive", "flash2"], profiles=["h100-sxm5-80gb"])
    sub = plots.time_vs_n(h100).layout.title.text.replace("<br>", " ")
    assert "predicted by iosim's time model (kernels: iosim-naive, iosim-flash2; rates measured on NVIDIA" in sub
    assert "H100 80GB HBM3, 2026-11-24)" in sub and "uncalibrated" not in sub
    a100 = _records(schedules=["naive", "flash2"], profiles=["a100-sxm4-80gb"])
    assert "datasheet rates, uncalibrated" in plots.time_vs_n(a100).layout.title.text.replace("<br>", " ")
    peak = _records(schedules=["flash1"], profiles=["h100-sxm5-80gb"])
    assert plots.time_vs_n(peak).layout.title.text.endswith("<sup>peak roofline, uncalibrated</sup>")
    mixed = plots.time_source(_records(profiles=["h100-sxm5-80gb", "a100-sxm4-80gb"]))
    assert "a100-sxm4-80gb: datasheet rates, uncalibrated" in mixed
    assert "h100-sxm5-80gb: rates measured on NVIDIA H100 80GB HBM3" in mixed
    assert mixed.endswith("flash1: peak roofline, uncalibrated")
    rel = plots.time_vs_n(h100, relative_to="flash2").layout.title.text
    assert "÷ flash2's" in rel and "rates measured on" in rel
    bars = plots.bars(h100, "seq_len", "predicted_s")
    assert "NVIDIA H100 80GB HBM3, 2026-11-24" in bars.layout.title.text and "kernel model" in bars.data[0].text[0]
    assert "<sup>" not in plots.bars(h100, "seq_len", "global_bytes").layout.title.text
    prof = profile_summary(get_profile("h100-sxm5-80gb"))
    points = [t for t in plots.roofline(h100, {prof["name"]: prof}).data if t.name in ("naive", "flash2")]
    assert all("time: the iosim-" in h and "kernel model, measured on NVIDIA H100" in h for t in points for h in t.text)
    assert "time: the iosim-flash2 kernel model, measured on" in plots.time_vs_n(h100).data[1].text[0]
    # results saved before records carried the model: said, not guessed
    old = [{k: v for k, v in r.items() if k not in ("time_kernel", "time_calibration")} for r in h100]
    assert "not recorded" in plots.time_vs_n(old).layout.title.text
