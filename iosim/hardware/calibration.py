"""The optional ``calibration`` section of a GPU profile: rates and latencies code reaches on one GPU (mma.sync,
wgmma, exp, fp32, shared memory, L2, DRAM, launch costs, memory latency, the SM clock under load) and where they
were measured, as ``iosim calibrate rates`` writes them (docs/profiles.md). Every number is a sourced value.
"""

from __future__ import annotations

import datetime
from typing import Annotated

from pydantic import Field

from .sourced import (
    SourcedBandwidth,
    SourcedCycles,
    SourcedFlops,
    SourcedFlopsTable,
    SourcedHz,
    SourcedHzTable,
    SourcedOps,
    SourcedSeconds,
    SourcedSecondsTable,
    _Strict,
)


class MmaSync(_Strict):
    """mma.sync m16n8k16, fp32 accumulate, one dtype."""

    throughput: SourcedFlopsTable = Field(description="by resident warps per SM (one block per SM), each warp "
                                          "issuing 8 independent accumulators")
    latency: SourcedCycles = Field(description="one mma in a dependent chain (one warp)")


class MmaSyncRates(_Strict):
    fp16: MmaSync
    bf16: MmaSync


class WgmmaRates(_Strict):
    """wgmma m64nNk16 (fp8: m64nNk32), A and B from shared memory, fp32 accumulate, by warpgroups per SM (one block
    per SM)."""

    n128: SourcedFlopsTable
    n256: SourcedFlopsTable
    wait: SourcedCycles | None = Field(None, description="the fixed cost of committing a chain of wgmma and waiting "
                                       "for its result (two warpgroups, the intercept over chain length); null: not "
                                       "measured (a profile calibrated before the probe), and fp8's is not")


class Wgmma(_Strict):
    fp16: WgmmaRates
    bf16: WgmmaRates
    fp8: WgmmaRates | None = Field(default=None, description="e4m3 x e4m3 (m64nNk32); null: not measured (a profile "
                                   "calibrated before the fp8 probe)")


class ExpRates(_Strict):
    throughput: SourcedOps = Field(description="ex2.approx results per second over the chip (MUFU)")
    latency: SourcedCycles = Field(description="one ex2 in a dependent chain")


class Fp32Rates(_Strict):
    fma: SourcedFlops = Field(description="fp32 FMA, counted as 2 FLOPs")
    add: SourcedFlops = Field(description="fp32 add")
    max: SourcedOps = Field(description="fp32 max (FMNMX) results per second")


class SmemRates(_Strict):
    ldmatrix: SourcedBandwidth = Field(description="ldmatrix.x4 bytes per second over the chip")
    ld128: SourcedBandwidth = Field(description="128-bit ld.shared bytes per second over the chip")


class ReadWrite(_Strict):
    read: SourcedBandwidth
    write: SourcedBandwidth


class ReduceRates(_Strict):
    f32: SourcedBandwidth = Field(description="red.global.add.f32 (FlashAttention-2's atomicAdd): fp32 bytes added "
                                  "per second")
    f32x2: SourcedBandwidth = Field(description="red.global.add.v2.f32 (kernels/flash_bwd.cu): fp32 bytes added per "
                                    "second")


class L2Rates(ReadWrite):
    reduce: ReduceRates | None = Field(default=None, description="fp32 reductions into L2 (the backward's dQ "
                                       "accumulator); absent in files calibrated before it was measured")


class DramRates(ReadWrite):
    read_write: SourcedBandwidth = Field(description="bytes read + bytes written per second, copying one buffer "
                                         "to another")


class LaunchCosts(_Strict):
    interval: SourcedSeconds = Field(description="back-to-back empty kernels on one stream, queued ahead")
    host_interval: SourcedSeconds = Field(description="the same, launched one by one from Python (CuPy)")
    per_block: SourcedSeconds = Field(description="each further tiny thread block, per block per SM")
    call: SourcedSeconds | None = Field(None, description="one call as the time records time it: CUDA events "
                                        "around one launch of a one-wave kernel of one L2 load and one store per "
                                        "thread (optional: files calibrated before it lack it)")
    dependent: SourcedSeconds | None = Field(None, description="what a second such launch adds to the call")


