"""iosim.measure on a real GPU under Nsight Compute: the counters mean what docs/validation.md says they mean."""

from __future__ import annotations

import pytest

from iosim.measure import Config, MeasureError, find_ncu, measure

pytestmark = pytest.mark.gpu
MiB = 1 << 20


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    try:
        find_ncu()
    except MeasureError as exc:
        pytest.skip(f"GPU test: {exc}")
    import cupy as cp

    l2 = cp.cuda.runtime.getDeviceProperties(0)["l2CacheSize"]
    big = 1 << (2 * l2 - 1).bit_length()  # a power of two, at least twice L2: the second pass misses
    cfgs = [Config("copy", nbytes=64 * MiB), Config("l2probe", nbytes=big)]
    cfgs += [Config("l2write", nbytes=8 * MiB, read_bytes=16 * MiB, interleave=True)]
    cfgs += [
        Config("l2write", nbytes=8 * MiB, read_written=True),
        Config("l2write", nbytes=big, read_written=True),
    ]
    cfgs += [Config("l2reuse", nbytes=8 * MiB, read_bytes=8 * MiB, hot_reps=3)]
    cfgs += [Config("l2reuse", nbytes=8 * MiB, read_bytes=big, read_shared=True)]
    cfgs += [Config("l2probe", nbytes=big, blocks_per_sm=2, threads=128)]
    cfgs += [Config("l2reuse", nbytes=8 * MiB, read_group=4)]
    return measure(cfgs, timing=False, workdir=str(tmp_path_factory.mktemp("measure"))), big


def test_copy_moves_its_bytes_at_the_sm_boundary_and_reads_them_once_from_dram(run):
    r, _ = run
    m = r.configs[0]["measured"]
    n = 64 * MiB
    assert m["sass_global_ld_bytes"] + (m["sass_global_ldgsts_bytes"] or 0) == n
    assert m["sass_global_st_bytes"] == n
    assert n <= m["dram_read_bytes"] <= 1.01 * n  # cold L2: every byte once (plus a few lines)


def test_one_pass_dram_profile_sees_no_dirty_lines_that_are_not_the_kernels(run):
    """A kernel that only reads writes (almost) nothing to DRAM when DRAM is counted in a pass of its own; the
    replayed profile of the same kernel counts write-backs of lines the profiler's replay left dirty."""
    r, big = run
    m = r.configs[1]["measured"]
    assert 2 * big * 0.99 <= m["dram_read_bytes"] <= 2 * big * 1.01  # both passes miss: read twice
    assert m["dram_write_bytes"] < 0.5e6
    assert r.dram_command is not None and "dram__bytes_write.sum" in r.dram_command
    assert m["dram_write_bytes_replayed"] is not None


def test_interleaved_write_probe_moves_its_bytes_and_keeps_its_dirty_lines_when_they_fit(run):
    r, _ = run
    m = r.configs[2]["measured"]
    assert m["sass_global_st_bytes"] == 8 * MiB
    assert m["sass_global_ld_bytes"] + (m["sass_global_ldgsts_bytes"] or 0) == 16 * MiB
    assert 16 * MiB <= m["dram_read_bytes"] <= 1.01 * 16 * MiB
    assert m["dram_write_bytes"] < 0.5e6  # 24 MiB in all: every dirty line is still in L2 at the end


def test_read_back_probe_reads_what_it_wrote_from_l2_when_it_fits_and_from_dram_when_not(run):
    r, big = run
    small, large = r.configs[3]["measured"], r.configs[4]["measured"]
    for m, n in ((small, 8 * MiB), (large, big)):
        assert m["sass_global_st_bytes"] == n
        assert m["sass_global_ld_bytes"] + (m["sass_global_ldgsts_bytes"] or 0) == n
    assert small["dram_read_bytes"] < 0.5e6  # 8 MiB written, read back: every line still in L2
    assert small["dram_write_bytes"] < 0.5e6
    # twice L2 written, then read back from its start: the first lines are long gone (LRU order), and reading
    # them back pushes out the next ones: all of it comes from DRAM again, after all of it went there
    assert 0.97 * big <= large["dram_read_bytes"] <= 1.01 * big
    assert 0.97 * big <= large["dram_write_bytes"] <= 1.01 * big


def test_reuse_probe_reads_its_bytes_and_drops_the_first_buffer_only_past_l2(run):
    r, big = run
    fits, past = r.configs[5]["measured"], r.configs[6]["measured"]
    # 8 MiB read 3 + 1 times by one SM each, 8 MiB of other data once; 8 MiB by every SM twice, then `big`
    assert fits["sass_global_ld_bytes"] + (fits["sass_global_ldgsts_bytes"] or 0) == 4 * 8 * MiB + 8 * MiB
    sms = r.device["sm_count"]
    assert past["sass_global_ld_bytes"] + (past["sass_global_ldgsts_bytes"] or 0) == 2 * sms * 8 * MiB + big
    assert 16 * MiB <= fits["dram_read_bytes"] <= 1.01 * 16 * MiB  # 16 MiB in all: read again from L2
    # twice L2 of other data between the two reads of the first buffer: it is read from DRAM again
    assert 0.99 * (16 * MiB + big) <= past["dram_read_bytes"] <= 1.01 * (16 * MiB + big)
    assert fits["dram_write_bytes"] < 0.5e6 and past["dram_write_bytes"] < 0.5e6


def test_read_probe_in_another_grid_reads_its_buffer_twice_from_dram_past_l2(run):
    r, big = run
    m = r.configs[7]["measured"]
    assert m["sass_global_ld_bytes"] + (m["sass_global_ldgsts_bytes"] or 0) == 2 * big
    assert 2 * big * 0.99 <= m["dram_read_bytes"] <= 2 * big * 1.01


def test_reuse_probe_by_groups_reads_each_line_once_per_sm_of_its_group(run):
    r, _ = run
    m = r.configs[8]["measured"]
    assert m["sass_global_ld_bytes"] + (m["sass_global_ldgsts_bytes"] or 0) == 2 * 4 * 8 * MiB
    assert 8 * MiB <= m["dram_read_bytes"] <= 1.01 * 8 * MiB  # fits: from DRAM once
