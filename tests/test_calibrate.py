"""Calibration of the L2 model's probe-derived inputs (iosim.calibrate, iosim.l2.probes): the probe traces move
the probe's bytes, the model's room factors act on the probes as derived by hand, and the built-in H200 profile's
values are what the archived measurements give (data/validation/, the command its sources cite)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from iosim import l2
from iosim.calibrate import (
    CALIBRATION_PROBES,
    CalibrationError,
    ProbeCase,
    block_share,
    dirty_at_start,
    fit_room,
    median_block_share,
    probe_cases,
)
from iosim.cli import cli
from iosim.hardware.gpu import get_profile
from iosim.l2 import L2Inputs
from iosim.l2.probes import CHUNK, probe_trace, simulate_probe
from iosim.measure.records import merge_repeats, read_records

MiB = 1 << 20
C = 8 * MiB  # a small L2 for the hand-derived cases
PROF = "h100-sxm5-80gb"
DATA = Path(__file__).resolve().parents[1] / "data/validation"


def probe(w, r=0, room=(1.0, 1.0, 1.0), dirty_at_start=0, **kw):
    return simulate_probe(w, r, PROF, L2Inputs(C, room, dirty_at_start, 1.0), **kw)


@pytest.mark.parametrize("dirty_room", [1.0, 2.0, 2.125])
def test_dirty_lines_take_their_room(dirty_room):
    """Writing W > L2 bytes keeps C / dirty_room of them in L2 and writes the rest back (to a chunk)."""
    res = probe(16 * MiB, room=(1.0, 1.0, dirty_room))
    assert abs(res.write_bytes - (16 * MiB - C / dirty_room)) <= CHUNK
    assert res.read_bytes == 0


@pytest.mark.parametrize("size_mib,private_room,second_pass_hits", [(5, 1.5, True), (6, 1.5, False), (7, 1.0, True)])
def test_private_room_decides_whether_a_reread_hits(size_mib, private_room, second_pass_hits):
    """Reading B bytes twice (one SM per line): the second pass hits iff B x private_room fits in L2."""
    b = size_mib * MiB
    res = probe(0, b, reread=True, room=(private_room, 2.0, 1.0))
    assert res.read_bytes == (b if second_pass_hits else 2 * b)


@pytest.mark.parametrize("read_mib,evicted", [(3, False), (4, True)])
def test_lines_every_sm_reads_take_shared_room(read_mib, evicted):
    """1 MiB dirty, then R bytes read by every SM at shared room 2: the dirty bytes stay iff 1 + 2R <= 8 MiB."""
    res = probe(1 * MiB, read_mib * MiB, shared=True, room=(1.0, 2.0, 1.0))
    assert res.write_bytes == (1 * MiB if evicted else 0)
    assert probe(1 * MiB, read_mib * MiB, shared=False, room=(1.0, 2.0, 1.0)).write_bytes == 0


def test_dirty_lines_present_at_start_are_written_back_when_evicted():
    init = 100_000
    assert probe(0, 4 * MiB, dirty_at_start=init).write_bytes == 0
    big = probe(0, 16 * MiB, dirty_at_start=init)
    assert big.write_bytes == init
    assert big.kernels[0].write_by_tensor == {"foreign": init}


def test_probe_trace_moves_the_probe_bytes():
    kt, _ = probe_trace(3 * MiB, 5 * MiB, shared=True, sms=4)
    rows = kt.r1 - kt.r0
    assert (rows[kt.write] * 256).sum() == 3 * MiB
    assert (rows[~kt.write] * 256).sum() == 4 * 5 * MiB  # every one of the 4 SMs reads all of it


def test_interleaved_probe_reads_then_writes_in_each_step_until_both_are_done():
    kt, _ = probe_trace(8 * CHUNK, 16 * CHUNK, interleave=True, sms=4)
    b0 = slice(kt.ptr[0], kt.ptr[1])  # SM 0: chunks 0, 4, 8, 12 read; 0, 4 written right after their reads
    assert kt.write[b0].tolist() == [False, True, False, True, False, False]
    assert (kt.r0[b0] // (CHUNK // 256)).tolist() == [0, 0, 4, 4, 8, 12]
    # 8 MiB written beside 8 MiB read in an 8 MiB L2: a plain LRU keeps the last 4 MiB of each, so 4 MiB of the
    # writes go back; dirty lines at twice the room keep 8/3 MiB of each, so 16/3 MiB go back
    plain = probe(8 * MiB, 8 * MiB, interleave=True, sms=4)
    heavy = probe(8 * MiB, 8 * MiB, interleave=True, room=(1.0, 1.0, 2.0), sms=4)
    assert plain.write_bytes == pytest.approx(4 * MiB, rel=0.02)
    assert heavy.write_bytes == pytest.approx(16 / 3 * MiB, rel=0.02)
    assert plain.read_bytes == heavy.read_bytes == 8 * MiB
    assert set(kt.tensor.tolist()) == {l2.TENSOR_CODES["Q"], l2.TENSOR_CODES["O"]}


def _cases(truth_room, init=0):
    """Probes 'measured' on a model L2 of 8 MiB with room ``truth_room``: what the fit must recover."""
    shapes = [(0, r, False, True, False) for r in (4 * MiB, 6 * MiB, 12 * MiB)]
    shapes += [(w, 0, False, False, False) for w in (6 * MiB, 12 * MiB)]
    shapes += [(1 * MiB, r, True, False, False) for r in (3 * MiB, 4 * MiB)]
    out = []
    for w, r, shared, reread, inter in shapes:
        res = probe(w, r, room=truth_room, dirty_at_start=init, shared=shared, reread=reread, interleave=inter)
        out.append(ProbeCase(w, r, shared, reread, inter, res.read_bytes, res.write_bytes))
    return out


def test_fit_room_recovers_the_room_the_probes_were_made_with():
    truth = (1.5, 2.0, 1.5)
    cases = _cases(truth)
    grid = ((1.0, 1.5), (1.0, 2.0), (1.0, 1.5, 2.0))
    fit = fit_room(cases, PROF, capacity=C, grid=grid)
    assert fit.room == truth and fit.misfit == 0.0
    assert all(err > 0 for err, room in fit.tried if room != truth)


def test_dirty_at_start_is_the_mean_write_of_read_probes_past_l2():
    cases = [ProbeCase(0, 48 * MiB, False, True, False, 0, 100), ProbeCase(0, 64 * MiB, False, True, False, 0, 300),
             ProbeCase(0, 8 * MiB, False, True, False, 0, 9999), ProbeCase(8 * MiB, 0, False, False, False, 0, 5)]
    assert dirty_at_start(cases, 48 * MiB) == 200
    with pytest.raises(CalibrationError, match="l2probe"):
        dirty_at_start(cases[2:], 48 * MiB)
    with pytest.raises(CalibrationError, match="write probes"):
        fit_room(cases[:2], PROF)


def test_the_calibration_probe_list_is_the_one_the_h200_was_calibrated_on():
    archived = [m.run for data in read_records(DATA / "h200-probes.tar.xz").values() for m in merge_repeats(data)]
    assert sorted(map(repr, archived)) == sorted(map(repr, CALIBRATION_PROBES))


def test_the_h200_dirty_at_start_and_room_reproduce_the_archived_probes():
    """The profile's values are what the archived probes give: dirty_at_start exactly, and the room's misfit is
    the one its source states (the full grid search is `iosim calibrate l2`, about 4 minutes)."""
    measured = [m for data in read_records(DATA / "h200-probes.tar.xz").values() for m in merge_repeats(data)]
    cases = probe_cases(measured)
    prof = get_profile("h200-sxm-141gb")
    assert len(cases) == 43
    assert dirty_at_start(cases, 48 * MiB) == prof.l2_dirty_at_start()
    assert "iosim calibrate l2" in prof.l2.room.source and "data/validation" in prof.l2.room.source


def test_block_share_from_a_synthetic_first_wave():
    """Two blocks per SM: the older takes f of the SM, the younger 1 - f; f = 0.54 gives share 0.46 / 0.54."""
    sms, f, d0 = 4, 0.54, 1000.0  # the older block ends after d0, the younger after d1 = 3 d0 - d0 / f
    d1 = 3 * d0 - d0 / f
    start = np.zeros(2 * sms, dtype=np.int64)
    end = np.array([d0] * sms + [d1] * sms, dtype=np.int64)
    sm = np.array(list(range(sms)) * 2)
    assert block_share(start, end, sm) == pytest.approx((1 - f) / f, rel=1e-3)
    with pytest.raises(CalibrationError, match="two blocks per SM"):
        block_share(start[:sms], end[:sms], sm[:sms])


def test_the_h200_block_share_is_the_archived_timelines():
    res = CliRunner().invoke(cli, ["calibrate", "block-share", str(DATA / "h200-timelines.tar.xz")])
    assert res.exit_code == 0, res.output
    assert f"sm.block_share: {get_profile('h200-sxm-141gb').block_share():.3f}" in res.output
    with pytest.raises(CalibrationError):
        median_block_share([])


def test_calibrate_without_data_is_one_line():
    res = CliRunner().invoke(cli, ["calibrate", "l2"])
    assert res.exit_code != 0 and "RECORD" in res.output and "Traceback" not in res.output
