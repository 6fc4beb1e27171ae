"""``calibration.forward.resident_step.fa2`` and ``calibration.forward.masked_step.fa2``: torch's FlashAttention-2
forward (SDPA's flash backend, the ``fa2`` description) timed as iosim's flash2 forward is, where torch runs here.

Why it is measured: the fa2 model (:mod:`iosim.timing.fa2`) composes FlashAttention-2's step from the chip's rates,
and two things of its code are not in them. Its step at one block an SM: measured on an H100 (2026-11-28, this
method by hand), the composition is 14% (d = 128) and 25% (d = 256) slower than the kernel, right at two. Its
masking loop: flash_fwd_kernel.h runs a causal Q block's last ceil(Br / Bc) K/V steps (one more where the lengths
are not whole tiles, as packed sequences never are) through a loop that masks every score, and those steps cost
1-3 us more than a plain one (H100, d = 64 and 128); the time record's short causal rows (N = 128-256, most of their
steps masked) and its packed documents were predicted 17-39% fast without it.

How (bf16, the description's tiles at each head dim, through torch's ``aten._flash_attention_forward``): one Q block
of Br queries on each of k x SMs query heads, all on one kv head (batch 1; the K/V tiles stay in L2), against 16 and
64 K/V tiles; k = 1 .. the block's residency on this GPU's profile:

- ``resident_step.fa2.d<d>_<Br>x<Bc>.<k>``: (t(64 tiles) - t(16)) / 48, non-causal (no step masked: whole tiles);
- ``masked_step.fa2.d<d>_<Br>x<Bc>.<k>``: calls at 2 and 4 K/V tiles (``mask_tiles``) causal (bottom-right: the block
  sees every key, its last ceil(Br / Bc) steps masked, as many as it has) less the same non-causal, over the masked
  steps the causal calls run beyond the others (:func:`iosim.calibrate.forward_step.extra_masked`, the fa2
  model's count);
- not where FlashAttention-2 would split the keys (d = 256, one block an SM: 132 Q blocks of 64 rows, under its
  heuristic's 80% of two an SM; its split-KV kernel runs then, :mod:`iosim.timing.decode`);
- both again with ``-varlen`` for the varlen kernel (cumulative lengths of one sequence: another instantiation, its
  lengths never whole tiles, so its non-causal block masks its last step and its causal one ceil(Br / Bc) + 1);
- its split-KV path (what torch runs where the grid would not fill the GPU: decode, a few heads; Q blocks of 64 rows
  against Bc = 256 / 128 / 64 keys a tile at d = 64 / 128 / 256, then a combine kernel, :mod:`iosim.timing.decode`)
  at half an SM's count of query heads (:data:`SPLIT_HEADS_PER_SM`) of 64 queries on one kv head, which
  FlashAttention-2's heuristic cuts into 4 splits (one wave of two blocks an SM), at :data:`SPLIT_TILES` tiles a
  split: ``resident_step.fa2.d<d>_64x<Bc>-splitkv.2`` from the calls at 8 and 32 tiles a split;
  ``call_fixed.fa2.bf16-splitkv.<d>``, what the call costs beyond its steps and the combine's reads of the partial
  outputs at L2's rate (both launches, a block's start and its partial output's store, the combine's chain): the
  call at 2 tiles a split less its 2 steps and those reads.
  Composed, the path was predicted 2-5 us fast on its short calls (H200, 2026-11-28: one head of 2048 queries at
  d = 128 -17.7%, decode of 256-4096 keys -10 to -13%).

Each time is the median of CALLS calls behind a busy kernel after a rest, as the other steps
(:mod:`iosim.calibrate.forward_step`). Measured (H200, 2026-11-28): the composed step 2% under to 19% over it, a
masked step 0.3-0.8 us more dense and 0.5-2.1 us more varlen; two runs agree within 0.15 us (docs/timing.md, "The
masked steps, measured").
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from iosim.blocks import cdiv
from iosim.calibrate.backward_step import CALLS, REST_S, torch_or_none
from iosim.calibrate.forward_step import (
    TILES,
    builtin_profile,
    extra_masked,
    mask_tiles,
    masked_from,
    residency_on,
    step_from,
)
from iosim.calibrate.rates_kernels import Bench, Measured, busy_timer
from iosim.timing.decode import SPLIT  # the split-KV path's key in calibration.forward

KERNEL = "fa2"  # the timing description the steps belong to
INSTANTIATIONS = ("", "varlen")  # the dense kernel (mha_fwd) and the packed-sequence one (mha_varlen_fwd)
SPLIT_HEADS_PER_SM = 0.5  # query heads of one 64-row Q block per SM: its heuristic then takes 4 splits (two an SM)
SPLIT_TILES = (2, 8, 32)  # K/V tiles a split: the fixed part's call, then the step's two


def _call(torch, heads: int, n: int, nk: int, d: int, causal: bool, varlen: bool) -> Callable[[], Any]:
    """torch's FlashAttention-2 forward on random bf16 inputs, ``heads`` query heads of ``n`` queries on one kv
    head of ``nk`` keys, dense or as one packed sequence (``varlen``), ready to time."""
    shape = (n, heads, d) if varlen else (1, n, heads, d)
    q = torch.randn(*shape, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(*shape[:-3], nk, 1, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    cu = [torch.tensor([0, m], device="cuda", dtype=torch.int32) for m in (n, nk)] if varlen else [None, None]
    fwd = torch.ops.aten._flash_attention_forward
    return lambda: fwd(q, k, v, cu[0], cu[1], n, nk, 0.0, causal, False)


def _times(seconds: Callable[[Any], float], torch, heads: int, tc, d: int, tiles: tuple[int, ...], causal: bool,
           varlen: bool) -> list[float]:
    """Seconds of the calls of one Q block of Br queries on each of ``heads`` query heads against each count of K/V
    ``tiles``."""
    return [seconds(_call(torch, heads, tc.block_q, m * tc.block_kv, d, causal, varlen)) for m in tiles]


def _splits(desc, sms: int, k: int, d: int) -> bool:
    """Whether FlashAttention-2's dense forward takes its split-KV kernel for k x SMs Q blocks of the description's
    Br at head dim ``d`` (:func:`iosim.timing.decode.num_splits`, the fewest keys called: more blocks than splits)."""
    from iosim.timing.decode import num_splits

    tc, sk = desc.tiles_for(d), desc.split_kv
    work = k * sms * cdiv(tc.block_q, sk.block_q)
    return num_splits(work, 2 * sms, cdiv(mask_tiles(tc)[0] * tc.block_kv, sk.block_kv[d])) > 1


def fa2_part(b: Bench, cp, report: Callable[[Measured, str], None]) -> None:
    """Measure ``forward.resident_step.fa2`` and ``forward.masked_step.fa2`` (module docstring) at each head dim of
    the description, dense and varlen, k = 1 .. residency, then its split-KV path (:func:`split_part`); said and
    skipped without torch or below sm_80."""
    from iosim.timing import load_kernel
    from iosim.timing.fa2 import instantiation_key

    torch = torch_or_none()
    if torch is None or int(cp.cuda.Device().compute_capability) < 80:
        print("forward: fa2 skipped (torch's FlashAttention-2 needs torch with CUDA and compute capability 8.0)",
              flush=True)
        return
    seconds = busy_timer(b, cp, CALLS, warmup=2, rest_s=REST_S)
    desc, profile = load_kernel(KERNEL), builtin_profile(cp)
    for instantiation in INSTANTIATIONS:
        for d in sorted(desc.tiles):
            tc = desc.tiles_for(d)
            key = instantiation_key(d, tc.block_q, tc.block_kv, instantiation)
            for k in range(1, residency_on(desc, tc, d, profile) + 1):
                if not instantiation and _splits(desc, b.sms, k, d):
                    print(f"forward.resident_step.{KERNEL}.{key}.{k}: skipped (FlashAttention-2 splits the keys of "
                          f"{k * b.sms} Q blocks of {tc.block_q} rows: its plain kernel never runs {k} an SM)",
                          flush=True)
                    continue
                timed = partial(_times, seconds, torch, k * b.sms, tc, d, varlen=bool(instantiation))
                steps, plain, causal = timed(TILES, False), timed(mask_tiles(tc), False), timed(mask_tiles(tc), True)
                report(Measured(("forward", "resident_step", KERNEL, key, k), step_from(*steps), "s",
                                _method(b, tc, instantiation, False)),
                       f"{steps[0] * 1e6:.1f} us at {TILES[0]} K/V tiles, {steps[1] * 1e6:.1f} us at {TILES[1]}")
                report(Measured(("forward", "masked_step", KERNEL, key, k),
                                masked_from(plain, causal, [extra_masked(desc, tc, d, m, bool(instantiation))
                                                            for m in mask_tiles(tc)]), "s",
                                _method(b, tc, instantiation, True)),
                       " / ".join(f"{t * 1e6:.2f}" for t in (*plain, *causal)) + f" us at {mask_tiles(tc)} K/V tiles, "
                       "plain then causal")
                torch.cuda.empty_cache()
    split_part(b, torch, seconds, report, profile)


def split_part(b: Bench, torch, seconds: Callable[[Any], float], report: Callable[[Measured, str], None],
               profile) -> None:
    """``resident_step.fa2.<key>-splitkv.<k>`` and ``call_fixed.fa2.bf16-splitkv.<d>`` (module docstring) at each head
    dim of the description's split-KV kernel; a geometry the heuristic does not cut as planned, or a GPU without a
    built-in profile (``profile`` None: the L2 rate the combine's reads are priced at), is said and skipped."""
    from iosim.timing import load_kernel
    from iosim.timing.decode import num_splits
    from iosim.timing.fa2 import instantiation_key
    from iosim.timing.rates import rates

    if profile is None:
        print(f"forward.call_fixed.{KERNEL}.bf16-{SPLIT}: skipped (no built-in profile for this GPU)", flush=True)
        return
    l2 = rates(profile, "bf16").l2

    desc = load_kernel(KERNEL)
    sk, heads = desc.split_kv, round(SPLIT_HEADS_PER_SM * b.sms)
    for d in sorted(desc.tiles):
        bc, rows = sk.block_kv[d], sk.block_q
        splits = {m: num_splits(heads, 2 * b.sms, 4 * m) for m in SPLIT_TILES}  # 4 m K/V tiles: m a split at 4
        key = instantiation_key(d, rows, bc, SPLIT)
        if set(splits.values()) != {4} or 4 * heads > 2 * b.sms:
            print(f"forward.resident_step.{KERNEL}.{key}: skipped (the heuristic cuts {heads} Q blocks into "
                  f"{sorted(set(splits.values()))} splits here, not 4)", flush=True)
            continue
        k = cdiv(4 * heads, b.sms)
        t = {m: seconds(_call(torch, heads, rows, 4 * m * bc, d, False, False)) for m in SPLIT_TILES}
        step = (t[SPLIT_TILES[2]] - t[SPLIT_TILES[1]]) / (SPLIT_TILES[2] - SPLIT_TILES[1])
        how = (f"torch's FlashAttention-2 forward, its split-KV path (64-row Q blocks, its Bc at each head dim: "
               f"{', '.join(f'{b_} at d = {d_}' for d_, b_ in sorted(sk.block_kv.items()))}; bf16), {heads} query "
               f"heads of {rows} queries on one kv head, cut into 4 splits ({4 * heads} blocks, {k} on each SM), "
               f"each time the median of {CALLS} calls behind a busy kernel after {REST_S} s idle")
        report(Measured(("forward", "resident_step", KERNEL, key, k), max(step, 1e-12), "s",
                        f"{how}: (time at {SPLIT_TILES[2]} K/V tiles a split - time at {SPLIT_TILES[1]}) / "
                        f"{SPLIT_TILES[2] - SPLIT_TILES[1]} (iosim/calibrate/fa2_step.py); by instantiation, then k"),
               " / ".join(f"{t[m] * 1e6:.1f}" for m in SPLIT_TILES) + f" us at {SPLIT_TILES} K/V tiles a split")
        partial = heads * rows * 4 * (d + 1) * 4  # fp32 partial O and lse of each split, read by the combine
        fixed = t[SPLIT_TILES[0]] - SPLIT_TILES[0] * step - partial / l2
        report(Measured(("forward", "call_fixed", KERNEL, f"bf16-{SPLIT}", d), max(fixed, 1e-9), "s",
                        f"{how}: the call at {SPLIT_TILES[0]} K/V tiles a split less its {SPLIT_TILES[0]} steps and "
                        "the combine's reads of the partial outputs at L2's rate (iosim/calibrate/fa2_step.py); by "
                        "head dim"), "")
        torch.cuda.empty_cache()


def _method(b: Bench, tc, instantiation: str, masked: bool) -> str:
    """The source of a ``resident_step`` (``masked``: ``masked_step``) measurement."""
    how = " (cumulative lengths of one packed sequence)" if instantiation else ""
    tiles = mask_tiles(tc) if masked else TILES
    calls = (f"k x {b.sms} query heads of Br queries on one kv head (k blocks on each SM, K/V in L2), at "
             f"{tiles[0]} and {tiles[1]} K/V tiles, each the median of {CALLS} calls behind a busy kernel after "
             f"{REST_S} s idle")
    what = ("(causal - non-causal) / the masked steps that adds, summed over the two" if masked
            else f"(time at {TILES[1]} - time at {TILES[0]}) / {TILES[1] - TILES[0]}, non-causal")
    return (f"torch's FlashAttention-2 forward{how} at Br x Bc = {tc.block_q} x {tc.block_kv}, bf16, {calls}: "
            f"{what} (iosim/calibrate/fa2_step.py); by instantiation, then k")
