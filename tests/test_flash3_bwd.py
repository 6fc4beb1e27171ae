"""The flash3 backward without a GPU: its simulator schedule (what kernels/flash3_bwd.cu moves) and its build lists.

The schedule's tile walk equals its closed form and its numeric execution equals a float64 gradient through the
parametrized tests of test_backward.py (they run every schedule in ``BACKWARD``); here: the counts are flash2's
grouped design with the main kernel renamed, the per-tensor closed forms of the kernel's loads and reduce-adds, and
the schedule's tiles and shared memory are the kernel's (iosim/launch/backward.py).
"""

from __future__ import annotations

import re

import pytest
from helpers import problems_and_tiles
from hypothesis import given
from hypothesis import strategies as st

from iosim import AttentionProblem, launch, simulate
from iosim._resources import kernels_dir
from iosim.blocks import cdiv
from iosim.gpu import build, flash3_host
from iosim.schedules import BACKWARD, flash3_bwd
from iosim.schedules.flash2_bwd import GroupedTiles
from iosim.simulate import closed, walk


@given(case=problems_and_tiles(max_len=200, head_dims=(8, 16, 64), max_tile=64), group=st.integers(1, 4))
def test_flash3_backward_moves_flash2_grouped_traffic_in_a_kernel_of_its_own(case, group):
    p, t = case
    p = p.model_copy(update={"heads": p.kv_heads * group})
    f3, f2 = closed("flash3", p, t, "backward"), closed("flash2", p, GroupedTiles(t.block_q, t.block_kv), "backward")
    assert [k.name for k in f3.kernels] == ["flash2_bwd_preprocess", "flash3_bwd", "flash2_bwd_convert_dq"]
    for a, b in zip(f3.kernels, f2.kernels, strict=True):
        assert (a.global_read, a.global_write, a.flops, a.grid) == (b.global_read, b.global_write, b.flops, b.grid)
    assert walk("flash3", p, t, "backward").global_bytes == f3.global_bytes


@pytest.mark.parametrize("N,Nk,H,Hk,d", [(4096, 4096, 16, 16, 128), (1000, 777, 8, 2, 64), (77, 300, 4, 1, 128)])
def test_flash3_backward_counts_k_v_once_q_do_per_visit_and_each_reduce_add_as_a_read_and_a_write(N, Nk, H, Hk, d):
    B, b = 2, 2
    p = AttentionProblem(batch=B, heads=H, kv_heads=Hk, seq_len=N, kv_len=Nk, head_dim=d, dtype="bf16")
    r = simulate("flash3", p, pass_="backward")
    Br, Bc = r.tiles.block_q, r.tiles.block_kv
    assert (Br, Bc) == launch.FLASH3_BWD_TILES[d]
    main = r.counts.kernels[1]
    Tc = cdiv(Nk, Bc)
    visits = B * H * Tc * N  # rows of Q_i (and dO_i, L_i, D_i, dQacc) the K/V blocks visit (no mask)
    assert main.grid == B * Hk * Tc
    assert main.global_read["K"] == main.global_read["V"] == B * Hk * Nk * d * b  # once per block, TMA
    assert main.global_read["Q"] == main.global_read["dO"] == visits * d * b
    assert main.global_read["lse"] == main.global_read["D"] == visits * 4
    assert main.global_read["dQacc"] == main.global_write["dQacc"] == visits * d * 4  # bulk reduce-add, fp32
    assert main.global_write["dK"] == main.global_write["dV"] == B * Hk * Nk * d * b  # summed over the group
    assert "bwd_dkdv_group_sum" not in [k.name for k in r.counts.kernels]


def test_flash3_backward_is_registered_under_the_forward_it_follows_and_runs_both_passes():
    assert BACKWARD["flash3"] is flash3_bwd.SCHEDULE and BACKWARD["flash3"].unit == "kv_head"
    p = AttentionProblem(batch=1, heads=4, kv_heads=2, seq_len=1024, head_dim=128, dtype="bf16", causal=True)
    both = simulate("flash3", p, pass_="both")
    fwd, bwd = simulate("flash3", p), simulate("flash3", p, pass_="backward")
    assert both.counts.global_bytes == fwd.counts.global_bytes + bwd.counts.global_bytes


@pytest.mark.parametrize("d", sorted(launch.FLASH3_BWD_TILES))
def test_the_schedule_tiles_and_shared_memory_are_the_kernels(d):
    Br, Bc = launch.FLASH3_BWD_TILES[d]
    assert (Br, Bc) == flash3_bwd.TILES_BY_HEAD_DIM[d] and launch.FLASH3_BWD_DQ_PAD == flash3_bwd.DQ_PAD
    p = AttentionProblem(seq_len=4096, head_dim=d, dtype="bf16")
    terms = launch.flash3_bwd_smem_terms(d, Br, Bc)
    t = simulate("flash3", p, pass_="backward").tiles
    assert flash3_bwd.shared_memory(p, t) == sum(terms.values()) - terms["barriers"] - terms["align"]
    assert launch.flash3_bwd_smem_bytes(d, Br, Bc) <= 227 * 1024  # sm_90 opt-in limit per block
    r = launch.FLASH3_BWD_REGISTERS
    assert 128 * r["producer"] + 256 * r["consumer"] <= 65536


def test_every_flash3_backward_tile_has_an_instantiation_and_its_wgmma_shapes():
    insts = build.flash3_bwd_instances()
    assert len(insts) == len(launch.FLASH3_BWD_TILES) * len(build.CUDA_TYPES) * 2
    src = (kernels_dir() / "flash3_bwd.cu").read_text()
    assert f"kF3bBc = {launch.FLASH3_BWD_TILES[128][1]};" in src
    assert f"kF3bDqPad = {launch.FLASH3_BWD_DQ_PAD};" in src
    assert re.search(rf"setmaxnreg\.dec\.sync\.aligned\.u32 {launch.FLASH3_BWD_REGISTERS['producer']};", src)
    assert re.search(rf"setmaxnreg\.inc\.sync\.aligned\.u32 {launch.FLASH3_BWD_REGISTERS['consumer']};", src)
    for d, (bq, _) in launch.FLASH3_BWD_TILES.items():
        nq = d if bq == 128 else d // 2  # dQ_i's columns per consumer warpgroup: split by rows at Br = 128
        assert bq in flash3_host.WGMMA_SS_N and d in flash3_host.WGMMA_RS_N and nq in flash3_host.WGMMA_SS_TT_N
    inst = insts[0]
    assert inst.nvrtc_extra == ("-arch=sm_90a",) and inst.explicit_instantiation.count("iosim::TmaMap") == 4


def test_bwd_wgmma_header_is_what_its_generator_writes():
    assert (kernels_dir() / "flash3_bwd_wgmma.cuh").read_text() == flash3_host.bwd_wgmma_header()
