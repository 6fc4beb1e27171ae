"""The packed-sequences (varlen) part of the time record without a GPU (benchmarks/time_record_varlen.py,
time_judge.py): its batches, each row predicted by the fa2 model on the varlen grid (not the roofline), the judge
keeping packed rows a group of their own, the bands giving them their own regime; and the two models of packed
sequences, the launch order's block times and the DRAM bytes of the varlen grid walked as one program, against the
dense problem where the two must agree."""

from __future__ import annotations

import pytest
from helpers import composed_flash2_profile, load_benchmark
from hypothesis import given, settings
from hypothesis import strategies as st

from iosim import AttentionProblem, simulate
from iosim.hardware.gpu import get_profile
from iosim.l2 import simulate_l2
from iosim.l2.packed import packed_dram
from iosim.schedules import Tiles
from iosim.schedules.flash2 import Flash2Tiles
from iosim.timing import fa2, load_kernel, uncertainty
from iosim.timing.kernels import TileConfig
from iosim.timing.rates import rates
from iosim.validation import seqlens_text

H100 = "h100-sxm5-80gb"


COMPOSED = composed_flash2_profile(H100)  # one step for the dense and the packed instantiations


@pytest.fixture(scope="module")
def tv():
    return load_benchmark("time_record_varlen")


@pytest.fixture(scope="module")
def judge(tv):
    return load_benchmark("time_judge")


def test_the_sweep_takes_skewed_short_cross_grouped_and_windowed_batches(tv):
    shapes = tv.sweep()
    assert len({s.key for s in shapes}) == len(shapes)
    assert {s.head_dim for s in shapes} == {64, 128, 256} and {s.causal for s in shapes} == {False, True}
    assert any(s.heads != s.kv_heads for s in shapes) and any(s.window for s in shapes)
    assert any(q != k for s in shapes for q, k in s.seqlens)  # cross-attention pairs, chunks against a cache
    assert max(len(s.seqlens) for s in shapes) >= 128 and any(len({q for q, _ in s.seqlens}) > 4 for s in shapes)
    assert tv.sweep()[1].seqlens == tv.sweep()[1].seqlens  # the drawn lengths are the same every run


def test_each_row_is_predicted_by_the_fa2_model_on_its_sequences(tv, judge):
    for s in tv.sweep():
        row = tv.row_of(s)
        assert judge.group(row) == "iosim-flash2 varlen"
        r = judge.simulate_row(row, H100)
        assert r.time.kernel == "iosim-flash2" and r.tiles.seqlens == s.seqlens
        assert (r.tiles.block_q, r.tiles.block_kv) == tv.tiles_of(s)
        assert r.hbm_model.startswith("l2-lru over the varlen grid")
        assert r.time.uncertainty.group.split(", ")[1] in ("varlen", uncertainty.ALL)  # its regime, or too few rows


def test_flash3_rows_are_predicted_by_the_fa3_model_on_their_sequences(tv, judge):
    for s in tv.sweep():
        row = tv.row_of(s, tv.FLASH3)
        assert judge.group(row) == "iosim-flash3 varlen"
        r = judge.simulate_row(row, H100)
        assert r.time.kernel == "iosim-flash3" and r.schedule == "flash3" and r.tiles.seqlens == s.seqlens
        assert (r.tiles.block_q, r.tiles.block_kv) == tv.tiles_of(s, tv.FLASH3) == (128, 64 if s.head_dim == 256 else 128)


