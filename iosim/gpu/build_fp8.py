"""What the GPU harness compiles for fp8 block quantization (kernels/quantize_fp8.cu), the fp8 forward's input pass:
sm_90a like the forward it feeds. Apart from :mod:`iosim.gpu.build` as :mod:`iosim.gpu.build_decode` is."""

from __future__ import annotations

from dataclasses import dataclass

from iosim.gpu.build import CUDA_TYPES, FLASH3_ARCH
from iosim.launch import FLASH3_FP8_TILES

QUANTIZE_SOURCE = "quantize_fp8.cu"
QUANTIZE_KERNEL = "iosim::quantize_fp8_kernel"


@dataclass(frozen=True)
class QuantizeInstance:
    """One template instantiation of quantize_fp8_kernel<T, D, Transpose> (Transpose: V^T for the P V wgmma)."""

    dtype: str  # of the input: "float16" | "bfloat16"
    head_dim: int
    transpose: bool

    @property
    def name_expression(self) -> str:
        return f"{QUANTIZE_KERNEL}<{CUDA_TYPES[self.dtype]}, {self.head_dim}, {'true' if self.transpose else 'false'}>"

    @property
    def explicit_instantiation(self) -> str:
        t, f = CUDA_TYPES[self.dtype], "const float*"
        return (f"template __global__ void {self.name_expression}(const {t}*, unsigned char*, float*, {f}, {f}, float*, "
                "int, int, int, int);")

    @property
    def source(self) -> str:
        return QUANTIZE_SOURCE

    @property
    def nvrtc_extra(self) -> tuple[str, ...]:
        return (f"-arch=sm_{FLASH3_ARCH}",)


def quantize_instances() -> list[QuantizeInstance]:
    """Every quantization instantiation: the fp8 forward's head dims, both input dtypes, rows or V^T."""
    return [QuantizeInstance(dt, d, t) for d in FLASH3_FP8_TILES for dt in CUDA_TYPES for t in (False, True)]
