"""fp8 (e4m3) forward, issue 27: iosim's fp8 flash3 kernel counted in the layout it reads (V^T padded to 16 keys,
fp32 block scales, O in bf16), the quantize kernels that write that layout, and the fp8 time model on calibrated
rates. Expected bytes are derived here by hand from the kernel's contract (docs/schedules/flash3.md), not read off
the code under test."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from iosim import AttentionProblem, get_profile, simulate
from iosim.launch import forward as launch_forward
from iosim.schedules import AUXILIARY, SCHEDULES, ScheduleError, Tiles, get_schedule
from iosim.schedules.flash3_fp8 import Fp8LayoutTiles
from iosim.schedules.fp8_quantize import QuantizeTiles
from iosim.simulate import closed, walk
from iosim.timing import load_kernel

H100 = get_profile("h100-sxm5-80gb")
F32 = 4  # a scale, an lse value


def fp8(**kw) -> AttentionProblem:
    return AttentionProblem(dtype="fp8", **kw)


def ours(p: AttentionProblem, **kw):
    return simulate("flash3", p, H100, kernel="iosim-flash3", **kw)


# -- the attention kernel's bytes ---------------------------------------------------------------------------------


def test_noncausal_bytes_by_hand_with_keys_not_a_multiple_of_16():
    # N = 300 -> 3 Q blocks of 128; N_kv = 200 -> 2 K/V blocks of 128 (200 = 128 + 72), V^T padded to 208 keys
    p = fp8(batch=1, heads=2, kv_heads=1, seq_len=300, kv_len=200, head_dim=64)
    r = ours(p, l2=False)
    assert r.tiles == Fp8LayoutTiles(128, 128)
    heads, d = 2, 64
    read, write = r.counts.global_read, r.counts.global_write
    assert read["Q"] == heads * 300 * d * 1  # e4m3, read once per Q block
    assert read["K"] == heads * 3 * 200 * d * 1  # every Q block streams all 200 keys
    assert read["V"] == heads * 3 * 208 * d * 1  # ... and V^T's 208: the last tile holds 72 keys + 8 of padding
    assert read["q_scale"] == heads * 3 * F32  # one per Q block
    assert read["k_scale"] == read["v_scale"] == heads * 3 * 2 * F32  # one each per K/V block visit
    assert write["O"] == heads * 300 * d * 2  # bf16, the output dtype
    assert write["lse"] == heads * 300 * F32
    assert set(read) == {"Q", "K", "V", "q_scale", "k_scale", "v_scale"} and set(write) == {"O", "lse"}


def test_causal_bytes_by_hand_skip_the_blocks_above_the_diagonal():
    # N = N_kv = 200, tiles 128 x 128 (d = 64): Q block 0 (rows 0-127) sees K/V block 0 only; Q block 1 (rows
    # 128-199) both
    p = fp8(batch=2, heads=1, seq_len=200, head_dim=64, causal=True)
    r = ours(p, l2=False)
    d, heads = 64, 2
    assert launch_forward.FLASH3_FP8_TILES[d] == (128, 128)
    read = r.counts.global_read
    assert read["K"] == heads * (128 + 128 + 72) * d
    assert read["V"] == heads * (128 + 128 + 80) * d  # the last block's V^T: 72 keys padded to 80
    assert read["k_scale"] == read["v_scale"] == heads * 3 * F32  # 3 visits
    assert read["q_scale"] == heads * 2 * F32


def test_a_multiple_of_16_keys_reads_v_exactly_as_k():
    r = ours(fp8(heads=4, seq_len=1024, kv_len=4000, head_dim=128, causal=True), l2=False)
    assert r.counts.global_read["V"] == r.counts.global_read["K"]


@given(st.integers(1, 300), st.integers(1, 300), st.sampled_from([16, 64]), st.booleans(), st.integers(1, 3),
       st.sampled_from([16, 32, 64]), st.sampled_from([16, 48, 64]))
def test_the_fp8_layouts_closed_form_equals_its_walk(N, Nk, d, causal, group, Br, Bc):
    p = fp8(seq_len=N, kv_len=Nk, head_dim=d, causal=causal, heads=2 * group, kv_heads=2)
    t = Fp8LayoutTiles(Br, Bc)
    c, w = closed("flash3", p, t).normalized(), walk("flash3", p, t).normalized()
    assert w.kernels[0].sram_peak <= c.kernels[0].sram_peak  # the closed form's peak bounds the walk's, as flash3's
    w.kernels[0].sram_peak = c.kernels[0].sram_peak = None
    assert w == c


def test_only_the_bytes_change_from_the_plain_fp8_walk():
    """Against the same tiles counted as FA3's fp8 (plain Tiles): V grows by the padding, O doubles, scales appear;
    Q, K, lse and every FLOP stay."""
    p = fp8(batch=1, heads=2, seq_len=333, kv_len=250, head_dim=64, causal=True)
    a, b = closed("flash3", p, Tiles(64, 64)), closed("flash3", p, Fp8LayoutTiles(64, 64))
    assert a.flops == b.flops
    for t in ("Q", "K"):
        assert a.global_read[t] == b.global_read[t]
    assert b.global_write["O"] == 2 * a.global_write["O"] and b.global_write["lse"] == a.global_write["lse"]
    # 250 keys = 3 full blocks of 64 + 58, padded to 64; the Q blocks whose rows see key 192 or later visit it
    last_visits = sum(1 for i in range(6) if min((i + 1) * 64, 333) - 1 + (250 - 333) >= 192)
    assert b.global_read["V"] - a.global_read["V"] == 2 * last_visits * (64 - 58) * 64


def test_bf16_through_our_kernel_is_flash2s_traffic_and_fa3_keeps_fa3s_fp8():
    pb = AttentionProblem(heads=8, seq_len=2048, head_dim=128, dtype="bf16")
    assert ours(pb, l2=False).counts.global_read == simulate("flash3", pb, H100, kernel="fa3", l2=False).counts.global_read
    p8 = pb.model_copy(update={"dtype": "fp8"})
    for kernel in ("fa3", None):  # FA3's published fp8 kernel: its tiles, Q, K, V as given, no scales, O as counted
        r = simulate("flash3", p8, H100, kernel=kernel, l2=False)
        assert r.tiles == Tiles(128, 224) and type(r.tiles) is Tiles
        assert "q_scale" not in r.counts.global_read and r.counts.global_write["O"] == 8 * 2048 * 128 * 1


def test_our_kernels_tiles_are_the_launchs():
    desc = load_kernel("iosim-flash3")
    for d, (br, bc) in launch_forward.FLASH3_FP8_TILES.items():
        assert (desc.tiles_for(d, "fp8").block_q, desc.tiles_for(d, "fp8").block_kv) == (br, bc)
        assert ours(fp8(seq_len=512, head_dim=d), l2=False).tiles == Fp8LayoutTiles(br, bc)
    for d, (br, bc) in launch_forward.FLASH3_TILES.items():
        assert (desc.tiles_for(d).block_q, desc.tiles_for(d).block_kv) == (br, bc)
    assert launch_forward.FP8_KEY_GROUP == 16


def test_the_layout_needs_whole_key_groups():
    with pytest.raises(ScheduleError, match="multiple of 16"):
        ours(fp8(seq_len=256, head_dim=64), block_kv=40)


def test_dram_is_every_distinct_byte_once_by_hand():
    # GQA 4:2, causal N = N_kv = 200, d = 64: every Q block sees a key; the most blocks one visits is both
    p = fp8(batch=1, heads=4, kv_heads=2, seq_len=200, head_dim=64, causal=True)
    r = ours(p)
    assert r.hbm_model.startswith("closed form (iosim.schedules.flash3_fp8.dram)")
    d = 64
    reads = 4 * (200 * d + 2 * F32) + 2 * (200 * d + 208 * d + 2 * 2 * F32)  # Q + q scales; K, V^T, k and v scales
    writes = 4 * 200 * (d * 2 + F32)
    assert (r.traffic["hbm"]["read_bytes"], r.traffic["hbm"]["write_bytes"]) == (reads, writes)
    assert r.time.kernels[0].resources["hbm"] == pytest.approx((reads + writes) / H100.require("dram.bandwidth"))


def test_the_numeric_executor_refuses_block_scales_it_does_not_run():
    import numpy as np

    from iosim.numeric import execute

    p = fp8(seq_len=32, head_dim=16)
    q = np.ones((1, 32, 1, 16))
    with pytest.raises(ValueError, match="block quantization"):
        execute("flash3", p, q, q, q, Fp8LayoutTiles(16, 16))


# -- the quantize kernels -----------------------------------------------------------------------------------------


def test_quantize_bytes_and_flops_by_hand():
    B, H, Hk, N, Nk, d = 2, 4, 2, 300, 200, 64
    p = fp8(batch=B, heads=H, kv_heads=Hk, seq_len=N, kv_len=Nk, head_dim=d)
    r = simulate("fp8-quantize", p, H100, l2=False)
    assert r.tiles == QuantizeTiles(128, 128)  # the attention kernel's tiles at d = 64
    q, k, v = r.counts.kernels
    assert (q.name, k.name, v.name) == ("quantize_q", "quantize_k", "quantize_v")
    assert (q.grid, k.grid, v.grid) == (B * H * 3, B * Hk * 2, B * Hk * 2)
    assert q.global_read == {"Q": 2 * B * H * N * d * 2}  # bf16, read twice (amax pass, quantize pass)
    assert q.global_write == {"Q": B * H * N * d, "q_scale": B * H * 3 * F32}
    assert k.global_read == {"K": 2 * B * Hk * Nk * d * 2}
    assert k.global_write == {"K": B * Hk * Nk * d, "k_scale": B * Hk * 2 * F32}
    assert v.global_write == {"V": B * Hk * 208 * d, "v_scale": B * Hk * 2 * F32}  # V^T with its padding keys
    assert q.flops["other"] == B * H * (2 * N * d + 3)  # |x| and max, a multiply per element; a division per block
    rot = simulate("fp8-quantize", p, H100, l2=False, incoherent=True).counts.kernels
    assert rot[0].flops["other"] - q.flops["other"] == B * H * N * d * 6  # Hadamard: d log2 d adds per row
    assert rot[1].flops["other"] - k.flops["other"] == B * Hk * Nk * d * 6 and rot[2].flops == v.flops  # not V


def test_quantize_dram_reads_each_input_once():
    p = fp8(batch=1, heads=2, seq_len=100, kv_len=90, head_dim=64)
    r = simulate("fp8-quantize", p, H100)
    assert r.hbm_model.startswith("closed form (iosim.schedules.fp8_quantize.dram)")
    assert r.hbm_read == [2 * 100 * 64 * 2, 2 * 90 * 64 * 2, 2 * 90 * 64 * 2]
    assert r.hbm_write == [k.global_write_bytes for k in r.counts.kernels]


@given(st.integers(1, 300), st.integers(1, 300), st.sampled_from([16, 64, 128]), st.integers(1, 3),
       st.sampled_from([16, 64, 128]), st.sampled_from([16, 64, 128]), st.booleans())
def test_quantize_closed_form_equals_its_walk(N, Nk, d, group, Br, Bc, incoherent):
    p = fp8(seq_len=N, kv_len=Nk, head_dim=d, heads=2 * group, kv_heads=2)
    t = QuantizeTiles(Br, Bc, incoherent=incoherent)
    assert closed("fp8-quantize", p, t).normalized() == walk("fp8-quantize", p, t).normalized()


def test_quantize_is_not_an_attention_schedule_and_says_what_it_takes():
    assert "fp8-quantize" in AUXILIARY and "fp8-quantize" not in SCHEDULES
    with pytest.raises(ScheduleError, match="dtype='bf16'"):
        simulate("fp8-quantize", AttentionProblem(seq_len=64, dtype="bf16"), H100)
    with pytest.raises(ScheduleError, match="power of two"):
        simulate("fp8-quantize", fp8(seq_len=64, head_dim=96), H100, incoherent=True)
    with pytest.raises(ScheduleError, match="no 'backward' pass"):
        get_schedule("fp8-quantize", "backward")
    with pytest.raises(ScheduleError, match="only fp8-quantize incoherent"):
        simulate("flash2", fp8(seq_len=64), H100, incoherent=True)


def test_quantize_plus_attention_against_bf16_attention_in_dram_bytes_by_hand():
    """What the report's comparison adds up: at N = N_kv = 4096, d = 128, 8 heads, non-causal, the fp8 call moves
    bf16 Q, K, V in once (2 B), e4m3 out and back in (1 B twice), V^T unpadded, O in bf16 both ways."""
    n, d, h = 4096, 128, 8
    p8 = fp8(heads=h, seq_len=n, head_dim=d)
    qz, att = simulate("fp8-quantize", p8, H100), ours(p8)
    blocks = n // 128 + 2 * -(-n // launch_forward.FLASH3_FP8_TILES[d][1])  # Q's scales, K's and V's
    fp8_total = (3 * h * n * d * 2 + 3 * h * n * d + h * blocks * F32  # quantize: bf16 in, e4m3 + scales out
                 + 3 * h * n * d + h * blocks * F32  # attention reads the e4m3 tensors and scales once
                 + h * n * (d * 2 + F32))  # O in bf16, lse
    got = sum(qz.hbm_read) + sum(qz.hbm_write) + sum(att.hbm_read) + sum(att.hbm_write)
    assert got == fp8_total
    bf16 = ours(p8.model_copy(update={"dtype": "bf16"}), l2=False)
    compulsory_bf16 = 3 * h * n * d * 2 + h * n * (d * 2 + F32)
    assert bf16.counts.global_bytes > compulsory_bf16  # bf16's requests; its DRAM floor is the compulsory bytes


# -- the time model -----------------------------------------------------------------------------------------------


def _with_fp8_wgmma(profile, factor: float):
    """``profile`` as if ``iosim calibrate rates`` had measured fp8 wgmma at ``factor`` x its bf16 table."""
    wg = profile.calibration.wgmma
    fp8_rates = wg.bf16.model_copy(update={n: getattr(wg.bf16, n).model_copy(update={"value": {
        k: v * factor for k, v in getattr(wg.bf16, n).value.items()}}) for n in ("n128", "n256")})
    cal = profile.calibration.model_copy(update={"wgmma": wg.model_copy(update={"fp8": fp8_rates})})
    return profile.model_copy(update={"calibration": cal})


@pytest.mark.parametrize("kernel", ["iosim-flash3", "fa3", "cudnn"])
def test_fp8_tensor_time_is_the_calibrated_fp8_wgmma_rate_where_measured(kernel):
    p = fp8(batch=4, heads=16, seq_len=4096, head_dim=128)
    prof = _with_fp8_wgmma(H100, 1.7)
    r = simulate("flash3", p, prof, kernel=kernel, l2=False)
    fp8_rate = max(prof.calibration.wgmma.fp8.n128.value.values())
    br, bc = r.tiles.block_q, r.tiles.block_kv  # the tensor cores run whole tiles (a ragged last K/V tile too)
    tiles = p.batch * p.heads * -(-p.seq_len // br) * -(-p.kv_len // bc)
    assert r.time.kernels[0].resources["tensor"] == pytest.approx(tiles * 4 * br * bc * p.head_dim / fp8_rate,
                                                                  rel=1e-9)
    assert "fp8 wgmma not measured" not in r.time.calibration


def test_without_an_fp8_measurement_the_fp16_share_applies_and_the_estimate_says_so():
    p = fp8(batch=4, heads=16, seq_len=4096, head_dim=128)
    cal = H100.calibration.model_copy(update={"wgmma": H100.calibration.wgmma.model_copy(update={"fp8": None})})
    prof = H100.model_copy(update={"calibration": cal})  # a profile calibrated before the fp8 probe
    r = simulate("flash3", p, prof, kernel="iosim-flash3", l2=False)
    wg = max(H100.calibration.wgmma.fp16.n128.value.values())
    rate = wg / H100.matmul_rate("fp16") * H100.matmul_rate("fp8")
    br, bc = r.tiles.block_q, r.tiles.block_kv
    tiles = p.batch * p.heads * -(-p.seq_len // br) * -(-p.kv_len // bc)
    assert r.time.kernels[0].resources["tensor"] == pytest.approx(tiles * 4 * br * bc * p.head_dim / rate, rel=1e-9)
    assert "fp8 wgmma not measured" in r.time.calibration


def test_fp8_loads_cost_half_of_bf16s_and_our_o_store_is_bf16():
    pb = AttentionProblem(batch=4, heads=16, seq_len=4096, head_dim=128, dtype="bf16")
    p8 = pb.model_copy(update={"dtype": "fp8"})
    tb = simulate("flash3", pb, H100, kernel="iosim-flash3", l2=False).time.kernels[0].resources
    t8 = simulate("flash3", p8, H100, kernel="iosim-flash3", l2=False).time.kernels[0].resources
    assert t8["load"] == pytest.approx(tb["load"] / 2)
    heads, n, d = 4 * 16, 4096, 128
    blocks, kv_blocks = n // 128, -(-n // launch_forward.FLASH3_FP8_TILES[d][1])
    compulsory = heads * (n * d * 1 + blocks * F32 + n * d * 2 + n * F32) + heads * 2 * (n * d * 1 + kv_blocks * F32)
    assert t8["hbm"] * H100.require("dram.bandwidth") == pytest.approx(compulsory, rel=1e-12)
    assert tb["hbm"] * H100.require("dram.bandwidth") == pytest.approx(heads * (4 * n * d * 2 + n * F32), rel=1e-12)
    assert math.isfinite(t8["pipeline"]) and t8["pipeline"] < tb["pipeline"]


def test_a_profile_with_an_fp8_wgmma_table_validates_and_one_without_still_does():
    data = _with_fp8_wgmma(H100, 2.0).model_dump(mode="json", exclude_none=True)
    again = type(H100).model_validate(data)
    assert again.calibration.wgmma.fp8 == _with_fp8_wgmma(H100, 2.0).calibration.wgmma.fp8
    del data["calibration"]["wgmma"]["fp8"]  # a profile calibrated before the fp8 probe
    assert type(H100).model_validate(data).calibration.wgmma.fp8 is None


def test_our_fp8_result_writes_its_layout_in_the_json_and_the_cli(capsys):
    """`iosim simulate flash3 --dtype fp8 --kernel iosim-flash3` failed writing its tiles (the JSON had no field for the
    fp8 layout option): the JSON now carries it, reads back unchanged, and the CLI prints it."""
    import json

    from helpers import run_cli

    from iosim.result import ResultJSON

    r = ours(fp8(batch=2, heads=4, seq_len=1024, head_dim=128), l2=False)
    written = json.dumps(r.to_json(), indent=2)
    assert json.loads(written)["tiles_by_pass"]["forward"]["layout"] == "iosim-fp8"
    assert json.dumps(ResultJSON.model_validate_json(written).to_json(), indent=2) == written
    code, out, _ = run_cli(["simulate", "flash3", "--seq-len", "1024", "--heads", "4", "--head-dim", "128",
                            "--dtype", "fp8", "--kernel", "iosim-flash3"], capsys)
    assert code == 0 and "layout=iosim-fp8" in out
