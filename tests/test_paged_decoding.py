"""flash-decoding as iosim's decode kernel runs it (kernel="iosim-decode"): ragged batches, a paged cache, 1-16 new
tokens, grouped-query packing. Closed form == tile walk; counts derived by hand from kernels/flash_decode.cu; the
DRAM closed form; every new input refused with one error naming it."""

from __future__ import annotations

import json
from dataclasses import astuple

import numpy as np
import pytest
from helpers import run_cli, without_peak
from hypothesis import given
from hypothesis import strategies as st

from iosim import AttentionProblem, ScheduleError, get_profile, simulate
from iosim.blocks import cdiv
from iosim.launch import decode as geo
from iosim.numeric import execute
from iosim.schedules import decode_layout
from iosim.schedules import paged_decoding as pd
from iosim.schedules.decode_layout import PagedDecodingTiles, make_tiles
from iosim.simulate import closed, walk
from iosim.timing import load_kernel
from iosim.timing.decode_split import kernel_split


@st.composite
def batches(draw, max_len=200):
    """A problem the kernel takes and its tiles: ragged lengths (0 included), paged or not, forced splits, the cache
    in the problem's dtype or fp8."""
    kv_heads = draw(st.integers(1, 2))
    L = draw(st.integers(1, 16))
    p = AttentionProblem(batch=draw(st.integers(1, 3)), heads=kv_heads * draw(st.sampled_from([1, 2, 5, 8])),
                         kv_heads=kv_heads, seq_len=L, kv_len=draw(st.integers(1, max_len)),
                         head_dim=draw(st.sampled_from([64, 128, 256])), dtype=draw(st.sampled_from(["fp16", "bf16"])),
                         causal=L > 1 or draw(st.booleans()))
    lens = draw(st.lists(st.integers(0, p.kv_len), min_size=p.batch, max_size=p.batch))
    page = draw(st.sampled_from([None, 16, 32, 64, 256]))
    return p, make_tiles(p, lens, page, draw(st.integers(1, 12)), draw(st.sampled_from([None, "fp8"])))


@given(batches())
def test_closed_form_equals_the_walk_of_the_kernels_tile_program(case):
    p, t = case
    w, c = walk("flash-decoding", p, t), closed("flash-decoding", p, t)
    assert without_peak(w) == without_peak(c)
    for kw, kc in zip(w.kernels, c.kernels, strict=True):
        assert kw.sram_peak <= kc.sram_peak


@given(batches())
def test_kv_bytes_are_each_sequences_keys_once_per_kv_head_and_row_block(case):
    p, t = case
    c = closed("flash-decoding", p, t)
    row_blocks = cdiv(p.group * p.seq_len, t.block_q)
    kv = row_blocks * sum(t.kv_lens) * p.kv_heads * p.head_dim * (1 if t.kv_dtype == "fp8" else p.elem_bytes)
    assert c.global_read["K"] == c.global_read["V"] == kv
    tiles = sum(cdiv(n, 16) for n in t.kv_lens)  # every tile of 16 keys holds keys: its rows past n_b are not read
    assert c.flops["matmul"] == row_blocks * tiles * p.kv_heads * 4 * t.block_q * 16 * p.head_dim
    table = sum(_table_reads(n, t) for n in t.kv_lens) if t.paged else 0
    assert c.global_read["block_table"] == row_blocks * p.kv_heads * table
    assert c.global_write["O"] == p.batch * p.seq_len * p.heads * p.head_dim * p.elem_bytes


