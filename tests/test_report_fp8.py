"""The report's section "FP8 forward" (issue 27): simulated bytes fp8 against bf16, the newest FP8 run of the throughput
record beside the newest bf16 rows on its shapes, the accuracy record; a record without FP8 rows yet, or none at all,
said in the section, never raised. And the readers of the throughput records that were there before the fp8 rows
(the section "Measured speedups") are unmoved by them."""

from __future__ import annotations

import json

import pytest
from test_report_speedups import BENCH_HEAD, DEV, NEW, _bench_rows

from iosim.report import fp8, load_gpu, render_report

PROFILE = "h100-sxm5-80gb"


def _fp8_rows(commit: str, date: str, ms: dict, ns=(1024, 4096), dims=(128, 256)) -> str:
    """One bench_fp8.py run: each backend's ms = ms[backend] × (N / 1024)²; the quantize pass without TFLOP/s."""
    out = []
    for d in dims:
        for n in ns:
            for causal in ("false", "true"):
                for backend, t in ms.items():
                    rate = "" if backend == fp8.QUANTIZE else "1.0"
                    out.append(f"{DEV},{date},{commit},fp8e4m3,{d},{n},{16384 // n},{2048 // d},{causal},{backend},"
                               f"{t * (n / 1024) ** 2:.4f},{rate}\n")
    return "".join(out)


def _bf16_rows(commit: str, date: str, ms: dict, ns=(1024, 4096), dims=(128, 256)) -> str:
    return _fp8_rows(commit, date, ms, ns, dims).replace(",fp8e4m3,", ",bf16,")


OLD_FP8 = {"iosim-flash3-fp8": 9.0, "cudnn-fp8": 9.0, "iosim-fp8-quantize": 9.0}
NEW_FP8 = {"iosim-flash3-fp8": 0.1, "cudnn-fp8": 0.125, "iosim-fp8-quantize": 0.01}


@pytest.fixture
def bench(tmp_path, monkeypatch):
    """A throughput record: two bf16 runs (the newer's flash3 is twice as fast), an fp16 run, two fp8 runs (the newer
    is shown)."""
    text = (BENCH_HEAD + _bf16_rows("b0", "2026-12-01", {"iosim-flash3": 0.4, "sdpa-cudnn": 0.25})
            + _fp8_rows("f0", "2026-12-01", OLD_FP8)
            + _bf16_rows("b1", "2026-12-02", {"iosim-flash3": 0.2}, dims=(128,))
            + _bf16_rows("h1", "2026-12-02", {"iosim-flash3": 5.0}).replace(",bf16,", ",fp16,")  # not drawn
            + _fp8_rows("f1", "2026-12-02", NEW_FP8))
    (tmp_path / f"{PROFILE}.csv").write_text(text)
    monkeypatch.setattr(fp8, "benchmarks_dir", lambda: tmp_path)
    monkeypatch.setattr(fp8, "accuracy_dir", lambda: tmp_path)
    return tmp_path


def test_the_newest_fp8_run_is_drawn_beside_the_newest_bf16_rows_of_its_shapes(bench):
    rows, why = fp8.read_bench(PROFILE)
    assert why is None and {r["commit"] for r in fp8.newest_fp8_run(rows)} == {"f1"}
    points, ms, bf16_runs = fp8.measured_points(rows)
    rate = {(p["backend"], p["head_dim"], p["causal"], p["seq_len"]): p["tflops"] for p in points}
    # d = 128, N = 1024, non-causal: 4 N² d B H = 4 × 1024² × 128 × 16 × 16 = 137.4 GFLOP
    assert rate[("iosim-flash3-fp8", 128, False, 1024)] == pytest.approx(1374.38953472)  # ÷ 0.1 ms
    assert rate[("iosim-flash3", 128, False, 1024)] == pytest.approx(rate[("iosim-flash3-fp8", 128, False, 1024)] / 2)
    assert rate[("iosim-flash3", 256, True, 4096)] == pytest.approx(rate[("iosim-flash3-fp8", 256, True, 4096)] / 4)
    assert rate[("cudnn-fp8", 128, True, 4096)] == pytest.approx(rate[("iosim-flash3-fp8", 128, True, 4096)] * 0.8)
    assert ("iosim-fp8-quantize", 128, False, 1024) not in rate and ms[("iosim-fp8-quantize", 128, False, 1024)] == 0.01
    assert bf16_runs == {"b0 of 2026-12-01", "b1 of 2026-12-02"}


def test_the_section_draws_the_figure_and_says_what_is_missing(bench):
    html, n_fig = fp8.fp8_section()
    assert n_fig == 1 and f'id="{fp8.SECTION_ID}"' in html and "fig-fp8-forward-h100" in html
    h100, h200 = html.split("<h3>H100</h3>")[1].split("<h3>H200</h3>")
    assert "run f1 of 2026-12-02" in h100 and "bf16 rows from runs b0 of 2026-12-01, b1 of 2026-12-02" in h100
    assert "<td>2.00×</td><td>1.25×</td><td>0.0100</td>" in h100  # d = 128, N = 1024: fp8 ÷ bf16, ÷ cuDNN fp8, ms
    assert "<td>4.00×</td><td>1.25×</td><td>0.1600</td>" in h100  # d = 256, N = 4096: the older bf16 run's flash3
    assert "docs/benchmarks/h200-sxm-141gb.csv: no record" in h200
    assert "data/validation/h100-fp8-accuracy.json: no record" in h100


