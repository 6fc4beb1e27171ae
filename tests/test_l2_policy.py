"""The L2 model's measured-policy parts, each against a number derived by hand:

* room per kind of line (``room``: private clean, shared clean, dirty) and dirty lines present at the start
  (``dirty_at_start``), on the probe kernels' access streams (iosim.l2.probes);
* block drift (``block_share``): co-resident blocks of one SM progress at different rates, older first.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from iosim import l2
from iosim.l2.cache import _set_sm_rates
from iosim.l2.probes import CHUNK, probe_trace, simulate_probe
from iosim.problem import AttentionProblem
from iosim.profile import SourcedCount, get_profile
from iosim.schedules import Tiles

MiB = 1 << 20
C = 8 * MiB  # a small L2 for the hand-derived cases
PROF = "h100-sxm5-80gb"


def probe(w, r=0, **kw):
    return simulate_probe(w, r, PROF, capacity=C, block_share=1.0, **kw)


@pytest.mark.parametrize("dirty_room", [1.0, 2.0, 2.125])
def test_dirty_lines_take_their_room(dirty_room):
    """Writing W > L2 bytes keeps C / dirty_room of them in L2 and writes the rest back (to a chunk)."""
    res = probe(16 * MiB, room=(1.0, 1.0, dirty_room))
    kept = C / dirty_room
    assert abs(res.write_bytes - (16 * MiB - kept)) <= CHUNK
    assert res.read_bytes == 0


@pytest.mark.parametrize(
    "size_mib,private_room,second_pass_hits", [(5, 1.5, True), (6, 1.5, False), (7, 1.0, True)]
)
def test_private_room_decides_whether_a_reread_hits(size_mib, private_room, second_pass_hits):
    """Reading B bytes twice (one SM per line): the second pass hits iff B x private_room fits in L2 (cyclic LRU
    misses everything otherwise)."""
    b = size_mib * MiB
    res = probe(0, b, reread=True, room=(private_room, 2.0, 1.0))
    assert res.read_bytes == (b if second_pass_hits else 2 * b)


@pytest.mark.parametrize("read_mib,evicted", [(3, False), (4, True)])
def test_lines_every_sm_reads_take_shared_room(read_mib, evicted):
    """1 MiB dirty, then R bytes read by every SM at shared room 2: the dirty bytes stay iff 1 + 2R <= 8 MiB."""
    res = probe(1 * MiB, read_mib * MiB, shared=True, room=(1.0, 2.0, 1.0))
    assert res.write_bytes == (1 * MiB if evicted else 0)
    same_private = probe(1 * MiB, read_mib * MiB, shared=False, room=(1.0, 2.0, 1.0))
    assert same_private.write_bytes == 0  # 1 + R <= 8 MiB: the same bytes read by one SM each fit


def test_dirty_lines_present_at_start_are_written_back_when_evicted():
    init = 100_000
    small = probe(0, 4 * MiB, room=(1.0, 1.0, 1.0), dirty_at_start=init)
    big = probe(0, 16 * MiB, room=(1.0, 1.0, 1.0), dirty_at_start=init)
    assert small.write_bytes == 0
    assert big.write_bytes == init
    assert big.kernels[0].write_by_tensor == {"foreign": init}
    assert big.kernels[0].dirty_at_end == 0  # the kernel wrote nothing


def test_probe_trace_moves_the_probe_bytes():
    kt, _ = probe_trace(3 * MiB, 5 * MiB, shared=True, sms=4)
    rows = kt.r1 - kt.r0
    assert (rows[kt.write] * 256).sum() == 3 * MiB
    assert (rows[~kt.write] * 256).sum() == 4 * 5 * MiB  # every one of the 4 SMs reads all of it


def test_interleaved_probe_reads_then_writes_in_each_step_until_both_are_done():
    kt, _ = probe_trace(2 * CHUNK * 4, 4 * CHUNK * 4, interleave=True, sms=4)  # 8 chunks written, 16 read
    rows = kt.r1 - kt.r0
    assert (rows[kt.write] * 256).sum() == 8 * CHUNK
    assert (rows[~kt.write] * 256).sum() == 16 * CHUNK  # each chunk by one SM
    b0 = slice(kt.ptr[0], kt.ptr[1])  # SM 0: chunks 0, 4, 8, 12 read; 0, 4 written right after their reads
    assert kt.write[b0].tolist() == [False, True, False, True, False, False]
    assert (kt.r0[b0] // (CHUNK // 256)).tolist() == [0, 0, 4, 4, 8, 12]
    # the room a dirty line takes shows in what the reads beside it push out
    # (L2 of 8 MiB; 8 MiB written beside 8 MiB read: a plain LRU keeps the last 4 MiB of each, so 4 MiB of the
    # writes go back; dirty lines at twice the room keep 8/3 MiB of each, so 16/3 MiB go back)
    plain = probe(8 * MiB, 8 * MiB, interleave=True, room=(1.0, 1.0, 1.0), sms=4)
    heavy = probe(8 * MiB, 8 * MiB, interleave=True, room=(1.0, 1.0, 2.0), sms=4)
    assert plain.write_bytes == pytest.approx(4 * MiB, rel=0.02)
    assert heavy.write_bytes == pytest.approx(16 / 3 * MiB, rel=0.02)
    assert plain.read_bytes == heavy.read_bytes == 8 * MiB


def test_read_back_probe_reads_each_chunk_it_wrote_after_all_the_writes():
    kt, _ = probe_trace(8 * CHUNK, 0, read_written=True, sms=4)
    b0 = slice(kt.ptr[0], kt.ptr[1])  # SM 0 writes chunks 0 and 4, then reads them back
    assert kt.write[b0].tolist() == [True, True, False, False]
    assert (kt.r0[b0] // (CHUNK // 256)).tolist() == [0, 4, 0, 4]
    assert set(kt.tensor.tolist()) == {l2.TENSOR_CODES["O"]}


def test_reuse_probe_trace_reads_the_buffer_k_times_then_other_data_then_the_buffer():
    kt, _ = probe_trace(0, 4 * CHUNK, hot_bytes=8 * CHUNK, hot_reps=2, sms=4)
    # SM 0: its chunks 0 and 4 of the buffer twice, chunk 0 of V, the buffer again
    b0 = slice(kt.ptr[0], kt.ptr[1])
    rows = CHUNK // 256
    assert (kt.r0[b0] // rows).tolist() == [0, 4, 0, 4, 0, 0, 4]
    q, v = l2.TENSOR_CODES["Q"], l2.TENSOR_CODES["V"]
    assert kt.tensor[b0].tolist() == [q, q, q, q, v, q, q]
    assert not kt.write.any()
    shared, _ = probe_trace(0, 4 * CHUNK, hot_bytes=8 * CHUNK, shared=True, sms=4)
    # every SM reads all 8 chunks of K, its chunk of V, all of K again
    b1 = slice(shared.ptr[1], shared.ptr[2])
    assert (shared.r0[b1] // rows).tolist() == [*range(8), 1, *range(8)]
    with pytest.raises(ValueError, match="hot_bytes"):
        probe_trace(CHUNK, 0, hot_bytes=CHUNK)
    grouped, _ = probe_trace(0, 0, hot_bytes=8 * CHUNK, group=2, sms=4)
    for b in range(4):  # SMs 0 and 1 read chunks 0, 2, 4, 6; SMs 2 and 3 chunks 1, 3, 5, 7; twice
        mine = list(range(b // 2, 8, 2))
        assert (grouped.r0[grouped.ptr[b] : grouped.ptr[b + 1]] // rows).tolist() == mine + mine
    with pytest.raises(ValueError, match="group=3"):
        probe_trace(0, 0, hot_bytes=CHUNK, group=3, sms=4)


@pytest.mark.parametrize("other_mib", [2, 5, 8])
def test_reuse_probe_in_an_lru_does_not_depend_on_how_often_the_buffer_was_read(other_mib):
    """An LRU keeps what was touched last: a 2 MiB buffer read once or four times, then other data, is dropped alike.
    L2 of 8 MiB, every line room 1: the buffer (2 MiB) and up to 6 MiB of other data fit; at 8 MiB of other data
    the buffer's lines are pushed out (in order) before it is read again, and reading it again misses on all of it."""
    kw = {"room": (1.0, 1.0, 1.0), "dirty_at_start": 0, "sms": 4, "hot_bytes": 2 * MiB}
    once, four = (probe(0, other_mib * MiB, hot_reps=k, **kw) for k in (1, 4))
    assert once.read_bytes == four.read_bytes
    again = once.read_bytes - (2 + other_mib) * MiB
    assert again == (2 * MiB if other_mib + 2 > 8 else 0)