def _table_reads(n: int, t: PagedDecodingTiles) -> int:
    """Block-table bytes one row block of a sequence of n keys loads, walked tile by tile as flash_decode.cu v6+
    does: in each split, warp w takes the 16-key tiles w, w + 4, ... and reads their pages 32 tiles at a time, a lane a
    tile, an address once (lanes of a batch whose tiles share a page load one entry)."""
    total = 0
    for s in range(t.splits):
        starts = list(range(s * t.chunk, min(n, (s + 1) * t.chunk), 16))
        for w in range(4):
            mine = starts[w::4]
            total += sum(4 * len({x // t.page_size for x in mine[i:i + 32]}) for i in range(0, len(mine), 32))
    return total


def _small(splits):
    """2 sequences (40 and 17 keys), 8 query heads on 2 kv heads, one new token, d = 64, bf16, pages of 16."""
    p = AttentionProblem(batch=2, heads=8, kv_heads=2, seq_len=1, kv_len=64, head_dim=64, dtype="bf16")
    return p, make_tiles(p, [40, 17], 16, splits)


def test_one_split_moves_what_flash_decode_cu_loads_and_stores_counted_by_hand():
    p, t = _small(1)
    assert (t.block_q, t.splits) == (16, 1)  # M = 4 rows: one stripe, one row block; 4 blocks (2 sequences x 2)
    c = closed("flash-decoding", p, t)
    (k,) = c.kernels
    assert k.grid == 4
    assert dict(k.global_read) == {
        "seqlens_k": 4 * 4 * 4,  # every thread of every block loads its sequence's length: once a warp counts
        "Q": 4 * 4 * 64 * 2,  # 4 packed rows a block (rows 4..15 of the stripe zero-filled, not read)
        "K": (40 + 17) * 2 * 64 * 2, "V": (40 + 17) * 2 * 64 * 2,  # keys below n_b of each kv head
        "block_table": (3 + 2) * 2 * 4,  # a tile of 16 keys: every lane of its warp loads the entry, counted once
    }
    assert dict(k.global_write) == {"O": 2 * 8 * 64 * 2, "lse": 2 * 8 * 4}
    assert k.flops["matmul"] == (3 + 2) * 2 * 4 * 16 * 16 * 64  # whole 16 x 16 tiles of the stripe


def test_an_fp8_cache_halves_k_and_v_and_every_working_thread_loads_two_scales_counted_by_hand():
    p = AttentionProblem(batch=2, heads=8, kv_heads=2, seq_len=1, kv_len=64, head_dim=64, dtype="bf16")
    t = make_tiles(p, [40, 0], 16, 1, "fp8")
    (k,) = closed("flash-decoding", p, t).kernels
    # 4 blocks; sequence 1 has no key: its 2 blocks write O = 0, lse = -inf and load no scale
    assert dict(k.global_read) == {
        "seqlens_k": 4 * 4 * 4, "Q": 2 * 4 * 64 * 2,
        "K": 40 * 2 * 64 * 1, "V": 40 * 2 * 64 * 1,  # one byte a value
        "block_table": 3 * 2 * 4,
        "k_scale": 2 * 4 * 4, "v_scale": 2 * 4 * 4,  # every warp of the 2 blocks with keys, its kv head's
    }
    assert dict(k.global_write) == {"O": 2 * 8 * 64 * 2, "lse": 2 * 8 * 4}  # O in q's dtype
    plain = closed("flash-decoding", p, make_tiles(p, [40, 0], 16, 1)).kernels[0]
    assert k.flops == plain.flops
    # DRAM: the keys at a byte, and one 32-byte sector for each scale vector (2 kv heads x 4 B)
    (r8, _), = decode_layout.dram(p, t)
    (r16, _), = decode_layout.dram(p, make_tiles(p, [40, 0], 16, 1))
    assert r16 - r8 == 2 * 40 * 2 * 64 - 2 * 32
    # shared memory: the ring at a byte, plus each warp's 16-bit K and V tile (iosim.launch.decode's terms)
    assert pd.shared_memory(p, t) == geo.decode_smem_bytes(64, 1, 2, 1)
    with pytest.raises(ScheduleError, match="kv_dtype='fp16': expected None"):
        make_tiles(p, [40, 0], 16, 1, "fp16")


def test_two_splits_add_the_partials_and_the_combine_kernel_counted_by_hand():
    p, t = _small(2)
    assert (t.splits, t.chunk) == (2, 32)  # 40 keys in 2 even chunks of whole tiles: 32 + 8
    split, combine = closed("flash-decoding", p, t).kernels
    # 8 blocks; sequence 1 (17 keys) has nothing in split 1: those 2 blocks read their length and exit
    assert split.grid == 8
    assert dict(split.global_read) == {"seqlens_k": 8 * 4 * 4, "Q": 6 * 4 * 64 * 2, "K": 57 * 2 * 64 * 2,
                                       "V": 57 * 2 * 64 * 2, "block_table": 5 * 2 * 4}
    assert dict(split.global_write) == {"Opart": 6 * 4 * 64 * 4, "lsepart": 6 * 4 * 4}
    # 16 output rows, a warp each, 4 a block: lengths by every lane (once a warp); then, in one pass over the
    # splits (2 and 1 of them), every lane reads each lse_s (once a warp) and its d / 32 floats of O_s
    assert combine.grid == 4
    assert dict(combine.global_read) == {"seqlens_k": 16 * 4, "lsepart": (8 * 2 + 8 * 1) * 4,
                                         "Opart": (8 * 2 + 8 * 1) * 64 * 4}
    assert dict(combine.global_write) == {"O": 16 * 64 * 2, "lse": 16 * 4}


def test_rows_that_see_no_key_read_no_partials_in_the_combine():
    # 4 new tokens, 2 keys: tokens 0 and 1 see none (O = 0, lse = -inf), 2 and 3 see 1 and 2 keys
    p = AttentionProblem(batch=1, heads=2, kv_heads=1, seq_len=4, kv_len=300, head_dim=64, dtype="bf16", causal=True)
    t = make_tiles(p, [2], None, 1)
    assert closed("flash-decoding", p, t).kernels[0].global_read["K"] == 2 * 64 * 2
    t = PagedDecodingTiles(16, 16, splits=2, chunk=16, kv_lens=(20,), page_size=None)
    _, combine = closed("flash-decoding", p, t).kernels
    assert combine.global_read["Opart"] == 2 * 4 * 2 * 64 * 4  # 4 tokens x 2 heads see a key, 2 splits each
    t = PagedDecodingTiles(16, 16, splits=2, chunk=16, kv_lens=(2,), page_size=None)
    _, combine = closed("flash-decoding", p, t).kernels
    assert combine.global_read["Opart"] == 2 * 2 * 1 * 64 * 4  # tokens 2, 3 x 2 heads, the one split with keys
    assert combine.global_read["lsepart"] == 2 * 2 * 1 * 4  # the rows that see no key read no lse_s either


def test_more_rows_than_32_take_more_row_blocks_each_rereading_kv():
    # GQA 8:1 with 16 new tokens: 128 packed rows; 2 stripes a block at d = 128 (4 row blocks), 1 at d = 256 (8)
    for d, blocks in ((128, 4), (256, 8)):
        p = AttentionProblem(batch=1, heads=8, kv_heads=1, seq_len=16, kv_len=4096, head_dim=d, dtype="bf16",
                             causal=True)
        t = make_tiles(p, None, None, 1)
        assert cdiv(128, t.block_q) == blocks == geo.decode_row_blocks(128, d)
        c = closed("flash-decoding", p, t)
        assert c.global_read["K"] == blocks * 4096 * d * 2


def test_the_block_table_costs_a_load_a_distinct_page_of_a_warps_batch_and_dram_sectors_by_the_page():
    p = AttentionProblem(batch=4, heads=32, kv_heads=4, seq_len=1, kv_len=8192, head_dim=128, dtype="bf16")
    glob, hbm = {}, {}
    for page in (16, 64, 256, None):
        t = make_tiles(p, None, page, 1)
        glob[page] = closed("flash-decoding", p, t).global_read["block_table"]
        hbm[page] = decode_layout.dram(p, t)[0][0]
    # a warp's tiles are 64 keys apart: pages of 16 and 64 hold one of them each, an entry a tile; a page of 256
    # holds 4 of a batch's 32, 8 entries a batch (4 batches of a warp's 128 tiles, 4 warps, 16 kv heads)
    assert glob[16] == glob[64] == 4 * 4 * (8192 // 16) * 4 and glob[None] == 0
    assert glob[256] == 4 * 4 * (4 * 4 * 8) * 4
    # DRAM: each sequence's entries once, in 32-byte sectors: 512, 128 and 32 entries of 4 B
    assert hbm[16] - hbm[None] == 4 * 512 * 4 and hbm[64] - hbm[None] == 4 * 128 * 4
    assert hbm[256] - hbm[None] == 4 * 32 * 4


def test_the_dram_closed_form_reads_each_distinct_byte_once_in_sectors():
    p = AttentionProblem(batch=3, heads=16, kv_heads=2, seq_len=2, kv_len=1000, head_dim=64, dtype="fp16",
                         causal=True)
    t = make_tiles(p, [1000, 0, 33], 64, 3)
    (r1, w1), (r2, w2) = decode_layout.dram(p, t)
    q = 2 * 2 * 16 * 64 * 2  # the two sequences that hold keys
    kv = 2 * (1000 + 33) * 2 * 64 * 2
    table = 2 * 32 + 32  # entries 0..15 of row 0 (64 B) and entry 0 of row 2 (row stride 16 entries): 2 + 1 sectors
    assert r1 == q + kv + table + 32  # the 3 lengths: one sector
    assert t.splits == 3 and w1 == (3 + 0 + 1) * 2 * 16 * 65 * 4  # the partials of the splits that hold keys
    assert r2 == (3 + 0 + 1) * 2 * 16 * 4 + (3 * 2 + 1 * 2) * 16 * 64 * 4 + 32  # every lse_s; O_s of rows that see
    assert w2 == 3 * 2 * 16 * (64 * 2 + 4)
    # what L2 holds dirty stays there past the kernel's end: only the bytes beyond that room cross within it
    (_, v1), (_, v2) = decode_layout.dram(p, t, dirty_room=w1 - 100)
    assert (v1, v2) == (100, 0)


def test_the_dirty_room_is_l2_over_a_dirty_lines_room():
    from iosim import get_profile

    h100 = get_profile("h100-sxm5-80gb")
    assert decode_layout.dirty_room(h100) == h100.l2.capacity.value / h100.l2_room()[2]


def test_simulate_takes_the_kernel_and_its_options_and_says_which_dram_model():
    p = AttentionProblem(batch=3, heads=32, kv_heads=4, seq_len=4, kv_len=8192, head_dim=128, dtype="bf16",
                         causal=True)
    r = simulate("flash-decoding", p, kernel="iosim-decode", kv_lens=np.array([8192, 100, 4000]), page_size=16)
    assert isinstance(r.tiles, PagedDecodingTiles) and r.tiles.kv_lens == (8192, 100, 4000)
    assert r.counts.normalized() == closed("flash-decoding", p, r.tiles).normalized()
    assert r.hbm_model.startswith("closed form")
    room = decode_layout.dirty_room(r.profile)
    assert [(a, b) for a, b in zip(r.hbm_read, r.hbm_write, strict=True)] == decode_layout.dram(p, r.tiles, room)
    assert simulate("flash-decoding", p, kernel="iosim-decode", kv_lens=[8192, 100, 4000], page_size=16,
                    l2=False).traffic["hbm"] == r.traffic["global"]  # --no-l2: the two-level view
    j = r.to_json()
    assert j["tiles_by_pass"]["forward"]["kv_lens"] == [8192, 100, 4000]
    assert j["tiles_by_pass"]["forward"]["page_size"] == 16 and j["by_tensor"]["block_table"]["global_read_bytes"]
    walked = simulate("flash-decoding", p, kernel="iosim-decode", method="walk", kv_lens=[8192, 100, 4000],
                      page_size=16, l2=False)
    assert without_peak(walked.counts) == without_peak(r.counts)


def test_the_cli_takes_kv_lens_and_page_size_and_agrees_with_python(capsys):
    args = ["simulate", "flash-decoding", "--batch", "3", "--heads", "8", "--kv-heads", "2", "--seq-len", "1",
            "--kv-len", "4096", "--head-dim", "64", "--dtype", "bf16", "--kernel", "iosim-decode",
            "--kv-lens", "4096,17,1000", "--page-size", "64", "--json"]
    code, out, err = run_cli(args, capsys)
    assert code == 0, err
    j = json.loads(out)
    p = AttentionProblem(batch=3, heads=8, kv_heads=2, seq_len=1, kv_len=4096, head_dim=64, dtype="bf16")
    r = simulate("flash-decoding", p, kernel="iosim-decode", kv_lens=[4096, 17, 1000], page_size=64).to_json()
    assert j["traffic"] == r["traffic"] and j["time"]["predicted_s"] == r["time"]["predicted_s"]
    code, out, err = run_cli(args[:-1], capsys)
    assert code == 0 and "kv_lens=[4096, 17, 1000]" in out and "block_table" in out


def test_the_simulators_splits_are_the_kernels():
    p = AttentionProblem(batch=5, heads=32, kv_heads=4, seq_len=1, kv_len=32768, head_dim=128, dtype="bf16")
    lens = [32768, 300, 9000, 0, 17]
    desc = load_kernel("iosim-decode")
    regs = desc.decode_registers(128, 1)
    smem = geo.decode_smem_bytes(128, 1, 2)
    slots = 132 * geo.decode_blocks_per_sm(smem, regs, 228 * 1024)  # plan_decode's residency from device attributes
    r = simulate("flash-decoding", p, "h100-sxm5-80gb", kernel="iosim-decode", kv_lens=lens)
    want, rule = kernel_split(p, get_profile("h100-sxm5-80gb"), desc, geo.split_slots(132, slots // 132), lens)
    assert (r.tiles.splits, r.tiles.chunk) == (want.splits, want.chunk) and want.splits > 1
    assert rule == "time model"  # the H100 profile has the kernel's calibration
    a100 = simulate("flash-decoding", p, "a100-sxm4-80gb", kernel="iosim-decode", kv_lens=lens)  # it has none:
    per_sm = geo.decode_blocks_per_sm(smem, regs, 164 * 1024)  # the occupancy rule on its residency
    assert (a100.tiles.splits, a100.tiles.chunk) == astuple(geo.decode_split(lens, 4, geo.split_slots(108, per_sm)))
    forced = simulate("flash-decoding", p, kernel="iosim-decode", kv_lens=lens, splits=3)
    assert (forced.tiles.splits, forced.tiles.chunk) == (3, 10928)


@given(k0=st.integers(0, 40).map(lambda x: 16 * x), span=st.integers(1, 9000),
       page=st.sampled_from([16, 32, 48, 64, 80, 128, 256, 1024]))
def test_the_table_bytes_closed_form_counts_each_batchs_distinct_entries(k0, span, page):
    k1 = k0 + span
    want = 4 * sum(len(batch) for w in range(4) for batch in decode_layout.table_entries(k0, k1, w, page))
    assert decode_layout.table_bytes(k0, k1, page) == want


def test_the_descriptions_registers_are_the_kernels():
    desc = load_kernel("iosim-decode")
    assert {(d, s): desc.decode_registers(d, s) for d, by in desc.decode.registers.items() for s in by} == \
        geo.DECODE_REGISTERS


BAD = [
    (dict(kv_lens=[10, 20]), r"kv_lens: shape \(2,\); expected one length per sequence, \(3,\) for batch=3"),
    (dict(kv_lens=[10, -1, 3]), r"kv_lens\[1\]=-1: expected 0 to kv_len=100"),
    (dict(kv_lens=[10, 101, 3]), r"kv_lens\[1\]=101: expected 0 to kv_len=100 \(kv_len is the cache's capacity"),
    (dict(kv_lens=[10, 2.5, 3]), r"kv_lens\[1\]=2.5: expected a whole number"),
    (dict(kv_lens=[10, True, 3]), r"kv_lens\[1\]=True: expected a whole number"),
    (dict(kv_lens="10,20,30"), r"kv_lens='10,20,30': expected the keys of each sequence"),
    (dict(kv_lens=np.ones((3, 1), int)), r"kv_lens: shape \(3, 1\)"),
    (dict(page_size=24), r"page_size=24: expected a multiple of 16 tokens"),
    (dict(page_size=0), r"page_size=0: expected a multiple of 16"),
    (dict(page_size=True), r"page_size=True: expected a whole number"),
    (dict(splits=0), r"splits=0: expected None or an integer from 1 to 128"),
    (dict(splits=129), r"splits=129: expected None or an integer from 1 to 128"),
    (dict(block_q=32), r"block_q=32, block_kv=None; the kernel's tiles are its own"),
]


@pytest.mark.parametrize("kw,match", BAD)
def test_bad_layouts_are_refused_naming_the_field(kw, match):
    p = AttentionProblem(batch=3, heads=8, kv_heads=2, seq_len=1, kv_len=100, head_dim=64, dtype="bf16")
    with pytest.raises(ScheduleError, match=match):
        simulate("flash-decoding", p, kernel="iosim-decode", **kw)


@pytest.mark.parametrize("problem,match", [
    (dict(seq_len=17, causal=True), r"seq_len=17 new tokens per sequence; expected 1 to 16"),
    (dict(head_dim=96), r"head_dim=96; expected one of \[64, 128, 256\]"),
    (dict(dtype="fp32"), r"dtype='fp32'; expected one of \['fp16', 'bf16'\]"),
    (dict(seq_len=4), r"causal=False with seq_len=4; .* set causal=True"),
])
def test_problems_the_kernel_does_not_take_are_refused(problem, match):
    p = AttentionProblem(**{**dict(batch=2, heads=8, kv_heads=2, seq_len=1, kv_len=100, head_dim=64, dtype="bf16"),
                            **problem})
    with pytest.raises(ScheduleError, match=match):
        simulate("flash-decoding", p, kernel="iosim-decode")


def test_a_ragged_or_paged_batch_without_the_kernel_says_which_kernel_takes_it():
    p = AttentionProblem(batch=2, heads=8, kv_heads=2, seq_len=1, kv_len=100, head_dim=64, dtype="bf16")
    with pytest.raises(ScheduleError, match=r"give kernel='iosim-decode'"):
        simulate("flash-decoding", p, kv_lens=[100, 50])
    with pytest.raises(ScheduleError, match=r"only flash-decoding takes splits \(and, with kernel='iosim-decode', "
                                            r"kv_lens, page_size and kv_dtype\)"):
        simulate("flash1", p, page_size=16)
    with pytest.raises(ScheduleError, match=r"page_size=16 without seqlens: flash2 reads a paged cache in its varlen"):
        simulate("flash2", p, page_size=16)  # flash2 takes pages in its chunked-prefill mode


def test_the_numeric_executor_refuses_the_kernels_tiles_with_where_its_numbers_are_checked():
    p = AttentionProblem(batch=1, heads=2, kv_heads=1, seq_len=1, kv_len=32, head_dim=64, dtype="bf16")
    q, k = np.zeros((1, 1, 2, 64)), np.zeros((1, 32, 1, 64))
    with pytest.raises(ScheduleError, match=r"counted, not executed here: .*tests/gpu/test_decode_gpu.py"):
        execute("flash-decoding", p, q, k, k, make_tiles(p))
