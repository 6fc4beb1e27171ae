"""iosim.measure on a real GPU under Nsight Compute: the counters mean what docs/validation.md says they mean, and
the calibration probes move the bytes they are meant to."""

from __future__ import annotations

import pytest

from iosim.measure import Attention, MeasureError, Options, ReadProbe, WriteProbe, find_ncu, measure

pytestmark = pytest.mark.gpu
MiB = 1 << 20


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    try:
        find_ncu()
        import cupy as cp

        l2 = cp.cuda.runtime.getDeviceProperties(0)["l2CacheSize"]
    except (MeasureError, ImportError, RuntimeError) as exc:
        pytest.skip(f"GPU test: {exc}")
    big = 1 << (2 * l2 - 1).bit_length()  # a power of two, at least twice L2: the second pass misses
    runs = [ReadProbe(big), ReadProbe(8 * MiB), WriteProbe(8 * MiB, 16 * MiB, interleave=True),
            WriteProbe(8 * MiB, 4 * MiB, shared=True), WriteProbe(2 * big), Attention("flash2", seq_len=1024, heads=8)]
    opts = Options(timing=False, workdir=str(tmp_path_factory.mktemp("measure")))
    return measure(runs, opts), big


def _loads(m):
    return m["sass_global_ld_bytes"] + (m["sass_global_ldgsts_bytes"] or 0)


def test_read_probe_reads_twice_and_past_l2_both_passes_come_from_dram(run):
    """A kernel that only reads writes (almost) nothing to DRAM when DRAM is counted in a pass of its own."""
    r, big = run
    m = r.entries[0]["measured"]
    assert _loads(m) == 2 * big and m["l2_read_bytes"] == 2 * big  # the SM-boundary counters are exact
    assert 2 * big * 0.99 <= m["dram_read_bytes"] <= 2 * big * 1.01
    assert m["dram_write_bytes"] < 0.5e6
    assert "dram__bytes_write.sum" in r.dram_command and m["dram_write_bytes_replayed"] is not None


def test_read_probe_that_fits_reads_dram_once(run):
    m = run[0].entries[1]["measured"]
    assert 8 * MiB <= m["dram_read_bytes"] <= 1.01 * 8 * MiB


def test_interleaved_write_probe_moves_its_bytes_and_keeps_its_dirty_lines_when_they_fit(run):
    m = run[0].entries[2]["measured"]
    assert m["sass_global_st_bytes"] == 8 * MiB and _loads(m) == 16 * MiB
    assert 16 * MiB <= m["dram_read_bytes"] <= 1.01 * 16 * MiB
    assert m["dram_write_bytes"] < 0.5e6  # 24 MiB in all: every dirty line is still in L2 at the end


def test_shared_write_probe_reads_every_line_from_every_sm(run):
    r, _ = run
    m = r.entries[3]["measured"]
    assert _loads(m) == r.device["sm_count"] * 4 * MiB and m["sass_global_st_bytes"] == 8 * MiB
    assert 4 * MiB <= m["dram_read_bytes"] <= 1.01 * 4 * MiB  # read from DRAM once, then from L2


def test_write_probe_past_l2_writes_back_what_l2_cannot_keep(run):
    r, big = run
    m = r.entries[4]["measured"]
    assert m["sass_global_st_bytes"] == 2 * big
    assert big <= m["dram_write_bytes"] < 2 * big  # some dirty lines are still in L2 at the end, not written


def test_flash2_is_found_by_its_marker_and_its_launch_recorded(run):
    e = run[0].entries[5]
    assert "error" not in e and len(e["kernels"]) == 1 and "flash_fwd_kernel" in e["kernels"][0]["kernel"]
    assert e["launch"]["tiles"]["block_q"] > 0 and e["measured"]["dram_read_bytes"] > 0
