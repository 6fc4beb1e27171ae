"""The raw data of runs 13 and 14 (docs/validation/raw/) say what docs/validation.md says of them, read the way
benchmarks/fit_l2_inputs.py and benchmarks/validate_compare.py read them."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from helpers import load_benchmark

from iosim.l2.probes import simulate_probe

ROOT = Path(__file__).resolve().parents[1]
RAW = ROOT / "docs/validation/raw"
MiB = 1 << 20


@pytest.fixture(scope="module")
def scripts():
    sys.path.insert(0, str(ROOT / "benchmarks"))  # fit_l2_inputs imports validate_compare by name
    try:
        yield (
            load_benchmark("fit_l2_inputs"),
            load_benchmark("validate_compare"),
            load_benchmark("validate_sweep"),
        )
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))


def test_run13_lines_written_back_stay_in_l2_where_the_default_model_evicts_them(scripts):
    fit, _, _ = scripts
    cases = fit.probes(RAW / "run13")
    back = {w // MiB: m for w, _, _, _, _, read_written, m in cases if read_written}
    assert sorted(back) == [16, 24, 28, 30, 32, 34, 36, 38, 40, 44, 48]
    for mib in (32, 34, 36):
        m = back[mib]
        assert m["dram_write_bytes"] > 7e6  # written back ...
        assert m["dram_read_bytes"] < 2e6  # ... and read back from L2
        model = simulate_probe(mib * MiB, 0, "h200-sxm-141gb", read_written=True, dirty_limit=0)
        assert model.read_bytes > 8e6  # the default model evicted them
    # writes only, past L2: 28 MiB stay dirty whatever the size (the limit)
    kept = [
        w - m["dram_write_bytes"] for w, r, _, rr, _, rw, m in cases if not (r or rr or rw) and w >= 48 * MiB
    ]
    assert len(kept) == 3 and all(27.8 * MiB < k < 28.2 * MiB for k in kept)


def test_run14_is_the_ramp_part_measured_three_times(scripts):
    _, compare, sweep = scripts
    ramp = sweep.sweep("ramp")
    entries = compare.load(RAW / "run14")
    assert len(entries) == len(ramp) == 22
    assert {(e["config"]["seq_len"], e["config"]["heads"], e["config"]["kv_heads"]) for e in entries} == {
        (c.seq_len, c.heads, c.kv_heads) for c in ramp
    }
    assert all(len(e["repeats"]) == 3 and e["config"]["kind"] == "flash2" for e in entries)


def test_validate_compare_says_when_a_folder_has_no_sweep(scripts, tmp_path, monkeypatch):
    _, compare, _ = scripts
    monkeypatch.setattr(sys, "argv", ["validate_compare.py", str(tmp_path)])
    with pytest.raises(SystemExit, match="no measured sweep"):
        compare.main()
