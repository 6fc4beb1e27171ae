"""The clock a call runs at under the board's power limiter (iosim.timing.clock): the phases a run goes through,
the clock each holds, and which calls a prediction means."""

from __future__ import annotations

import json
import math

import pytest
from helpers import run_cli

from iosim import ScheduleError, simulate
from iosim.hardware import get_profile
from iosim.timing import clock, energy

H100 = "h100-sxm5-80gb"
HEAVY = dict(batch=1, heads=32, seq_len=32768, head_dim=128, causal=True, dtype="bf16")  # ~13 ms, ~1 kW at f0
LIGHT = dict(batch=8, heads=32, kv_heads=8, seq_len=1, kv_len=4096, head_dim=128, dtype="bf16")  # decode, DRAM


def heavy(run="record"):
    return simulate("flash3", HEAVY, H100, kernel="cudnn", warm=True, run=run)


def test_a_heavy_call_slows_down_as_the_run_goes_on():
    """Drawing more than the fast loop allows, the call runs at the start clock from rest, lower from engage on,
    lower still at the board's limit; the record's median call is past engage (about 13 ms a call)."""
    single, record, steady = heavy("single"), heavy("record"), heavy("steady")
    c = record.time.clock
    assert c.watts > get_profile(H100).calibration.power.limiter.watts.value[132]
    assert c.steady_hz < c.fast_hz < c.start_hz
    assert single.time.clock.shares == (1.0, 0.0, 0.0) and steady.time.clock.shares == (0.0, 0.0, 1.0)
    assert c.shares == (0.0, 1.0, 0.0)
    assert single.time.predicted_s < record.time.predicted_s < steady.time.predicted_s
    # a tensor-bound call's time scales with the clock
    assert record.time.predicted_s == pytest.approx(single.time.predicted_s * c.start_hz / c.fast_hz, rel=1e-9)


def test_the_held_clocks_draw_their_caps():
    """At the fast clock the call draws the all-SM burst's watts, at the steady clock the board's limit (the
    bisection's precision), and the energy a call takes there is that power times its time."""
    power = get_profile(H100).calibration.power
    for run, cap in (("record", power.limiter.watts.value[132]), ("steady", power.limit.value)):
        t = heavy(run).time
        assert t.energy_j / t.predicted_s == pytest.approx(cap, rel=1e-6)


def test_a_light_call_keeps_its_clock():
    """A decode step bound by DRAM draws far less than the cap: its clocks are the start clock and its time the
    same for every run."""
    times = {run: simulate("flash-decoding", LIGHT, H100, kernel="iosim-decode", run=run) for run in
             ("single", "record", "steady")}
    c = times["steady"].time.clock
    assert c.fast_hz == c.steady_hz == c.start_hz and c.settle_s is None
    assert len({r.time.predicted_s for r in times.values()}) == 1


def test_no_limiter_no_change():
    """A profile whose calibration has no limiter (older files) predicts as before: no clocks, any run the same."""
    prof = get_profile(H100)
    bare = prof.model_copy(update={"calibration": prof.calibration.model_copy(update={
        "power": prof.calibration.power.model_copy(update={"limiter": None})})})
    a = simulate("flash3", HEAVY, bare, kernel="cudnn", warm=True, run="single")
    b = simulate("flash3", HEAVY, bare, kernel="cudnn", warm=True, run="steady")
    assert a.time.clock is None and a.time.predicted_s == b.time.predicted_s


def test_fp8_gets_clocks_only_where_its_energy_was_measured():
    """fp8's tensor FLOPs are priced at the e4m3 wgmma burst's energy (power.wgmma_fp8); a calibration without it
    gives fp8 calls no clocks (the bf16 unit would price them twice over)."""
    prof = get_profile(H100)
    r = simulate("flash3", {**HEAVY, "dtype": "fp8"}, prof, kernel="iosim-flash3", warm=True)
    assert r.time.clock is not None and r.time.clock.watts > 0
    older = prof.model_copy(update={"calibration": prof.calibration.model_copy(update={
        "power": prof.calibration.power.model_copy(update={"wgmma_fp8": None})})})
    assert simulate("flash3", {**HEAVY, "dtype": "fp8"}, older, kernel="iosim-flash3", warm=True).time.clock is None


@pytest.mark.parametrize(("t_call", "expected"), [
    (1e-3, (1.0, 0.0, 0.0)),  # 22 calls end before engage (47 ms)
    (5e-3, (0.0, 1.0, 0.0)),  # calls 10-21 start after it: 12 of the 20 timed, the median among them
    (4e-3, (0.5, 0.5, 0.0)),  # calls 12-21 (48 ms on) after it: 10 of 20, the median between the two
])
def test_the_records_median_call(t_call, expected):
    ends = (0.047, 0.8, math.inf)
    assert clock.run_shares("record", (t_call, t_call * 1.1, t_call * 1.2), ends) == expected


