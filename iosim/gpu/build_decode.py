"""What the GPU harness compiles for Flash-Decoding (``kernels/flash_decode.cu``): its template instantiations, named as
CuPy's ``name_expressions`` take them and as the nvcc compile check instantiates them. No CuPy here.

The split kernel ``flash_decode_kernel<D, MT, T, KV>`` per head dim, row stripes
(:data:`iosim.launch.decode.DECODE_STRIPES`), dtype and cache type (KV = T, or ``iosim::e4m3`` for an fp8 cache); the
combine kernel ``flash_decode_combine_kernel<D, T>`` per head dim and dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

from iosim.gpu.build import CUDA_TYPES
from iosim.launch.decode import DECODE_HEAD_DIMS, DECODE_STRIPES

DECODE_SOURCE = "flash_decode.cu"
FP8_CACHE_TYPE = "iosim::e4m3"  # the kernel's one-byte storage type of an fp8 cache (kernels/common.cuh)
_PARAMS = {  # kind: (kernel, its parameters; {t} is the dtype)
    "split": ("flash_decode_kernel", "const {t}*, const {kv}*, const {kv}*, {t}*, float*, float*, float*, const int*, "
                                     "const int*, const float*, const float*, int, int, int, int, int, int, int, float"),
    "combine": ("flash_decode_combine_kernel", "const float*, const float*, const int*, {t}*, float*, int, int, int, "
                                               "int, int"),
}


@dataclass(frozen=True)
class DecodeInstance:
    """One template instantiation: kind "split" <D, MT, T, KV> (``stripes`` = MT; ``fp8_cache``: KV = e4m3, else
    T) or "combine" <D, T>."""

    kind: str
    head_dim: int
    dtype: str  # "float16" | "bfloat16": q's and O's
    stripes: int = 1  # split kernel only
    fp8_cache: bool = False  # split kernel only: K and V in e4m3 with per-kv-head scales

    @property
    def _kv_type(self) -> str:
        return FP8_CACHE_TYPE if self.fp8_cache else CUDA_TYPES[self.dtype]

    @property
    def name_expression(self) -> str:
        t, name = CUDA_TYPES[self.dtype], _PARAMS[self.kind][0]
        args = f"{self.head_dim}, {self.stripes}, {t}, {self._kv_type}" if self.kind == "split" else f"{self.head_dim}, {t}"
        return f"iosim::{name}<{args}>"

    @property
    def explicit_instantiation(self) -> str:
        params = _PARAMS[self.kind][1].format(t=CUDA_TYPES[self.dtype], kv=self._kv_type)
        return f"template __global__ void {self.name_expression}({params});"

    @property
    def source(self) -> str:
        return DECODE_SOURCE


def decode_instances() -> list[DecodeInstance]:
    """Every Flash-Decoding instantiation the library can launch."""
    out = [DecodeInstance("split", d, dt, mt, fp8) for d, mt in DECODE_STRIPES for dt in CUDA_TYPES
           for fp8 in (False, True)]
    return out + [DecodeInstance("combine", d, dt) for d in DECODE_HEAD_DIMS for dt in CUDA_TYPES]