def test_dirty_limit_writes_back_the_oldest_dirty_lines_and_keeps_them_clean():
    """L2 of 8 MiB, dirty lines at twice the room, at most 2 MiB dirty. Writing 6 MiB: all but the last 2 MiB go
    back as they pass the limit and stay, clean: 2 x 2 + 4 x 1 = 8 MiB of room, nothing is evicted, and reading the
    6 MiB back costs no DRAM read. Without the limit the same writes take 12 MiB of room: 2 MiB are evicted, and
    reading back from the start misses on them and pushes out what comes next."""
    kw = {"room": (1.0, 1.0, 2.0), "dirty_at_start": 0, "sms": 4}
    limited = probe(6 * MiB, read_written=True, dirty_limit=2 * MiB, **kw)
    assert limited.write_bytes == 4 * MiB
    assert limited.read_bytes == 0
    assert limited.kernels[0].dirty_at_end == 2 * MiB
    unlimited = probe(6 * MiB, read_written=True, dirty_limit=0, **kw)
    assert unlimited.read_bytes >= 2 * MiB
    assert unlimited.write_bytes >= 2 * MiB
    # what the limit writes back counts once: writing 12 MiB with room for all of it leaves 2 MiB dirty
    big = probe(12 * MiB, dirty_limit=2 * MiB, room=(1.0, 1.0, 1.0), dirty_at_start=0, sms=4)
    assert (big.write_bytes, big.kernels[0].dirty_at_end) == (10 * MiB, 2 * MiB)


