"""Time of a FlashAttention-2-class forward (mma.sync): the K/V step of a block, the SM, the waves, the memory floor.

One thread block = one Q block of Br rows; its W warps own Br/W rows each. At every K/V step (Bc keys) a warp runs,
**in sequence** (FA2, §3.1 of Dao 2023: the softmax needs S, P·V needs P):

    ldmatrix   K_j and V_j (and Q_i where it is not held in registers) from shared memory: the SM's bandwidth
    mma        4·(Br/W)·Bc·d FLOPs on its sub-partition's tensor core (QKᵀ and P·V, mma.sync m16n8k16)
    softmax    (Br/W)·Bc exp2 on the special-function unit, SOFTMAX_OPS fp32 operations per score and one rescale
               per output element

and a block-wide barrier per step (the K/V ring's) keeps the block's warps in the same phase, so one block's step is
the *sum* t_seq = t_ldmatrix + t_mma + t_softmax (each phase with the block's warps sharing the SM). k blocks resident
on an SM run out of phase and hide part of one another's step: the SM's step for k blocks is

    T_step = max( t_seq·(1 + OVERLAP_LOSS·(k−1)) , k·t_mma , k·t_ldmatrix , k·t_softmax , k·t_load(L2) )

(:data:`iosim.timing.overlap.OVERLAP_LOSS`, the one fitted constant of the time model, says what share of a second
stream's work does not hide under the first's). A Q block visiting n_i K/V blocks takes t_i = prologue + n_i·T_step
+ epilogue; thread blocks are placed on the SMs' k slots in launch order (causal imbalance and the last wave fall
out of the placement), and once the last is placed each SM's remaining blocks run at the step of the blocks left on
it (:func:`iosim.blocks.tail_makespan`, the steps at j = 1 .. k); the kernel takes the longer of that and its DRAM
bytes over DRAM bandwidth, plus a launch.
With a sliding window (the tiles' ``window``) n_i is the Q block's K/V range (:func:`iosim.blocks.kv_block_range`),
as kernels/flash_fwd.cu's Local instantiations visit it.

**The measured step.** t_seq and the overlap are the chip's rates and one fitted constant; how much of a phase a
kernel's warps hide is their code's. Measured (H100, 2026-11-28), the composition is 16% slow for a lone block of
iosim's default tiles (a lone warp on a sub-partition issues its softmax while its mma.sync run) and 14-22% fast for
its 64-row tiles at d = 64. Where the profile holds the description's step at the call's instantiation and
residency (``calibration.forward.resident_step.<kernel>.d<d>_<Br>x<Bc>.<k>``, :mod:`iosim.calibrate.forward_step`:
k blocks on every SM, bf16, K/V in L2), a 16-bit call takes it as T_step; the composed one stays beside it
(``step_composed``). Packed sequences and a paged cache run instantiations of their own, measured apart
(``d128_128x32-varlen``, ``d128_64x64-paged16`` and ``-paged64``: their steps 0-9% and 2-15% longer than the dense
kernel's on an H100): each call takes its own (:func:`instantiation_step`); a window's Local instantiations keep the
composed step.

**The masked steps.** FlashAttention-2 runs a causal Q block's first ceil(Br / Bc) K/V tiles (it walks them from
the last; one more where the lengths are not whole tiles, and a non-causal block's first one then) through a loop
that masks every score (``masking: fa2-loop``); kernels/flash_fwd.cu masks, in a pass of its own, the tiles holding a
key past the diagonal or the keys' end (``masking: diagonal``). What a masked step costs beyond the measured one
(``calibration.forward.masked_step``: :mod:`iosim.calibrate.fa2_step`, :mod:`iosim.calibrate.forward_step`) is added
for each Q block's :func:`masked` steps where the profile holds both (:func:`mask_step`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from ..blocks import cdiv, kv_block_ranges, tail_makespan
from ..counts import KernelCounts
from ..hardware.gpu import Profile
from ..launch import flash_smem_bytes, resident_blocks
from ..problem import AttentionProblem
from ..schedules.flash2 import page_tiles
from . import overlap
from .estimate import Conditions, KernelTime
from .kernels import KernelDesc, TileConfig
from .rates import WARP_LANES, Rates

SOFTMAX_OPS = 3.5  # fp32 lane operations per score: row max, x·scale - m·scale (FFMA), row sum, ½ convert-and-pack
# Warp instructions per K/V step that kernels/flash_fwd.cu's Paged instantiation runs beyond the contiguous one on the
# same tiles: Nsight Compute's source counters (H100, d = 128, 64 x 64 tiles, pages of 64, 576015e) count 887 against
# 834 a warp a tile, integer address arithmetic (the copies' rows from the tile's row list; shared-memory addresses
# ptxas recomputes under the paged state's registers). Priced at the ALU issue rate, as SOFTMAX_OPS; measured at
# d = 128 only, and taken at every head dim (docs/kernels.md, chunked prefill).
PAGED_OPS = 887 - 834
SUBPARTITIONS = 4  # warp schedulers per SM (each with its own tensor core and quarter of the SFU and FP32 lanes)


@dataclass(frozen=True)
class StepParts:
    ldmatrix_s: float  # one block's fragments from shared memory, one step
    mma_s: float  # one block's two GEMMs of one step
    softmax_s: float  # one block's online softmax of one step
    load_s: float  # one block's K/V tiles from L2 at the SM's share of L2 bandwidth
    step_s: float  # the step of all k resident blocks

    @property
    def sequence_s(self) -> float:
        return self.ldmatrix_s + self.mma_s + self.softmax_s


def smem_bytes(tc: TileConfig, d: int, e: int) -> int:
    if isinstance(tc.smem, int):
        return tc.smem
    if tc.smem == "qkv":
        return (tc.block_q + 2 * tc.block_kv) * d * e
    return flash_smem_bytes(d, tc.block_q, tc.block_kv, e)


def residency(tc: TileConfig, desc: KernelDesc, d: int, e: int, profile: Profile) -> int:
    """Thread blocks resident per SM (registers, shared memory, threads)."""
    total, _ = resident_blocks(profile, desc.warps * 32, smem_bytes(tc, d, e), tc.registers or 255)
    return max(1, total // int(profile.require("sm_count")))


def ldmatrix_bytes(rows: int, Bc: int, d: int, e: int, W: int, tc: TileConfig) -> float:
    """Shared-memory bytes one block's warps read into registers at one step: K_j and V_j by every warp, and each
    warp's rows of Q_i where Q is not held in registers."""
    return W * 2 * Bc * d * e + (0 if tc.q_in_registers else rows * d * e)


