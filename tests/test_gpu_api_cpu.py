"""What can be checked about iosim.gpu without a GPU: lazy import, the one-line error, the launch geometry
(iosim.launch: shared-memory arithmetic) and the list of instantiations the library launches (the CI compile check builds that same list)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from iosim import launch
from iosim.gpu import build


def test_import_iosim_and_iosim_gpu_never_import_cupy():
    code = "import sys, iosim, iosim.gpu, iosim.gpu.compile_check; assert 'cupy' not in sys.modules, 'cupy imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_attention_without_cupy_raises_gpu_unavailable_in_one_line(monkeypatch):
    from iosim import gpu

    monkeypatch.setitem(sys.modules, "cupy", None)  # makes `import cupy` raise ImportError
    with pytest.raises(gpu.GPUUnavailableError) as info:
        gpu.attention(None, None, None)
    msg = str(info.value)
    assert "\n" not in msg and "CuPy" in msg and "pip install" in msg
    assert info.value.__cause__ is None and info.value.__suppress_context__


def test_flash_smem_budget_is_q_plus_a_ring_of_k_and_v():
    # Q_i: 128*128*2 = 32768; K_j, V_j: 3 stages * 32*128*2 = 24576 each
    assert launch.flash_stages(128) == 3 and launch.flash_stages(256) == 2
    assert launch.flash_smem_terms(128, 128, 32, 2) == {"Q_i": 32768, "K_j": 24576, "V_j": 24576}
    assert launch.flash_smem_bytes(128, 128, 32) == 81920
    assert launch.flash_smem_bytes(128, 64, 64) == 64 * 128 * 2 + 2 * 3 * 64 * 128 * 2  # 114688
    assert launch.flash_smem_bytes(256, 64, 32) == 64 * 256 * 2 + 2 * 2 * 32 * 256 * 2


def test_every_compiled_tile_fits_two_blocks_per_sm_on_hopper():
    # H100/H200: 227 KB opt-in per block, 228 KB per SM with 1 KB reserved per block; A100: 163 KB per block
    for d, tiles in launch.FLASH_TILES.items():
        for bq, bkv in tiles:
            assert 2 * (launch.flash_smem_bytes(d, bq, bkv) + 1024) <= 228 * 1024, (d, bq, bkv)
            assert launch.flash_smem_bytes(d, bq, bkv) <= 163 * 1024, (d, bq, bkv)
            assert bq % 64 == 0 and bkv % 16 == 0


def test_naive_softmax_holds_one_row():
    # not a multiple of 8 keys (rows not 16-byte aligned), or longer than 256 threads x 8 chunks: shared memory
    assert launch.naive_softmax_smem_bytes(4097, 2) == 8194
    assert launch.naive_softmax_smem_bytes(16392, 2) == 32784 and launch.naive_softmax_row_threads(16392) == 0
    # else the row is in registers: 32 .. 256 threads per row, 256 / that rows per block
    for kv, threads in ((8, 32), (1000, 32), (2048, 32), (2056, 64), (4096, 64), (8192, 128), (16384, 256)):
        assert launch.naive_softmax_row_threads(kv) == threads and launch.naive_softmax_smem_bytes(kv) == 0
        assert launch.naive_softmax_rows_per_block(kv) == 256 // threads


def test_instantiation_list_covers_every_tile_dtype_and_mask():
    insts = build.flash_instances()
    n_tiles = sum(len(t) for t in launch.FLASH_TILES.values())
    assert len(insts) == len(set(insts)) == n_tiles * 2 * 2
    assert {64, 128} <= set(launch.HEAD_DIMS)
    for d in launch.HEAD_DIMS:
        for causal in (False, True):
            assert build.default_tiles(d, "float16", causal) in launch.FLASH_TILES[d]
    inst = build.FlashInstance(128, 128, 32, "bfloat16", True)
    assert inst.name_expression == "iosim::flash_fwd_kernel<128, 128, 32, __nv_bfloat16, true>"
    assert inst.explicit_instantiation.startswith("template __global__ void " + inst.name_expression + "(")
    naive = build.naive_instances()
    assert len(naive) == len(set(naive)) == 2 * (3 * len(launch.HEAD_DIMS) + 1)  # qk x2 and pv per d, one softmax
    assert {n.kind for n in naive} == {"qk", "softmax", "pv"}
    assert build.NaiveInstance("qk", "float16", True, 64).name_expression == "iosim::naive_qk_kernel<64, __half, true>"
    # the schedule's one Br: both GEMMs tile the query rows alike (the simulator counts V re-read N / Br times)
    assert launch.NAIVE_TILES["qk"]["block_m"] == launch.NAIVE_TILES["pv"]["block_m"]


def test_default_tiles_rejects_unknown_head_dim_and_dtype():
    with pytest.raises(ValueError, match="head_dim=48"):
        build.default_tiles(48)
    with pytest.raises(ValueError, match="dtype='float32'"):
        build.default_tiles(64, "float32")


def test_nvcc_options_match_nvrtc_options(tmp_path):
    nv = build.nvcc_options(tmp_path, 90)
    assert build.nvrtc_options(tmp_path) == ("--std=c++17", "-ftz=true", f"-I{tmp_path}")
    assert "-std=c++17" in nv and "-ftz=true" in nv and f"-I{tmp_path}" in nv and "-arch=sm_90" in nv


def _fake_nvcc(tmp_path, spill_bytes: int):
    """A stand-in for nvcc that prints a ptxas resource report (what compile_check parses) and succeeds."""
    exe = tmp_path / f"nvcc_spill{spill_bytes}"
    exe.write_text(
        "#!/bin/sh\n"
        "echo \"ptxas info    : Compiling entry function 'k' for 'sm_90'\" >&2\n"
        f"echo 'ptxas info    : Function properties for k\n    {spill_bytes} bytes stack frame, {spill_bytes} bytes "
        f"spill stores, {spill_bytes} bytes spill loads' >&2\n"
        "echo 'ptxas info    : Used 255 registers, used 1 barriers' >&2\n"
    )
    exe.chmod(0o755)
    return str(exe)


def test_compile_check_passes_without_spills_and_fails_on_a_spill(tmp_path, capsys):
    from iosim.gpu import compile_check

    assert compile_check.main(["--arch", "90", "--nvcc", _fake_nvcc(tmp_path, 0)]) == 0
    assert compile_check.main(["--arch", "90", "--nvcc", _fake_nvcc(tmp_path, 108)]) == 1
    out = capsys.readouterr().out
    assert "SPILL" in out and "forbidden spills" in out
    assert compile_check.main(["--arch", "90", "--nvcc", "false"]) == 1  # every compile fails
