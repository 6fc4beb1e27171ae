"""Time of MLA's attention as torch runs it (issue 28 item 3): decode's on its memory-efficient kernel at DeepSeek-V3's
widths, from the kernel's measured step (:mod:`iosim.schedules.mla_decode`); prefill's on cuDNN's fused forward, by
the fa3 model of the ``cudnn`` description (:mod:`iosim.schedules.mla_prefill`, :func:`prefill_attention_time`).

Torch's only fused kernel for keys of 576 and values of 512 is xFormers' CUTLASS kernel for sm_80
(``fmha_cutlassF_bf16_aligned_32x128_gmem_sm80``, :data:`REFERENCE`): a thread block of 4 warps takes 32 query rows
(here: heads of one sequence) and walks the keys in tiles of 128. At every tile it reads Q and the key tile from
global memory for Q K^T, the value tile for P V, and, its values being wider than one tile, it keeps its output
accumulator in global memory in fp32: read back at every tile after the first, written at every one before the last
(``MlaDecode(accumulator="global")``, :func:`reference`). Nsight Compute (H200, 2026-11-28) gives it 122 registers a
thread and 51,200 B of shared memory a block: 4 blocks an SM on an H100 or H200.

**Why a measured step.** Its step is not the sum of rates the FlashAttention models compose: at 4 warps a block the
SM's tensor pipe is 20-28% busy and its L2 traffic 29-76% of peak (Nsight Compute, H200), so latency and the SM's
share of L2 bound it, and how much of each a second block hides is the code's. A block-step per SM costs 11.9 us
alone and 8.7-9.1 us once two or more share the SM (measured, H200). So the step is measured where the kernel runs,
as the other kernels' (``calibration.forward.resident_step.torch-mla.d576x512_32x128.<k>``: k blocks on every SM,
each sequence its own cache, :mod:`iosim.calibrate.mla_step`), and the call's fixed part beside it
(``call_fixed.torch-mla.d576x512_32x128.1``).

**The call.** The grid is a block per 32 rows of each sequence, every block walking ceil(N / 128) tiles; the blocks
are dealt over the SMs' slots (:func:`iosim.blocks.tail_makespan`: whole waves, then the last wave's blocks at the
step of as many an SM as it leaves), plus the fixed part; never under the compulsory DRAM bytes
(:func:`iosim.schedules.mla_decode.dram`) at the measured read rate. Past one wave the hardware deals the later
blocks to whichever SMs free a slot first, unevenly (Nsight Compute: 660 blocks land 4-7 an SM on an H200), which
the wave count does not see: such grids are predicted 6-14% fast or up to 13% slow (docs/serving.md).

**Prefill.** Keys of 192 values and values of 128 are not a shape torch's flash backend takes; its cuDNN backend
runs them with an FA3-class kernel (:data:`PREFILL_REFERENCE`: wgmma, 64-row warpgroups, 128-key tiles, as at
d = 128). Its time is the ``cudnn`` description's model (:mod:`iosim.timing.fa3`: the composed step, the grid's
order, the call's fixed part, the power limiter over a record's run), with Q K^T, P V, the loads of K and V and the
store of O each at its own width (``Workload.value_dim``). Nothing in it is measured on MLA's shapes: the rates and
the one fitted constant are those every cuDNN row of the time records is predicted with.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

from ..blocks import cdiv, tail_makespan
from ..counts import Counts
from ..hardware.gpu import Profile
from ..launch import resident_blocks
from ..problem import AttentionProblem, InputWarning
from ..schedules import mla_prefill
from ..schedules.base import Tiles
from ..schedules.mla_decode import VALUE, MlaDecode, dram
from .estimate import KernelTime, TimeEstimate, Workload
from .fa2 import forward_tables
from .rates import rates

KERNEL = "torch-mla"  # the calibration's name for it (calibration.forward.<part>.torch-mla)


@dataclass(frozen=True)
class Reference:
    """The kernel torch runs for MLA decode's attention: its tiles, warps and resources."""

    name: str = "fmha_cutlassF_bf16_aligned_32x128_gmem_sm80"
    block_q: int = 32
    block_kv: int = 128
    warps: int = 4
    registers: int = 122
    smem: int = 51_200
    source: str = ("torch 2.11 aten/src/ATen/native/transformers/cuda/mem_eff_attention/kernel_forward.h "
                   "(kQueriesPerBlock 32, kKeysPerBlock 128, kMaxK 65536: kKeepOutputInRF false, the fp32 output "
                   "accumulator in global memory); registers and dynamic shared memory per block from Nsight Compute "
                   "(launch__registers_per_thread, launch__shared_mem_per_block_dynamic), H200, 2026-11-28")


REFERENCE = Reference()


class MlaTimeError(ValueError):
    """A decode step the reference kernel's model does not describe."""


def reference(batch: int, kv_len: int, q_len: int = 1) -> MlaDecode:
    """The decode step as torch's kernel runs it: 32-row blocks, 128-key tiles, the accumulator in global memory."""
    return MlaDecode(batch=batch, kv_len=kv_len, q_len=q_len, block_q=REFERENCE.block_q,
                     block_kv=REFERENCE.block_kv, accumulator="global")


def step_key(m: MlaDecode) -> str:
    """The calibration's key for the kernel at ``m``'s widths and tiles: ``d576x512_32x128``."""
    return f"d{m.key_dim}x{m.latent}_{m.block_q}x{m.block_kv}"


