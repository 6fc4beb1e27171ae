"""What the GPU harness compiles for Flash-Decoding (``kernels/flash_decode.cu``): its template instantiations, named as
CuPy's ``name_expressions`` take them and as the nvcc compile check instantiates them. No CuPy here.

The split kernel ``flash_decode_kernel<D, MT, T>`` per head dim, row stripes (:data:`iosim.launch.decode.DECODE_STRIPES`)
and dtype; the combine kernel ``flash_decode_combine_kernel<D, T>`` per head dim and dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

from iosim.gpu.build import CUDA_TYPES
from iosim.launch.decode import DECODE_HEAD_DIMS, DECODE_STRIPES

DECODE_SOURCE = "flash_decode.cu"
_PARAMS = {  # kind: (kernel, its parameters; {t} is the dtype)
    "split": ("flash_decode_kernel", "const {t}*, const {t}*, const {t}*, {t}*, float*, float*, float*, const int*, "
                                     "const int*, int, int, int, int, int, int, int, float"),
    "combine": ("flash_decode_combine_kernel", "const float*, const float*, const int*, {t}*, float*, int, int, int, "
                                               "int, int"),
}


@dataclass(frozen=True)
class DecodeInstance:
    """One template instantiation: kind "split" <D, MT, T> (``stripes`` = MT) or "combine" <D, T>."""

    kind: str
    head_dim: int
    dtype: str  # "float16" | "bfloat16"
    stripes: int = 1  # split kernel only

    @property
    def name_expression(self) -> str:
        t, name = CUDA_TYPES[self.dtype], _PARAMS[self.kind][0]
        args = f"{self.head_dim}, {self.stripes}, {t}" if self.kind == "split" else f"{self.head_dim}, {t}"
        return f"iosim::{name}<{args}>"

    @property
    def explicit_instantiation(self) -> str:
        params = _PARAMS[self.kind][1].format(t=CUDA_TYPES[self.dtype])
        return f"template __global__ void {self.name_expression}({params});"

    @property
    def source(self) -> str:
        return DECODE_SOURCE


def decode_instances() -> list[DecodeInstance]:
    """Every Flash-Decoding instantiation the library can launch."""
    out = [DecodeInstance("split", d, dt, mt) for d, mt in DECODE_STRIPES for dt in CUDA_TYPES]
    return out + [DecodeInstance("combine", d, dt) for d in DECODE_HEAD_DIMS for dt in CUDA_TYPES]
