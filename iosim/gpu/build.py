"""What the GPU harness compiles and how: template instantiations, compiler options, tile sizes, shared memory.

Nothing here imports CuPy, so the CI compile check (``python -m iosim.gpu.compile_check``, nvcc and no GPU) and the
CPU tests read the very lists the run-time path compiles from.

Names follow the math: ``block_q`` = Br (query rows per thread block), ``block_kv`` = Bc (key/value rows per step),
``head_dim`` = d.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

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


def nvcc_options(include_dir: Path, arch: int) -> list[str]:
    """The same options for nvcc, plus a cubin for one real architecture and ptxas's resource report."""
    return ["-std=c++17", "-ftz=true", f"-I{include_dir}", f"-arch=sm_{arch}", "-cubin", "-Xptxas", "-v"]


# ------------------------------------------------------------------------------------------------------------------
# FlashAttention-2 forward (kernels/flash_fwd.cu)

FLASH_SOURCE = "flash_fwd.cu"
FLASH_KERNEL = "iosim::flash_fwd_kernel"
FLASH_WARPS = 4  # fixed in the kernel: each warp owns block_q / 64 stripes of 16 query rows
FLASH_THREADS = 32 * FLASH_WARPS


def flash_stages(head_dim: int) -> int:
    """Depth of the kernel's K/V cp.async ring (mirrors flash_stages() in kernels/flash_fwd.cu).

    3 (tiles j+1 and j+2 in flight during tile j) where it fits two blocks per SM; 2 at d=256.
    """
    return 2 if head_dim >= 256 else 3


# (block_q, block_kv) the library can launch, per head dim. Every entry compiles without register spills for
# sm_80/sm_90 (checked by compile_check); larger tiles (e.g. 128 x 64 at d=128) spill and are left out.
FLASH_TILES: dict[int, tuple[tuple[int, int], ...]] = {
    32: ((128, 64), (64, 64)),
    64: ((128, 64), (64, 128), (64, 64)),
    128: ((128, 32), (64, 64)),
    256: ((64, 32),),
}
HEAD_DIMS: tuple[int, ...] = tuple(FLASH_TILES)

# default (block_q, block_kv) per (head_dim, causal): chosen from the tile sweep in docs/kernels.md
_DEFAULT_TILES: dict[tuple[int, bool], tuple[int, int]] = {
    (32, False): (128, 64),
    (32, True): (128, 64),
    (64, False): (128, 64),
    (64, True): (128, 64),
    (128, False): (128, 32),
    (128, True): (128, 32),
    (256, False): (64, 32),
    (256, True): (64, 32),
}


def default_tiles(head_dim: int, dtype: str = "bfloat16", causal: bool = False) -> tuple[int, int]:
    """(block_q, block_kv) the flash2 schedule uses when none are given.

    ``dtype`` is accepted for symmetry with the kernel's template (fp16 and bf16 use the same tiles today).
    """
    if head_dim not in FLASH_TILES:
        raise ValueError(f"head_dim={head_dim!r}: expected one of {list(HEAD_DIMS)}")
    if str(dtype) not in CUDA_TYPES:
        raise ValueError(f"dtype={dtype!r}: expected one of {list(CUDA_TYPES)}")
    return _DEFAULT_TILES[(head_dim, bool(causal))]


def flash_smem_terms(head_dim: int, block_q: int, block_kv: int, itemsize: int = 2) -> dict[str, int]:
    """Dynamic shared memory of one flash2 thread block, term by term, in bytes."""
    return {
        # Q_i (Br x d), resident for the whole K/V loop; its rows are reused to stage O for 16-byte stores
        "Q_i": block_q * head_dim * itemsize,
        # K_j (Bc x d), a ring of flash_stages(d) buffers so later tiles load while tile j is used
        "K_j": flash_stages(head_dim) * block_kv * head_dim * itemsize,
        # V_j (Bc x d), likewise
        "V_j": flash_stages(head_dim) * block_kv * head_dim * itemsize,
    }


def flash_smem_bytes(head_dim: int, block_q: int, block_kv: int, itemsize: int = 2) -> int:
    return sum(flash_smem_terms(head_dim, block_q, block_kv, itemsize).values())


