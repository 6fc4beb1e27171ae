"""Exact byte counts: the seeds, the papers' line-by-line accounting, and closed form == tile walk."""

from __future__ import annotations

import itertools

import pytest
from helpers import problems_and_tiles, without_peak
from hypothesis import given
from hypothesis import strategies as st

from iosim import AttentionProblem, simulate
from iosim.blocks import cdiv
from iosim.problem import STAT_BYTES
from iosim.schedules import SCHEDULES, Tiles, fits, get_schedule
from iosim.simulate import closed, walk

# -- the seeds ------------------------------------------------------------------------------------------


def test_naive_one_head_moves_138_412_032_bytes_with_S_and_P_each_written_and_read_once():
    r = simulate("naive", AttentionProblem(seq_len=4096, head_dim=128, dtype="fp16"))
    g = r.traffic["global"]
    assert g["read_bytes"] + g["write_bytes"] == 138_412_032
    for t in ("S", "P"):
        assert r.counts.global_read[t] == 33_554_432
        assert r.counts.global_write[t] == 33_554_432
    assert dict(r.counts.global_read) == {"Q": 1_048_576, "K": 1_048_576, "V": 1_048_576,
                                          "S": 33_554_432, "P": 33_554_432}
    assert dict(r.counts.global_write) == {"S": 33_554_432, "P": 33_554_432, "O": 1_048_576}


def test_naive_32_heads_moves_4_43_GB_and_33x_the_compulsory_traffic():
    p = AttentionProblem(seq_len=4096, head_dim=128, heads=32)
    r = simulate("naive", p)
    total = r.traffic["global"]["read_bytes"] + r.traffic["global"]["write_bytes"]
    assert total == 4_429_185_024  # 4.43 GB
    compulsory = 4 * p.seq_len * p.head_dim * p.elem_bytes * p.heads  # Q, K, V read once, O written once
    assert compulsory == 134_217_728  # 134 MB
    assert total / compulsory == 1 + p.seq_len / p.head_dim == 33


def test_naive_counts_b_times_4Nd_plus_4N2_per_head():
    for N, d, dt in [(512, 64, "bf16"), (1000, 96, "fp32"), (77, 16, "fp16")]:
        p = AttentionProblem(seq_len=N, head_dim=d, dtype=dt, batch=2, heads=3)
        r = simulate("naive", p)
        b = p.elem_bytes
        assert r.counts.global_bytes == b * (4 * N * d + 4 * N * N) * 6


# -- FlashAttention-1, Algorithm 1, line by line ---------------------------------------------------


@pytest.mark.parametrize("N,d,Br,Bc,dt", [(4096, 128, 128, 192, "fp16"), (1024, 64, 64, 256, "bf16"),
                                          (2048, 64, 64, 64, "fp32"), (1000, 64, 96, 160, "fp16")])  # last: ragged
def test_flash1_matches_algorithm_1_line_by_line(N, d, Br, Bc, dt):
    p = AttentionProblem(seq_len=N, head_dim=d, dtype=dt)
    c = closed("flash1", p, Tiles(Br, Bc))
    b, s, Tc = p.elem_bytes, STAT_BYTES, cdiv(N, Bc)
    # line 6: K_j, V_j once; line 8: Q_i, O_i, l_i, m_i for every (i, j)
    assert c.global_read_bytes == 2 * N * d * b + Tc * (2 * N * d * b + 2 * N * s)
    # line 2: O, l, m initialized; lines 12-13: O_i, l_i, m_i written for every (i, j)
    assert c.global_write_bytes == (N * d * b + 2 * N * s) + Tc * (N * d * b + 2 * N * s)
    # HBM_FA1_fwd = 2Nd + Tc·N·(3d + 4) elements (+ Nd + 2N with the init), here in bytes
    assert c.global_bytes == b * (2 * N * d + 3 * Tc * N * d) + s * 4 * Tc * N + N * d * b + 2 * N * s
    assert dict(c.global_read) == {"K": N * d * b, "V": N * d * b, "Q": Tc * N * d * b, "O": Tc * N * d * b,
                                   "l": Tc * N * s, "m": Tc * N * s}


