"""The backward pass: Algorithm 3 counted literally (b·(7N² + 8Nd) bytes per head), Algorithms 4 and FA2-2
line by line, closed form == tile walk, and dQ, dK, dV of the very tile programs equal to a float64 gradient
derived by hand.

Numeric tolerances are relative Frobenius errors in units of the dtype's roundoff u (fp16 2^-11, bf16 2^-8):
inputs, O, and (naive) P, dP, dS, and (flash1) dQ at every step are rounded to the dtype, so the error is a
few u; we allow 8u. fp32 is held to 1e-5.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from helpers import problems_and_tiles, random_inputs, without_peak
from hypothesis import given
from hypothesis import strategies as st

from iosim import AttentionProblem, ScheduleError, simulate
from iosim.blocks import cdiv
from iosim.numeric import execute_backward, reference_backward
from iosim.problem import STAT_BYTES
from iosim.schedules import BACKWARD, Tiles
from iosim.schedules.flash2_bwd import GroupedTiles
from iosim.simulate import closed, walk

BWD_HEAD_DIMS = (4, 8, 16, 32, 64)

TOL = {"fp32": 1e-5, "fp16": 8 * 2**-11, "bf16": 8 * 2**-8}

# -- Algorithm 3: the exact count ------------------------------------------------------------------------


@pytest.mark.parametrize("N,d,dt", [(1024, 64, "fp16"), (4096, 128, "bf16"), (1000, 96, "fp32"), (77, 16, "fp16"),
                                    (1, 1, "fp32")])
def test_standard_backward_moves_exactly_b_times_7N2_plus_8Nd_bytes_per_head(N, d, dt):
    p = AttentionProblem(seq_len=N, head_dim=d, dtype=dt, batch=2, heads=3)
    r = simulate("naive", p, pass_="backward")
    b = p.elem_bytes
    assert r.counts.global_bytes == b * (7 * N * N + 8 * N * d) * 6
    # per line: reads 5N² + 5Nd, writes 2N² + 3Nd
    assert r.counts.global_read_bytes == b * (5 * N * N + 5 * N * d) * 6
    assert r.counts.global_write_bytes == b * (2 * N * N + 3 * N * d) * 6
    NN, Nd = N * N * b * 6, N * d * b * 6
    assert dict(r.counts.global_read) == {"P": 2 * NN, "dP": NN, "dS": 2 * NN, "dO": 2 * Nd, "V": Nd, "K": Nd,
                                          "Q": Nd}
    assert dict(r.counts.global_write) == {"dV": Nd, "dP": NN, "dS": NN, "dQ": Nd, "dK": Nd}


def test_standard_forward_plus_backward_is_12Nd_plus_11N2_elements_and_25_2_GB_at_gpt2_medium():
    p = AttentionProblem(seq_len=1024, head_dim=64, heads=16, batch=64, dtype="fp16")
    r = simulate("naive", p, "a100-sxm4-40gb", pass_="both")
    N, d = 1024, 64
    assert r.counts.global_bytes == 2 * (12 * N * d + 11 * N * N) * 1024 == 25_232_932_864  # 25.2 GB
    assert [k.name for k in r.counts.kernels][:3] == ["naive_scores", "naive_softmax", "naive_pv"]


# -- FlashAttention-1 Algorithm 4 and FlashAttention-2 Algorithm 2, line by line --------------------------


@pytest.mark.parametrize("N,d,Br,Bc,dt", [(1024, 64, 64, 256, "fp16"), (1000, 32, 32, 96, "bf16"),
                                          (512, 128, 64, 64, "fp32")])
def test_flash1_backward_matches_algorithm_4_line_by_line(N, d, Br, Bc, dt):
    p = AttentionProblem(seq_len=N, head_dim=d, dtype=dt)
    c = closed("flash1", p, Tiles(Br, Bc), "backward")
    b, s, Tc = p.elem_bytes, STAT_BYTES, cdiv(N, Bc)
    # line 7: K_j, V_j once; line 10: Q_i, O_i, dO_i, dQ_i, l_i, m_i for every (i, j)
    assert c.global_read_bytes == 2 * N * d * b + Tc * (4 * N * d * b + 2 * N * s)
    # line 5: dQ, dK, dV = 0; line 21: dQ_i every (i, j); line 24: dK_j, dV_j once
    assert c.global_write_bytes == 3 * N * d * b + Tc * N * d * b + 2 * N * d * b
    # HBM_FA1_bwd = 4Nd + Tc·N·(5d + 2) elements (+3Nd init), here in bytes with fp32 l, m
    assert c.global_bytes == b * (4 * N * d + 5 * Tc * N * d) + s * 2 * Tc * N + 3 * N * d * b


@pytest.mark.parametrize("N,Nk,d,Br,Bc", [(1024, 1024, 64, 128, 128), (1000, 777, 128, 64, 128), (17, 300, 32, 16, 64)])
def test_flash2_backward_counts_the_prepass_the_atomics_in_fp32_and_dK_dV_written_once(N, Nk, d, Br, Bc):
    p = AttentionProblem(seq_len=N, kv_len=Nk, head_dim=d, dtype="bf16")
    c = closed("flash2", p, Tiles(Br, Bc), "backward")
    b, s, Tc = 2, STAT_BYTES, cdiv(Nk, Bc)
    pre, main, conv = c.kernels
    assert dict(pre.global_read) == {"dO": N * d * b, "O": N * d * b}  # line 4: D = rowsum(dO ∘ O)
    assert dict(pre.global_write) == {"D": N * s, "dQacc": N * d * 4}  # ... and the accumulator cleared
    # line 6 once per K/V block; line 9 per (i, j); line 15 an fp32 read and write of dQ_i per (i, j)
    assert dict(main.global_read) == {"K": Nk * d * b, "V": Nk * d * b, "Q": Tc * N * d * b, "dO": Tc * N * d * b,
                                      "lse": Tc * N * s, "D": Tc * N * s, "dQacc": Tc * N * d * 4}
    assert dict(main.global_write) == {"dQacc": Tc * N * d * 4, "dK": Nk * d * b, "dV": Nk * d * b}  # line 18
    assert dict(conv.global_read) == {"dQacc": N * d * 4} and dict(conv.global_write) == {"dQ": N * d * b}


def test_causal_flash_backward_visits_the_forwards_tiles_and_about_half_of_them():
    p = AttentionProblem(seq_len=8192, head_dim=64)
    for s in ("flash1", "flash2"):
        full = closed(s, p, Tiles(128, 128), "backward").flops["matmul"]
        causal = closed(s, p.model_copy(update={"causal": True}), Tiles(128, 128), "backward").flops["matmul"]
        fwd = closed(s, p.model_copy(update={"causal": True}), Tiles(128, 128)).flops["matmul"]
        Tr = 8192 // 128
        assert causal * Tr * Tr == full * Tr * (Tr + 1) // 2
        assert causal * 4 == fwd * 10  # five GEMMs per visited tile backward, two forward


# -- closed form == walk, numeric == reference, over drawn shapes ---------------------------------------


@pytest.mark.parametrize("schedule", list(BACKWARD))
@given(data=st.data())
def test_backward_closed_form_equals_tile_walk(schedule, data):
    p, t = data.draw(problems_and_tiles(max_len=200, head_dims=BWD_HEAD_DIMS, max_tile=64, tiled=schedule != "naive" or data.draw(st.booleans())))
    w, c = walk(schedule, p, t, "backward"), closed(schedule, p, t, "backward")
    assert without_peak(w) == without_peak(c)
    for kw, kc in zip(w.kernels, c.kernels, strict=True):
        if kc.sram_peak is None:
            continue
        assert kw.sram_peak <= kc.sram_peak
        if t.block_q and not p.causal and p.seq_len % t.block_q == 0 and p.kv_len % t.block_kv == 0:
            assert kw.sram_peak == kc.sram_peak


@pytest.mark.parametrize("schedule", list(BACKWARD))
@given(case=problems_and_tiles(max_len=48, head_dims=BWD_HEAD_DIMS, max_tile=64), fwd=st.tuples(st.integers(1, 32), st.integers(1, 32)),
       seed=st.integers(0, 2**32 - 1))
def test_backward_numeric_execution_equals_float64_gradient(schedule, case, fwd, seed):
    p, t = case
    ft = Tiles(*fwd) if schedule != "naive" else Tiles(None, None)
    t = t if schedule != "naive" else Tiles(None, None)
    q, k, v, do = random_inputs(p, seed, grad=True)
    got = execute_backward(schedule, p, q, k, v, do, {"forward": ft, "backward": t})
    want = reference_backward(p, q, k, v, do)
    for name, x, ref, size in zip(("dQ", "dK", "dV"), got, want, _magnitudes(p, q, k, v, do), strict=True):
        assert not np.isnan(x).any(), f"{name}: an element was never written (outputs start as NaN)"
        err = np.linalg.norm(x - ref) / max(np.linalg.norm(ref), size, 1e-300)
        assert err <= TOL[p.dtype], (name, err)


def _magnitudes(p, q, k, v, do):
    """Frobenius norms of tau·|dS| |K|, tau·|dS|ᵀ |Q|, |P|ᵀ |dO|, with |dS| = P ∘ (|dP| + |D|): the size of
    the terms each gradient sums. The rows of dS sum to zero, so dQ and dK can be far smaller than their
    terms (with one key they are exactly 0, with two the entries per row are opposite); an error of a few u
    relative to the terms is then all a dtype allows."""
    q, k, v, do = (np.asarray(a, dtype=np.float64) for a in (q, k, v, do))
    kr, vr = np.repeat(k, p.group, axis=2), np.repeat(v, p.group, axis=2)
    S = np.einsum("bnhd,bmhd->bhnm", q, kr) * p.scale
    if p.causal:
        S = np.where(np.arange(p.kv_len)[None, :] > np.arange(p.seq_len)[:, None] + p.causal_offset, -np.inf, S)
    m = S.max(axis=-1, keepdims=True)
    P = np.exp(S - np.where(np.isneginf(m), 0.0, m))
    P = P / np.where(P.sum(-1, keepdims=True) > 0, P.sum(-1, keepdims=True), 1)
    dP = np.einsum("bnhd,bmhd->bhnm", do, vr)
    dS = P * (np.abs(dP) + np.abs((P * dP).sum(-1, keepdims=True)))  # |terms| of P ∘ (dP - D), before cancelling
    return (p.scale * np.linalg.norm(np.einsum("bhnm,bmhd->bnhd", dS, np.abs(kr))),
            p.scale * np.linalg.norm(np.einsum("bhnm,bnhd->bmhd", dS, np.abs(q))),
            np.linalg.norm(np.einsum("bhnm,bnhd->bmhd", P, np.abs(do))))


# -- the pass in the API, the JSON and the CLI ----------------------------------------------------------


def test_both_passes_are_the_forward_kernels_then_the_backward_kernels_and_forward_stays_the_default():
    p = AttentionProblem(seq_len=300, head_dim=64, heads=4, kv_heads=2, causal=True)
    fwd, bwd, both = (simulate("flash2", p, pass_=x) for x in ("forward", "backward", "both"))
    assert simulate("flash2", p).to_json() == fwd.to_json()
    assert both.counts.global_bytes == fwd.counts.global_bytes + bwd.counts.global_bytes
    assert [k.name for k in both.counts.kernels] == [k.name for k in fwd.counts.kernels + bwd.counts.kernels]
    assert bwd.counts.kernels[-1].name == "bwd_dkdv_group_sum"  # grouped-query: dK, dV summed over the group
    j = both.to_json()
    assert j["pass"] == "both" and set(j["tiles_by_pass"]) == {"forward", "backward"}
    assert j["conventional_flops"] == fwd.to_json()["conventional_flops"] * 7 // 2  # fwd + 2.5 x fwd


def test_an_unknown_pass_is_an_error_that_names_the_passes():
    with pytest.raises(ScheduleError, match="pass='sideways': expected one of forward, backward, both"):
        simulate("flash2", AttentionProblem(seq_len=64), pass_="sideways")


def test_cli_pass_both_prints_json_with_the_pass():
    out = subprocess.run([sys.executable, "-m", "iosim", "simulate", "naive", "--seq-len", "256", "--head-dim", "64",
                          "--pass", "backward", "--json"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    j = json.loads(out.stdout)
    total = j["traffic"]["global"]["read_bytes"] + j["traffic"]["global"]["write_bytes"]
    assert j["pass"] == "backward" and total == 2 * (7 * 256 * 256 + 8 * 256 * 64)


@pytest.mark.parametrize("schedule", ["flash1", "flash2"])
@given(case=problems_and_tiles(max_len=40, head_dims=BWD_HEAD_DIMS, max_tile=64), order_seed=st.integers(0, 1000), seed=st.integers(0, 2**16))
def test_backward_gradients_do_not_depend_on_the_order_of_the_inner_loop(schedule, case, order_seed, seed):
    p, t = case
    p = p.model_copy(update={"dtype": "fp32"})
    q, k, v, do = random_inputs(p, seed, grad=True)
    shuffle = np.random.default_rng(order_seed).permutation
    a = execute_backward(schedule, p, q, k, v, do, t)
    b = execute_backward(schedule, p, q, k, v, do, t,
                         kv_order=lambda blocks: [blocks[i] for i in shuffle(len(blocks))])
    for x, y in zip(a, b, strict=True):
        assert np.abs(x - y).max() <= 1e-4 * max(1.0, np.abs(x).max())


# -- grouped-query heads: FlashAttention-2's expanded copies (gqa="expand") or iosim's kernel (gqa="grouped") ------

GROUPED = {"gqa": "grouped"}


def _grouped(t: Tiles) -> GroupedTiles:
    return GroupedTiles(t.block_q, t.block_kv)


def _with_group(p: AttentionProblem, group: int) -> AttentionProblem:
    return p.model_copy(update={"heads": p.kv_heads * group})


@given(data=st.data())
def test_grouped_backward_closed_form_equals_tile_walk(data):
    p, t = data.draw(problems_and_tiles(max_len=200, head_dims=BWD_HEAD_DIMS, max_tile=64))
    t = _grouped(t)
    w, c = walk("flash2", p, t, "backward"), closed("flash2", p, t, "backward")
    assert without_peak(w) == without_peak(c)
    for kw, kc in zip(w.kernels, c.kernels, strict=True):
        assert kw.sram_peak <= kc.sram_peak
        if not p.causal and p.seq_len % t.block_q == 0 and p.kv_len % t.block_kv == 0:
            assert kw.sram_peak == kc.sram_peak


@given(case=problems_and_tiles(max_len=200, head_dims=BWD_HEAD_DIMS, max_tile=64))
def test_grouped_equals_expand_without_grouped_query_heads(case):
    p, t = case
    p = _with_group(p, 1)
    for count in (closed, walk):
        assert count("flash2", p, _grouped(t), "backward") == count("flash2", p, t, "backward")


@given(case=problems_and_tiles(max_len=200, head_dims=BWD_HEAD_DIMS, max_tile=64), group=st.integers(2, 4))
def test_grouped_reads_K_and_V_once_per_kv_head_and_has_no_group_sum(case, group):
    p, t = case
    p = _with_group(p, group)
    e, g = closed("flash2", p, t, "backward"), closed("flash2", p, _grouped(t), "backward")
    assert [k.name for k in e.kernels] == [k.name for k in g.kernels] + ["bwd_dkdv_group_sum"]
    (em, gm), kv = (e.kernels[1], g.kernels[1]), p.batch * p.kv_heads * p.kv_len * p.head_dim * p.elem_bytes
    assert em.grid == group * gm.grid == p.batch * p.heads * cdiv(p.kv_len, t.block_kv)
    for tensor in ("K", "V"):
        assert em.global_read[tensor] == group * gm.global_read[tensor] == group * kv  # line 6: group times less
        assert em.global_write["d" + tensor] == group * gm.global_write["d" + tensor] == group * kv  # line 18
    for tensor in ("Q", "dO", "lse", "D", "dQacc"):  # every query head's rows are read as before
        assert em.global_read[tensor] == gm.global_read[tensor]
    assert em.flops == gm.flops and em.global_write["dQacc"] == gm.global_write["dQacc"]
    for a, b in ((e.kernels[0], g.kernels[0]), (e.kernels[2], g.kernels[2])):  # preprocess, convert: per query head
        assert a == b
    # docs/schedules/backward.md: expand - grouped = B·N_kv·d·b·(6·heads - 2·kv_heads)
    assert e.global_bytes - g.global_bytes == kv // p.kv_heads * (6 * p.heads - 2 * p.kv_heads)


@given(case=problems_and_tiles(max_len=48, head_dims=BWD_HEAD_DIMS, max_tile=64),
       fwd=st.tuples(st.integers(1, 32), st.integers(1, 32)), seed=st.integers(0, 2**32 - 1))
def test_grouped_backward_numeric_execution_equals_float64_gradient(case, fwd, seed):
    p, t = case
    q, k, v, do = random_inputs(p, seed, grad=True)
    got = execute_backward("flash2", p, q, k, v, do, {"forward": Tiles(*fwd), "backward": _grouped(t)})
    want = reference_backward(p, q, k, v, do)
    for name, x, ref, size in zip(("dQ", "dK", "dV"), got, want, _magnitudes(p, q, k, v, do), strict=True):
        assert not np.isnan(x).any(), f"{name}: an element was never written (outputs start as NaN)"
        err = np.linalg.norm(x - ref) / max(np.linalg.norm(ref), size, 1e-300)
        assert err <= TOL[p.dtype], (name, err)


def test_simulate_takes_gqa_for_the_backward_pass_and_says_so_in_the_json():
    p = AttentionProblem(batch=2, seq_len=1000, head_dim=128, heads=8, kv_heads=2, causal=True)
    expand, grouped = (simulate("flash2", p, pass_="backward", gqa=x) for x in ("expand", "grouped"))
    assert expand.to_json() == simulate("flash2", p, pass_="backward").to_json()  # the default is FA2's design
    assert "bwd_dkdv_group_sum" not in [k.name for k in grouped.counts.kernels]
    assert grouped.to_json()["tiles_by_pass"]["backward"]["gqa"] == "grouped"
    assert "gqa" not in expand.to_json()["tiles_by_pass"]["backward"]
    both = simulate("flash2", p, pass_="both", gqa="grouped", method="walk")  # the forward takes no gqa: not given
    assert both.counts.global_bytes == simulate("flash2", p).counts.global_bytes + grouped.counts.global_bytes


@pytest.mark.parametrize("schedule,pass_,gqa,message", [
    ("flash2", "forward", "grouped", r"^flash2 takes no gqa \(given gqa='grouped'\):.* gqa, 'expand' \(the default\) "
                                     r"or 'grouped'"),
    ("flash1", "backward", "grouped", r"^flash1 backward takes no gqa \(given gqa='grouped'\)"),
    ("flash-decoding", "forward", "expand", r"^flash-decoding takes no gqa"),
    ("flash2", "backward", "packed", r"^gqa='packed': expected 'expand' .* or 'grouped'"),
])
def test_gqa_elsewhere_or_with_another_value_is_an_error_naming_it_and_its_values(schedule, pass_, gqa, message):
    with pytest.raises(ScheduleError, match=message):
        simulate(schedule, AttentionProblem(seq_len=64, heads=4, kv_heads=2), pass_=pass_, gqa=gqa)
