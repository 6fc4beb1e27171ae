"""The L2 model at scale: flash2's compact program, the default model (heads extrapolated, steady K/V windows
skipped) against the full walk (``exact=True``), the progress callback, and a million tokens in bounded time and
memory (naive's and flash1's programs and shortcuts: test_l2_programs.py)."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from iosim import l2
from iosim.cli import cli
from iosim.l2 import walk as l2_walk
from iosim.l2.atoms import atomize, global_bytes
from iosim.l2.program import expand, flash2_program
from iosim.problem import AttentionProblem
from iosim.schedules import Tiles
from iosim.schedules.flash2 import make_tiles
from iosim.simulate import simulate

H200 = "h200-sxm-141gb"


def _p(**kw):
    return AttentionProblem.make(**kw)


@given(
    n=st.integers(1, 700),
    nk=st.integers(1, 700),
    br=st.sampled_from([16, 32, 64, 128]),
    bc=st.sampled_from([16, 32, 64]),
    causal=st.booleans(),
    rev=st.booleans(),
    window=st.one_of(st.none(), st.tuples(st.one_of(st.none(), st.integers(0, 300)),
                                          st.one_of(st.none(), st.integers(0, 300)))),
)
@settings(max_examples=80, deadline=None)
def test_flash2_program_expanded_equals_the_atomized_trace(n, nk, br, bc, causal, rev, window):
    """Dense, or with a sliding window (each Q block's K/V range from kv_block_range), the program as the traced
    schedule."""
    p = _p(seq_len=n, kv_len=nk, head_dim=64, causal=causal)
    t = Tiles(br, bc) if window is None else make_tiles(p, None, br, bc, window=(window[0], 0 if causal else window[1]))
    order = "reverse" if rev else "forward"
    kt = l2.trace_program("flash2", p, t, kv_order=order)[0]
    at = atomize(kt, p)
    prog = flash2_program(p, t, order)
    ptr, atom, shape, write = expand(prog)
    assert np.array_equal(ptr, kt.ptr) and np.array_equal(write, kt.write)
    assert np.array_equal(atom, at.acc_atom) and np.array_equal(shape, at.acc_shape)
    assert np.array_equal(prog.atom_bytes, at.atom_bytes) and np.array_equal(prog.atom_kv, at.atom_kv)
    assert (prog.global_read, prog.global_write) == global_bytes(kt, p, 1)


def test_flash2_program_memory_is_per_block_not_per_access():
    """N = 1,048,576: 537 million accesses per head, held as 40,960 records."""
    prog = flash2_program(_p(seq_len=1 << 20, head_dim=128), Tiles(128, 32))
    assert prog.accesses == 8192 * (2 * 32768 + 3)
    assert len(prog.atom) == 8192 * 5
    assert sum(a.nbytes for a in (prog.atom, prog.shape, prog.write, prog.step, prog.gidx, prog.glen, prog.reps,
                                  prog.atom_bytes, prog.atom_kv, prog.atom_tensor)) < 8_000_000


def test_default_is_the_full_walk_below_the_budget():
    p = _p(heads=32, seq_len=16384, head_dim=128)
    exact = l2.simulate_l2("flash2", p, Tiles(128, 32), H200, walk=l2.WalkOptions(exact=True)).kernels[0]
    default = l2.simulate_l2("flash2", p, Tiles(128, 32), H200).kernels[0]
    assert (default.dram_read, default.dram_write, default.dirty_at_end) == (
        exact.dram_read, exact.dram_write, exact.dirty_at_end)
    assert default.heads_walked == 32 and default.skipped == 0


def _agree(p, tiles, inputs, resident, budget=0):
    """(exact, default) kernels; the default forced to approximate (``budget``)."""
    inputs = replace(inputs, resident=resident)
    exact = l2.simulate_l2("flash2", p, tiles, H200, inputs, walk=l2.WalkOptions(exact=True)).kernels[0]
    default = l2.simulate_l2("flash2", p, tiles, H200, inputs, walk=l2.WalkOptions(budget=budget)).kernels[0]
    return exact, default


def _within(default, exact, tol=0.01):
    assert abs(default.dram_read - exact.dram_read) <= tol * exact.dram_read
    assert abs(default.dram_write - exact.dram_write) <= tol * exact.dram_write


@pytest.mark.parametrize("causal,heads,kv_heads", [(False, 16, 16), (True, 16, 16), (False, 32, 16), (True, 32, 16)])
def test_default_agrees_with_the_full_walk_on_mid_sizes(monkeypatch, causal, heads, kv_heads):
    """Mid sizes with the approximations forced on: 16 heads, or 32 in groups of 2; 8 blocks resident, so 32 waves
    a head, and K/V far larger than an L2 of 256 KiB: heads are extrapolated and steady windows skipped (a window of
    128 rounds, so that a K/V loop of 2048 accesses holds several)."""
    monkeypatch.setattr(l2_walk, "WINDOW", 128)
    p = _p(heads=heads, kv_heads=kv_heads, seq_len=32768, head_dim=128, causal=causal)
    exact, default = _agree(p, Tiles(128, 32), l2.L2Inputs(capacity=256 * 1024), resident=8)
    _within(default, exact)
    assert default.heads_walked < heads  # the approximation did happen
    if not causal:
        assert default.skipped > 0.3 * default.accesses


@pytest.mark.slow
def test_heads_that_differ_are_walked_not_extrapolated():
    """N = 65536 on an H200: one head in eight costs 18% less (where its boundary falls in the waves), so the
    middle units' halves disagree and the model walks the grid in full rather than extrapolate."""
    p = _p(heads=32, seq_len=65536, head_dim=128)
    exact, default = _agree(p, Tiles(128, 32), l2.L2Inputs(), resident=None)
    assert default.heads_walked == 32
    assert (default.dram_read, default.dram_write) == (exact.dram_read, exact.dram_write)


@pytest.mark.slow
@pytest.mark.parametrize("causal,kv_heads", [(False, 32), (True, 32), (False, 8), (True, 8)])
def test_default_agrees_with_the_full_walk_at_131072(causal, kv_heads):
    """What a user runs: ``simulate(..., l2=True)`` with its default tiles on an H200, 32 heads."""
    p = _p(heads=32, kv_heads=kv_heads, seq_len=131072, head_dim=128, causal=causal)
    exact = simulate("flash2", p, H200, l2=True, l2_exact=True).traffic["hbm"]
    default = simulate("flash2", p, H200, l2=True).traffic["hbm"]
    for k in ("read_bytes", "write_bytes"):
        assert abs(default[k] - exact[k]) <= 0.01 * exact[k]


@pytest.mark.slow
@pytest.mark.parametrize("causal", [False, True])
def test_extrapolated_heads_agree_with_the_full_walk_at_131072(causal):
    """Batch 4 x 32 heads: 16 of the 128 heads are walked and the rest extrapolated (measured: reads +0.59% and
    -0.16%, writes +0.09% and -0.001%)."""
    p = _p(batch=4, heads=32, seq_len=131072, head_dim=128, causal=causal)
    exact = simulate("flash2", p, H200, l2=True, l2_exact=True).traffic["hbm"]
    r = simulate("flash2", p, H200, l2=True)
    assert r.l2.kernels[0].heads_walked < 128 and "heads walked, the rest extrapolated" in r.hbm_model
    for k in ("read_bytes", "write_bytes"):
        assert abs(r.traffic["hbm"][k] - exact[k]) <= 0.01 * exact[k]


@pytest.mark.slow
def test_skipping_steady_windows_agrees_at_262144():
    """Four heads, so the heads are all walked: the skipped windows alone (blocks drifting, H200)."""
    p = _p(heads=4, seq_len=262144, head_dim=128)
    exact, default = _agree(p, Tiles(128, 32), l2.L2Inputs(), resident=None)
    assert default.skipped > 0.3 * default.accesses
    _within(default, exact)


def test_progress_reports_accesses_up_to_the_total():
    seen = []
    p = _p(heads=8, seq_len=8192, head_dim=128)
    l2.simulate_l2("flash2", p, Tiles(128, 32), H200, walk=l2.WalkOptions(progress=lambda d, t: seen.append((d, t))))
    total = 8 * 64 * (2 * 256 + 3)
    assert seen[-1] == (total, total)
    assert all(0 <= d <= t == total for d, t in seen)


def test_hbm_model_says_how_it_was_obtained():
    p = _p(heads=16, seq_len=32768, head_dim=128)
    exact = simulate("flash2", p, H200, l2=True, l2_exact=True)
    assert "every access walked" in exact.hbm_model


def test_cli_takes_l2_exact():
    res = CliRunner().invoke(cli, ["simulate", "flash2", "--seq-len", "4096", "--heads", "2", "--l2-exact",
                                        "--json"])
    assert res.exit_code == 0, res.output
    assert "every access walked" in res.output


@pytest.mark.slow
def test_a_million_tokens_in_bounded_memory():
    """flash2, N = 1,048,576, 32 heads, d = 128, H200: the default model's allocations stay under 1 GB (its time,
    5-6 s on a 2-core machine against 304 s for the full walk, is a figure in the docs, not a timed test); its DRAM
    reads are at least the compulsory Q, K, V once. Measured in a fresh process after a small problem has compiled
    the loop, so numba's compiler is not counted."""
    code = ("import tracemalloc\nfrom iosim import AttentionProblem, simulate\n"
            "simulate('flash2', AttentionProblem.make(heads=2, seq_len=4096), 'h200-sxm-141gb', l2=True)\n"
            "p = AttentionProblem.make(heads=32, seq_len=1 << 20, head_dim=128)\n"
            "tracemalloc.start(); r = simulate('flash2', p, 'h200-sxm-141gb', l2=True)\n"
            "print(tracemalloc.get_traced_memory()[1], r.traffic['hbm']['read_bytes'], r.traffic['hbm']['write_bytes'])\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    peak, read, write = int(out[0]), int(out[1]), int(out[2])
    assert peak < 1e9
    assert read >= 3 * 32 * (1 << 20) * 128 * 2
    assert 0 < write <= 32 * (1 << 20) * (128 * 2 + 4)
