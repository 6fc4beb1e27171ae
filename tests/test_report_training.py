"""The report's section "Training: forward + backward": the newest run of each GPU's committed training record,
its speedups beside the simulated bytes ratio, a missing record named, never a crash."""

from __future__ import annotations

import pytest

from iosim.report import training as tr

HEAD = "device,date,commit,dtype,head_dim,seq_len,batch,heads,causal,backend,ms,speedup\n"


def _rows(commit: str, date: str, flash_ms: float) -> str:
    out = []
    for n in (512, 1024):
        for backend, ms in (("torch-standard", 10.0), ("sdpa-flash", flash_ms), ("iosim-flash2", 4.0)):
            out.append(f"GPU,{date},{commit},bf16,64,{n},{16384 // n},12,true,{backend},{ms},{10.0 / ms:.3f}\n")
    return "".join(out)


@pytest.fixture
def records(tmp_path, monkeypatch):
    (tmp_path / "training-h100-sxm5-80gb.csv").write_text(HEAD + _rows("aaa", "2026-01-01", 2.0)
                                                          + _rows("bbb", "2026-02-01", 2.5))
    monkeypatch.setattr(tr, "benchmarks_dir", lambda: tmp_path)
    return tmp_path


def test_the_newest_run_is_read(records):
    rows, why = tr.read_training("h100-sxm5-80gb")
    assert why is None and {r["commit"] for r in rows} == {"bbb"} and len(rows) == 6


def test_the_section_shows_speedups_and_the_simulated_ratio_and_names_a_missing_record(records):
    html, n_fig = tr.training_section()
    assert n_fig == 1 and "fig-training-h100" in html
    assert "4.00×" in html and "2.50×" in html  # sdpa-flash 10 / 2.5, iosim 10 / 4
    assert "docs/benchmarks/training-h200-sxm-141gb.csv: no record" in html


def test_the_simulated_ratio_is_naive_over_flash2_bytes_and_above_one(records):
    rows, _ = tr.read_training("h100-sxm5-80gb")
    ratio = tr.traffic_ratio(rows, "h100-sxm5-80gb")
    assert list(ratio) == [512, 1024] and 1 < ratio[512] < ratio[1024]


def test_a_file_that_is_not_a_record_is_named(tmp_path, monkeypatch):
    (tmp_path / "training-h100-sxm5-80gb.csv").write_text("a,b\n1,2\n")
    monkeypatch.setattr(tr, "benchmarks_dir", lambda: tmp_path)
    rows, why = tr.read_training("h100-sxm5-80gb")
    assert rows == [] and "not a training record" in why
