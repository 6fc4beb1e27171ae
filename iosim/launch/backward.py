"""Launch geometry of the backward pass's kernels (kernels/flash_bwd.cu, kernels/flash3_bwd.cu), as plain data:
tiles, threads, shared memory term by term, registers, grid order (:mod:`iosim.launch.forward` holds the forward's,
:mod:`iosim.launch.model` the residency rule both use). Names follow the math: ``block_q`` = Br, ``block_kv`` = Bc, ``head_dim`` = d.
"""

from __future__ import annotations

from ..problem import AttentionProblem
from ..schedules import Tiles
from .model import KernelLaunchModel, LaunchError, LaunchModel, registers_of


def backward_launch_model(schedule: str, problem: AttentionProblem, tiles: Tiles, *, variant: str = "iosim",
                          registers: int | list[int] | None = None) -> LaunchModel:
    """The backward's kernels as launched: flash2's (``variant`` "iosim", ours, or "fa2": :func:`flash_bwd_launch`)
    or flash3's (:func:`flash3_bwd_launch`)."""
    if schedule == "flash3":
        return flash3_bwd_launch(problem, tiles, registers)
    if schedule != "flash2":
        raise LaunchError(f"no backward launch geometry known for schedule {schedule!r}")
    return flash_bwd_launch(problem, tiles, variant, registers)


# ------------------------------------------------------------------------------------------------------------------
# FlashAttention-2 backward (kernels/flash_bwd.cu): mirrors BwdLayout and the kernels' shared-memory carve-up.

FLASH_BWD_WARPS = 8  # flash_bwd_kernel: 8 warps, each a 32-row warp tile of every GEMM (BwdLayout in the kernel)
FLASH_BWD_THREADS = 32 * FLASH_BWD_WARPS
FLASH_BWD_DQ_THREADS = 128  # flash_bwd_dq_kernel (deterministic mode): 4 warps of 16 query rows
FLASH_BWD_ROW_THREADS = 256  # preprocess and convert kernels: threads per block
# (block_q, block_kv) of flash_bwd_kernel per head dim, from tile sweeps on the H100 at N = 8192 (docs/kernels.md):
# Bc = 128 halves the Q_i, dO_i reloads and dQ reductions of Bc = 64 (d = 128: 0.86x torch's FA2 backward against
# 0.60-0.69x); Br = 128 halves the blocks' iterations where its accumulators fit (d = 64: 0.85-0.88x against
# 0.78-0.81x; at d = 128 it needs Bc = 64: 0.72-0.74x). No spills at d <= 128 (ptxas, nvcc 13.0, sm_80 and sm_90);
# d = 256 at 64 x 64 spills 32-40 B (stated, measured)
FLASH_BWD_TILES: dict[int, tuple[int, int]] = {32: (128, 128), 64: (128, 128), 128: (64, 128), 256: (64, 64)}
# Bc of flash_bwd_dq_kernel (Br = 64): its dQ accumulator stays in registers beside S and dP
FLASH_BWD_DQ_BLOCK_KV: dict[int, int] = {32: 64, 64: 64, 128: 32, 256: 32}


def flash_bwd_smem_terms(head_dim: int, block_q: int, block_kv: int, itemsize: int = 2) -> dict[str, int]:
    """Dynamic shared memory of one flash_bwd_kernel thread block, term by term, in bytes."""
    d, Br, Bc = head_dim, block_q, block_kv
    return {
        "K_j": Bc * d * itemsize,  # Alg. 2 line 6, resident for the whole loop
        "V_j": Bc * d * itemsize,
        "Q_i": 2 * Br * d * itemsize,  # line 9, two buffers: block i+1 loads while block i is used
        "dO_i": 2 * Br * d * itemsize,
        "P^T": Bc * Br * itemsize,  # line 11, the A operand of dV += P^T dO
        "dS^T": Bc * Br * itemsize,  # line 14, the A operand of dK += dS^T Q and (transposed) of dQ += dS K
        "L_i, D_i": 2 * 2 * Br * 4,  # fp32 statistics, two buffers
    }


def flash_bwd_smem_bytes(head_dim: int, block_q: int, block_kv: int, itemsize: int = 2) -> int:
    return sum(flash_bwd_smem_terms(head_dim, block_q, block_kv, itemsize).values())


def flash_bwd_dq_smem_bytes(head_dim: int, block_kv: int, itemsize: int = 2) -> int:
    """flash_bwd_dq_kernel: Q_i and dO_i (64 x d), and two buffers each of K_j and V_j (Bc x d)."""
    return (2 * 64 + 4 * block_kv) * head_dim * itemsize


# registers per thread of the backward's row kernels (preprocess, dQ conversion, group sum): not measured; at most
# 32 so that registers never limit their residency below the threads' (2048 a SM), which they do not in the kernels
# (a few fp32 values a thread)
FLASH_BWD_ROW_REGISTERS = 32
# the main kernel's registers where none are given: the cap of __launch_bounds__(256, 1) (ours; FA2's 8-warp traits
# likewise), one block an SM; shared memory (over 160 KB at the tiles of FLASH_BWD_TILES) allows one block anyway
FLASH_BWD_REGISTERS = 255


