"""Time of FlashAttention-3's forward on Hopper (family ``fa3``: fa3, cudnn): the pipeline, not the sum of its parts.

FA3 (Shah et al. 2024, §3) runs, in every thread block (one per Q block, one block per SM, persistent):

* a **producer** warpgroup that loads K_j, V_j with TMA into a 2-stage buffer, so loads overlap compute;
* two **consumer** warpgroups that alternate (**ping-pong**): the softmax of one runs while the tensor cores
  execute the GEMMs of the other; inside a warpgroup the softmax of tile j runs under the QKᵀ GEMM of j+1.

So one K/V step of a thread block costs the *largest* of its parts, not their sum:

    t_gemm    = 4·Br·Bc·d / (tensor rate per SM · tensor_efficiency)           two wgmma GEMMs
    t_softmax = exp / (exp rate per SM) + other / (fp32 instruction rate per SM)  one exp2 per score on the
                special-function unit; max, subtract, sum, rescale on the FP32 pipe, over the Br x Bc tile
    t_load    = 2·bc·d·b / (L2 bandwidth per SM)                               K_j, V_j by TMA (bc: its keys)
    t_step    = max(t_gemm, t_softmax, t_load)          (overlap=True; FA2-style overlap=False: t_gemm + t_softmax)

The GEMMs and the softmax run whole tiles past a ragged end (wgmma's shapes are fixed, and both consumer
warpgroups run every step of a Q tile): a sequence of 777 tokens costs them what 896 do. A warpgroup whose 64 rows
straddle an edge of the tile (the causal diagonal, a window's bounds, the keys' ragged end) first runs a mask pass
(kernels/flash3_fwd.cu's ``need_mask``), MASK_OPS instructions a score by the instantiation (plain, causal, Local),
which lengthens that step's softmax: a window of a few tiles masks most of its steps, a long causal row one or two
of many (:func:`masked_steps`).

and a thread block takes  t_first + Σ_j t_step + t_last: the prologue (load Q_i and the first K/V tile,
then the first QKᵀ, which nothing hides) and the epilogue (the last P·V, O / l, and the store of O).
Thread blocks are placed on the SMs longest first (FA3's persistent scheduler), in the grid's order on the SM that
frees first (``launch_order: persistent-in-order``: cuDNN's tile counter), or for iosim's kernel
(``launch_order: persistent-iosim``) where its launch places them (:mod:`iosim.launch.flash3_schedule`: a snake
over the tile list, or a causal call's host schedule: a window's tiles, alike but for the first ones of each head,
do not even out in the snake as they would under a dynamic scheduler), and the kernel takes the
longer of that schedule and the memory system's floor: global bytes over the L2 bandwidth, and the
compulsory bytes (Q, K, V read once, O and L written once) over DRAM bandwidth, because FA3's scheduler
keeps a head's K and V in L2 while its Q blocks run (hopper/tile_scheduler.hpp, "L2 swizzling").

Values narrower or wider than the keys (MLA prefill: keys of 192, values of 128; ``value_dim``, through
``Workload.value_dim``) take Q K^T at the keys' width and P V at the values', each load and store at its own.

fp8 (e4m3): 1-byte Q, K, V in the loads, the tensor rate of fp8 (the profile's ``compute.tensor.fp8`` times the
efficiency :mod:`iosim.timing` passes: the calibrated fp8 wgmma rate's share of that peak where ``iosim calibrate rates``
measured it). With iosim's fp8 layout (:mod:`iosim.schedules.flash3_fp8`) O is stored in bf16 and the compulsory
bytes are that layout's (V^T padded, block scales): :func:`iosim.schedules.flash3_fp8.dram`. The scales' 8 bytes a
K/V step are left out of the step's loads (under 0.1% of K_j and V_j at d >= 64).

Rates come from the profile. ``tensor_efficiency`` is the sustained fraction of the datasheet's tensor-core
peak, a parameter of this model with its source (below), not a property of the chip.

**The measured step.** Where the profile holds the kernel's own step (``calibration.forward.step``, by description,
input type and head dim: :mod:`iosim.calibrate.forward_step`), :mod:`iosim.timing` passes it as ``step_s`` for a
call that runs the instantiation it was measured on (the description's tiles, no pages; a window's call its Local
instantiation's, ``bf16-local``, or the plain one's where that was not measured; packed sequences the plain one's),
and a K/V step costs that (a masked one its mask pass more); with it, where measured, a tile's prologue and
epilogue are the measured ``tile_fixed`` (what a further tile adds beyond its steps) and the call's launch and
drain the measured ``call_fixed``; the placement is the model's as above.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..blocks import cdiv, kv_block_ranges, makespan
from ..counts import KernelCounts
from ..hardware.gpu import Profile
from ..launch.flash3_schedule import block_tiles, varlen_schedule, varlen_tiles
from ..problem import ELEMENT_BYTES, STAT_BYTES, AttentionProblem
from ..schedules import flash3_fp8
from .estimate import KernelTime
from .rates import Rates


@dataclass(frozen=True)
class HopperModel:
    tensor_efficiency: float = 798 / 989.4
    """Sustained / datasheet tensor-core rate. Source: a bf16 8192³ GEMM measured ~798 TFLOP/s on the H100 of
    this project's GPU machine (docs/kernels.md, the flash3 floor) against the datasheet's 989.4 TFLOP/s, which
    assumes the 1.98 GHz boost clock."""
    overlap: bool = True
    """True: FA3's pipeline (max of the parts); False: FA2-style, softmax and GEMMs in sequence."""
    overlap_loss: float = 0.0
    """With ``overlap``: the share of the shorter of GEMM and softmax that does not hide under the longer (0: a
    perfect ping-pong; iosim.timing passes its fitted OVERLAP_LOSS)."""
    step_s: float | None = None
    """A K/V step as measured on the kernel itself (``calibration.forward.step``, iosim.calibrate.forward_step), in
    place of the composed one; None: composed. A masked step adds its mask pass to it as to the composed step."""
    tile_fixed_s: float | None = None
    """What a Q tile costs beyond its steps, as measured (``calibration.forward.tile_fixed``), in place of the
    composed prologue and epilogue; None: composed."""


