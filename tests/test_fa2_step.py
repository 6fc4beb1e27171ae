"""calibration.forward.resident_step.fa2 and masked_step.fa2 (iosim/calibrate/fa2_step.py) and what the fa2 model
does with them (iosim/timing/fa2.py: masked, mask_step): the measurement's arithmetic on a stand-in clock, the
steps of FlashAttention-2's masking loop counted as its code runs them, and priced only where measured."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import numpy as np
import pytest
import yaml

from iosim import AttentionProblem, simulate
from iosim.blocks import cdiv
from iosim.calibrate import fa2_step, rates_kernels
from iosim.calibrate.rates_kernels import Measured
from iosim.hardware.gpu import PROFILES_DIR, get_profile, profile_from_dict
from iosim.timing import load_kernel
from iosim.timing.fa2 import masked, visits

STEP_S = {64: 1.4e-6, 128: 1.1e-6, 256: 1.3e-6}  # the stand-in's step of each of k blocks an SM is k times this
MASK_S = {64: 1.9e-6, 128: 0.9e-6, 256: 0.6e-6}  # and what a masked step adds, k times this
VARLEN = 1.1  # the varlen kernel's step and mask, relative to the dense one's
SPLIT_STEP_S = {64: 3.1e-6, 128: 2.6e-6, 256: 2.2e-6}  # the split-KV kernel's step at two blocks an SM
SPLIT_FIXED_S = 9e-6  # and what its call costs beyond its steps and the combine's reads


class _Bench:
    sms = 132

    def fn(self, name):
        return lambda *a: None


class _CuPy:
    @property
    def cuda(self):
        return SimpleNamespace(Device=lambda: SimpleNamespace(compute_capability="90"))


@pytest.fixture
def stand_in(monkeypatch):
    """Calls on a stand-in clock: a fixed part, k blocks an SM each stepping through its K/V tiles, the masking
    loop's steps dearer (a causal block's last ceil(Br / Bc), and one more, as the non-causal block's one, in the
    varlen kernel)."""
    desc = load_kernel("fa2")
    monkeypatch.setattr(rates_kernels, "cupy_clock", lambda cp, spin: None)
    monkeypatch.setattr(fa2_step, "REST_S", 0.0)
    monkeypatch.setattr(fa2_step, "builtin_profile", lambda cp: get_profile("h100-sxm5-80gb"))
    monkeypatch.setattr(fa2_step, "_call", lambda torch, heads, n, nk, d, causal, varlen:
                        (heads, n, nk, d, causal, varlen))
    monkeypatch.setitem(sys.modules, "torch", SimpleNamespace(cuda=SimpleNamespace(is_available=lambda: True,
                                                                                   empty_cache=lambda: None)))

    def time_ms(call, reps, warmup, view, clock):
        heads, n, nk, d, causal, varlen = call
        if heads == _Bench.sms // 2:  # the split-KV path: 4 splits of 64-row blocks, Bc the split kernel's
            assert n == desc.split_kv.block_q and not causal and not varlen
            bc = desc.split_kv.block_kv[d]
            partial = heads * n * 4 * (d + 1) * 4
            return 1e3 * (SPLIT_FIXED_S + partial / _l2() + nk // bc // 4 * SPLIT_STEP_S[d])
        tc = desc.tiles_for(d)
        k = heads // _Bench.sms
        assert heads % _Bench.sms == 0 and n == tc.block_q and nk % tc.block_kv == 0
        loop = min(nk // tc.block_kv, (cdiv(tc.block_q, tc.block_kv) if causal else 0) + varlen)  # as many as it has
        scale = VARLEN if varlen else 1.0
        return 1e3 * (15e-6 + k * scale * (nk // tc.block_kv * STEP_S[d] + loop * MASK_S[d]))

    monkeypatch.setattr(rates_kernels, "time_ms", time_ms)


def test_the_plain_step_and_what_a_masked_step_adds_at_every_residency(stand_in):
    got: list[Measured] = []
    fa2_step.fa2_part(_Bench(), _CuPy(), lambda m, note: got.append(m))
    parts = {m.path[1:]: m.value for m in got}
    desc = load_kernel("fa2")
    for d in desc.tiles:
        tc = desc.tiles_for(d)
        for suffix, scale in (("", 1.0), ("-varlen", VARLEN)):
            key = f"d{d}_{tc.block_q}x{tc.block_kv}{suffix}"
            steps = {k: v for (part, name, kk, k), v in parts.items() if part == "resident_step" and kk == key}
            assert steps and set(steps) == {k for (part, _, kk, k) in parts if part == "masked_step" and kk == key}
            for k, seconds in steps.items():
                assert seconds == pytest.approx(k * scale * STEP_S[d], rel=1e-9)
                assert parts[("masked_step", "fa2", key, k)] == pytest.approx(k * scale * MASK_S[d], rel=1e-9)


def _l2() -> float:
    from iosim.timing.rates import rates

    return rates(get_profile("h100-sxm5-80gb"), "bf16").l2


def test_the_split_kv_paths_step_and_fixed_part(stand_in):
    """Half an SM's count of 64-row Q blocks, which FlashAttention-2's heuristic cuts into 4 splits (two blocks an
    SM): the step from the calls at 8 and 32 tiles a split, the fixed part from the one at 2 less its steps and the
    combine's reads at L2's rate."""
    got: list[Measured] = []
    fa2_step.fa2_part(_Bench(), _CuPy(), lambda m, note: got.append(m))
    parts = {m.path[1:]: m.value for m in got}
    sk = load_kernel("fa2").split_kv
    for d, step in SPLIT_STEP_S.items():
        assert parts[("resident_step", "fa2", f"d{d}_64x{sk.block_kv[d]}-splitkv", 2)] == pytest.approx(step, rel=1e-9)
        assert parts[("call_fixed", "fa2", "bf16-splitkv", d)] == pytest.approx(SPLIT_FIXED_S, rel=1e-9)


def test_the_split_kv_model_takes_the_measured_parts_where_measured():
    """One head of 2048 queries, which FlashAttention-2 splits (32 Q blocks of 64 rows, 8 splits: 256 blocks, two an
    SM, one wave of 2 steps each): with the split kernel measured the call is its fixed part, the wave's steps and
    the combine's reads; without, the composed parts, as before."""
    p = AttentionProblem(batch=1, heads=1, seq_len=2048, head_dim=128, dtype="bf16")
    data = yaml.safe_load((PROFILES_DIR / "h100-sxm5-80gb.yaml").read_text())
    fwd = data["calibration"]["forward"]
    fwd.setdefault("resident_step", {})["fa2"] = {"d128_64x128-splitkv": {"value": {2: "2.5 us"}, "source": "test"}}
    fwd.setdefault("call_fixed", {})["fa2"] = {"bf16-splitkv": {"value": {128: "9 us"}, "source": "test"}}
    measured = simulate("flash2", p, profile_from_dict(data, "test"), kernel="fa2").time.kernels[0].resources
    partial = 2048 * 8 * 129 * 4
    assert measured["step"] == pytest.approx(2.5e-6) and measured["blocks"] == pytest.approx(2 * 2.5e-6)
    assert measured["combine"] == pytest.approx(partial / _l2(), rel=1e-9)
    assert measured["main"] == pytest.approx(2 * 2.5e-6 + 9e-6, rel=1e-9)
    composed = simulate("flash2", p, "h100-sxm5-80gb", kernel="fa2").time.kernels[0].resources
    assert composed["step"] != pytest.approx(2.5e-6) and composed["combine"] > partial / _l2()


