"""What can be checked about iosim.gpu without a GPU: lazy import, the one-line error, the launch geometry
(iosim.launch: shared-memory arithmetic), the list of instantiations the library launches (the CI compile check builds that same list)
and the torch path of iosim.gpu.inputs on stand-ins for torch and CuPy."""

from __future__ import annotations

import subprocess
import sys
import types
from contextlib import nullcontext

import numpy as np
import pytest

from iosim import launch
from iosim.gpu import build, inputs
from iosim.launch import varlen
from iosim.schedules.flash2 import PAGE_TILES_HEAD_DIMS, page_tiles


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
    # rows at a pitch of 8 elements (16 bytes): a ragged row is a whole number of chunks, held like the others
    assert [launch.naive_row_pitch(kv, 2) for kv in (1, 8, 777, 4097)] == [8, 8, 784, 4104]
    assert launch.naive_softmax_row_threads(4097) == 128 and launch.naive_softmax_chunks(4097) == 8
    assert launch.naive_softmax_row_threads(777) == 32 and launch.naive_softmax_chunks(777) == 4
    # longer than 256 threads x 8 chunks: shared memory, one row at its pitch
    assert launch.naive_softmax_smem_bytes(16392, 2) == 32784 and launch.naive_softmax_row_threads(16392) == 0
    assert launch.naive_softmax_smem_bytes(16385, 2) == 32784 and launch.naive_softmax_row_threads(16385) == 0
    # else the row is in registers: 32 .. 256 threads per row, 256 / that rows per block
    for kv, threads in ((8, 32), (1000, 32), (2048, 32), (2056, 64), (4096, 64), (8192, 128), (16384, 256)):
        assert launch.naive_softmax_row_threads(kv) == threads and launch.naive_softmax_smem_bytes(kv) == 0
        assert launch.naive_softmax_rows_per_block(kv) == 256 // threads


def test_instantiation_list_covers_every_tile_dtype_and_mask():
    insts = build.flash_instances()
    n_tiles = sum(len(t) for t in launch.FLASH_TILES.values())
    n_varlen = sum(len(t) for t in varlen.FLASH_VARLEN_TILES.values())
    n_local = sum(len(t) for t in varlen.FLASH_LOCAL_TILES.values())
    n_paged = len(varlen.FLASH_PAGED_TILES)
    # dense: every tile, dtype, causal or not; varlen: plain and causal, and a window (Local), per dtype; paged:
    # plain, causal and a window per dtype at one tile per head dim, each key's row looked up or a tile in one page
    n_paged += len(PAGE_TILES_HEAD_DIMS)
    assert len(insts) == len(set(insts)) == n_tiles * 2 * 2 + n_varlen * 2 * 2 + n_local * 2 + n_paged * 3 * 2
    assert {(i.head_dim, i.block_q, i.block_kv) for i in insts if i.local and not i.paged} == \
        {(d, bq, bkv) for d, t in varlen.FLASH_LOCAL_TILES.items() for bq, bkv in t}
    assert {64, 128} <= set(launch.HEAD_DIMS)
    for d in launch.HEAD_DIMS:
        for causal in (False, True):
            assert build.default_tiles(d, "float16", causal) in launch.FLASH_TILES[d]
    inst = build.FlashInstance(128, 128, 32, "bfloat16", True)
    # the dense kernel keeps its name: Local and Varlen default to false
    assert inst.name_expression == "iosim::flash_fwd_kernel<128, 128, 32, __nv_bfloat16, true>"
    assert inst.explicit_instantiation.startswith("template __global__ void " + inst.name_expression + "(")
    assert build.FlashInstance(64, 64, 64, "float16", False, True, True).name_expression == \
        "iosim::flash_fwd_kernel<64, 64, 64, __half, false, true, true>"
    with pytest.raises(ValueError, match="causal and local"):
        build.FlashInstance(64, 64, 64, "float16", True, True, True)
    with pytest.raises(ValueError, match="paged need varlen"):
        build.FlashInstance(64, 64, 64, "float16", True, False, False, True)
    with pytest.raises(ValueError, match="page_tiles needs paged"):
        build.FlashInstance(64, 64, 64, "float16", True, False, True, False, True)
    assert build.FlashInstance(64, 64, 64, "float16", True, False, True, True, True).name_expression == \
        "iosim::flash_fwd_kernel<64, 64, 64, __half, true, false, true, true, true>"
    assert page_tiles(64, 64, 128) and page_tiles(128, 64, 64) and not page_tiles(32, 64, 128)
    assert not page_tiles(64, 32, 256)  # d = 256 keeps its row lists
    naive = build.naive_instances()
    # qk x2 and pv per d; the softmax per chunks of a row per thread
    assert len(naive) == len(set(naive)) == 2 * (3 * len(launch.HEAD_DIMS) + len(build.SOFTMAX_CHUNKS))
    assert {n.kind for n in naive} == {"qk", "softmax", "pv"}
    assert build.NaiveInstance("softmax", "bfloat16", chunks=4).name_expression == \
        "iosim::naive_softmax_kernel<__nv_bfloat16, 4>"
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


