"""The CLI: the JSON contract, readable output, and one clear line with exit code 2 for bad input."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from iosim import AttentionProblem, ProblemError, simulate

# time.bound (docs/json.md): the roofline's resources, or what limits a kernel in the time model
TIME_BOUNDS = ("tensor", "exp", "fp32", "global", "hbm", "sequence", "smem", "softmax", "l2", "dram", "blocks", "load",
               "store")


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "iosim", *args], capture_output=True, text=True, timeout=120)


def test_simulate_json_carries_the_public_contract_with_exact_integers():
    out = run("simulate", "naive", "--seq-len", "4096", "--head-dim", "128", "--json", "--no-l2")
    assert out.returncode == 0, out.stderr
    j = json.loads(out.stdout)
    for key in ("schedule", "profile", "problem", "tiles", "traffic", "by_tensor", "flops", "sram_peak_bytes", "time"):
        assert key in j
    assert j["profile"] == "h100-sxm5-80gb"
    g = j["traffic"]["global"]
    assert g["read_bytes"] + g["write_bytes"] == 138_412_032
    assert j["traffic"]["hbm"] == j["traffic"]["global"] and j["hbm_model"].startswith("none")
    assert set(j["traffic"]["sram"]) == {"read_bytes", "write_bytes"}
    assert j["by_tensor"]["S"] == {"global_read_bytes": 33_554_432, "global_write_bytes": 33_554_432}
    assert j["flops"]["total"] == j["flops"]["matmul"] + j["flops"]["exp"] + j["flops"]["other"]
    assert isinstance(j["flops"]["matmul"], int) and j["flops"]["matmul"] == 4 * 4096 * 4096 * 128
    assert j["time"]["predicted_s"] > 0 and j["time"]["bound"] in TIME_BOUNDS
    assert set(j["tiles"]) >= {"block_q", "block_kv"}


def test_simulate_takes_hbm_from_the_l2_model_by_default():
    out = run("simulate", "flash2", "--seq-len", "4096", "--heads", "32", "--json")
    assert out.returncode == 0, out.stderr
    j = json.loads(out.stdout)
    # K and V of a head (2 MB) stay in the 50 MB L2: DRAM sees about the compulsory bytes, L2 all the re-reads
    compulsory = 4 * 4096 * 128 * 2 * 32
    assert j["traffic"]["hbm"]["read_bytes"] < 1.1 * compulsory < j["traffic"]["global"]["read_bytes"] / 5
    assert not j["hbm_model"].startswith("none")


def test_simulate_prints_a_readable_table():
    out = run("simulate", "flash2", "--seq-len", "1000", "--kv-len", "777", "--heads", "8", "--kv-heads", "2",
              "--causal", "--head-dim", "64", "--dtype", "bf16", "--block-q", "64", "--block-kv", "32")
    assert out.returncode == 0, out.stderr
    assert "block_q=64, block_kv=32" in out.stdout and "global" in out.stdout and "lse" in out.stdout


def test_simulate_gqa_grouped_counts_iosims_backward_kernel_and_refuses_the_forward():
    args = ["simulate", "flash2", "--seq-len", "1000", "--heads", "8", "--kv-heads", "2", "--causal", "--json",
            "--no-l2", "--pass", "backward"]
    expand, grouped = run(*args), run(*args, "--gqa", "grouped")
    assert expand.returncode == 0 and grouped.returncode == 0, expand.stderr + grouped.stderr
    e, g = json.loads(expand.stdout), json.loads(grouped.stdout)
    assert g["tiles_by_pass"]["backward"]["gqa"] == "grouped"
    assert e["by_tensor"]["K"]["global_read_bytes"] == 4 * g["by_tensor"]["K"]["global_read_bytes"]  # group 4
    assert [k["name"] for k in e["time"]["kernels"]][-1] == "bwd_dkdv_group_sum"
    assert "bwd_dkdv_group_sum" not in [k["name"] for k in g["time"]["kernels"]]
    out = run("simulate", "flash2", "--seq-len", "64", "--gqa", "grouped")
    assert out.returncode == 2 and "flash2 takes no gqa" in out.stderr and "'grouped'" in out.stderr


@pytest.mark.parametrize("args,fragment", [
    (["simulate", "flash2", "--seq-len", "0"], "seq_len=0"),
    (["simulate", "flash2", "--seq-len", "64", "--heads", "3", "--kv-heads", "2"], "not divisible by kv_heads=2"),
    (["simulate", "flash9", "--seq-len", "64"], "flash9"),
    (["simulate", "flash2", "--seq-len", "64", "--dtype", "fp64"], "fp64"),
    (["simulate", "flash2", "--seq-len", "64", "--profile", "no-such-gpu"], "unknown profile 'no-such-gpu'"),
    (["simulate", "flash2", "--seq-len", "4096", "--block-q", "512", "--block-kv", "512"], "use smaller tiles"),
    (["simulate", "flash2", "--seq-len", "64", "--block-q", "-4"], "block_q=-4"),
    (["simulate", "naive", "--seq-len", "64", "--block-q", "16"], "give both"),
    (["simulate", "flash2", "--seq-len", "64", "--window", "1,2,3"], "expected LEFT,RIGHT"),
    (["simulate", "flash2", "--seq-len", "64", "--causal", "--window", "8,1"], "causal means right = 0"),
    (["simulate", "naive", "--seq-len", "64", "--window", "8,0"], "naive takes no window"),
    (["simulate", "flash2", "--seq-len", "64", "--seqlens", "32:64:1"], "expected N or Q:K"),
    (["simulate", "flash2", "--seq-len", "64", "--seqlens", "32,16"], "seq_len=48 and kv_len=48, the packed totals"),
    (["simulate", "flash2", "--seq-len", "64", "--page-size", "16"], "page_size=16 without seqlens"),
])
def test_bad_input_gets_one_line_and_exit_code_2(args, fragment):
    out = run(*args)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out.stderr
    assert fragment in lines[0]


def test_profile_file_with_unknown_key_is_rejected_naming_the_field(tmp_path):
    good = run("profiles", "show", "h100-sxm5-80gb")
    assert good.returncode == 0
    text = good.stdout.replace("sm_count:", "sm_cuont:", 1)
    f = tmp_path / "typo.yaml"
    f.write_text(text)
    out = run("profiles", "validate", str(f))
    assert out.returncode == 2 and "sm_cuont" in out.stderr and "unknown key" in out.stderr
    out = run("simulate", "flash2", "--seq-len", "64", "--profile", str(f))
    assert out.returncode == 2 and "sm_cuont" in out.stderr


def test_profile_flag_takes_a_file_path_everywhere(tmp_path):
    f = tmp_path / "mine.yaml"
    f.write_text(run("profiles", "show", "a100-sxm4-40gb").stdout)
    assert run("profiles", "validate", str(f)).returncode == 0
    out = run("simulate", "flash2", "--seq-len", "256", "--profile", str(f), "--json")
    assert out.returncode == 0 and json.loads(out.stdout)["profile"] == "a100-sxm4-40gb"


def test_profiles_list_names_every_builtin():
    out = run("profiles", "list")
    for name in ("a100-sxm4-40gb", "a100-sxm4-80gb", "h100-sxm5-80gb", "h200-sxm-141gb", "b200", "rtx-4090",
                 "l4", "mi300x"):
        assert name in out.stdout


def test_problem_api_errors_name_the_field():
    with pytest.raises(ProblemError, match="head_dim=0"):
        AttentionProblem.make(seq_len=8, head_dim=0)
    with pytest.raises(ProblemError, match="heads=6 is not divisible by kv_heads=4"):
        AttentionProblem.make(seq_len=8, heads=6, kv_heads=4)
    with pytest.raises(ProblemError, match="colour: unknown field"):
        AttentionProblem.make(seq_len=8, colour="red")
    p = AttentionProblem.make(seq_len=8, head_dim=64)
    assert p.kv_len == 8 and p.kv_heads == 1 and p.scale == 0.125


def test_simulate_lists_a_bad_profiles_errors_one_per_line_as_validate_does(tmp_path):
    text = run("profiles", "show", "h100-sxm5-80gb").stdout
    text = text.replace("sm_count:", "sm_cuont:", 1).replace("value: 3350000000000.0", "value: 0", 1)
    f = tmp_path / "bad.yaml"
    f.write_text(text)
    validate = run("profiles", "validate", str(f))
    out = run("simulate", "flash2", "--seq-len", "64", "--profile", str(f))
    assert validate.returncode == out.returncode == 2 and "Traceback" not in out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 4  # the file, then sm_count missing, bandwidth 0, sm_cuont unknown
    assert lines[0] == f"iosim: error: {validate.stderr.strip().splitlines()[0]}"
    assert lines[1:] == validate.stderr.strip().splitlines()[1:]
    assert any("memory[0].dram.bandwidth.value: 0 is not a positive quantity" in line for line in lines)


def test_progress_bar_is_silent_before_its_delay_and_draws_after_it():
    """The L2 model's bar (the CLI's, rich) draws nothing while a run is shorter than its delay, and draws once the
    delay has passed. The delays are set so that the outcome depends on no clock: a run never lasts 10^9 s, and
    every run has lasted at least 0 s (a cold numba cache made the old 1.5 s version fail)."""
    import io

    from iosim.cli.progress import ProgressBar

    p = AttentionProblem(heads=4, seq_len=4096, head_dim=128)
    for delay, drawn in ((1e9, False), (0.0, True)):
        out = io.StringIO()
        with ProgressBar(stream=out, delay=delay) as bar:
            simulate("flash2", p, "h200-sxm-141gb", l2=True, l2_progress=bar)
        assert (out.getvalue() != "") == drawn, (delay, out.getvalue()[:80])


def test_simulate_takes_packed_sequences_and_a_paged_cache_as_the_api_does():
    """--seqlens N|Q:K,... and --page-size count what simulate(..., seqlens=..., page_size=...) counts."""
    out = run("simulate", "flash2", "--seq-len", "1100", "--kv-len", "5100", "--heads", "4", "--kv-heads", "2",
              "--dtype", "bf16", "--causal", "--seqlens", "100,1000:5000", "--page-size", "16", "--no-l2", "--json")
    assert out.returncode == 0, out.stderr
    j = json.loads(out.stdout)
    p = AttentionProblem(seq_len=1100, kv_len=5100, heads=4, kv_heads=2, dtype="bf16", causal=True)
    api = simulate("flash2", p, seqlens=[(100, 100), (1000, 5000)], page_size=16, l2=False).to_json()
    assert j["traffic"] == api["traffic"] and j["tiles_by_pass"]["forward"]["page_size"] == 16
    assert j["tiles_by_pass"]["forward"]["seqlens"] == [[100, 100], [1000, 5000]]


def test_simulate_takes_a_sliding_window_as_the_api_does():
    """--window LEFT,RIGHT (none: no bound) counts what simulate(..., window=...) counts."""
    out = run("simulate", "flash3", "--seq-len", "2048", "--heads", "2", "--dtype", "bf16", "--causal", "--window",
              "255,0", "--no-l2", "--json")
    assert out.returncode == 0, out.stderr
    j = json.loads(out.stdout)
    p = AttentionProblem(seq_len=2048, heads=2, dtype="bf16", causal=True)
    api = simulate("flash3", p, window=(255, 0), l2=False).to_json()
    assert j["traffic"] == api["traffic"] and j["tiles_by_pass"]["forward"]["window"] == [255, 0]
    unbounded = json.loads(run("simulate", "flash2", "--seq-len", "512", "--window", "none,3", "--no-l2",
                               "--json").stdout)
    assert unbounded["tiles_by_pass"]["forward"]["window"] == [None, 3]

