"""calibration.decode.tile (iosim/calibrate/decode_tile.py) and what the decode time model does with it
(iosim/timing/flash_decode.py): the measurement's arithmetic on a stand-in clock, the profile field, the CLI's
--decode-only, and the split kernel's cap at a warp's chain; the combine kernel's rounds."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest
import yaml
from helpers import run_cli

from iosim import AttentionProblem, simulate
from iosim._resources import kernels_dir
from iosim.calibrate import decode_tile, rates_kernels
from iosim.calibrate.rates_kernels import Measured
from iosim.hardware.gpu import PROFILES_DIR, get_profile, load_profile_file, profile_from_dict
from iosim.launch import decode as geo
from iosim.timing.flash_decode import tile_chain_s
from iosim.timing.rates import rates

TILE_S = {"16bit": {"d64x1": 0.6e-6, "d64x2": 0.9e-6, "d128x1": 0.9e-6, "d128x2": 1.4e-6, "d256x1": 1.6e-6},
          "fp8": {"d64x1": 0.8e-6, "d64x2": 1.1e-6, "d128x1": 1.2e-6, "d128x2": 1.8e-6, "d256x1": 2.3e-6}}


class _Bench:
    sms = 132

    def fn(self, name):
        return lambda *a: None


def test_the_tile_is_the_time_a_warp_adds_per_tile_between_the_two_lengths(monkeypatch):
    """t(n) = fixed + tiles per warp (n / 64) x tile: the part reports the tile, whatever the fixed part, for every
    instantiation the library compiles, on both caches."""
    fixed, dram_fixed = 7e-6, 9e-6  # over DRAM (each sequence on pages of its own) the fixed part is longer
    monkeypatch.setattr(rates_kernels, "cupy_clock", lambda cp, spin: None)
    monkeypatch.setattr(decode_tile, "_call", lambda cp, gpu, batch, d, q_len, n, fp8, own_pages=False:
                        (d, q_len, n, fp8, batch, own_pages))
    monkeypatch.setattr(decode_tile, "_blocks_per_sm", lambda d, stripes, fp8: 1 if d == 256 else 2)
    expected = {(d, 1 if s == 1 else 4, fp8): TILE_S["fp8" if fp8 else "16bit"][f"d{d}x{s}"]
                for d, s in geo.DECODE_STRIPES for fp8 in (False, True)}

    def time_ms(call, reps, warmup, view, clock):  # two blocks an SM: each warp's tile 1.5x as long; over DRAM 1.2x
        d, q_len, n, fp8, batch, own = call
        tile = expected[(d, q_len, fp8)] * (1.5 if batch == 2 * _Bench.sms else 1.0) * (1.2 if own else 1.0)
        return 1e3 * ((dram_fixed if own else fixed) + n / 64 * tile)

    monkeypatch.setattr(rates_kernels, "time_ms", time_ms)
    got: list[Measured] = []
    decode_tile.decode_tile_part(_Bench(), cp=None, report=lambda m, note: got.append(m))
    tiles = [m for m in got if m.path[1] == "tile"]
    assert len(tiles) == 2 * (2 * len(geo.DECODE_STRIPES) - 1)  # d = 256: one block an SM only
    for m in tiles:
        _, _, cache, key, per_sm = m.path
        assert m.unit == "s" and m.value == pytest.approx(TILE_S[cache][key] * (1.5 if per_sm == 2 else 1), rel=1e-9)
    # the intercept of the calls over DRAM: what they spend beyond their tiles as calls run (their own slope)
    fixed_parts = [m for m in got if m.path[1] == "fixed_dram"]
    assert len(fixed_parts) == len(tiles) and all(m.value == pytest.approx(dram_fixed, rel=1e-6) for m in fixed_parts)
    alone = [m for m in got if m.path[1] == "fixed_alone"]  # a grid of a few blocks: its own slope and intercept
    assert len(alone) == 2 * len(geo.DECODE_STRIPES)
    assert all(m.value == pytest.approx(dram_fixed, rel=1e-6) for m in alone)


def test_a_combine_round_is_the_time_the_rounds_between_the_two_split_counts_add(monkeypatch):
    # the combine's part of a call is the whole call less its split kernel alone; the split kernel's own time (here
    # growing with the splits) drops out. The rounds come from one sequence, the fixed part from a full grid (one
    # sequence's combine costs less beyond its rounds: here 2 us, the full grid's 5 us)
    fixed, per = 5e-6, {64: 0.3e-6, 128: 0.45e-6, 256: 0.4e-6}
    split_s = {8: 7e-6, 128: 11e-6, 2: 9e-6}
    monkeypatch.setattr(rates_kernels, "cupy_clock", lambda cp, spin: None)
    monkeypatch.setattr(decode_tile, "_combine_calls",
                        lambda cp, d, splits, batch: (("whole", d, splits, batch), ("alone", d, splits, batch)))
    monkeypatch.setattr(decode_tile, "_blocks_per_sm", lambda d, stripes, fp8: 2)

    def seconds(call):
        kind, d, splits, batch = call
        assert batch == (1 if splits != decode_tile.FULL_SPLITS else 2 * 132 // decode_tile.FULL_SPLITS)
        combine = (fixed if batch > 1 else 2e-6) + -(-splits // geo.combine_unroll(d)) * per[d]
        return split_s[splits] + (combine if kind == "whole" else 0.0)

    monkeypatch.setattr(rates_kernels, "time_ms", lambda call, reps, warmup, view, clock: 1e3 * seconds(call))
    got: list[Measured] = []
    decode_tile.combine_round_part(_Bench(), cp=None, report=lambda m, note: got.append(m))
    rounds = {m.path[-1]: m.value for m in got if m.path[:2] == ("decode", "combine_round")}
    assert rounds == pytest.approx(per, rel=1e-9)
    # what the call costs beyond its rounds: the intercept, whatever the rounds a head dim's unroll makes
    assert {m.path[-1]: m.value for m in got if m.path[:2] == ("decode", "combine_fixed")} == pytest.approx(
        {64: fixed, 128: fixed, 256: fixed}, rel=1e-9)
    got.clear()  # a GPU whose shared memory holds no d = 256 block (an RTX 4090's 100 KB): that head dim is skipped
    monkeypatch.setattr(decode_tile, "_blocks_per_sm", lambda d, stripes, fp8: 0 if d == 256 else 2)
    decode_tile.combine_round_part(_Bench(), cp=None, report=lambda m, note: got.append(m))
    assert sorted({m.path[-1] for m in got}) == [64, 128]


def _profile_with_tiles(name: str = "h100-sxm5-80gb", fixed: bool = True, combine_fixed: str | None = None):
    data = yaml.safe_load((PROFILES_DIR / f"{name}.yaml").read_text())
    data["calibration"]["decode"] = {"tile": {c: {k: {"value": {1: f"{v * 1e6} us", 2: f"{1.5 * v * 1e6} us"},
                                                      "source": "test"} for k, v in t.items()}
                                              for c, t in TILE_S.items()},
                                     "combine_round": {"value": {64: "300 ns", 128: "450 ns", 256: "400 ns"},
                                                       "source": "test"},
                                     "fixed": {c: {k: {"value": {1: "9 us", 2: "10 us"}, "source": "test"} for k in t}
                                               for c, t in TILE_S.items()} if fixed else None}
    if combine_fixed is not None:
        data["calibration"]["decode"]["combine_fixed"] = {"value": {64: combine_fixed, 128: combine_fixed,
                                                                    256: combine_fixed}, "source": "test"}
    return profile_from_dict(data, "test")


def test_the_profile_carries_the_tiles_and_the_model_reads_them():
    p = _profile_with_tiles()
    assert tile_chain_s(p, 128, 2, fp8=False) == pytest.approx(1.4e-6)
    assert tile_chain_s(p, 256, 1, fp8=True) == pytest.approx(2.3e-6)
    assert tile_chain_s(p, 128, 2, fp8=False, per_sm=2) == pytest.approx(2.1e-6)  # the table's second entry
    assert tile_chain_s(p, 128, 2, fp8=False, per_sm=3) == pytest.approx(2.8e-6)  # on along the last two
    assert tile_chain_s(p, 128, 3, fp8=False) == 0.0  # no such instantiation: nothing charged
    assert tile_chain_s(_without_decode("h100-sxm5-80gb"), 128, 1, fp8=False) == 0.0


def _without_decode(name: str):
    """The built-in profile as a file calibrated before the decode section."""
    data = yaml.safe_load((PROFILES_DIR / f"{name}.yaml").read_text())
    data["calibration"].pop("decode", None)
    return profile_from_dict(data, "older")


def _split_s(profile, p: AttentionProblem, **kw) -> float:
    r = simulate("flash-decoding", p, profile, kernel="iosim-decode", warm=True, **kw)
    return r.time.kernels[0].predicted_s


def test_a_grid_under_a_wave_runs_at_its_warps_chain():
    """One sequence of one kv head: a few blocks, nothing shared. Each warp's tiles take ``decode.tile`` each, so
    the split kernel takes at least tiles per warp x tile, and more than the model without the field predicts."""
    p = AttentionProblem(batch=1, heads=8, kv_heads=1, seq_len=1, kv_len=4096, head_dim=128, dtype="bf16")
    with_tiles = _profile_with_tiles()
    r = simulate("flash-decoding", p, with_tiles, kernel="iosim-decode", warm=True, page_size=16)
    t = r.tiles
    tiles_per_warp = -(-t.chunk // (geo.DECODE_WARPS * geo.DECODE_TILE))
    split = r.time.kernels[0].predicted_s
    assert split >= tiles_per_warp * TILE_S["16bit"]["d128x1"]
    assert split > _split_s(_without_decode("h100-sxm5-80gb"), p, page_size=16) + 0.5 * tiles_per_warp * TILE_S[
        "16bit"]["d128x1"]


def test_a_dram_bound_grid_is_not_slowed_by_a_short_chain():
    """Batch 32 of 8192 keys: 256 blocks, each warp's chain far under its share of the DRAM stream; the tile
    changes nothing (within 1%)."""
    p = AttentionProblem(batch=32, heads=32, kv_heads=4, seq_len=1, kv_len=8192, head_dim=128, dtype="bf16")
    assert _split_s(_profile_with_tiles(fixed=False), p) == pytest.approx(
        _split_s(_without_decode("h100-sxm5-80gb"), p), rel=0.01)


def test_the_combine_merges_a_round_of_splits_per_l2_round_trip():
    """kCombineUnroll in kernels/flash_decode.cu is what the model's rounds use; 128 splits take 16 round trips
    at d = 128 (were 64, two splits at a time)."""
    src = (kernels_dir() / "flash_decode.cu").read_text()
    assert "constexpr int kCombineUnroll = V == 8 ? 4 : 8;" in src
    assert [geo.combine_unroll(d) for d in (64, 128, 256)] == [8, 8, 4]
    p = AttentionProblem(batch=1, heads=8, kv_heads=1, seq_len=1, kv_len=32768, head_dim=128, dtype="bf16")
    r = simulate("flash-decoding", p, "h100-sxm5-80gb", kernel="iosim-decode", warm=True, page_size=16, splits=128)
    assert r.tiles.splits == 128
    lat = get_profile("h100-sxm5-80gb").measured("latency.l2")
    bare = _without_decode("h100-sxm5-80gb")
    r = simulate("flash-decoding", p, bare, kernel="iosim-decode", warm=True, page_size=16, splits=128)
    assert r.time.kernels[1].resources["blocks"] == pytest.approx((2 + 16) * lat, rel=0.05)  # a round: one latency
    r = simulate("flash-decoding", p, _profile_with_tiles(), kernel="iosim-decode", warm=True, page_size=16,
                 splits=128)
    assert r.time.kernels[1].resources["blocks"] == pytest.approx(2 * lat + 16 * 450e-9, rel=0.05)  # the measured


def test_the_stand_in_command_writes_the_decode_section(monkeypatch, capsys, tmp_path):
    """--decode-only measures that part alone and keeps the base profile's other calibrated values."""
    from test_rates import _FakeCupy

    monkeypatch.setitem(sys.modules, "cupy", _FakeCupy(True))

    def part(b, cp, report):
        for cache, t in TILE_S.items():
            for key, v in t.items():
                report(Measured(("decode", "tile", cache, key, 1), v, "s", "stand-in"), "")

    import iosim.cli.calibrate as cli

    monkeypatch.setattr(cli, "decode_part", part)
    out = tmp_path / "h100.yaml"
    code, text, err = run_cli(["calibrate", "rates", "--decode-only", "-o", str(out)], capsys)
    assert code == 0, err
    p = load_profile_file(out)
    base = load_profile_file(PROFILES_DIR / "h100-sxm5-80gb.yaml")
    assert tile_chain_s(p, 64, 2, fp8=True) == pytest.approx(1.1e-6)
    assert p.measured("dram.read") == base.measured("dram.read")  # the other sections as they were
    assert "decode.tile.16bit.d128x1.1" in text
    code, _, err = run_cli(["calibrate", "rates", "--decode-only", "--power-only", "-o", str(out)], capsys)
    assert code != 0 and "give one" in err