def smem_bytes_moved(p: AttentionProblem, tc: TileConfig, W: int, blocks: int, steps: float) -> float:
    """Bytes through shared memory of ``blocks`` thread blocks running ``steps`` K/V steps in all (the energy
    model's): each step's K_j and V_j landed and read (:func:`ldmatrix_bytes`), each block's Q_i landed and read
    once."""
    Br, Bc, d, e = tc.block_q, tc.block_kv, p.head_dim, p.elem_bytes
    return steps * (2 * Bc * d * e + ldmatrix_bytes(Br, Bc, d, e, W, tc)) + blocks * 2 * Br * d * e


def step(rows: int, Bc: int, d: int, e: int, k: int, desc: KernelDesc, tc: TileConfig, r: Rates) -> StepParts:
    """One K/V step of ``k`` resident blocks on one SM (``rows`` query rows per block); each warp also issues the
    tiles' ``step_ops`` instructions (a paged cache's PAGED_OPS)."""
    W = desc.warps
    rw = rows / W  # rows per warp
    per_sp = max(W / SUBPARTITIONS, 1.0)  # the block's warps on one sub-partition
    sp = r.sms * SUBPARTITIONS
    mma = per_sp * 4 * rw * Bc * d / (r.mma_at(W) / sp)
    soft = per_sp * (rw * Bc / (r.ex2 / sp) + (SOFTMAX_OPS * rw * Bc + rw * d + WARP_LANES * tc.step_ops) / (r.alu / sp))
    ldm = ldmatrix_bytes(rows, Bc, d, e, W, tc) / (r.smem / r.sms)
    load = 2 * Bc * d * e / (r.l2 / r.sms)
    mma_k = per_sp * 4 * rw * Bc * d / (r.mma_at(k * W) / sp)  # the tensor cores shared by k blocks' warps
    t = max((ldm + mma + soft) * (1 + overlap.OVERLAP_LOSS * (k - 1)), k * mma_k, k * ldm, k * soft, k * load)
    return StepParts(ldm, mma, soft, load, t)


