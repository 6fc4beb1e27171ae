"""The fp8 part of the byte record without a GPU (benchmarks/validation_record.py --part fp8, validation_fp8.py): the
runs' arguments, the worker's fp8 calls on stand-ins for torch and iosim.gpu, and a made-up ncu CSV of one fp8
attention run (its quantize launches before its marker) and one quantize run through the parse, the grouping, the
merge, the simulation and the judge as a measured record would go. Expected bytes are worked out here by hand from
the kernels' contracts (docs/schedules/flash3.md, kernels/flash3_fwd.cu's TMA boxes), not read off the code."""

from __future__ import annotations

import json
import tarfile
from types import SimpleNamespace

import pytest
from helpers import FakeNcuCsv, load_benchmark

from iosim import measure as M
from iosim.launch import FLASH3_FP8_TILES
from iosim.measure import worker
from iosim.measure.records import merge_repeats
from iosim.validation import Check, judge_all, read_checks

H100 = "h100-sxm5-80gb"
# B = 1, H = 2 query heads on 1 kv head, N = 300, N_kv = 200, d = 64: tiles 128 x 128, 3 Q tiles, 2 K/V tiles, V^T
# padded to 208 keys
SHAPE = dict(seq_len=300, kv_len=200, heads=2, kv_heads=1, head_dim=64, dtype="fp8")
RUNS = [M.Attention("flash3-fp8", **SHAPE), M.Attention("fp8-quantize", **SHAPE)]
QUANT = ["void iosim::quantize_fp8_kernel<__nv_bfloat16, 64, false>(...)",
         "void iosim::quantize_fp8_kernel<__nv_bfloat16, 64, false>(...)",
         "void iosim::quantize_fp8_kernel<__nv_bfloat16, 64, true>(...)"]
ATTN = "void iosim::flash3_fwd_kernel<64, 128, iosim::e4m3, false>(...)"
# by hand: e4m3 Q 2·300·64, K 2·3·200·64 (every Q tile streams every key), V^T 2·3·208·64 (the padding keys too)
ATTN_READS = 2 * 300 * 64 + 2 * 3 * 200 * 64 + 2 * 3 * 208 * 64
ATTN_WRITES = 2 * 300 * 64 * 2 + 2 * 300 * 4  # O in bf16, lse
SCALE_READS = 2 * 3 * 4 + 2 * 2 * 3 * 2 * 4  # a q scale per Q tile; a k and a v scale per K/V tile visit
# the quantize launches: bf16 read twice (amax pass, quantize pass); e4m3 out (V^T: 208 keys) and a scale per block
QUANT_LD = [2 * 2 * 300 * 64 * 2, 2 * 200 * 64 * 2, 2 * 200 * 64 * 2]
QUANT_ST = [2 * 300 * 64 + 2 * 3 * 4, 200 * 64 + 2 * 4, 208 * 64 + 2 * 4]