MASK_OPS: dict[str, dict[int, float]] = {"plain": {64: 2.06, 128: 2.06, 256: 2.12},
                                          "causal": {64: 3.12, 128: 3.12, 256: 3.38},
                                          "local": {64: 7.0, 128: 7.12, 256: 8.38}}
"""SASS instructions of the mask pass per masked score, by instantiation (plain: the keys' ragged end only; causal;
Local: a window) and head dim: ``python benchmarks/flash3_mask_sass.py`` (the kernel as shipped against a copy whose
pass is compiled out, cuobjdump -sass; nvcc 13, sm_90a, 2026-11-27; fp16 and bf16 alike). Priced at the fp32
instruction rate; the fp8 instantiations (the same source) and other FA3-design kernels (cuDNN, FA3's) are taken
to mask as these do."""


MEASURED_PARTS = ("step", "tile_fixed", "call_fixed")  # calibration.forward's tables, as measured on the kernel


def value_key(dtype: str, value_dim: int, tiles) -> str:
    """The calibration's key of an instantiation whose values are ``value_dim`` wide against keys of another width,
    at the tiles it was measured with: ``bf16-v128-128x128`` (MLA prefill's, :mod:`iosim.timing.mla`)."""
    return f"{dtype}-v{value_dim}-{tiles.block_q}x{tiles.block_kv}"