def test_a_gpu_older_than_ampere_skips_the_section(capsys):
    turing = SimpleNamespace(cuda=SimpleNamespace(Device=lambda: SimpleNamespace(compute_capability="75")))
    got: list[Measured] = []
    decode_tile.decode_part(_Bench(), turing, report=lambda m, note: got.append(m))
    assert got == [] and "compute capability 8.0" in capsys.readouterr().out


def test_a_block_s_fixed_part_is_the_calibrated_intercept_less_the_launch_and_the_drain():
    """decode.fixed (9 us at one block an SM) is a call: the model takes the call's launch and its last stores'
    drain off it, and charges the rest to every block that holds keys (its first tiles from DRAM: the latency
    beyond L2's). A grid of 4 blocks then takes that much longer than without the field."""
    from iosim.timing.flash_decode import block_fixed_s
    from iosim.timing.rates import rates

    p = _profile_with_tiles()
    r = rates(p, "bf16")
    assert block_fixed_s(p, 128, 1, False, 1, r) == pytest.approx(9e-6 - r.first_launch_s() - r.l2_latency_s)
    assert block_fixed_s(p, 128, 1, False, 2, r) == pytest.approx(10e-6 - r.first_launch_s() - r.l2_latency_s)
    assert block_fixed_s(_without_decode("h100-sxm5-80gb"), 128, 1, False, 1, r) is None
    data = yaml.safe_load((PROFILES_DIR / "h100-sxm5-80gb.yaml").read_text())  # a grid of a few blocks: toward alone
    data["calibration"]["decode"] = p.calibration.decode.model_dump(mode="json") | {
        "fixed_alone": {"16bit": {"d128x1": {"value": "6 us", "source": "test"}}}}
    with_alone = profile_from_dict(data, "alone")
    assert block_fixed_s(with_alone, 128, 1, False, 1, r, fill=0.5) == pytest.approx(
        7.5e-6 - r.first_launch_s() - r.l2_latency_s)
    assert block_fixed_s(with_alone, 128, 1, False, 1, r, fill=1.0) == pytest.approx(
        9e-6 - r.first_launch_s() - r.l2_latency_s)
    prob = AttentionProblem(batch=1, heads=8, kv_heads=1, seq_len=1, kv_len=1024, head_dim=128, dtype="bf16")
    no_fixed = _profile_with_tiles(fixed=False)
    gain = _split_s(p, prob, page_size=16) - _split_s(no_fixed, prob, page_size=16)
    own = r.block_s + r.l2_latency_s + r.dram_latency_s  # the composed part the measurement replaces (and the merge)
    assert 9e-6 - r.first_launch_s() - r.l2_latency_s - own - 1e-6 < gain < 9e-6 - r.first_launch_s()