def visits(p: AttentionProblem, Br: int, Bc: int, window: tuple[int | None, int | None] | None = None) -> np.ndarray:
    """K/V blocks each Q block of one head visits: those its rows see (causal), within a sliding ``window``."""
    lo, hi = kv_block_ranges(p.seq_len, p.kv_len, Br, Bc, p.causal, window)
    return np.maximum(hi - lo, 0).astype(float)


class Pace(NamedTuple):
    """How a block's steps run: ``k`` blocks resident on its SM, ``latency`` of one dependent load, ``step_s`` the
    measured step (:func:`instantiation_step`; None: composed), ``mask_s`` what a masked step adds
    (:func:`mask_step`)."""

    k: int
    latency: float = 0.0
    step_s: float | None = None
    mask_s: float = 0.0


def block_times(p: AttentionProblem, desc: KernelDesc, tc: TileConfig, r: Rates, pace: Pace,
                window: tuple[int | None, int | None] | None = None, packed: bool = False) -> np.ndarray:
    """Seconds of each Q block of one head at ``pace`` (:class:`Pace`: its k blocks resident per SM, one dependent
    load's latency, which its Q_i and first K/V tile wait twice for, nothing of the block hiding them; its measured
    step or the composed one; what a masked step adds, for the :func:`masked` steps of ``packed`` sequences or not);
    ``window``: a sliding window's K/V ranges."""
    Br, Bc, d, e, k = tc.block_q, tc.block_kv, p.head_dim, p.elem_bytes, pace.k
    n = visits(p, Br, Bc, window)
    per_sm_l2 = r.l2 / r.sms
    t_step = step(Br, Bc, d, e, k, desc, tc, r).step_s if pace.step_s is None else pace.step_s  # whole mma tiles
    prologue = k * (Br + 2 * Bc) * d * e / per_sm_l2 + r.block_s + 2 * pace.latency  # Q_i and the first K/V tile
    epilogue = k * Br * d * e / per_sm_l2  # O written once
    extra = pace.mask_s * masked(p, tc, n, packed, desc.masking) if pace.mask_s else 0.0  # mask_s: masking set
    return prologue + n * t_step + extra + epilogue


def masked(p: AttentionProblem, tc: TileConfig, n: np.ndarray, packed: bool, rule: str = "fa2-loop") -> np.ndarray:
    """Steps of each Q block (``n`` visited; no window) that run the kernel's mask, by ``rule``
    (:attr:`KernelDesc.masking`). "fa2-loop": FlashAttention-2's masking loop (flash_fwd_kernel.h's
    n_masking_steps: its last K/V tiles, which it runs first): ceil(Br / Bc) of a causal block, one more where the
    lengths are not whole tiles (its Is_even_MN; packed sequences never are); of a non-causal block, the last one
    where they are not, and none where they are (its mask then compiles to nothing). "diagonal" (kernels/flash_fwd.cu's
    need_mask): the tiles holding a key past the keys' end or, causal, past the Q block's first row's last key."""
    Br, Bc = tc.block_q, tc.block_kv
    if rule == "diagonal":
        return _diagonal(p, Br, Bc, n)
    even = not packed and p.seq_len % Br == 0 and p.kv_len % Bc == 0
    loop = cdiv(Br, Bc) + (not even) if p.causal else int(not even)
    return np.minimum(n, loop)