# ------------------------------------------------------------------------------------------------------------------
# torch tensors viewed without DLPack (iosim.gpu.inputs): the pure-Python parts, on stand-ins for torch and CuPy.
# tests/gpu/test_attention_gpu.py runs the same paths on real ones.


class _FakeTensor:
    """What torch_view reads of a torch.Tensor."""

    def __init__(self, shape, dtype="float16", stride=None, *, cuda=True, grad=False, ptr=0x7F0000000000, dev=1):
        self.shape, self.dtype, self.is_cuda, self.requires_grad = tuple(shape), dtype, cuda, grad
        self._stride = stride or tuple(int(np.prod(shape[i + 1:])) for i in range(len(shape)))
        self._ptr, self._dev, self.layout = ptr, dev, "strided"
        self.device = types.SimpleNamespace(type="cuda" if cuda else "cpu")

    def stride(self):
        return self._stride

    def numel(self):
        return int(np.prod(self.shape))

    def element_size(self):
        return 4 if self.dtype == "float32" else 2

    def data_ptr(self):
        return self._ptr

    def get_device(self):
        return self._dev

    def new_zeros(self, n):
        return _FakeTensor((n,), self.dtype)

    def __dlpack__(self, stream=None):
        raise AssertionError("DLPack export called")


class _FakeArray:
    """cupy.ndarray as the checks read it: shape, dtype, strides, flags.c_contiguous, data.ptr, device.id."""

    def __init__(self, shape, dtype, memptr, strides):
        self.shape, self.dtype, self.strides, self.data = shape, dtype, strides, memptr
        self.ndim, self.device = len(shape), types.SimpleNamespace(id=memptr.mem.device_id)
        item, want = dtype.itemsize, []
        for n in reversed(shape):
            want.insert(0, item)
            item *= n
        self.flags = types.SimpleNamespace(c_contiguous=tuple(want) == tuple(strides))


def _fakes(monkeypatch):
    """(torch, cupy) stand-ins; torch registered in sys.modules as iosim finds it."""
    torch = types.ModuleType("torch")
    torch.Tensor, torch.strided, torch.float32 = _FakeTensor, "strided", "float32"
    torch.empty_calls = []

    def empty(shape, dtype, device):
        torch.empty_calls.append((shape, dtype, device))
        return _FakeTensor(shape, dtype, dev=device)

    torch.empty = empty
    torch._C = types.SimpleNamespace(_cuda_getCurrentRawStream=lambda dev: torch.stream_ptr)
    torch.stream_ptr = 0
    monkeypatch.setitem(sys.modules, "torch", torch)
    dtypes = {"float16": np.dtype("float16"), "float32": np.dtype("float32"),
              "bfloat16": types.SimpleNamespace(name="bfloat16", itemsize=2)}
    cp = types.SimpleNamespace(ndarray=_FakeArray, float32=np.float32, dlpack_calls=[])

    def from_dlpack(t):
        cp.dlpack_calls.append(t.dtype)
        if t.dtype not in dtypes:
            raise TypeError(f"unsupported dtype {t.dtype}")
        return types.SimpleNamespace(dtype=dtypes[t.dtype])

    cp.from_dlpack = from_dlpack
    cp.cuda = types.SimpleNamespace(
        UnownedMemory=lambda ptr, size, owner, device_id: types.SimpleNamespace(
            ptr=ptr, size=size, owner=owner, device_id=device_id),
        MemoryPointer=lambda mem, offset: types.SimpleNamespace(mem=mem, ptr=mem.ptr + offset),
        ExternalStream=lambda ptr, device_id: types.SimpleNamespace(ptr=ptr, device_id=device_id),
        get_current_stream=lambda: types.SimpleNamespace(ptr=0))
    monkeypatch.setattr(inputs, "_TORCH_DTYPES", {})
    monkeypatch.setattr(inputs, "_STREAMS", {})
    return torch, cp


