"""iosim.timing.mla: the time of torch's MLA decode attention kernel from its measured step, and of its prefill
attention (cuDNN's kernel at keys of 192 and values of 128) by the fa3 model."""

from __future__ import annotations

import pytest

from iosim.hardware.gpu import get_profile
from iosim.schedules.mla_decode import MlaDecode
from iosim.schedules.mla_prefill import MlaPrefill
from iosim.timing.mla import REFERENCE, MlaTimeError, attention_time, measured, reference, residency, step_key

H200 = "h200-sxm-141gb"


def test_the_reference_is_torchs_tiles_with_the_accumulator_in_global_memory():
    m = reference(64, 4096)
    assert (m.block_q, m.block_kv, m.accumulator) == (32, 128, "global")
    assert step_key(m) == "d576x512_32x128"


@pytest.mark.parametrize("profile", ["h100-sxm5-80gb", H200])
def test_four_blocks_an_sm_by_its_registers_and_shared_memory(profile):
    # 122 registers x 128 threads: 4 blocks of 65,536; 51,200 B + 1 KiB reserved: 4 in 228 KiB
    assert residency(get_profile(profile)) == 4


def test_one_block_an_sm_walks_its_tiles_at_the_lone_step():
    p = get_profile(H200)
    steps, fixed = measured(p, reference(1, 1))
    t = attention_time(reference(1, 32768), p)  # 4 blocks on 4 SMs, 256 tiles each
    assert t.predicted_s == pytest.approx(256 * steps[1] + fixed)
    assert t.bound == "step" and t.grid == 4


def test_a_grid_over_the_sms_takes_the_step_of_its_busiest_sm():
    p = get_profile(H200)
    steps, fixed = measured(p, reference(1, 1))
    # 64 sequences: 256 blocks on 132 SMs, two on most; 128: 512, four on most (one wave of 528 slots)
    assert attention_time(reference(64, 4096), p).predicted_s == pytest.approx(32 * steps[2] + fixed)
    assert attention_time(reference(128, 2048), p).predicted_s == pytest.approx(16 * steps[4] + fixed)
    # 200 sequences: 800 blocks, a whole wave of 528 then 272 (3 on the busiest SM)
    assert attention_time(reference(200, 1024), p).predicted_s == pytest.approx(8 * (steps[4] + steps[3]) + fixed)


def test_no_measured_step_no_model():
    assert attention_time(reference(64, 4096), get_profile("a100-sxm4-80gb")) is None


def test_other_designs_are_refused():
    with pytest.raises(MlaTimeError, match="accumulator='registers', 64 x 64, bf16"):
        attention_time(MlaDecode(batch=1, kv_len=64), get_profile(H200))
    assert REFERENCE.name.startswith("fmha_cutlassF")


def test_the_prefill_reference_is_torchs_expansion_on_cudnns_tiles():
    from iosim.timing.mla import PREFILL_REFERENCE, prefill_reference

    m = prefill_reference(2, 4096)
    assert (m.expansion, m.block_q, m.block_kv, m.kv_len, m.key_dim) == ("gemm+cat", 128, 128, 4096, 192)
    assert PREFILL_REFERENCE.kernel == "cudnn" and "64x128x192" in PREFILL_REFERENCE.name


def test_prefill_on_the_h200_walks_cudnns_measured_step_tile_and_call():
    """512 Q tiles of 4 steps each (one sequence of 512 tokens, 128 heads, not causal) on 132 SMs in the grid's order:
    the busiest SM takes 4 tiles; the call is its measured fixed part, 4 tile parts and 16 steps."""
    from iosim.timing.fa3 import value_key
    from iosim.timing.mla import PREFILL_REFERENCE, prefill_attention_time, prefill_reference

    p = get_profile(H200)
    key = value_key("bf16", 128, PREFILL_REFERENCE)
    step, tile, call = (getattr(p.calibration.forward, part)["cudnn"][key].value[192]
                        for part in ("step", "tile_fixed", "call_fixed"))
    m = MlaPrefill(batch=1, seq_len=512, kv_len=512, causal=False, expansion="gemm+cat")
    t = prefill_attention_time(m, p, run="single")
    assert t.kernel == "cudnn" and t.kernels[0].bound == "step (measured)"
    assert t.predicted_s == pytest.approx(call + 4 * (tile + 4 * step))
    assert prefill_attention_time(prefill_reference(1, 512), p).predicted_s < t.predicted_s  # causal: fewer steps


def test_prefill_without_a_measured_step_composes_it_from_the_rates():
    from iosim.timing.mla import prefill_attention_time, prefill_reference

    t = prefill_attention_time(prefill_reference(1, 4096), get_profile("h100-sxm5-80gb"))
    assert t.kernels[0].bound in ("tensor", "softmax", "load")


def test_prefill_on_other_tiles_is_refused():
    from iosim.timing.mla import prefill_attention_time

    with pytest.raises(MlaTimeError, match="128 x 128 tiles"):
        prefill_attention_time(MlaPrefill(batch=1, seq_len=512, kv_len=512, block_q=64), get_profile(H200))


def test_prefill_on_a_gpu_other_than_hopper_is_a_what_if_said_so():
    from iosim.problem import InputWarning
    from iosim.timing.mla import prefill_attention_time, prefill_reference

    with pytest.warns(InputWarning, match="not a Hopper GPU"):
        t = prefill_attention_time(prefill_reference(1, 1024), get_profile("a100-sxm4-80gb"))
    assert t.predicted_s > 0  # the counts hold; the time is the Hopper model's
