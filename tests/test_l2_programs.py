"""naive's and flash1's programs for the L2 model, built without the tracer: equal to the tracer's atomized trace (up
to the numbering of atoms); rows that share atoms (recycled) give the very bytes of rows that do not; and the
default model's shortcuts for long grids (naive's rows extrapolated, flash1's streaming passes counted from their
tiles, causal flash2's lockstep blocks skipped) against the full walk."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from iosim import l2
from iosim.l2 import model as l2_model
from iosim.l2.atoms import atomize, global_bytes
from iosim.l2.program import expand
from iosim.l2.programs import flash1_program, naive_programs
from iosim.problem import AttentionProblem
from iosim.schedules import Tiles
from iosim.simulate import simulate

H200, H100 = "h200-sxm-141gb", "h100-sxm5-80gb"


def _p(**kw):
    return AttentionProblem.make(**kw)


def _same_up_to_numbering(prog, kt, p):
    """The program, expanded, makes the tracer's accesses in the same order, atom for atom (a one-to-one map of atom
    numbers that keeps each atom's bytes and tensor), and requests the same bytes."""
    at = atomize(kt, p)
    ptr, atom, shape, write = expand(prog)
    assert np.array_equal(ptr, kt.ptr) and np.array_equal(write, kt.write)
    assert not shape.any() and not at.acc_shape.any()  # every access one atom, in both
    pairs = np.unique(np.stack([atom, at.acc_atom.astype(np.int64)]), axis=1)
    assert len(np.unique(pairs[0])) == len(np.unique(pairs[1])) == pairs.shape[1]  # one-to-one
    assert np.array_equal(prog.atom_bytes[pairs[0]], at.atom_bytes[pairs[1]])
    assert np.array_equal(prog.atom_tensor[pairs[0]], at.atom_tensor[pairs[1]])
    assert (prog.global_read, prog.global_write) == global_bytes(kt, p, 1)
    assert prog.accesses == len(kt.tensor)


@given(n=st.integers(1, 300), nk=st.integers(1, 300), br=st.sampled_from([None, 16, 32, 64]),
       bc=st.sampled_from([16, 48, 64]))
@settings(max_examples=25, deadline=None)
def test_naive_programs_expanded_equal_the_atomized_trace(n, nk, br, bc):
    p = _p(seq_len=n, kv_len=nk, head_dim=32)
    t = Tiles(br, None if br is None else bc)
    for prog, kt in zip(naive_programs(p, t), l2.trace_program("naive", p, t), strict=True):
        _same_up_to_numbering(prog, kt, p)


@given(n=st.integers(1, 400), nk=st.integers(1, 400), br=st.sampled_from([16, 32, 64]),
       bc=st.sampled_from([16, 32, 48]), causal=st.booleans(), rev=st.booleans())
@settings(max_examples=25, deadline=None)
def test_flash1_program_expanded_equals_the_atomized_trace(n, nk, br, bc, causal, rev):
    p = _p(seq_len=n, kv_len=nk, head_dim=32, causal=causal)
    order = "reverse" if rev else "forward"
    _same_up_to_numbering(flash1_program(p, Tiles(br, bc), order), l2.trace_program("flash1", p, Tiles(br, bc), order)[0], p)


def _kernels(r):
    return [(k.dram_read, k.dram_write, k.dirty_at_end, k.read_by_tensor, k.write_by_tensor) for k in r.kernels]


@pytest.mark.parametrize("share", [1.0, 0.5])
@pytest.mark.parametrize("resident", [4, 264])
@pytest.mark.parametrize("n,nk,tiles,heads,kv_heads", [
    (4096, 1000, (64, 64), 3, 3), (3000, 4096, (32, 48), 2, 1), (16384, 256, (16, 64), 2, 2),
    (4096, 2048, (64, 64), 8, 2)])
def test_recycled_rows_give_the_bytes_of_rows_of_their_own(share, resident, n, nk, tiles, heads, kv_heads):
    """A 96 KiB L2 and up to 264 blocks resident (two to an SM, drifting at share 0.5): the default shares atoms
    between rows (and heads) far apart, the exact walk gives every row its own; every byte the same."""
    p = _p(seq_len=n, kv_len=nk, head_dim=64, heads=heads, kv_heads=kv_heads)
    x = l2.L2Inputs(capacity=96 * 1024, block_share=share)
    x = replace(x, resident=resident)
    default = l2.simulate_l2("naive", p, Tiles(*tiles), H200, x)
    exact = l2.simulate_l2("naive", p, Tiles(*tiles), H200, x, walk=l2.WalkOptions(exact=True))
    assert _kernels(default) == _kernels(exact)


