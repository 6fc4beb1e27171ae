"""Host side of the FlashAttention-3-design backward (kernels/flash3_bwd.cu, sm_90a only): the main kernel's TMA maps,
tiles, shared memory and launch arguments. :mod:`iosim.gpu.backward` launches it between flash_bwd.cu's preprocess
kernel (Delta = rowsum(dO o O), fp32 dQ accumulator cleared) and its dQ conversion (or, ``deterministic=True``, its
Q-outer dQ kernel: the main kernel then adds nothing into dQ, so no order-dependent additions remain).

One thread block per (K/V block of Bc = 128 keys, kv head, batch): a producer warp loads K_j, V_j once and Q_i, dO_i
per visit by TMA; three more warps add each visit's fp32 dQ_i partial into the accumulator with TMA bulk
reduce-adds; two consumer warpgroups run the wgmma GEMMs. Counted by ``simulate("flash3", p, pass_="backward")``.
"""

from __future__ import annotations

from typing import Any

from iosim import launch
from iosim.gpu import build, flash3_host
from iosim.gpu.inputs import AttentionInputError, SharedMemoryError

_LOG2E = 1.4426950408889634


def check_head_dim(head_dim: int) -> tuple[int, int]:
    """(block_q, block_kv) of the flash3 backward at ``head_dim``, or a clear error where no tile fits."""
    if head_dim not in launch.FLASH3_BWD_TILES:
        raise AttentionInputError(
            f"schedule='flash3' backward: head_dim={head_dim} is not supported (supported: "
            f"{list(launch.FLASH3_BWD_TILES)}). Each consumer warpgroup keeps dK and dV of its 64 keys in fp32 "
            f"registers: 2 x 64 x {head_dim} / 128 threads = {2 * 64 * head_dim // 128} registers a thread, beside "
            "S^T, dP^T and dQ, against wgmma's 255-register limit (setmaxnreg 240); use schedule='flash2'")
    return launch.FLASH3_BWD_TILES[head_dim]


def main_kernel(c: Any, do: Any, lse: Any, delta: Any, acc: Any, dk: Any, dv: Any, limit: int):
    """(instance, grid, block, shared memory, arguments, tiles) of flash3_bwd_kernel for the checked call ``c``;
    ``acc`` None: deterministic mode (no dQ GEMM, no reduce-adds)."""
    cp, i32 = c.cp, c.cp.int32
    flash3_host.require_hopper(cp)
    B, N, H, D = (int(s) for s in c.q.shape)
    Nk, Hk = int(c.k.shape[1]), int(c.k.shape[2])
    Br, Bc = check_head_dim(D)
    smem = launch.flash3_bwd_smem_bytes(D, Br, Bc, build.ITEMSIZE[c.dtype])
    if smem > limit:
        raise SharedMemoryError(f"flash3 backward at head_dim={D}: needs {smem} B of shared memory per block "
                                f"({launch.flash3_bwd_smem_terms(D, Br, Bc)}); this device allows {limit} B")
    maps = (flash3_host.tensor_map("q", c.q.data.ptr, c.dtype, B, N, H, D, Br),
            flash3_host.tensor_map("k", c.k.data.ptr, c.dtype, B, Nk, Hk, D, Bc),
            flash3_host.tensor_map("v", c.v.data.ptr, c.dtype, B, Nk, Hk, D, Bc),
            flash3_host.tensor_map("do", do.data.ptr, c.dtype, B, N, H, D, Br))
    inst = build.Flash3BwdInstance(D, Br, c.dtype, c.causal)
    args = (*maps, lse, delta, acc if acc is not None else cp.uint64(0), dk, dv, i32(N), i32(Nk), i32(H), i32(Hk),
            cp.float32(c.scale), cp.float32(c.scale * _LOG2E))
    grid = (-(-Nk // Bc) * Hk * B, 1, 1)  # 1-D: the kernel orders the blocks (causal: longest first)
    return inst, grid, (launch.FLASH3_BWD_THREADS, 1, 1), smem, args, {"block_q": Br, "block_kv": Bc}
