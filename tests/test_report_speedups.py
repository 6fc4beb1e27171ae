"""The report's section "Measured speedups" (issue 17 item 7): standard attention ÷ FA2, cuDNN and iosim's flash2
from the throughput records, beside the time model's predicted speedup and the seeds' claims; the newest run that
has torch-standard; the committed records from any working folder; a missing record or GPU said, never a crash."""

from __future__ import annotations

import csv

import pytest

from iosim import plots
from iosim.report import load_gpu, load_speedups, render_report, speedup_section, speedup_table
from iosim.report.speedups import newest_standard_run

BENCH_HEAD = "device,date,commit,dtype,head_dim,seq_len,batch,heads,causal,backend,ms,tflops\n"
TIME_HEAD = ("kernel,device,profile,batch,heads,kv_heads,seq_len,kv_len,head_dim,dtype,causal,block_q,block_kv,"
             "predicted_s,measured_s\n")
DEV = "NVIDIA H100 80GB HBM3"


def _bench_rows(commit: str, date: str, times: dict, ns=(256, 1024, 4096), dims=(64, 128)) -> str:
    """One run: every backend's ms = times[backend] × N / 1024 (so every speedup is a ratio of two constants)."""
    out = []
    for d in dims:
        for n in ns:
            for causal in ("false", "true"):
                for backend, t in times.items():
                    out.append(f"{DEV},{date},{commit},bf16,{d},{n},{max(1, 16384 // n)},{2048 // d},{causal},"
                               f"{backend},{t * n / 1024:.4f},1.0\n")
    return "".join(out)


OLD = {"torch-standard": 8.0, "sdpa-flash": 2.0, "sdpa-cudnn": 1.0}  # an older run with torch-standard
NEW = {"torch-standard": 12.0, "sdpa-flash": 2.0, "sdpa-cudnn": 1.2, "iosim-flash2": 2.4, "iosim-naive": 4.8}
LATEST = {"sdpa-flash": 2.0, "iosim-flash3": 1.0}  # the newest run, without torch-standard: not shown


