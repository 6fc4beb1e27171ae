"""What ``iosim calibrate rates`` compiles (kernels/rates.cu): one module, its extern "C" kernels plus the template
instantiations named here; on Hopper also the wgmma kernels (sm_90a). Apart from :mod:`iosim.gpu.build` as
:mod:`iosim.gpu.build_fp8` is."""

from __future__ import annotations

from dataclasses import dataclass

from iosim.gpu.build import CUDA_TYPES, FLASH3_ARCH, FLASH3_CUDA_TYPES, FP8_DTYPE

RATES_SOURCE = "rates.cu"
RATES_WGMMA_DEFINE = "-DIOSIM_RATES_WGMMA"
RATES_WGMMA_N = (128, 256)  # wgmma m64nNk16 (e4m3: m64nNk32)
RATES_WARPGROUPS = (1, 2, 3)  # warpgroups per block (one block per SM)
# the wgmma kernels' input types: fp16, bf16 and e4m3 (k32); CUDA_TYPES stays 16-bit, as the other kernels read it
RATES_WGMMA_TYPES: dict[str, str] = {**CUDA_TYPES, FP8_DTYPE: FLASH3_CUDA_TYPES[FP8_DTYPE]}


def rates_mma_names() -> dict[tuple[str, str], str]:
    """{(kind, dtype): name expression} of the mma.sync kernels, kind "mma" (throughput) or "latency"."""
    return {(kind, dt): f"rates_{'mma' if kind == 'mma' else 'mma_latency'}<{t}>"
            for dt, t in CUDA_TYPES.items() for kind in ("mma", "latency")}


def rates_wgmma_names() -> dict[tuple[int, str, int], str]:
    """{(N, dtype, warpgroups): name expression} of the wgmma kernels (sm_90a); dtype "float16", "bfloat16" or
    "e4m3"."""
    return {(n, dt, wg): f"rates_wgmma<{n}, {t}, {wg}>"
            for n in RATES_WGMMA_N for dt, t in RATES_WGMMA_TYPES.items() for wg in RATES_WARPGROUPS}


RATES_CHAIN_N = (64, 128)  # the backward's GEMM widths: S^T, dP^T and dQ at Br = 64, dV and dK at d = 64 and 128
RATES_CHAIN_WARPGROUPS = (1, 2)  # one warpgroup alone, and the backward's two consumer warpgroups


def rates_wgmma_chain_names() -> dict[tuple[int, str, int], str]:
    """{(N, dtype, warpgroups): name expression} of the wgmma round-trip kernels (sm_90a), 16-bit types."""
    return {(n, dt, wg): f"rates_wgmma_chain<{n}, {t}, {wg}>"
            for n in RATES_CHAIN_N for dt, t in CUDA_TYPES.items() for wg in RATES_CHAIN_WARPGROUPS}


@dataclass(frozen=True)
class RatesSource:
    """kernels/rates.cu as one module; ``wgmma``: the sm_90a build that adds the wgmma kernels."""

    wgmma: bool = False
    source: str = RATES_SOURCE

    @property
    def name_expressions(self) -> list[str]:
        hopper = (*rates_wgmma_names().values(), *rates_wgmma_chain_names().values()) if self.wgmma else ()
        return [*rates_mma_names().values(), *hopper]

    @property
    def name_expression(self) -> str:  # what the compile check prints
        return RATES_SOURCE + (" (wgmma)" if self.wgmma else "")

    @property
    def explicit_instantiation(self) -> str:
        sig = {"rates_mma<": "int, int, float*, unsigned long long*", "rates_mma_latency<": "int, float*, long long*",
               "rates_wgmma<": "int, int, float*, unsigned long long*",
               "rates_wgmma_chain<": "int, int, float*, long long*"}
        return "\n".join(f"template __global__ void {e}({sig[e[: e.index('<') + 1]]});" for e in self.name_expressions)

    @property
    def nvrtc_extra(self) -> tuple[str, ...]:
        return (f"-arch=sm_{FLASH3_ARCH}", RATES_WGMMA_DEFINE) if self.wgmma else ()
