"""MLA decode (iosim.schedules.mla_decode): DeepSeek-V3's latent attention with absorbed weights, in closed form."""

from __future__ import annotations

import pytest

from iosim import ScheduleError
from iosim.schedules.mla_decode import MlaDecode, counts, dram, gqa_intensity, intensity


def test_one_sequence_counted_by_hand():
    m = MlaDecode(batch=1, kv_len=100, q_len=1)  # 128 heads x 1 token = 128 rows: two row blocks of 64
    q, a, o = counts(m).kernels
    assert dict(q.global_read) == {"Q": 128 * 128 * 2, "W_UK": 128 * 128 * 512 * 2}
    assert q.flops["matmul"] == 2 * 128 * 128 * 512
    assert a.grid == 2 and a.global_read["K"] == 2 * 100 * 576 * 2  # the latent cache once per row block
    assert a.global_read["Q"] == 128 * 576 * 2 and dict(a.global_write) == {"O": 128 * 512 * 2, "lse": 128 * 4}
    assert a.flops["matmul"] == 2 * 128 * 100 * (576 + 512) and a.flops["exp"] == 128 * 100
    assert dict(o.global_read) == {"O": 128 * 512 * 2, "W_UV": 128 * 512 * 128 * 2}
    assert dram(m)[1][0] == 128 * 576 * 2 + 100 * 576 * 2  # at DRAM the cache once


def test_every_head_shares_the_latent_so_intensity_is_about_heads_times_1088_over_576():
    m = MlaDecode(batch=64, kv_len=32768)
    per_key = 128 * (2 * (576 + 512) + 1) / (576 * 2)  # FLOPs of 128 rows per cached byte
    assert intensity(m) == pytest.approx(per_key, rel=0.01)
    assert intensity(MlaDecode(batch=64, kv_len=32768, q_len=4)) == pytest.approx(4 * per_key, rel=0.03)
    # the absorbed weights (33.6 MB a layer) weigh on one sequence's step, not on a batch of long ones
    assert intensity(MlaDecode(batch=1, kv_len=32768), attention_only=False) < 0.6 * per_key
    assert intensity(m, attention_only=False) > 0.95 * per_key


def test_gqa_decode_intensity_is_its_group():
    assert gqa_intensity(32, 4, 128, 32768) == pytest.approx(8 * (4 * 128 + 1) / (4 * 128), rel=0.01)
    assert gqa_intensity(32, 32, 128, 32768, q_len=4) == pytest.approx(4.0, rel=0.01)


@pytest.mark.parametrize("kw,match", [(dict(batch=0), r"batch=0; expected a whole number >= 1"),
                                      (dict(q_len=True), r"q_len=True"), (dict(dtype="int8"), r"dtype='int8'")])
def test_bad_shapes_are_refused_naming_the_field(kw, match):
    with pytest.raises(ScheduleError, match=match):
        MlaDecode(**{"batch": 1, "kv_len": 10, **kw})


def test_the_accumulator_in_global_memory_counted_by_hand():
    # torch's design (iosim.timing.mla.reference): 32-row blocks, 128-key tiles; one sequence of 2048 keys is 4
    # blocks of 16 tiles. Each tile reads the block's Q (32 x 576), K (128 x 576) and V (128 x 512, the latent's
    # first 512); the fp32 accumulator (32 x 512) is read at 15 tiles and written at 15, O (bf16) once.
    m = MlaDecode(batch=1, kv_len=2048, block_q=32, block_kv=128, accumulator="global")
    a = counts(m).kernels[1]
    per_block_tile = 32 * 576 * 2 + 128 * 576 * 2 + 128 * 512 * 2
    assert a.global_read_bytes == 4 * (16 * per_block_tile + 15 * 32 * 512 * 4)
    assert a.global_write_bytes == 4 * (15 * 32 * 512 * 4 + 32 * 512 * 2)
    assert a.flops == counts(MlaDecode(batch=1, kv_len=2048)).kernels[1].flops  # the same math as FlashMLA's
    # at DRAM its compulsory bytes: Q and the cache once, O once (its scratch not counted)
    assert dram(m)[1] == (128 * 576 * 2 + 2048 * 576 * 2, 128 * 512 * 2)


def test_an_unknown_accumulator_is_refused():
    with pytest.raises(ScheduleError, match=r"accumulator='shared'; expected one of \['registers', 'global'\]"):
        MlaDecode(batch=1, kv_len=8, accumulator="shared")
