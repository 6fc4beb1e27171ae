"""The fp8 forward's host side without a GPU: the e4m3 decoding table, V^T's key order, the rotation's signs and the
argument checks that need no device."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from iosim import launch
from iosim.gpu import fp8


def test_e4m3_table_decodes_every_byte_as_ml_dtypes():
    want = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    got = fp8._E4M3_TABLE
    assert np.array_equal(np.isnan(got), np.isnan(want))
    assert np.array_equal(got[~np.isnan(got)], want[~np.isnan(want)])


def test_key_order_is_the_register_fragment_of_p():
    """k position 4t + e of P's fp8 A fragment holds the accumulator's column 8 * (e // 2) + 2t + e % 2."""
    order = [fp8.fp8_key_of(p) for p in range(launch.FP8_KEY_GROUP)]
    assert sorted(order) == list(range(16))
    for t in range(4):
        assert order[4 * t: 4 * t + 4] == [2 * t, 2 * t + 1, 8 + 2 * t, 9 + 2 * t]


@pytest.mark.parametrize("d", sorted(launch.FLASH3_FP8_TILES))
def test_rotation_signs_are_plus_minus_one_and_repeatable(d):
    s = fp8.rotation_signs(d, 5)
    assert s.dtype == np.float32 and s.shape == (d,) and set(np.unique(s)) <= {-1.0, 1.0}
    assert np.array_equal(s, fp8.rotation_signs(d, 5)) and not np.array_equal(s, fp8.rotation_signs(d, 6))


def test_fp8_blocks_are_the_kernel_tiles_and_refuse_other_head_dims():
    for d, tiles in launch.FLASH3_FP8_TILES.items():
        assert fp8.fp8_blocks(d) == tiles
    with pytest.raises(fp8.AttentionInputError, match="head dims"):
        fp8.fp8_blocks(96)


def test_attention_refuses_plain_arrays_as_fp8():
    q = fp8.Fp8Tensor(None, None, (1, 8, 2, 128), 128)
    with pytest.raises(fp8.AttentionTypeError, match="quantize_fp8"):
        fp8._check_fp8(q, np.zeros((1, 8, 2, 128)), q)
