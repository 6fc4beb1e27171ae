"""What can be checked about Flash-Decoding without a GPU: the split heuristic (iosim.launch.decode), the launch
geometry against the kernel's constants, the list of instantiations the compile check builds, and every argument
check of iosim.gpu.decode (iosim.gpu.decode_inputs). tests/gpu/test_decode_gpu.py runs the kernels."""

from __future__ import annotations

import re
import sys
import types

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from iosim._resources import kernels_dir
from iosim.gpu import AttentionInputError, AttentionTypeError, GPUUnavailableError
from iosim.gpu import decode_inputs as di
from iosim.gpu.build_decode import DecodeInstance, decode_instances
from iosim.launch import decode as geo

H100_SMEM_PER_SM = 228 * 1024  # Hopper Tuning Guide
A100_SMEM_PER_BLOCK = 163 * 1024


# ------------------------------------------------------------------------------------------------------------------
# the split heuristic


def test_a_grid_that_fills_the_gpu_stays_unsplit():
    # 64 sequences x 4 kv heads = 256 blocks >= 80% of 132 SMs x 2 blocks: one split, chunk = the whole sequence
    assert geo.decode_split([8192] * 64, 4, 264) == geo.SplitChoice(1, 8192)


def test_the_fill_counts_at_most_two_resident_blocks_an_sm():
    # an fp8 cache's d = 128 blocks fit three an SM; the heuristic fills two (module docstring, step 1)
    assert geo.split_slots(132, 3) == 264 and geo.split_slots(132, 2) == 264 and geo.split_slots(132, 1) == 132
    assert geo.split_slots(132, 0) == 132  # at least one an SM
    per_sm = geo.decode_blocks_per_sm(geo.decode_smem_bytes(128, 1, 2, 1), geo.DECODE_REGISTERS_FP8[(128, 1)],
                                      H100_SMEM_PER_SM)
    assert per_sm == 3
    # batch 64, 4 kv heads, one token, 8192 keys: 256 blocks fill 80% of 264 slots unsplit (of 396, 2 splits)
    assert geo.decode_split([8192] * 64, 4, geo.split_slots(132, per_sm)).splits == 1
    assert geo.decode_split([8192] * 64, 4, 132 * per_sm).splits == 2


def test_a_small_batch_is_split_to_fill_one_wave():
    # 16 x 4 = 64 blocks: 4 splits of 2048 keys = 256 blocks, between 80% and 100% of the 264 slots
    assert geo.decode_split([8192] * 16, 4, 264) == geo.SplitChoice(4, 2048)
    assert geo.decode_split([32768] * 32, 4, 264) == geo.SplitChoice(2, 16384)


def test_no_split_is_shorter_than_the_minimum_unless_forced():
    # one sequence, one kv head: filling 211 slots would take 5-key splits; 256 keys at least -> 1000 // 256 = 3
    assert geo.decode_split([1000], 1, 264) == geo.SplitChoice(3, 336)
    assert geo.decode_split([100], 1, 264) == geo.SplitChoice(1, 112)  # shorter than the minimum: unsplit
    assert geo.decode_split([1000], 1, 264, splits=8) == geo.SplitChoice(8, 128)


def test_forced_splits_are_capped_by_the_tiles_of_the_longest_sequence():
    assert geo.decode_split([100], 1, 264, splits=128) == geo.SplitChoice(7, 16)  # 7 tiles of 16 keys
    assert geo.decode_split([100, 5], 1, 264, splits=1) == geo.SplitChoice(1, 112)
    assert geo.decode_split([0, 0], 4, 264) == geo.SplitChoice(1, 16)  # nothing to read


@pytest.mark.parametrize("bad", [0, -1, 129, 2.0, True, "4"])
def test_a_forced_split_count_out_of_range_is_an_error(bad):
    with pytest.raises(geo.DecodeGeometryError, match=r"splits=.*expected None or an integer from 1 to 128"):
        geo.decode_split([1000], 1, 264, splits=bad)