def _with_bursts(engages_s: list[float] | None):
    """The H100 profile with its limiter's engage spread set (None: none, as older files)."""
    prof = get_profile(H100)
    lim = prof.calibration.power.limiter
    table = None if engages_s is None else {"value": {i: e for i, e in enumerate(engages_s, 1)}, "source": "test"}
    lim = lim.model_validate({**lim.model_dump(), "engage_bursts": table})
    power = prof.calibration.power.model_copy(update={"limiter": lim})
    return prof.model_copy(update={"calibration": prof.calibration.model_copy(update={"power": power})})


def test_a_record_straddling_engage_is_priced_over_the_bursts_spread():
    """The fast loop acts at a time that varies from burst to burst; the record's median call is priced as the
    average over the measured bursts, each as likely: all at one side gives that side's time, a split between
    sides the mix in proportion, and a profile without the spread its median alone (older files)."""
    start, fast = _with_bursts([1.0, 2.0]), _with_bursts([1e-4, 2e-4])  # every burst acts after / before the run
    t_start = simulate("flash3", HEAVY, start, kernel="cudnn", warm=True).time
    t_fast = simulate("flash3", HEAVY, fast, kernel="cudnn", warm=True).time
    assert t_start.clock.shares == (1.0, 0.0, 0.0) and t_fast.clock.shares == (0.0, 1.0, 0.0)
    mixed = simulate("flash3", HEAVY, _with_bursts([1e-4, 1.0, 2.0, 3.0]), kernel="cudnn", warm=True).time
    assert mixed.clock.shares == pytest.approx((0.75, 0.25, 0.0))
    assert mixed.predicted_s == pytest.approx(0.75 * t_start.predicted_s + 0.25 * t_fast.predicted_s, rel=1e-9)
    assert (simulate("flash3", HEAVY, _with_bursts(None), kernel="cudnn", warm=True).time.predicted_s
            == heavy().time.predicted_s)


def test_a_run_of_seconds_counts_its_calls():
    """A run of S seconds from rest: whole calls in each phase; its shares are shares of the calls."""
    ends, times = (0.05, 0.8, math.inf), (0.01, 0.011, 0.012)
    assert clock.run_shares(0.03, times, ends) == (1.0, 0.0, 0.0)
    s = clock.run_shares(2.0, times, ends)
    assert s == pytest.approx((5 / 174, 69 / 174, 100 / 174))  # 5 calls to 50 ms, 69 to 0.809 s, 100 to 2.009 s
    assert sum(s) == pytest.approx(1.0)


@pytest.mark.parametrize("bad", ["bogus", "-1", "0", "inf", -2.0, float("nan")])
def test_a_bad_run_is_refused(bad):
    with pytest.raises(ScheduleError, match="run"):
        simulate("flash3", HEAVY, H100, kernel="cudnn", run=bad)


def test_a_run_in_seconds_reads_as_seconds():
    assert clock.check_run("2s") == 2.0 and clock.check_run("0.5") == 0.5 and clock.check_run("steady") == "steady"


def test_units_are_priced_at_the_clock_only_where_measured():
    """mma.sync and wgmma bursts ran within the limiter's clocks: priced at the call's clock, 1 at their own;
    exp, fp32 and shared memory ran at 1.98 GHz, above them: as measured. The SM's energy per cycle grows with
    the clock."""
    power = get_profile(H100).calibration.power
    at = power.at["wgmma"].value
    assert energy.clock_factor(power, "wgmma", at) == pytest.approx(1.0)
    assert energy.clock_factor(power, "wgmma", 1.5e9) < 1.0 < energy.clock_factor(power, "wgmma", 1.75e9)
    assert energy.clock_factor(power, "exp", 1.5e9) == 1.0 == energy.clock_factor(power, "smem", 1.6e9)
    cycles = [energy.energy_per_cycle(power, f * 1e9) for f in (1.3, 1.5, 1.7, 1.8)]
    assert cycles == sorted(cycles)


def test_the_cli_prints_and_writes_the_clocks(capsys):
    args = ["simulate", "flash3", "--kernel", "cudnn", "--seq-len", "32768", "--heads", "32", "--head-dim", "128",
            "--causal", "--warm"]
    code, out, _ = run_cli([*args, "--run", "steady"], capsys)
    assert code == 0 and "clock under the power limiter" in out and "(steady): 100% at" in out
    code, out, _ = run_cli([*args, "--json", "--run", "2"], capsys)
    c = json.loads(out)["time"]["clock"]
    assert code == 0 and c["run"] == "2 s" and sum(c["shares"]) == pytest.approx(1.0)
    code, _, err = run_cli([*args, "--run", "forever"], capsys)
    assert code != 0 and "run 'forever'" in err
    code, out, _ = run_cli(["simulate", "flash2", "--seq-len", "1024", "--head-dim", "64"], capsys)
    assert code == 0 and "throughout (the call draws" in out  # a light call: one clock
