"""The raw data of runs 13-19 (docs/validation/raw/) say what docs/validation.md says of them, read the way
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


def _read_again(compare, run: str, part: str) -> dict:
    """MB read from DRAM past the compulsory bytes, per probe (medians of the repeats)."""
    import json

    out = {}
    for e in compare.merge_repeats(json.loads((RAW / run / f"measured_{part}.json").read_text())["configs"]):
        c, m = e["config"], e["measured"]
        # (fields a run's probe kernel did not have yet take their defaults)
        key = (c["kind"], c["read_shared"], c.get("hot_reps", 1), c.get("read_group", 1))
        grid = (c.get("blocks_per_sm", 8), c.get("threads", 256))
        out[(*key, c["nbytes"] // MiB, c["read_bytes"] // MiB, c["spin_us"], *grid)] = (
            m["dram_read_bytes"] - c["nbytes"] - (c["read_bytes"] if c["kind"] == "l2reuse" else 0)
        ) / 1e6
    return out


def test_runs_15_and_16_lines_read_again_stay_longer_and_every_sm_lines_go_sooner(scripts):
    _, compare, _ = scripts
    r15 = _read_again(compare, "run15", "reuse")
    once = {r: r15[("l2reuse", False, 1, 1, 16, r, 0, 8, 256)] for r in (16, 20, 24, 28, 32)}
    four = {r: r15[("l2reuse", False, 4, 1, 16, r, 0, 8, 256)] for r in (16, 20, 24, 28, 32)}
    every = {r: r15[("l2reuse", True, 1, 1, 16, r, 0, 8, 256)] for r in (16, 20, 24, 28, 32)}
    assert all(four[r] < once[r] - 1.5 for r in (24, 28, 32))  # an LRU gives the same (test_l2_policy)
    assert all(every[r] > once[r] + 2 for r in (16, 20, 24))
    r16 = _read_again(compare, "run16", "reuse2")
    assert (
        r16[("l2reuse", False, 1, 1, 44, 0, 0, 8, 256)]
        > 1.4 * r16[("l2probe", False, 1, 1, 44, 0, 0, 8, 256)]
    )
    assert (
        r16[("l2reuse", False, 4, 1, 8, 32, 0, 8, 256)]
        < r16[("l2reuse", False, 1, 1, 8, 32, 0, 8, 256)] - 0.5
    )


def test_run17_the_read_probe_misses_sooner_with_fewer_threads_per_sm(scripts):
    _, compare, _ = scripts
    r17 = _read_again(compare, "run17", "geometry")

    def miss(size, bps, threads):
        return r17[("l2probe", False, 1, 1, size, 0, 0, bps, threads)] / (size * MiB / 1e6)

    for size in (40, 44, 48):
        assert miss(size, 1, 256) > miss(size, 8, 256) + 0.05
        assert miss(size, 2, 128) > miss(size, 8, 256) + 0.05
        assert abs(miss(size, 1, 1024) - miss(size, 8, 256)) < 0.05  # threads per SM, not blocks


def test_run18_idling_between_the_reads_changes_nothing(scripts):
    _, compare, _ = scripts
    r18 = _read_again(compare, "run18", "idle")
    for size in (16, 32, 40):
        by_idle = [r18[("l2reuse", False, 1, 1, size, 0, t, 8, 256)] for t in (0, 50, 200, 1000, 4000)]
        assert max(by_idle) - min(by_idle) < 1.0


def test_run19_lines_read_by_groups_spanning_both_partitions_go_sooner(scripts):
    _, compare, _ = scripts
    r19 = _read_again(compare, "run19", "group")
    g = {
        (n, r): r19[("l2reuse", False, 1, n, 16, r, 0, 8, 256)] for n in (1, 2, 33) for r in (16, 20, 24, 28)
    }
    assert all(abs(g[2, r] - g[1, r]) < 0.5 for r in (16, 20, 24, 28))  # a pair of blocks: one partition
    assert g[33, 20] > 4 * g[1, 20] and g[33, 16] > 2.0 > 0.2 > g[1, 16]
    # the measured placement (run 3) puts 3 of 11 groups of 12 and 3 of 4 groups of 33 across both partitions
    topo = compare.measured_topology(RAW)
    part = [topo.l2_partition[m] for m in topo.dispatch[1]]
    spans = {n: sum(len(set(part[i : i + n])) == 2 for i in range(0, 132, n)) for n in (2, 12, 33)}
    assert spans == {2: 0, 12: 3, 33: 3}


def test_validate_compare_says_when_a_folder_has_no_sweep(scripts, tmp_path, monkeypatch):
    _, compare, _ = scripts
    monkeypatch.setattr(sys, "argv", ["validate_compare.py", str(tmp_path)])
    with pytest.raises(SystemExit, match="no measured sweep"):
        compare.main()


def test_validate_compare_says_which_options_go_together(scripts, monkeypatch):
    _, compare, _ = scripts
    for args in (["--placement"], ["--soft-edge", "--grid-curve", str(RAW / "run17")]):
        monkeypatch.setattr(sys, "argv", ["validate_compare.py", str(RAW / "run14"), *args])
        with pytest.raises(SystemExit, match="goes with --soft-edge"):
            compare.main()