@given(n=st.integers(1, 5000), nk=st.integers(1, 5000), causal=st.booleans(), d=st.sampled_from([64, 128, 256]))
@settings(max_examples=25, deadline=None)
def test_flash3_one_packed_sequence_takes_the_dense_calls_time(n, nk, causal, d):
    """The fa3 model: one sequence packed is the problem itself (its tiles, placed by the same rule in the same
    order: the dense launch's snake or host schedule)."""
    p = AttentionProblem(seq_len=n, kv_len=nk, heads=8, head_dim=d, causal=causal)
    dense = simulate("flash3", p, H100, kernel="iosim-flash3", l2=False)
    packed = simulate("flash3", p, H100, kernel="iosim-flash3", l2=False, seqlens=[(n, nk)])
    assert packed.time.kernels[0].resources["pipeline"] == pytest.approx(dense.time.kernels[0].resources["pipeline"],
                                                                         rel=1e-9)
    assert packed.time.predicted_s == pytest.approx(dense.time.predicted_s, rel=1e-9)


@pytest.mark.parametrize("causal", [False, True])
def test_flash3_equal_sequences_packed_take_the_dense_batchs_time(causal):
    dense = simulate("flash3", AttentionProblem(batch=16, heads=16, seq_len=1024, head_dim=128, causal=causal),
                     H100, kernel="iosim-flash3", warm=True)
    packed = simulate("flash3", AttentionProblem(batch=1, heads=16, seq_len=16384, head_dim=128, causal=causal),
                      H100, kernel="iosim-flash3", warm=True, seqlens=[1024] * 16)
    assert packed.time.kernels[0].resources["pipeline"] == pytest.approx(dense.time.kernels[0].resources["pipeline"],
                                                                         rel=1e-12)


def test_the_varlen_grids_order_is_the_descriptions():
    """Ours runs every head of a sequence before the next sequence, a causal sequence's last Q tile first; FA2 runs
    every sequence of a head before the next head, its Q tiles in order. Blocks past a sequence's end exit."""
    p = AttentionProblem(seq_len=384, heads=2, head_dim=64, causal=True)
    rt = rates(get_profile(H100), "bf16")
    tc = TileConfig(block_q=128, block_kv=64, registers=128)
    exit_s = rt.block_s + rt.l2_latency_s
    for name in ("iosim-flash2", "fa2"):
        t = fa2.packed_order(p, load_kernel(name), tc, rt, fa2.Pace(1), ((256, 256), (128, 128)), None)
        kinds = ["exit" if x == exit_s else "work" for x in t]  # 2 blocks a head and sequence (the longest's tiles)
        if name == "iosim-flash2":  # sequence 0 (tile 1, tile 0) for head 0 and head 1; then sequence 1's (tile 0, exit)
            assert kinds == ["work", "work"] * 2 + ["work", "exit"] * 2 and t[0] > t[1]
        else:  # head 0: sequence 0 (tile 0, tile 1), sequence 1 (tile 0, exit); then head 1
            assert kinds == ["work", "work", "work", "exit"] * 2 and t[0] < t[1]


def test_packed_rows_are_their_own_regime():
    assert uncertainty.regime("iosim-flash2", 4096, 4096, True, packed=True) == "varlen"
    assert seqlens_text(((3, 5), (7, 7))) == "3:5 7:7" and seqlens_text(None) == ""


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("kernel", ["iosim-flash2", "fa2"])
def test_equal_sequences_packed_take_the_dense_batchs_time(causal, kernel):
    """16 sequences of 1024 packed run the dense batch's blocks, block for block (our grid (Tr, heads, 16), FA2's
    (Tr, 16, heads))."""
    prof = COMPOSED  # the same step for both (iosim-flash2's measured steps are the dense instantiation's)
    dense = simulate("flash2", AttentionProblem(batch=16, heads=16, seq_len=1024, head_dim=128, causal=causal),
                     prof, kernel=kernel, warm=True)
    packed = simulate("flash2", AttentionProblem(batch=1, heads=16, seq_len=16384, head_dim=128, causal=causal),
                      prof, kernel=kernel, warm=True, seqlens=[1024] * 16)
    assert packed.time.kernels[0].resources["blocks"] == pytest.approx(dense.time.kernels[0].resources["blocks"],
                                                                       rel=1e-12)