@pytest.mark.parametrize("dirty_room", [1.0, 2.0])
def test_dirty_limit_in_the_soft_edge_variant(dirty_room):
    """The stack-distance variant with a curve that misses nothing within 8 MiB of room and everything past it: 6
    MiB written under a 2 MiB limit send 4 MiB back, which stay (clean, room 1): reading the 6 MiB back misses
    nothing, with dirty lines at room 1 or 2 (at most 2 x 2 + 4 = 8 MiB of room). Without the limit and at room 2,
    the first lines written are 12 MiB of room behind when read back: all of them miss, and go back first."""
    curve = [(0.0, 0.0), (8.0 * MiB, 0.0), (8.0 * MiB + 1, 1.0), (64.0 * MiB, 1.0)]
    kw = {
        "room": (1.0, 1.0, dirty_room),
        "dirty_at_start": 0,
        "sms": 4,
        "miss_curve": curve,
        "partitions": False,
    }
    limited = probe(6 * MiB, read_written=True, dirty_limit=2 * MiB, **kw)
    assert limited.write_bytes == 4 * MiB
    assert limited.read_bytes == 0
    assert limited.kernels[0].dirty_at_end == 2 * MiB
    unlimited = probe(6 * MiB, read_written=True, dirty_limit=0, **kw)
    if dirty_room == 1.0:
        assert (unlimited.write_bytes, unlimited.read_bytes) == (0, 0)
    else:
        assert unlimited.read_bytes >= 2 * MiB and unlimited.write_bytes >= 2 * MiB