def measured(profile: Profile, desc, p: AttentionProblem, tiles, part: str, value_dim: int | None = None
             ) -> float | None:
    """``calibration.forward.<part>`` (:data:`MEASURED_PARTS`) of the description ``desc`` for the call's input type
    and head dim, where the call runs the instantiation it was measured on: the description's own tiles, no pages; a
    window's call takes its Local instantiation's (``<dtype>-local``), or where that was not measured the plain
    one's; packed sequences their Varlen instantiation's step (``<dtype>-varlen``, measured alone: its tile and
    call parts, taken on a long sequence's tiles, are not what short sequences' tiles cost) and the plain one's tile
    and call parts (the mask passes priced apart either way); values of ``value_dim`` against keys of ``head_dim``
    the instantiation measured at both widths and the call's tiles (:func:`value_key`) or none; else None (the model
    composes it)."""
    cal = getattr(profile.calibration, "forward", None)
    tables = (getattr(cal, part) or {}).get(desc.name, {}) if cal is not None else {}
    if value_dim is not None and value_dim != p.head_dim:
        table = tables.get(value_key(p.dtype, value_dim, tiles))
        if table is None or p.head_dim not in table.value or getattr(tiles, "page_size", None):
            return None
        return float(table.value[p.head_dim])
    local = mask_kind(p, getattr(tiles, "window", None)) == "local"
    table = tables.get(f"{p.dtype}-local") if local else None  # a window's Local instantiation, where measured
    if getattr(tiles, "seqlens", None) and not local:  # packed sequences: the Varlen instantiation's, where measured
        table = tables.get(f"{p.dtype}-varlen")
    table = table if table is not None else tables.get(p.dtype)
    if table is None or p.head_dim not in table.value:
        return None
    if getattr(tiles, "page_size", None):
        return None
    return float(table.value[p.head_dim]) if desc.runs_own_tiles(p.head_dim, tiles, p.dtype) else None


def mask_kind(p: AttentionProblem, window: tuple[int | None, int | None] | None) -> str:
    """Which of the kernel's instantiations a call runs, as its mask goes (iosim.launch.varlen.mask_of)."""
    if window is not None and window not in ((None, None), (None, 0)):
        return "local"
    return "causal" if p.causal or window == (None, 0) else "plain"


def mask_ops(kind: str, head_dim: int) -> float:
    """MASK_OPS of ``kind`` at ``head_dim`` (the nearest instantiation at or above it, else the largest)."""
    table = MASK_OPS[kind]
    return table[min((d for d in table if d >= head_dim), default=max(table))]


WARPGROUP_ROWS = 64  # query rows of one consumer warpgroup (Br = 128: two)


