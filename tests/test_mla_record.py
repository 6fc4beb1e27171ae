"""benchmarks/mla_record.py on a CPU: its judging of a stage (iosim.validation's hbm rule) and its table of the
measured records in data/validation (DeepSeek-V3's absorbed MLA decode step run by torch on an H100 and an H200)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from helpers import load_benchmark

from iosim.schedules.mla_decode import MlaDecode, dram

ROOT = Path(__file__).resolve().parents[1]
BENCH_DIR = str(ROOT / "benchmarks")


@pytest.fixture(scope="module")
def mla():
    if BENCH_DIR not in sys.path:  # mla_record imports cuda_events and time_record from beside itself
        sys.path.insert(0, BENCH_DIR)
    return load_benchmark("mla_record")


def test_within_is_the_hbm_rule(mla):
    # reads 5%, writes 10% of the measured bytes, or 1% of the stage's compulsory bytes, whichever is wider
    assert mla.within(105, 100, "read", 0) and not mla.within(106, 100, "read", 0)
    assert mla.within(110, 100, "write", 0) and not mla.within(111, 100, "write", 0)
    assert mla.within(1_000, 0, "write", 100_000) and not mla.within(1_001, 0, "write", 100_000)


def test_short_names_keep_the_kernel(mla):
    assert mla.short(["void at::<unnamed>::CatArrayBatchedCopy<at::<unnamed>::OpaqueType<2>, unsigned int>(int)"]) \
        == "CatArrayBatchedCopy"
    assert mla.short(["fmha_cutlassF_bf16_aligned_32x128_gmem_sm80(PyTorchMemEffAttention::Params)"]) \
        == "fmha_cutlassF_bf16_aligned_32x128_gmem_sm80"
    assert mla.short([]) == "-"


@pytest.mark.parametrize("device", ["h100", "h200"])
def test_table_of_the_record(mla, device, capsys):
    from iosim.hardware.gpu import get_profile
    from iosim.schedules.mla_decode import counts
    from iosim.timing.mla import attention_time, reference

    path = ROOT / "data/validation" / f"{device}-mla.json"
    rec = json.loads(path.read_text())
    assert rec["check_error"] < mla.CHECK_TOL
    errors = mla.table(device, path)
    out = capsys.readouterr().out
    profile = get_profile(mla.PROFILE[device])
    for row in rec["rows"]:
        shape = f"| {row['batch']} x {row['kv_len']} |"
        lines = [ln for ln in out.splitlines() if ln.startswith(shape)]
        assert len(lines) == len(mla.STAGES)  # the three judged stages and torch.cat
        simulated = dram(MlaDecode(batch=row["batch"], kv_len=row["kv_len"]))
        for (stage, k), line in zip(mla.JUDGED.items(), lines, strict=False):
            if stage != "attention":
                assert f"{simulated[k][0] / 1e6:.2f} / {row['stages'][stage]['dram_read'] / 1e6:.2f}" in line
        attention = lines[1]  # torch's kernel against the counts of its own design, and its model's time
        ref = reference(row["batch"], row["kv_len"])
        assert f"{counts(ref).kernels[1].global_read_bytes / 1e6:.2f} / " in attention
        t = attention_time(ref, profile)
        assert (f"/ {t.predicted_s * 1e3:.4f} / " if t else " / - / ") in attention
    assert len(errors) == (len(rec["rows"]) if attention_time(reference(1, 1), profile) else 0)


def test_the_h200_record_counts_torchs_kernel_exactly_at_global(mla, capsys):
    path = ROOT / "data/validation" / "h200-mla.json"
    rec = json.loads(path.read_text())
    mla.table("h200", path)
    lines = [ln for ln in capsys.readouterr().out.splitlines() if "mla_attention" in ln]
    assert len(lines) == len(rec["rows"]) == len(mla.SHAPES)
    assert all(ln.count(" exact |") == 2 for ln in lines)  # global reads and writes, each to the byte


def test_a_missing_record_is_one_line_not_a_traceback(mla, tmp_path, capsys):
    assert mla.main(["--device", "h200", "--out", str(tmp_path)]) == 2
    assert "no record" in capsys.readouterr().err