@dataclass(frozen=True)
class FlashInstance:
    """One template instantiation of flash_fwd_kernel<D, Br, Bc, T, Causal>."""

    head_dim: int
    block_q: int
    block_kv: int
    dtype: str  # "float16" | "bfloat16"
    causal: bool

    @property
    def name_expression(self) -> str:  # what cupy.RawModule(name_expressions=...) and get_function take
        t = CUDA_TYPES[self.dtype]
        c = "true" if self.causal else "false"
        return f"{FLASH_KERNEL}<{self.head_dim}, {self.block_q}, {self.block_kv}, {t}, {c}>"

    @property
    def explicit_instantiation(self) -> str:  # the same, as a C++ explicit instantiation (nvcc compile check)
        t = CUDA_TYPES[self.dtype]
        return (
            f"template __global__ void {self.name_expression}(const {t}*, const {t}*, const {t}*, {t}*, float*, "
            "int, int, int, int, float);"
        )

    @property
    def source(self) -> str:
        return FLASH_SOURCE


def flash_instances() -> list[FlashInstance]:
    """Every flash2 instantiation the library can launch."""
    return [
        FlashInstance(d, bq, bkv, dt, c)
        for d, tiles in FLASH_TILES.items()
        for bq, bkv in tiles
        for dt in CUDA_TYPES
        for c in (False, True)
    ]


# ------------------------------------------------------------------------------------------------------------------
# Naive attention, Algorithm 0 (kernels/naive.cu). Mirrors the constexprs at the top of naive.cu: the simulator
# counts the same tiling from this dict.

NAIVE_SOURCE = "naive.cu"
NAIVE_TILES: dict[str, dict[str, int]] = {
    # S = scale * Q K^T: a 64 x 64 tile of S per block, reduction over d in steps of 16
    "qk": {"block_m": 64, "block_n": 64, "block_k": 16, "threads": 256},
    # P = softmax(S): one row of S per block, the row held in shared memory (kv_len elements) between passes
    "softmax": {"rows_per_block": 1, "threads": 256},
    # O = P V: a 64 x d tile of O (64 query rows x every head dim) per block, grid (1, ceil(N/64), B*H), so P is
    # read once and V once per 64 rows; reduction over keys in steps of 16, V staged per step in column chunks of 64
    # (at most 4: head_dim <= 256; the kernel's kNaivePvChunks)
    "pv": {"block_m": 64, "block_k": 16, "head_dim_chunk": 64, "max_head_dim": 256, "threads": 256},
}


def naive_softmax_smem_bytes(kv_len: int, itemsize: int = 2) -> int:
    """Dynamic shared memory of the softmax kernel: one row of S in the input dtype."""
    return kv_len * itemsize


@dataclass(frozen=True)
class NaiveInstance:
    """One template instantiation of a naive.cu kernel: kind in {"qk", "softmax", "pv"}."""

    kind: str
    dtype: str
    causal: bool = False  # only the qk kernel is templated on it

    @property
    def name_expression(self) -> str:
        t = CUDA_TYPES[self.dtype]
        if self.kind == "qk":
            return f"iosim::naive_qk_kernel<{t}, {'true' if self.causal else 'false'}>"
        return f"iosim::naive_{self.kind}_kernel<{t}>"

    @property
    def explicit_instantiation(self) -> str:
        t = CUDA_TYPES[self.dtype]
        params = {
            "qk": f"const {t}*, const {t}*, {t}*, int, int, int, int, int, float",
            "softmax": f"const {t}*, {t}*, float*, int",
            "pv": f"const {t}*, const {t}*, {t}*, int, int, int, int, int",
        }[self.kind]
        return f"template __global__ void {self.name_expression}({params});"

    @property
    def source(self) -> str:
        return NAIVE_SOURCE


def naive_instances() -> list[NaiveInstance]:
    out: list[NaiveInstance] = []
    for dt in CUDA_TYPES:
        out += [NaiveInstance("qk", dt, False), NaiveInstance("qk", dt, True)]
        out += [NaiveInstance("softmax", dt), NaiveInstance("pv", dt)]
    return out


def all_instances() -> list[FlashInstance | NaiveInstance]:
    return [*flash_instances(), *naive_instances()]
