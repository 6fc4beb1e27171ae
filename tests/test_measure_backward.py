"""The backward part of the validation record without a GPU: a made-up ncu CSV of two backward runs (our kernels
and torch's FA2, markers and end markers around them, the next run's forward after the end marker) goes through
the parse, the grouping by marker, the records' merge, the simulation and the judge exactly as a measured one would
(benchmarks/validation_record.py), so that the GPU run cannot fail on a typo of this path."""

from __future__ import annotations

import pytest
from helpers import FakeNcuCsv, load_benchmark

from iosim import AttentionProblem, simulate
from iosim import measure as M
from iosim.measure.records import merge_repeats
from iosim.validation import Check, judge_all, lower_bound, read_checks, write_checks

H100 = "h100-sxm5-80gb"
RUNS = [M.Attention("flash2-bwd", seq_len=1000, heads=4, kv_heads=2, head_dim=64, causal=True),
        M.Attention("sdpa-flash-bwd", seq_len=1024, heads=4, head_dim=128, dtype="bf16")]
KERNELS = {  # what each run launches (names as ncu prints them)
    0: ["void iosim::flash_bwd_preprocess_kernel<64, __half>(const T2 *, ...)",
        "void iosim::flash_bwd_kernel<64, 128, 128, __half, 1>(const T4 *, ...)",
        "void iosim::flash_bwd_convert_dq_kernel<__half>(const float *, T1 *, long long)"],
    1: ["void pytorch_flash::flash_bwd_dot_do_o_kernel<1, Flash_bwd_kernel_traits<128, 64, 128, 8, 2, 4, 2, 0, 1, "
        "cutlass::bfloat16_t, Flash_kernel_traits_sm80<128, 64, 128, 8, cutlass::bfloat16_t>>>(Flash_bwd_params)",
        "void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits<128, 64, 128, 8, "
        "2, 4, 2, 0, 1, cutlass::bfloat16_t, Flash_kernel_traits_sm80<128, 64, 128, 8, cutlass::bfloat16_t>>, 0, 0, "
        "0, 0, 1, 1, 0>(Flash_bwd_params)",
        "void pytorch_flash::flash_bwd_convert_dq_kernel<Flash_bwd_kernel_traits<128, 64, 128, 8, 2, 4, 2, 0, 1, "
        "cutlass::bfloat16_t, Flash_kernel_traits_sm80<128, 64, 128, 8, cutlass::bfloat16_t>>>(Flash_bwd_params)"]}
METRICS = {"smsp__sass_data_bytes_mem_global_op_ld.sum": 1000, "smsp__sass_data_bytes_mem_global_op_ldgsts.sum": 200,
           "smsp__sass_data_bytes_mem_global_op_st.sum": 30, "smsp__sass_data_bytes_mem_global_op_red.sum": 4,
           "smsp__sass_data_bytes_mem_global_op_atom.sum": 0, "dram__bytes_read.sum": 5000,
           "dram__bytes_write.sum": 700, "launch__registers_per_thread": 168}


def _csv() -> str:
    """ncu's --csv --print-units base page: per run its marker, kernels, end marker, then the next run's forward."""
    page = FakeNcuCsv()
    launch = page.launch

    for i, names in KERNELS.items():
        launch("iosim_marker", f"({i + 1}, 1, 1)", {"gpu__time_duration.sum": 1})
        for n, name in enumerate(names):
            launch(name, "(8, 2, 1)", {k: v * (n + 1) for k, v in METRICS.items()})
        launch("iosim_marker", f"({i + 1}, 1, {M.ncu.END_MARKER_Z})", {"gpu__time_duration.sum": 1})
        launch("void iosim::flash_fwd_kernel<64, 128, 64, __half, 0>(...)", "(8, 4, 1)", METRICS)  # next forward
    return page.text()


