"""calibration.forward.step (iosim/calibrate/forward_step.py) and what the fa3 and fa2 models do with it
(iosim/timing/fa3.py: fa3.measured; iosim/timing/fa2.py: measured_step): the measurement's arithmetic on a stand-in
clock, and the step taken only where the call runs the instantiation (and, for flash2, the residency) it was
measured on."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest
import yaml

from iosim import AttentionProblem, simulate
from iosim.calibrate import cudnn_step, forward_step, rates_kernels
from iosim.calibrate.rates_kernels import Measured
from iosim.hardware.gpu import PROFILES_DIR, get_profile, profile_from_dict
from iosim.launch.varlen import FLASH_PAGED_TILES, varlen_default_tiles
from iosim.schedules.flash2 import PAGE_TILES_HEAD_DIMS
from iosim.timing import load_kernel
from iosim.timing.fa2 import instantiation_step, residency

PAGED = ("paged16", "paged64")

STEP_S = {"bf16": {64: 0.5e-6, 128: 0.8e-6, 256: 1.0e-6}, "fp8": {64: 0.4e-6, 128: 0.9e-6, 256: 1.1e-6},
          "bf16-local": {64: 0.55e-6, 128: 0.85e-6, 256: 1.05e-6},
          "bf16-varlen": {64: 0.52e-6, 128: 0.83e-6, 256: 1.02e-6}}
FLASH2_S = 0.9e-6  # iosim-flash2, bf16: the stand-in's step of each of k blocks an SM is k times this
FLASH2_MASK_S = 0.3e-6  # and what its mask pass adds to a tile, k times this
# its packed-sequence instantiations' steps in the stand-in, relative to the dense one's
INSTANTIATION = {"": 1.0, "varlen": 1.05, "paged16": 1.15, "paged64": 1.1}


class _Bench:
    sms = 132
    hopper = True

    def fn(self, name):
        return lambda *a: None


class _CuPy:
    int64 = int
    cc = "90"

    @property
    def cuda(self):  # CuPy's cuda.Device().compute_capability
        cc = self.cc
        return type("cuda", (), {"Device": lambda: type("Device", (), {"compute_capability": cc})()})

    @staticmethod
    def get_default_memory_pool():
        return type("Pool", (), {"free_all_blocks": staticmethod(lambda: None)})()


@pytest.fixture
def stand_in(monkeypatch):
    """The part on a stand-in clock: a call takes a fixed part, a further Q tile's part and its steps."""
    fixed, tile_fixed = 12e-6, 4e-6  # the call's fixed part is what is left of `fixed` beyond one tile's
    monkeypatch.setattr(rates_kernels, "cupy_clock", lambda cp, spin: None)
    monkeypatch.setattr(forward_step, "REST_S", 0.0)
    monkeypatch.setattr(forward_step, "_call", lambda cp, heads, n, nk, d, kind="bf16", schedule="flash3", tiles=None:
                        (heads, n, nk, d, kind, schedule, tiles,
                         kind.partition("-")[2] if schedule == "flash2" else ""))  # flash2's instantiation
    monkeypatch.setattr(forward_step, "builtin_profile", lambda cp: get_profile("h100-sxm5-80gb"))

    def time_ms(call, reps, warmup, view, clock):
        heads, n, nk, d, kind, schedule, tiles, instantiation = call
        if schedule == "flash2":  # k blocks an SM, each a Q tile of Br queries at its tiles
            k, (bq, bkv) = heads // _Bench.sms, tiles
            assert heads % _Bench.sms == 0 and n == bq and nk % bkv == 0
            causal = instantiation.endswith("causal")  # bottom-right: the last ceil(Br / Bc) tiles take the mask
            masked = min(nk // bkv, -(-bq // bkv)) if causal else 0  # as mask_tiles calls it: nk >= Br
            step = FLASH2_S * INSTANTIATION[instantiation.removesuffix("causal").removesuffix("-")]
            return 1e3 * (fixed + nk // bkv * k * step + masked * k * FLASH2_MASK_S)
        tc = load_kernel("iosim-flash3").tiles_for(d, kind.split("-")[0])
        tiles = heads // _Bench.sms  # Q tiles an SM: 1, or 2 for the tile's fixed part
        assert heads in (_Bench.sms, 2 * _Bench.sms) and n == tc.block_q and nk % tc.block_kv == 0  # one kv head
        step = STEP_S[kind][d]
        return 1e3 * (fixed + (tiles - 1) * tile_fixed + tiles * nk // tc.block_kv * step)

    monkeypatch.setattr(rates_kernels, "time_ms", time_ms)
    return fixed, tile_fixed


def test_the_step_is_the_time_a_block_adds_per_kv_tile_between_the_two_lengths(stand_in):
    fixed, tile_fixed = stand_in
    got: list[Measured] = []
    forward_step.forward_part(_Bench(), _CuPy(), report=lambda m, note: got.append(m))
    flash3 = [m for m in got if m.path[2] == "iosim-flash3"]
    steps = {(m.path[3], m.path[4]): m.value for m in flash3 if m.path[1] == "step"}
    assert steps == pytest.approx({(t, d): v for t, table in STEP_S.items() for d, v in table.items()}, rel=1e-9)
    assert all(m.value == pytest.approx(tile_fixed, rel=1e-6) for m in flash3 if m.path[1] == "tile_fixed")
    assert all(m.value == pytest.approx(fixed - tile_fixed, rel=1e-6) for m in flash3 if m.path[1] == "call_fixed")
    # the Varlen instantiation's step alone: its tile and call parts, a long sequence's, are not kept
    assert len(flash3) == 3 * len(steps) - 2 * len(STEP_S["bf16-varlen"])
    assert not any(m.path[3] == "bf16-varlen" for m in flash3 if m.path[1] != "step")
    flash2 = {m.path[3:]: m.value for m in got if m.path[:3] == ("forward", "resident_step", "iosim-flash2")}
    want = {}  # every compiled tile at each head dim, k = 1 .. its residency on the H100 profile
    desc, prof = load_kernel("iosim-flash2"), get_profile("h100-sxm5-80gb")
    for d in desc.tiles:
        own = desc.tiles_for(d)
        for tc in (own, *(own.with_tiles(o.block_q, o.block_kv) for o in own.others)):
            for k in range(1, residency(tc, desc, d, 2, prof) + 1):
                want[(f"d{d}_{tc.block_q}x{tc.block_kv}", k)] = k * FLASH2_S
        # the varlen instantiation at the tiles packed calls run, the paged one at its tile, pages of 16 and (its
        # PageTiles instantiation, where it exists) 64
        paged = PAGED if d in PAGE_TILES_HEAD_DIMS else ("paged16",)
        for tiles, names in ((varlen_default_tiles(d, False), ("varlen",)), (FLASH_PAGED_TILES[d], paged)):
            tc = own.with_tiles(*tiles)
            for name in names:
                for k in range(1, residency(tc, desc, d, 2, prof) + 1):
                    want[(f"d{d}_{tiles[0]}x{tiles[1]}-{name}", k)] = k * FLASH2_S * INSTANTIATION[name]
    assert flash2 == pytest.approx(want, rel=1e-9) and ("d64_64x64", 3) in flash2
    assert ("d128_128x32-varlen", 2) in flash2 and ("d128_64x64-paged16", 1) in flash2
    # what the mask pass adds to a tile, at the dense and varlen instantiations' keys (not the paged one's)
    masked = {m.path[3:]: m.value for m in got if m.path[:3] == ("forward", "masked_step", "iosim-flash2")}
    assert masked == pytest.approx({key: key[1] * FLASH2_MASK_S for key in want if "-paged" not in key[0]}, rel=1e-9)


def test_before_hopper_only_the_flash2_step_is_measured(stand_in, capsys):
    class Ampere(_Bench):
        hopper = False

    got: list[Measured] = []
    forward_step.forward_part(Ampere(), _CuPy(), report=lambda m, note: got.append(m))
    assert {m.path[2] for m in got} == {"iosim-flash2"} and "flash3 skipped" in capsys.readouterr().out
    volta = _CuPy()
    volta.cc = "70"
    got.clear()
    forward_step.forward_part(Ampere(), volta, report=lambda m, note: got.append(m))
    assert not got and "flash2 skipped" in capsys.readouterr().out


def _profile(steps: dict | None):
    data = yaml.safe_load((PROFILES_DIR / "h100-sxm5-80gb.yaml").read_text())
    data["calibration"].pop("forward", None)
    if steps is not None:
        data["calibration"]["forward"] = {"step": {"iosim-flash3": {
            t: {"value": {d: f"{v * 1e6} us" for d, v in table.items()}, "source": "a test"}
            for t, table in steps.items()}}, "tile_fixed": None, "call_fixed": None}
    return profile_from_dict(data, "test")


def _run(p, profile, **kw):
    return simulate("flash3", p, profile, kernel="iosim-flash3", **kw)


@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
def test_the_model_takes_the_measured_step_for_the_instantiation_it_was_measured_on(dtype):
    p = AttentionProblem(batch=1, heads=8, seq_len=16384, head_dim=256, dtype=dtype)
    composed = _run(p, _profile(None)).time.kernels[0]
    slow = {t: {d: 10 * v for d, v in table.items()} for t, table in STEP_S.items()}
    measured = _run(p, _profile(STEP_S)).time.kernels[0]
    slower = _run(p, _profile(slow)).time.kernels[0]
    # 1024 Q tiles on 132 SMs, 256 steps each: the busiest SM runs 8 tiles, 2048 steps
    added = slower.resources["pipeline"] - measured.resources["pipeline"]
    assert added == pytest.approx(2048 * 9 * STEP_S[dtype][256], rel=1e-6)
    assert composed.resources["pipeline"] != pytest.approx(measured.resources["pipeline"])
    assert measured.bound == "step (measured)" and composed.bound != measured.bound


def test_other_tiles_keep_the_composed_step_and_a_window_takes_its_local_instantiations():
    p = AttentionProblem(batch=1, heads=8, seq_len=4096, head_dim=128, dtype="bf16")
    slow = {t: {d: 10 * v for d, v in table.items()} for t, table in STEP_S.items()}
    a = _run(p, _profile(None), block_q=128, block_kv=64).time.predicted_s
    b = _run(p, _profile(slow), block_q=128, block_kv=64).time.predicted_s
    assert a == pytest.approx(b)  # tiles it was not measured at: composed either way
    window = {"window": (256, 0)}
    composed = _run(p, _profile(None), **window).time.predicted_s
    local = _run(p, _profile(slow), **window).time.kernels[0]
    plain_only = {"bf16": slow["bf16"]}
    plain = _run(p, _profile(plain_only), **window).time.kernels[0]
    assert local.bound == plain.bound == "step (measured)" and local.predicted_s > composed
    # the Local instantiation's step where measured (5% longer in the stand-in), else the plain one's
    assert local.resources["pipeline"] > plain.resources["pipeline"]


def test_packed_sequences_take_their_varlen_instantiations_step():
    """flash3's packed sequences run its Varlen instantiation: its step where measured (3.75% longer in the
    stand-in at d = 128), else the plain one's; a window on them its Local one's."""
    p = AttentionProblem(batch=1, heads=8, seq_len=4096, head_dim=128, dtype="bf16")
    seqs = [(1024, 1024), (3072, 3072)]
    varlen = _run(p, _profile(STEP_S), seqlens=seqs).time.kernels[0]
    plain = _run(p, _profile({t: STEP_S[t] for t in ("bf16", "fp8")}), seqlens=seqs).time.kernels[0]
    assert varlen.bound == plain.bound == "step (measured)"
    assert varlen.resources["pipeline"] > plain.resources["pipeline"]
    slow_varlen = {**STEP_S, "bf16-varlen": {d: 10 * v for d, v in STEP_S["bf16-varlen"].items()}}
    window = {"seqlens": seqs, "window": (256, 0)}
    assert _run(p, _profile(slow_varlen), **window).time.predicted_s == pytest.approx(
        _run(p, _profile(STEP_S), **window).time.predicted_s)  # a window: the Local step, not the Varlen one


def test_a_tiles_and_a_calls_fixed_parts_replace_the_composed_ones_where_measured():
    """B = 1, 8 heads, N = 16384, d = 256 (1024 Q tiles, 8 on the busiest of 132 SMs): with tile_fixed measured each
    of its tiles costs that beyond its steps, and the call call_fixed beyond its tiles."""
    p = AttentionProblem(batch=1, heads=8, seq_len=16384, head_dim=256, dtype="fp8")
    data = yaml.safe_load((PROFILES_DIR / "h100-sxm5-80gb.yaml").read_text())

    def with_fixed(tile_us, call_us):
        table = lambda v: {"iosim-flash3": {"fp8": {"value": {256: f"{v} us"}, "source": "a test"}}}  # noqa: E731
        data["calibration"]["forward"] = {"step": table(1.0), "tile_fixed": table(tile_us),
                                          "call_fixed": table(call_us)}
        return _run(p, profile_from_dict(data, "test")).time.kernels[0].predicted_s

    a, b, c = with_fixed(2.0, 5.0), with_fixed(3.0, 5.0), with_fixed(2.0, 6.0)
    assert b - a == pytest.approx(8 * 1e-6, rel=1e-6)  # 8 tiles on the busiest SM, 1 us more each
    assert c - a == pytest.approx(1e-6, rel=1e-6)


def _flash2_profile(steps: dict | None):
    """The H100 profile with iosim-flash2's resident steps ``steps`` ({"d128_128x32": {k: seconds}}; None: none)."""
    data = yaml.safe_load((PROFILES_DIR / "h100-sxm5-80gb.yaml").read_text())
    data["calibration"]["forward"].pop("resident_step", None)
    if steps is not None:
        data["calibration"]["forward"]["resident_step"] = {"iosim-flash2": {
            key: {"value": {k: f"{v * 1e6} us" for k, v in t.items()}, "source": "a test"} for key, t in steps.items()}}
    return profile_from_dict(data, "test")


def _flash2(p, profile, **kw):
    return simulate("flash2", p, profile, kernel="iosim-flash2", **kw).time.kernels[0]


def test_the_fa2_model_takes_the_flash2_step_measured_at_the_calls_tiles_and_residency():
    """A grid under a wave (4 heads x 16 Q tiles: one block an SM) takes the step measured at k = 1; each block
    visits 64 K/V tiles of 32 keys, so a step 0.5 us longer is 32 us longer. A grid of two blocks an SM takes the
    k = 2 entry, other tiles theirs; a window, fp32 or a residency not measured keep the composed step."""
    small = AttentionProblem(batch=1, heads=4, seq_len=2048, head_dim=128, dtype="bf16")
    big = AttentionProblem(batch=4, heads=32, seq_len=2048, head_dim=128, dtype="bf16")  # 2048 blocks, 2 an SM
    composed = _flash2(small, _flash2_profile(None))
    prof = _flash2_profile({"d128_128x32": {1: 1.0e-6, 2: 1.7e-6}, "d128_64x64": {1: 1.2e-6}})
    measured = _flash2(small, prof)
    assert "step_composed" not in composed.resources and measured.resources["step"] == pytest.approx(1.0e-6)
    assert measured.bound == "step (measured)"
    slower = _flash2(small, _flash2_profile({"d128_128x32": {1: 1.5e-6}}))
    assert slower.resources["blocks"] - measured.resources["blocks"] == pytest.approx(64 * 0.5e-6, rel=1e-6)
    assert _flash2(big, prof).resources["step"] == pytest.approx(1.7e-6)
    assert _flash2(small, prof, block_q=64, block_kv=64).resources["step"] == pytest.approx(1.2e-6)
    assert _flash2(big, prof, block_q=64, block_kv=64).bound != "step (measured)"  # k = 2 not measured there
    assert _flash2(small, prof, window=(256, 0)).bound != "step (measured)"
    assert _flash2(small.model_copy(update={"dtype": "fp32"}), prof).bound != "step (measured)"


def test_packed_and_paged_calls_take_their_own_instantiations_step():
    """Packed sequences run flash_fwd.cu's varlen instantiation and take its step; keys in pages the paged one that
    runs: its PageTiles instantiation's step (measured on pages of 64) where the pages are a multiple of Bc at a head
    dim that has it, else its row lists' (measured on pages of 16); a window keeps the composed step; a profile
    without them keeps the composed step too."""
    desc = load_kernel("iosim-flash2")
    p = AttentionProblem(batch=1, heads=4, seq_len=2048, head_dim=128, dtype="bf16")
    tc = desc.tiles_for(128).with_tiles(64, 64)  # the paged instantiation's tile at d = 128
    prof = _flash2_profile({"d128_128x32": {1: 1.0e-6}, "d128_128x32-varlen": {1: 1.1e-6},
                            "d128_64x64-paged16": {1: 1.6e-6}, "d128_64x64-paged64": {1: 1.3e-6}})
    dense_tc = desc.tiles_for(128)
    assert instantiation_step(prof, desc, p, dense_tc, 1, None, False, None) == pytest.approx(1.0e-6)
    assert instantiation_step(prof, desc, p, dense_tc, 1, None, True, None) == pytest.approx(1.1e-6)
    paged = {page: instantiation_step(prof, desc, p, tc, 1, None, True, page) for page in (16, 32, 48, 64, 256, 320)}
    # Bc = 64: pages of 16, 32 and 48 cross tiles (row lists), 64, 256 and 320 hold whole tiles (PageTiles)
    assert paged == pytest.approx({16: 1.6e-6, 32: 1.6e-6, 48: 1.6e-6, 64: 1.3e-6, 256: 1.3e-6, 320: 1.3e-6})
    p256 = p.model_copy(update={"head_dim": 256})  # no PageTiles instantiation at d = 256: its row lists always
    prof256 = _flash2_profile({"d256_64x32-paged16": {1: 1.7e-6}})
    tc256 = desc.tiles_for(256).with_tiles(64, 32)
    assert instantiation_step(prof256, desc, p256, tc256, 1, None, True, 64) == pytest.approx(1.7e-6)
    assert instantiation_step(prof, desc, p, dense_tc, 1, (256, 0), True, None) is None
    assert instantiation_step(_flash2_profile({"d128_128x32": {1: 1.0e-6}}), desc, p, dense_tc, 1, None, True,
                              None) is None
    seqs = [(1024, 1024), (512, 2048)]
    batch = p.model_copy(update={"seq_len": 1536, "kv_len": 3072})  # the packed totals
    packed = _flash2(batch, prof, seqlens=seqs)
    assert packed.bound == "step (measured)" and packed.resources["step"] == pytest.approx(1.1e-6)
    in_pages = _flash2(batch, prof, seqlens=seqs, page_size=32, block_q=64, block_kv=64)
    assert in_pages.resources["step"] == pytest.approx(1.6e-6)


def test_the_tile_and_call_parts_are_taken_on_short_tiles(stand_in, monkeypatch):
    """What a Q tile costs beyond its steps shrinks as its steps grow (they hide part of it): on a stand-in whose
    tiles of the step's lengths hide three quarters of it, flash3's tile part is what a SHORT_TILES-tile Q tile
    pays, and its step and call parts are unchanged."""
    fixed, tile_fixed = stand_in
    inner = rates_kernels.time_ms

    def time_ms(call, reps, warmup, view, clock):
        heads, _, nk, d, kind, schedule, _, _ = call
        if schedule != "flash3" or nk < forward_step.TILES[0] * load_kernel("iosim-flash3").tiles_for(
                d, kind.split("-")[0]).block_kv:
            return inner(call, reps, warmup, view, clock)
        return inner(call, reps, warmup, view, clock) - 1e3 * 0.75 * tile_fixed * (heads // _Bench.sms)

    monkeypatch.setattr(rates_kernels, "time_ms", time_ms)
    assert forward_step.SHORT_TILES < forward_step.TILES[0]
    got: list[Measured] = []
    forward_step.forward_part(_Bench(), _CuPy(), report=lambda m, note: got.append(m))
    flash3 = {(m.path[1], m.path[3], m.path[4]): m.value for m in got if m.path[2] == "iosim-flash3"}
    for kind, table in STEP_S.items():
        for d, step in table.items():
            assert flash3["step", kind, d] == pytest.approx(step, rel=1e-9)
            if kind != "bf16-varlen":
                assert flash3["tile_fixed", kind, d] == pytest.approx(tile_fixed, rel=1e-6)
                assert flash3["call_fixed", kind, d] == pytest.approx(fixed - tile_fixed, rel=1e-6)


def test_cudnns_fp8_parts_come_from_its_own_calls_and_a_line_through_four_tile_counts(stand_in, monkeypatch):
    """cuDNN's fp8 forward (cudnn-frontend) timed as ours is, on its description's fp8 tiles; its tile part the slope
    of the calls at 1 to 4 Q tiles an SM. Without torch or cudnn-frontend the part is said and skipped."""
    fixed, tile_fixed = stand_in
    step = {64: 1.8e-6, 128: 2.1e-6, 256: 1.8e-6}
    desc = load_kernel("cudnn")
    calls = []

    def call(torch, cudnn, handle, heads, n, nk, d):
        tc = desc.tiles_for(d, "fp8")
        tiles = heads // _Bench.sms
        assert heads % _Bench.sms == 0 and n == tc.block_q and nk % tc.block_kv == 0
        calls.append(tiles)
        return ("cudnn", fixed + (tiles - 1) * tile_fixed + tiles * nk // tc.block_kv * step[d])

    monkeypatch.setattr(cudnn_step, "_cudnn_call", call)
    monkeypatch.setattr(cudnn_step.cudnn_fp8, "open_handle", lambda torch, cudnn: None, raising=False)
    monkeypatch.setitem(sys.modules, "cudnn", SimpleNamespace())
    monkeypatch.setitem(sys.modules, "torch", SimpleNamespace(cuda=SimpleNamespace(empty_cache=lambda: None)))
    monkeypatch.setattr(rates_kernels, "time_ms", lambda c, reps, warmup, view, clock: 1e3 * c[1])
    got: list[Measured] = []
    cudnn_step.cudnn_fp8_part(_Bench(), report=lambda m, note: got.append(m), seconds=forward_step.busy_timer(
        _Bench(), _CuPy(), 15, warmup=2))
    parts = {(m.path[1], m.path[4]): m.value for m in got}
    assert all(m.path[2:4] == ("cudnn", "fp8") for m in got) and set(calls) == {1, 2, 3, 4}
    assert {d: parts[("step", d)] for d in step} == pytest.approx(step, rel=1e-9)
    assert all(parts[("tile_fixed", d)] == pytest.approx(tile_fixed, rel=1e-6) for d in step)
    assert all(parts[("call_fixed", d)] == pytest.approx(fixed - tile_fixed, rel=1e-6) for d in step)


def test_without_cudnn_frontend_the_cudnn_part_is_said_and_skipped(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "cudnn", None)  # import cudnn raises ImportError
    got: list[Measured] = []
    cudnn_step.cudnn_fp8_part(_Bench(), report=lambda m, note: got.append(m), seconds=lambda call: 0.0)
    assert not got and "cuDNN fp8 skipped" in capsys.readouterr().out


def test_the_last_waves_blocks_take_the_step_of_the_blocks_left_on_their_sm():
    """1968 Q tiles at two blocks an SM (264 slots): 7 whole waves, then 120 blocks, one on each of 120 SMs, which
    run at the one-block step: a faster one shortens the grid. 2112 blocks (whole waves) end together whatever it
    is."""
    tail = AttentionProblem(batch=3, heads=41, seq_len=2048, head_dim=128, dtype="bf16")
    whole = AttentionProblem(batch=4, heads=33, seq_len=2048, head_dim=128, dtype="bf16")

    def blocks(p, alone):
        return _flash2(p, _flash2_profile({"d128_128x32": {1: alone, 2: 1.7e-6}})).resources["blocks"]

    assert blocks(tail, 0.5e-6) < blocks(tail, 1.0e-6) < blocks(tail, 1.7e-6)
    assert blocks(whole, 0.5e-6) == pytest.approx(blocks(whole, 1.7e-6), rel=1e-12)