def flash_bwd_launch(problem: AttentionProblem, tiles: Tiles, variant: str = "iosim",
                     registers: int | list[int] | None = None) -> LaunchModel:
    """flash2's backward kernels as launched, each a program block of the L2 model (:mod:`iosim.l2.backward`):
    the preprocess and the dQ conversion one block of ``block_q`` rows (iosim's: d / 8 threads a row, 8 elements a
    thread; FA2's: 256 threads), the main kernel one block per K/V block. ``variant="iosim"`` (gqa="grouped",
    kernels/flash_bwd.cu): main grid (Tc, kv heads, batch), each block's Q blocks first to last. ``"fa2"``
    (gqa="expand", FlashAttention-2's flash_bwd_launch_template.h): grids (blocks, batch, heads), each block's Q
    blocks last to first; a group sum of dK, dV after it where heads are grouped (torch sums the copies)."""
    d, e, Br, Bc = problem.head_dim, problem.elem_bytes, tiles.block_q, tiles.block_kv
    main_smem = flash_bwd_smem_bytes(d, Br, Bc, e)  # FA2's carve-up differs in detail, not in its one block a SM
    row_threads = max(32, Br * d // 8) if variant == "iosim" else FLASH_BWD_ROW_THREADS
    threads = [row_threads, FLASH_BWD_THREADS, row_threads]
    smem = [0, main_smem, 0]
    regs = [FLASH_BWD_ROW_REGISTERS, FLASH_BWD_REGISTERS, FLASH_BWD_ROW_REGISTERS]
    if variant == "fa2" and problem.group > 1:  # torch's sum of the expanded dK, dV over the group
        threads.append(FLASH_BWD_ROW_THREADS)
        smem.append(0)
        regs.append(FLASH_BWD_ROW_REGISTERS)
    kernels = tuple(KernelLaunchModel(threads[i], smem[i], registers_of(registers, i, regs[i]))
                    for i in range(len(threads)))
    if variant == "iosim":
        return LaunchModel(kernels, note="iosim flash2 backward: preprocess and dQ conversion over rows, main grid "
                                         "(Tc, kv heads, batch), Q blocks first to last")
    if variant != "fa2":
        raise LaunchError(f"variant={variant!r}: expected 'iosim' or 'fa2'")
    return LaunchModel(kernels, head_order="head_major", kv_order="reverse",
                       note="FA2 backward: grids (blocks, batch, heads), Q blocks visited last to first")


# ------------------------------------------------------------------------------------------------------------------
# FlashAttention-3-design backward (kernels/flash3_bwd.cu): sm_90a only; mirrors the constexprs at its top.

FLASH3_BWD_THREADS = 384  # warpgroup 0: producer warp (TMA) + 3 dQ writer warps (bulk reduce-add); 1, 2: consumers
FLASH3_BWD_REGISTERS = {"producer": 24, "consumer": 240}  # setmaxnreg: 128 x 24 + 256 x 240 = 64,512
# (block_q, block_kv) per head dim: block_kv = 2 consumer warpgroups x 64 keys (wgmma's M); block_q = wgmma's N of
# S^T, dP^T (FlashAttention-3's hopper/ tiles: 128 x 128 at d = 64, 64 x 128 at d = 128; at block_q = 128 each
# warpgroup computes 64 rows of dQ_i, else half its columns). d = 256 is not offered: dK + dV accumulators of 64 keys
# x 256 are 256 fp32 registers a consumer thread
FLASH3_BWD_TILES: dict[int, tuple[int, int]] = {64: (128, 128), 128: (64, 128)}
FLASH3_BWD_DQ_PAD = 8  # fp32 padding of a dQ staging row (bank conflicts of the accumulator stores)


def flash3_bwd_smem_terms(head_dim: int, block_q: int, block_kv: int, itemsize: int = 2) -> dict[str, int]:
    """Dynamic shared memory of one flash3_bwd_kernel thread block, term by term, in bytes."""
    d, Br, Bc = head_dim, block_q, block_kv
    return {
        "K_j, V_j": 2 * Bc * d * itemsize,  # resident for the whole loop, 128B-swizzled panels
        "Q_i, dO_i": 2 * 2 * Br * d * itemsize,  # a 2-stage TMA ring each
        "dS^T": 2 * Bc * Br * itemsize,  # two buffers: the A operand of dQ = dS K
        "dQ staging": Br * (d + FLASH3_BWD_DQ_PAD) * 4,  # fp32, the source of the bulk reduce-adds
        "L_i, Delta_i": 2 * 2 * Br * 4,  # fp32, two stages
        "barriers": 128,
        "align": 1024,
    }


def flash3_bwd_smem_bytes(head_dim: int, block_q: int, block_kv: int, itemsize: int = 2) -> int:
    return sum(flash3_bwd_smem_terms(head_dim, block_q, block_kv, itemsize).values())


def flash3_bwd_launch(problem: AttentionProblem, tiles: Tiles, registers: int | list[int] | None = None) -> LaunchModel:
    """kernels/flash3_bwd.cu's launch: flash2's preprocess and dQ conversion (iosim's rows), then the main kernel of
    384 threads, each block's Q blocks first to last; 168 registers a thread (setmaxnreg 24 / 240 over its three
    warpgroups), one block an SM by its shared memory. Its 1-D grid runs a head's K/V blocks in turn (iosim's flash2
    order, as modeled); causal grids run the longest K/V blocks first in sections of heads, which this launch does not
    describe (the L2 model walks them in head order)."""
    iosim = flash_bwd_launch(problem, tiles, "iosim", registers)
    per_thread = (FLASH3_BWD_REGISTERS["producer"] + 2 * FLASH3_BWD_REGISTERS["consumer"]) // 3
    main = KernelLaunchModel(FLASH3_BWD_THREADS, flash3_bwd_smem_bytes(problem.head_dim, tiles.block_q,
                                                                        tiles.block_kv, problem.elem_bytes),
                             registers_of(registers, 1, per_thread))
    kernels = (iosim.kernels[0], main, iosim.kernels[2])
    return LaunchModel(kernels, note="iosim flash3 backward: preprocess and dQ conversion over rows, main grid "
                                     "of 384 threads a head's K/V blocks in turn (causal: modeled in head order), Q "
                                     "blocks first to last")