def _record(text: str) -> dict:
    groups = M.group_by_marker(M.parse_ncu_csv(text))
    entries = []
    for i, run in enumerate(RUNS):
        launches = groups[i]
        e = {"run": M.to_dict(run), "kernels": [{"kernel": k["kernel"], **M.summarize(k)} for k in launches],
             "measured": M.sum_launches(launches), "time_ms": 1.0}
        if run.kind == "flash2-bwd":
            e["launch"] = {"tiles": {"block_q": 128, "block_kv": 128}, "kernels": []}
        entries.append(e)
    return {"device": {"name": "fake"}, "entries": entries}


def test_end_markers_keep_the_next_runs_forward_out():
    groups = M.group_by_marker(M.parse_ncu_csv(_csv()))
    assert sorted(groups) == [0, 1]
    assert [[k["kernel"] for k in groups[i]] for i in (0, 1)] == [KERNELS[0], KERNELS[1]]


@pytest.fixture(scope="module")
def vr():
    return load_benchmark("validation_record")


def test_fake_backward_record_goes_through_simulate_and_judge(vr, tmp_path):
    measured = merge_repeats(_record(_csv()))
    checks = [c for m in measured for c in vr.simulate_measured(m, H100)]
    assert [c.kernel for c in checks[::4]] == ["flash2-bwd", "sdpa-flash-bwd"]
    for c in checks:
        assert c.kernel.endswith("-bwd") and c.profile == H100
    # kernel n's metrics are METRICS x (n + 1): the three kernels' sum is 6 x METRICS; reads ld + ldgsts + red +
    # atom, writes st + red + atom
    assert [c.measured for c in checks[:4]] == [6 * (1000 + 200 + 4), 6 * (30 + 4), 6 * 5000, 6 * 700]
    # simulated global: the schedule's counts at the tiles the launch (ours) or FA2's kernel name (torch's) gives
    for c, gqa in ((checks[0], "grouped"), (checks[4], "expand")):
        run = RUNS[0] if gqa == "grouped" else RUNS[1]
        p = AttentionProblem.make(heads=run.heads, kv_heads=run.kv_heads, seq_len=run.seq_len,
                                  head_dim=run.head_dim, dtype=run.dtype, causal=run.causal)
        want = simulate("flash2", p, H100, pass_="backward", gqa=gqa, block_q=c.block_q, block_kv=c.block_kv, l2=False)
        assert c.simulated == want.traffic["global"]["read_bytes"]
    assert (checks[4].block_q, checks[4].block_kv) == (64, 128)  # from Flash_bwd_kernel_traits<128, 64, 128, ...>
    verdicts = judge_all(checks)
    assert len(verdicts) == 8 and all(v.by in ("", "exact", "bound", "floor", "range") for v in verdicts)
    path = tmp_path / "fake.csv"
    write_checks(path, checks, "fake")
    assert read_checks(path) == checks


def test_backward_compulsory_bytes_by_hand():
    """B=2, H=4 query heads, 2 kv heads, N=100, N_kv=300, d=64, bf16: Q, O, dO, dQ (4 x 2·4·100·64·2), K, V, dK, dV
    (4 x 2·2·300·64·2), lse and Delta (2 x 2·4·100·4), the fp32 accumulator (2·4·100·64·4)."""
    c = Check("flash2-bwd", H100, 2, 4, 2, 100, 300, 64, "bf16", True, 64, 128, "hbm", "read", 1, 1)
    assert c.compulsory == 4 * 102400 + 4 * 153600 + 2 * 3200 + 204800


def test_backward_lower_bound_where_the_groups_rows_do_not_fit():
    """Our kernel's block visits its group's query heads in turn: 4 heads of 16K rows at d=128 (16K x 1032 B each,
    67 MB) exceed the H100's 50 MiB; one head's (FA2's expanded design) does not."""
    kw = dict(profile=H100, batch=1, heads=32, kv_heads=8, seq_len=16384, kv_len=16384, head_dim=128, dtype="bf16",
              causal=True, block_q=64, block_kv=128, boundary="hbm", direction="read", simulated=1, measured=1)
    assert lower_bound(Check("flash2-bwd", **kw))
    assert not lower_bound(Check("sdpa-flash-bwd", **kw))
