"""flash2's sliding window and packed sequences (varlen) in the simulator: the closed form equals the tile walk, the
global bytes equal the loads and stores of kernels/flash_fwd.cu's varlen kernel (its tile choice, transcribed below
as the kernel computes it), window bytes grow as N·w, and a packed batch is the sum of its sequences and the reads of
their lengths."""

from __future__ import annotations

import pytest
from helpers import without_peak
from hypothesis import given
from hypothesis import strategies as st

from iosim import AttentionProblem, simulate
from iosim.blocks import cdiv
from iosim.problem import STAT_BYTES
from iosim.schedules import ScheduleError, ScheduleOptions, Tiles, resolve_tiles
from iosim.simulate import closed, walk


def tiles(p, Br, Bc, **options):
    return resolve_tiles("flash2", p, None, Br, Bc, options=ScheduleOptions(**options))


def visited(N: int, Nk: int, Br: int, Bc: int, causal: bool, window):
    """(Q tile's first row, K/V tiles n_min .. n_max - 1) of every Q tile of one sequence that visits a K/V tile, as
    flash_fwd.cu's varlen kernel finds them: the last row m0 + Br - 1 unclamped, the window's bounds clamped to the
    lengths."""
    left, right = window if window is not None else (None, None)
    local = window is not None and not (left is None and right == 0) and window != (None, None)
    causal = causal or (window is not None and left is None and right == 0)
    for m_block in range(cdiv(N, Br)):
        m0, off = m_block * Br, Nk - N
        n_max, n_min = cdiv(Nk, Bc), 0
        if causal and not local:
            last = m0 + Br - 1 + off
            n_max = min(n_max, 0 if last < 0 else last // Bc + 1)
        if local:
            lw = min(2**31 - 1 if left is None else left, Nk)
            rw = min(2**31 - 1 if right is None else right, N)
            last = m0 + Br - 1 + off + rw
            n_max = min(n_max, 0 if last < 0 else last // Bc + 1)
            first = m0 + off - lw
            n_min = 0 if first <= 0 else first // Bc
        if n_max > n_min:
            yield m0, range(n_min, n_max)


def kernel_bytes(N: int, Nk: int, Br: int, Bc: int, causal: bool, window, d: int, b: int) -> tuple[int, int]:
    """(bytes read, bytes written) of one head of one sequence as flash_fwd.cu's varlen kernel moves them: Q loaded
    only by a tile that visits a K/V tile, K and V rows of each visited tile (a ragged last tile: its real rows), O
    and lse of every row written."""
    read = 0
    for m0, kv in visited(N, Nk, Br, Bc, causal, window):
        read += min(Br, N - m0) * d * b  # Q_i
        read += sum(2 * min(Bc, Nk - j * Bc) * d * b for j in kv)  # K_j, V_j
    return read, N * d * b + N * STAT_BYTES


def table_loads(N: int, Nk: int, Br: int, Bc: int, causal: bool, window, page_size: int, d: int) -> int:
    """Block-table entries (4 B each) one head of one sequence loads in the paged kernel, as page_of does and as the
    SASS counter counts a load: of each visited K/V tile, thread tid < Bc loads the entry of key tid (row lists), or
    every thread the entry of its first key where the page size is a multiple of Bc at d <= 128 (PageTiles); each
    warp's distinct entries once."""
    n = 0
    for _, kv in visited(N, Nk, Br, Bc, causal, window):
        for j in kv:
            for warp in range(4):
                lanes = range(32 * warp, 32 * warp + 32)
                keys = [j * Bc for _ in lanes] if page_size % Bc == 0 and d <= 128 else \
                    [j * Bc + tid for tid in lanes if tid < Bc and j * Bc + tid < Nk]
                n += len({t // page_size for t in keys})
    return n


windows = st.one_of(st.none(), st.tuples(st.one_of(st.none(), st.integers(0, 300)),
                                         st.one_of(st.none(), st.integers(0, 300))))


@given(N=st.integers(1, 400), Nk=st.integers(1, 400), Br=st.sampled_from([16, 64, 128]),
       Bc=st.sampled_from([16, 32, 64]), causal=st.booleans(), window=windows, heads=st.sampled_from([(2, 2), (4, 1)]))
def test_window_closed_form_equals_the_walk_and_the_kernels_loads_and_stores(N, Nk, Br, Bc, causal, window, heads):
    if causal and window is not None:
        window = (window[0], 0)
    p = AttentionProblem(seq_len=N, kv_len=Nk, heads=heads[0], kv_heads=heads[1], head_dim=64, causal=causal,
                         dtype="bf16")
    t = tiles(p, Br, Bc, window=window)
    c = closed("flash2", p, t)
    assert without_peak(c) == without_peak(walk("flash2", p, t))
    read, write = kernel_bytes(N, Nk, Br, Bc, causal, window, 64, 2)
    assert c.global_read_bytes == read * p.heads and c.global_write_bytes == write * p.heads


@given(lens=st.lists(st.tuples(st.integers(0, 300), st.integers(0, 300)), min_size=1, max_size=5),
       causal=st.booleans(), window=windows, Br=st.sampled_from([64, 128]), Bc=st.sampled_from([32, 64]))
def test_a_packed_batch_moves_the_sum_of_its_sequences_bytes_and_no_padding(lens, causal, window, Br, Bc):
    if causal and window is not None:
        window = (window[0], 0)
    tq, tk = sum(n for n, _ in lens), sum(n for _, n in lens)
    if tq == 0 or tk == 0:
        return  # a problem has at least one query and one key
    p = AttentionProblem(seq_len=tq, kv_len=tk, heads=2, head_dim=64, causal=causal, dtype="fp16")
    t = tiles(p, Br, Bc, window=window, seqlens=lens)
    c = closed("flash2", p, t)
    assert without_peak(c) == without_peak(walk("flash2", p, t))
    read = sum(kernel_bytes(n, nk, Br, Bc, causal, window, 64, 2)[0] for n, nk in lens)
    # the varlen grid: ceil(longest / Br) blocks a sequence and head, each warp of each reading the four lengths of
    # its sequence (4 B each, once a warp: what Nsight Compute's SASS counters measured), a block with a Q tile to
    # run reading the first query row again where it writes O (docs/validation.md, packed sequences)
    launched, working = cdiv(max(1, max(n for n, _ in lens)), Br) * len(lens), sum(cdiv(n, Br) for n, _ in lens)
    assert c.global_read_bytes == read * 2 + 2 * 4 * 4 * (4 * launched + working)
    assert c.global_write_bytes == tq * (64 * 2 + STAT_BYTES) * 2  # O and lse once per real row
    assert c.kernels[0].grid == 2 * launched


@given(lens=st.lists(st.tuples(st.integers(0, 300), st.integers(0, 300)), min_size=1, max_size=4),
       causal=st.booleans(), window=windows, page=st.sampled_from([1, 16, 48, 64, 128]),
       tiles_=st.sampled_from([(64, 64), (128, 64), (64, 32)]), d=st.sampled_from([64, 128, 256]))
def test_a_paged_cache_moves_the_packed_bytes_plus_the_block_table_entries_each_thread_loads(lens, causal, window,
                                                                                            page, tiles_, d):
    if causal and window is not None:
        window = (window[0], 0)
    tq, tk = sum(n for n, _ in lens), sum(n for _, n in lens)
    if tq == 0 or tk == 0:
        return
    p = AttentionProblem(seq_len=tq, kv_len=tk, heads=4, kv_heads=2, head_dim=d, causal=causal, dtype="bf16")
    packed = closed("flash2", p, tiles(p, *tiles_, window=window, seqlens=lens))
    t = tiles(p, *tiles_, window=window, seqlens=lens, page_size=page)
    c = closed("flash2", p, t)
    assert without_peak(c) == without_peak(walk("flash2", p, t))
    entries = sum(table_loads(n, nk, *tiles_, causal, window, page, d) for n, nk in lens) * p.heads
    assert c.kernels[0].global_read.get("block_table", 0) == 4 * entries
    assert c.global_read_bytes == packed.global_read_bytes + 4 * entries  # K, V, Q, O, lse: the packed call's
    assert c.global_write_bytes == packed.global_write_bytes and c.flops == packed.flops


def test_the_paged_l2_model_adds_the_block_tables_live_sectors_once():
    from iosim.l2.packed import table_sectors

    p = AttentionProblem(seq_len=300, kv_len=3000, heads=8, kv_heads=2, head_dim=128, causal=True, dtype="bf16")
    seqs = [(100, 1000), (100, 1900), (100, 100)]
    t = tiles(p, 64, 64, seqlens=seqs, page_size=16)  # rows of 119 entries: 63 + 119 + 7 live
    assert t.table_width == 119
    # live entries 0-62, 119-237, 238-244: sectors of 8 entries 0-7, 14-29 and 29-30
    assert table_sectors(t, 32) == 8 + 16 + 1
    plain = simulate("flash2", p, seqlens=seqs, block_q=64, block_kv=64)
    paged = simulate("flash2", p, seqlens=seqs, block_q=64, block_kv=64, page_size=16)
    assert paged.hbm_read[0] == plain.hbm_read[0] + 32 * table_sectors(t, 32)
    with pytest.raises(ScheduleError, match="page_size=16 without seqlens"):
        simulate("flash2", p, page_size=16)
    with pytest.raises(ScheduleError, match="page_size=0"):
        simulate("flash2", p, seqlens=seqs, page_size=0)


def test_window_bytes_grow_as_n_times_w_not_n_squared():
    def kv_bytes(N, w):
        p = AttentionProblem(seq_len=N, head_dim=128, causal=True, dtype="bf16")
        c = closed("flash2", p, tiles(p, 128, 64, window=(w - 1, 0)))
        return c.global_read["K"] + c.global_read["V"]

    w = 1024
    a, b, c = kv_bytes(4096, w), kv_bytes(8192, w), kv_bytes(16384, w)
    assert c - b == 2 * (b - a)  # linear in N past the first window
    per_q_tile = (b - a) // (4096 // 128)
    assert per_q_tile == 2 * (w // 64 + 2) * 64 * 128 * 2  # w / Bc + 2 K/V tiles of a 128-row Q tile (alignment)
    p = AttentionProblem(seq_len=16384, head_dim=128, causal=True, dtype="bf16")
    dense = closed("flash2", p, Tiles(128, 64))
    assert c < (dense.global_read["K"] + dense.global_read["V"]) / 7  # N / w = 16: ~8x fewer K/V bytes than causal


def test_no_window_and_an_unbounded_one_count_what_the_dense_schedule_counts():
    p = AttentionProblem(seq_len=1000, kv_len=777, heads=2, head_dim=64)
    dense = closed("flash2", p, Tiles(128, 64))
    assert closed("flash2", p, tiles(p, 128, 64, window=(None, None))) == dense
    pc = AttentionProblem(seq_len=1000, kv_len=777, heads=2, head_dim=64, causal=True)
    assert closed("flash2", p, tiles(p, 128, 64, window=(None, 0))) == closed("flash2", pc, Tiles(128, 64))
    one = closed("flash2", p, tiles(p, 128, 64, seqlens=[(1000, 777)]))
    lengths = {"cu_seqlens_q": 2 * (2 * 8 + 8) * 4 * 4, "cu_seqlens_k": 2 * 2 * 8 * 4 * 4}  # 2 heads x 8 blocks
    assert one.global_read == {**dense.global_read, **lengths}  # one packed sequence: the dense problem, its lengths
    assert one.global_write == dense.global_write and one.total_flops == dense.total_flops


def test_varlen_moves_less_than_the_batch_padded_to_its_longest_sequence():
    lens = [8192] + [512] * 14 + [64]
    p = AttentionProblem(seq_len=sum(lens), heads=16, head_dim=128, causal=True, dtype="bf16")
    packed = closed("flash2", p, tiles(p, 128, 32, seqlens=lens))
    padded = closed("flash2", AttentionProblem(batch=len(lens), seq_len=8192, heads=16, head_dim=128, causal=True,
                                               dtype="bf16"), Tiles(128, 32))
    assert packed.global_bytes < padded.global_bytes / 4
    assert packed.total_flops < padded.total_flops / 4


def test_simulate_takes_window_and_seqlens_with_the_l2_and_time_models_of_each():
    p = AttentionProblem(seq_len=4096, head_dim=128, causal=True)
    r = simulate("flash2", p, window=(511, 0))
    # the L2 model walks the windowed program: K and V once from DRAM (they fit in L2), far less than global
    assert r.hbm_model.startswith("l2-lru") and r.traffic["hbm"]["read_bytes"] < r.traffic["global"]["read_bytes"]
    assert r.time.kernel == "iosim-flash2"  # the fa2 model visits each Q block's K/V range
    assert r.to_json()["tiles_by_pass"]["forward"]["window"] == [511, 0]
    v = simulate("flash2", AttentionProblem(seq_len=300, head_dim=64), seqlens=[100, 200])
    # packed sequences: the L2 model walks the varlen grid as one program, the fa2 model times it
    assert v.hbm_model.startswith("l2-lru over the varlen grid") and v.time.kernel == "iosim-flash2"
    assert v.traffic["hbm"]["read_bytes"] < v.traffic["global"]["read_bytes"]
    assert v.tiles.seqlens == ((100, 100), (200, 200))


@pytest.mark.parametrize("kw,match", [
    (dict(seqlens=[100, 100]), r"seqlens: 2 sequences of 200 queries and 200 keys in all; expected a problem of "
                               r"batch 1 with seq_len=200"),
    (dict(window=(-1, 0)), r"window=\(-1, 0\): expected \(left, right\), each an integer >= 0 or None"),
    (dict(window=(5, 3), causal=True), r"window=\(5, 3\) on a causal problem: causal means right = 0"),
    (dict(seqlens=["a"]), r"seqlens=\['a'\]: expected one length per sequence"),
])
def test_bad_window_and_seqlens_are_errors(kw, match):
    causal = kw.pop("causal", False)
    with pytest.raises(ScheduleError, match=match):
        simulate("flash2", AttentionProblem(seq_len=300, head_dim=64, causal=causal), l2=False, **kw)


def test_other_schedules_and_the_backward_pass_refuse_them():
    p = AttentionProblem(seq_len=256, head_dim=64)
    with pytest.raises(ScheduleError, match=r"naive takes no window .* only flash2's and flash3's forward pass window "
                                            r"and seqlens"):
        simulate("naive", p, window=(8, 0))
    with pytest.raises(ScheduleError, match=r"flash3: window=None, seqlens=\[128, 128\] with fp8"):
        simulate("flash3", p.model_copy(update={"dtype": "fp8"}), seqlens=[128, 128])
    with pytest.raises(ScheduleError, match=r"window, seqlens with pass='both'"):
        simulate("flash2", p, window=(8, 0), pass_="both")


# ------------------------------------------------------------------------------------------------------------------
# flash3's packed sequences (kernels/flash3_fwd.cu, Varlen): whole TMA boxes from each sequence's first row


def flash3_tma_bytes(lens, Br: int, Bc: int, causal: bool, window, d: int, b: int) -> int:
    """Bytes one head's TMA boxes read, as the Varlen kernel issues them (its kv_first / kv_blocks per Q tile of a
    sequence; a box of Br query rows or Bc keys from the sequence's first row, cut only at the packed tensor's end:
    a tile that ends past its sequence reads the next sequence's rows)."""
    tq, tk = sum(n for n, _ in lens), sum(n for _, n in lens)
    left, right = window if window is not None else (None, None)
    local = window is not None
    read, q0, k0 = 0, 0, 0
    for N, Nk in lens:
        lw = min(2**31 - 1 if left is None else left, Nk) if local else 0
        rw = min(2**31 - 1 if right is None else right, N) if local else 0
        for m in range(cdiv(N, Br)):
            n_end = cdiv(Nk, Bc)
            if causal or local:
                last = min((m + 1) * Br, N) - 1 + (Nk - N) + rw
                n_end = min(n_end, 0 if last < 0 else last // Bc + 1)
            n_first = max(0, m * Br + (Nk - N) - lw) // Bc if local else 0
            if n_end <= n_first:
                continue
            read += min(Br, tq - q0 - m * Br) * d * b
            read += sum(2 * min(Bc, tk - k0 - j * Bc) * d * b for j in range(n_first, n_end))
        q0, k0 = q0 + N, k0 + Nk
    return read


@given(lens=st.lists(st.tuples(st.integers(0, 300), st.integers(0, 300)), min_size=1, max_size=5),
       causal=st.booleans(), window=st.one_of(st.none(), st.tuples(st.integers(0, 200), st.integers(0, 50))),
       Bc=st.sampled_from([64, 128]))
def test_flash3_packed_counts_are_the_kernels_whole_boxes_and_its_own_rows_written(lens, causal, window, Bc):
    if window is not None and causal:
        window = (window[0], 0)  # causal means right = 0
    tq, tk = sum(n for n, _ in lens), sum(n for _, n in lens)
    if tq == 0 or tk == 0:
        return
    p = AttentionProblem(seq_len=tq, kv_len=tk, heads=4, kv_heads=2, head_dim=64, causal=causal, dtype="bf16")
    t = resolve_tiles("flash3", p, None, 128, Bc, options=ScheduleOptions(window=window, seqlens=lens))
    c = closed("flash3", p, t)
    assert without_peak(c) == without_peak(walk("flash3", p, t))
    assert c.global_read_bytes == 4 * flash3_tma_bytes(lens, 128, Bc, causal, window, 64, 2)
    assert c.global_write_bytes == 4 * tq * (64 * 2 + STAT_BYTES)  # O and lse of every real row, once
    assert c.kernels[0].name == "flash3_fwd" and c.kernels[0].grid == 4 * sum(cdiv(n, 128) for n, _ in lens)


def test_flash3_one_packed_sequence_moves_what_the_dense_flash3_call_does():
    for causal in (False, True):
        p = AttentionProblem(seq_len=777, kv_len=1000, heads=4, head_dim=128, causal=causal, dtype="bf16")
        packed = simulate("flash3", p, seqlens=[(777, 1000)], l2=False)
        dense = simulate("flash3", p, l2=False)
        assert packed.counts.global_read_bytes == dense.counts.global_read_bytes
        assert packed.counts.global_write_bytes == dense.counts.global_write_bytes
        assert packed.counts.flops == dense.counts.flops