def masked_steps(p: AttentionProblem, Br: int, Bc: int, window: tuple[int | None, int | None] | None,
                 lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Warpgroup-steps of each Q tile (visiting K/V tiles ``lo .. hi - 1``) that run the mask pass, as
    kernels/flash3_fwd.cu decides it for a warpgroup's rows r0 .. r0 + 63: its K/V tile reaches past the last key a
    row sees (the diagonal or the window's right bound, or the keys' end) or starts before the first key the last of
    the 64 rows sees (the window's left bound). A window unbounded on both sides is the plain mask, (None, 0) the
    causal one; any other runs the Local instantiation, an unbounded side as the kernel takes it (left kv_len, right
    seq_len)."""
    off, kind = p.kv_len - p.seq_len, mask_kind(p, window)
    left = right = None
    if kind == "local":
        left = p.kv_len if window[0] is None else min(window[0], p.kv_len)
        right = p.seq_len if window[1] is None else min(window[1], p.seq_len)
    elif kind == "causal":
        right = 0
    last_row = WARPGROUP_ROWS - 1
    total = np.zeros(len(lo))
    for cw in range(Br // WARPGROUP_ROWS):
        r0 = np.arange(len(lo)) * Br + cw * WARPGROUP_ROWS
        edge = np.full(len(lo), p.kv_len - 1) if right is None else np.minimum(p.kv_len - 1, r0 + off + right)
        first_right = (edge - Bc + 1) // Bc + 1  # tiles from here on pass the right edge
        last_left = (-((left - r0 - last_row - off) // Bc) if left is not None  # ceil: tiles before this miss keys
                     else np.full(len(lo), -(1 << 40)))
        a, c = np.clip(first_right, lo, hi), np.clip(last_left, lo, hi)
        total += (c - lo) + (hi - np.maximum(a, c))
    return total


def wgmma_efficiency(r: Rates, profile: Profile, dtype: str) -> float:
    """The measured wgmma rate as a share of the datasheet peak of its input type (:class:`HopperModel`'s
    ``tensor_efficiency``): fp8's own measurement where ``iosim calibrate rates`` made it (``calibration.wgmma.fp8``),
    else the fp16 measurement's share of the fp16 peak (the estimate's ``calibration`` says so)."""
    if r.wgmma == r.wgmma and r.calibration != "uncalibrated":  # measured (not nan)
        measured = r.wgmma_dtype or ("bf16" if dtype == "bf16" else "fp16")
        return min(1.0, r.wgmma / profile.matmul_rate(measured))
    return HopperModel().tensor_efficiency


def _rates(profile: Profile, dtype: str, model: HopperModel) -> dict[str, float]:
    sms = int(profile.require("sm_count"))
    return {
        "sms": sms,
        "tensor": profile.matmul_rate(dtype) * model.tensor_efficiency / sms,  # FLOP/s per SM
        "exp": profile.require("compute.exp") / sms,  # exp2/s per SM
        "alu": profile.require("compute.fp32") / 2 / sms,  # instructions/s per SM (an FMA is 2 FLOPs)
        "l2": _l2_bandwidth(profile) / sms,  # B/s per SM
    }


def _l2_bandwidth(profile: Profile) -> float:
    """``l2.bandwidth``, or infinity where the profile does not publish it (the loads then cost no time, and the
    estimate names the field in ``unmodeled``, as the roofline does)."""
    bw = profile.l2.bandwidth.value
    return float(bw) if bw else math.inf


def block_times(p: AttentionProblem, Br: int, Bc: int, profile: Profile, model: HopperModel = HopperModel(),
                out_bytes: int | None = None, window: tuple[int | None, int | None] | None = None,
                value_dim: int | None = None) -> tuple[np.ndarray, dict[str, float]]:
    """Seconds of each Q block's thread block (one head), and the summed parts (per head, at one SM's rates; and
    ``tiles``, the K/V steps of the head's Q blocks); ``out_bytes``: bytes of an element of O (None: the problem
    dtype's); ``window``: a sliding window (left, right), each Q block visiting the K/V blocks
    :func:`iosim.blocks.kv_block_range` gives; ``value_dim``: values per head where they are narrower or wider
    than the keys' ``head_dim`` (MLA prefill: keys of 192, values of 128; None: ``head_dim``), which Q K^T, P V,
    the loads of K and V and the store of O each take at their own width."""
    r = _rates(profile, p.dtype, model)
    N, Nk, d, b = p.seq_len, p.kv_len, p.head_dim, p.elem_bytes
    dv = d if value_dim is None else value_dim
    ob = b if out_bytes is None else out_bytes
    Tr = cdiv(N, Br)
    i = np.arange(Tr)
    br = (np.minimum((i + 1) * Br, N) - i * Br).astype(float)
    lo, hi = (x.astype(float) for x in kv_block_ranges(N, Nk, Br, Bc, p.causal, window))
    n = np.maximum(hi - lo, 0)
    cols = np.where(n > 0, np.minimum(hi * Bc, Nk) - lo * Bc, 0)  # keys streamed
    last = cols - np.maximum(n - 1, 0) * Bc  # keys in the last visited block (ragged or full)

    def parts(keys):
        """(gemm, softmax, load) seconds of one step whose K/V tile holds ``keys`` keys. The tensor cores and the
        softmax run whole tiles, Br rows by Bc keys, whatever of them lies past the sequence's end (wgmma's shapes
        are fixed; both consumer warpgroups run every step of a Q tile); the loads move the keys there are."""
        gemm = 2 * Br * Bc * (d + dv) / r["tensor"]  # Q K^T at the keys' width, P V at the values'
        softmax = (Br * Bc + Br) / r["exp"] + (4 * Br * Bc + (4 + dv) * Br) / r["alu"]  # O's rows rescaled
        load = keys * (d + dv) * b / r["l2"]
        return gemm, softmax, load

    def step(keys, mask=0.0):
        g, s, ld = parts(keys)
        s = s + mask
        if not model.overlap:
            return np.maximum(g + s, ld)
        return np.maximum(np.maximum(g, s) + model.overlap_loss * np.minimum(g, s), ld)

    g_tile, s_tile, l_full = parts(Bc)
    _, _, l_last = parts(last)
    # a masked warpgroup-step: its softmax longer by the mask pass over its 64 rows (linear in the masked count)
    per_mask = step(Bc, mask_ops(mask_kind(p, window), d) * WARPGROUP_ROWS * Bc / r["alu"]) - step(Bc)
    masks = masked_steps(p, Br, Bc, window, lo, hi)
    full, ragged = (step(Bc), step(last)) if model.step_s is None else (model.step_s, model.step_s)  # whole tiles
    steady = np.where(n > 0, np.maximum(n - 1, 0) * full + ragged + masks * per_mask, 0.0)
    qk, pv = 2 * Br * Bc * d / r["tensor"], 2 * Br * Bc * dv / r["tensor"]  # the first Q K^T, the last P V
    first = np.where(n > 0, br * d * b / r["l2"] + np.where(n > 1, l_full, l_last) + qk, 0.0)
    epilogue = pv + br * dv * (4 / r["alu"] + ob / r["l2"])  # last P·V; O / l; store O (its rows)
    fixed = first + epilogue if model.tile_fixed_s is None else model.tile_fixed_s
    t = np.where(n > 0, fixed + steady, br * dv * ob / r["l2"])  # a Q block that sees no key: store zeros
    sums = {"tensor": float((n * g_tile).sum()), "softmax": float((n * s_tile).sum()),
            "load": float(parts(cols)[2].sum()), "tiles": float(n.sum())}
    return t, sums


def placed(per_block: np.ndarray, p: AttentionProblem, tiles, sms: int, placement: str) -> float:
    """When the last SM ends, each Q tile of every head taking ``per_block[m]`` seconds (m its Q block): placed
    longest first on the free SM ("dynamic"), on the free SM in the grid's order ("in-order": a head's Q tiles from
    the first, head after head; cuDNN's), or as kernels/flash3_fwd.cu's launch places them ("iosim": tile t =
    x + Tr * head, causal m = Tr - 1 - x; a window runs the kernel's Local instantiation, not its causal one)."""
    durations = np.tile(per_block, p.n_heads_total)
    if placement in ("dynamic", "in-order"):
        return makespan(durations, sms, longest_first=placement == "dynamic")
    causal = mask_kind(p, getattr(tiles, "window", None)) == "causal"
    order = np.tile(per_block[::-1] if causal else per_block, p.n_heads_total)  # duration of tile t
    blocks = min(len(order), sms)
    per_sm = block_tiles(p.batch, p.seq_len, p.kv_len, p.heads, tiles.block_q, tiles.block_kv, causal, blocks)
    return float(max(order[ts].sum() for ts in per_sm if ts)) if len(order) else 0.0


def packed(p: AttentionProblem, tiles, profile: Profile, model: HopperModel, sms: int,
           placement: str) -> tuple[np.ndarray, dict[str, float], float]:
    """Packed sequences (``tiles.seqlens``; a problem of batch 1) as kernels/flash3_fwd.cu's Varlen instantiation
    runs them: every Q tile of every sequence and head timed as its sequence's own problem (:func:`block_times`),
    placed as the launch places them ("iosim": :func:`iosim.launch.flash3_schedule.varlen_schedule`'s lists) or
    longest first ("dynamic"). Returns every tile's seconds (in the list's order: sequence, head, Q tile), the
    parts of one head summed over the sequences, and when the last SM ends."""
    window, heads = getattr(tiles, "window", None), p.n_heads_total
    Br, Bc = tiles.block_q, tiles.block_kv
    per_seq, per_head = [], {"tensor": 0.0, "softmax": 0.0, "load": 0.0, "tiles": 0.0}
    for n, nk in tiles.seqlens:
        t = np.zeros(0)
        if n > 0:
            t, part = block_times(p.model_copy(update={"seq_len": n, "kv_len": nk}), Br, Bc, profile, model,
                                  window=window)
            per_head = {key: per_head[key] + part[key] for key in per_head}
        per_seq.append(t)
    Tr = max(1, cdiv(max(n for n, _ in tiles.seqlens), Br))
    start = np.concatenate([[0], np.cumsum([len(t) for t in per_seq])])
    flat = np.concatenate(per_seq)

    def seconds(t: np.ndarray) -> np.ndarray:  # each tile's, by its number t = m + Tr * (h + H * b)
        return flat[start[t // (Tr * heads)] + t % Tr]

    listed, _ = varlen_tiles(tiles.seqlens, heads, Br, Bc, p.causal, window)
    durations = seconds(listed)
    if not len(durations):
        return durations, per_head, 0.0
    blocks = min(len(durations), sms)
    if placement in ("dynamic", "in-order"):
        return durations, per_head, makespan(durations, sms, longest_first=placement == "dynamic")
    sched = varlen_schedule(tiles.seqlens, heads, Br, Bc, p.causal, window, blocks)
    offsets, order = sched[:blocks + 1], sched[blocks + 1:]  # every block holds a tile (blocks <= tiles)
    return durations, per_head, float(np.add.reduceat(seconds(order), offsets[:-1]).max())


def kernel_time(kernel: KernelCounts, problem: AttentionProblem, tiles, profile: Profile,
                model: HopperModel = HopperModel(), placement: str = "dynamic", value_dim: int | None = None
                ) -> KernelTime:
    """The time of ``kernel`` (flash3_fwd, as counted), its parts and its bound; the L2 bandwidth's absence (the
    loads then cost no time) is named in the roofline's ``unmodeled`` beside it; ``placement``: where the tiles run
    (:func:`placed`); packed sequences (``tiles.seqlens``): :func:`packed`; ``value_dim``: as :func:`block_times`
    (not with packed sequences or iosim's fp8 layout)."""
    p = problem
    layout = isinstance(tiles, flash3_fp8.Fp8LayoutTiles)  # iosim's fp8 kernel: O in bf16, its own compulsory bytes
    out_bytes = ELEMENT_BYTES[flash3_fp8.OUTPUT_DTYPE] if layout else None
    r = _rates(profile, p.dtype, model)
    sms = r["sms"]
    heads = p.n_heads_total
    if value_dim is not None and (layout or getattr(tiles, "seqlens", ())):
        raise ValueError("value_dim: the fa3 model takes values of their own width on dense calls only, not "
                         "packed sequences or iosim's fp8 layout")
    if getattr(tiles, "seqlens", ()):
        every_tile, sums, pipeline = packed(p, tiles, profile, model, sms, placement)
        busy = float(every_tile.sum())
    else:
        per_block, sums = block_times(p, tiles.block_q, tiles.block_kv, profile, model, out_bytes,
                                      getattr(tiles, "window", None), value_dim)
        pipeline = placed(per_block, p, tiles, sms, placement)
        busy = float(per_block.sum()) * heads
    k = kernel
    b, d = p.elem_bytes, p.head_dim
    dv = d if value_dim is None else value_dim
    compulsory = (heads * (p.seq_len * (d + dv) * b + p.seq_len * STAT_BYTES)
                  + p.batch * p.kv_heads * p.kv_len * (d + dv) * b)
    if layout:
        compulsory = sum(rd + wr for rd, wr in flash3_fp8.dram(p, tiles))
    res = {
        "tensor": sums["tensor"] * heads / sms,  # every SM's tensor cores busy all the time
        "softmax": sums["softmax"] * heads / sms,
        "load": sums["load"] * heads / sms,
        "pipeline": pipeline,  # the thread blocks' pipelined times, placed on the SMs
        "global": (k.global_read_bytes + k.global_write_bytes) / _l2_bandwidth(profile),
        "hbm": compulsory / profile.require("dram.bandwidth"),
    }
    total = max(pipeline, res["global"], res["hbm"])
    if total == pipeline and model.step_s is not None:  # the kernel's own step, as measured
        bound = "step (measured)"
    elif total == pipeline:  # name the part that limits the steady state
        bound = max(("tensor", "softmax", "load"), key=res.get)
    else:
        bound = "global" if res["global"] >= res["hbm"] else "hbm"
    utilization = busy / sms / pipeline if pipeline else 1.0
    flops = heads * sums["tiles"] * 2 * tiles.block_q * tiles.block_kv * (d + dv)  # whole tiles (the energy's)
    return KernelTime(k.name, k.grid, float(utilization), res, total, bound, tensor_flops=flops)
