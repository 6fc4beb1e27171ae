"""calibration.forward.naive (iosim/calibrate/naive_step.py) and what the naive model does with it
(iosim/timing/naive.py): the measurement's arithmetic on a stand-in clock whose kernels take the model's own round
times, and the measured rounds taken only where the profile has them."""

from __future__ import annotations

import pytest

from iosim import AttentionProblem, simulate
from iosim.calibrate import naive_step, rates_kernels
from iosim.calibrate.rates_kernels import Measured
from iosim.hardware.gpu import get_profile
from iosim.launch import naive_row_pitch
from iosim.timing import naive

SMS = 132
TRUTH = {"qk": 5.0e-6, "qk_row": 4.0e-6, "qk_masked": 3.0e-6, "pv": 1.6e-6, "pv_row": 1.2e-6, "pv_block": 4.0e-6,
         "pv_block_row": 0.5e-6, "pv_masked": 1.0e-6}
FIXED = 7e-6  # a call's launch and start


def softmax_s_per_mb(kv_len: int) -> float:
    """The stand-in softmax's seconds a MB of S: slower at short rows, as the kernel's (a warp a row)."""
    return 1e-6 * (0.4 + 64 / kv_len)


class _Bench:
    sms = SMS

    def fn(self, name):
        return lambda *a: None


class _CuPy:
    @property
    def cuda(self):
        return type("cuda", (), {"Device": lambda: type("Device", (), {"compute_capability": "90"})()})

    @staticmethod
    def get_default_memory_pool():
        return type("Pool", (), {"free_all_blocks": staticmethod(lambda: None)})()


@pytest.fixture
def stand_in(monkeypatch):
    """Each kernel call takes FIXED plus its blocks' round times (the model's, at TRUTH) spread over k x SMs slots."""
    profile = get_profile("h100-sxm5-80gb")
    monkeypatch.setattr(rates_kernels, "cupy_clock", lambda cp, spin: None)
    monkeypatch.setattr(naive_step, "REST_S", 0.0)
    monkeypatch.setattr(naive_step, "builtin_profile", lambda cp: profile)
    monkeypatch.setattr(naive_step, "_kernel", lambda cp, kernel, heads, n, nk, d, causal=False:
                        (kernel, heads, n, nk, d, causal))

    def time_ms(call, reps, warmup, view, clock):
        kernel, heads, n, nk, d, causal = call
        if kernel == naive_step.SOFTMAX:  # S read, P written: seconds a MB of S at the row length
            return 1e3 * (FIXED + heads * n * naive_row_pitch(nk, 2) * 2 / 1e6 * softmax_s_per_mb(nk))
        k = naive.residency(profile, d, kernel)
        p = AttentionProblem(batch=1, heads=heads, kv_heads=1, seq_len=n, kv_len=nk, head_dim=d, causal=causal)
        total, _ = naive.measured_tile_seconds(p, TRUTH, kernel)
        assert heads % (k * SMS) == 0  # whole rounds only
        return 1e3 * (FIXED + total * heads / (k * SMS))

    monkeypatch.setattr(rates_kernels, "time_ms", time_ms)


def test_the_calibration_recovers_the_round_times_the_kernels_take(stand_in):
    got: list[Measured] = []
    naive_step.naive_part(_Bench(), _CuPy(), report=lambda m, note: got.append(m))
    parts = {(m.path[2], m.path[3]): m.value for m in got if m.path[2] != "softmax_mb"}
    assert {part for part, _ in parts} == set(TRUTH) == {*naive.MEASURED_PARTS, *naive.OPTIONAL_PARTS}
    assert {d for _, d in parts} == {32, 64, 128, 256}
    for (part, _), value in parts.items():
        assert value == pytest.approx(TRUTH[part], rel=1e-6), part
    softmax = {m.path[3]: m.value for m in got if m.path[2] == "softmax_mb"}
    assert softmax == pytest.approx({nk: softmax_s_per_mb(nk) for nk in naive_step.SOFTMAX_KEYS}, rel=1e-6)


