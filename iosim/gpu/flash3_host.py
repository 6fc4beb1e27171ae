"""Host side of the FlashAttention-3-style forward kernel (kernels/flash3_fwd.cu, sm_90a only): TMA tensor maps,
the Hopper check and the launch.

Tensor maps come from the CUDA driver's ``cuTensorMapEncodeTiled`` (:mod:`iosim.gpu.driver`: ctypes on
``libcuda``, and why); the function only fills a 128-byte host struct (no context, no device memory, no stream), so
nothing is shared with CuPy's driver state. The 128 bytes reach the kernel by value as a ``__grid_constant__``
parameter, passed through CuPy as a NumPy structured scalar of 16 uint64 (CuPy's custom-struct arguments).

Nothing here imports CuPy at module level; :func:`wgmma_header` (the generator of kernels/flash3_wgmma.cuh) runs on
any machine.
"""

from __future__ import annotations

import ctypes
from typing import Any, NamedTuple

import numpy as np

from iosim import launch
from iosim.gpu.driver import libcuda
from iosim.launch.flash3_schedule import tile_schedule, varlen_schedule, varlen_tiles
from iosim.launch.varlen import Mask

# CUtensorMapDataType / CUtensorMapSwizzle / CUtensorMapL2promotion values (cuda.h, CUDA 12.0+)
_TMA_DTYPE = {"float16": 6, "bfloat16": 9, "e4m3": 0}  # e4m3: UINT8 (TMA moves bytes)
_TMA_ITEMSIZE = {"float16": 2, "bfloat16": 2, "e4m3": 1}
_SWIZZLE = {64: 2, 128: 3}  # CU_TENSOR_MAP_SWIZZLE_64B / _128B, by the bytes of a box row
_L2_PROMOTION_256B = 3
_OOB_FILL_ZERO = 0  # out-of-bounds box elements are read as zeros (ragged N, N_kv)


class HopperRequiredError(RuntimeError):
    """schedule="flash3" needs an sm_90 GPU (H100, H200): wgmma, TMA and setmaxnreg exist nowhere else."""


def require_hopper(cp: Any) -> None:
    dev = cp.cuda.Device()
    cc = str(dev.compute_capability)
    if cc != "90":
        name = cp.cuda.runtime.getDeviceProperties(dev.id)["name"]
        name = name.decode() if isinstance(name, bytes) else name
        raise HopperRequiredError(
            f"schedule='flash3' needs a Hopper GPU (compute capability 9.0: H100, H200; it uses wgmma, TMA and "
            f"setmaxnreg of sm_90a), but device {dev.id} is {name} (compute capability {cc[:-1]}.{cc[-1]}); "
            "use schedule='flash2'"
        )


def _tensor_map_dtype():
    return np.dtype({"names": [f"w{i}" for i in range(16)], "formats": [np.uint64] * 16})


_maps: dict[tuple, Any] = {}  # encoded maps by their arguments: a map is 128 bytes fixed by them alone