def test_a_fixed_part_measured_over_dram_is_taken_as_it_is_where_the_call_reads_dram():
    """decode.fixed_dram (the intercept with the cache in DRAM, as calls run) replaces decode.fixed where a profile
    has both. Measured over DRAM it already holds the first tiles' DRAM latency: a call whose cache is in DRAM gets
    no more added; one whose cache stays in L2 between warm calls waits the latency beyond L2's less. Measured in L2
    (decode.fixed alone, files before 2026-11-29) that latency is added instead."""
    from iosim.timing.flash_decode import block_fixed_s
    from iosim.timing.rates import rates

    def with_dram(value: str):
        base = _profile_with_tiles()
        data = yaml.safe_load((PROFILES_DIR / "h100-sxm5-80gb.yaml").read_text())
        data["calibration"]["decode"] = base.calibration.decode.model_dump(mode="json") | {
            "fixed_dram": {c: {k: {"value": {1: value, 2: value}, "source": "test"} for k in t}
                           for c, t in TILE_S.items()}}
        return profile_from_dict(data, "dram")

    p = with_dram("12 us")
    r = rates(p, "bf16")
    assert block_fixed_s(p, 128, 1, False, 1, r) == pytest.approx(12e-6 - r.first_launch_s() - r.l2_latency_s)
    big = AttentionProblem(batch=1, heads=8, kv_heads=1, seq_len=1, kv_len=1 << 20, head_dim=128, dtype="bf16")
    small = AttentionProblem(batch=1, heads=8, kv_heads=1, seq_len=1, kv_len=1024, head_dim=128, dtype="bf16")
    kw = dict(page_size=16, splits=4)
    # a cache past L2 (256 MB): the measured part as it is; 3 us more measured, 3 us more predicted
    assert _split_s(with_dram("15 us"), big, **kw) - _split_s(p, big, **kw) == pytest.approx(3e-6, rel=1e-6)
    # in DRAM the L2-measured field adds the latency beyond L2's, the DRAM-measured one nothing
    l2_measured = _profile_with_tiles()  # decode.fixed = 9 us
    dram_9 = with_dram("9 us")
    gap = r.dram_latency_s - r.l2_latency_s
    assert _split_s(l2_measured, big, **kw) - _split_s(dram_9, big, **kw) == pytest.approx(gap, rel=1e-6)
    # a warm call whose cache stays in L2: the DRAM-measured part less that latency, the L2-measured as it is
    assert _split_s(l2_measured, small, **kw) - _split_s(dram_9, small, **kw) == pytest.approx(gap, rel=1e-6)


def test_the_combine_takes_its_measured_part_beyond_its_rounds():
    """decode.combine_fixed where measured: the calibration's own shape (one sequence of 8 query heads, 2 blocks)
    costs that part plus its rounds, as timed; without it the part is composed from the launch and L2 latency."""
    p = AttentionProblem(batch=1, heads=8, kv_heads=1, seq_len=1, kv_len=32768, head_dim=128, dtype="bf16")
    kw = dict(kernel="iosim-decode", warm=True, page_size=16, splits=128)
    r = simulate("flash-decoding", p, _profile_with_tiles(combine_fixed="5 us"), **kw)
    combine = r.time.kernels[1]
    assert combine.predicted_s == pytest.approx(5e-6 + 16 * 450e-9, rel=1e-6)  # 16 rounds of 8 splits
    bare = simulate("flash-decoding", p, _profile_with_tiles(), **kw).time.kernels[1]
    rt = rates(get_profile("h100-sxm5-80gb"), "bf16")
    assert bare.resources["launch"] == pytest.approx(rt.next_launch_s() + rt.l2_latency_s, rel=1e-9)
