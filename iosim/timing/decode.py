"""Time of FlashAttention-2's split-KV forward, as torch runs it where its grid would not fill the GPU (decode: a few
queries against a long K/V; or few heads and short sequences).

With one query per sequence and grouped-query heads, FA2 folds the query heads of a K/V head into the query rows
(``seqlenq_ngroups_swapped``: seq_len_q = H/H_kv, heads = H_kv); with Q blocks of 64 rows it cuts the K/V sequence
into ``num_splits`` parts chosen by its wave-efficiency heuristic (``num_splits_heuristic`` with 2 × SMs, at most
128 splits; one split: the plain kernel runs, :mod:`iosim.timing.fa2`), runs one
thread block per (batch, head, Q block, split) over its part, then a combine kernel merges the partial outputs by
their log-sum-exp. Each block streams its K/V part once; the kernel takes the longer of the blocks' placement and
the K/V bytes over DRAM bandwidth, and the combine kernel reads the partial outputs once.

Where the profile measured the split kernel (:mod:`iosim.calibrate.fa2_step`: ``resident_step.<kernel>.d<d>_64x<Bc>
-splitkv.<k>`` and ``call_fixed.<kernel>.bf16-splitkv``), its step is the measured one and what the call costs beyond
its steps and the combine's reads of the partial outputs (both launches, a block's start and partial store, the
combine's chain) the measured fixed part, in place of the composed ones.
"""

from __future__ import annotations

import math

import numpy as np

from ..blocks import cdiv, makespan
from ..counts import KernelCounts
from ..hardware.gpu import Profile
from ..problem import AttentionProblem
from . import fa2
from .estimate import Conditions, KernelTime
from .kernels import KernelDesc, TileConfig
from .rates import Rates

MAX_SPLITS = 128
SPLIT = "splitkv"  # the split-KV kernel's key in calibration.forward (resident_step's instantiation, call_fixed's)


def num_splits(work: int, slots: int, n_blocks: int, max_splits: int = MAX_SPLITS) -> int:
    """FlashAttention-2's num_splits_heuristic: the fewest splits within 85% of the best wave efficiency."""
    if work >= 0.8 * slots:
        return 1
    max_splits = min(max_splits, slots, n_blocks)
    eff = []
    for s in range(1, max_splits + 1):
        eligible = s == 1 or cdiv(n_blocks, s) != cdiv(n_blocks, s - 1)
        waves = work * s / slots
        eff.append(waves / math.ceil(waves) if eligible else 0.0)
    best = max(eff)
    for s in range(1, max_splits + 1):
        if eff[s - 1] and eff[s - 1] >= 0.85 * best:
            return s
    return 1


def folded(p: AttentionProblem, desc: KernelDesc) -> AttentionProblem:
    """The problem the kernel runs: for one query with grouped-query heads, a kernel that folds them
    (``desc.fold_gqa_decode``: FA2) runs seq_len = H / H_kv query rows of H_kv heads, unmasked (one position), split
    or not; ``p`` elsewhere. Its bytes are ``p``'s: the counts stand."""
    if not desc.fold_gqa_decode or p.seq_len != 1 or p.heads <= p.kv_heads:
        return p
    return p.model_copy(update={"seq_len": p.heads // p.kv_heads, "heads": p.kv_heads, "causal": False})


def split_geometry(p: AttentionProblem, desc: KernelDesc, r: Rates) -> tuple[int, int, int, int, int]:
    """(rows, heads, Bc, n K/V blocks, splits) as FA2's set_params_splitkv sets them, on the problem it runs
    (:func:`folded`)."""
    sk = desc.split_kv
    d = p.head_dim
    Bc = sk.block_kv.get(d) or sk.block_kv[min(x for x in sk.block_kv if x >= d)]
    p = folded(p, desc)
    rows, heads = p.seq_len, p.heads
    n_blocks = cdiv(p.kv_len, Bc)
    work = p.batch * heads * cdiv(rows, sk.block_q)
    return rows, heads, Bc, n_blocks, num_splits(work, 2 * r.sms, n_blocks)


def split_fixed(profile: Profile, desc: KernelDesc, p: AttentionProblem) -> float | None:
    """``calibration.forward.call_fixed.<kernel>.bf16-splitkv`` at the call's head dim: what the split path's call
    costs beyond its steps and the combine's reads, measured one wave of two blocks an SM
    (:mod:`iosim.calibrate.fa2_step`); None for other inputs than 16-bit ones or where it is not measured."""
    table = fa2.forward_tables(profile, "call_fixed", desc.name).get(f"bf16-{SPLIT}")
    if table is None or p.elem_bytes != 2 or p.head_dim not in table.value:
        return None
    return float(table.value[p.head_dim])


def applies(p: AttentionProblem, desc: KernelDesc, r: Rates) -> bool:
    """Whether the kernel takes its split-KV path for ``p`` (more than one split)."""
    return desc.split_kv is not None and split_geometry(p, desc, r)[4] > 1


def kernel_time(c: Conditions, kernel: KernelCounts, dram: tuple[float, float]) -> KernelTime:
    """The time of ``kernel`` (the forward's, as counted) run split-KV, with its combine kernel, on its DRAM (read,
    write) bytes ``dram``, and its parts."""
    p, desc, r, latency = c.problem, c.desc, c.rates, c.latency
    sk = desc.split_kv
    d, e = p.head_dim, p.elem_bytes
    rows, heads, Bc, n_blocks, splits = split_geometry(p, desc, r)
    tc = TileConfig(block_q=sk.block_q, block_kv=Bc, registers=255, smem="qkv")
    grid = p.batch * heads * cdiv(rows, sk.block_q) * splits
    k = fa2.residency(tc, desc, d, e, c.profile)
    k = min(k, max(1, math.ceil(grid / r.sms)))
    st = fa2.step(sk.block_q, Bc, d, e, k, desc, tc, r)
    step_s = fa2.measured_step(c.profile, desc, p, tc, k, SPLIT)
    fixed = split_fixed(c.profile, desc, p) if step_s is not None else None
    step_s = st.step_s if step_s is None else step_s
    per_split = cdiv(n_blocks, splits)
    per_sm_l2 = r.l2 / r.sms
    start = 0.0 if fixed is not None else k * sk.block_q * d * e / per_sm_l2 + r.block_s + 2 * latency
    blocks = makespan(np.full(grid, start + per_split * step_s), r.sms * k)  # causal: ignored
    main = max(blocks, r.dram_s(*dram)) + (fixed if fixed is not None else r.first_launch_s() + latency)
    combine = 0.0
    if splits > 1:  # partial O (fp32) and lse of every split read once, O written once
        partial = p.batch * p.heads * p.seq_len * splits * (d + 1) * 4
        combine = partial / r.l2 + (0.0 if fixed is not None else r.next_launch_s() + 3 * latency)  # lse, O; store
    parts = {"utilization": min(1.0, grid / (r.sms * k)), "splits": splits, "resident_blocks": k, "blocks": blocks,
             "main": main, "combine": combine, "step": step_s, "launch": r.first_launch_s(),
             **({"call_fixed": fixed} if fixed is not None else {})}
    bound = "dram" if r.dram_s(*dram) > blocks else "blocks"
    smem = fa2.smem_bytes_moved(p, tc, desc.warps, grid, float(grid * per_split))
    return KernelTime.of(kernel.name, kernel.grid, main + combine, {**parts, "bound": bound}, smem)