def _diagonal(p: AttentionProblem, Br: int, Bc: int, n: np.ndarray) -> np.ndarray:
    """Tiles of each Q block that hold a key past the keys' end (the ragged last tile) or, causal (bottom-right),
    past the block's first row's last key (of its visited tiles [lo, lo + n), those from j0 = (m0 + kv_len -
    seq_len + 1) // Bc up)."""
    lo, hi = kv_block_ranges(p.seq_len, p.kv_len, Br, Bc, p.causal, None)
    hi = np.minimum(hi, lo + n.astype(int))
    last = p.kv_len // Bc  # the ragged last tile, where there is one
    ragged = (p.kv_len % Bc != 0) & (lo <= last) & (last < hi)
    if not p.causal:
        return ragged.astype(float)
    j0 = (np.arange(len(lo)) * Br + p.kv_len - p.seq_len + 1) // Bc
    return (np.maximum(hi - np.maximum(lo, j0), 0) + (ragged & (last < j0))).astype(float)


def measured_step(profile: Profile, desc: KernelDesc, p: AttentionProblem, tc: TileConfig, k: int,
                  instantiation: str = "") -> float | None:
    """``calibration.forward.resident_step`` of the description at the call's instantiation (head dim, Br x Bc;
    ``instantiation``: "" the dense kernel, "varlen" or "paged16" / "paged64", :func:`instantiation_key`) and ``k``
    blocks an SM, measured on bf16 inputs (:mod:`iosim.calibrate.forward_step`), for a 16-bit call at a head dim the
    description lists; else None."""
    table = forward_tables(profile, "resident_step", desc.name)
    entry = table.get(instantiation_key(p.head_dim, tc.block_q, tc.block_kv, instantiation))
    if entry is None or p.elem_bytes != 2 or p.head_dim not in desc.tiles or k not in entry.value:
        return None
    return float(entry.value[k])


def mask_step(profile: Profile, desc: KernelDesc, p: AttentionProblem, tc: TileConfig, k: int,
              window: tuple[int | None, int | None] | None, packed: bool, page_size: int | None) -> float:
    """``calibration.forward.masked_step`` of the description's instantiation (the dense one or, ``packed``, the
    varlen one) at ``k`` blocks an SM: what a masked step adds to its measured step; 0 where the description names
    no mask (``masking``), the call has a window or pages, or the profile has no measurement
    (:mod:`iosim.calibrate.fa2_step`, :mod:`iosim.calibrate.forward_step`)."""
    table = forward_tables(profile, "masked_step", desc.name)
    if not table or desc.masking is None or window is not None or page_size or p.elem_bytes != 2:
        return 0.0
    entry = table.get(instantiation_key(p.head_dim, tc.block_q, tc.block_kv, "varlen" if packed else ""))
    return float(entry.value[k]) if entry is not None and k in entry.value else 0.0


def forward_tables(profile: Profile, part: str, kernel: str) -> dict:
    """``calibration.forward.<part>.<kernel>``: its tables by key (instantiation or input kind); empty where the
    profile has none."""
    cal = getattr(profile.calibration, "forward", None)
    return (getattr(cal, part, None) or {}).get(kernel) or {} if cal is not None else {}


def instantiation_key(d: int, block_q: int, block_kv: int, instantiation: str = "") -> str:
    """The key of ``calibration.forward.resident_step.<kernel>``'s table: ``d128_128x32`` (the dense kernel),
    ``d128_128x32-varlen``, ``d128_64x64-paged16``."""
    return f"d{d}_{block_q}x{block_kv}" + (f"-{instantiation}" if instantiation else "")


def paged_step(profile: Profile, desc: KernelDesc, p: AttentionProblem, tc: TileConfig, k: int,
               page_size: int) -> float | None:
    """The measured step of the paged instantiation that runs on pages of ``page_size`` tokens
    (:func:`iosim.schedules.flash2.page_tiles`): the PageTiles one's, measured on pages of 64 (a multiple of every
    paged tile's Bc), or the row lists', measured on pages of 16 (where every tile crosses pages; each key's row is
    looked up at any page size, the same work); None where it is not measured."""
    tiles = page_tiles(page_size, tc.block_kv, p.head_dim)
    return measured_step(profile, desc, p, tc, k, "paged64" if tiles else "paged16")


def instantiation_step(profile: Profile, desc: KernelDesc, p: AttentionProblem, tc: TileConfig, k: int,
                       window: tuple[int | None, int | None] | None, packed: bool,
                       page_size: int | None) -> float | None:
    """The measured step of the instantiation a call runs: the dense kernel's, the varlen one's (``packed``
    sequences), the paged one's (their keys in pages of ``page_size``); None with a window (its Local
    instantiations keep the composed step) or where the profile has no measurement."""
    if window is not None:
        return None
    if page_size:
        return paged_step(profile, desc, p, tc, k, page_size)
    return measured_step(profile, desc, p, tc, k, "varlen" if packed else "")