def test_clean_ahead_writes_back_dirty_lines_before_the_curve_evicts_them():
    """Curve: nothing missed within 8 MiB of room, everything past it. 6 MiB written (room 1) all fit. Read back in
    the order written, each chunk is 6 MiB of room behind at its re-read (the chunks written after it, then those
    read back before it): past 8 - 4 MiB, so with clean_ahead 4 MiB all of it goes back, and stays (no read
    misses). Written and read back at 3 MiB, within 4: nothing goes back."""
    curve = [(0.0, 0.0), (8.0 * MiB, 0.0), (8.0 * MiB + 1, 1.0), (64.0 * MiB, 1.0)]
    kw = {"room": (1.0, 1.0, 1.0), "dirty_at_start": 0, "sms": 4, "miss_curve": curve, "partitions": False}
    plain = probe(6 * MiB, read_written=True, **kw)
    ahead = probe(6 * MiB, read_written=True, clean_ahead=4.0 * MiB, **kw)
    assert plain.read_bytes == ahead.read_bytes == 0
    assert plain.write_bytes == 0 and plain.kernels[0].dirty_at_end == 6 * MiB
    assert ahead.write_bytes == 6 * MiB and ahead.kernels[0].dirty_at_end == 0
    assert ahead.to_json()["clean_ahead_bytes"] == 4 * MiB and "ahead of eviction" in ahead.describe()
    short = probe(3 * MiB, read_written=True, clean_ahead=4.0 * MiB, **kw)
    assert (short.write_bytes, short.read_bytes) == (0, 0)
    with pytest.raises(l2.L2ModelError, match="clean_ahead"):
        probe(MiB, clean_ahead=MiB)  # the hard edge has no curve to clean ahead on


def test_dirty_limit_is_not_in_the_two_partition_model_and_not_negative():
    with pytest.raises(l2.L2ModelError, match="dirty_limit"):
        probe(MiB, dirty_limit=MiB, partitions=True)
    with pytest.raises(l2.L2ModelError, match="dirty_limit"):
        probe(MiB, dirty_limit=-1)


def test_sm_rates_are_shares_by_age():
    n_sms, n_slots = 2, 6  # slots 0, 2, 4 on SM 0
    live = np.array([True, True, True, False, True, True])
    age = np.array([5, 0, 2, 9, 7, 1], dtype=np.int64)
    rate = np.zeros(n_slots)
    _set_sm_rates(0, n_sms, n_slots, live, age, rate, 0.5, np.zeros(0))
    # SM 0 holds ages 5 (slot 0), 2 (slot 2), 7 (slot 4): ranks 1, 0, 2; shares 1 : 0.5 : 0.25
    assert rate[[2, 0, 4]] == pytest.approx(np.array([1, 0.5, 0.25]) / 1.75)
    _set_sm_rates(1, n_sms, n_slots, live, age, rate, 0.5, np.zeros(0))
    assert rate[[1, 5]] == pytest.approx([1 / 1.5, 0.5 / 1.5])  # ages 0 and 1; slot 3 is not live


def _two_blocks_one_sm(share, chunks=200, cap_chunks=16, block_rate=None):
    """Two blocks on one SM, each reading the same K chunks 0..chunks-1 in order; DRAM reads in chunks."""
    rows = CHUNK // 256
    per_block = [(1, j * rows, (j + 1) * rows, False) for j in range(chunks)]
    flat = np.array(per_block * 2, dtype=np.int64)
    z = np.zeros(len(flat), dtype=np.int64)
    kt = l2.KernelTrace(
        "two",
        np.array([0, chunks, 2 * chunks]),
        flat[:, 0].astype(np.int8),
        flat[:, 1],
        flat[:, 2],
        z,
        z,
        flat[:, 3].astype(bool),
    )
    prof = get_profile(PROF)
    prof = prof.model_copy(update={"sm_count": SourcedCount(value=1, source="test: one SM")})
    p = AttentionProblem(seq_len=chunks * rows, heads=1, head_dim=128, dtype="fp16")
    res = l2.simulate_l2(
        "flash2",
        p,
        Tiles(rows, rows),
        prof,
        traces=[kt],
        resident=2,
        capacity=cap_chunks * CHUNK,
        block_share=share,
        block_rate=block_rate,
    )
    assert res.timeline == (block_rate is not None)
    return res.read_bytes // CHUNK


def test_lockstep_blocks_share_every_chunk():
    assert _two_blocks_one_sm(1.0) == 200


def test_drifting_blocks_miss_once_the_lag_exceeds_l2():
    """Shares 2/3 and 1/3 (block_share 0.5): when block 1 reaches chunk j, block 0 read it j/2 of block 1's reads
    ago and has read j newer chunks since, so its stack distance is 1.5 j chunks: a hit iff 1.5 j < 16, for
    j = 0..10. After block 0 ends (block 1 at chunk 100) the rest misses too: 200 + 189 reads, give or take a
    round of the credit scheme."""
    assert 389 - 2 <= _two_blocks_one_sm(0.5) <= 389 + 2