def test_flash1_default_tiles_follow_line_1_with_the_largest_M_that_fits():
    p = AttentionProblem(seq_len=4096, head_dim=128)
    r = simulate("flash1", p)
    M = r.tiles.sram_elements
    assert r.tiles.block_kv == cdiv(M, 4 * 128) and r.tiles.block_q == min(cdiv(M, 4 * 128), 128)
    # M is the shared memory per thread block in elements, or the largest smaller M whose tiles fit
    flash1 = get_schedule("flash1")
    assert M == r.sram_budget // 2 or not fits(flash1, p, Tiles(128, cdiv(M + 1, 512)), r.profile)
    assert fits(flash1, p, r.tiles, r.profile)


def test_tiles_that_do_not_fit_are_an_error_that_says_how_much_is_needed_and_how_much_there_is():
    from iosim import ScheduleError

    with pytest.raises(ScheduleError, match=r"need 262,144 B of shared memory .* has 232,448 B"):
        simulate("flash2", AttentionProblem(seq_len=4096, head_dim=256), block_q=256, block_kv=128)
    with pytest.raises(ScheduleError, match=r"need 396,288 B of registers"):
        simulate("flash2", AttentionProblem(seq_len=4096, head_dim=128), block_q=256, block_kv=256)


@pytest.mark.parametrize("N,Nk,Br,Bc", [(64, 64, 16, 16), (100, 37, 16, 8), (37, 100, 8, 16), (90, 20, 16, 16)])
def test_causal_flash1_reads_Q_O_l_m_once_per_tile_that_holds_a_visible_key(N, Nk, Br, Bc):
    p = AttentionProblem(seq_len=N, kv_len=Nk, head_dim=8, causal=True, dtype="fp16")
    c = closed("flash1", p, Tiles(Br, Bc))
    rows = sum(min(Br, N - i * Br) for (i, _) in _visible_blocks_brute_force(N, Nk, Br, Bc))
    assert c.global_read["Q"] == c.global_read["O"] == rows * 8 * 2
    assert c.global_read["l"] == c.global_read["m"] == rows * 4
    assert c.global_write["O"] == (N + rows) * 8 * 2  # line 2's initialization, then line 12 per visited tile
    assert c.global_read["K"] == Nk * 8 * 2  # line 6: once


# -- FlashAttention-2, Algorithm 1 -----------------------------------------------------------------


@pytest.mark.parametrize("N,Nk,d,Br,Bc", [(4096, 4096, 128, 128, 64), (1000, 777, 64, 128, 128),
                                          (17, 4097, 64, 64, 32)])
def test_flash2_matches_algorithm_1_line_by_line(N, Nk, d, Br, Bc):
    p = AttentionProblem(seq_len=N, kv_len=Nk, head_dim=d, dtype="bf16", heads=2)
    c = closed("flash2", p, Tiles(Br, Bc))
    b, Tr = 2, cdiv(N, Br)
    # line 4: Q_i once; line 7: K_j, V_j for every (i, j) -> Tr passes; lines 14-15: O once, L (fp32) once
    assert dict(c.global_read) == {"Q": 2 * N * d * b, "K": 2 * Tr * Nk * d * b, "V": 2 * Tr * Nk * d * b}
    assert dict(c.global_write) == {"O": 2 * N * d * b, "lse": 2 * N * 4}
    # HBM_FA2_fwd = 2Nd + 2Tr·Nd + N (N = Nk), in bytes with an fp32 L
    if N == Nk:
        assert c.global_bytes == 2 * (b * (2 * N * d + 2 * Tr * N * d) + 4 * N)