def residency(profile: Profile) -> int:
    """The reference kernel's thread blocks resident per SM on ``profile``."""
    total, _ = resident_blocks(profile, REFERENCE.warps * 32, REFERENCE.smem, REFERENCE.registers)
    return max(1, total // int(profile.require("sm_count")))


def measured(profile: Profile, m: MlaDecode) -> tuple[dict[int, float], float] | None:
    """(step by blocks an SM, the call's fixed part) of the reference kernel at ``m``'s key, or None where the
    profile has not measured them."""
    step = forward_tables(profile, "resident_step", KERNEL).get(step_key(m))
    fixed = forward_tables(profile, "call_fixed", KERNEL).get(step_key(m))
    if step is None or fixed is None or 1 not in fixed.value:
        return None
    return {int(k): float(v) for k, v in step.value.items()}, float(fixed.value[1])


def attention_time(m: MlaDecode, profile: Profile) -> KernelTime | None:
    """The reference kernel's time on the decode step ``m`` (:func:`reference`; bf16), or None where ``profile``
    has not measured its step."""
    if (m.accumulator, m.block_q, m.block_kv, m.dtype) != ("global", REFERENCE.block_q, REFERENCE.block_kv, "bf16"):
        raise MlaTimeError(f"the reference kernel's model describes bf16 steps with the accumulator in global memory "
                           f"and {REFERENCE.block_q} x {REFERENCE.block_kv} tiles (iosim.timing.mla.reference); got "
                           f"accumulator={m.accumulator!r}, {m.block_q} x {m.block_kv}, {m.dtype}")
    got = measured(profile, m)
    if got is None:
        return None
    steps, fixed = got
    per_sm = min(residency(profile), max(steps))
    if any(j not in steps for j in range(1, per_sm + 1)):
        return None
    sms = int(profile.require("sm_count"))
    blocks, tiles = m.batch * cdiv(m.rows, m.block_q), cdiv(m.kv_len, m.block_kv)
    speedup = {j: steps[per_sm] / steps[j] for j in range(1, per_sm + 1)}
    run = tail_makespan([tiles * steps[per_sm]] * blocks, sms, per_sm, speedup)
    read, write = dram(m)[1]
    floor = rates(profile, m.dtype).dram_s(read, write)
    parts = {"steps": run, "call_fixed": fixed, "dram": floor, "utilization": min(1.0, blocks / (sms * per_sm))}
    seconds = max(run + fixed, floor)
    parts["bound"] = "dram" if floor > run + fixed else "step"
    return KernelTime.of(REFERENCE.name, blocks, seconds, parts)


@dataclass(frozen=True)
class PrefillReference:
    """The kernel torch runs for MLA prefill's attention (keys of 192, values of 128) and the description that
    times it."""

    name: str = "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x192"
    kernel: str = "cudnn"
    block_q: int = 128
    block_kv: int = 128
    source: str = ("torch 2.11 scaled_dot_product_attention, cuDNN backend (cuDNN 9.19), H200, 2026-11-28: the only "
                   "fused backend that takes keys of 192 and values of 128 (flash refuses them; memory-efficient runs "
                   "fmha_cutlassF_bf16_aligned_32x128_gmem_sm80, 4x slower); its name's 64x128x192 is a "
                   "warpgroup's 64 rows, 128-key tiles and the keys' width, two consumer warpgroups a Q tile as at "
                   "d = 128 (iosim/timing/kernels/cudnn.yaml)")


PREFILL_REFERENCE = PrefillReference()


def prefill_reference(batch: int, seq_len: int, kv_len: int | None = None) -> mla_prefill.MlaPrefill:
    """MLA prefill as torch runs it: one GEMM then a copy expand K and V (``expansion="gemm+cat"``), cuDNN's tiles."""
    return mla_prefill.MlaPrefill(batch=batch, seq_len=seq_len, kv_len=seq_len if kv_len is None else kv_len,
                                  block_q=PREFILL_REFERENCE.block_q, block_kv=PREFILL_REFERENCE.block_kv,
                                  expansion="gemm+cat")


def prefill_attention_time(m: mla_prefill.MlaPrefill, profile: Profile, run: str | float = "record"
                           ) -> TimeEstimate:
    """The attention kernel of ``m`` (``mla_attention``) as :data:`PREFILL_REFERENCE`'s description times it: the
    fa3 model on heads of ``batch x heads``, keys of ``key_dim``, values of 128 (``run``: as
    :func:`iosim.timing.predict`'s)."""
    from . import predict  # the package's entry; this module is not imported by it

    if not profile.is_hopper():
        warnings.warn(InputWarning(
            f"MLA prefill's time model is cuDNN's Hopper kernel ({PREFILL_REFERENCE.kernel}, wgmma: sm_90), and "
            f"{profile.display_name} is not a Hopper GPU: its time is a what-if (the counts hold); use an H100/H200 "
            "profile"), stacklevel=2)
    if (m.block_q, m.block_kv) != (PREFILL_REFERENCE.block_q, PREFILL_REFERENCE.block_kv):
        raise MlaTimeError(f"the prefill model describes {PREFILL_REFERENCE.kernel}'s {PREFILL_REFERENCE.block_q} x "
                           f"{PREFILL_REFERENCE.block_kv} tiles (iosim.timing.mla.prefill_reference); got "
                           f"{m.block_q} x {m.block_kv}")
    problem = AttentionProblem(batch=m.batch, heads=m.heads, seq_len=m.seq_len, kv_len=m.kv_len,
                               head_dim=m.key_dim, dtype=m.dtype, causal=m.causal)
    attention = mla_prefill.counts(m).kernels[-1]
    work = Workload("flash3", "forward", problem, Tiles(m.block_q, m.block_kv), Counts([attention]),
                    [mla_prefill.dram(m)[-1]], value_dim=VALUE)
    return predict(work, profile, PREFILL_REFERENCE.kernel, run=run)