def test_recycling_keeps_a_few_rows_of_atoms():
    p = _p(seq_len=131072, head_dim=128, dtype="bf16", heads=32)
    rec = (264, 48_000_000, 132, 0.851, 32)
    scores, softmax, pv = naive_programs(p, Tiles(64, 64), [rec] * 3)
    assert 0 < scores.row_wrap < 20 and 0 < pv.row_wrap < 1000 and 0 < softmax.row_wrap < 2000
    assert len(pv.atom_bytes) < 1000 * 2049 + 2048  # not 2048 rows x 2049 tiles of each of 32 heads


PROFILE_INPUTS = l2.L2Inputs()


def _agree(schedule, p, tiles, inputs=PROFILE_INPUTS, profile=H200, tol=0.01):
    """(default forced to approximate, exact) kernels, checked within ``tol`` on reads and writes."""
    default = l2.simulate_l2(schedule, p, tiles, profile, inputs, walk=l2.WalkOptions(budget=0))
    exact = l2.simulate_l2(schedule, p, tiles, profile, inputs, walk=l2.WalkOptions(exact=True))
    for d, e in zip(default.kernels, exact.kernels, strict=True):
        assert abs(d.dram_read - e.dram_read) <= tol * e.dram_read
        assert abs(d.dram_write - e.dram_write) <= tol * max(e.dram_write, 1)
    return default.kernels


@pytest.mark.parametrize("n,heads,tiles,profile", [
    (16384, 1, (16, 16), H200), (16384, 4, (16, 32), H200), (20000, 2, (48, 40), H100)])
def test_naive_rows_extrapolated_agree_with_the_full_walk(n, heads, tiles, profile):
    """naive's rows past the first few: each moves what the last few moved (measured within 0.15%)."""
    p = _p(seq_len=n, kv_len=n + 3000 if heads == 2 else n, heads=heads, head_dim=64, dtype="bf16")
    kernels = _agree("naive", p, Tiles(*tiles), profile=profile)
    assert any("naive's rows" in k.approximation() for k in kernels)


@pytest.mark.parametrize("n,heads,kv_heads,causal,tiles", [
    (16384, 16, 4, True, (64, 128)), (16384, 16, 16, False, (64, 128)), (8192, 32, 8, True, (32, 64))])
def test_flash1_passes_counted_from_their_tiles_agree_with_the_full_walk(n, heads, kv_heads, causal, tiles):
    """flash1's passes that stream through a 4 MiB L2: each costs its tiles (K/V once a group), the last walked."""
    p = _p(seq_len=n, heads=heads, kv_heads=kv_heads, head_dim=64, causal=causal)
    (k,) = _agree("flash1", p, Tiles(*tiles), l2.L2Inputs(capacity=4 << 20), tol=0.001)
    assert "flash1's passes" in k.approximation() and k.skipped > 0.9 * k.accesses


@pytest.mark.parametrize("heads,kv_heads", [(4, 1), (8, 2)])
def test_causal_lockstep_blocks_skip_with_reuse_and_agree(heads, kv_heads):
    """Causal grouped-query flash2 at N = 131072 with a 4 MiB L2: one block an SM (lockstep), launched a few rounds
    apart, so later blocks reuse what earlier ones fetched; such windows are skipped now (23% of the accesses,
    2-5% before) and agree with the full walk (measured within 0.003%)."""
    p = _p(seq_len=131072, heads=heads, kv_heads=kv_heads, head_dim=128, causal=True)
    (k,) = _agree("flash2", p, Tiles(128, 64), l2.L2Inputs(capacity=4 << 20))
    assert k.resident == 132 and k.skipped > 0.15 * k.accesses


@pytest.mark.slow
@pytest.mark.parametrize("schedule,causal,tiles", [
    ("flash1", True, (128, 227)), ("flash1", False, (128, 227)), ("naive", False, (128, 128))])
def test_shortcuts_agree_with_the_full_walk_at_131072(schedule, causal, tiles):
    """N = 131072 on an H200 with flash1's default tiles (8 heads) and naive's kernel's (one head), the default
    forced to take its shortcuts."""
    p = _p(seq_len=131072, heads=8 if schedule == "flash1" else 1, head_dim=128, dtype="bf16", causal=causal)
    kernels = _agree(schedule, p, Tiles(*tiles))
    assert any(k.skipped > 0.5 * k.accesses for k in kernels)


def test_tiny_naive_tiles_are_refused_before_any_work(monkeypatch):
    """naive at N = 1,048,576 with 8 x 8 tiles would hold billions of P tiles: refused before a program is built,
    by the model and by simulate (hbm = global, with the reason)."""

    def no_programs(*args, **kwargs):
        raise AssertionError("a program was built")

    monkeypatch.setattr(l2_model, "naive_programs", no_programs)
    p = _p(heads=1, seq_len=1 << 20, head_dim=128)
    with pytest.raises(l2.L2ModelError, match="tiles of P"):
        l2.simulate_l2("naive", p, Tiles(8, 8), H200)
    r = simulate("naive", p, H200, l2=True, block_q=8, block_kv=8)
    assert r.hbm_model.startswith("none") and "use larger tiles" in r.hbm_model