def _visible_blocks_brute_force(N, Nk, Br, Bc):
    """(i, j) pairs whose tile holds at least one (row, key) with key <= row + Nk - N, by enumeration."""
    pairs = set()
    for r, c in itertools.product(range(N), range(Nk)):
        if c <= r + Nk - N:
            pairs.add((r // Br, c // Bc))
    return pairs


@pytest.mark.parametrize("N,Nk,Br,Bc", [(64, 64, 16, 16), (100, 37, 16, 8), (37, 100, 8, 16), (50, 50, 16, 7),
                                        (90, 20, 16, 16)])
def test_causal_flash2_visits_exactly_the_tiles_that_hold_a_visible_key(N, Nk, Br, Bc):
    p = AttentionProblem(seq_len=N, kv_len=Nk, head_dim=8, causal=True, dtype="fp16")
    c = closed("flash2", p, Tiles(Br, Bc))
    pairs = _visible_blocks_brute_force(N, Nk, Br, Bc)
    key_rows = sum(min(Bc, Nk - j * Bc) for (_, j) in pairs)
    assert c.global_read["K"] == key_rows * 8 * 2
    assert c.flops["matmul"] == 4 * 8 * sum(min(Br, N - i * Br) * min(Bc, Nk - j * Bc) for i, j in pairs)


# -- closed form == walk, over drawn shapes -------------------------------------------------------------


@pytest.mark.parametrize("schedule", list(SCHEDULES))
@given(data=st.data())
def test_closed_form_equals_tile_walk(schedule, data):
    p, t = data.draw(problems_and_tiles(tiled=schedule != "naive" or data.draw(st.booleans())))
    w, c = walk(schedule, p, t), closed(schedule, p, t)
    assert without_peak(w) == without_peak(c)
    # the walk's peak is what the buffers really held; the closed form's is the allocation (an upper bound),
    # reached exactly when tiles divide the sequences and no tile is skipped
    for kw, kc in zip(w.kernels, c.kernels, strict=True):
        assert kw.sram_peak <= kc.sram_peak
        if (t.block_q and not p.causal and p.seq_len % t.block_q == 0 and p.kv_len % t.block_kv == 0):
            assert kw.sram_peak == kc.sram_peak


# -- invariants across schedules ------------------------------------------------------------------------


@given(problems_and_tiles())
def test_without_causal_every_schedule_executes_the_same_4_N_Nk_d_matmul_flops(pt):
    p, t = pt
    p = p.model_copy(update={"causal": False})
    flops = {s: closed(s, p, t if s != "naive" else Tiles(None, None)).flops["matmul"] for s in SCHEDULES}
    assert set(flops.values()) == {4 * p.seq_len * p.kv_len * p.head_dim * p.n_heads_total}


@given(problems_and_tiles(), st.integers(1, 8), st.integers(1, 8))
def test_with_square_tiles_that_divide_the_sequences_flash2_global_traffic_never_exceeds_flash1s(pt, tr, tc):
    # (with ragged tiles it can: a last Q block of one row still streams all of K and V)
    p, t = pt
    B = t.block_q
    p = p.model_copy(update={"seq_len": tr * B, "kv_len": tc * B})
    sq = Tiles(B, B)
    assert closed("flash2", p, sq).global_bytes <= closed("flash1", p, sq).global_bytes


@pytest.mark.parametrize("schedule", list(SCHEDULES))
@given(pt=problems_and_tiles())
def test_global_traffic_grows_with_sequence_length(schedule, pt):
    p, t = pt
    t = t if schedule != "naive" else Tiles(None, None)
    longer = p.model_copy(update={"seq_len": p.seq_len + 1, "kv_len": p.kv_len + 1})
    assert closed(schedule, longer, t).global_bytes > closed(schedule, p, t).global_bytes


@pytest.mark.parametrize("d", [64, 128])
def test_naive_traffic_quadruples_and_flash_traffic_per_pass_halves_with_bigger_tiles(d):
    # Theorem 2: naive is Θ(Nd + N²); doubling N multiplies it by ~4 once N >> d
    p1, p2 = AttentionProblem(seq_len=16384, head_dim=d), AttentionProblem(seq_len=32768, head_dim=d)
    ratio = closed("naive", p2, Tiles(None, None)).global_bytes / closed("naive", p1, Tiles(None, None)).global_bytes
    assert 3.9 < ratio < 4.0
    # flash1's repeated traffic (Q, O, l, m passes) is proportional to Tc: doubling Bc halves it
    p = AttentionProblem(seq_len=8192, head_dim=d)
    rep = {Bc: closed("flash1", p, Tiles(64, Bc)).global_bytes - closed("flash1", p, Tiles(64, 8192)).global_bytes
           for Bc in (64, 128, 256)}
    assert rep[64] > rep[128] > rep[256] > 0
    # flash2's K/V passes are proportional to Tr: doubling Br halves K and V traffic exactly
    kv = {Br: closed("flash2", p, Tiles(Br, 64)).global_read["K"] for Br in (64, 128, 256)}
    assert kv[64] == 2 * kv[128] == 4 * kv[256]


def test_causal_flash2_skips_about_half_the_tiles_at_long_sequences():
    p = AttentionProblem(seq_len=16384, head_dim=128)
    full = closed("flash2", p, Tiles(128, 128))
    causal = closed("flash2", p.model_copy(update={"causal": True}), Tiles(128, 128))
    Tr = 16384 // 128
    assert causal.flops["matmul"] * Tr * Tr == full.flops["matmul"] * Tr * (Tr + 1) // 2
