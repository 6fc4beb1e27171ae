"""The energy model (iosim.timing.energy): each unit of work at its calibrated energy, shared-memory bytes as the
kernel models move them."""

from __future__ import annotations

import pytest

from iosim import AttentionProblem, get_profile, simulate
from iosim.blocks import cdiv
from iosim.timing import load_kernel
from iosim.timing.energy import KernelWork, energy_j

H100 = "h100-sxm5-80gb"


def _power(profile: str = H100):
    return get_profile(profile).calibration.power


def test_the_built_in_hopper_profiles_price_shared_memory():
    for name in (H100, "h200-sxm-141gb"):
        power = _power(name)
        assert power.smem is not None and 0 < power.smem.value < power.l2.value < power.dram.value


def test_shared_memory_bytes_add_their_measured_energy_and_nothing_else():
    r = simulate("flash2", AttentionProblem(batch=2, heads=4, seq_len=1024, head_dim=64), H100, kernel="iosim-flash2")
    power = _power()
    args, smem = (r.counts, 1e6, 1e-4, "bf16", "fa2", power), KernelWork(smem_bytes=1e9)
    assert energy_j(*args, smem) - energy_j(*args) == pytest.approx(power.smem.value * 1e9)
    assert energy_j(*args[:-1], power.model_copy(update={"smem": None}), smem) == pytest.approx(energy_j(*args))


def test_fa2_moves_each_step_s_tiles_through_shared_memory():
    """Hand count of iosim-flash2 at d = 64 (Br = 128, Bc = 64, 4 warps, Q read from shared memory at every step):
    per step K_j and V_j landed, every warp's read of both and the block's read of Q_i; Q_i landed and read once
    per block."""
    p = AttentionProblem(batch=2, heads=4, seq_len=1024, kv_len=960, head_dim=64)
    tc, warps = load_kernel("iosim-flash2").tiles_for(64), load_kernel("iosim-flash2").warps
    assert (tc.block_q, tc.block_kv, warps, tc.q_in_registers) == (128, 64, 4, False)
    blocks, steps = 8 * 8, 8 * 8 * cdiv(960, 64)
    tile = 64 * 64 * 2  # one K/V tile, bf16
    want = steps * (2 * tile + warps * 2 * tile + 128 * 64 * 2) + blocks * 2 * 128 * 64 * 2
    (k,) = simulate("flash2", p, H100, kernel="iosim-flash2").time.kernels
    assert k.smem_bytes == want


def test_the_causal_mask_skips_shared_memory_reads():
    for schedule, kernel in (("flash2", "iosim-flash2"), ("naive", "iosim-naive"), ("flash2", "iosim-flash2-bwd")):
        pass_ = "backward" if kernel.endswith("-bwd") else "forward"
        full, causal = (sum(k.smem_bytes for k in simulate(schedule, AttentionProblem(heads=4, seq_len=2048,
                        head_dim=128, causal=c), H100, kernel=kernel, pass_=pass_).time.kernels) for c in (False, True))
        assert 0 < causal < full, kernel


def test_wgmma_kernels_price_their_operands_in_the_flop_energy():
    r = simulate("flash3", AttentionProblem(heads=4, seq_len=2048, head_dim=128), H100, kernel="cudnn")
    assert all(k.smem_bytes == 0 for k in r.time.kernels)


def test_the_predicted_energy_is_the_formula_on_the_predicted_time():
    r = simulate("naive", AttentionProblem(heads=4, seq_len=2048, head_dim=128), H100, kernel="iosim-naive", l2=True)
    hbm = r.time_hbm["read_bytes"] + r.time_hbm["write_bytes"]
    ks = r.time.kernels
    smem, tensor, l2 = (sum(getattr(k, f) for k in ks) for f in ("smem_bytes", "tensor_flops", "l2_bytes"))
    assert r.time.clock.shares == (1.0, 0.0, 0.0)  # a short call: the records' median before the limiter acts
    assert smem > 0 and r.time.energy_j == pytest.approx(
        energy_j(r.counts, hbm, r.time.predicted_s, "fp16", "naive", _power(), KernelWork(smem, tensor, l2),
                 r.time.clock.start_hz))


def test_standard_attention_s_kernels_skip_the_tiles_the_causal_mask_empties():
    """naive.cu multiplies a 128 x 128 tile of S only where a row of it sees a key: at N = 1024 (8 x 8 tiles) the
    36 tiles on and below the diagonal of each head; P V's 128 x 64 tiles likewise (8 rows of tiles: 2, 4, .., 16
    of the 16 key tiles)."""
    p = AttentionProblem(heads=2, seq_len=1024, head_dim=64, causal=True)
    scores, softmax, pv = simulate("naive", p, H100, kernel="iosim-naive").time.kernels
    assert scores.tensor_flops == 2 * 36 * 2 * 128 * 128 * 64
    assert softmax.tensor_flops == 0
    assert pv.tensor_flops == 2 * sum(range(2, 17, 2)) * 2 * 128 * 64 * 64


def test_standard_attention_prices_the_l2_re_reads_of_its_tiles():
    """The description's counts are the paper's (each operand read once); naive.cu's scores kernel reads Q_i once
    per 128-key tile and K_j once per 128-row tile, its P V kernel V once per 128 rows: the energy's L2 bytes."""
    N, d, e, heads = 1000, 64, 2, 3
    p = AttentionProblem(heads=heads, seq_len=N, head_dim=d)
    r = simulate("naive", p, H100, kernel="iosim-naive")
    scores, softmax, pv = r.time.kernels
    tiles = cdiv(N, 128)
    assert scores.l2_bytes == heads * (tiles * N * d * e * 2 + N * N * e)
    assert softmax.l2_bytes == heads * 2 * N * N * e
    assert pv.l2_bytes == heads * (N * N * e + tiles * N * d * e + N * d * e)
    assert r.counts.global_bytes < sum(k.l2_bytes for k in r.time.kernels)