def test_a_record_without_fp8_rows_says_so_plainly(tmp_path, monkeypatch):
    (tmp_path / f"{PROFILE}.csv").write_text(BENCH_HEAD + _bench_rows("a670eb3", "2026-11-24", NEW))
    (tmp_path / "h200-sxm-141gb.csv").write_text("device,seq_len\nx,1\n")
    monkeypatch.setattr(fp8, "benchmarks_dir", lambda: tmp_path)
    html, n_fig = fp8.fp8_section()
    assert n_fig == 0 and "fig-fp8-forward" not in html
    assert f"docs/benchmarks/{PROFILE}.csv has no fp8e4m3 rows yet: no FP8 measurement" in html
    assert "docs/benchmarks/h200-sxm-141gb.csv: not a throughput record" in html


def test_the_accuracy_record_is_averaged_over_seeds_and_a_bad_one_is_named(bench):
    rows = [{"source": "iosim", "mode": m, "seed": s, "d": 128, "N": 4096, "rmse": r}
            for m, s, r in (("plain", 0, 2e-2), ("plain", 1, 4e-2), ("incoherent", 0, 9e-3))]
    (bench / "h100-fp8-accuracy.json").write_text(json.dumps(rows))
    (bench / "h200-fp8-accuracy.json").write_text(json.dumps({"rows": [{"d": 1}]}))
    got, why = fp8.read_accuracy("h100")
    assert why is None and got == rows
    table = fp8.accuracy_table(got)
    assert "<td>iosim</td><td>plain</td><td>128</td><td>4,096</td><td>3.00e-02</td><td>2</td>" in table
    assert "<td>incoherent</td><td>128</td><td>4,096</td><td>9.00e-03</td><td>1</td>" in table
    assert fp8.read_accuracy("h200")[1].startswith("data/validation/h200-fp8-accuracy.json: not an accuracy record")
    (bench / "h200-fp8-accuracy.json").write_text(json.dumps({"rows": rows}))
    assert fp8.read_accuracy("h200") == (rows, None)
    (bench / "h200-fp8-accuracy.json").write_text("{")
    assert "cannot be read" in fp8.read_accuracy("h200")[1]


def test_the_simulated_bytes_are_fewer_in_fp8_and_a_refusal_is_shown(monkeypatch):
    rows = fp8.simulated_bytes(PROFILE, shapes=((128, 1024), (256, 4096)))
    for r in rows:
        assert "why" not in r
        assert 0 < r["fp8"]["global"] < r["bf16"]["global"] <= 2 * r["fp8"]["global"] + 1
        assert 0 < r["fp8"]["hbm"] < r["bf16"]["hbm"]
    real = fp8.simulate

    def no_fp8(schedule, problem, *a, **kw):
        if problem.dtype == "fp8":
            raise ValueError("fp8 not yet\nmore")
        return real(schedule, problem, *a, **kw)

    monkeypatch.setattr(fp8, "simulate", no_fp8)
    (r,) = fp8.simulated_bytes(PROFILE, shapes=((64, 1024),))
    assert r["why"] == "fp8: ValueError: fp8 not yet" and "fp8: ValueError: fp8 not yet" in fp8.bytes_table([r])


def test_the_speedup_section_reads_the_same_numbers_with_fp8_rows_in_its_run(tmp_path):
    """fp8 rows appended with the commit and date of a run that has torch-standard: its measured speedups stay."""
    base = BENCH_HEAD + _bench_rows("a670eb3", "2026-11-24", NEW)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / f"{PROFILE}.csv").write_text(base)
    (tmp_path / "b" / f"{PROFILE}.csv").write_text(base + _fp8_rows("a670eb3", "2026-11-24", NEW_FP8, ns=(1024,),
                                                                     dims=(64, 128)))
    without = load_gpu("H100", "h100", PROFILE, tmp_path / "a", tmp_path)
    with_fp8 = load_gpu("H100", "h100", PROFILE, tmp_path / "b", tmp_path)
    assert with_fp8.measured == without.measured and len(without.measured) > 0


def test_the_report_of_the_builtin_scenarios_has_the_section(monkeypatch, bench):
    monkeypatch.setattr("iosim.report.page.builtin_report", lambda runs: True)
    monkeypatch.setattr("iosim.report.page.load_speedups", lambda: [])
    page = render_report([])
    assert f'<li><a href="#{fp8.SECTION_ID}">{fp8.TITLE}</a></li>' in page and "fig-fp8-forward-h100" in page
