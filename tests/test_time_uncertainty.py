"""A prediction's uncertainty (issue 29 item 4): the band of measured ÷ predicted in its kernel's and regime's rows
of the time records (iosim.timing.uncertainty), carried by the estimate, its JSON and the CLI."""

from __future__ import annotations

import json

import pytest
from helpers import run_cli

from iosim import AttentionProblem, simulate
from iosim.result import ResultJSON
from iosim.timing import uncertainty

HEADER = "kernel,device,profile,batch,heads,kv_heads,seq_len,kv_len,head_dim,dtype,causal,block_q,block_kv," \
         "predicted_s,measured_s\n"


def _row(kernel: str, profile: str, seq_len: int, kv_len: int, causal: bool, ratio: float) -> str:
    return f"{kernel},GPU,{profile},1,1,1,{seq_len},{kv_len},64,bf16,{str(causal).lower()},,,1.0e-3,{ratio * 1e-3}\n"


@pytest.fixture
def fake_record(tmp_path):
    """Device p1: kernel k has 6 causal rows (ratios 0.9 .. 1.4) and 2 non-causal rows; device p2: 1 k row."""
    causal = [1.4, 0.9, 1.0, 1.1, 1.2, 1.3]  # unsorted: the quantile sorts
    (tmp_path / "p1-time.csv").write_text(HEADER + "".join(_row("k", "p1", 1024, 1024, True, x) for x in causal)
                                          + _row("k", "p1", 512, 512, False, 0.8)
                                          + _row("k", "p1", 512, 512, False, 2.0))
    (tmp_path / "p2-time.csv").write_text(HEADER + _row("k", "p2", 1, 4096, False, 3.0))
    return str(tmp_path)


def test_a_groups_band_is_the_10th_and_90th_percentile_by_hand(fake_record):
    # sorted causal ratios 0.9 1.0 1.1 1.2 1.3 1.4: position (6-1)*0.1 = 0.5 -> 0.95; (6-1)*0.9 = 4.5 -> 1.35
    u = uncertainty.band("k", "p1", AttentionProblem(seq_len=2048, head_dim=64, causal=True), 2.0, fake_record)
    assert u.low_s == pytest.approx(2.0 * 0.95) and u.high_s == pytest.approx(2.0 * 1.35)
    assert (u.group, u.rows, u.device) == ("k, causal", 6, "p1")


def test_a_thin_regime_falls_back_to_the_kernels_rows_and_an_unrecorded_profile_pools(fake_record):
    # non-causal on p1 has 2 rows (< MIN_ROWS): all 8 of p1's rows, sorted 0.8 0.9 ... 1.4 2.0
    u = uncertainty.band("k", "p1", AttentionProblem(seq_len=512, head_dim=64), 1.0, fake_record)
    allp1 = sorted([1.4, 0.9, 1.0, 1.1, 1.2, 1.3, 0.8, 2.0])
    assert (u.group, u.rows) == ("k, all regimes", 8)
    assert u.low_s == pytest.approx(allp1[0] + 0.7 * (allp1[1] - allp1[0]))  # position 7*0.1 = 0.7
    assert u.high_s == pytest.approx(allp1[6] + 0.3 * (allp1[7] - allp1[6]))  # position 7*0.9 = 6.3
    # a profile with no record of its own: both devices' rows pooled, and the band says so
    pooled = uncertainty.band("k", "other", AttentionProblem(seq_len=512, head_dim=64), 1.0, fake_record)
    assert (pooled.group, pooled.rows, pooled.device) == ("k, all regimes", 9, "pooled: p1, p2")
    # decode (one query row against 4,096 keys) is its own regime; on p2 it has 1 row: p2's kernel rows
    assert uncertainty.regime("k", 1, 4096, False) == "decode"
    assert uncertainty.regime("k-bwd", 1, 4096, False) == "non-causal"  # a backward is never decode
    assert uncertainty.regime("k", 1, 4096, False, packed=True) == "varlen"
    assert uncertainty.regime("k", 1, 4096, False, packed=True, paged=True) == "paged"  # chunked prefill on pages
    assert uncertainty.regime("k", 1, 4096, False, paged=True) == "decode"  # a paged decode is decode
    none = uncertainty.band("other-kernel", "p1", AttentionProblem(seq_len=512, head_dim=64), 1.0, fake_record)
    assert (none.low_s, none.high_s, none.group, none.rows) == (None, None, uncertainty.NO_RECORD, 0)


