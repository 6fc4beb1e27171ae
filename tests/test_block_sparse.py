"""Block-sparse FlashAttention (Alg. 5, Proposition 4): zero blocks cost nothing, traffic Θ(Nd + N²d²s/M),
closed form == walk, and the numbers equal float64 attention restricted to the mask's blocks."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from helpers import random_inputs, without_peak
from hypothesis import given
from hypothesis import strategies as st

from iosim import AttentionProblem, ScheduleError, get_profile, simulate
from iosim.blocks import cdiv
from iosim.numeric import execute, reference_block_sparse
from iosim.problem import STAT_BYTES
from iosim.schedules import Tiles
from iosim.schedules.block_sparse import block_mask, make_tiles
from iosim.simulate import closed, walk

TOL = {"fp32": 1e-5, "fp16": 4 * 2**-11, "bf16": 4 * 2**-8}
H100 = get_profile("h100-sxm5-80gb")


@st.composite
def cases(draw, max_len=200):
    kv_heads = draw(st.integers(1, 2))
    p = AttentionProblem(
        batch=draw(st.integers(1, 2)),
        heads=kv_heads * draw(st.integers(1, 2)),
        kv_heads=kv_heads,
        seq_len=draw(st.integers(1, max_len)),
        kv_len=draw(st.integers(1, max_len)),
        head_dim=draw(st.sampled_from([4, 8, 16, 32])),
        dtype=draw(st.sampled_from(["fp16", "bf16", "fp32"])),
        causal=draw(st.booleans()),
    )
    t = make_tiles(p, H100, draw(st.integers(1, 40)), draw(st.integers(1, 40)),
                   density=draw(st.floats(0.01, 1.0)), seed=draw(st.integers(0, 2**16)))
    return p, t


@given(cases())
def test_block_sparse_closed_form_equals_tile_walk(case):
    p, t = case
    w, c = walk("block-sparse", p, t), closed("block-sparse", p, t)
    assert without_peak(w) == without_peak(c)
    assert w.kernels[0].sram_peak <= c.kernels[0].sram_peak


@given(cases(max_len=60), st.integers(0, 2**32 - 1))
def test_block_sparse_numeric_execution_equals_float64_attention_over_the_masks_blocks(case, seed):
    p, t = case
    q, k, v = random_inputs(p, seed)
    O, _ = execute("block-sparse", p, q, k, v, t)
    assert not np.isnan(O).any()
    ref = reference_block_sparse(p, q, k, v, block_mask(t), t.block_q, t.block_kv)
    assert np.linalg.norm(O - ref) <= TOL[p.dtype] * max(np.linalg.norm(ref), 1e-30)


@given(st.integers(1, 8), st.integers(1, 8), st.sampled_from([16, 32, 64]), st.sampled_from([16, 64]),
       st.floats(0.01, 1.0), st.integers(0, 1000))
def test_zero_blocks_cost_nothing_and_traffic_is_Nd_plus_s_times_the_dense_inner_loop(tr, tc, B, d, s, seed):
    # Proposition 4: Θ(Nd + N²d²s/M); with tiles that divide the sequences, exactly linear in s
    p = AttentionProblem(seq_len=tr * B, kv_len=tc * B, head_dim=d)
    t = make_tiles(p, H100, B, B, density=s, seed=seed)
    nnz = int(block_mask(t).sum())
    sparse, dense = closed("block-sparse", p, t), closed("flash1", p, Tiles(B, B))
    N, Nk, b = p.seq_len, p.kv_len, p.elem_bytes
    fixed = 2 * Nk * d * b + N * d * b + 2 * N * STAT_BYTES  # K, V once (line 6); O, l, m initialized (line 2)
    assert (sparse.global_bytes - fixed) * (tr * tc) == (dense.global_bytes - fixed) * nnz
    assert sparse.flops["matmul"] == 4 * B * B * d * nnz  # two GEMMs per non-zero block, none elsewhere


def test_a_dense_mask_counts_exactly_algorithm_1():
    p = AttentionProblem(seq_len=1000, kv_len=700, head_dim=64, causal=True, heads=2)
    t = make_tiles(p, H100, 64, 128, density=1.0)
    a, b = closed("block-sparse", p, t).normalized(), closed("flash1", p, Tiles(64, 128)).normalized()
    assert a.kernels[0].global_read == b.kernels[0].global_read and a.kernels[0].flops == b.kernels[0].flops


def test_masks_come_from_npy_or_text_files_of_the_tiles_shape(tmp_path):
    p = AttentionProblem(seq_len=256, head_dim=64)
    m = np.eye(4, dtype=np.int8)
    np.save(tmp_path / "m.npy", m)
    np.savetxt(tmp_path / "m.txt", m, fmt="%d")
    for f in ("m.npy", "m.txt"):
        r = simulate("block-sparse", p, mask=str(tmp_path / f), block_q=64, block_kv=64)
        assert r.tiles.density == 0.25 and r.counts.flops["matmul"] == 4 * 64 * 64 * 64 * 4
    with pytest.raises(ScheduleError, match=r"shape \(4, 4\), but tiles block_q=32"):
        simulate("block-sparse", p, mask=str(tmp_path / "m.npy"), block_q=32, block_kv=64)
    np.save(tmp_path / "bad.npy", m * 2)
    with pytest.raises(ScheduleError, match="only 0 and 1"):
        simulate("block-sparse", p, mask=str(tmp_path / "bad.npy"), block_q=64, block_kv=64)
    with pytest.raises(ScheduleError, match="not both"):
        simulate("block-sparse", p, mask=str(tmp_path / "m.npy"), density=0.5, block_q=64, block_kv=64)
    with pytest.raises(ScheduleError, match=r"density=1\.5"):
        simulate("block-sparse", p, density=1.5)


def test_a_drawn_mask_has_the_asked_density_and_the_seed_fixes_it():
    p = AttentionProblem(seq_len=4096, head_dim=64)
    a, b, c = (simulate("block-sparse", p, density=0.25, seed=s, block_q=64, block_kv=64) for s in (1, 1, 2))
    assert a.tiles.density == 0.25 and a.tiles.mask == b.tiles.mask != c.tiles.mask
    assert a.counts.global_bytes == c.counts.global_bytes  # same number of blocks, same traffic


def test_cli_block_sparse_flags(tmp_path):
    np.save(tmp_path / "m.npy", np.tril(np.ones((4, 4), dtype=np.int8)))
    for flags in (["--density", "0.5", "--seed", "3"], ["--mask", str(tmp_path / "m.npy")]):
        out = subprocess.run([sys.executable, "-m", "iosim", "simulate", "block-sparse", "--seq-len", "256",
                              "--head-dim", "64", "--block-q", "64", "--block-kv", "64", "--json", *flags],
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        j = json.loads(out.stdout)
        assert j["tiles_by_pass"]["forward"]["density"] in (0.5, 10 / 16)
        assert j["flops"]["matmul"] == 4 * 64 * 64 * 64 * cdiv(16 * j["tiles_by_pass"]["forward"]["density"], 1)


# -- the backward pass: Algorithm 4 with the zero blocks skipped ----------------------------------------


@given(cases())
def test_block_sparse_backward_closed_form_equals_tile_walk(case):
    p, t = case
    w, c = walk("block-sparse", p, t, "backward"), closed("block-sparse", p, t, "backward")
    assert without_peak(w) == without_peak(c)


@given(cases(max_len=40), st.integers(0, 2**32 - 1))
def test_block_sparse_backward_gradients_equal_float64_over_the_masks_blocks(case, seed):
    from iosim.numeric import execute_backward, reference_backward

    p, t = case
    p = p.model_copy(update={"dtype": "fp32"})
    q, k, v, do = random_inputs(p, seed, grad=True)
    got = execute_backward("block-sparse", p, q, k, v, do, t)
    want = reference_backward(p, q, k, v, do, block_mask(t), t.block_q, t.block_kv)
    for x, ref in zip(got, want, strict=True):
        assert not np.isnan(x).any()
        # fp32 throughout: absolute error against the size of the inputs (dQ, dK may cancel to ~0)
        assert np.abs(x - ref).max() <= 1e-4 * max(1.0, np.abs(ref).max())


def test_forward_and_backward_share_one_mask_and_fwd_plus_bwd_is_linear_in_s():
    p = AttentionProblem(seq_len=4096, head_dim=64, heads=4)
    runs = {s: simulate("block-sparse", p, "a100-sxm4-40gb", density=s, seed=0, pass_="both") for s in (1.0, 0.5, 0.25)}
    r = runs[0.5]
    assert r.tiles_by_pass["forward"] == r.tiles_by_pass["backward"]  # same tiles, same mask
    nz = {s: int(block_mask(x.tiles).sum()) for s, x in runs.items()}
    g = {s: x.counts.global_bytes for s, x in runs.items()}
    # g(s) = fixed + per_block · nnz: the three points lie on one line
    assert (g[1.0] - g[0.5]) * (nz[0.5] - nz[0.25]) == (g[0.5] - g[0.25]) * (nz[1.0] - nz[0.5])