def tensor_map(name: str, ptr: int, dtype: str, batch: int, rows: int, heads: int, head_dim: int,
               box_rows: int) -> Any:
    """A TMA map of a (batch, rows, heads, head_dim) contiguous tensor, read in boxes of (box_rows rows x one
    128-byte row of head-dim elements: 64 fp16/bf16, 128 e4m3; 64 B where head_dim is 64 e4m3) of one head: dims
    innermost first (head_dim, heads, rows, batch); swizzled to the box row's width, so each box lands in shared
    memory as wgmma's swizzled layout. Returned as a NumPy scalar that CuPy passes by value."""
    e = _TMA_ITEMSIZE[dtype]
    row = min(head_dim * e, 128)
    return _encode(name, ptr, dtype, (head_dim, heads, rows, batch), (row // e, 1, box_rows, 1), row)


def vt_tensor_map(ptr: int, batch: int, kv_heads: int, head_dim: int, rows_pad: int, box_keys: int) -> Any:
    """The fp8 kernel's map of V^T (batch, kv_heads, head_dim, rows_pad) e4m3, read in boxes of (head_dim rows x
    box_keys keys: 128, or 64 where block_kv is no multiple of 128, as flash3_fwd.cu's kVRowBytes): dims innermost
    first (rows_pad, head_dim, kv_heads, batch)."""
    return _encode("v^T", ptr, "e4m3", (rows_pad, head_dim, kv_heads, batch), (box_keys, head_dim, 1, 1), box_keys)


def _encode(name: str, ptr: int, dtype: str, dims_: tuple[int, ...], box_: tuple[int, ...], row_bytes: int) -> Any:
    key = (ptr, dtype, dims_, box_)
    hit = _maps.get(key)
    if hit is not None:
        return hit
    e = _TMA_ITEMSIZE[dtype]
    dims = (ctypes.c_uint64 * 4)(*dims_)
    strides = (ctypes.c_uint64 * 3)(dims_[0] * e, dims_[0] * dims_[1] * e, dims_[0] * dims_[1] * dims_[2] * e)
    box = (ctypes.c_uint32 * 4)(*box_)
    one = (ctypes.c_uint32 * 4)(1, 1, 1, 1)
    buf = ctypes.create_string_buffer(128 + 64)
    addr = (ctypes.addressof(buf) + 63) // 64 * 64
    rc = libcuda().cuTensorMapEncodeTiled(
        ctypes.c_void_p(addr), _TMA_DTYPE[dtype], 4, ctypes.c_void_p(ptr), dims, strides, box, one, 0,
        _SWIZZLE[row_bytes], _L2_PROMOTION_256B, _OOB_FILL_ZERO,
    )
    if rc != 0:
        raise RuntimeError(
            f"cuTensorMapEncodeTiled({name}: dims {tuple(dims)}, strides {tuple(strides)} B, box {tuple(box)}) "
            f"failed with CUresult {rc}"
        )
    raw = ctypes.string_at(addr, 128)
    if len(_maps) >= 256:  # a bounded cache: forget the oldest maps (dicts keep insertion order)
        for k in list(_maps)[:128]:
            del _maps[k]
    _maps[key] = m = np.frombuffer(raw, dtype=_tensor_map_dtype())[0]
    return m


_schedules: dict[tuple, Any] = {}


def _device_schedule(cp: Any, key: tuple) -> Any:
    """tile_schedule(*key) on the device (an int32 array, or None), computed once per shape and device."""
    dkey = (cp.cuda.Device().id, *key)
    if dkey not in _schedules:
        sched = tile_schedule(*key)
        _schedules[dkey] = None if sched is None else cp.asarray(sched, dtype=cp.int32)
    return _schedules[dkey]


def launch_kernel(cp: Any, fn: Any, q: Any, k: Any, v: Any, o: Any, lse: Any, *, causal: bool, scale_log2: float,
           dtype: str, block_q: int, block_kv: int, smem: int, scales: tuple[Any, Any, Any] | None = None,
           window: tuple[int, int] = (0, 0)) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """Launch flash3_fwd_kernel (compiled as ``fn``) on (B, N, H, d) q and (B, N_kv, H_kv, d) k, v; returns (grid, block).
    fp8 (dtype "e4m3"): q and k hold e4m3 bytes, v is V^T (B, H_kv, d, N_kv padded) and ``scales`` the three block
    scale arrays (:mod:`iosim.gpu.fp8`). ``window``: (left, right) as the Local instantiation takes them
    (:meth:`iosim.launch.varlen.Mask.kernel_window`); the others ignore it.

    Persistent grid: min(Tr * H * B, SMs) blocks, each taking Q tiles blockIdx.x, blockIdx.x + gridDim.x, ... in
    flash2's grid order (Q tiles of one (batch, head) fastest, so co-resident blocks share K/V in L2; causal Q tiles
    last-first within a head)."""
    B, N, H, D = (int(s) for s in q.shape)
    Nk, Hk = int(k.shape[1]), int(k.shape[2])
    tm_q = tensor_map("q", q.data.ptr, dtype, B, N, H, D, block_q)
    tm_k = tensor_map("k", k.data.ptr, dtype, B, Nk, Hk, D, block_kv)
    if dtype == "e4m3":
        tm_v = vt_tensor_map(v.data.ptr, B, Hk, D, int(v.shape[3]), 128 if block_kv % 128 == 0 else 64)
    else:
        tm_v = tensor_map("v", v.data.ptr, dtype, B, Nk, Hk, D, block_kv)
    sms = int(cp.cuda.Device().attributes["MultiProcessorCount"])
    grid = (min(launch.flash3_tiles(B, N, H, block_q), sms), 1, 1)
    block = (launch.FLASH3_THREADS, 1, 1)
    sched = _device_schedule(cp, (B, N, Nk, H, block_q, block_kv, causal, grid[0]))
    i32, null = cp.int32, cp.uint64(0)
    sq, sk, sv = scales if scales is not None else (null, null, null)
    fn(grid, block, (tm_q, tm_k, tm_v, o, lse, sched if sched is not None else null, sq, sk, sv, i32(B), i32(N),
                     i32(Nk), i32(H), i32(Hk), cp.float32(scale_log2), i32(window[0]), i32(window[1]), null, null,
                     i32(0)), shared_mem=smem)
    return grid, block


_varlen_schedules: dict[tuple, tuple[int, Any]] = {}  # (blocks, the CSR list on the device) by batch and shape


class VarlenCall(NamedTuple):
    """What a packed-sequences launch needs besides its arrays: ``seqlens`` (queries, keys) per sequence on the
    host, ``cu_seqlens`` (q, k) their cumulative lengths on the device, the causal mask or window
    (:class:`iosim.launch.varlen.Mask`), the dtype name, the tiles, the softmax scale in log2 units and the dynamic
    shared memory."""

    seqlens: tuple[tuple[int, int], ...]
    cu_seqlens: tuple[Any, Any]
    mask: Mask
    dtype: str
    block_q: int
    block_kv: int
    scale_log2: float
    smem: int


def launch_varlen(cp: Any, fn: Any, arrays: tuple[Any, Any, Any, Any, Any],
                  call: VarlenCall) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """Launch the Varlen flash3_fwd_kernel (compiled as ``fn``) on ``arrays``: packed (total_q, H, d) q, (total_k,
    H_kv, d) k and v, O like q, lse (H, total_q). The tensor maps see one batch of total rows; the persistent grid
    (min(working tiles, SMs) blocks) runs the host schedule of :func:`iosim.launch.flash3_schedule.varlen_schedule`,
    computed once per batch and shape. Returns (grid, block)."""
    q, k, v, o, lse = arrays
    total_q, H, D = (int(x) for x in q.shape)
    total_k, Hk = int(k.shape[0]), int(k.shape[1])
    tm_q = tensor_map("q", q.data.ptr, call.dtype, 1, total_q, H, D, call.block_q)
    tm_k = tensor_map("k", k.data.ptr, call.dtype, 1, total_k, Hk, D, call.block_kv)
    tm_v = tensor_map("v", v.data.ptr, call.dtype, 1, total_k, Hk, D, call.block_kv)
    sms = int(cp.cuda.Device().attributes["MultiProcessorCount"])
    causal, window = call.mask
    tiles = (H, call.block_q, call.block_kv, causal, window)
    key = (cp.cuda.Device().id, call.seqlens, *tiles, sms)
    if key not in _varlen_schedules:
        blocks = max(1, min(len(varlen_tiles(call.seqlens, *tiles)[0]), sms))
        sched = varlen_schedule(call.seqlens, *tiles, blocks)
        if len(_varlen_schedules) >= 256:  # bounded, as the tensor maps' cache (a serving loop's batches differ)
            for old in list(_varlen_schedules)[:128]:
                del _varlen_schedules[old]
        _varlen_schedules[key] = (blocks, cp.asarray(sched.astype(np.int32)))
    blocks, sched = _varlen_schedules[key]
    grid, block = (blocks, 1, 1), (launch.FLASH3_THREADS, 1, 1)
    left, right = call.mask.kernel_window()
    i32, null = cp.int32, cp.uint64(0)
    fn(grid, block, (tm_q, tm_k, tm_v, o, lse, sched, null, null, null, i32(len(call.seqlens)),
                     i32(max(n for n, _ in call.seqlens)), i32(total_k), i32(H), i32(Hk), cp.float32(call.scale_log2),
                     i32(left), i32(right), *call.cu_seqlens, i32(total_q)), shared_mem=call.smem)
    return grid, block


# ------------------------------------------------------------------------------------------------------------------
# kernels/flash3_wgmma.cuh: one inline-PTX wrapper per wgmma shape the kernel uses (an accumulator of N/2 fp32
# registers per thread is N/2 asm operands, so the wrappers are generated rather than written by hand).

WGMMA_SS_N = (64, 128, 176, 192)  # S = Q K^T: N = block_kv
WGMMA_RS_N = (64, 128, 256)  # O += P V: N = head_dim
_PTX_TYPE = {"__half": "f16", "__nv_bfloat16": "bf16"}
FP8_CTYPE = "iosim::e4m3"  # kernels/hopper.cuh: the fp8 instantiations' input type (8-bit wgmma, k32)
WGMMA_FP8_SS_N = (64, 128, 192)  # S = Q K^T: N = block_kv
WGMMA_FP8_RS_N = tuple(sorted(launch.FLASH3_FP8_TILES))  # O += P V^T: N = head_dim


def _wgmma_fn(kind: str, n: int, ctype: str) -> str:
    fp8 = ctype == "e4m3"  # e4m3 x e4m3, k32
    t, k = ("e4m3", 32) if fp8 else (_PTX_TYPE[ctype], 16)
    r = n // 2
    acc = ", ".join(f"%{i}" for i in range(r))
    outs = ", ".join(f'"+f"(d[{i}])' for i in range(r))
    if kind in ("ss", "ss_tt"):
        sig = f"float (&d)[{r}], unsigned long long a_desc, unsigned long long b_desc, int accumulate"
        ops = f"%{r}, %{r + 1}"
        scale = f"%{r + 2}"
        # imm-scale-a, imm-scale-b, then K-major A and B ("ss") or MN-major A and B ("ss_tt": the backward's
        # dQ = dS K reads dS from the stored dS^T and K with d contiguous)
        tail = "1, 1, 0, 0" if kind == "ss" else "1, 1, 1, 1"
        ins = '"l"(a_desc), "l"(b_desc), "r"(accumulate)'
    else:
        sig = f"float (&d)[{r}], const unsigned (&a)[4], unsigned long long b_desc, int accumulate"
        ops = f"{{%{r}, %{r + 1}, %{r + 2}, %{r + 3}}}, %{r + 4}"
        scale = f"%{r + 5}"
        tail = "1, 1, 1"  # imm-scale-a, imm-scale-b, N-major B (V is stored key-major: d contiguous)
        ins = '"r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(accumulate)'
    if fp8:
        tail = "1, 1"  # 8-bit wgmma takes K-major A and B only (no transpose immediates): P V reads V^T
    return (
        f"template <> __device__ __forceinline__ void wgmma_{kind}<{n}, {ctype}>({sig}) {{\n"
        f'    asm volatile("{{\\n.reg .pred p;\\nsetp.ne.b32 p, {scale}, 0;\\n"\n'
        f'                 "wgmma.mma_async.sync.aligned.m64n{n}k{k}.f32.{t}.{t} {{{acc}}}, {ops}, p, {tail};\\n}}\\n"\n'
        f"                 : {outs}\n"
        f"                 : {ins});\n"
        "}\n"
    )


def wgmma_header() -> str:
    """The text of kernels/flash3_wgmma.cuh (tests/test_flash3_build.py checks the file equals it)."""
    parts = [
        "// flash3_wgmma.cuh: wgmma.mma_async wrappers for kernels/flash3_fwd.cu (sm_90a).\n"
        "// GENERATED by iosim.gpu.flash3_host.wgmma_header(); do not edit by hand (tests/test_flash3_build.py checks it).\n"
        "//   wgmma_ss<N, T>(d, a_desc, b_desc, accumulate): d (64 x N fp32) = A (64 x 16, shared, K-major) *\n"
        "//       B (16 x N, shared, K-major) + (accumulate ? d : 0)\n"
        "//   wgmma_rs<N, T>(d, a, b_desc, accumulate): A (64 x 16) from registers (4 x f16x2 per thread), B N-major\n"
        "//   T = e4m3 (fp8): k32 instead of k16, A and B K-major (ss and rs); rs takes 4 x 4 e4m3 a thread: rows\n"
        "//       (t%32)/4 + {0, 8}, columns 4*(t%4) + {0..3} and 16 + 4*(t%4) + {0..3}\n"
        "// Accumulator layout: thread t of the warpgroup holds rows 16*(t/32) + (t%32)/4 + {0, 8}, columns\n"
        "// 8*i + 2*(t%4) + {0, 1} at d[4*i + {0, 1}] (row +0) and d[4*i + {2, 3}] (row +8).\n"
        "#pragma once\n\n#include \"hopper.cuh\"  // iosim::e4m3\n\nnamespace iosim {\n\n"
        "template <int N, typename T>\n"
        "__device__ __forceinline__ void wgmma_ss(float (&d)[N / 2], unsigned long long a_desc, "
        "unsigned long long b_desc, int accumulate);\n"
        "template <int N, typename T>\n"
        "__device__ __forceinline__ void wgmma_rs(float (&d)[N / 2], const unsigned (&a)[4], "
        "unsigned long long b_desc, int accumulate);\n\n"
    ]
    for ctype in _PTX_TYPE:
        for n in WGMMA_SS_N:
            parts.append(_wgmma_fn("ss", n, ctype) + "\n")
        for n in WGMMA_RS_N:
            parts.append(_wgmma_fn("rs", n, ctype) + "\n")
    for n in WGMMA_FP8_SS_N:
        parts.append(_wgmma_fn("ss", n, "e4m3") + "\n")
    for n in WGMMA_FP8_RS_N:
        parts.append(_wgmma_fn("rs", n, "e4m3") + "\n")
    parts.append("}  // namespace iosim\n")
    return "".join(parts)


WGMMA_SS_TT_N = (32, 64)  # backward dQ = dS K: N = head_dim / 2 (each consumer warpgroup half of d)


def bwd_wgmma_header() -> str:
    """The text of kernels/flash3_bwd_wgmma.cuh: the MN-major wgmma_ss_tt wrappers of kernels/flash3_bwd.cu."""
    parts = [
        "// flash3_bwd_wgmma.cuh: wgmma.mma_async wrappers with MN-major A and B for kernels/flash3_bwd.cu (sm_90a).\n"
        "// GENERATED by iosim.gpu.flash3_host.bwd_wgmma_header(); do not edit by hand (tests/test_flash3_build.py checks "
        "it).\n"
        "//   wgmma_ss_tt<N, T>(d, a_desc, b_desc, accumulate): d (64 x N fp32) = A (64 x 16, shared, M contiguous) *\n"
        "//       B (16 x N, shared, N contiguous) + (accumulate ? d : 0); accumulator layout as flash3_wgmma.cuh.\n"
        "#pragma once\n\nnamespace iosim {\n\n"
        "template <int N, typename T>\n"
        "__device__ __forceinline__ void wgmma_ss_tt(float (&d)[N / 2], unsigned long long a_desc, "
        "unsigned long long b_desc, int accumulate);\n\n"
    ]
    for ctype in _PTX_TYPE:
        for n in WGMMA_SS_TT_N:
            parts.append(_wgmma_fn("ss_tt", n, ctype) + "\n")
    parts.append("}  // namespace iosim\n")
    return "".join(parts)


if __name__ == "__main__":  # python -m iosim.gpu.flash3_host [bwd] > kernels/flash3_wgmma.cuh (flash3_bwd_wgmma.cuh)
    import sys

    sys.stdout.write(bwd_wgmma_header() if sys.argv[1:] == ["bwd"] else wgmma_header())