def test_a_recorded_kernel_carries_its_band_and_an_unrecorded_one_says_so():
    p = AttentionProblem(seq_len=4096, heads=16, head_dim=128, dtype="bf16", causal=True)
    r = simulate("flash2", p, "h100-sxm5-80gb", kernel="fa2")
    u = r.time.uncertainty
    assert (u.group, u.device) == ("fa2, causal", "h100-sxm5-80gb") and u.rows >= uncertainty.MIN_ROWS
    ratios = uncertainty.groups()[("h100-sxm5-80gb", "fa2", "causal")]
    assert u.low_s == pytest.approx(r.time.predicted_s * uncertainty.quantile(list(ratios), 0.1))
    assert u.low_s < u.high_s
    # fa3 (our flash3) has no time record yet; nor has the peak roofline (flash1)
    for sched in ("flash3", "flash1"):
        v = simulate(sched, p, "h100-sxm5-80gb").time.uncertainty
        assert (v.low_s, v.group) == (None, uncertainty.NO_RECORD)


def test_a_profile_on_datasheet_rates_gets_no_band():
    u = simulate("flash2", AttentionProblem(seq_len=4096, head_dim=128), "a100-sxm4-80gb").time.uncertainty
    assert (u.low_s, u.group) == (None, uncertainty.UNCALIBRATED)


def test_a_users_description_under_a_builtin_name_gets_no_band(tmp_path):
    from iosim.timing import load_kernel
    text = load_kernel("iosim-flash2").model_dump_json(by_alias=True)
    desc = json.loads(text)
    desc["warps"] = 8 if desc["warps"] != 8 else 4
    path = tmp_path / "iosim-flash2.yaml"
    path.write_text(json.dumps(desc))  # JSON is YAML
    r = simulate("flash2", AttentionProblem(seq_len=2048, head_dim=64), kernel=str(path))
    assert r.time.uncertainty.group == uncertainty.NO_RECORD


def test_the_json_carries_the_band_and_round_trips():
    r = simulate("naive", AttentionProblem(seq_len=1, kv_len=8192, batch=8, heads=32, head_dim=128, dtype="bf16"),
                 "h200-sxm-141gb")
    j = r.to_json()
    u = j["time"]["uncertainty"]
    assert u["group"] == "iosim-naive, decode" and u["device"] == "h200-sxm-141gb" and u["rows"] == 5
    assert ResultJSON.model_validate(j).to_json() == j
    assert json.loads(json.dumps(j)) == j
    old = json.loads(json.dumps(j))
    del old["time"]["uncertainty"]  # a result saved before the field still reads
    assert ResultJSON.model_validate(old).time.uncertainty is None


def test_the_cli_shows_the_band_in_the_predicted_time_line(capsys):
    code, out, _ = run_cli(["simulate", "flash2", "--seq-len", "4096", "--head-dim", "128", "--causal", "--kernel",
                            "fa2"], capsys)
    assert code == 0
    line = next(x for x in out.splitlines() if x.startswith("predicted time:"))
    assert "10th-90th percentile" in line and "fa2, causal" in line and "h100-sxm5-80gb record" in line
    _, out, _ = run_cli(["simulate", "flash1", "--seq-len", "4096", "--head-dim", "128"], capsys)
    assert "no band: no record" in next(x for x in out.splitlines() if x.startswith("predicted time:"))


def test_the_time_vs_n_figure_shades_each_recorded_kernels_band():
    from iosim import plots
    from iosim.scenario import run_scenario, scenario_from_dict
    recs = run_scenario(scenario_from_dict({
        "schema_version": 1, "name": "t", "title": "t", "schedules": ["flash1", "flash2"],
        "profiles": ["h100-sxm5-80gb", "a100-sxm4-80gb"],
        "problems": [{"seq_len": [1024, 4096], "head_dim": 64, "causal": True}]})).records
    fig = plots.time_vs_n(recs)
    names = [t.name for t in fig.data]
    # flash2 on the calibrated H100 has a record: its upper edge, then its lower edge filled up to it; flash1 (the
    # peak roofline) and the A100 (datasheet rates) have none
    bands = [n for n in names if ": band " in n]
    assert bands == ["h100-sxm5-80gb, flash2: band high", "h100-sxm5-80gb, flash2: band low"], names
    low = next(t for t in fig.data if t.name.endswith("band low"))
    line = next(t for t in fig.data if t.name == "h100-sxm5-80gb, flash2")
    h100 = [r for r in recs if r["schedule"] == "flash2" and r["profile"] == "h100-sxm5-80gb"]
    want = [uncertainty.band("iosim-flash2", "h100-sxm5-80gb", AttentionProblem(seq_len=r["seq_len"], head_dim=64,
                                                                                causal=True), r["predicted_s"])
            for r in h100]
    assert low.fill == "tonexty" and list(low.y) == pytest.approx([u.low_s for u in want])
    assert "band:" in line.text[0] and "iosim-flash2, causal" in line.text[0]
    assert "10th-90th percentile" in fig.layout.title.text
    # divided by a schedule's time, the figure is a ratio: no band
    assert not any(": band " in t.name for t in plots.time_vs_n(recs, relative_to="flash1").data)
