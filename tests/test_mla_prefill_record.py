"""benchmarks/mla_prefill_record.py on a CPU: its table of the measured record in data/validation (DeepSeek-V3's MLA
prefill run by torch on an H200: cuBLAS's GEMM, torch.cat, cuDNN's attention), each stage's DRAM bytes judged by the
hbm rule against iosim.schedules.mla_prefill and the attention's time against iosim.timing.mla."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import load_benchmark

from iosim.hardware.gpu import get_profile
from iosim.schedules.mla_prefill import dram
from iosim.timing.mla import prefill_attention_time, prefill_reference

ROOT = Path(__file__).resolve().parents[1]
RECORD = ROOT / "data/validation" / "h200-mla-prefill.json"


@pytest.fixture(scope="module")
def rec():
    return load_benchmark("mla_prefill_record")


def test_table_of_the_h200_record(rec, capsys):
    data = json.loads(RECORD.read_text())
    assert data["check_error"] < rec.CHECK_TOL
    errors = rec.table("h200", RECORD)
    out = capsys.readouterr().out
    profile = get_profile(rec.PROFILE["h200"])
    assert len(errors) == len(data["rows"]) == len(rec.SHAPES)
    for row, err in zip(data["rows"], errors, strict=True):
        m = prefill_reference(row["batch"], row["seq_len"], row["kv_len"])
        lines = [ln for ln in out.splitlines() if ln.startswith(f"| {rec.shape(row)} |")]
        assert [ln.split(" | ")[1] for ln in lines] == ["mla_kv_up", "mla_k_cat", "mla_attention"]
        for line, (read, write), stage in zip(lines, dram(m), rec.STAGES, strict=True):
            got = row["stages"][stage]
            assert f"{read / 1e6:.2f} / {got['dram_read'] / 1e6:.2f}" in line
            assert f"{write / 1e6:.2f} / {got['dram_write'] / 1e6:.2f}" in line
        model = prefill_attention_time(m, profile).predicted_s * 1e3
        assert f"/ {model:.4f} / {row['stages']['attention']['ms']:.4f} |" in lines[2]
        assert err == pytest.approx((model - row["stages"]["attention"]["ms"]) / row["stages"]["attention"]["ms"])
    assert f"attention time, model against measured ({len(rec.SHAPES)} rows)" in out
    assert any(row["kv_len"] > row["seq_len"] for row in data["rows"])  # chunks after a cached prefix


def test_the_attention_kernel_is_the_one_the_model_names_with_its_tiles(rec):
    """cuDNN's persistent grid fetches one tile a Q tile of 128 rows and one a block from its counter: the record's
    atomics count exactly the tiles the model deals out."""
    data = json.loads(RECORD.read_text())
    for row in data["rows"]:
        launch = rec.attention_kernel(row["stages"]["attention"])
        assert launch is not None
        tiles = row["batch"] * 128 * -(-row["seq_len"] // 128)
        assert launch["atomics"] == tiles + launch["grid"]


def test_a_missing_record_is_one_line_not_a_traceback(rec, tmp_path, capsys):
    assert rec.main(["--device", "h200", "--out", str(tmp_path)]) == 2
    assert "no record" in capsys.readouterr().err
