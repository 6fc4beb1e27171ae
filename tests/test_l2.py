"""The L2 model (iosim/l2/): trace = schedule counts, cold-cache compulsory traffic, LRU thrash, dirty lines left
at the end, and equality of the fast atom model with a plain line-level LRU over the exact trace."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from l2_reference import reference_lines

from iosim import l2
from iosim.hardware.gpu import get_profile
from iosim.launch import (
    NAIVE_REGISTERS,
    NAIVE_SOFTMAX_REGISTERS,
    launch_model,
    naive_softmax_chunks,
    resident_blocks,
)
from iosim.problem import AttentionProblem
from iosim.schedules import Tiles
from iosim.simulate import simulate

BIG = 1 << 40  # an L2 larger than anything touched


def _p(**kw):
    return AttentionProblem.make(**kw)


# -- the trace is the schedule ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "schedule,tiles",
    [("flash2", (64, 32)), ("naive", (64, 64)), ("naive", (None, None)), ("flash1", (32, 32))],
)
@pytest.mark.parametrize("causal", [False, True])
def test_trace_bytes_equal_schedule_global(schedule, tiles, causal):
    p = _p(batch=2, heads=4, kv_heads=2, seq_len=200, kv_len=176, head_dim=64, causal=causal)
    t = Tiles(*tiles)
    res = l2.simulate_l2(schedule, p, t, "h100-sxm5-80gb", l2.L2Inputs(capacity=BIG))
    counts = simulate(schedule, p, block_q=tiles[0], block_kv=tiles[1], method="walk").counts
    assert [k.global_read for k in res.kernels] == [k.global_read_bytes for k in counts.kernels]
    assert [k.global_write for k in res.kernels] == [k.global_write_bytes for k in counts.kernels]


# -- physics of the model -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("schedule,tiles", [("flash2", (64, 32)), ("naive", (64, 64))])
def test_cold_cache_compulsory_when_everything_fits(schedule, tiles):
    """Everything fits: each byte read is fetched once; written bytes stay dirty (not counted)."""
    p = _p(heads=4, seq_len=256, head_dim=64)
    res = l2.simulate_l2(schedule, p, Tiles(*tiles), "h100-sxm5-80gb")
    e = p.elem_bytes
    for k in res.kernels:
        assert k.dram_write == 0
        assert k.dirty_at_end == k.global_write  # every output still dirty at the end (ncu does not count it)
    if schedule == "flash2":
        k = res.kernels[0]
        assert k.dram_read == 3 * 4 * 256 * 64 * e  # Q, K, V once
        assert k.read_by_tensor == {"Q": 4 * 256 * 64 * e, "K": 4 * 256 * 64 * e, "V": 4 * 256 * 64 * e}
    else:
        qk, sm, pv = res.kernels
        assert qk.dram_read == 2 * 4 * 256 * 64 * e  # Q, K once though re-read Tc / Tr times
        assert sm.dram_read == 4 * 256 * 256 * e  # S once
        assert pv.dram_read == 4 * 256 * 256 * e + 4 * 256 * 64 * e  # P, V once


def test_lru_thrash_when_working_set_exceeds_l2():
    """One block at a time, K/V larger than L2: LRU keeps nothing of a sequential stream, every pass misses."""
    p = _p(seq_len=1024, head_dim=64)
    t = Tiles(128, 64)
    kv = 2 * 1024 * 64 * 2
    fits = l2.simulate_l2("flash2", p, t, "h100-sxm5-80gb", l2.L2Inputs(capacity=4 * kv, resident=1)).kernels[0]
    thrash = l2.simulate_l2("flash2", p, t, "h100-sxm5-80gb", l2.L2Inputs(capacity=kv // 2, resident=1)).kernels[0]
    Tr = 1024 // 128
    assert fits.read_by_tensor["K"] + fits.read_by_tensor["V"] == kv
    assert (
        thrash.read_by_tensor["K"] + thrash.read_by_tensor["V"] == Tr * kv
    )  # = the global (two-level) count


def test_dirty_lines_written_only_when_evicted():
    """Outputs larger than L2 are written back as they are evicted; at most an L2's worth stays dirty."""
    p = _p(heads=16, seq_len=2048, head_dim=64)
    cap = 1 << 20
    inputs = l2.L2Inputs(capacity=cap, dirty_at_start=0)  # no other kernel's dirty lines in L2
    k = l2.simulate_l2("flash2", p, Tiles(128, 64), "h100-sxm5-80gb", inputs).kernels[0]
    assert k.dram_write + k.dirty_at_end == k.global_write  # every written byte once, either way
    assert 0 < k.dirty_at_end <= cap
    assert k.dram_write >= k.global_write - cap


def test_concurrent_blocks_share_kv():
    """More resident blocks of one head stream K/V together: fewer DRAM reads under a small L2."""
    p = _p(seq_len=2048, head_dim=64)
    t = Tiles(128, 64)
    cap = 64 * 1024
    one = l2.simulate_l2("flash2", p, t, "h100-sxm5-80gb", l2.L2Inputs(capacity=cap, resident=1)).kernels[0].dram_read
    many = l2.simulate_l2("flash2", p, t, "h100-sxm5-80gb", l2.L2Inputs(capacity=cap, resident=16)).kernels[0].dram_read
    assert many < one / 4


def test_residency_from_profile():
    prof = get_profile("h200-sxm-141gb")
    r, lim = resident_blocks(prof, threads=128, smem=65536, registers=255)
    assert lim["registers"] == 2 and r == 2 * 132
    r, lim = resident_blocks(prof, threads=256, smem=8704, registers=32)
    assert lim["threads"] == 8 and r == 8 * 132