class MemoryLatency(_Strict):
    """One load in a dependent chain (pointer chase, one thread, ld.global.cg): seconds, not SM cycles, since L2
    and DRAM run on clocks of their own; the cycles are in the source."""

    l2: SourcedSeconds = Field(description="a load that hits L2 (a 4 MiB buffer, warm)")
    dram: SourcedSeconds = Field(description="a load that misses L2 (random lines of a 1 GiB buffer, each once)")


def decode_keys(head_dim: int, stripes: int, fp8: bool) -> tuple[str, str]:
    """The keys of an instantiation in ``decode.tile`` and ``decode.fixed`` (``fixed_dram``): the cache's element
    ('16bit', 'fp8') and 'd128x2' (head dim 128, two 16-row stripes a block)."""
    return "fp8" if fp8 else "16bit", f"d{head_dim}x{stripes}"


class DecodeCalibration(_Strict):
    """iosim's Flash-Decoding kernels (kernels/flash_decode.cu) on this GPU: what their loops cost beyond any rate of
    the chip (iosim/calibrate/decode_tile.py)."""

    tile: dict[str, dict[str, SourcedSecondsTable]] = Field(
        description="seconds one warp spends on a tile of 16 keys with its ring full (the cache in L2), by blocks "
                    "resident on each SM (1, and 2 where two fit): by the cache's element ('16bit', 'fp8'), then "
                    "by instantiation ('d128x2': head dim 128, two 16-row stripes a block)")
    fixed: dict[str, dict[str, SourcedSecondsTable]] | None = Field(
        None, description="the same measurement's intercept: seconds of a call of one (two) blocks an SM beyond their "
                          "tiles (launch, the block's start, Q, the first tiles, the warps' merge, the stores), keyed "
                          "as tile; absent in files measured before it")
    fixed_dram: dict[str, dict[str, SourcedSecondsTable]] | None = Field(
        None, description="as fixed, with each sequence on pages of its own (the cache in DRAM, as calls run: a full "
                          "grid's first loads go to DRAM at once); where present the time model takes it for fixed; "
                          "absent in files measured before 2026-11-29")
    fixed_alone: dict[str, dict[str, SourcedSeconds]] | None = Field(
        None, description="as fixed, a grid of 4 blocks (each alone on its SM; since 2026-11-29 with the cache in "
                          "DRAM, as fixed_dram); absent in files measured before it")
    combine_round: SourcedSecondsTable | None = Field(
        None, description="seconds a round of the combine kernel's split loop takes (one L2 round trip for its "
                          "splits' partial rows), by head dim; absent in files measured before it")
    combine_fixed: SourcedSecondsTable | None = Field(
        None, description="the same measurement's intercept: seconds the combine adds to a decode call beyond its "
                          "rounds, after the split kernel (its launch, or on sm_90 its wait as the split kernel's "
                          "programmatic dependent; a block's start, the length load, the stores), by head dim; absent "
                          "in files measured before 2026-11-28")


