"""What can be checked about varlen and sliding-window attention without a GPU: every argument check of
iosim.gpu.attention_varlen and of the window (iosim.gpu.varlen_inputs), the kernel's mask as the launch takes it, the
varlen grid and its empty blocks, and the instantiation list against the kernel's signature.
tests/gpu/test_varlen_gpu.py runs the kernel."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import load_benchmark
from hypothesis import given
from hypothesis import strategies as st

from iosim import gpu
from iosim._resources import kernels_dir
from iosim.gpu import AttentionInputError, AttentionTypeError, build
from iosim.gpu import varlen_inputs as vi
from iosim.launch import varlen as geo
from iosim.schedules.flash2 import PAGE_TILES_HEAD_DIMS

# ------------------------------------------------------------------------------------------------------------------
# the window


@pytest.mark.parametrize("window,causal,expected", [
    (None, False, None), (None, True, None),
    ((0, 0), False, (0, 0)), ((4095, 0), True, (4095, 0)), ((4095, None), True, (4095, 0)),
    ((None, None), False, (None, None)), ((3, 7), False, (3, 7)), ([2, 5], False, (2, 5)),
    ((np.int64(8), np.int32(0)), False, (8, 0)),
])
def test_a_window_is_a_pair_of_bounds_and_causal_means_right_zero(window, causal, expected):
    assert vi.check_window(window, causal) == expected


@pytest.mark.parametrize("window,match", [
    ((-1, 0), r"window: left=-1; expected an integer >= 0, or None"),
    ((0, -3), r"window: right=-3; expected an integer >= 0, or None"),
    ((-1, -1), r"left=-1"),
])
def test_a_negative_bound_is_an_error(window, match):
    with pytest.raises(AttentionInputError, match=match):
        vi.check_window(window, False)


@pytest.mark.parametrize("window", [5, "4,0", (1, 2, 3), (1,), (1.5, 0), (True, 0), (0, False), ({}, 0)])
def test_a_window_that_is_not_a_pair_of_integers_is_a_type_error(window):
    with pytest.raises(AttentionTypeError, match=r"window"):
        vi.check_window(window, False)


def test_a_causal_call_with_a_right_bound_is_an_error_that_says_both_ways_out():
    with pytest.raises(AttentionInputError, match=r"window=\(16, 4\) with causal=True: causal means right = 0; pass "
                                                  r"window=\(16, 0\), or causal=False"):
        vi.check_window((16, 4), True)


@pytest.mark.parametrize("causal,window,expected", [
    (False, None, geo.Mask(False, None)),
    (True, None, geo.Mask(True, None)),
    (False, (None, None), geo.Mask(False, None)),  # unbounded both ways: the plain kernel
    (False, (None, 0), geo.Mask(True, None)),  # the causal kernel, not Local
    (True, (None, 0), geo.Mask(True, None)),
    (True, (10, 0), geo.Mask(False, (10, 0))),  # a causal window: Local with right = 0
    (False, (0, None), geo.Mask(False, (0, None))),
])
def test_the_kernel_runs_the_cheapest_mask_that_says_the_same(causal, window, expected):
    assert geo.mask_of(causal, window) == expected


def test_an_unbounded_side_reaches_the_kernel_as_int_max():
    assert geo.Mask(False, (None, 5)).kernel_window() == (2**31 - 1, 5)
    assert geo.Mask(False, (7, None)).kernel_window() == (7, 2**31 - 1)
    assert geo.Mask(True, None).kernel_window() == (0, 0)


def test_attention_varlen_checks_window_causal_and_options_before_it_needs_a_gpu():
    q = np.zeros((4, 2, 64), np.float16)
    with pytest.raises(AttentionInputError, match=r"window: left=-2"):
        gpu.attention_varlen(q, q, q, ([0, 4], [0, 4]), window=(-2, 0))
    with pytest.raises(AttentionTypeError, match=r"causal=1: expected True or False"):
        gpu.attention_varlen(q, q, q, ([0, 4], [0, 4]), causal=1)
    with pytest.raises(AttentionInputError, match=r"options: window not taken by attention_varlen .* window=\(left, "
                                                  r"right\)"):
        gpu.attention_varlen(q, q, q, ([0, 4], [0, 4]), options=gpu.AttentionOptions(window=(1, 0)))
    with pytest.raises(AttentionInputError, match=r"options: block_trace, deterministic not taken"):
        gpu.attention_varlen(q, q, q, ([0, 4], [0, 4]),
                             options=gpu.AttentionOptions(block_trace=object(), deterministic=True))
    with pytest.raises(AttentionTypeError, match=r"options: got dict"):
        gpu.attention_varlen(q, q, q, ([0, 4], [0, 4]), options={"window": (1, 0)})


# ------------------------------------------------------------------------------------------------------------------
# cumulative lengths


@pytest.mark.parametrize("cu,match", [
    ([0, 5, 3, 9], r"cu_seqlens_q\[2\] = 3 < cu_seqlens_q\[1\] = 5; expected cumulative lengths that never decrease"),
    ([1, 5, 9], r"cu_seqlens_q\[0\] = 1; expected 0"),
    ([0], r"cu_seqlens_q: shape \(1,\); expected \(batch \+ 1,\) with batch >= 1"),
    ([[0, 1], [1, 2]], r"cu_seqlens_q: shape \(2, 2\)"),
    ([0, 2**30], r"cu_seqlens_q\[-1\] = 1073741824 tokens; expected fewer than 2\^30"),
])
def test_cumulative_lengths_that_are_not_are_an_error(cu, match):
    with pytest.raises(AttentionInputError, match=match):
        vi.check_cu_seqlens(cu, "cu_seqlens_q")


def test_empty_sequences_are_lengths_of_zero():
    a = vi.check_cu_seqlens(np.array([0, 0, 5, 5, 9], np.int64), "cu_seqlens_k")
    assert a.dtype == np.int32 and a.tolist() == [0, 0, 5, 5, 9]


@pytest.mark.parametrize("cu", [[0.0, 4.0], np.array([0, 4], np.float32), ["0", "4"], [0, None]])
def test_cumulative_lengths_must_be_integers(cu):
    with pytest.raises(AttentionTypeError, match=r"cu_seqlens_q: .*expected an integer array"):
        vi.check_cu_seqlens(cu, "cu_seqlens_q")


def test_too_many_sequences_for_the_grid_is_an_error():
    with pytest.raises(AttentionInputError, match=r"65536 sequences; expected at most 65535"):
        vi.check_cu_seqlens(np.arange(65537), "cu_seqlens_q")


def test_lengths_that_do_not_add_up_to_the_packed_tokens_are_an_error():
    s = vi.check_shapes((10, 4, 64), (12, 2, 64), (12, 2, 64), ("float16",) * 3)
    vi.check_totals(10, 12, s)
    with pytest.raises(AttentionInputError, match=r"cu_seqlens_q\[-1\] = 9; expected 10, the rows of q"):
        vi.check_totals(9, 12, s)
    with pytest.raises(AttentionInputError, match=r"cu_seqlens_k\[-1\] = 13; expected 12, the rows of k and v"):
        vi.check_totals(10, 13, s)


def test_q_and_k_must_describe_the_same_number_of_sequences():
    with pytest.raises(AttentionInputError, match=r"cu_seqlens_k: 1 sequences; expected 2, as cu_seqlens_q"):
        vi.check_batches(np.array([0, 2, 4]), np.array([0, 4]))


def test_max_seqlen_q_defaults_to_the_longest_and_may_not_be_shorter():
    lens = np.array([3, 17, 0])
    assert vi.check_max_seqlen(None, lens) == 17
    assert vi.check_max_seqlen(64, lens) == 64
    with pytest.raises(AttentionInputError, match=r"max_seqlen_q=16; expected at least 17, the length of sequence 1"):
        vi.check_max_seqlen(16, lens)
    with pytest.raises(AttentionTypeError, match=r"max_seqlen_q=17.0"):
        vi.check_max_seqlen(17.0, lens)


# ------------------------------------------------------------------------------------------------------------------
# shapes and dtypes


@pytest.mark.parametrize("shapes,dtypes,error,match", [
    (((2, 10, 4, 64), (12, 2, 64), (12, 2, 64)), "float16", AttentionInputError, r"q: shape \(2, 10, 4, 64\) has 4 dims; "
     r"expected 3 dims \(total_q, heads, head_dim\)"),
    (((10, 4, 64), (3, 16, 2, 64), (3, 16, 2, 64)), "float16", AttentionInputError, r"k: shape \(3, 16, 2, 64\) has 4 "
     r"dims; .* or, for k and v, a paged cache through gpu.varlen_batch\(..., block_table=..., page_size=...\)"),
    (((10, 4, 64), (12, 2, 64), (12, 3, 64)), "float16", AttentionInputError, r"v: shape \(12, 3, 64\) differs"),
    (((10, 4, 64), (12, 3, 64), (12, 3, 64)), "float16", AttentionInputError, r"kv_heads=3 does not divide"),
    (((10, 4, 48), (12, 2, 48), (12, 2, 48)), "float16", AttentionInputError, r"head_dim=48 is not supported"),
    (((10, 4, 64), (12, 2, 128), (12, 2, 128)), "float16", AttentionInputError, r"k: head_dim 128 differs"),
    (((10, 0, 64), (12, 2, 64), (12, 2, 64)), "float16", AttentionInputError, r"empty dimension"),
    (((10, 4, 64), (12, 2, 64), (12, 2, 64)), "float32", AttentionTypeError, r"q: dtype float32 is not supported"),
])
def test_shapes_and_dtypes_are_checked_with_one_clear_error(shapes, dtypes, error, match):
    with pytest.raises(error, match=match):
        vi.check_shapes(*shapes, (dtypes,) * 3)


def test_k_and_v_must_have_q_dtype():
    with pytest.raises(AttentionTypeError, match=r"v: dtype float16 differs from q's bfloat16"):
        vi.check_shapes((10, 4, 64), (12, 2, 64), (12, 2, 64), ("bfloat16", "bfloat16", "float16"))


# ------------------------------------------------------------------------------------------------------------------
# the grid, the tiles and the instantiations


def test_the_grid_covers_the_longest_sequence_and_counts_the_blocks_that_exit_at_once():
    assert geo.varlen_grid(1000, 8, 4, 128) == (8, 8, 4)
    # lengths 1, 17, 128, 1000 at Br = 128: 1 + 1 + 1 + 8 tiles of the 4 x 8 = 32 blocks per head
    assert geo.empty_blocks([1, 17, 128, 1000], 1000, 8, 128) == (32 - 11) * 8
    assert geo.empty_blocks([256, 256], 256, 2, 128) == 0
    assert geo.varlen_grid(0, 1, 2, 64) == (1, 1, 2)  # only empty sequences: one block each, which exits


@given(lens=st.lists(st.integers(0, 3000), min_size=1, max_size=20), bq=st.sampled_from([64, 128]))
def test_every_q_tile_of_every_sequence_has_a_block_and_the_rest_exit(lens, bq):
    grid = geo.varlen_grid(max(lens), 1, len(lens), bq)
    real = sum(-(-n // bq) for n in lens)
    assert all(-(-n // bq) <= grid[0] for n in lens)
    assert grid[0] * grid[2] == real + geo.empty_blocks(lens, max(lens), 1, bq)


def test_windowed_tiles_avoid_the_one_that_spills_and_defaults_follow_the_dense_kernel():
    assert geo.varlen_default_tiles(128, False) == (128, 32)  # the dense default
    assert geo.varlen_default_tiles(128, True) == (64, 64)  # 128 x 32 spills on sm_80 with a window
    assert geo.varlen_default_tiles(64, True) == (128, 64)
    for table in (geo.FLASH_VARLEN_TILES, geo.FLASH_LOCAL_TILES):
        for d, tiles in table.items():
            assert set(tiles) <= set(gpu.FLASH_TILES[d]), d


# ------------------------------------------------------------------------------------------------------------------
# a paged cache (chunked prefill): the block table and the cache's shape


def test_a_block_table_names_a_page_for_every_live_key_and_nothing_else_is_read():
    lens = np.array([40, 0, 16])
    table = np.array([[5, 2, 9, -7], [-1, -1, -1, -1], [0, -3, 99, 99]])
    checked, max_page = vi.check_page_table(table, lens, 16)
    assert checked.dtype == np.int32 and max_page == 9
    assert checked.tolist() == [[5, 2, 9, 0], [0, 0, 0, 0], [0, 0, 0, 0]]  # entries past each last page: never read


@pytest.mark.parametrize("table,lens,page,match", [
    ([[3, -1]], [17], 16, r"block_table\[0, 1\] = -1"),
    ([[3, 4]], [33], 16, "at most max_pages \\* page_size = 2 \\* 16 = 32"),
    ([[3, 4, 5]], [33], 16, None),
    ([[3]], [5], 0, "page_size=0"),
    ([[3]], [5], True, "page_size=True"),
    ([3, 4], [5], 16, r"shape \(2,\)"),
    ([[3], [4]], [5], 16, r"\(1, >= 1\)"),
])
def test_a_block_table_that_cannot_hold_the_keys_is_an_error(table, lens, page, match):
    if match is None:
        vi.check_page_table(np.array(table), np.array(lens), page)
        return
    with pytest.raises(AttentionInputError, match=match):
        vi.check_page_table(np.array(table), np.array(lens), page)


def test_a_paged_cache_has_the_batchs_pages_and_every_page_the_table_names():
    assert vi.check_paged_cache((10, 16, 2, 64), (10, 16, 2, 64), 16, 9) == (160, 2, 64)
    for shapes, page, max_page, match in [(((10, 16, 2, 64), (10, 16, 2, 64)), 16, 10, "names page 10"),
                                          (((10, 16, 2, 64), (10, 16, 2, 64)), 32, 0, "pages of 16 tokens"),
                                          (((160, 2, 64), (160, 2, 64)), 16, 0, "4 dims"),
                                          (((10, 16, 2, 64), (10, 16, 1, 64)), 16, 0, "v: shape")]:
        with pytest.raises(AttentionInputError, match=match):
            vi.check_paged_cache(*shapes, page, max_page)


@pytest.mark.parametrize("seed", [None, 7])
def test_paged_kv_puts_every_key_in_the_slot_its_table_names_and_zeros_the_rest(seed):
    lens = [0, 1, 47, 48, 130]
    cu = np.concatenate([[0], np.cumsum(lens)])
    k = np.random.default_rng(0).standard_normal((cu[-1], 2, 8)).astype(np.float32)
    kc, vc, table = gpu.paged_kv(k, -k, cu, 48, seed=seed)
    assert kc.shape == (1 + 1 + 1 + 3, 48, 2, 8) and table.shape == (5, 3) and table.dtype == np.int32
    filled = np.zeros(kc.shape[:2], dtype=bool)
    for b, n in enumerate(lens):
        pages = table[b, : -(-n // 48)]
        assert len(set(pages.tolist())) == len(pages)  # a sequence's pages are its own
        for t in range(n):
            assert np.array_equal(kc[pages[t // 48], t % 48], k[cu[b] + t])
            filled[pages[t // 48], t % 48] = True
    assert filled.sum() == cu[-1] and not kc[~filled].any() and np.array_equal(vc, -kc)
    checked, max_page = vi.check_page_table(table, np.array(lens), 48)  # the table the batch takes as it is
    assert max_page == kc.shape[0] - 1 and (checked[table >= 0] == table[table >= 0]).all()
    assert (table[4].tolist() == [3, 4, 5]) == (seed is None)  # sequence order, or drawn at random


def test_paged_kv_refuses_a_page_size_and_lengths_that_do_not_fit():
    k = np.zeros((10, 1, 8), dtype=np.float32)
    with pytest.raises(AttentionInputError, match="page_size=0"):
        gpu.paged_kv(k, k, [0, 10], 0)
    with pytest.raises(AttentionInputError, match=r"cu_seqlens_k\[-1\] = 9 rows"):
        gpu.paged_kv(k, k, [0, 9], 16)


def test_the_paged_kernel_is_compiled_once_per_head_dim_dtype_and_mask_at_tiles_that_do_not_spill():
    paged = [i for i in build.flash_instances() if i.paged]
    rows = [i for i in paged if not i.page_tiles]  # plain, causal, window per dtype; PageTiles where it exists
    assert len(rows) == 3 * len(geo.FLASH_PAGED_TILES) * 2
    assert {(i.head_dim, i.dtype, i.causal, i.local) for i in paged if i.page_tiles} == \
        {(i.head_dim, i.dtype, i.causal, i.local) for i in rows if i.head_dim in PAGE_TILES_HEAD_DIMS}
    assert {(i.head_dim, (i.block_q, i.block_kv)) for i in paged} == set(geo.FLASH_PAGED_TILES.items())
    assert geo.FLASH_PAGED_TILES[128] == (64, 64)  # 128 x 32 spills with the lookups
    for d, tiles in geo.FLASH_PAGED_TILES.items():
        assert tiles in geo.FLASH_VARLEN_TILES[d] and tiles in geo.FLASH_LOCAL_TILES[d]  # a contiguous twin exists


def test_every_instantiation_matches_the_kernels_parameter_list():
    src = (kernels_dir() / build.FLASH_SOURCE).read_text()
    sig = re.search(r"flash_fwd_kernel\((.*?)\)\s*\{", src, re.S).group(1)
    n_params = len([p for p in sig.split(",") if p.strip()])
    assert n_params == 17
    for inst in build.flash_instances():
        params = inst.explicit_instantiation.split("(", 1)[1].rstrip(");")
        assert len(params.split(",")) == n_params, inst
        flags = inst.name_expression.rstrip(">").split(", ")[4:]  # Causal .. PageTiles; defaults left out
        given = ["true" if f else "false" for f in (inst.causal, inst.local, inst.varlen, inst.paged,
                                                     inst.page_tiles)]
        assert flags == given[: 5 if inst.page_tiles else 4 if inst.paged else 3 if inst.varlen else 1], inst


# ------------------------------------------------------------------------------------------------------------------
# the benchmark's FLOP count


def _bench_varlen():
    """benchmarks/bench_varlen.py, which imports cuda_events from beside itself."""
    bench_dir = str(Path(__file__).resolve().parents[1] / "benchmarks")
    if bench_dir not in sys.path:
        sys.path.insert(0, bench_dir)
    return load_benchmark("bench_varlen")


@given(lens=st.lists(st.integers(0, 70), min_size=1, max_size=4), causal=st.booleans(),
       window=st.one_of(st.none(), st.integers(1, 80)))
def test_bench_varlen_counts_the_visible_pairs_of_each_sequence(lens, causal, window):
    bench = _bench_varlen()
    causal = causal or window is not None  # its windows are causal: (w - 1, 0)
    want = 0
    for n in lens:
        i, j = np.arange(n)[:, None], np.arange(n)[None, :]
        ok = (j <= i) if causal else np.ones((n, n), bool)
        if window is not None:
            ok &= i - j < window
        want += int(ok.sum())
    assert bench.visible_pairs(lens, causal, window) == want