def test_gqa_heads_share_kv_in_l2():
    p = _p(heads=8, kv_heads=2, seq_len=512, head_dim=64)
    k = l2.simulate_l2("flash2", p, Tiles(128, 64), "h100-sxm5-80gb").kernels[0]
    assert k.read_by_tensor["K"] == 2 * 512 * 64 * 2  # each kv head fetched once for its 4 query heads


# -- the fast model against an exact line-level LRU ---------------------------------------------------------------


@given(
    schedule=st.sampled_from(["flash2", "naive"]),
    n=st.integers(1, 5).map(
        lambda k: 64 * k
    ),  # line-aligned rows of every tensor (S: 64 x 2 B, lse: 32 x 4 B)
    heads=st.sampled_from([1, 2, 4]),
    group=st.sampled_from([1, 2]),
    causal=st.booleans(),
    lines=st.integers(8, 600),
    resident=st.integers(1, 12),
)
@settings(max_examples=30, deadline=None)
def test_atom_lru_equals_line_lru_without_dedupe(schedule, n, heads, group, causal, lines, resident):
    kv_heads = max(1, heads // group)
    p = _p(heads=heads, kv_heads=kv_heads, seq_len=n, head_dim=64, causal=causal)
    t = Tiles(32, 32) if schedule == "flash2" else Tiles(32, 64)
    cap = lines * 128
    plain = l2.L2Inputs(capacity=cap, room=(1.0, 1.0, 1.0), dirty_at_start=0, block_share=1.0,  # as the reference
                        resident=resident)
    fast = l2.simulate_l2(schedule, p, t, "h100-sxm5-80gb", plain, walk=l2.WalkOptions(dedupe=False))
    ref = reference_lines(schedule, p, t, "h100-sxm5-80gb", capacity=cap, resident=resident)
    assert [(k.dram_read, k.dram_write, k.dirty_at_end) for k in fast.kernels] == ref


@pytest.mark.parametrize("cap_lines", [2000, 8000, 40000])
@pytest.mark.parametrize("causal", [False, True])
def test_dedupe_approximation_is_close(cap_lines, causal):
    """The one approximation (a tile read by several blocks in one round is touched once) stays within 2% when L2
    holds a few rounds' worth of tiles (here a round touches <= 24 x 4 KiB; on an H200, 264 x 8 KiB in 60 MiB).
    With an L2 smaller than one round it is not valid (the order inside a round then decides the misses)."""
    p = _p(heads=4, kv_heads=2, seq_len=1024, head_dim=64, causal=causal)
    t = Tiles(64, 32)
    exact = l2.simulate_l2(
        "flash2", p, t, "h100-sxm5-80gb", l2.L2Inputs(capacity=cap_lines * 128, resident=24),
        walk=l2.WalkOptions(dedupe=False)
    )
    fast = l2.simulate_l2(
        "flash2", p, t, "h100-sxm5-80gb", l2.L2Inputs(capacity=cap_lines * 128, resident=24),
        walk=l2.WalkOptions(dedupe=True)
    )
    e, f = exact.kernels[0], fast.kernels[0]
    assert abs(f.dram_read - e.dram_read) <= 0.02 * e.dram_read
    assert abs(f.dram_write - e.dram_write) <= 0.02 * max(e.dram_write, 1) + 4096


def test_the_l2_model_sets_hbm_and_keeps_global():
    r = simulate("flash2", _p(heads=8, seq_len=1024, head_dim=64), "h100-sxm5-80gb")
    r2 = simulate("flash2", _p(heads=8, seq_len=1024, head_dim=64), "h100-sxm5-80gb", l2=True)
    assert r2.traffic["global"] == r.traffic["global"]
    assert r2.traffic["hbm"]["read_bytes"] == 3 * 8 * 1024 * 64 * 2
    assert r2.traffic["hbm"]["write_bytes"] == 0
    assert r2.time.predicted_s > 0


def test_fa2_variant_reverses_kv_and_heads():
    lm = launch_model("flash2", _p(seq_len=256), Tiles(128, 64), variant="fa2")
    assert lm.kv_order == "reverse" and lm.head_order == "head_major"


@pytest.mark.parametrize(("kv_len", "chunks"), [(256, 1), (264, 2), (512, 2), (1000, 4), (1024, 4), (2048, 8),
                                                (16384, 8), (999, 4), (20000, 1)])
def test_naive_softmax_holds_a_row_in_the_fewest_chunks_per_thread(kv_len, chunks):
    """naive.cu instantiates its softmax for 1, 2, 4 or 8 16-byte chunks of a row per thread: the smallest that holds
    the row (rows that go through shared memory take 1), so short rows take fewer registers."""
    assert naive_softmax_chunks(kv_len) == chunks
    sm = launch_model("naive", _p(seq_len=64, kv_len=kv_len), Tiles(128, 128)).kernels[1]
    assert sm.registers == NAIVE_SOFTMAX_REGISTERS[chunks]


@pytest.mark.parametrize("d", [64, 128, 256])
def test_naive_pv_is_one_gpu_block_per_program_block(d):
    """naive.cu v2: one pv block computes 128 query rows x all of d through a ring of P (128 x 64) and V (64 x d)
    tiles, so P is read once (no split of d across blocks)."""
    pv = launch_model("naive", _p(seq_len=256, head_dim=d), Tiles(128, 128)).kernels[2]
    stages = 2 if d >= 256 else 3
    assert pv.smem == stages * (128 * 64 + 64 * d) * 2 and pv.registers == NAIVE_REGISTERS[d][1]