class ForwardCalibration(_Strict):
    """iosim's forward kernels on this GPU: what a K/V step costs beyond any rate of the chip
    (iosim/calibrate/forward_step.py)."""

    step: dict[str, dict[str, SourcedSecondsTable]] = Field(
        default_factory=dict,
        description="seconds a thread block spends on one K/V step of its Q tile, by the kernel's timing "
                    "description ('iosim-flash3'; 'cudnn': cuDNN's fp8 forward through cudnn-frontend; Hopper "
                    "only), then its inputs' type ('bf16', 'fp8'; 'bf16-local': a window's Local instantiation, "
                    "every key inside the window; 'bf16-varlen': the Varlen instantiation, one packed sequence), "
                    "then head dim; measured on a Q tile an SM, the K/V in L2, no mask")
    tile_fixed: dict[str, dict[str, SourcedSecondsTable]] | None = Field(
        None, description="seconds a further Q tile of a block costs beyond its steps, keyed as step (no "
                          "'bf16-varlen': a long sequence's tiles are not short ones'); absent in files measured "
                          "before it")
    call_fixed: dict[str, dict[str, SourcedSecondsTable]] | None = Field(
        None, description="seconds a call costs beyond its tiles (launch, start, first loads, last stores), keyed as "
                          "step; 'fa2' / 'bf16-splitkv': torch's FlashAttention-2 split-KV path beyond its steps and "
                          "its combine's reads (iosim/calibrate/fa2_step.py); 'torch-mla' / 'd576x512_32x128' / 1: "
                          "torch's MLA decode attention (iosim/calibrate/mla_step.py); absent in files measured "
                          "before it")
    resident_step: dict[str, dict[str, SourcedSecondsTable]] | None = Field(
        None, description="seconds an SM spends on one K/V step of each of k resident thread blocks, by the kernel's "
                          "timing description ('iosim-flash2'; 'fa2': torch's FlashAttention-2 forward), then its "
                          "instantiation ('d64_128x64': head dim, Br x Bc; '-varlen', '-paged16', '-paged64' after "
                          "it: the packed-sequence and paged ones; '-splitkv': fa2's split-KV kernel), then k (1 to "
                          "the instantiation's residency); bf16, a Q tile on each block, all on one kv head (K/V in "
                          "L2), no mask; 'torch-mla' / 'd576x512_32x128': torch's MLA decode attention, each "
                          "sequence on a cache of its own (iosim/calibrate/mla_step.py); absent in files measured "
                          "before it")
    masked_step: dict[str, dict[str, SourcedSecondsTable]] | None = Field(
        None, description="seconds an SM spends beyond resident_step on a K/V step of each of its k blocks that the "
                          "kernel masks (the causal diagonal's tiles, by the description's masking: "
                          "iosim.timing.fa2.masked; 'fa2' from iosim/calibrate/fa2_step.py, 'iosim-flash2' from "
                          "iosim/calibrate/forward_step.py), keyed as resident_step (no paged keys); absent in files "
                          "measured before it")
    naive: dict[str, SourcedSecondsTable] | None = Field(
        None, description="the naive schedule's kernels (kernels/naive.cu), by part ('qk', 'qk_row', "
                          "'qk_masked': seconds a round of the scores kernel's resident tiles takes an SM, whole "
                          "tiles, one query row, causally masked; 'pv', 'pv_row', 'pv_masked': a 64-key step of a "
                          "round of P V's resident blocks; 'pv_block', 'pv_block_row': a round's cost beyond its "
                          "steps, at 128 rows and at one), then head dim; 'softmax_mb': seconds the softmax takes a "
                          "MB of S streamed from DRAM, by kv_len; bf16 (iosim/calibrate/naive_step.py); absent in "
                          "files measured before it")


class BackwardCalibration(_Strict):
    """Backward kernels on this GPU: what a step and a work tile cost beyond any rate of the chip
    (iosim/calibrate/backward_step.py)."""

    step: dict[str, SourcedSecondsTable] = Field(
        description="seconds a thread block spends on one step (one Q block against its K/V block), by the "
                    "kernel's timing description ('iosim-flash2-bwd', 'fa2-bwd', ...), then by head dim; measured "
                    "on a one-wave grid, bf16, no mask")
    tile_fixed: dict[str, SourcedSecondsTable] | None = Field(
        None, description="seconds a further work tile (K/V block) costs an SM beyond its steps (its start, K_j and "
                          "V_j, dK_j and dV_j written), keyed as step; measured as two tiles an SM against one; "
                          "absent in files measured before it")


class SourcedWatts(_Strict):
    value: float | None = Field(gt=0, description="watts")
    source: str = Field(min_length=1)


class SourcedJoules(_Strict):
    value: float | None = Field(gt=0, description="joules per unit of work (the field says which unit)")
    source: str = Field(min_length=1)


class SourcedWattsTable(_Strict):
    """Watts by a count of SMs."""

    value: dict[Annotated[int, Field(ge=1)], Annotated[float, Field(gt=0)]] = Field(min_length=1)
    source: str = Field(min_length=1)


