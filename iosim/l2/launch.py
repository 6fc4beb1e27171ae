"""Launch geometry: the grid order and the thread blocks resident at once (what iosim/gpu launches).

Part of the L2 model; the model as a whole is described in :mod:`iosim.l2`.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..blocks import cdiv
from ..problem import AttentionProblem
from ..profile import Profile
from ..schedules import Tiles, get_schedule
from ._common import L2ModelError

# registers per thread of iosim's flash2 kernel (launch__registers_per_thread, ncu on the H200, kernel v3)
FLASH2_REGISTERS = {
    (128, 128, 32): 255,
    (128, 64, 64): 249,
    (64, 128, 64): 238,
}  # v3, read by ncu on the H200
FLASH2_REGISTERS_DEFAULT = 255  # unknown instantiation: assume the register cap of __launch_bounds__(128)


@dataclass(frozen=True)
class KernelLaunchModel:
    """How one kernel of a schedule is launched, per head: threads, shared memory, registers, block order.

    ``block_order``: permutation of the head's program blocks in ``blockIdx.x`` order (None = program order).
    ``gpu_blocks_per_block``: thread blocks the GPU launches for one program block; residency is divided by it.
    1 for every kernel iosim launches today (naive pv split O's columns over ``ceil(d/64)`` blocks before naive.cu
    v1.2).
    """

    threads: int
    smem: int
    registers: int
    block_order: str = "forward"  # or "reverse"
    gpu_blocks_per_block: int = 1


@dataclass(frozen=True)
class LaunchModel:
    kernels: tuple[KernelLaunchModel, ...]
    head_order: str = (
        "batch_major"  # grid (.., heads, batch): heads fastest; "head_major": grid (.., batch, heads)
    )
    kv_order: str = "forward"
    note: str = ""


def launch_model(
    schedule: str,
    problem: AttentionProblem,
    tiles: Tiles,
    *,
    variant: str = "iosim",
    registers: int | list[int] | None = None,
) -> LaunchModel:
    """The launch of ``schedule`` as iosim's kernels do it (``variant="iosim"``, read from iosim/gpu), or as
    FlashAttention-2 (``variant="fa2"``: grid (num_m_blocks, batch, heads), K/V loop in reverse, m blocks forward)."""
    d, e = problem.head_dim, problem.elem_bytes
    if schedule == "flash2":
        Br, Bc = tiles.block_q, tiles.block_kv
        if variant == "fa2":
            smem = Br * d * e + 2 * Bc * d * e  # Flash_fwd_kernel_traits: sQ + sK + sV (one stage each)
            regs = (registers[0] if isinstance(registers, (list, tuple)) else registers) or 255
            return LaunchModel(
                (KernelLaunchModel(128, smem, regs),),
                head_order="head_major",
                kv_order="reverse",
                note="FA2: grid (m blocks, batch, heads), K/V blocks visited last to first",
            )
        # iosim/gpu/attention.py: grid (Tr, H, B), 128 threads, smem from iosim/gpu/build.py (Q + the K/V stages);
        # kernels/flash_fwd.cu: causal launches Q tiles last-first (m_block = Tr - 1 - blockIdx.x)
        try:
            from ..gpu import build  # no CuPy needed

            smem = build.flash_smem_bytes(d, Br, Bc, e)
        except Exception:  # pragma: no cover - a head dim the GPU library does not build
            smem = Br * d * e + 2 * 2 * Bc * d * e
        regs = (registers[0] if isinstance(registers, (list, tuple)) else registers) or FLASH2_REGISTERS.get(
            (d, Br, Bc), FLASH2_REGISTERS_DEFAULT
        )
        return LaunchModel(
            (KernelLaunchModel(128, smem, regs, "reverse" if problem.causal else "forward"),),
            note="iosim flash2: grid (Tr, heads, batch); causal Q tiles launched last-first",
        )
    if schedule == "naive":
        # iosim/gpu/build.py NAIVE_TILES: qk grid (Tc, Tr, B*H) 256 threads; softmax one row per block;
        # pv grid (1, Tr, B*H): one GPU block per program block (64 query rows x all d, naive.cu v1.2).
        # Static smem: qk 2 x 16 x 68 fp32 (Q and K tiles); pv 16 x 68 (P) + 4 x 16 x 68 (V, four 64-column
        # chunks) fp32 = 21,760 B at every d. Registers: qk 80, softmax 31 (ptxas via ncu on the H200, v1.1);
        # pv 128 (ptxas, sm_90, compile_check on naive.cu v1.2; ncu on the H200 read the same).
        qk_smem = 2 * 16 * 68 * 4
        pv_smem = (16 * 68 + 4 * 16 * 68) * 4
        regs = (
            registers
            if isinstance(registers, (list, tuple))
            else [registers or 80, registers or 31, registers or 128]
        )
        return LaunchModel(
            (
                KernelLaunchModel(256, qk_smem, regs[0]),
                KernelLaunchModel(256, problem.kv_len * e, regs[1]),
                KernelLaunchModel(256, pv_smem, regs[2]),
            ),
            note="iosim naive: qk grid (Tc, Tr, B*H), softmax (B*H*N), pv (1, Tr, B*H)",
        )
    if schedule == "flash1":
        return LaunchModel(
            (KernelLaunchModel(128, get_schedule("flash1").shared_memory(problem, tiles), 255),),
            note="flash1: one block per head (no GPU kernel; geometry assumed)",
        )
    raise L2ModelError(f"no launch geometry known for schedule {schedule!r}")


def resident_blocks(
    profile: Profile, threads: int, smem: int, registers: int, *, smem_reserved: int = 1024
) -> tuple[int, dict]:
    """Thread blocks of one kernel resident at once on the whole GPU, and the per-SM limit of each resource.

    Registers are allocated per warp in units of 256 (CUDA occupancy calculator); the runtime reserves 1 KiB of
    shared memory per block (sm_80+)."""
    sms = int(profile.require("sm_count"))
    max_threads = profile.sm.max_threads.value if profile.sm else None
    max_blocks = profile.sm.max_blocks.value if profile.sm else None
    if max_threads is None or max_blocks is None:
        raise L2ModelError(
            f"profile {profile.name}: sm.max_threads and sm.max_blocks are needed for residency"
        )
    smem_sm = int(profile.require("smem.per_sm"))
    regs_sm = int(profile.require("registers.per_sm")) // 4
    warps = cdiv(threads, 32)
    regs_block = warps * cdiv(registers * 32, 256) * 256
    limits = {
        "blocks": max_blocks,
        "threads": max_threads // threads,
        "registers": regs_sm // regs_block if regs_block else max_blocks,
        "smem": smem_sm // (smem + smem_reserved),
    }
    per_sm = max(1, min(limits.values()))
    return per_sm * sms, limits