def test_the_softmaxs_seconds_a_mb_are_linear_in_its_slots_over_the_row():
    """At a share f of its instantiation's slots filled, a row costs the seconds a MB of the full instantiation and
    the half-full one's, linear in 1/f: exact at both, between them in between, the longest full one past them."""
    profile = get_profile("h100-sxm5-80gb")
    table = profile.calibration.forward.naive["softmax_mb"].value
    p = AttentionProblem(batch=1, heads=1, seq_len=128, kv_len=1024, head_dim=64)
    at = lambda nk: naive.softmax_s_per_mb(profile, p.model_copy(update={"kv_len": nk}))  # noqa: E731
    assert at(1024) == table[1024] and at(520) == pytest.approx(table[520])
    assert min(table[520], table[1024]) <= at(777) <= max(table[520], table[1024])  # 97 of 128 chunks: f = 0.77
    slots, fill = naive.softmax_fill(777)
    x = (1 / fill - 1) / (1 / naive.softmax_fill(520)[1] - 1)
    assert slots == 1024 and at(777) == pytest.approx(table[1024] + x * (table[520] - table[1024]))
    assert at(65536) == table[65536]  # the shared-memory path: its own measurements, log2-linear between them
    assert min(table[32768], table[65536]) <= at(46341) <= max(table[32768], table[65536])


def test_a_heads_masked_units_are_those_naive_cu_skips():
    assert naive_step.masked_units(naive_step.QK, 1024) == (28, 64)  # 8 x 8 tiles: the 28 above the diagonal
    assert naive_step.masked_units(naive_step.PV, 1024) == (56, 128)  # row tile i multiplies its first 2 i + 2 steps
    tiles, _ = naive.measured_tile_seconds(
        AttentionProblem(batch=1, heads=1, seq_len=1024, kv_len=1024, head_dim=64, causal=True), TRUTH, 0)
    assert tiles == pytest.approx(36 * TRUTH["qk"] + 28 * TRUTH["qk_masked"])


def test_rows_between_one_and_a_tile_interpolate_and_a_partial_wave_takes_its_share():
    one = AttentionProblem(batch=1, heads=1, seq_len=1, kv_len=256, head_dim=128)
    half = one.model_copy(update={"seq_len": 64})
    assert naive.measured_tile_seconds(one, TRUTH, 0)[0] == pytest.approx(2 * TRUTH["qk_row"])
    mid = TRUTH["qk_row"] + 63 / 127 * (TRUTH["qk"] - TRUTH["qk_row"])
    assert naive.measured_tile_seconds(half, TRUTH, 0)[0] == pytest.approx(2 * mid)
    # 8 heads x 2 tiles = 16 blocks on 132 SMs at k = 2: one partial round, one block on the busiest SM: half a round
    p = AttentionProblem(batch=1, heads=8, seq_len=128, kv_len=256, head_dim=128)
    assert naive.measured_blocks_s(p, TRUTH, 0, SMS, 2)[0] == pytest.approx(TRUTH["qk"] / 2)
    p = p.model_copy(update={"heads": 264})  # 528 blocks: two whole rounds
    assert naive.measured_blocks_s(p, TRUTH, 0, SMS, 2)[0] == pytest.approx(2 * TRUTH["qk"])


def test_the_model_takes_the_measured_rounds_where_the_profile_has_them():
    p = AttentionProblem(batch=8, heads=32, kv_heads=8, seq_len=1, kv_len=4096, head_dim=128)
    measured = simulate("naive", p, "h100-sxm5-80gb", kernel="iosim-naive", l2=True, warm=True).time.kernels
    assert ["round" in k.resources for k in measured] == [True, False, True]  # the GEMMs' measured rounds
    composed = simulate("naive", p, "a100-sxm4-80gb", kernel="iosim-naive", l2=True, warm=True).time.kernels
    assert not any("round" in k.resources for k in composed)  # no calibration.forward.naive there
    assert naive.measured_parts(get_profile("a100-sxm4-80gb"), p) is None