def sequence(p: AttentionProblem, n: int, nk: int) -> AttentionProblem:
    """Packed sequence (``n`` queries, ``nk`` keys) of the batch-1 problem ``p`` as a problem of its own (a copy, not
    validated: a sequence may have no key)."""
    return p.model_copy(update={"seq_len": n, "kv_len": nk})


def packed_order(p: AttentionProblem, desc: KernelDesc, tc: TileConfig, r: Rates, pace: Pace,
                 seqs: tuple[tuple[int, int], ...], window: tuple[int | None, int | None] | None) -> np.ndarray:
    """Seconds of each thread block of packed sequences ``seqs`` ((queries, keys) each), in the launch order of the
    description's varlen grid (``varlen_grid``): kernels/flash_fwd.cu's (ceil(longest / Br), heads, sequences), a
    sequence's Q blocks from its last where causal or windowed (they see the most keys); FlashAttention-2's
    (ceil(longest / Br), sequences, heads), in order. Each Q block is timed as its sequence's own problem at
    ``pace``; a block past its sequence's last Q tile exits at once (a block's start and its read of the cumulative
    lengths, an L2 hit)."""
    Tr = cdiv(max(1, max(n for n, _ in seqs)), tc.block_q)
    exit_s = r.block_s + r.l2_latency_s
    reverse = desc.launch_order == "causal-longest-first" and (p.causal or window is not None)
    per_seq = []  # one head's blocks of each sequence, exits included
    for n, nk in seqs:
        t = np.zeros(0)
        if n > 0:
            t = block_times(sequence(p, n, nk), desc, tc, r, pace, window, packed=True)
            t = t[::-1] if reverse else t
        per_seq.append(np.concatenate([t, np.full(Tr - len(t), exit_s)]))
    if desc.varlen_grid == "tiles-sequences-heads":  # every sequence of head 0, then of head 1, ...
        return np.tile(np.concatenate(per_seq), p.heads)
    return np.concatenate([np.tile(s, p.heads) for s in per_seq])


def launch_order(per_head: np.ndarray, copies: int, desc: KernelDesc, causal: bool) -> np.ndarray:
    if causal and desc.launch_order == "causal-longest-first":
        per_head = per_head[::-1]
    return np.tile(per_head, copies)  # grid (Tr, heads, batch): a head's Q blocks, then the next head's


