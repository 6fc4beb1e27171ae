"""iosim.tune / `iosim tune`: a kernel's compiled tiles ranked by the time model, with why each loses."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from iosim import AttentionProblem, launch, simulate
from iosim.cli import cli
from iosim.timing import fa2
from iosim.timing.kernels import load_kernel
from iosim.tune import tune

H100 = "h100-sxm5-80gb"


@pytest.mark.parametrize("d", [32, 64, 128, 256])
def test_the_description_lists_the_tiles_and_registers_the_kernel_is_compiled_with(d):
    tc = load_kernel("iosim-flash2").tiles_for(d)
    listed = [(tc.block_q, tc.block_kv, tc.registers), *((o.block_q, o.block_kv, o.registers) for o in tc.others)]
    assert sorted((bq, bkv) for bq, bkv, _ in listed) == sorted(launch.FLASH_TILES[d])
    for bq, bkv, regs in listed[1:]:
        assert regs == launch.FLASH2_REGISTERS[(d, bq, bkv)]
    # flash_fwd.cu's kQInRegs: one 16-row stripe a warp (Br = 64 over 4 warps) and d <= 128
    for o in (tc, *tc.others):
        assert o.q_in_registers == (o.block_q == 64 and d <= 128)


def test_a_listed_tile_is_timed_with_its_own_registers():
    desc = load_kernel("iosim-flash2")
    assert fa2.tiles_of(desc, 64, 64, 64).registers == launch.FLASH2_REGISTERS[(64, 64, 64)]
    assert fa2.tiles_of(desc, 64, 128, 64).registers == desc.tiles[64].registers  # the default entry


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", [(16, 32, 1024, 64), (4, 16, 4096, 128), (1, 8, 512, 64)])
def test_every_compiled_tile_is_ranked_fastest_first_as_simulate_times_it(shape, causal):
    B, H, N, d = shape
    p = AttentionProblem(batch=B, heads=H, seq_len=N, head_dim=d, dtype="bf16", causal=causal)
    ranked = tune("flash2", p, H100, kernel="iosim-flash2")
    assert sorted((c.block_q, c.block_kv) for c in ranked) == sorted(launch.FLASH_TILES[d])
    times = [c.predicted_s for c in ranked]
    assert times == sorted(times) and ranked[0].reason == ""
    for c in ranked:
        r = simulate("flash2", p, H100, block_q=c.block_q, block_kv=c.block_kv, kernel="iosim-flash2")
        assert c.predicted_s == r.time.predicted_s
    assert all(c.reason.startswith(f"{c.predicted_s / times[0] - 1:+.1%}") for c in ranked[1:])


def test_a_small_causal_grid_prefers_more_blocks_and_says_why_the_large_tile_loses():
    p = AttentionProblem(batch=1, heads=8, seq_len=512, head_dim=64, dtype="bf16", causal=True)
    ranked = tune("flash2", p, H100, kernel="iosim-flash2")
    big = next(c for c in ranked if (c.block_q, c.block_kv) == (128, 64))
    assert ranked[0].block_q == 64 and "waves" in big.reason


def test_without_a_tile_list_the_powers_of_two_are_ranked_and_those_that_cannot_run_say_why():
    ranked = tune("flash1", AttentionProblem(seq_len=2048, head_dim=64), H100)
    legal = [c for c in ranked if c.legal]
    assert len(ranked) == 25 and len(legal) < 25 and legal[0].predicted_s <= legal[-1].predicted_s
    assert all(not c.legal and "256" in c.reason for c in ranked[len(legal):])


def test_the_cli_prints_the_same_ranking():
    p = AttentionProblem(batch=2, heads=16, seq_len=2048, head_dim=64, dtype="bf16")
    res = CliRunner().invoke(cli, ["tune", "flash2", "--kernel", "iosim-flash2", "--batch", "2", "--heads", "16",
                                   "--seq-len", "2048", "--head-dim", "64", "--dtype", "bf16", "--json"])
    assert res.exit_code == 0, res.output
    got = json.loads(res.output)
    want = tune("flash2", p, None, kernel="iosim-flash2")
    assert [(g["block_q"], g["block_kv"], g["predicted_s"]) for g in got] == \
        [(c.block_q, c.block_kv, c.predicted_s) for c in want]
    text = CliRunner().invoke(cli, ["tune", "flash2", "--kernel", "iosim-flash2", "--seq-len", "2048",
                                    "--head-dim", "64"]).output
    assert "first choice" in text and text.count("\n") == len(launch.FLASH_TILES[64])