def test_a_replayed_timeline_of_equal_rates_is_lockstep():
    assert _two_blocks_one_sm(0.5, block_rate=[1.0, 1.0]) == 200


def test_a_replayed_timeline_sets_each_blocks_rate_whatever_runs_beside_it():
    """Block 0 at one access per round, block 1 at half (the shares ignored): the speeds 2 : 1 of block_share 0.5,
    so the same count as test_drifting_blocks_miss_once_the_lag_exceeds_l2 (block 1's reuse of chunk j at stack
    distance 1.5 j), give or take a round."""
    assert 389 - 2 <= _two_blocks_one_sm(1.0, block_rate=[1.0, 0.5]) <= 389 + 2


@pytest.mark.parametrize("rates", [[1.0], [1.0, 0.0], [1.0, 1.5]])
def test_a_replayed_timeline_needs_a_rate_in_0_1_per_block(rates):
    with pytest.raises(l2.L2ModelError, match="block_rate"):
        _two_blocks_one_sm(0.5, block_rate=rates)


def test_timeline_rates_are_the_fastest_duration_over_each():
    assert l2.timeline_rates([0, 10, 5], [100, 60, 205]).tolist() == [0.5, 1.0, 0.25]
    with pytest.raises(l2.L2ModelError, match="positive duration"):
        l2.timeline_rates([0, 10], [100, 10])


def test_timeline_rates_under_a_mask_count_each_blocks_own_accesses():
    # block 1 makes 3x the accesses of block 0 in 2x the time: it is the faster one
    assert l2.timeline_rates([0, 0], [100, 200], work=[10, 30]).tolist() == pytest.approx([2 / 3, 1.0])
    with pytest.raises(l2.L2ModelError, match="access count"):
        l2.timeline_rates([0, 0], [100, 200], work=[10])


