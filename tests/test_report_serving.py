"""The report's section "Serving": iosim's decode kernel's measured DRAM share beside the model's, and the varlen
rows, from the committed records; a missing record is named, never raised."""

from __future__ import annotations

import csv
from itertools import pairwise

import pytest

from iosim._resources import benchmarks_dir
from iosim.report import records, serving, serving_mla


def test_the_section_draws_decode_varlen_window_and_mla_time_figures_per_gpu_and_mla_intensity_once():
    html, n_fig = serving.serving_section()
    assert n_fig == 4 * len(serving.GPUS) + 1 + 1  # and MLA prefill's time figure: the H200's record only
    assert "fig-serving-mla-time-h100" in html and "fig-serving-mla-time-h200" in html
    assert "fig-serving-mla-prefill-h200" in html and "fig-serving-mla-prefill-h100" not in html
    assert f'id="{serving.SECTION_ID}"' in html and "fig-serving-h100" in html and "fig-serving-h200" in html
    assert "fig-serving-window-h100" in html and "fig-serving-window-h200" in html and "fig-serving-mla" in html
    assert "fig-serving-varlen-h100" in html and "fig-serving-varlen-h200" in html
    assert "Varlen and sliding windows" in html and "pages of 16" in html
    assert html.count("contiguous cache (chunked prefill on pages)") == 6 * len(serving.GPUS)  # the paged rows


def test_a_windows_bytes_grow_with_it_under_full_attentions_and_the_benchmarks_rows_are_drawn():
    profile = serving.GPUS[0][1]
    vrows, _ = serving.read_record(f"varlen-{profile}.csv", serving.VARLEN_COLUMNS)
    sim, (full_bytes, full_s), measured = serving.window_points(profile, vrows)
    assert [w for w, _, _ in sim] == list(serving.WINDOWS)
    assert all(a[1] < b[1] and a[2] < b[2] for a, b in pairwise(sim))  # bytes and time grow with w
    assert sim[-1][1] < full_bytes and sim[-1][2] < full_s
    assert [w for w, _ in measured] == [256, 1024, 4096] and all(s > 0 for _, s in measured)