def tiles_of(desc: KernelDesc, head_dim: int, block_q: int | None, block_kv: int | None) -> TileConfig:
    """The description's tiles for ``head_dim``, or the tiles the simulation ran with (their registers from the
    description's ``others`` where it lists them, else the default's; shared memory as the description says)."""
    tc = desc.tiles_for(head_dim)
    if block_q is None or (block_q, block_kv) == (tc.block_q, tc.block_kv):
        return tc
    listed = any((o.block_q, o.block_kv) == (block_q, block_kv) and o.q_in_registers is not None for o in tc.others)
    out = tc.with_tiles(block_q, block_kv)
    return out if listed else out.model_copy(update={"q_in_registers": block_q // desc.warps <= 16})


def kernel_time(c: Conditions, kernel: KernelCounts, dram: tuple[float, float], tc: TileConfig,
                window: tuple[int | None, int | None] | None = None,
                seqs: tuple[tuple[int, int], ...] = (), page_size: int | None = None) -> KernelTime:
    """The time of ``kernel`` at tiles ``tc``, its DRAM (read, write) bytes ``dram``, and its parts; ``window``: the
    call's sliding window (None: dense); ``seqs``: packed sequences ((queries, keys) each; a problem of batch 1,
    the varlen grid of :func:`packed_order`); ``page_size``: their keys in a paged cache of pages of that many tokens
    (the composed step PAGED_OPS more). Each takes its instantiation's measured step where the profile has it."""
    p, desc, r, latency = c.problem, c.desc, c.rates, c.latency
    if page_size:
        tc = tc.model_copy(update={"step_ops": tc.step_ops + PAGED_OPS})
    k = residency(tc, desc, p.head_dim, p.elem_bytes, c.profile)
    heads = p.n_heads_total
    grid = (cdiv(max(1, max(n for n, _ in seqs)), tc.block_q) * len(seqs) if seqs else cdiv(p.seq_len, tc.block_q)) * heads
    working = sum(cdiv(n, tc.block_q) for n, _ in seqs) * heads if seqs else grid  # packed: blocks that do not exit
    if working < r.sms * k:  # one partial wave: blocks spread over the SMs, fewer resident on each
        k = max(1, math.ceil(working / r.sms))
    step_m = instantiation_step(c.profile, desc, p, tc, k, window, bool(seqs), page_size)
    mask_s = mask_step(c.profile, desc, p, tc, k, window, bool(seqs), page_size) if step_m is not None else 0.0
    pace = Pace(k, latency, step_m, mask_s)
    if seqs:
        order = packed_order(p, desc, tc, r, pace, seqs, window)
    else:
        order = launch_order(block_times(p, desc, tc, r, pace, window), heads, desc, p.causal)
    blocks = tail_makespan(order, r.sms, k, _speedup(c, desc, tc, k, step_m, (window, bool(seqs), page_size)))
    memory = r.dram_s(*dram)
    total = max(blocks, memory) + r.first_launch_s() + latency  # the last stores drain
    sp = step(tc.block_q, tc.block_kv, p.head_dim, p.elem_bytes, k, desc, tc, r)
    busy = float(order.sum()) / (r.sms * k * blocks) if blocks else 1.0  # share of the chip's block slots in use
    parts = {"utilization": min(1.0, busy), "blocks": blocks, "dram": memory, "launch": r.first_launch_s(), "resident_blocks": k,
             "step_ldmatrix": sp.ldmatrix_s, "step_mma": sp.mma_s, "step_softmax": sp.softmax_s,
             "step_load": sp.load_s, "step": sp.step_s if step_m is None else step_m,
             **({"step_composed": sp.step_s} if step_m is not None else {}),
             **({"step_masked_extra": mask_s} if mask_s else {})}
    bound = "dram" if memory > blocks else "step (measured)" if step_m is not None else _step_bound(sp, k)
    problems = [sequence(p, n, nk) for n, nk in seqs if n > 0] if seqs else [p]
    steps = heads * float(sum(np.sum(visits(q, tc.block_q, tc.block_kv, window)) for q in problems))
    smem = smem_bytes_moved(p, tc, desc.warps, grid, steps)
    return KernelTime.of(kernel.name, kernel.grid, total, {**parts, "bound": bound}, smem)


def _speedup(c: Conditions, desc: KernelDesc, tc: TileConfig, k: int, step_m: float | None, call: tuple
             ) -> dict[int, float]:
    """How much faster each block on an SM runs while j = 1 .. k blocks run there than with ``k``: the step at k over
    the step at j, the instantiation's measured ones where the call takes a measured step (``step_m``) and the
    profile holds it at every j, else the composed ones; ``call``: (window, packed, page_size), as
    instantiation_step."""
    p, r = c.problem, c.rates
    measured = [instantiation_step(c.profile, desc, p, tc, j, *call) for j in range(1, k + 1)] if step_m else []
    if step_m is None or None in measured:  # the ratios of one kind: a measured step over a composed one is neither
        measured = [step(tc.block_q, tc.block_kv, p.head_dim, p.elem_bytes, j, desc, tc, r).step_s
                    for j in range(1, k + 1)]
    return {j: measured[-1] / measured[j - 1] for j in range(1, k + 1)}


def _step_bound(sp: StepParts, k: int) -> str:
    """What limits the step: the in-block sequence (the warps' phases one after another), or a shared resource."""
    cands = {"sequence": sp.sequence_s * (1 + overlap.OVERLAP_LOSS * (k - 1)), "tensor": k * sp.mma_s,
             "smem": k * sp.ldmatrix_s, "softmax": k * sp.softmax_s, "l2": k * sp.load_s}
    return max(cands, key=cands.get)