def test_block_accesses_are_in_launch_order_over_every_head():
    p = AttentionProblem.make(seq_len=1024, heads=2, head_dim=64, causal=True)
    t = Tiles(128, 64)
    kt = l2.head_program("flash2", p, t)[0]
    per_block = np.diff(kt.ptr)  # program order: Q tile 0 sees the fewest keys
    got = l2.block_accesses("flash2", p, t)
    # the causal kernel launches its Q tiles last-first (kernels/flash_fwd.cu), the same for each head
    assert got.tolist() == per_block[::-1].tolist() * 2
    assert got[0] > got[7]
    # each K/V tile visited is two accesses (K and V), plus Q, O and lse of the block
    assert (got[:8] - 3).tolist() == [2 * (1024 - 128 * i) // 64 for i in range(8)]
    full = l2.block_accesses("flash2", AttentionProblem.make(seq_len=1024, heads=2, head_dim=64), t)
    assert set(full.tolist()) == {3 + 2 * 1024 // 64}


def test_the_h200_profile_carries_the_measured_inputs_and_results_say_which_were_used():
    p = AttentionProblem(seq_len=1024, heads=2, head_dim=64, dtype="fp16")
    h200 = l2.simulate_l2("flash2", p, Tiles(128, 64), "h200-sxm-141gb")
    j = h200.to_json()
    prof = get_profile("h200-sxm-141gb")
    assert prof.l2_room() != (1.0, 1.0, 1.0) and prof.l2_dirty_at_start() > 0 and prof.block_share() < 1.0
    assert j["block_share"] == prof.block_share() == 0.851
    assert tuple(j["room"].values()) == prof.l2_room()
    assert j["dirty_at_start_bytes"] == prof.l2_dirty_at_start()
    assert j["placement"] == "assumed"  # the built-in profile has no sm.topology
    assert "block share 0.851" in h200.describe() and "dirty at start" in h200.describe()
    plain = l2.simulate_l2("flash2", p, Tiles(128, 64), PROF)  # no measured inputs: a plain LRU in lockstep
    assert plain.to_json()["block_share"] == 1.0 and plain.describe().endswith("blocks resident")


def test_a_profiles_dirty_limit_is_the_default_and_results_say_so():
    from iosim.profile import SourcedBytes

    base = get_profile(PROF)
    assert base.l2_dirty_limit() == 0  # absent: no limit
    l2_part = base.l2.model_copy(update={"dirty_limit": SourcedBytes(value=2 * MiB, source="test: 2 MiB")})
    prof = base.model_copy(update={"memory": [base.dram, l2_part, base.smem, base.registers]})
    assert prof.l2_dirty_limit() == 2 * MiB
    kw = {"capacity": C, "block_share": 1.0, "room": (1.0, 1.0, 1.0), "dirty_at_start": 0, "sms": 4}
    res = simulate_probe(12 * MiB, 0, prof, **kw)
    assert (res.write_bytes, res.dirty_limit) == (10 * MiB, 2 * MiB)  # the limit, as in the hand-derived case
    assert res.to_json()["dirty_limit_bytes"] == 2 * MiB and "at most 2,097,152 B dirty" in res.describe()
    assert simulate_probe(12 * MiB, 0, prof, dirty_limit=0, **kw).write_bytes == 4 * MiB  # 0 turns it off


def test_the_h200_dirty_lines_at_start_are_run_10s_read_probe():
    """The profiles' dirty_at_start is what their source says: the mean DRAM writes of the read-only probe at
    48 MiB and up in docs/validation/raw/run10 (medians of its repeats), as benchmarks/fit_l2_inputs.py takes it."""
    import json
    import statistics

    root = Path(__file__).resolve().parents[1]
    configs = json.loads((root / "docs/validation/raw/run10/measured_probes.json").read_text())["configs"]
    by_size: dict[int, list[int]] = {}
    for e in configs:
        c = e["config"]
        if c["kind"] == "l2probe" and c["nbytes"] >= 48 * MiB and e.get("measured"):
            by_size.setdefault(c["nbytes"], []).append(e["measured"]["dram_write_bytes"])
    assert len(by_size) == 4 and all(len(v) == 3 for v in by_size.values())
    mean = int(np.mean([statistics.median(v) for v in by_size.values()]))
    for name in ("h200-sxm-141gb", str(root / "docs/validation/h200-sxm-141gb-measured.yaml")):
        assert get_profile(name).l2_dirty_at_start() == mean


def test_miss_curve_variant_with_a_step_curve_keeps_what_the_lru_keeps():
    """The stack-distance variant weighs atoms by their room too: with a step curve at the capacity it keeps
    C / dirty_room of a write-only stream, like the LRU."""
    step = [(C - 1.0, 0.0), (float(C), 1.0)]  # in room bytes
    for dirty_room in (1.0, 2.0):
        sd = probe(16 * MiB, room=(1.0, 1.0, dirty_room), miss_curve=step)
        assert abs(sd.write_bytes - (16 * MiB - C / dirty_room)) <= 2 * CHUNK
    init = probe(0, 16 * MiB, room=(1.0, 1.0, 1.0), dirty_at_start=100_000, miss_curve=step)
    assert abs(init.write_bytes - 100_000) <= 1  # the foreign lines are far past the step


def _placed_probe(dispatch):
    """1 MiB dirty, then 4 MiB that each of 4 blocks reads whole, on an 8-SM chip whose SMs 0-3 share one L2
    partition and 4-7 the other; room (1, 2, 1) in 8 MiB: the dirty MiB stays iff the reads are private
    (1 + 4 <= 8), and is written back iff they are shared (1 + 2 x 4 > 8)."""
    from iosim.profile import SMTopology

    prof = get_profile(PROF).model_copy(update={"sm_count": SourcedCount(value=8, source="test: eight SMs")})
    topo = SMTopology(l2_partition=[0, 0, 0, 0, 1, 1, 1, 1], dispatch={1: dispatch}, source="test")
    res = simulate_probe(
        1 * MiB,
        4 * MiB,
        prof,
        shared=True,
        sms=4,
        capacity=C,
        block_share=1.0,
        room=(1.0, 2.0, 1.0),
        topology=topo,
    )
    return res


def test_measured_placement_decides_which_lines_are_shared():
    one_side = _placed_probe([0, 1, 2, 3, 4, 5, 6, 7])  # blocks 0-3 on SMs 0-3: one partition
    both = _placed_probe([0, 4, 1, 5, 2, 6, 3, 7])  # blocks on SMs 0, 4, 1, 5: both partitions
    assert one_side.write_bytes == 0 and both.write_bytes == 1 * MiB
    assert both.to_json()["placement"] == "measured" and "measured block placement" in both.describe()


def test_topology_must_name_every_sm_its_blocks_per_sm_times():
    from iosim.profile import SMTopology

    with pytest.raises(ValueError, match="exactly 2 times"):
        SMTopology(l2_partition=[0, 1], dispatch={2: [0, 1, 1, 1]}, source="test")
    with pytest.raises(ValueError, match="both partitions"):
        SMTopology(l2_partition=[0, 0], dispatch={}, source="test")


def _two_part(w, r, sms, **kw):
    """The two-partition L2 on a probe, 8-SM chip (SMs 0-3 near partition 0), 8 MiB: two halves of 4 MiB."""
    prof = get_profile(PROF).model_copy(update={"sm_count": SourcedCount(value=8, source="test: eight SMs")})
    return simulate_probe(w, r, prof, sms=sms, capacity=C, block_share=1.0, partitions=True, **kw)


@pytest.mark.parametrize("size_mib,missed", [(3, 0.0), (5, 0.5)])
def test_two_partitions_one_partitions_readers_fill_half_the_l2(size_mib, missed):
    """Readers on SMs 0-3 only: their partition holds all B (its half, and copies of the other half). B = 3 MiB fits
    4 MiB: the second pass hits. B = 5 MiB does not: the lines homed near miss (a cyclic LRU keeps none), the lines
    homed across hit at their home (2.5 MiB there): exactly half misses."""
    b = size_mib * MiB
    res = _two_part(0, b, 4, reread=True, room=(1.0, 1.0, 1.0))
    assert res.read_bytes - b == pytest.approx(missed * b, abs=CHUNK)


@pytest.mark.parametrize("size_mib,missed", [(5, 0.0), (6, 1.0)])
def test_two_partitions_every_sms_own_lines_take_three_quarters_of_each_half(size_mib, missed):
    """Each of 8 SMs reads its own lines twice: a partition holds its SMs' B / 2 and the home copies of the other
    SMs' lines homed there, B / 4. 0.75 x 5 MiB fits 4 MiB; 0.75 x 6 MiB does not (then nothing is kept)."""
    b = size_mib * MiB
    res = _two_part(0, b, 8, reread=True, room=(1.0, 1.0, 1.0))
    assert res.read_bytes - b == pytest.approx(missed * b, abs=2 * CHUNK)


@pytest.mark.parametrize("writers", [4, 8])
def test_two_partitions_dirty_lines_live_at_home_whoever_writes(writers):
    """16 MiB written at dirty room 2: each 4 MiB half keeps 2 MiB dirty, 4 MiB in all, from one partition's SMs or
    from all (the measured probe: 29.3 vs 29.4 MB)."""
    res = _two_part(16 * MiB, 0, writers, room=(1.0, 1.0, 2.0))
    assert abs(res.write_bytes - 12 * MiB) <= 2 * CHUNK


def test_profile_l2_partitions_selects_the_two_partition_model():
    base = get_profile(PROF)
    two = base.model_copy(
        update={
            "memory": [
                base.memory[0],
                base.l2.model_copy(update={"partitions": SourcedCount(value=2, source="t")}),
                *base.memory[2:],
            ]
        }
    )
    p = AttentionProblem(seq_len=1024, heads=2, head_dim=64, dtype="fp16")
    assert l2.simulate_l2("flash2", p, Tiles(128, 64), two).to_json()["model"] == "l2-lru-2p"
    assert l2.simulate_l2("flash2", p, Tiles(128, 64), two, partitions=False).to_json()["model"] == "l2-lru"
    with pytest.raises(l2.L2ModelError, match="one-pool model"):
        l2.simulate_l2("flash2", p, Tiles(128, 64), two, miss_curve=[(0.0, 0.0), (1.0, 1.0)])
    with pytest.raises(ValueError, match="1 or 2 partitions"):
        type(base.l2).model_validate({**base.l2.model_dump(), "partitions": {"value": 3, "source": "t"}})