@given(n=st.integers(1, 3000), nk=st.integers(1, 3000), causal=st.booleans(), d=st.sampled_from([64, 128]))
@settings(max_examples=25, deadline=None)
def test_one_packed_sequence_is_the_dense_problem(n, nk, causal, d):
    """Time and DRAM bytes: one sequence packed is the problem itself (its blocks, its walk, nothing left dirty that
    a later sequence would evict), at the same step (the composed one; with the H100's measured steps, packed
    calls take the varlen instantiation's, calibration.forward.resident_step.iosim-flash2.d<d>_<Br>x<Bc>-varlen)."""
    p = AttentionProblem(seq_len=n, kv_len=nk, heads=4, head_dim=d, causal=causal)
    dense = simulate("flash2", p, COMPOSED, kernel="iosim-flash2")
    packed = simulate("flash2", p, COMPOSED, kernel="iosim-flash2", seqlens=[(n, nk)])
    assert packed.time.predicted_s == pytest.approx(dense.time.predicted_s, rel=1e-9)
    measured = simulate("flash2", p, H100, kernel="iosim-flash2", seqlens=[(n, nk)]).time.kernels[0]
    tc = load_kernel("iosim-flash2").tiles_for(d)  # packed: the varlen instantiation's own step, as measured
    table = get_profile(H100).calibration.forward.resident_step["iosim-flash2"]
    varlen = table[fa2.instantiation_key(d, tc.block_q, tc.block_kv, "varlen")].value.values()
    assert "step_composed" in measured.resources
    assert any(measured.resources["step"] == pytest.approx(float(v)) for v in varlen)
    assert (packed.hbm_read[0], packed.hbm_write[0]) == (dense.hbm_read[0], dense.hbm_write[0])


def test_sequences_with_no_query_only_add_blocks_that_exit_and_no_bytes():
    p = AttentionProblem(seq_len=2048, kv_len=2048 + 512, heads=8, head_dim=128, causal=True)
    alone = simulate("flash2", p.model_copy(update={"kv_len": 2048}), H100, kernel="iosim-flash2",
                     seqlens=[2048])
    padded = simulate("flash2", p, H100, kernel="iosim-flash2", seqlens=[(2048, 2048), (0, 512)])
    assert padded.hbm_read == alone.hbm_read and padded.hbm_write == alone.hbm_write
    # the 128 blocks that exit at once take slots the partial wave leaves free; the others still run one an SM
    assert padded.time.kernels[0].resources["blocks"] == pytest.approx(alone.time.kernels[0].resources["blocks"])
    assert padded.time.kernels[0].resources["step"] == alone.time.kernels[0].resources["step"]


@pytest.mark.parametrize("causal,window,heads", [(False, None, (4, 4)), (True, None, (8, 2)), (True, (300, 0), (4, 1))])
def test_the_packed_walk_of_one_sequence_is_the_dense_walk(causal, window, heads):
    """The varlen grid walked as one program: with one sequence, the dense kernel's blocks in the dense launch's
    order (heads, then Q tiles, causal last first), so the L2 model's bytes to the byte."""
    p = AttentionProblem(seq_len=1500, kv_len=1700, heads=heads[0], kv_heads=heads[1], head_dim=64, causal=causal,
                         dtype="bf16")
    dense = simulate_l2("flash2", p, Flash2Tiles(128, 64, window=window) if window else Tiles(128, 64), H100)
    got = packed_dram(p, Flash2Tiles(128, 64, window=window, seqlens=((1500, 1700),)), H100)
    assert (got.read_bytes, got.write_bytes) == (dense.read_bytes, dense.write_bytes)