def test_without_torch_the_part_is_said_and_skipped(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch raises ImportError
    got: list[Measured] = []
    fa2_step.fa2_part(_Bench(), _CuPy(), lambda m, note: got.append(m))
    assert not got and "fa2 skipped" in capsys.readouterr().out


@pytest.mark.parametrize(("n", "nk", "causal", "packed", "loop"), [
    (1024, 1024, True, False, 2),    # whole 128 x 64 tiles, causal: ceil(Br / Bc) = 2
    (1000, 1000, True, False, 3),    # not whole tiles: one more
    (1024, 1024, False, False, 0),   # non-causal, whole tiles: the mask compiles to nothing
    (1000, 1024, False, False, 1),   # non-causal, a ragged last Q tile: the last step masked
    (1024, 1024, False, True, 1),    # packed sequences are never whole tiles
    (1024, 1024, True, True, 3),
])
def test_masked_steps_are_the_last_ones_of_flashattention2s_masking_loop(n, nk, causal, packed, loop):
    tc = load_kernel("fa2").tiles_for(128)  # 128 x 64
    p = AttentionProblem(batch=1, heads=1, seq_len=n, kv_len=nk, head_dim=128, dtype="bf16", causal=causal)
    n_i = visits(p, tc.block_q, tc.block_kv)
    assert np.array_equal(masked(p, tc, n_i, packed), np.minimum(n_i, loop))


@pytest.mark.parametrize(("n", "nk", "causal", "want"), [
    (256, 256, True, [2, 2]),        # 128 x 64 tiles: each Q block's two diagonal tiles
    (128, 384, True, [2]),           # bottom-right: the block sees 384 keys, the last two tiles cross its rows
    (256, 256, False, [0, 0]),       # whole tiles: no mask pass
    (256, 250, False, [1, 1]),       # the ragged last tile
    (256, 250, True, [2, 3]),        # offset -6: the second block's row 128 sees keys to 122, so tiles 1-3
])
def test_iosim_flash2_masks_the_tiles_past_its_diagonal_or_its_keys(n, nk, causal, want):
    """kernels/flash_fwd.cu's need_mask: a visited tile holding a key past the keys' end or, causal, past the Q
    block's first row's last key."""
    tc = load_kernel("iosim-flash2").tiles_for(128).with_tiles(128, 64)
    p = AttentionProblem(batch=1, heads=1, seq_len=n, kv_len=nk, head_dim=128, dtype="bf16", causal=causal)
    got = masked(p, tc, visits(p, tc.block_q, tc.block_kv), False, "diagonal")
    assert got.tolist() == want


def _profile(mask: float | None):
    """The H100 profile with fa2's dense and varlen steps at d = 128 (1 and 2 blocks an SM), and what a masked step
    adds (None: not measured)."""
    data = yaml.safe_load((PROFILES_DIR / "h100-sxm5-80gb.yaml").read_text())
    fwd = data["calibration"]["forward"]
    table = lambda s: {"value": {1: f"{s * 1e6} us", 2: f"{2 * s * 1e6} us"}, "source": "a test"}  # noqa: E731
    fwd.setdefault("resident_step", {})["fa2"] = {"d128_128x64": table(2e-6), "d128_128x64-varlen": table(2.2e-6)}
    if mask is not None:
        fwd["masked_step"] = {"fa2": {"d128_128x64": table(mask), "d128_128x64-varlen": table(mask)}}
    return profile_from_dict(data, "test")


def _fa2(p, profile, **kw):
    return simulate("flash2", p, profile, kernel="fa2", block_q=128, block_kv=64, **kw).time.kernels[0]


def test_the_fa2_model_adds_the_measured_mask_to_its_masked_steps_only():
    """Seven heads of 2048 causal queries (112 blocks: one wave, one an SM, not split): the longest block visits 32
    K/V tiles, its last 2 masked, so a masked step 1 us dearer makes the grid 2 us longer; non-causal whole tiles, a
    window, or a profile without the measurement add nothing."""
    p = AttentionProblem(batch=1, heads=7, seq_len=2048, head_dim=128, dtype="bf16", causal=True)
    plain, dearer = _fa2(p, _profile(None)), _fa2(p, _profile(1e-6))
    assert plain.resources["step"] == dearer.resources["step"] == pytest.approx(2e-6)  # the measured one, k = 1
    assert "step_masked_extra" not in plain.resources
    assert dearer.resources["blocks"] - plain.resources["blocks"] == pytest.approx(2e-6, rel=1e-6)
    full = p.model_copy(update={"causal": False})
    assert _fa2(full, _profile(1e-6)).resources["blocks"] == pytest.approx(_fa2(full, _profile(None)).resources[
        "blocks"], rel=1e-12)
    window = _fa2(p, _profile(1e-6), window=(256, 0))
    assert "step_masked_extra" not in window.resources
    # packed: one sequence of 2048 causal queries, its blocks' last 3 steps masked (the varlen kernel's loop)
    packed = [_fa2(p, _profile(m), seqlens=[(2048, 2048)]).resources["blocks"] for m in (None, 1e-6)]
    assert packed[1] - packed[0] == pytest.approx(3e-6, rel=1e-6)