def _time_rows(ns=(128, 1024, 4096)) -> str:
    """Predicted: iosim-naive 10 s, fa2 4 s, cudnn 2.5 s per 1024 tokens; and a grouped-query row (not a benchmark
    shape) that must be left out."""
    out = []
    for d in (64, 128):
        for n in ns:
            for kernel, t in (("iosim-naive", 10.0), ("fa2", 4.0), ("cudnn", 2.5), ("iosim-flash2", 4.4)):
                for causal in ("false", "true"):
                    b, h = max(1, 16384 // n), 2048 // d
                    out.append(f"{kernel},{DEV},h100-sxm5-80gb,{b},{h},{h},{n},{n},{d},bf16,{causal},,,"
                               f"{t * n / 1024:.6e},1e-3\n")
    out.append(f"fa2,{DEV},h100-sxm5-80gb,16,32,8,1024,1024,128,bf16,false,,,1e-9,1e-3\n")
    return "".join(out)


@pytest.fixture
def records(tmp_path):
    bench, val = tmp_path / "benchmarks", tmp_path / "validation"
    bench.mkdir()
    val.mkdir()
    (bench / "h100-sxm5-80gb.csv").write_text(
        BENCH_HEAD + _bench_rows("1111111", "2026-11-20", OLD) + _bench_rows("a670eb3", "2026-11-24", NEW)
        + _bench_rows("2222222", "2026-11-25", LATEST))
    (val / "h100-time.csv").write_text(TIME_HEAD + _time_rows())
    return bench, val


def test_the_newest_run_with_torch_standard_is_shown(records):
    bench, _ = records
    rows = list(csv.DictReader(open(bench / "h100-sxm5-80gb.csv")))
    assert {r["commit"] for r in newest_standard_run(rows)} == {"a670eb3"}
    assert newest_standard_run([r for r in rows if r["backend"] != "torch-standard"]) == []


def test_measured_and_predicted_speedups_from_the_records(records):
    g = load_gpu("H100", "h100", "h100-sxm5-80gb", *records)
    assert g.missing == [] and g.run == {"device": DEV, "commit": "a670eb3", "date": "2026-11-24"}
    by = {(r["backend"], r["head_dim"], r["causal"], r["seq_len"]): r["speedup"] for r in g.measured}
    assert len(by) == 3 * 2 * 2 * 3  # three kernels, d 64 and 128, causal and not, three N
    assert by[("sdpa-flash", 64, False, 1024)] == pytest.approx(6.0)
    assert by[("sdpa-cudnn", 128, True, 4096)] == pytest.approx(10.0)
    assert by[("iosim-flash2", 64, True, 256)] == pytest.approx(5.0)
    pred = {(r["backend"], r["head_dim"], r["causal"], r["seq_len"]): r["speedup"] for r in g.predicted}
    assert set(pred) == {(b, d, c, n) for b in ("sdpa-flash", "sdpa-cudnn") for d in (64, 128)
                         for c in (False, True) for n in (128, 1024, 4096)}  # the grouped-query row left out
    assert pred[("sdpa-flash", 128, False, 1024)] == pytest.approx(2.5)
    assert pred[("sdpa-cudnn", 64, True, 128)] == pytest.approx(4.0)


def test_figure_has_measured_predicted_and_the_three_claims(records):
    g = load_gpu("H100", "h100", "h100-sxm5-80gb", *records)
    fig = plots.speedups(g.figure)
    names = {t.name for t in fig.data if t.showlegend is not False}
    assert {"FA2 (sdpa-flash), non-causal", "FA2 (sdpa-flash), causal", "cuDNN (sdpa-cudnn), causal",
            "iosim flash2, non-causal", "FA2 predicted, causal", "cuDNN predicted, non-causal"} <= names
    band = next(t for t in fig.data if t.name.startswith("claim: FlashAttention 2-4×"))
    assert set(band.y) == {2.0, 4.0} and band.fill == "toself"
    fa3 = next(t for t in fig.data if t.name.startswith("claim: FA3-class (cuDNN) 1.5-2× FA2"))
    assert (min(fa3.y), max(fa3.y)) == pytest.approx((1.5 * 6.0, 2.0 * 6.0))  # over FA2's measured 6×
    short = next(t for t in fig.data if t.name.startswith("claim: standard attention wins below ~256 tokens"))
    assert list(short.x) == [256, 256]
    assert fig.layout.xaxis.type == "log" and fig.layout.yaxis.type == "log"
    assert [a.text for a in fig.layout.annotations][:2] == ["d = 64", "d = 128"]
    title = fig.layout.title.text.replace("<br>", " ")
    assert "run a670eb3 of 2026-11-24" in title and "rates measured on NVIDIA H100 80GB HBM3" in title
    dotted = [t for t in fig.data if "predicted" in (t.name or "")]
    assert dotted and all(t.line.dash == "dot" for t in dotted)
    assert {t.line.dash for t in fig.data if t.name and t.name.endswith(", causal") and "predicted" not in t.name} \
        == {"dash"}
    assert plots.figure_data(fig)  # its points go to CSV like every figure's


def test_table_gives_the_ranges_from_n_1024_and_judges_each_claim(records):
    g = load_gpu("H100", "h100", "h100-sxm5-80gb", *records)
    table = speedup_table([g])
    assert "<td>FA2 ÷ standard</td><td class=num>6.00× (8 shapes)</td><td class=num>2.50× (8 shapes)</td>" in table
    assert "<b>above</b> the claim: every shape beyond 4×" in table  # FA2 6× and cuDNN 10×: above 2-4×
    assert "<td>cuDNN ÷ FA2</td><td class=num>1.67× (8 shapes)</td><td class=num>1.60× (8 shapes)</td>" in table
    assert "<b>within</b> the claim" in table  # cuDNN 1.67× FA2: within 1.5-2×
    assert "at N = 256: FA2 6.00×, cuDNN 10.0×" in table and "at N = 128: FA2 2.50×, cuDNN 4.00×" in table
    assert "<b>not seen</b> at N ≥ 256" in table
    # the model's check on the same run: iosim-naive ÷ fa2 predicted 2.5, measured 2.4; ÷ cudnn 4.0 and 4.0
    assert "predicted ÷ measured: median 1.02, 1.00 to 1.04" in table
    section, n = speedup_section([g])
    assert n == 1 and 'id="fig-measured-speedups-h100"' in section and "<p class=note>" not in section


def test_missing_records_and_gpus_are_named_not_raised(tmp_path, records):
    bench, val = records
    empty = tmp_path / "empty"
    empty.mkdir()
    gpus = load_speedups(empty, empty)
    assert [g.name for g in gpus] == ["H100", "H200"]
    section, n = speedup_section(gpus)
    assert n == 0
    for name in ("docs/benchmarks/h100-sxm5-80gb.csv is missing", "docs/validation/h100-time.csv is missing",
                 "docs/benchmarks/h200-sxm-141gb.csv is missing", "docs/validation/h200-time.csv is missing"):
        assert name in section
    assert "No GPU has a speedup record yet" in section
    (bench / "h200-sxm-141gb.csv").write_text("device,seq_len\nx,1\n")  # not a throughput record
    gpus = load_speedups(bench, val)
    section, n = speedup_section(gpus)
    assert n == 1  # the H100 only
    assert "docs/benchmarks/h200-sxm-141gb.csv has no columns backend, causal, commit" in section
    assert "docs/validation/h200-time.csv is missing: no predicted speedups" in section
    (bench / "h100-sxm5-80gb.csv").write_text(BENCH_HEAD + _bench_rows("2222222", "2026-11-25", LATEST))
    g = load_gpu("H100", "h100", "h100-sxm5-80gb", bench, val)
    assert g.missing == ["docs/benchmarks/h100-sxm5-80gb.csv has no run with torch-standard (runs: 2222222 of "
                         "2026-11-25): no measured speedups"]
    assert g.predicted and "measured: no run with torch-standard" in plots.speedups(g.figure).layout.title.text


def test_committed_records_render_from_any_working_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the records come from iosim's data folders, not from here
    gpus = {g.name: g for g in load_speedups()}
    h100 = gpus["H100"]
    assert h100.predicted, h100.missing  # the committed H100 time record
    assert all(0.5 < r["speedup"] < 100 for r in h100.predicted + h100.measured)
    if h100.measured:  # once the throughput record has a run with torch-standard
        assert h100.run["device"] == "NVIDIA H100 80GB HBM3" and not h100.missing
    section, n = speedup_section(list(gpus.values()))
    assert n >= 1 and '<section id="measured-speedups">' in section
    assert all(f"<h3>{name}</h3>" in section for name in ("H100", "H200"))
    assert str(tmp_path) not in section


def test_only_the_builtin_report_has_the_section_unless_given(records):
    page = render_report([])
    assert "measured-speedups" not in page  # a report of named scenarios: no section of its own
    page = render_report([], speedups=[load_gpu("H100", "h100", "h100-sxm5-80gb", *records)])
    assert '<li><a href="#measured-speedups">Measured speedups</a></li>' in page
    assert page.count('class="plotly-graph-div"') == 1
