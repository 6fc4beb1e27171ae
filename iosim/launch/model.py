"""What a launch is, as plain data (threads, shared memory, registers, block and head order per kernel), and how
many of a kernel's thread blocks a GPU holds at once (residency). The kernels' own numbers are in
:mod:`iosim.launch.forward` and :mod:`iosim.launch.backward`.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..blocks import cdiv
from ..hardware.gpu import Profile


class LaunchError(ValueError):
    """No launch geometry is known for a schedule, or a profile lacks what residency needs."""


@dataclass(frozen=True)
class KernelLaunchModel:
    """How one kernel of a schedule is launched, per head: threads, shared memory, registers, block order.

    ``block_order``: the head's program blocks in ``blockIdx.x`` order, "forward" or "reverse".
    """

    threads: int
    smem: int
    registers: int
    block_order: str = "forward"


@dataclass(frozen=True)
class LaunchModel:
    kernels: tuple[KernelLaunchModel, ...]
    head_order: str = "batch_major"  # grid (.., heads, batch): heads fastest; "head_major": grid (.., batch, heads)
    kv_order: str = "forward"
    note: str = ""


def registers_of(registers: int | list[int] | None, i: int, default: int) -> int:
    if isinstance(registers, (list, tuple)):
        return registers[i]
    return registers or default


def resident_blocks(profile: Profile, threads: int, smem: int, registers: int, *,
                    smem_reserved: int = 1024) -> tuple[int, dict]:
    """Thread blocks of one kernel resident at once on the whole GPU, and the per-SM limit of each resource.

    Registers are allocated per warp in units of 256 (CUDA occupancy calculator); the runtime reserves 1 KiB of
    shared memory per block (sm_80+)."""
    sms = int(profile.require("sm_count"))
    max_threads = profile.sm.max_threads.value if profile.sm else None
    max_blocks = profile.sm.max_blocks.value if profile.sm else None
    if max_threads is None or max_blocks is None:
        raise LaunchError(f"profile {profile.name}: sm.max_threads and sm.max_blocks are needed for residency")
    smem_sm = int(profile.require("smem.per_sm"))
    regs_sm = int(profile.require("registers.per_sm")) // 4
    regs_block = cdiv(threads, 32) * cdiv(registers * 32, 256) * 256
    limits = {
        "blocks": max_blocks,
        "threads": max_threads // threads,
        "registers": regs_sm // regs_block if regs_block else max_blocks,
        "smem": smem_sm // (smem + smem_reserved),
    }
    return max(1, min(limits.values())) * sms, limits