def _csv() -> str:
    """ncu's --csv page: the attention run's quantize launches (before its marker), its kernel, its end marker; the
    quantize run's three launches between its markers. Values: the bytes worked out above, the SASS loads of the
    attention kernel as Nsight Compute counted them on the GPUs: 4 B a consumer warp (8 a block), 2026-11-26."""
    page = FakeNcuCsv()
    launch = page.launch

    def quantize(scale):  # scale: the attention run's preparation gets other values, which no range may hold
        for name, ld, st in zip(QUANT, QUANT_LD, QUANT_ST, strict=True):
            launch(name, "(3, 2, 1)", {"smsp__sass_data_bytes_mem_global_op_ld.sum": ld * scale,
                                       "smsp__sass_data_bytes_mem_global_op_ldgsts.sum": 0,
                                       "smsp__sass_data_bytes_mem_global_op_st.sum": st * scale,
                                       "dram__bytes_read.sum": ld // 2 * scale, "dram__bytes_write.sum": st * scale})

    quantize(7)
    launch("iosim_marker", "(1, 1, 1)", {"gpu__time_duration.sum": 1})
    launch(ATTN, "(132, 1, 1)", {"l1tex__m_xbar2l1tex_read_bytes_mem_global_op_tma_ld.sum": ATTN_READS,
                                 "smsp__sass_data_bytes_mem_global_op_ld.sum": 8 * SCALE_READS,
                                 "smsp__sass_data_bytes_mem_global_op_st.sum": ATTN_WRITES,
                                 "dram__bytes_read.sum": 60000, "dram__bytes_write.sum": ATTN_WRITES})
    launch("iosim_marker", f"(1, 1, {M.ncu.END_MARKER_Z})", {"gpu__time_duration.sum": 1})
    launch("iosim_marker", "(2, 1, 1)", {"gpu__time_duration.sum": 1})
    quantize(1)
    launch("iosim_marker", f"(2, 1, {M.ncu.END_MARKER_Z})", {"gpu__time_duration.sum": 1})
    return page.text()


def _record() -> dict:
    groups = M.group_by_marker(M.parse_ncu_csv(_csv()))
    tiles = {"block_q": 128, "block_kv": 128}
    entries = []
    for i, run in enumerate(RUNS):
        e = {"run": M.to_dict(run), "kernels": [{"kernel": k["kernel"], **M.summarize(k)} for k in groups[i]],
             "measured": M.sum_launches(groups[i]), "time_ms": 1.0,
             "launch": {"tiles": {**tiles, "stages": 2} if run.kind == "flash3-fp8" else tiles, "kernels": []}}
        entries.append(e)
    return {"device": {"name": "fake"}, "entries": entries}


@pytest.fixture(scope="module")
def vr():
    return load_benchmark("validation_record")


@pytest.fixture(scope="module")
def vf(vr):
    import sys

    return sys.modules["validation_fp8"]


def test_the_fp8_kinds_take_fp8_and_the_kernels_head_dims_and_no_other_kind_does():
    assert set(M.runs.FP8_KINDS) <= set(M.ATTENTION_KINDS)
    with pytest.raises(M.MeasureError, match="dtype='fp8'"):
        M.Attention("flash3-fp8", heads=2, dtype="bf16")
    with pytest.raises(M.MeasureError, match="head_dim in"):
        M.Attention("fp8-quantize", head_dim=96, dtype="fp8")
    with pytest.raises(M.MeasureError, match="fp8: kinds"):
        M.Attention("flash3", dtype="fp8")
    assert M.from_dict(M.to_dict(RUNS[0])) == RUNS[0]


def test_the_quantize_kernels_are_profiled():
    import re

    assert re.search(M.ncu.KERNEL_REGEX, "quantize_fp8_kernel") and re.search(M.ncu.KERNEL_REGEX, "flash3_fwd_kernel")


def test_the_worker_quantizes_outside_the_attention_runs_call_and_records_the_quantize_blocks(monkeypatch):
    calls = []
    fake_gpu = SimpleNamespace(
        fp8_blocks=lambda d: FLASH3_FP8_TILES[d],
        quantize_fp8=lambda x, **kw: calls.append(("quantize", x[1], kw)) or ("fp8", x[1], kw),
        attention=lambda q, k, v, **kw: calls.append(("attention", kw)))
    gen = SimpleNamespace(manual_seed=lambda s: gen)
    fake_torch = SimpleNamespace(bfloat16="bf16", Generator=lambda device: gen,
                                 randn=lambda *shape, **kw: ("x", shape, kw["dtype"]))
    monkeypatch.setattr(worker, "gpu", fake_gpu)
    run = M.Attention("flash3-fp8", seq_len=512, kv_len=384, heads=8, kv_heads=2, head_dim=128, dtype="fp8",
                      causal=True)
    fn, info = worker._prepare(run, None, fake_torch)
    assert info == {} and [c[0] for c in calls] == ["quantize"] * 3  # before the call: outside the run's range
    assert [c[2] for c in calls] == [{"block": 128}, {"block": 192}, {"block": 192, "transpose": True}]
    assert [c[1] for c in calls] == [(1, 512, 8, 128), (1, 384, 2, 128), (1, 384, 2, 128)]
    calls.clear()
    fn()
    assert calls == [("attention", {"schedule": "flash3", "causal": True})]
    fn, info = worker._prepare(M.Attention("fp8-quantize", head_dim=256, dtype="fp8"), None, fake_torch)
    assert info == {"launch": {"tiles": {"block_q": 128, "block_kv": 64}, "kernels": []}}
    calls.clear()
    fn()
    assert [c[0] for c in calls] == ["quantize"] * 3
    assert worker._launch_record(M.Attention("fp8-quantize", dtype="fp8")) is None  # the blocks above stand


def test_a_fake_fp8_record_goes_through_simulate_and_judge_exactly(vr):
    measured = merge_repeats(_record())
    assert [len(m.kernels) for m in measured] == [1, 3]  # the preparation's quantize launches are in no range
    checks = [c for m in measured for c in vr.simulate_measured(m, H100)]
    assert [c.kernel for c in checks[::4]] == ["flash3-fp8", "fp8-quantize"]
    assert all(c.dtype == "fp8" and (c.block_q, c.block_kv) == (128, 128) for c in checks)
    attn, quant = checks[:4], checks[4:]
    # global: TMA loads against Q, K, V^T (the scales' SASS loads are not in it); stores; DRAM as measured
    assert [(c.simulated, c.measured) for c in attn[:2]] == [(ATTN_READS, ATTN_READS), (ATTN_WRITES, ATTN_WRITES)]
    assert attn[2].measured == 60000 and attn[2].launches == (60000,)
    assert [(c.simulated, c.measured) for c in quant[:2]] == [(sum(QUANT_LD), sum(QUANT_LD)),
                                                              (sum(QUANT_ST), sum(QUANT_ST))]
    # DRAM closed forms: every distinct byte once (Q, its scales; K, V^T and theirs of the kv head)
    assert attn[2].simulated == 2 * (300 * 64 + 3 * 4) + (200 + 208) * 64 + 2 * 2 * 4
    assert (quant[2].simulated, quant[3].simulated) == (sum(QUANT_LD) // 2, sum(QUANT_ST))
    verdicts = judge_all(checks)
    assert [v.by for v in verdicts[:2]] == ["exact", "exact"] and [v.by for v in verdicts[4:6]] == ["exact"] * 2


def test_the_scale_loads_note_compares_sass_bytes_with_8_times_the_schedules(vr, vf):
    (line,) = vf.notes(merge_repeats(_record()), H100)
    assert f"SASS {8 * SCALE_READS:,} B, 8 x the schedule's {SCALE_READS:,} B = {8 * SCALE_READS:,} B" in line
    assert "TMA reads - schedule's = 0 B" in line and "whole boxes would add 50,688 B" in line


@pytest.mark.parametrize("causal, want", [
    # non-causal, 300 x 200, tiles 128 x 128: the last Q box 84 rows past N (once a head); every Q tile visits the
    # last K/V tile: K rows 200..255 (56) and V^T keys 208..255 (48) past the end, a row of 64 B each
    (False, 2 * (84 * 64 + 3 * (56 + 48) * 64)),
    # causal 300 x 300: only Q tile 2 visits K/V tile 2 (keys 256..299: 84 K rows, 80 V^T keys past 304)
    (True, 2 * (84 * 64 + 1 * (84 + 80) * 64)),
])
def test_the_tma_boxes_past_the_end_by_hand(vf, causal, want):
    run = M.Attention("flash3-fp8", seq_len=300, kv_len=300 if causal else 200, heads=2, kv_heads=1, head_dim=64,
                      dtype="fp8", causal=causal)
    assert vf.box_overreach(run, (128, 128)) == want


def test_every_problem_of_the_part_has_whole_tiles_but_the_one_kept_partial(vf):
    partial = [r for r in vf.fp8_sweep() if r.kind == "flash3-fp8" and vf.box_overreach(r, FLASH3_FP8_TILES[r.head_dim])]
    assert [(r.seq_len, r.head_dim) for r in partial] == [(8192, 128)]
    assert {r.head_dim for r in vf.fp8_sweep()} == {64, 128, 256}


def test_fp8_compulsory_bytes_by_hand():
    kw = dict(profile=H100, batch=1, heads=2, kv_heads=1, seq_len=300, kv_len=200, head_dim=64, dtype="fp8",
              causal=False, block_q=128, block_kv=128, boundary="hbm", direction="read", simulated=1, measured=1)
    # e4m3 Q 38,400 and K, V 25,600; O in bf16 76,800; lse 2,400
    assert Check("flash3-fp8", **kw).compulsory == 38400 + 25600 + 76800 + 2400
    # 64,000 elements of Q, K, V: 2 bytes in, 1 out
    assert Check("fp8-quantize", **kw).compulsory == 64000 * 3


def test_the_judge_reads_the_fp8_archive_beside_the_others(vr, tmp_path, monkeypatch):
    rec = _record()
    (tmp_path / "measured_fp8.json").write_text(json.dumps(rec))
    with tarfile.open(tmp_path / "h100-fp8.tar.xz", "w:xz") as tar:
        tar.add(tmp_path / "measured_fp8.json", arcname="measured_fp8.json")
    monkeypatch.setattr(vr, "DATA", tmp_path)
    monkeypatch.setattr(vr, "DOCS", tmp_path)
    monkeypatch.setattr(vr, "rewrite_doc", lambda *a: None)  # docs/validation.md stays as it is
    vr.main(["--device", "h100", "--no-figure"])
    checks = read_checks(tmp_path / "h100.csv")
    assert sorted({c.kernel for c in checks}) == ["flash3-fp8", "fp8-quantize"] and len(checks) == 8
