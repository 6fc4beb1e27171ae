"""flash2's backward kernels in the L2 model: each program, expanded, is the tracer's atomized trace of the schedule's
backward program (both grouped-query designs, either Q-block order); the group sum against a hand count; and where
everything fits in L2 the model's DRAM bytes are the compulsory ones (each tensor's bytes read once from DRAM,
nothing written back), kernel by kernel."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_l2_programs import _same_up_to_numbering

from iosim import AttentionProblem, l2, simulate
from iosim.blocks import cdiv, n_kv_blocks_visible
from iosim.l2.backward import flash2_bwd_programs, group_sum
from iosim.l2.program import expand
from iosim.schedules import Tiles
from iosim.schedules.flash2_bwd import GroupedTiles

H100, H200 = "h100-sxm5-80gb", "h200-sxm-141gb"


@given(n=st.integers(1, 300), nk=st.integers(1, 300), br=st.sampled_from([16, 32, 64]),
       bc=st.sampled_from([16, 32, 48]), causal=st.booleans(), rev=st.booleans(), grouped=st.booleans(),
       group=st.sampled_from([1, 2, 3]))
@settings(max_examples=30, deadline=None)
def test_backward_programs_expanded_equal_the_atomized_trace(n, nk, br, bc, causal, rev, grouped, group):
    p = AttentionProblem.make(seq_len=n, kv_len=nk, head_dim=32, heads=group, kv_heads=1, causal=causal)
    t = GroupedTiles(br, bc) if grouped else Tiles(br, bc)
    order = "reverse" if rev else "forward"
    traces = l2.trace_program("flash2", p, t, order, pass_="backward")
    progs = flash2_bwd_programs(p, t, order)
    assert [q.name for q in progs[:3]] == [kt.name for kt in traces]
    for prog, kt in zip(progs, traces):
        _same_up_to_numbering(prog, kt, p)
    assert {q.unit for q in progs[:3]} == {"kv_head" if grouped else "head"}


def test_group_sum_program_by_hand():
    """3 query heads a kv head, 300 keys (blocks of 128, 128, 44), d = 32, fp16: each block reads the three copies
    of dK's rows, then of dV's, and writes the two sums."""
    p = AttentionProblem.make(seq_len=10, kv_len=300, head_dim=32, heads=3, kv_heads=1)
    prog = group_sum(p)
    row = 32 * 2
    assert prog.global_read == 2 * 3 * 300 * row and prog.global_write == 2 * 300 * row
    ptr, atom, _, write = expand(prog)
    assert list(ptr) == [0, 8, 16, 24] and list(write[:8]) == [False] * 6 + [True] * 2
    assert [int(prog.atom_bytes[a]) for a in atom[16:24]] == [44 * row] * 8
    assert [prog.atom_tensor[a] for a in atom[:8]] == [l2.TENSOR_CODES[t] for t in ["dK"] * 3 + ["dV"] * 3 + ["dK", "dV"]]


def _compulsory(p: AttentionProblem, t, name: str, grouped: bool) -> tuple[int, int]:
    """Bytes of each tensor once: what a kernel moves across DRAM when all of it fits in L2 and its
    writes stay in L2 (dirty at the end, not counted). The main kernel reads the rows of the Q blocks that see a key
    (causal with seq_len > kv_len: the first rows see none, their blocks are never visited)."""
    e, d, R, Rk = p.elem_bytes, p.head_dim, p.batch * p.heads * p.seq_len, p.batch * p.kv_heads * p.kv_len
    kv_copies = Rk if grouped else p.batch * p.heads * p.kv_len
    Br, N = t.block_q, p.seq_len
    seen = sum(min(Br, N - i * Br) for i in range(cdiv(N, Br))
               if n_kv_blocks_visible(i, Br, t.block_kv, N, p.kv_len, p.causal) > 0)
    Rv = p.batch * p.heads * seen
    # (DRAM read, DRAM written, distinct bytes written: dirty in L2 at the end)
    return {"flash2_bwd_preprocess": (2 * R * d * e, 0, R * 4 + R * d * 4),
            "flash2_bwd": (2 * Rk * d * e + 2 * Rv * d * e + 2 * Rv * 4 + Rv * d * 4, 0, Rv * d * 4 + 2 * kv_copies * d * e),
            "flash2_bwd_convert_dq": (R * d * 4, 0, R * d * e),
            "bwd_dkdv_group_sum": (2 * kv_copies * d * e, 0, 2 * Rk * d * e)}[name]


@pytest.mark.parametrize("gqa", ["grouped", "expand"])
@pytest.mark.parametrize("kw", [dict(heads=4, seq_len=1000, kv_len=777, head_dim=64, causal=True),
                                dict(heads=8, kv_heads=2, seq_len=512, head_dim=128, dtype="bf16"),
                                dict(batch=2, heads=4, kv_heads=1, seq_len=300, kv_len=1200, head_dim=64, causal=True)])
def test_everything_fits_in_l2_dram_bytes_are_compulsory(gqa, kw):
    """No foreign dirty lines at the start (an input of the profile's, tested elsewhere): every tensor is read from
    DRAM once, nothing evicted, so nothing written."""
    p = AttentionProblem.make(**kw)
    x = l2.L2Inputs(dirty_at_start=0)
    r = simulate("flash2", p, H200, pass_="backward", gqa=gqa, l2=False)
    res = l2.simulate_l2("flash2", p, r.tiles, H200, x, pass_="backward")
    assert [k.name for k in res.kernels] == [k.name for k in r.counts.kernels]
    for k in res.kernels:
        assert (k.dram_read, k.dram_write, k.dirty_at_end) == _compulsory(p, r.tiles, k.name, gqa == "grouped"), k.name


def test_simulate_backward_and_both_take_hbm_from_the_l2_model():
    p = AttentionProblem.make(heads=8, seq_len=2048, head_dim=64, causal=True)
    back = simulate("flash2", p, H100, pass_="backward", gqa="grouped")
    both = simulate("flash2", p, H100, pass_="both", gqa="grouped")
    fwd = simulate("flash2", p, H100)
    assert back.hbm_model.startswith("l2-lru") and both.hbm_model.startswith("l2-lru")
    assert both.hbm_read == fwd.hbm_read + back.hbm_read and both.hbm_write == fwd.hbm_write + back.hbm_write
    assert back.traffic["hbm"]["read_bytes"] < back.traffic["global"]["read_bytes"]


def test_backward_of_other_schedules_says_why_not():
    r = simulate("naive", AttentionProblem.make(seq_len=256, head_dim=64), H100, pass_="backward")
    assert r.hbm_model.startswith("none:") and "flash2 and flash3 only" in r.hbm_model


def test_flash3_backward_moves_flash2_grouped_traffic_through_its_own_launch():
    """kernels/flash3_bwd.cu reads and writes what flash2's grouped design does (iosim/schedules/flash3_bwd.py);
    its launch (384 threads, its shared memory) goes to the L2 model, and the main kernel keeps its name."""
    p = AttentionProblem.make(batch=2, heads=8, kv_heads=2, seq_len=1000, head_dim=128, causal=True)
    f3 = simulate("flash3", p, H100, pass_="backward")
    f2 = simulate("flash2", p, H100, pass_="backward", gqa="grouped", block_q=64, block_kv=128)
    assert [k.name for k in f3.l2.kernels] == ["flash2_bwd_preprocess", "flash3_bwd", "flash2_bwd_convert_dq"]
    assert f3.l2.launch.kernels[1].threads == 384 and f2.l2.launch.kernels[1].threads == 256
    assert f3.traffic["global"] == f2.traffic["global"]
    e, d = p.elem_bytes, p.head_dim
    once = 2 * p.batch * (p.heads * p.seq_len + p.kv_heads * p.kv_len) * d * e  # Q, dO, K, V, each read once at least
    assert sum(f3.hbm_read) >= once
