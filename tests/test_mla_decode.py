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