class PowerLimiter(_Strict):
    """What the board's power limiter does to a run of tensor-core work from rest (iosim/calibrate/power.py): the
    clock before it acts, when it acts, and the clock and power random-operand tensor bursts on n SMs then hold
    (the SM's power against its clock, :mod:`iosim.timing.clock`)."""

    clock: SourcedHz = Field(description="SM clock of the burst on every SM before the limiter acts")
    engage: SourcedSeconds | None = Field(None, description="from the start of that burst until its clock falls "
                                          "(absent: the burst held its clock, the limit is above its power)")
    engage_bursts: SourcedSecondsTable | None = Field(None, description="each short burst's engage, by burst "
                                                      "(1, 2, ..): the spread engage is the median of; absent in "
                                                      "older files")
    clocks: SourcedHzTable = Field(description="the clock each burst holds after the fast loop acted, by SMs busy")
    watts: SourcedWattsTable = Field(description="board watts of each burst then (NVML energy counter), by SMs busy")
    settle: SourcedSeconds | None = Field(None, description="from the start of the burst on every SM until its "
                                          "clock falls again, the board's averaged power at its limit (absent: "
                                          "it never did)")
    steady: SourcedHz = Field(description="the clock the burst on every SM holds after that")
    steady_watts: SourcedWatts = Field(description="board watts of the burst on every SM then")


class PowerCalibration(_Strict):
    """Board power (NVML) and the energy of each unit of work beyond the base power (iosim/calibrate/power.py)."""

    limit: SourcedWatts = Field(description="the board's enforced power limit")
    idle: SourcedWatts = Field(description="no kernel running")
    base: SourcedWatts = Field(description="every SM spinning on a timer: what a kernel's duration costs")
    mma_sync: SourcedJoules = Field(description="per tensor-core FLOP of mma.sync (bf16)")
    wgmma: SourcedJoules | None = Field(None, description="per tensor-core FLOP of wgmma (bf16); Hopper only")
    wgmma_fp8: SourcedJoules | None = Field(None, description="per tensor-core FLOP of wgmma e4m3 (fp8); Hopper "
                                            "only, absent in older files")
    exp: SourcedJoules = Field(description="per ex2.approx")
    fp32: SourcedJoules = Field(description="per fp32 FLOP (an FMA is 2)")
    l2: SourcedJoules = Field(description="per byte of L2 traffic that hits")
    dram: SourcedJoules = Field(description="per byte of DRAM traffic, its passage through L2 included")
    smem: SourcedJoules | None = Field(None, description="per byte of ldmatrix traffic (shared memory to registers)")
    at: dict[str, SourcedHz] | None = Field(None, description="the SM clock each unit's burst ran at, by unit "
                                            "(mma_sync, wgmma, wgmma_fp8, exp, fp32, smem); absent in older files")
    limiter: PowerLimiter | None = Field(None, description="the power limiter's clocks; absent in older files")


class MeasuredOn(_Strict):
    device: str = Field(min_length=1)
    driver: str = Field(min_length=1)
    cuda: str = Field(min_length=1)
    date: datetime.date
    commit: str = Field(min_length=1)
    command: str = Field(min_length=1)


class Calibration(_Strict):
    """Rates code reaches on one GPU, chip-wide unless a field says: ``iosim calibrate rates`` measures them."""

    measured_on: MeasuredOn
    sm_clock: SourcedHz = Field(description="SM clock under load (clock64 over %globaltimer)")
    mma_sync: MmaSyncRates
    wgmma: Wgmma | None = Field(default=None, description="Hopper (sm_90a) only; null elsewhere")
    exp: ExpRates
    fp32: Fp32Rates
    smem: SmemRates
    l2: L2Rates
    dram: DramRates
    launch: LaunchCosts
    latency: MemoryLatency | None = Field(default=None, description="memory latency of one dependent load; absent "
                                          "in files calibrated before it was measured (iosim calibrate rates writes it)")
    decode: DecodeCalibration | None = Field(default=None, description="iosim's decode kernel's tile time; absent "
                                             "in files calibrated before it (the decode model then charges none)")
    forward: ForwardCalibration | None = Field(default=None, description="iosim's flash3 forward's step times; "
                                               "absent in files calibrated before it and GPUs before Hopper (the fa3 "
                                               "model then composes the step from the rates)")
    backward: BackwardCalibration | None = Field(default=None, description="the backward kernels' step times; "
                                                 "absent in files calibrated before it (the backward models then "
                                                 "compose the step from the rates)")
    power: PowerCalibration | None = Field(default=None, description="board power and energy per unit of work "
                                           "(NVML); absent where NVML's binding was missing or in older files")
