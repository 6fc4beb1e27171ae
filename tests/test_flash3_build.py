"""The flash3 build lists, without a GPU or CuPy: what compile_check builds is what the library launches."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from iosim import launch
from iosim._resources import kernels_dir
from iosim.gpu import build, build_fp8, flash3_host
from iosim.launch import flash3_schedule


def test_every_flash3_tile_has_an_instantiation_per_dtype_and_mask():
    insts = build.flash3_instances()  # 16-bit: plain, causal, windowed, each dense and packed; fp8: plain, causal
    assert len(insts) == len(launch.FLASH3_TILES) * len(build.CUDA_TYPES) * 6 + len(launch.FLASH3_FP8_TILES) * 2
    for d, (bq, bkv) in launch.FLASH3_TILES.items():
        assert bq == 128  # 2 consumer warpgroups x wgmma's M of 64; the kernel's Br
        for dt in build.CUDA_TYPES:
            for causal in (False, True):
                assert build.Flash3Instance(d, bkv, dt, causal) in insts
            assert build.Flash3Instance(d, bkv, dt, False, True) in insts
            assert build.Flash3Instance(d, bkv, dt, False, True).name_expression.endswith(", false, true>")
            for causal, local in ((False, False), (True, False), (False, True)):  # packed sequences (Varlen)
                inst = build.Flash3Instance(d, bkv, dt, causal, local, True)
                assert inst in insts
                assert inst.name_expression.endswith(f"{str(causal).lower()}, {str(local).lower()}, true>")
    for d, (bq, bkv) in launch.FLASH3_FP8_TILES.items():
        assert bq == 128 and bkv % 32 == 0  # fp8 P V runs in whole k32 steps
        for causal in (False, True):
            assert build.Flash3Instance(d, bkv, build.FP8_DTYPE, causal) in insts


def test_fp8_instantiation_takes_e4m3_and_writes_bf16():
    inst = build.Flash3Instance(128, 128, build.FP8_DTYPE, False)
    assert inst.name_expression == "iosim::flash3_fwd_kernel<128, 128, iosim::e4m3, false>"
    assert "__nv_bfloat16*, float*, const int*, const float*, const float*, const float*" in inst.explicit_instantiation
    q = build_fp8.quantize_instances()
    assert {(i.head_dim, i.transpose) for i in q} == {(d, t) for d in launch.FLASH3_FP8_TILES for t in (False, True)}


def test_flash3_compiles_for_sm90a_only():
    inst = build.flash3_instances()[0]
    assert inst.nvrtc_extra == ("-arch=sm_90a",)
    opts = build.nvcc_options(kernels_dir(), build.FLASH3_ARCH)
    assert "-gencode=arch=compute_90a,code=sm_90a" in opts and not any(o.startswith("-arch") for o in opts)
    assert "-arch=sm_90" in build.nvcc_options(kernels_dir(), 90)


def test_flash3_explicit_instantiation_names_the_kernel():
    inst = build.Flash3Instance(128, 128, "bfloat16", True)
    assert inst.name_expression == "iosim::flash3_fwd_kernel<128, 128, __nv_bfloat16, true>"
    assert inst.explicit_instantiation.startswith(f"template __global__ void {inst.name_expression}(")
    assert inst.explicit_instantiation.count("const __grid_constant__ iosim::TmaMap") == 3
    assert (kernels_dir() / inst.source).is_file()


def test_every_flash3_instantiation_matches_the_kernels_parameter_list():
    src = (kernels_dir() / build.FLASH3_SOURCE).read_text()
    sig = re.search(r"flash3_fwd_kernel\((.*?)\)\s*\{", src, re.S).group(1)
    n_params = len([p for p in sig.split(",") if p.strip()])
    for inst in build.flash3_instances():
        assert len(inst.explicit_instantiation.split("(", 1)[1].rstrip(");").split(",")) == n_params, inst


def test_the_wgmma_shapes_cover_every_tile():
    for d, (_, bkv) in launch.FLASH3_TILES.items():
        assert bkv in flash3_host.WGMMA_SS_N and d in flash3_host.WGMMA_RS_N
    for d, (_, bkv) in launch.FLASH3_FP8_TILES.items():
        assert bkv in flash3_host.WGMMA_FP8_SS_N and d in flash3_host.WGMMA_FP8_RS_N


def test_wgmma_header_is_what_its_generator_writes():
    assert (kernels_dir() / "flash3_wgmma.cuh").read_text() == flash3_host.wgmma_header()


def test_flash3_smem_fits_a_hopper_block():
    for d, (bq, bkv) in launch.FLASH3_TILES.items():
        terms = launch.flash3_smem_terms(d, bq, bkv)
        assert terms["Q_i"] == bq * d * 2 and terms["K_j"] == terms["V_j"] == launch.FLASH3_STAGES * bkv * d * 2
        assert launch.flash3_smem_bytes(d, bq, bkv) <= 227 * 1024  # sm_90 opt-in limit per block


def test_flash3_registers_fit_the_sm():
    r = launch.FLASH3_REGISTERS
    assert 128 * r["producer"] + 256 * r["consumer"] <= 65536
    assert launch.FLASH3_THREADS == 384


def _loads(sched, blocks, cost):
    return [sum(cost(t) for t in sched[blocks + 1 + sched[x]: blocks + 1 + sched[x + 1]]) for x in range(blocks)]


def test_causal_schedule_covers_every_tile_once_and_evens_out_the_blocks():
    B, N, H, G = 1, 16384, 16, 132  # Tr = 128 tiles a head against 132 blocks: the snake leaves 1.53x there
    sched = flash3_schedule.tile_schedule(B, N, N, H, 128, 128, True, G)
    assert sched is not None and len(sched) == G + 1 + 128 * H
    assert sorted(sched[G + 1:]) == list(range(128 * H)) and sched[0] == 0 and sched[G] == 128 * H

    def cost(t):
        return flash3_schedule.kv_blocks(127 - t % 128, N, N, 128, 128, True) + 1

    loads = _loads(sched, G, cost)
    assert max(loads) / (sum(loads) / G) < 1.02


def test_non_causal_and_balanced_shapes_keep_the_kernels_own_order():
    assert flash3_schedule.tile_schedule(4, 4096, 4096, 16, 128, 128, False, 132) is None
    assert flash3_schedule.tile_schedule(16, 1024, 1024, 16, 128, 128, True, 132) is None  # the snake is as good here


def test_block_tiles_are_the_snake_or_the_host_schedule_and_cover_every_tile_once():
    snake = flash3_schedule.block_tiles(1, 1000, 1000, 2, 128, 128, False, 5)  # 16 tiles on 5 blocks
    assert snake[0] == [0, 9, 10] and snake[4] == [4, 5, 14, 15]  # round 1 reversed: block 4 takes tile 5
    assert sorted(t for ts in snake for t in ts) == list(range(16))
    host = flash3_schedule.block_tiles(1, 16384, 16384, 16, 128, 128, True, 132)
    assert sorted(t for ts in host for t in ts) == list(range(128 * 16))
    assert host != flash3_schedule.snake(128 * 16, 132)  # the causal 16K shape takes the host's greedy schedule


def test_kv_blocks_skips_tiles_right_of_the_diagonal_bottom_right_aligned():
    assert flash3_schedule.kv_blocks(0, 256, 256, 128, 128, True) == 1
    assert flash3_schedule.kv_blocks(1, 256, 256, 128, 128, True) == 2
    assert flash3_schedule.kv_blocks(0, 300, 100, 128, 128, True) == 0  # rows 0..127 see keys j <= i - 200: none
    assert flash3_schedule.kv_blocks(0, 100, 1000, 128, 128, False) == 8


@given(lens=st.lists(st.tuples(st.integers(0, 700), st.integers(0, 700)), min_size=1, max_size=6),
       heads=st.integers(1, 3), causal=st.booleans(), window=st.one_of(st.none(), st.tuples(st.integers(0, 300),
                                                                                              st.just(0))),
       blocks=st.integers(1, 9))
def test_a_packed_batchs_schedule_gives_every_working_tile_to_one_block_once(lens, heads, causal, window, blocks):
    seqs = tuple(lens)
    causal = causal and window is None  # a causal window is the Local kernel's (right = 0)
    tiles, visits = flash3_schedule.varlen_tiles(seqs, heads, 128, 128, causal, window)
    Tr = max(1, -(-max(n for n, _ in seqs) // 128))
    want = sorted(m + Tr * (h + heads * b) for b, (n, _) in enumerate(seqs) for h in range(heads)
                  for m in range(-(-n // 128)))
    assert sorted(tiles.tolist()) == want  # no tile past a sequence's end; tiles that see no key are listed (they write zeros)
    sched = flash3_schedule.varlen_schedule(seqs, heads, 128, 128, causal, window, blocks).tolist()
    offsets, given = sched[:blocks + 1], sched[blocks + 1:]
    assert offsets[0] == 0 and offsets == sorted(offsets) and offsets[-1] == len(given)
    assert sorted(given) == want
    for t, v in zip(tiles, visits, strict=True):  # each tile's K/V tiles: what the kernel's kv_blocks walks
        m, b = t % Tr, t // (Tr * heads)
        n, nk = seqs[b]
        if window is None:
            assert v == flash3_schedule.kv_blocks(m, n, nk, 128, 128, causal)