def _covered(lens, split):
    """Times each 16-key tile of each sequence is visited, replaying the kernel's index arithmetic: split s of
    sequence b covers keys [s * chunk, min(n_b, (s + 1) * chunk)); warp w takes tiles w, w + 4, ... of it."""
    out = []
    for n in lens:
        count = np.zeros(-(-n // geo.DECODE_TILE), dtype=int)
        for s in range(split.splits):
            begin, end = s * split.chunk, min(n, (s + 1) * split.chunk)
            if begin >= end:
                continue
            assert s < split.splits_of(n), "a split with keys that the combine kernel would not read"
            n_tiles = -(-(end - begin) // geo.DECODE_TILE)
            for w in range(geo.DECODE_WARPS):
                for t in range(w, n_tiles, geo.DECODE_WARPS):
                    count[begin // geo.DECODE_TILE + t] += 1
        out.append(count)
    return out


@given(lens=st.lists(st.integers(0, 20000), min_size=1, max_size=8), per_seq=st.integers(1, 64),
       slots=st.integers(1, 600), forced=st.one_of(st.none(), st.integers(1, geo.MAX_SPLITS)))
def test_every_key_is_read_by_exactly_one_warp_of_one_split(lens, per_seq, slots, forced):
    split = geo.decode_split(lens, per_seq, slots, forced)
    assert split.chunk % geo.DECODE_TILE == 0 and 1 <= split.splits <= geo.MAX_SPLITS
    longest = max(lens)
    if longest:
        assert (split.splits - 1) * split.chunk < longest <= split.splits * split.chunk  # no empty split
    for count in _covered(lens, split):
        assert (count == 1).all()
    if forced is None and split.splits > 1:
        assert split.chunk >= geo.MIN_SPLIT_TOKENS  # never a split shorter than the minimum
    if forced is None and len(set(lens)) == 1 and per_seq * len(lens) >= geo.SPLIT_FILL * slots:
        assert split.splits == 1  # equal lengths that fill the slots unsplit stay unsplit


@given(n=st.integers(1, 100_000), batch=st.integers(1, 256), per_seq=st.sampled_from([1, 2, 4, 8, 32]),
       slots=st.sampled_from([108, 132, 264, 396]))
def test_splits_fill_the_target_unless_the_minimum_or_the_cap_binds(n, batch, per_seq, slots):
    split = geo.decode_split([n] * batch, per_seq, slots)
    blocks = per_seq * batch * split.splits
    target = int(geo.SPLIT_FILL * slots)
    # the cap or the minimum split binds (evening the chunk out to whole tiles may drop a split in 17 then)
    bound = 17 * split.splits >= 16 * min(geo.MAX_SPLITS, max(1, n // geo.MIN_SPLIT_TOKENS))
    # rounding the chunk up to whole tiles can cost a block or so below the target
    assert bound or blocks >= target * (1 - geo.DECODE_TILE / split.chunk) - per_seq * batch, (blocks, split)
    assert blocks <= max(target, per_seq * batch) + per_seq * batch  # at most one split more than the target


def test_partial_bytes_count_only_splits_that_hold_keys():
    split = geo.SplitChoice(4, 2048)
    # 3 + 1 + 0 splits written, each row (token, head) d + 1 fp32
    assert geo.decode_partial_bytes(2, 32, 128, split, [5000, 10, 0]) == 4 * 2 * 32 * 129 * 4
    assert geo.decode_partial_bytes(1, 32, 128, geo.SplitChoice(1, 8192), [8192]) == 0


# ------------------------------------------------------------------------------------------------------------------
# launch geometry against the kernel


def _kernel_source() -> str:
    return (kernels_dir() / "flash_decode.cu").read_text()


def test_stages_and_tile_mirror_the_kernel_constants():
    src = _kernel_source()
    m = re.search(r"decode_stages\(int D\) \{ return D >= 256 \? (\d) : \(D >= 128 \? (\d) : (\d)\); \}", src)
    assert m, "decode_stages() in flash_decode.cu changed: update iosim.launch.decode.decode_stages"
    assert (geo.decode_stages(256), geo.decode_stages(128), geo.decode_stages(64)) == tuple(int(x) for x in m.groups())
    assert f"constexpr int kDecodeTile = {geo.DECODE_TILE};" in src
    assert f"constexpr int kDecodeWarps = {geo.DECODE_WARPS};" in src


def test_shared_memory_is_q_plus_four_rings_and_the_merge_area_fits_over_the_ring():
    # d = 128, one stripe: Q 16 x 128 x 2 = 4096; 4 warps x 3 stages x (K + V: 2 x 16 x 128 x 2) = 98304
    assert geo.decode_smem_terms(128, 1) == {"Q_i": 4096, "K_j, V_j": 98304}
    for d, mt in geo.DECODE_STRIPES:
        ring = geo.decode_smem_terms(d, mt)["K_j, V_j"]
        assert geo.decode_merge_bytes(d, mt) <= ring, (d, mt)
        assert geo.decode_smem_bytes(d, mt) <= A100_SMEM_PER_BLOCK, (d, mt)  # sm_80 holds every block
        # an fp8 cache: the ring at one byte an element plus each warp's fp16 V tile; the merge fits over it and Q_i
        fp8 = geo.decode_smem_terms(d, mt, 2, 1)
        assert fp8["K_j, V_j"] == ring // 2 and fp8["V_j (fp16)"] == 4 * 16 * d * 2
        assert fp8["Q_i row scales"] == 128
        assert geo.decode_merge_bytes(d, mt) <= fp8["Q_i"] + fp8["K_j, V_j"] + fp8["V_j (fp16)"], (d, mt)
        assert geo.decode_smem_bytes(d, mt, 2, 1) <= A100_SMEM_PER_BLOCK, (d, mt)


def test_every_config_keeps_enough_bytes_in_flight_per_sm():
    # Little's law: DRAM read bandwidth x loaded latency (~800 ns) / 132 SMs; H100 3.073 TB/s, H200 4.483 TB/s
    need = {"h100": 3.073e12 * 800e-9 / 132, "h200": 4.483e12 * 800e-9 / 132}
    assert 18_000 < need["h100"] < 19_000 and 27_000 < need["h200"] < 28_000
    for d, mt in geo.DECODE_STRIPES:
        per_sm = geo.decode_blocks_per_sm(geo.decode_smem_bytes(d, mt), geo.DECODE_REGISTERS[(d, mt)],
                                          H100_SMEM_PER_SM)
        assert per_sm >= 1
        assert geo.decode_bytes_in_flight(d, per_sm) >= 2 * need["h200"], (d, mt, per_sm)
    # d = 128: 2 blocks of 100 KB per SM (shared memory binds; 160 registers would allow 3)
    assert geo.decode_blocks_per_sm(geo.decode_smem_bytes(128, 1), 160, H100_SMEM_PER_SM) == 2
    assert geo.decode_blocks_per_sm(1024, 255, H100_SMEM_PER_SM) == 2  # registers bind


def test_rows_pack_into_stripes_and_row_blocks():
    assert (geo.decode_stripes(8, 128), geo.decode_row_blocks(8, 128)) == (1, 1)  # GQA 8:1, one token
    assert (geo.decode_stripes(32, 128), geo.decode_row_blocks(32, 128)) == (2, 1)
    assert geo.decode_row_blocks(128, 128) == 4  # 8:1 x 16 tokens
    assert (geo.decode_stripes(32, 256), geo.decode_row_blocks(32, 256)) == (1, 2)
    assert geo.decode_grid(3, 4, 8, 128, 5) == (1, 5, 12)
    assert geo.combine_grid(3, 2, 32) == (48, 1, 1)  # 192 rows, 4 a block


def test_instantiations_cover_every_stripe_head_dim_and_dtype():
    insts = decode_instances()
    split = [i for i in insts if i.kind == "split"]
    combine = [i for i in insts if i.kind == "combine"]
    assert len(insts) == len(set(insts)) == 4 * len(geo.DECODE_STRIPES) + 2 * len(geo.DECODE_HEAD_DIMS)
    assert {(i.head_dim, i.stripes, i.fp8_cache) for i in split} == {(d, mt, f) for d, mt in geo.DECODE_STRIPES
                                                                       for f in (False, True)}
    assert {i.head_dim for i in combine} == set(geo.DECODE_HEAD_DIMS)
    inst = DecodeInstance("split", 128, "bfloat16", 2)
    assert inst.name_expression == "iosim::flash_decode_kernel<128, 2, __nv_bfloat16, __nv_bfloat16>"
    fp8 = DecodeInstance("split", 64, "float16", 1, fp8_cache=True)
    assert fp8.name_expression == "iosim::flash_decode_kernel<64, 1, __half, iosim::e4m3>"
    assert "const iosim::e4m3*, const iosim::e4m3*, __half*" in fp8.explicit_instantiation
    assert DecodeInstance("combine", 64, "float16").name_expression == "iosim::flash_decode_combine_kernel<64, __half>"
    # the explicit instantiation lists as many parameters as the kernel's definition
    src = _kernel_source()
    for kind, kernel in (("split", "flash_decode_kernel("), ("combine", "flash_decode_combine_kernel(")):
        body = src[src.index(kernel) + len(kernel):]
        n_params = body[: body.index(")")].count(",") + 1
        inst = next(i for i in insts if i.kind == kind)
        assert inst.explicit_instantiation.count(",") - inst.name_expression.count(",") + 1 == n_params


def test_the_compile_check_builds_the_decode_kernels(tmp_path, capsys):
    from iosim.gpu import compile_check

    nvcc = tmp_path / "nvcc"
    nvcc.write_text("#!/bin/sh\necho 'ptxas info    : Used 100 registers, used 1 barriers' >&2\n"
                    "echo '    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads' >&2\n")
    nvcc.chmod(0o755)
    assert compile_check.main(["--arch", "80", "--nvcc", str(nvcc)]) == 0
    out = capsys.readouterr().out
    for inst in decode_instances():
        assert inst.name_expression in out


# ------------------------------------------------------------------------------------------------------------------
# argument checks

F16 = ("float16", "float16", "float16")


def _paged(q=(2, 1, 8, 128), k=(10, 16, 2, 128), table=(2, 5), dtypes=F16):
    return di.check_shapes(q, k, k, dtypes, table)


def test_shapes_of_a_contiguous_and_a_paged_cache():
    s = di.check_shapes((3, 2, 32, 128), (3, 1000, 4, 128), (3, 1000, 4, 128), ("bfloat16",) * 3)
    assert (s.paged, s.group, s.rows, s.capacity, s.page_size, s.max_pages, s.stripes) == \
        (False, 8, 16, 1000, 1000, 1, 1)
    s = _paged()
    assert (s.paged, s.page_size, s.num_pages, s.max_pages, s.capacity, s.rows) == (True, 16, 10, 5, 80, 4)


@pytest.mark.parametrize("args,match", [
    (((2, 8, 128), (2, 9, 2, 128), (2, 9, 2, 128), F16), r"q: shape \(2, 8, 128\) has 3 dims"),
    (((2, 17, 8, 128), (2, 9, 2, 128), (2, 9, 2, 128), F16), "q_len=17 new tokens per sequence; expected 1 to 16"),
    (((2, 0, 8, 128), (2, 9, 2, 128), (2, 9, 2, 128), F16), "empty dimension"),
    (((2, 1, 8, 96), (2, 9, 2, 96), (2, 9, 2, 96), F16), r"head_dim=96 is not supported by decode; expected one of"),
    (((2, 1, 8, 128), (2, 9, 2, 64), (2, 9, 2, 64), F16), "k_cache: head_dim 64 differs"),
    (((2, 1, 8, 128), (2, 9, 3, 128), (2, 9, 3, 128), F16), "kv_heads=3 does not divide q's heads=8"),
    (((2, 1, 8, 128), (2, 9, 2, 128), (2, 8, 2, 128), F16), "v_cache: shape .* differs from k_cache's"),
    (((2, 1, 8, 128), (3, 9, 2, 128), (3, 9, 2, 128), F16), "k_cache: batch 3 differs from q's batch 2"),
    (((70000, 1, 8, 128), (70000, 9, 2, 128), (70000, 9, 2, 128), F16), "batch \\* kv_heads"),
])
def test_shape_errors_name_the_argument_and_the_expectation(args, match):
    with pytest.raises(AttentionInputError, match=match):
        di.check_shapes(*args)


def test_dtype_errors_name_the_argument():
    with pytest.raises(AttentionTypeError, match="q: dtype float32 is not supported"):
        di.check_shapes((1, 1, 2, 64), (1, 8, 2, 64), (1, 8, 2, 64), ("float32",) * 3)
    with pytest.raises(AttentionTypeError, match="v_cache: dtype float16 differs from q's bfloat16"):
        di.check_shapes((1, 1, 2, 64), (1, 8, 2, 64), (1, 8, 2, 64), ("bfloat16", "bfloat16", "float16"))
    with pytest.raises(AttentionTypeError, match="v_cache: dtype bfloat16 while k_cache is fp8"):
        di.check_shapes((1, 1, 2, 64), (1, 8, 2, 64), (1, 8, 2, 64), ("bfloat16", "uint8", "bfloat16"))


@pytest.mark.parametrize("cache", ["uint8", "float8_e4m3fn"])
def test_an_fp8_cache_takes_its_scales_per_kv_head(cache):
    s = di.check_shapes((1, 1, 4, 64), (1, 8, 2, 64), (1, 8, 2, 64), ("bfloat16", cache, cache))
    assert s.fp8_cache and s.kv_dtype == di.FP8_CACHE and s.dtype == "bfloat16"
    k, v = di.check_kv_scales(0.5, np.array([1.0, 2.0]), s)
    assert k.dtype == np.float32 and k.tolist() == [0.5, 0.5] and v.tolist() == [1.0, 2.0]
    with pytest.raises(AttentionInputError, match=r"v_cache: e4m3 values without their scale; expected "
                                                  r"QuantizedKV\(values, scale\), scale a number or \(2,\) floats"):
        di.check_kv_scales(1.0, None, s)
    with pytest.raises(AttentionInputError, match=r"k_cache.scale\[0\] = inf; expected a finite scale > 0"):
        di.check_kv_scales(np.inf, 1.0, s)
    with pytest.raises(AttentionInputError, match=r"k_cache.scale: float64 of shape \(3,\); expected a number or "
                                                  r"\(2,\)"):
        di.check_kv_scales([1.0, 2.0, 3.0], 1.0, s)
    plain = di.check_shapes((1, 1, 4, 64), (1, 8, 2, 64), (1, 8, 2, 64), ("float16",) * 3)
    assert not plain.fp8_cache and di.check_kv_scales(None, None, plain) is None
    with pytest.raises(AttentionInputError, match="v_cache: a QuantizedKV of float16 values; expected e4m3"):
        di.check_kv_scales(None, 1.0, plain)


def test_page_sizes_must_be_whole_tiles_and_the_table_must_match_the_batch():
    with pytest.raises(AttentionInputError, match="page_size=24 tokens; expected a multiple of 16"):
        _paged(k=(10, 24, 2, 128))
    with pytest.raises(AttentionInputError, match=r"block_table: shape \(3, 5\); expected \(batch, max_pages\)"):
        _paged(table=(3, 5))
    with pytest.raises(AttentionInputError, match="block_table: shape"):
        _paged(table=(10,))
    assert _paged(k=(4, 256, 2, 128)).capacity == 5 * 256


def test_seqlens_default_only_for_a_contiguous_cache_and_must_fit_the_cache():
    contiguous = di.check_shapes((2, 1, 8, 64), (2, 50, 2, 64), (2, 50, 2, 64), F16)
    assert di.check_seqlens(None, contiguous).tolist() == [50, 50]
    assert di.check_seqlens(np.array([0, 50]), contiguous).dtype == np.int32  # 0 keys is allowed: O = 0
    with pytest.raises(AttentionInputError, match=r"seqlens_k\[1\] = 51; expected 0 to 50"):
        di.check_seqlens(np.array([3, 51]), contiguous)
    with pytest.raises(AttentionInputError, match=r"seqlens_k\[0\] = -1"):
        di.check_seqlens(np.array([-1, 5]), contiguous)
    with pytest.raises(AttentionInputError, match=r"seqlens_k: shape \(3,\); expected \(2,\)"):
        di.check_seqlens(np.array([1, 2, 3]), contiguous)
    paged = _paged()
    with pytest.raises(AttentionInputError, match="seqlens_k: None; expected the keys of each sequence"):
        di.check_seqlens(None, paged)
    with pytest.raises(AttentionInputError, match=r"seqlens_k\[1\] = 81; expected 0 to 80 .*max_pages \* page_size"):
        di.check_seqlens(np.array([80, 81]), paged)


def test_block_table_entries_are_checked_only_where_a_sequence_reads_them():
    s = _paged()  # 10 pages of 16, table (2, 5)
    lens = np.array([17, 0])  # sequence 0 reads 2 pages, sequence 1 none
    table = np.array([[9, 3, -1, 99, -7], [-1, -1, -1, -1, -1]])
    out = di.check_block_table(table, lens, s)
    assert out.dtype == np.int32 and out.flags.c_contiguous
    assert out.tolist() == [[9, 3, 0, 0, 0], [0, 0, 0, 0, 0]]  # unread entries are never used (zeroed)
    with pytest.raises(AttentionInputError, match=r"block_table\[0, 1\] = 10; expected a page of k_cache, 0 to 9 "
                                                  r"\(sequence 0 holds 17 keys in 2 pages of 16\)"):
        di.check_block_table(np.array([[9, 10, 0, 0, 0], [0] * 5]), lens, s)
    with pytest.raises(AttentionInputError, match=r"block_table\[1, 0\] = -1"):
        di.check_block_table(table, np.array([17, 1]), s)


def test_integer_arrays_come_from_lists_and_numpy_and_other_dtypes_are_errors():
    assert di.host_ints([1, 2, 3], "seqlens_k").tolist() == [1, 2, 3]
    assert di.host_ints(np.array([[1, 2]], dtype=np.int32), "block_table").dtype == np.int64
    with pytest.raises(AttentionTypeError, match="seqlens_k: dtype float64; expected an integer array"):
        di.host_ints(np.array([1.5]), "seqlens_k")
    with pytest.raises(AttentionTypeError, match="block_table: dtype object"):
        di.host_ints(np.array([None, 1], dtype=object), "block_table")


def test_decode_without_cupy_raises_gpu_unavailable_in_one_line(monkeypatch):
    from iosim import gpu

    monkeypatch.setitem(sys.modules, "cupy", None)  # makes `import cupy` raise ImportError
    for call in (lambda: gpu.decode(None, None, None, seqlens_k=[1]), lambda: gpu.plan_decode(None, None, None)):
        with pytest.raises(GPUUnavailableError) as info:
            call()
        assert "\n" not in str(info.value) and "CuPy" in str(info.value)


# ------------------------------------------------------------------------------------------------------------------
# plan and launch on a stand-in for CuPy (NumPy arrays; the kernels record their arguments): the order and values
# of what reaches the kernels. tests/gpu/test_decode_gpu.py runs them.


class _DevArray(np.ndarray):
    """A NumPy array with what the checks read of a cupy.ndarray: data.ptr and device.id."""

    @property
    def data(self):
        return types.SimpleNamespace(ptr=self.__array_interface__["data"][0])

    @property
    def device(self):
        return types.SimpleNamespace(id=0)


def _dev(x, dtype=None):
    return np.ascontiguousarray(np.asarray(x, dtype=dtype)).view(_DevArray)


@pytest.fixture
def fake_cupy(monkeypatch):
    from iosim.gpu import flash_decode

    class Device:
        compute_capability = "90"

        def __init__(self, dev=0):
            self.attributes = {"MultiProcessorCount": 132, "MaxSharedMemoryPerMultiprocessor": 233472}

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    cp = types.ModuleType("cupy")
    cp.ndarray, cp.asarray, cp.int32, cp.float32, cp.uint64, cp.dtype = _DevArray, _dev, np.int32, np.float32, \
        np.uint64, np.dtype
    cp.empty = lambda shape, dtype=None: _dev(np.empty(shape, dtype=dtype))
    stream = types.SimpleNamespace(synchronize=lambda: None, ptr=0)
    cp.cuda = types.SimpleNamespace(Device=Device, get_current_stream=lambda: stream,
                                    runtime=types.SimpleNamespace(getDeviceCount=lambda: 1, getDevice=lambda: 0,
                                                                  getDeviceProperties=lambda d: {"name": b"Fake GPU"}))
    monkeypatch.setitem(sys.modules, "cupy", cp)
    calls = []

    def kernel(cp_, inst, smem, trace=False):
        def fn(grid, block, args, shared_mem=0):
            calls.append(types.SimpleNamespace(inst=inst, grid=grid, block=block, args=args, smem=shared_mem,
                                               dependent=False))
        fn.num_regs, fn.inst = 160, inst
        return fn

    def dependent(fn, grid, block, args, stream, shared_mem=0):  # iosim.gpu.driver's programmatic dependent launch
        calls.append(types.SimpleNamespace(inst=fn.inst, grid=grid, block=block, args=args, smem=shared_mem,
                                           dependent=True))

    monkeypatch.setattr(flash_decode, "_kernel", kernel)
    monkeypatch.setattr(flash_decode, "launch_dependent", dependent)
    monkeypatch.setattr(flash_decode, "_smem_limit", lambda cp_: 232448)
    return calls


def test_a_paged_plan_launches_the_split_then_the_combine_kernel_with_the_checked_arguments(fake_cupy):
    from iosim import gpu

    q = _dev(np.zeros((3, 4, 16, 128), np.float16))  # 16 heads on 2 kv heads, 4 tokens: 32 rows, 2 stripes
    k = _dev(np.zeros((40, 64, 2, 128), np.float16))  # 40 pages of 64
    table = np.arange(30).reshape(3, 10) + 5
    table[1, 1:] = -1  # past sequence 1's only page: never read
    plan = gpu.plan_decode(q, k, k, seqlens_k=[600, 1, 0], block_table=table, splits=3)
    assert plan.split == geo.SplitChoice(3, 208)  # 600 keys: ceil(200 / 16) * 16 = 208
    o, lse = plan.run(q, k, k)
    assert o.shape == q.shape and o.dtype == np.float16 and lse.shape == (3, 16, 4) and lse.dtype == np.float32
    split, combine = fake_cupy
    assert split.inst == DecodeInstance("split", 128, "float16", 2)
    assert (split.grid, split.block, split.smem) == ((1, 3, 6), (128, 1, 1), geo.decode_smem_bytes(128, 2))
    a = split.args
    assert a[0] is q and a[1] is k and a[2] is k and a[3] is o and a[4] is lse
    assert a[5].shape == (192, 3, 128) and a[5].dtype == np.float32 and a[6].shape == (192, 3)  # partials
    assert a[7].tolist() == [600, 1, 0] and a[7].dtype == np.int32
    assert a[8].dtype == np.int32 and a[8].tolist()[1] == [15] + [0] * 9  # unread entries zeroed
    assert int(a[9]) == int(a[10]) == 0  # no k_scale, v_scale: a 16-bit cache
    # q_len, heads, kv_heads, page_size, table stride, chunk, splits, scale * log2(e)
    assert [int(x) for x in a[11:18]] == [4, 16, 2, 64, 10, 208, 3]
    assert float(a[18]) == pytest.approx(1.4426950408889634 / 128 ** 0.5, rel=1e-6)
    assert combine.inst == DecodeInstance("combine", 128, "float16") and combine.grid == (48, 1, 1)
    assert not split.dependent and combine.dependent  # compute capability 9.0: the combine a dependent launch
    c = combine.args
    assert c[0] is a[5] and c[1] is a[6] and c[2] is a[7] and c[3] is o and c[4] is lse
    assert [int(x) for x in c[5:]] == [192, 4, 16, 208, 3]  # rows, q_len, heads, chunk, splits


def test_before_compute_capability_9_the_combine_is_a_plain_launch(fake_cupy, monkeypatch):
    import cupy  # the fake

    from iosim import gpu

    monkeypatch.setattr(cupy.cuda.Device, "compute_capability", "80")  # no griddepcontrol before sm_90
    q = _dev(np.zeros((1, 1, 8, 64), np.float16))
    k = _dev(np.zeros((1, 512, 1, 64), np.float16))
    plan = gpu.plan_decode(q, k, k, splits=2)
    plan.run(q, k, k)
    split, combine = fake_cupy
    assert split.inst == DecodeInstance("split", 64, "float16", 1) and not split.dependent
    assert not plan.dependent_combine and not combine.dependent
    assert combine.inst == DecodeInstance("combine", 64, "float16")


def test_an_fp8_plan_launches_the_e4m3_instance_with_its_scales_and_smaller_ring(fake_cupy):
    from iosim import gpu

    q = _dev(np.zeros((2, 1, 8, 128), np.float16))
    bits = _dev(np.zeros((2, 300, 2, 128), np.uint8))  # e4m3 bits, contiguous
    k, v = gpu.QuantizedKV(bits, [0.5, 0.25]), gpu.QuantizedKV(bits, 2.0)
    plan = gpu.plan_decode(q, k, v, splits=1)
    plan.run(q, k, v)
    (split,) = fake_cupy
    assert split.inst == DecodeInstance("split", 128, "float16", 1, fp8_cache=True)
    assert split.smem == geo.decode_smem_bytes(128, 1, 2, 1) == 4096 + 49152 + 16384 + 128
    assert np.asarray(split.args[9]).tolist() == [0.5, 0.25] and np.asarray(split.args[10]).tolist() == [2.0, 2.0]
    with pytest.raises(AttentionInputError, match="k_cache: e4m3 values without their scale"):
        gpu.plan_decode(q, bits, v)


def test_an_fp8_cache_of_64_byte_rows_among_four_kv_heads_asks_for_the_shared_memory_of_three_blocks_an_sm(fake_cupy):
    from iosim import gpu

    regs = geo.DECODE_REGISTERS_FP8[(64, 1)]
    for kv_heads, per_sm in ((4, 3), (8, 3), (2, 4), (1, 4)):  # docs/kernels.md, "Three blocks an SM"
        q = _dev(np.zeros((2, 1, 8 * kv_heads, 64), np.float16))
        bits = _dev(np.zeros((2, 300, kv_heads, 64), np.uint8))  # e4m3 bits: a row of 64 bytes every 64 x kv_heads
        k = gpu.QuantizedKV(bits, 1.0)
        plan = gpu.plan_decode(q, k, k, splits=1)
        smem = plan.launches[0].smem_bytes
        assert smem >= geo.decode_smem_bytes(64, 1, 2, 1)
        assert geo.decode_blocks_per_sm(smem, regs, 233472) == per_sm, kv_heads


def test_only_short_spread_rows_hold_a_block_count():
    need = geo.decode_smem_bytes(64, 1, 2, 1)
    held = geo.decode_launch_smem(64, 1, 2, 1, 4, 233472)
    assert held > need and geo.decode_blocks_per_sm(held, 1, 233472) == 3  # registers aside: shared memory binds
    assert geo.decode_launch_smem(64, 1, 2, 1, 4, 167936) == need  # an A100's SM holds 3 of them as they are
    for d, stripes, kv_itemsize in ((64, 1, None), (64, 2, 1), (128, 1, 1), (256, 1, 1)):  # 16-bit, or longer rows
        assert geo.decode_launch_smem(d, stripes, 2, kv_itemsize, 32, 233472) == \
            geo.decode_smem_bytes(d, stripes, 2, kv_itemsize), (d, stripes)
    from iosim.hardware.gpu import get_profile

    h200 = get_profile("h200-sxm-141gb")
    regs = geo.DECODE_REGISTERS_FP8[(64, 1)]
    assert geo.decode_slots(h200, 64, 1, 2, regs, 1, kv_heads=4) == 3 * 132
    assert geo.decode_slots(h200, 64, 1, 2, regs, 1, kv_heads=2) == 4 * 132


def test_a_contiguous_cache_is_one_page_per_sequence_and_one_split_needs_no_combine(fake_cupy):
    from iosim import gpu

    q = _dev(np.zeros((2, 1, 8, 64), np.float16))
    k = _dev(np.zeros((2, 300, 8, 64), np.float16))
    o = _dev(np.full(q.shape, np.nan, np.float16))
    got = gpu.decode(q, k, k, splits=1, scale=0.25, out=(o, None))
    assert got.o is o and got.lse.shape == (2, 8, 1)
    (split,) = fake_cupy
    a = split.args
    assert a[5] == 0 and a[6] == 0 and a[8] == 0 and a[9] == a[10] == 0  # null partials, table, scales
    assert [int(x) for x in a[11:18]] == [1, 8, 8, 300, 1, 304, 1]  # page_size = max_len, chunk: 300 in tiles
    assert float(a[18]) == pytest.approx(0.25 * 1.4426950408889634, rel=1e-6)
    with pytest.raises(AttentionInputError, match=r"out: o \(2, 1, 8, 64\) float32"):
        gpu.decode(q, k, k, out=(_dev(np.zeros(q.shape, np.float32)), None))
    with pytest.raises(AttentionInputError, match="expected the plan's"):
        gpu.plan_decode(q, k, k).run(_dev(np.zeros((2, 1, 16, 64), np.float16)), k, k)


def test_a_scale_given_as_a_number_is_copied_to_the_device_once():
    """plan.run's fp8 scales as numbers: the device copy is made once and kept (a copy a call cost about 3.4 us a
    scale on an H100, docs/serving.md); another value, device or head count gets its own."""
    from contextlib import nullcontext
    from types import SimpleNamespace

    import numpy as np

    from iosim.gpu import flash_decode

    copies = []

    def asarray(a):
        copies.append(a)
        return np.array(a)

    cp = SimpleNamespace(asarray=asarray, cuda=SimpleNamespace(
        Device=lambda d: nullcontext(), get_current_stream=lambda: SimpleNamespace(synchronize=lambda: None)))
    flash_decode._NUMBER_SCALES.clear()
    a = flash_decode._number_scales(cp, 0, 4, 0.5)
    assert flash_decode._number_scales(cp, 0, 4, 0.5) is a and len(copies) == 1
    assert a.dtype == np.float32 and a.tolist() == [0.5] * 4
    assert flash_decode._number_scales(cp, 0, 4, 0.25) is not a and flash_decode._number_scales(cp, 1, 4, 0.5) is not a
    assert len(copies) == 3
    flash_decode._NUMBER_SCALES.clear()