def test_a_long_sequence_after_a_short_one_writes_the_short_ones_o_back():
    """Sequences in flight one after another share the cache: walked alone, a 1024-token sequence leaves its O
    dirty (not written, as Nsight Compute counts a kernel); packed before 16K tokens it is pushed out and written."""
    p = AttentionProblem(seq_len=1, heads=16, head_dim=128, dtype="bf16")
    small = simulate_l2("flash2", p.model_copy(update={"seq_len": 1024, "kv_len": 1024}), Tiles(128, 32), H100)
    big = simulate_l2("flash2", p.model_copy(update={"seq_len": 16384, "kv_len": 16384}), Tiles(128, 32), H100)
    assert small.write_bytes == 0 and small.kernels[0].dirty_at_end >= 1024 * 16 * 128 * 2  # O stays in L2
    both = packed_dram(p.model_copy(update={"seq_len": 17408, "kv_len": 17408}),
                       Flash2Tiles(128, 32, seqlens=((1024, 1024), (16384, 16384))), H100)
    assert both.write_bytes - big.write_bytes >= 1024 * 16 * 128 * 2  # the short sequence's O, written back


@given(lens=st.lists(st.tuples(st.integers(0, 700), st.integers(0, 700)), min_size=1, max_size=6),
       causal=st.booleans(), windowed=st.booleans(), heads=st.sampled_from([(2, 2), (4, 1), (6, 2)]))
@settings(max_examples=30, deadline=None)
def test_the_packed_walk_reads_what_the_blocks_need_at_least_once(lens, causal, windowed, heads):
    """Any packed batch (empty sequences, sequences without keys, windows, grouped heads) walks: DRAM reads no fewer
    than the bytes of Q its blocks read (each Q tile by one block, once) and no more than ``global``; writes no more
    than O and lse."""
    tq, tk = sum(q for q, _ in lens), sum(k for _, k in lens)
    if tq == 0 or tk == 0:
        return  # a problem has at least one query and one key
    p = AttentionProblem(seq_len=tq, kv_len=tk, heads=heads[0], kv_heads=heads[1], head_dim=64, causal=causal,
                         dtype="bf16")
    window = (200, 0 if causal else 100) if windowed else None
    r = simulate("flash2", p, H100, seqlens=lens, window=window, block_q=128, block_kv=64)
    g = r.counts.kernels[0].global_read
    once = simulate("flash2", p, H100, seqlens=lens, window=window, block_q=128, block_kv=64, l2=False)
    assert r.hbm_read[0] <= once.hbm_read[0]  # at most what the blocks request (global)
    assert r.hbm_read[0] >= g["Q"] and r.hbm_write[0] <= tq * p.heads * (64 * 2 + 4)


def test_a_paged_cache_adds_its_instructions_to_every_k_v_step_of_the_fa2_model():
    # the paged instantiation's PAGED_OPS warp instructions a step, at the ALU issue rate, on each of the block's warps
    desc, r = load_kernel("iosim-flash2"), rates(get_profile(H100), "bf16")
    tc = TileConfig(block_q=64, block_kv=64, registers=249, smem="iosim", q_in_registers=True)
    plain, paged = (fa2.step(64, 64, 128, 2, 2, desc, tc.model_copy(update={"step_ops": ops}), r)
                    for ops in (0.0, fa2.PAGED_OPS))
    per_sp, sp = max(desc.warps / fa2.SUBPARTITIONS, 1.0), r.sms * fa2.SUBPARTITIONS
    assert paged.softmax_s - plain.softmax_s == pytest.approx(per_sp * fa2.WARP_LANES * fa2.PAGED_OPS / (r.alu / sp))
    assert (paged.mma_s, paged.ldmatrix_s, paged.load_s) == (plain.mma_s, plain.ldmatrix_s, plain.load_s)
    # and simulate() prices it where the keys are paged, the same batch contiguous otherwise
    p = AttentionProblem(batch=1, seq_len=1280, kv_len=1280, heads=32, kv_heads=8, head_dim=128, causal=True)
    seqs = [(256, 640), (1024, 640)]
    times = [simulate("flash2", p, H100, seqlens=seqs, page_size=ps, block_q=64, block_kv=64).time.predicted_s
             for ps in (None, 64)]
    assert times[1] > times[0]
