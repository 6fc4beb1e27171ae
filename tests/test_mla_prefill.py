"""MLA prefill (iosim.schedules.mla_prefill): DeepSeek-V3's latent attention on a chunk of new tokens, keys and values
expanded from the latent cache, in closed form; counts derived by hand below."""

from __future__ import annotations

import pytest

from iosim import ScheduleError
from iosim.schedules.mla_prefill import MlaPrefill, counts, dram, gqa_intensity, intensity


def test_one_sequence_of_two_tiles_counted_by_hand():
    m = MlaPrefill(batch=1, seq_len=256, kv_len=256)  # causal: Q tile 0 sees K/V tile 0, Q tile 1 tiles 0 and 1
    up, a = counts(m).kernels
    assert dict(up.global_read) == {"c_KV": 256 * 512 * 2, "k_R": 256 * 64 * 2, "W_UK": 512 * 128 * 128 * 2,
                                    "W_UV": 512 * 128 * 128 * 2}
    assert dict(up.global_write) == {"K": 256 * 128 * 192 * 2, "V": 256 * 128 * 128 * 2}
    assert up.flops["matmul"] == 2 * 256 * 512 * 128 * (128 + 128)
    keys_streamed = 128 + 256  # K/V rows loaded over the two Q tiles
    assert a.grid == 128 * 2
    assert dict(a.global_read) == {"Q": 128 * 256 * 192 * 2, "K": 128 * keys_streamed * 192 * 2,
                                   "V": 128 * keys_streamed * 128 * 2}
    assert dict(a.global_write) == {"O": 128 * 256 * 128 * 2, "lse": 128 * 256 * 4}
    scores = 128 * 128 + 128 * 256  # the visited tiles' scores, masked ones included
    assert a.flops["matmul"] == 2 * 128 * scores * (192 + 128) and a.flops["exp"] == 128 * scores
    assert dram(m)[1] == (128 * (256 * 192 + 256 * (192 + 128)) * 2, a.global_write_bytes)  # Q, K, V once


def test_a_chunk_after_a_cached_prefix_expands_every_key_it_sees():
    first = MlaPrefill(batch=2, seq_len=4096, kv_len=4096)
    chunk = MlaPrefill(batch=2, seq_len=4096, kv_len=16384)  # the last 4096 of 16384 tokens
    assert counts(chunk).kernels[0].global_write_bytes == 4 * counts(first).kernels[0].global_write_bytes
    # the chunk's rows see 4x the keys (bottom-right causal): about 7x the first chunk's causal triangle of scores
    ratio = counts(chunk).kernels[1].flops["exp"] / counts(first).kernels[1].flops["exp"]
    assert 6.5 < ratio < 7.5


def test_attention_intensity_grows_with_the_chunk_and_the_expansion_weighs_on_it():
    short, long_ = MlaPrefill(batch=1, seq_len=1024, kv_len=1024), MlaPrefill(batch=1, seq_len=16384, kv_len=16384)
    assert 12 < intensity(long_) / intensity(short) < 16  # causal: FLOPs grow as N^2, bytes as N
    assert intensity(long_, attention_only=False) < 0.75 * intensity(long_)  # K and V written, then read back


@pytest.mark.parametrize("kw,match", [(dict(batch=0), r"batch=0; expected a whole number >= 1"),
                                      (dict(kv_len=10), r"kv_len=10 < seq_len=100"),
                                      (dict(dtype="int8"), r"dtype='int8'"), (dict(causal=1), r"causal=1")])
def test_bad_shapes_are_refused_naming_the_field(kw, match):
    with pytest.raises(ScheduleError, match=match):
        MlaPrefill(**{"batch": 1, "seq_len": 100, "kv_len": 100, **kw})


def test_gqa_prefill_intensity_counts_the_same_tiles_and_shares_k_and_v_within_a_group():
    # 256 tokens, causal, 128-tiles: 128 * 128 + 128 * 256 visited scores a head; Q, K, V, O once
    got = gqa_intensity(32, 8, 128, 256)
    flops = 32 * (128 * 128 + 128 * 256) * (4 * 128 + 1)
    assert got == pytest.approx(flops / (2 * 256 * 32 * 128 * 2 + 2 * 256 * 8 * 128 * 2 + 256 * 32 * 4))
    assert gqa_intensity(32, 8, 128, 4096) > intensity(MlaPrefill(batch=1, seq_len=4096, kv_len=4096))


def test_torchs_expansion_a_gemm_then_a_copy_counted_by_hand():
    m = MlaPrefill(batch=1, seq_len=256, kv_len=256, expansion="gemm+cat")
    up, cat, a = counts(m).kernels
    assert (up.name, cat.name, a.name) == ("mla_kv_up", "mla_k_cat", "mla_attention")
    assert dict(up.global_read) == {"c_KV": 256 * 512 * 2, "W_UK": 512 * 128 * 128 * 2, "W_UV": 512 * 128 * 128 * 2}
    assert dict(up.global_write) == {"K_nope": 256 * 128 * 128 * 2, "V": 256 * 128 * 128 * 2}  # side by side
    assert dict(cat.global_read) == {"K_nope": 256 * 128 * 128 * 2, "k_R": 256 * 128 * 64 * 2}  # k_R at each head
    assert dict(cat.global_write) == {"K": 256 * 128 * 192 * 2}
    assert up.grid == cat.grid == 2 * 128  # a block per 128 keys of one head
    assert cat.total_flops == 0 and up.flops["matmul"] == 2 * 256 * 512 * 128 * 256
    d = dram(m)
    assert d[1] == (256 * 128 * 128 * 2 + 256 * 64 * 2, 256 * 128 * 192 * 2)  # k_R once a token at DRAM
    fused = MlaPrefill(batch=1, seq_len=256, kv_len=256)
    assert a == counts(fused).kernels[-1] and d[2] == dram(fused)[-1]  # the attention is the same either way
    # the copy writes K_nope once more and reads it back: the fused kernel's bytes and twice K_nope
    assert sum(map(sum, d[:2])) == sum(dram(fused)[0]) + 2 * 256 * 128 * 128 * 2


def test_an_unknown_expansion_is_refused():
    with pytest.raises(ScheduleError, match=r"expansion='cat'; expected one of \['fused', 'gemm\+cat'\]"):
        MlaPrefill(batch=1, seq_len=100, kv_len=100, expansion="cat")
