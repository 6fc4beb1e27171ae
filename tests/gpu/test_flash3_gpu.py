"""schedule="flash3" (kernels/flash3_fwd.cu, Hopper only) against a float64 reference of the same inputs.

Same method as test_attention_gpu.py, whose reference, NaN-poisoned run and checks this file reuses: fresh random
inputs per case, out and lse_out poisoned with NaN before the kernel runs (an unwritten element fails), relative
Frobenius error within the dtype's bound (fp16 1e-3, bf16 1e-2; never widened to pass), rows that see no key exactly
0 with lse = -inf. Shape classes: ragged N and N_kv (not multiples of 128 or of any tile), causal with N < N_kv and
N > N_kv (rows with no visible key), grouped-query and multi-query heads, every head dim flash3 has, both dtypes.
On a GPU that is not Hopper the tests check the clear error instead.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_attention_gpu import DTYPES, _cp, check, is_hopper, rand_inputs, reference, run, seeded_rng

pytestmark = pytest.mark.gpu


HOPPER = is_hopper()
needs_hopper = pytest.mark.skipif(not HOPPER, reason="schedule='flash3' needs a Hopper GPU (sm_90)")

SHAPES = [  # (batch, seq_len, kv_len, heads, kv_heads)
    (1, 1, 1, 2, 2),
    (2, 17, 33, 4, 4),  # ragged, smaller than one tile
    (1, 130, 97, 4, 1),  # multi-query, N > N_kv: causal rows 0..32 see no key
    (1, 37, 250, 2, 2),  # N < N_kv
    (2, 300, 300, 4, 2),  # grouped-query 2:1, a ragged last Q and K/V tile
    (1, 1, 4097, 2, 2),
    (1, 4097, 1000, 8, 1),  # grouped-query 8:1, N > N_kv: whole Q tiles with no visible key when causal
    (1, 1000, 4097, 8, 8),
    (1, 512, 512, 2, 2),  # exact multiples of the tiles
]


@needs_hopper
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "B{}-N{}-Nk{}-H{}-Hk{}".format(*s))
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("D", [64, 128, 256])
@pytest.mark.parametrize("dtype", DTYPES)
def test_flash3_equals_float64_reference(shape, causal, D, dtype):
    rng = seeded_rng()
    B, N, Nk, H, Hk = shape
    host, dev = rand_inputs(rng, B, N, Nk, H, Hk, D, dtype)
    o, lse = run(*dev, dtype, causal=causal, schedule="flash3")
    check(o, lse, *reference(*host, causal), dtype, f"flash3 {shape} d={D} causal={causal}")


@needs_hopper
@pytest.mark.parametrize("dtype", DTYPES)
def test_flash3_large_scores_stay_finite(dtype):
    """Scores of several hundred (amp 4, d=128): the online softmax must rescale, never overflow."""
    rng = seeded_rng()
    host, dev = rand_inputs(rng, 1, 700, 900, 2, 1, 128, dtype, amp=4.0)
    for causal in (False, True):
        o, lse = run(*dev, dtype, causal=causal, schedule="flash3")
        check(o, lse, *reference(*host, causal), dtype, f"flash3 amp=4 causal={causal}")


@needs_hopper
def test_flash3_agrees_with_flash2():
    """Same inputs through both kernels: within the bf16 bound of each other (both are within it of float64)."""
    rng = seeded_rng()
    _, dev = rand_inputs(rng, 2, 1000, 1200, 8, 2, 128, "bfloat16")
    o3, _ = run(*dev, "bfloat16", causal=True, schedule="flash3")
    o2, _ = run(*dev, "bfloat16", causal=True, schedule="flash2")
    assert np.linalg.norm(o3 - o2) / np.linalg.norm(o2) < 1e-2


@needs_hopper
def test_flash3_last_launch_describes_it():
    from iosim import gpu, launch

    rng = seeded_rng()
    _, dev = rand_inputs(rng, 2, 300, 200, 4, 2, 128, "float16")
    run(*dev, "float16", causal=True, schedule="flash3")
    rec = gpu.last_launch()
    bq, bkv = launch.FLASH3_TILES[128]
    assert rec.schedule == "flash3" and rec.causal and (rec.seq_len, rec.kv_len) == (300, 200)
    assert (rec.heads, rec.kv_heads, rec.head_dim, rec.dtype) == (4, 2, 128, "float16")
    assert rec.tiles == {"block_q": bq, "block_kv": bkv, "stages": launch.FLASH3_STAGES}
    (kl,) = rec.launches
    assert kl.kernel == f"iosim::flash3_fwd_kernel<128, {bkv}, __half, true>"
    sms = int(_cp().cuda.Device().attributes["MultiProcessorCount"])
    tiles = launch.flash3_tiles(2, 300, 4, bq)
    assert tiles == -(-300 // bq) * 4 * 2
    assert kl.grid == (min(tiles, sms), 1, 1) and kl.block == (launch.FLASH3_THREADS, 1, 1)  # persistent
    assert kl.smem_bytes == launch.flash3_smem_bytes(128, bq, bkv)


@needs_hopper
def test_flash3_rejects_what_it_does_not_compile():
    from iosim import gpu

    rng = seeded_rng()
    _, (q, k, v) = rand_inputs(rng, 1, 64, 64, 2, 2, 32, "float16")
    with pytest.raises(gpu.AttentionInputError, match="head_dim=32 is not supported by schedule='flash3'"):
        gpu.attention(q, k, v, schedule="flash3")
    _, (q, k, v) = rand_inputs(rng, 1, 64, 64, 2, 2, 128, "float16")
    with pytest.raises(gpu.AttentionInputError, match="one tile per head dim"):
        gpu.attention(q, k, v, schedule="flash3", options=gpu.AttentionOptions(block_q=64, block_kv=64))


@pytest.mark.skipif(HOPPER, reason="checks the error on a non-Hopper GPU")
def test_flash3_says_clearly_it_needs_hopper():
    from iosim import gpu

    rng = seeded_rng()
    _, (q, k, v) = rand_inputs(rng, 1, 64, 64, 2, 2, 128, "float16")
    with pytest.raises(gpu.HopperRequiredError, match="needs a Hopper GPU"):
        gpu.attention(q, k, v, schedule="flash3")


@needs_hopper
@pytest.mark.parametrize("shape", [(1, 2048, 1024, 12, 4), (1, 2500, 1250, 10, 2)], ids=str)
@pytest.mark.parametrize("dtype", DTYPES)
def test_flash3_causal_with_the_host_tile_schedule(shape, dtype):
    """Causal shapes where the host's greedy tile schedule replaces the snake (on a 132-SM H100/H200)."""
    from iosim import launch
    from iosim.launch.flash3_schedule import tile_schedule

    B, N, Nk, H, Hk = shape
    sms = int(_cp().cuda.Device().attributes["MultiProcessorCount"])
    G = min(launch.flash3_tiles(B, N, H), sms)
    if sms == 132:
        assert tile_schedule(B, N, Nk, H, 128, 128, True, G) is not None
    rng = seeded_rng()
    host, dev = rand_inputs(rng, B, N, Nk, H, Hk, 128, dtype)
    o, lse = run(*dev, dtype, causal=True, schedule="flash3")
    check(o, lse, *reference(*host, True), dtype, f"flash3 scheduled {shape}")
