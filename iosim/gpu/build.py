"""What the GPU harness compiles and how: template instantiations, compiler options, tile sizes, shared memory.

The tiles, threads and shared memory of each kernel are launch geometry, in :mod:`iosim.launch`. Nothing here
imports CuPy, so the CI compile check (``python -m iosim.gpu.compile_check``, nvcc and no GPU) and the
CPU tests read the very lists the run-time path compiles from.

Names follow the math: ``block_q`` = Br (query rows per thread block), ``block_kv`` = Bc (key/value rows per step),
``head_dim`` = d.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from iosim.launch import (
    FLASH3_BWD_TILES,
    FLASH3_FP8_TILES,
    FLASH3_TILES,
    FLASH_BWD_DQ_BLOCK_KV,
    FLASH_BWD_TILES,
    FLASH_DEFAULT_TILES,
    FLASH_TILES,
    HEAD_DIMS,
    NAIVE_SOFTMAX_REGISTERS,
    varlen,
)
from iosim.schedules.flash2 import PAGE_TILES_HEAD_DIMS

# dtype name (NumPy/CuPy spelling) -> CUDA C++ type of the kernels' template argument
CUDA_TYPES: dict[str, str] = {"float16": "__half", "bfloat16": "__nv_bfloat16"}
ITEMSIZE: dict[str, int] = {"float16": 2, "bfloat16": 2}

# Options given to NVRTC through CuPy. CuPy adds --std=c++17 and -ftz=true itself; they are written out here so the
# nvcc compile check uses the very same ones (CuPy's --device-as-default-execution-space has no nvcc spelling and
# changes nothing: every function in kernels/ is marked __device__ or __global__).
NVRTC_OPTIONS: tuple[str, ...] = ("--std=c++17", "-ftz=true")
COMPILE_ARCHS: tuple[int, ...] = (80, 90)  # what CI checks: Ampere (mma.sync, cp.async, ldmatrix) and Hopper


def nvrtc_options(include_dir: Path) -> tuple[str, ...]:
    """Options for cupy.RawModule: ours plus the kernels folder on the include path (for common.cuh)."""
    return (*NVRTC_OPTIONS, f"-I{include_dir}")


def nvcc_options(include_dir: Path, arch: int | str) -> list[str]:
    """The same options for nvcc, plus a cubin for one real architecture and ptxas's resource report.

    ``arch`` "90a" (flash3: wgmma, setmaxnreg) is spelled with -gencode: nvcc 13.0's -arch=sm_90a shorthand also
    runs a plain sm_90 pass that rejects those instructions."""
    target = f"-gencode=arch=compute_{arch},code=sm_{arch}" if str(arch).endswith("a") else f"-arch=sm_{arch}"
    return ["-std=c++17", "-ftz=true", f"-I{include_dir}", target, "-cubin", "-Xptxas", "-v"]


# ------------------------------------------------------------------------------------------------------------------
# FlashAttention-2 forward (kernels/flash_fwd.cu)

FLASH_SOURCE = "flash_fwd.cu"
FLASH_KERNEL = "iosim::flash_fwd_kernel"


def default_tiles(head_dim: int, dtype: str = "bfloat16", causal: bool = False) -> tuple[int, int]:
    """(block_q, block_kv) the flash2 kernel uses when none are given (:data:`iosim.launch.FLASH_DEFAULT_TILES`).

    ``dtype`` and ``causal`` are checked and accepted for symmetry with the kernel's template (fp16 and bf16,
    causal or not, use the same tiles today).
    """
    if head_dim not in FLASH_TILES:
        raise ValueError(f"head_dim={head_dim!r}: expected one of {list(HEAD_DIMS)}")
    if str(dtype) not in CUDA_TYPES:
        raise ValueError(f"dtype={dtype!r}: expected one of {list(CUDA_TYPES)}")
    return FLASH_DEFAULT_TILES[head_dim]


@dataclass(frozen=True)
class FlashInstance:
    """One template instantiation of flash_fwd_kernel<D, Br, Bc, T, Causal, Local, Varlen, Paged, PageTiles>.

    ``local``: a sliding window (runtime bounds; a causal window is local with right = 0, so never with
    ``causal``); ``varlen``: packed sequences with cumulative lengths, or the dense batch with a window (null
    cu_seqlens); ``paged``: varlen queries against a paged KV cache (a block table; chunked prefill), each key's
    row looked up; ``page_tiles``: the paged kernel for pages a multiple of Bc tokens long, where a K/V tile lies in
    one page and is copied from its first row (:func:`iosim.schedules.flash2.page_tiles`). The dense
    kernel (all False) is named by its first five arguments, as before the others were added: its code is what it
    was (they default to false)."""

    head_dim: int
    block_q: int
    block_kv: int
    dtype: str  # "float16" | "bfloat16"
    causal: bool
    local: bool = False
    varlen: bool = False
    paged: bool = False
    page_tiles: bool = False

    def __post_init__(self):
        if self.causal and self.local:
            raise ValueError("FlashInstance: causal and local together; a causal window is local with right = 0")
        if (self.local or self.paged) and not self.varlen:
            raise ValueError("FlashInstance: local and paged need varlen (the kernel takes the window and the "
                             "cache's lengths with the varlen arguments)")
        if self.page_tiles and not self.paged:
            raise ValueError("FlashInstance: page_tiles needs paged (tiles in one page of a paged cache)")

    @property
    def name_expression(self) -> str:  # what cupy.RawModule(name_expressions=...) and get_function take
        t = CUDA_TYPES[self.dtype]
        flags = ", ".join("true" if f else "false" for f in (self.causal, self.local, self.varlen))
        if self.paged:
            flags += ", true, true" if self.page_tiles else ", true"
        elif not (self.local or self.varlen):
            flags = "true" if self.causal else "false"
        return f"{FLASH_KERNEL}<{self.head_dim}, {self.block_q}, {self.block_kv}, {t}, {flags}>"

    @property
    def explicit_instantiation(self) -> str:  # the same, as a C++ explicit instantiation (nvcc compile check)
        t = CUDA_TYPES[self.dtype]
        return (
            f"template __global__ void {self.name_expression}(const {t}*, const {t}*, const {t}*, {t}*, float*, "
            "int, int, int, int, float, const int*, const int*, int, int, const int*, int, int);"
        )

    @property
    def source(self) -> str:
        return FLASH_SOURCE


def flash_instances() -> list[FlashInstance]:
    """Every flash2 instantiation the library can launch: the dense kernel per tile, dtype and causality; the
    varlen kernel per dtype, plain and causal at each of :data:`iosim.launch.varlen.FLASH_VARLEN_TILES` and with a
    window (Local) at each of :data:`~iosim.launch.varlen.FLASH_LOCAL_TILES`; the paged kernel (chunked prefill) per
    dtype, plain, causal and with a window, at :data:`iosim.launch.varlen.FLASH_PAGED_TILES`, each key's row looked
    up and (``page_tiles``, at :data:`iosim.schedules.flash2.PAGE_TILES_HEAD_DIMS`) a tile in one page."""
    out = [FlashInstance(d, bq, bkv, dt, c) for d, tiles in FLASH_TILES.items() for bq, bkv in tiles
           for dt in CUDA_TYPES for c in (False, True)]
    for local, table in ((False, varlen.FLASH_VARLEN_TILES), (True, varlen.FLASH_LOCAL_TILES)):
        out += [FlashInstance(d, bq, bkv, dt, c, local, True) for d, tiles in table.items() for bq, bkv in tiles
                for dt in CUDA_TYPES for c in ((False,) if local else (False, True))]
    for local in (False, True):
        out += [FlashInstance(d, *varlen.FLASH_PAGED_TILES[d], dt, c, local, True, True, tiles)
                for d in FLASH_TILES for dt in CUDA_TYPES for c in ((False,) if local else (False, True))
                for tiles in ((False, True) if d in PAGE_TILES_HEAD_DIMS else (False,))]
    return out


# ------------------------------------------------------------------------------------------------------------------
# Naive attention, Algorithm 0 (kernels/naive.cu); its tiles are iosim.launch.NAIVE_TILES.

NAIVE_SOURCE = "naive.cu"
SOFTMAX_CHUNKS = tuple(NAIVE_SOFTMAX_REGISTERS)  # the softmax's instantiations: chunks of a row per thread


@dataclass(frozen=True)
class NaiveInstance:
    """One template instantiation of a naive.cu kernel: kind in {"qk", "softmax", "pv"}.

    qk is naive_qk_kernel<D, T, Causal>, pv naive_pv_kernel<D, T> (``head_dim`` = D), softmax
    naive_softmax_kernel<T, Chunks> (``chunks``; ``head_dim`` and ``causal`` unused)."""

    kind: str
    dtype: str
    causal: bool = False  # only the qk kernel is templated on it
    head_dim: int = 0  # qk and pv
    chunks: int = 8  # softmax: 16-byte chunks of a row per thread (iosim.launch.naive_softmax_chunks)

    @property
    def name_expression(self) -> str:
        t = CUDA_TYPES[self.dtype]
        if self.kind == "qk":
            return f"iosim::naive_qk_kernel<{self.head_dim}, {t}, {'true' if self.causal else 'false'}>"
        if self.kind == "pv":
            return f"iosim::naive_pv_kernel<{self.head_dim}, {t}>"
        return f"iosim::naive_softmax_kernel<{t}, {self.chunks}>"

    @property
    def explicit_instantiation(self) -> str:
        t = CUDA_TYPES[self.dtype]
        params = {
            "qk": f"const {t}*, const {t}*, {t}*, int, int, int, int, float",
            "softmax": f"const {t}*, {t}*, float*, int, long long, int",
            "pv": f"const {t}*, const {t}*, {t}*, int, int, int, int, int",
        }[self.kind]
        return f"template __global__ void {self.name_expression}({params});"

    @property
    def source(self) -> str:
        return NAIVE_SOURCE


def naive_instances() -> list[NaiveInstance]:
    """Every naive instantiation the library can launch: qk and pv per head dim, the softmax per dtype and chunks
    per thread."""
    out: list[NaiveInstance] = []
    for dt in CUDA_TYPES:
        for d in HEAD_DIMS:
            out += [NaiveInstance("qk", dt, False, d), NaiveInstance("qk", dt, True, d), NaiveInstance("pv", dt, head_dim=d)]
        out += [NaiveInstance("softmax", dt, chunks=c) for c in SOFTMAX_CHUNKS]
    return out


# ------------------------------------------------------------------------------------------------------------------
# FlashAttention-2 backward (kernels/flash_bwd.cu); tiles in iosim.launch.FLASH_BWD_TILES / FLASH_BWD_DQ_BLOCK_KV

FLASH_BWD_SOURCE = "flash_bwd.cu"
_BWD_PARAMS = {  # kind: (kernel, its parameters after the template's own: T is the dtype)
    "preprocess": ("flash_bwd_preprocess_kernel", "const {t}*, const {t}*, float*, float*, int, int, long long"),
    "main": ("flash_bwd_kernel", "const {t}*, const {t}*, const {t}*, const {t}*, const float*, const float*, float*, "
                                 "{t}*, {t}*, int, int, int, int, float, float"),
    "dq": ("flash_bwd_dq_kernel", "const {t}*, const {t}*, const {t}*, const {t}*, const float*, const float*, {t}*, "
                                  "int, int, int, int, float, float"),
    "convert": ("flash_bwd_convert_dq_kernel", "const float*, {t}*, long long"),
}


@dataclass(frozen=True)
class FlashBwdInstance:
    """One template instantiation of a flash_bwd.cu kernel: kind "preprocess" <D, T>, "main" <D, Br, Bc, T, Causal>,
    "dq" (deterministic mode) <D, Br, Bc, T, Causal> or "convert" <T>."""

    kind: str
    dtype: str
    head_dim: int = 0
    block_q: int = 0
    block_kv: int = 0
    causal: bool = False

    @property
    def name_expression(self) -> str:
        t, name = CUDA_TYPES[self.dtype], _BWD_PARAMS[self.kind][0]
        if self.kind == "preprocess":
            args = f"{self.head_dim}, {t}"
        elif self.kind == "convert":
            args = t
        else:
            args = f"{self.head_dim}, {self.block_q}, {self.block_kv}, {t}, {'true' if self.causal else 'false'}"
        return f"iosim::{name}<{args}>"

    @property
    def explicit_instantiation(self) -> str:
        params = _BWD_PARAMS[self.kind][1].format(t=CUDA_TYPES[self.dtype])
        return f"template __global__ void {self.name_expression}({params});"

    @property
    def source(self) -> str:
        return FLASH_BWD_SOURCE


def flash_bwd_instances() -> list[FlashBwdInstance]:
    """Every backward instantiation the library can launch: per dtype the dQ conversion; per head dim the
    preprocessing; per head dim and causality the main kernel and the deterministic dQ kernel."""
    out: list[FlashBwdInstance] = []
    for dt in CUDA_TYPES:
        out.append(FlashBwdInstance("convert", dt))
        for d, (bq, bkv) in FLASH_BWD_TILES.items():
            out.append(FlashBwdInstance("preprocess", dt, d))
            for c in (False, True):
                out.append(FlashBwdInstance("main", dt, d, bq, bkv, c))
                out.append(FlashBwdInstance("dq", dt, d, 64, FLASH_BWD_DQ_BLOCK_KV[d], c))
    return out


def all_instances() -> list[FlashInstance | NaiveInstance | FlashBwdInstance]:
    return [*flash_instances(), *naive_instances(), *flash_bwd_instances()]


# ------------------------------------------------------------------------------------------------------------------
# FlashAttention-3 forward (kernels/flash3_fwd.cu): sm_90a only; tiles in iosim.launch.FLASH3_TILES

FLASH3_SOURCE = "flash3_fwd.cu"
FLASH3_KERNEL = "iosim::flash3_fwd_kernel"
FLASH3_ARCH = "90a"  # wgmma, setmaxnreg: the arch-specific Hopper target (NVRTC: -arch=sm_90a)


FP8_DTYPE = "e4m3"  # the fp8 instantiations' input dtype name (iosim.gpu.fp8); their O is bfloat16
FLASH3_CUDA_TYPES: dict[str, str] = {**CUDA_TYPES, FP8_DTYPE: "iosim::e4m3"}


@dataclass(frozen=True)
class Flash3Instance:
    """One template instantiation of flash3_fwd_kernel<D, Bc, T, Causal, Local, Varlen> (Br is fixed at 128; Local: a
    sliding window, 16-bit inputs, not causal: a causal window is one with right = 0; Varlen: packed sequences,
    16-bit inputs)."""

    head_dim: int
    block_kv: int
    dtype: str  # "float16" | "bfloat16" | "e4m3" (fp8 inputs, bf16 O)
    causal: bool
    local: bool = False
    varlen: bool = False  # packed sequences (cu_seqlens; 16-bit inputs)

    @property
    def name_expression(self) -> str:
        t = FLASH3_CUDA_TYPES[self.dtype]
        c = "true" if self.causal else "false"
        tail = [*(["true" if self.local else "false"] if self.local or self.varlen else []),
                *(["true"] if self.varlen else [])]  # Local, Varlen: defaults false
        return f"{FLASH3_KERNEL}<{', '.join([str(self.head_dim), str(self.block_kv), t, c, *tail])}>"

    @property
    def explicit_instantiation(self) -> str:
        o = CUDA_TYPES.get(self.dtype, "__nv_bfloat16")
        m = "const __grid_constant__ iosim::TmaMap"
        f = "const float*"
        return (f"template __global__ void {self.name_expression}({m}, {m}, {m}, {o}*, float*, const int*, {f}, {f}, "
                f"{f}, int, int, int, int, int, float, int, int, const int*, const int*, int);")

    @property
    def source(self) -> str:
        return FLASH3_SOURCE

    @property
    def nvrtc_extra(self) -> tuple[str, ...]:  # added to nvrtc_options(): CuPy's own -arch gives way to ours
        return (f"-arch=sm_{FLASH3_ARCH}",)


def flash3_instances() -> list[Flash3Instance]:
    """Every flash3 instantiation the library can launch."""
    return [
        Flash3Instance(d, bkv, dt, c)
        for d, (_, bkv) in FLASH3_TILES.items()
        for dt in CUDA_TYPES
        for c in (False, True)
    ] + [Flash3Instance(d, bkv, dt, False, True) for d, (_, bkv) in FLASH3_TILES.items() for dt in CUDA_TYPES] + [
        Flash3Instance(d, bkv, dt, c, w, True) for d, (_, bkv) in FLASH3_TILES.items() for dt in CUDA_TYPES
        for c, w in ((False, False), (True, False), (False, True))] + [
        Flash3Instance(d, bkv, FP8_DTYPE, c) for d, (_, bkv) in FLASH3_FP8_TILES.items() for c in (False, True)]


# ------------------------------------------------------------------------------------------------------------------
# FlashAttention-3-design backward (kernels/flash3_bwd.cu): sm_90a only; tiles in iosim.launch.FLASH3_BWD_TILES.
# Its preprocess and dQ conversion (and deterministic dQ) kernels are flash_bwd.cu's (FlashBwdInstance).

FLASH3_BWD_SOURCE = "flash3_bwd.cu"
FLASH3_BWD_KERNEL = "iosim::flash3_bwd_kernel"


@dataclass(frozen=True)
class Flash3BwdInstance:
    """One template instantiation of flash3_bwd_kernel<D, Br, T, Causal> (Bc is fixed at 128)."""

    head_dim: int
    block_q: int
    dtype: str
    causal: bool

    @property
    def name_expression(self) -> str:
        t = CUDA_TYPES[self.dtype]
        return f"{FLASH3_BWD_KERNEL}<{self.head_dim}, {self.block_q}, {t}, {'true' if self.causal else 'false'}>"

    @property
    def explicit_instantiation(self) -> str:
        t = CUDA_TYPES[self.dtype]
        m = "const __grid_constant__ iosim::TmaMap"
        return (f"template __global__ void {self.name_expression}({m}, {m}, {m}, {m}, const float*, const float*, "
                f"float*, {t}*, {t}*, int, int, int, int, float, float);")

    @property
    def source(self) -> str:
        return FLASH3_BWD_SOURCE

    @property
    def nvrtc_extra(self) -> tuple[str, ...]:
        return (f"-arch=sm_{FLASH3_ARCH}",)


def flash3_bwd_instances() -> list[Flash3BwdInstance]:
    """Every flash3 backward instantiation the library can launch."""
    return [Flash3BwdInstance(d, bq, dt, c) for d, (bq, _) in FLASH3_BWD_TILES.items() for dt in CUDA_TYPES
            for c in (False, True)]