def test_byte_geometry_spans_first_to_last_element():
    assert inputs.byte_geometry((2, 3, 4, 5), (60, 20, 5, 1), 2) == ((120, 40, 10, 2), 240)
    assert inputs.byte_geometry((2, 4, 3, 5), (60, 5, 20, 1), 2) == ((120, 10, 40, 2), 240)  # a transpose
    assert inputs.byte_geometry((2, 3), (0, 1), 4) == ((0, 4), 12)  # an expanded (broadcast) dim
    assert inputs.byte_geometry((2, 0, 3), (3, 3, 1), 2)[1] == 0


def test_torch_view_wraps_the_tensor_memory_keeps_it_alive_and_looks_each_dtype_up_once(monkeypatch):
    _, cp = _fakes(monkeypatch)
    t = _FakeTensor((2, 3, 4, 64), "bfloat16", ptr=0x1000, dev=3)
    x = inputs.torch_view(cp, t)
    assert x.shape == (2, 3, 4, 64) and x.dtype.name == "bfloat16" and x.flags.c_contiguous
    assert x.strides == (2 * 3 * 4 * 64 * 2 // 2, 4 * 64 * 2, 64 * 2, 2)
    assert x.data.ptr == 0x1000 and x.data.mem.owner is t and x.device.id == 3
    assert x.data.mem.size == t.numel() * 2
    assert inputs.torch_view(cp, _FakeTensor((1, 8, 2, 64), "bfloat16")) is not None
    assert cp.dlpack_calls == ["bfloat16"]  # one lookup of a one-element tensor, then the cache


def test_torch_view_leaves_to_dlpack_what_it_does_not_take(monkeypatch):
    _, cp = _fakes(monkeypatch)
    for t in (_FakeTensor((1, 8, 2, 64), cuda=False), _FakeTensor((1, 8, 2, 64), grad=True),
              _FakeTensor((1, 0, 2, 64)), _FakeTensor((1, 8, 2, 64), "complex32"), np.zeros((1, 8, 2, 64))):
        assert inputs.torch_view(cp, t) is None
    with pytest.raises(inputs.AttentionInputError, match="q: tensor is on the CPU"):
        inputs._as_cupy(cp, _FakeTensor((1, 8, 2, 64), cuda=False), "q")


def test_validate_checks_torch_views_as_before_and_outputs_are_torch(monkeypatch):
    torch, cp = _fakes(monkeypatch)
    q, k = _FakeTensor((1, 8, 4, 64), dev=0), _FakeTensor((1, 16, 2, 64), dev=0)
    a = inputs.validate(cp, q, k, k, "flash2", False, None)
    assert a.torch is torch and a.torch_dtype == "float16" and a.device == 0 and a.dtype == "float16"
    assert a.q.data.mem.owner is q and a.out is None and a.scale == pytest.approx(1 / 8)
    ret, view = a.empty((1, 4, 8), lse=True)
    assert torch.empty_calls == [((1, 4, 8), "float32", 0)] and isinstance(ret, _FakeTensor)
    assert view.data.mem.owner is ret and view.dtype == np.float32
    # the same checks, the same words: a transposed k, a q of another dtype, an out of the wrong shape
    kt = _FakeTensor((1, 16, 2, 64), stride=(2048, 64, 1024, 1), dev=0)
    with pytest.raises(inputs.AttentionInputError, match=r"k: strides \(4096, 128, 2048, 2\) are not C-contiguous"):
        inputs.validate(cp, q, kt, k, "flash2", False, None)
    with pytest.raises(inputs.AttentionTypeError, match="q: dtype float32 is not supported"):
        q32 = _FakeTensor((1, 8, 4, 64), "float32", dev=0)
        inputs.validate(cp, q32, k, k, "flash2", False, None)
    out = _FakeTensor((1, 8, 4, 32), dev=0)
    with pytest.raises(inputs.AttentionInputError, match=r"out: \(1, 8, 4, 32\) float16"):
        inputs.validate(cp, q, k, k, "flash2", False, None, inputs.AttentionOptions(out=out))
    with pytest.raises(inputs.AttentionTypeError, match="out: got _FakeTensor; expected a CuPy array or a CUDA torch"):
        inputs.validate(cp, q, k, k, "flash2", False, None,
                        inputs.AttentionOptions(out=_FakeTensor((1, 8, 4, 64), grad=True)))
    given = inputs.AttentionOptions(out=_FakeTensor((1, 8, 4, 64), dev=0))
    good = inputs.validate(cp, q, k, k, "flash2", False, None, given)
    assert good.out.shape == (1, 8, 4, 64)


def test_a_torch_call_runs_on_torchs_current_stream(monkeypatch):
    torch, cp = _fakes(monkeypatch)
    assert isinstance(inputs.torch_stream(cp, torch, 0), nullcontext)  # torch's stream is CuPy's current one
    torch.stream_ptr = 0xABC
    s = inputs.torch_stream(cp, torch, 1)
    assert (s.ptr, s.device_id) == (0xABC, 1) and inputs.torch_stream(cp, torch, 1) is s  # cached
    a = inputs.validate(cp, *[_FakeTensor((1, 8, 2, 64), dev=0)] * 3, "flash2", False, None)
    assert a.stream().ptr == 0xABC


def test_backward_instantiations_cover_every_head_dim_dtype_and_mask():
    insts = build.flash_bwd_instances()
    # per dtype: one dQ conversion; per head dim: the preprocessing, and the main and dQ kernels causal or not
    assert len(insts) == len(set(insts)) == 2 * (1 + 5 * len(launch.FLASH_BWD_TILES))
    assert set(launch.FLASH_BWD_TILES) == set(launch.HEAD_DIMS)
    main = build.FlashBwdInstance("main", "bfloat16", 128, 64, 128, True)
    assert main.name_expression == "iosim::flash_bwd_kernel<128, 64, 128, __nv_bfloat16, true>"
    assert main.explicit_instantiation.startswith("template __global__ void " + main.name_expression + "(")
    assert build.FlashBwdInstance("convert", "float16").name_expression == "iosim::flash_bwd_convert_dq_kernel<__half>"
    assert all(i.source == "flash_bwd.cu" for i in insts) and set(insts) <= set(build.all_instances())


def test_backward_shared_memory_fits_an_h100_block_at_every_shipped_tile():
    for d, (bq, bkv) in launch.FLASH_BWD_TILES.items():
        terms = launch.flash_bwd_smem_terms(d, bq, bkv)
        assert sum(terms.values()) == launch.flash_bwd_smem_bytes(d, bq, bkv) <= 227 * 1024
        assert terms["Q_i"] == 2 * bq * d * 2  # double-buffered
        assert launch.flash_bwd_dq_smem_bytes(d, launch.FLASH_BWD_DQ_BLOCK_KV[d]) <= 227 * 1024


def test_backward_inputs_are_checked_naming_the_argument():
    from iosim.gpu.backward import _check_like

    def arr(shape=(1, 8, 2, 64), dtype="float16", contiguous=True, dev=0, ptr=0x1000):
        return types.SimpleNamespace(shape=shape, dtype=np.dtype(dtype), flags=types.SimpleNamespace(
            c_contiguous=contiguous), device=types.SimpleNamespace(id=dev), data=types.SimpleNamespace(ptr=ptr))

    want = ((1, 8, 2, 64), "float16", 0)
    _check_like(arr(), "o", *want)  # fine
    for bad, match in ((arr(shape=(1, 8, 2, 32)), r"do: \(1, 8, 2, 32\) float16"),
                       (arr(dtype="float32"), "do: .* float32 .*expected a contiguous"),
                       (arr(contiguous=False), "contiguous=False"),
                       (arr(dev=1), "do: on device 1; expected device 0"),
                       (arr(ptr=0x1008), "do: data pointer 0x1008 is not 16-byte aligned")):
        with pytest.raises(inputs.AttentionInputError, match=match):
            _check_like(bad, "do", *want)
