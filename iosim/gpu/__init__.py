"""iosim's real kernels on an NVIDIA GPU through CuPy: FlashAttention-2 forward and backward, the naive three-kernel
path, and a FlashAttention-3-style forward for Hopper (schedule="flash3"); differentiable on torch tensors. Flash-Decoding
over a contiguous or paged KV cache, in q's dtype or fp8 (:func:`decode`, :func:`quantize_kv_fp8`). Packed sequences
of different lengths and sliding windows (:func:`attention_varlen`; a window on the dense batch: ``AttentionOptions(window=...)``). FP8 (e4m3) forward on
Hopper with block quantization and incoherent processing (:func:`attention_fp8`, :func:`quantize_fp8`).

Importing this package never imports CuPy; the functions import it when called and raise
:class:`GPUUnavailableError` (one line) where CuPy or a GPU is missing.
"""

from iosim.gpu._cupy import GPUUnavailableError
from iosim.gpu.api import attention
from iosim.gpu.attention import KernelLaunch, LaunchRecord, default_tiles, last_launch, naive_kernels
from iosim.gpu.backward import attention_backward
from iosim.gpu.decode_inputs import QuantizedKV
from iosim.gpu.flash3_host import HopperRequiredError
from iosim.gpu.flash_decode import Decoded, DecodePlan, decode, plan_decode
from iosim.gpu.fp8 import Fp8Tensor, attention_fp8, fp8_blocks, quantize_fp8
from iosim.gpu.inputs import (
    SCHEDULES,
    AttentionInputError,
    AttentionOptions,
    AttentionTypeError,
    BackwardOptions,
    SharedMemoryError,
)
from iosim.gpu.kv_fp8 import quantize_kv_fp8
from iosim.gpu.varlen import Varlen, VarlenBatch, attention_varlen, paged_kv, varlen_batch
from iosim.launch import (
    FLASH3_FP8_TILES,
    FLASH3_TILES,
    FLASH_BWD_TILES,
    FLASH_TILES,
    NAIVE_TILES,
    flash_smem_bytes,
)

__all__ = [
    "FLASH3_FP8_TILES",
    "FLASH3_TILES",
    "FLASH_BWD_TILES",
    "FLASH_TILES",
    "NAIVE_TILES",
    "SCHEDULES",
    "AttentionInputError",
    "AttentionOptions",
    "AttentionTypeError",
    "BackwardOptions",
    "DecodePlan",
    "Decoded",
    "Fp8Tensor",
    "GPUUnavailableError",
    "HopperRequiredError",
    "KernelLaunch",
    "LaunchRecord",
    "QuantizedKV",
    "SharedMemoryError",
    "Varlen",
    "VarlenBatch",
    "attention",
    "attention_backward",
    "attention_fp8",
    "attention_varlen",
    "decode",
    "default_tiles",
    "flash_smem_bytes",
    "fp8_blocks",
    "last_launch",
    "naive_kernels",
    "paged_kv",
    "plan_decode",
    "quantize_fp8",
    "quantize_kv_fp8",
    "varlen_batch",
]
