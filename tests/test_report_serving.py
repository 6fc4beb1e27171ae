"""The report's section "Serving": iosim's decode kernel's measured DRAM share beside the model's, and the varlen
rows, from the committed records; a missing record is named, never raised."""

from __future__ import annotations

import csv

from iosim._resources import benchmarks_dir
from iosim.report import serving


def test_the_section_draws_one_figure_per_gpu_from_the_committed_records():
    html, n_fig = serving.serving_section()
    assert n_fig == len(serving.GPUS)
    assert f'id="{serving.SECTION_ID}"' in html and "fig-serving-h100" in html and "fig-serving-h200" in html
    assert "Varlen and sliding windows" in html and "pages of 16" in html


def test_the_model_is_drawn_on_every_contiguous_row():
    profile = serving.GPUS[0][1]
    with open(benchmarks_dir() / f"decode-{profile}.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    got = serving.predicted_share(rows, profile)
    contiguous = {(int(r["batch"]), int(r["n"])) for r in rows if r["layout"] == "contig"}
    assert {(b, n) for b, pts in got.items() for n, _ in pts} == contiguous
    assert all(share > 0 for pts in got.values() for _, share in pts)


def test_a_missing_record_is_named_not_raised(monkeypatch, tmp_path):
    monkeypatch.setattr(serving, "benchmarks_dir", lambda: tmp_path)
    html, n_fig = serving.serving_section()
    assert n_fig == 0 and "docs/benchmarks/decode-h100-sxm5-80gb.csv: no record" in html
    assert "docs/benchmarks/varlen-h200-sxm-141gb.csv: no record" in html