def test_the_model_is_drawn_on_every_contiguous_row():
    profile = serving.GPUS[0][1]
    with open(benchmarks_dir() / f"decode-{profile}.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    got = serving.predicted_share(rows, profile)
    contiguous = {(int(r["batch"]), serving.cache_of(r), int(r["n"])) for r in rows if r["layout"] == "contig"}
    assert {(b, c, n) for (b, c), pts in got.items() for n, _ in pts} == contiguous
    assert {c for _, c, _ in contiguous} == {"bf16", "fp8"}
    assert all(share > 0 for pts in got.values() for _, share in pts)


def test_a_missing_record_is_named_not_raised(monkeypatch, tmp_path):
    monkeypatch.setattr(records, "benchmarks_dir", lambda: tmp_path)
    html, n_fig = serving.serving_section()
    # windows (no measured crosses), MLA's intensity, its decode time records and the H200's prefill record
    assert n_fig == 2 * len(serving.GPUS) + 1 + 1
    assert "docs/benchmarks/decode-h100-sxm5-80gb.csv: no record" in html
    assert "docs/benchmarks/varlen-h200-sxm-141gb.csv: no record" in html


def test_the_padded_batches_work_is_recovered_from_the_rows_tflops():
    vrows, _ = serving.read_record(f"varlen-{serving.GPUS[0][1]}.csv", serving.VARLEN_COLUMNS)
    bars, work = serving.padded_points(vrows)
    assert set(bars) == {"flash2", "flash3"} and len(work) == 12  # 3 batches x causal or not x d 64, 128
    for label, ratio in work:
        if label.startswith("equal"):
            assert ratio == pytest.approx(1.0, rel=1e-3)  # four sequences of 4096: nothing padded
        else:
            assert ratio > 2  # skewed 8192 + 14 x 512 + 64: 15.2x the pairs; uniform lengths 2.2x


def test_the_paged_rows_have_flexattention_on_the_same_pages_beside_them():
    html, _ = serving.serving_section()
    assert html.count("FlexAttention on the same pages") == 6 * len(serving.GPUS)


@pytest.mark.parametrize("name,profile", serving.GPUS)
def test_the_mla_reference_is_tabled_beside_the_counts_and_the_models(name, profile):
    from iosim._resources import validation_dir
    from iosim.hardware.gpu import get_profile
    from iosim.schedules.mla_decode import dram
    from iosim.timing.mla import attention_time, reference

    with open(validation_dir() / serving_mla.MLA_RECORDS[name], newline="") as f:
        rows = list(csv.DictReader(f))
    got = serving_mla.mla_measured(name, profile)
    assert got.count("<tr><td>") == len(rows) == 4 * len({(r["batch"], r["kv_len"]) for r in rows})  # 3 stages + cat
    first = next(r for r in rows if r["stage"] == "attention")
    ref = reference(int(first["batch"]), int(first["kv_len"]))
    assert f"{dram(ref)[1][0] / 1e6:.1f} (floor) / {int(first['dram_read']) / 1e6:.1f}" in got
    t = attention_time(ref, get_profile(profile))  # the model where the profile measured the kernel's step
    assert (f"{t.predicted_s * 1e3:.3f} (model) / " if t else "no step measured / ") in got


def test_a_missing_mla_record_is_named(monkeypatch):
    monkeypatch.setitem(serving_mla.MLA_RECORDS, "H100", "no-such-mla.csv")
    assert "no MLA record" in serving_mla.mla_measured("H100", serving.GPUS[0][1])
    assert serving_mla.mla_time_figure("H100", serving.GPUS[0][1], serving.SECTION_ID) == ""  # and no figure of it


@pytest.mark.parametrize("name,profile", serving.GPUS)
def test_the_mla_time_figure_draws_the_model_where_the_profile_measured_its_step(name, profile):
    from iosim.hardware.gpu import get_profile
    from iosim.timing.mla import attention_time, reference

    got = serving_mla.mla_time_figure(name, profile, serving.SECTION_ID)
    modeled = attention_time(reference(1, 1), get_profile(profile)) is not None
    assert ("its model's (the kernel's step" in got) == modeled
    assert ("no model: this GPU's profile has not measured its step" in got) == (not modeled)


def test_the_decode_byte_record_is_folded_per_cache_boundary_and_direction(monkeypatch, tmp_path):
    html = serving.decode_bytes("H100")
    assert html.count("<tr><td>") == 8 and "16 of 16" in html and "exact 16" in html
    monkeypatch.setattr(records, "validation_dir", lambda: tmp_path)
    assert "no decode byte record" in serving.decode_bytes("H200")


def test_the_mla_prefill_reference_is_tabled_beside_the_counts_and_the_model():
    from iosim._resources import validation_dir
    from iosim.hardware.gpu import get_profile
    from iosim.schedules.mla_prefill import dram
    from iosim.timing.mla import prefill_attention_time, prefill_reference

    name, profile = serving.GPUS[1]  # the H200: the GPU the record was measured on
    with open(validation_dir() / serving_mla.MLA_PREFILL_RECORDS[name], newline="") as f:
        rows = list(csv.DictReader(f))
    got = serving_mla.mla_prefill_measured(name, profile)
    assert got.count("<tr><td>") == len(rows) == 3 * len({(r["batch"], r["seq_len"], r["kv_len"]) for r in rows})
    last = [r for r in rows if r["stage"] == "attention"][-1]  # a chunk after a cached prefix
    m = prefill_reference(int(last["batch"]), int(last["seq_len"]), int(last["kv_len"]))
    assert m.kv_len > m.seq_len and f"{m.batch} × {m.seq_len} on {m.kv_len}" in got
    assert f"{dram(m)[2][0] / 1e6:.1f} / {int(last['dram_read']) / 1e6:.1f}" in got
    t = prefill_attention_time(m, get_profile(profile)).predicted_s * 1e3
    assert f"{t:.3f} (model) / {float(last['ms']):.3f}" in got
    assert "no MLA prefill record" in serving_mla.mla_prefill_measured(*serving.GPUS[0])  # no H100 run
    assert got in serving.serving_section()[0]


def test_the_mla_prefill_time_figure_draws_the_measured_the_model_and_the_roofline():
    from iosim.hardware.gpu import get_profile
    from iosim.timing.mla import prefill_attention_time, prefill_reference

    name, profile = serving.GPUS[1]
    got = serving_mla.mla_prefill_time_figure(name, profile, serving.SECTION_ID)
    assert f'id="fig-serving-mla-prefill-{name.lower()}"' in got and "roofline of the counts" in got
    model = prefill_attention_time(prefill_reference(4, 1024, 8192), get_profile(profile)).predicted_s * 1e3
    assert "4 x 1024 on 8192" in got and f"{model:.6g}"[:5] in got  # the chunk's bar, at the model's time
    assert serving_mla.mla_prefill_time_figure(*serving.GPUS[0], serving.SECTION_ID) == ""  # no H100 record
