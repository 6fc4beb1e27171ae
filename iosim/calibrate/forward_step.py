"""``calibration.forward``: what iosim's forward kernels spend on one K/V step, as timed on this GPU. For its
FlashAttention-3-design forward (kernels/flash3_fwd.cu, the ``iosim-flash3`` description; Hopper): a thread block's
step, and what a tile and a call cost beyond their steps, for its 16-bit and fp8 (e4m3) instantiations and its
16-bit Local one (a sliding window's; timed with a window wider than the keys) at each head dim. For its
FlashAttention-2 forward (``iosim-flash2``): an SM's step at each tile and residency (last paragraph).

Why it is measured: the fa3 model (:mod:`iosim.timing.fa3`) composes a step from the chip's rates (the two GEMMs
at the measured wgmma rate, the softmax at the exp and fp32 rates, overlapped as FA3's ping-pong does), and that
composition prices the fp8 instantiation at d = 256 a quarter faster than it runs: the time record's fp8 rows at
d = 256, N >= 4096, are measured 23-26% slower than predicted on an H100 (the model puts the tile at 68% of the
measured fp8 wgmma rate; the kernel reaches 52%), those at d = 128 within 3%. What the kernel spends beyond the
rates is its code's (Nsight Compute: it issues at half the peak rate, held by dependency stalls, at d = 128 and
256 alike; docs/timing.md, fp8), so the kernel's own step is timed.

How: one Q tile of Br queries on each SM, all reading one kv head (``heads`` = SMs query heads on one kv head,
batch 1, so the persistent grid holds one tile a block and the K/V tiles stay in L2), no mask; the keys grow from
16 to 64 K/V tiles, so each block runs 48 more steps whatever its fixed costs (the launch, Q, the first tile, O's
store) are: step = (t1(64 Bc) − t1(16 Bc)) / 48. Then one and two Q tiles on each SM (twice the heads) at
SHORT_TILES = 4 K/V tiles: what a further tile costs beyond its steps, ``forward.tile_fixed`` = t2(4 Bc) − t1(4 Bc)
− 4 · step (its Q load, its first K/V tile's wait, O / l and O's store, as far as the tile's own steps do not hide
them), and what the call costs beyond its tiles, ``forward.call_fixed`` = t1(4 Bc) − 4 · step − tile_fixed (the
launch, the grid's start, the first loads' latency, the last stores' drain). Short tiles, because what a tile costs
beyond its steps shrinks as its steps grow and hide more of it, so it counts, and is best measured, where tiles are
short (cuDNN's fp8 forward, H200, 2026-11-28: a further Q tile less its steps 1.6-1.8 us at 1, 2 and 4 K/V tiles at
every head dim, -0.6 to 1.6 us at 16; at 16 it is the small difference of calls 40-150 us long). Each time is the
median of CALLS calls queued behind a busy kernel after a rest (a few milliseconds of tensor work, before the
board's power limiter acts). The fp8 inputs are quantized once beforehand (``iosim.gpu.quantize_fp8``), as the fp8
time record times the kernel alone.

cuDNN's fused forward (fp8, and bf16 at MLA prefill's widths) is measured the same way by
:mod:`iosim.calibrate.cudnn_step`.

``calibration.forward.resident_step.iosim-flash2``: the step of iosim's FlashAttention-2 forward (kernels/flash_fwd.cu,
any GPU of compute capability 8.0 or more), bf16, at every tile it is compiled with (its description's and the
others `iosim tune` ranks), with k = 1 .. its residency blocks on each SM (k·SMs query heads of one Q tile on one
kv head, 16 then 64 K/V tiles): seconds an SM spends on one step of each of its k blocks. The fa2 model
(:mod:`iosim.timing.fa2`) composes that step from the chip's rates, the warps' phases in sequence and the one fitted
overlap between blocks; measured (H100, 2026-11-28), the composition is 16% slow for a lone block of the default
tiles (its warps issue their softmax while their mma.sync run) and 14-22% fast for the 64-row tiles at d = 64,
which is where `iosim tune` chose wrong. The residency is the model's on this GPU's built-in profile
(:func:`iosim.calibrate.device.guess_profile`); where none fits, k = 1 only. The same for the kernel's packed-sequence
instantiations, each a compile of its own with its own per-step work (the sequence's bounds; the paged one's
block-table lookups): the varlen one at the tiles packed calls run (``d128_128x32-varlen``: one packed sequence of
Br queries and its keys), the paged kernel at its one tile: its row lists with pages of 16 tokens
(``d128_64x64-paged16``) and its PageTiles instantiation with pages of 64 (``-paged64``, where it exists); the keys
in pages in a random order. H100, 2026-11-28: the varlen step 0-9% and the paged one 2-15% longer than the dense
one's at the same tiles (the paged kernel's version then, before PageTiles).
``calibration.forward.masked_step.iosim-flash2``: what its mask pass (the tiles holding a key past the causal
diagonal or the keys' end) adds to a tile, at the dense and varlen keys and residencies: calls at :func:`mask_tiles`
K/V tiles causal (bottom-right) less plain, over the tiles masked (:func:`extra_masked`; H200, 2026-11-28: 0-0.5 us a
tile).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

from iosim.blocks import cdiv
from iosim.calibrate.backward_step import CALLS, REST_S
from iosim.calibrate.device import device_facts, guess_profile
from iosim.calibrate.rates_kernels import Bench, Measured, RatesError, busy_timer
from iosim.hardware.gpu import get_profile

KERNEL = "iosim-flash3"  # the timing description the steps belong to
FLASH2 = "iosim-flash2"  # the FlashAttention-2 forward's description: its steps at each tile and residency
TILES = (16, 64)  # K/V tiles of the step's two calls
SHORT_TILES = 4  # K/V tiles of the calls the tile and call parts are taken from (module docstring)
# the flash3 instantiations measured: by input type, "bf16-local" (a window's Local instantiation, bf16, its window
# wider than the keys: no step masked, what its own code costs beyond the plain one's) and "bf16-varlen" (packed
# sequences' Varlen instantiation, one sequence: its step only; its tile and call parts, a long sequence's, are not
# what short sequences' tiles cost, docs/timing.md "packed sequences")
KINDS = ("bf16", "fp8", "bf16-local", "bf16-varlen")
MASKED = ("", "varlen")  # flash2's instantiations whose masked step is measured (the paged one's is not)
# page sizes the flash2 paged kernel's step is measured at: its row lists on pages of 16, its PageTiles instantiation
# on pages of 64 (iosim.timing.fa2.paged_step takes the one that runs)
PAGES = (16, 64)


def step_from(t1: float, t2: float) -> float:
    """Seconds a step from the calls at TILES[0] and TILES[1] K/V tiles."""
    return max(t2 - t1, 1e-12) / (TILES[1] - TILES[0])


def mask_tiles(tc) -> tuple[int, int]:
    """K/V tiles of the calls a masked step is taken from: short ones, so that the causal call's masked steps are
    much of it (at TILES the difference of 1 to 3 us sat inside the 100-200 us calls' noise: torch's
    FlashAttention-2, H200, -2.4 to +3.5 us between the two lengths), with keys for every query of the block (c =
    ceil(Br / Bc), at least 2) and two more: (c, c + 2)."""
    c = max(2, cdiv(tc.block_q, tc.block_kv))
    return c, c + 2


def masked_from(plain: list[float], causal: list[float], extra: list[int]) -> float:
    """Seconds a masked step adds, from the calls at :func:`mask_tiles` without and with the causal mask and the
    masked steps the causal ones run beyond the others (``extra``, :func:`extra_masked`): their differences over
    those steps, summed; at least 1 ps (a measurement noisier than the part)."""
    diff = sum(c - p for p, c in zip(plain, causal, strict=True))
    return max(diff / sum(extra), 1e-12)


def extra_masked(desc, tc, d: int, tiles: int, varlen: bool) -> int:
    """Masked steps a causal Q block of Br queries against ``tiles`` K/V tiles runs beyond a non-causal one, by the
    description's mask (:func:`iosim.timing.fa2.masked`; FlashAttention-2's loop: ceil(Br / Bc) and, varlen, one
    more, at most its steps, less the non-causal block's one where varlen; kernels/flash_fwd.cu's: the tiles past the
    diagonal)."""
    from iosim import AttentionProblem
    from iosim.timing.fa2 import masked

    n = np.array([tiles])
    p = AttentionProblem(batch=1, heads=1, seq_len=tc.block_q, kv_len=tiles * tc.block_kv, head_dim=d, dtype="bf16")
    causal = p.model_copy(update={"causal": True})
    return int(masked(causal, tc, n, varlen, desc.masking)[0] - masked(p, tc, n, varlen, desc.masking)[0])


def fixed_from(t1: float, t2: float, *short: float) -> tuple[float, float]:
    """(tile_fixed, call_fixed) from the calls of one Q tile a block at TILES[0] and TILES[1] K/V tiles and of
    1, 2, .. Q tiles a block at SHORT_TILES (``short``; module docstring): the line through the short calls, its
    slope a tile (tile_fixed + SHORT_TILES steps), its intercept call_fixed; each at least 1 ns (a measurement
    noisier than the part)."""
    step = step_from(t1, t2)
    slope, intercept = np.polyfit(np.arange(1, len(short) + 1), short, 1)
    return max(float(slope) - SHORT_TILES * step, 1e-9), max(float(intercept), 1e-9)


def _call(cp, heads: int, n: int, nk: int, d: int, kind: str = "bf16", schedule: str = "flash3",
          tiles: tuple[int, int] | None = None) -> Callable[[], Any]:
    """iosim's ``schedule`` forward on random inputs, ``heads`` query heads on one kv head, at ``tiles`` (Br, Bc;
    flash2, None: the default), ready to time; ``kind`` (:data:`KINDS`): bf16, quantized to e4m3 once ("fp8"),
    bf16 through the Local instantiation ("bf16-local"), or the heads' queries and the keys as one packed sequence
    through the Varlen instantiation ("bf16-varlen") or flash2's Paged one, keys in pages of p tokens
    ("bf16-paged<p>"); "-causal" after any, the causal mask (bottom-right)."""
    import ml_dtypes

    from iosim import gpu

    causal, kind = kind.endswith("-causal"), kind.removesuffix("-causal")

    bf16 = ml_dtypes.bfloat16
    q = cp.random.standard_normal((1, n, heads, d), dtype=cp.float32).astype(bf16)
    k, v = (cp.random.standard_normal((1, nk, 1, d), dtype=cp.float32).astype(bf16) for _ in range(2))
    if kind == "fp8":
        bq, bkv = gpu.fp8_blocks(d)
        q, k, v = gpu.quantize_fp8(q, block=bq), gpu.quantize_fp8(k, block=bkv), gpu.quantize_fp8(v, block=bkv,
                                                                                                   transpose=True)
    opts = gpu.AttentionOptions(block_q=tiles[0], block_kv=tiles[1]) if tiles else None
    if kind.endswith("-local"):  # the Local instantiation, every key inside the window
        opts = gpu.AttentionOptions(window=(nk, nk))
    packing = kind.partition("-")[2]
    if packing == "varlen" or packing.startswith("paged"):
        return _packed(q[0], k[0], v[0], packing, schedule, tiles, causal)
    return lambda: gpu.attention(q, k, v, causal=causal, schedule=schedule, options=opts)


def _packed(q, k, v, packing: str, schedule: str, tiles: tuple[int, int] | None, causal: bool = False
            ) -> Callable[[], Any]:
    """q (n, heads, d), k and v (nk, 1, d) as one packed sequence through the Varlen instantiation (``packing``
    "varlen", at ``tiles`` where given) or, "paged<p>", flash2's Paged one with the keys in pages of p tokens in a
    random order (its one tile per head dim); ``causal``: bottom-right."""
    from iosim import gpu

    cu_q, cu_k = [0, q.shape[0]], [0, k.shape[0]]
    if packing.startswith("paged"):
        page = int(packing.removeprefix("paged"))
        kc, vc, table = gpu.paged_kv(k, v, cu_k, page, seed=page)
        batch = gpu.varlen_batch(cu_q, cu_k, block_table=table, page_size=page)
        return lambda: gpu.attention_varlen(q, kc, vc, batch, causal=causal, schedule=schedule)
    batch = gpu.varlen_batch(cu_q, cu_k)
    opts = gpu.AttentionOptions(block_q=tiles[0], block_kv=tiles[1]) if tiles else None
    return lambda: gpu.attention_varlen(q, k, v, batch, causal=causal, schedule=schedule, options=opts)


def forward_part(b: Bench, cp, report: Callable[[Measured, str], None]) -> None:
    """Measure ``forward.resident_step`` of ``iosim-flash2`` (bf16, each tile and residency, its dense, varlen and
    paged instantiations), then ``forward.step``, ``forward.tile_fixed`` and ``forward.call_fixed`` of
    ``iosim-flash3`` by input type and of its Local instantiation (its Varlen one's step alone), at each head dim of
    its tiles (Hopper only; elsewhere said and skipped)."""
    seconds = busy_timer(b, cp, CALLS, warmup=2, rest_s=REST_S)
    flash2_part(b, cp, report, seconds)
    if not b.hopper:
        print("forward: flash3 skipped (iosim's flash3 forward runs on Hopper, sm_90a, only)", flush=True)
        return
    flash3_part(b, cp, report, seconds, KINDS)


def flash3_part(b: Bench, cp, report: Callable[[Measured, str], None], seconds: Callable[[Any], float],
                kinds: tuple[str, ...]) -> None:
    """``forward.step``, ``tile_fixed`` and ``call_fixed`` of ``iosim-flash3`` for each of ``kinds`` (:data:`KINDS`)
    at each head dim of its tiles (Hopper)."""
    from iosim.timing import load_kernel

    desc = load_kernel(KERNEL)
    for kind in kinds:
        dtype, local, varlen = kind.split("-")[0], kind.endswith("-local"), kind.endswith("-varlen")
        fp8 = dtype == "fp8"
        for d in sorted(desc.fp8_tiles if fp8 else desc.tiles):
            tc = desc.tiles_for(d, dtype)
            shapes = [(b.sms, n * tc.block_kv) for n in TILES]
            if not varlen:  # the tile and call parts (the Varlen instantiation's step alone)
                shapes += [(m * b.sms, SHORT_TILES * tc.block_kv) for m in (1, 2)]
            times = _timed(f"forward.step.{KERNEL}.{kind}.{d}", seconds,
                           [partial(_call, cp, h, tc.block_q, nk, d, kind) for h, nk in shapes])
            if times is None:
                continue
            what = (f"iosim's flash3 forward ({KERNEL}'s tiles), {dtype} inputs"
                    f"{' (quantized beforehand)' if fp8 else ''}, "
                    f"{_mask_text(local, varlen)}, "
                    f"{b.sms} query heads of Br queries on one kv head (a Q tile on each SM, K/V in L2): "
                    f"{_method()}; by head dim")
            _report_parts(report, (KERNEL, kind, d), times, tc, what, step_only=varlen)
            cp.get_default_memory_pool().free_all_blocks()


def _mask_text(local: bool, varlen: bool) -> str:
    """How a flash3 instantiation is called, for the measurement's source."""
    if local:
        return "its Local instantiation with a window wider than the keys"
    return "its Varlen instantiation, one packed sequence, no mask" if varlen else "no mask"


def _report_parts(report: Callable[[Measured, str], None], key: tuple, times: list[float], tc, what: str,
                  step_only: bool = False) -> None:
    """The step, tile_fixed and call_fixed of ``key`` (kernel, kind, head dim) from the calls' ``times``: one Q tile
    an SM at TILES[0] and TILES[1] K/V tiles, then 1, 2, .. Q tiles an SM at SHORT_TILES (``step_only``: the
    step)."""
    report(Measured(("forward", "step", *key), step_from(*times[:2]), "s", what),
           f"{times[0] * 1e6:.1f} us at {TILES[0]} K/V tiles, {times[1] * 1e6:.1f} us at {TILES[1]} "
           f"(Br x Bc = {tc.block_q} x {tc.block_kv})")
    if step_only:
        return
    tile, call = fixed_from(*times)
    most = len(times) - 2  # Q tiles an SM in the last call
    how = ("one and two Q tiles on each SM (twice the heads) at {n} K/V tiles: the two-tile call's time - the "
           "one-tile call's - {n} steps" if most == 2 else "1 to {m} Q tiles on each SM (as many times the heads) "
           "at {n} K/V tiles: the slope of the line through their times, less {n} steps").format(n=SHORT_TILES,
                                                                                                  m=most)
    report(Measured(("forward", "tile_fixed", *key), tile, "s",
                    f"the same kernel and inputs, {how} (iosim/calibrate/forward_step.py); by head dim"),
           ", ".join(f"{t * 1e6:.1f}" for t in times[2:]) + f" us with 1..{most} Q tiles an SM")
    report(Measured(("forward", "call_fixed", *key), call, "s",
                    f"the same calls' line at no Q tile: the one-tile call at {SHORT_TILES} K/V tiles less its "
                    f"{SHORT_TILES} steps and one tile_fixed (iosim/calibrate/forward_step.py); by head dim"), "")


def flash2_part(b: Bench, cp, report: Callable[[Measured, str], None], seconds: Callable[[Any], float]) -> None:
    """``forward.resident_step.iosim-flash2`` at each compiled tile of each head dim and each count of blocks an SM
    up to its residency, then of its varlen and paged instantiations at the tiles they run (module docstring)."""
    from iosim.launch.varlen import FLASH_PAGED_TILES, varlen_default_tiles
    from iosim.schedules.flash2 import PAGE_TILES_HEAD_DIMS
    from iosim.timing import load_kernel
    from iosim.timing.fa2 import instantiation_key

    if int(cp.cuda.Device().compute_capability) < 80:
        print("forward: flash2 skipped (iosim's flash2 forward needs compute capability 8.0)", flush=True)
        return
    desc, profile = load_kernel(FLASH2), builtin_profile(cp)

    def resident_steps(tc, d: int, instantiation: str = "") -> None:
        """The steps of one instantiation at tiles ``tc`` (``instantiation``: "" the dense one, "varlen" or
        "paged<page size>"), k = 1 .. its residency."""
        key, tiles = instantiation_key(d, tc.block_q, tc.block_kv, instantiation), (tc.block_q, tc.block_kv)
        for k in range(1, residency_on(desc, tc, d, profile) + 1):
            kind = f"bf16-{instantiation}" if instantiation else "bf16"
            times = _timed(f"forward.resident_step.{FLASH2}.{key}.{k}", seconds,
                           [partial(_call, cp, k * b.sms, tc.block_q, n * tc.block_kv, d, kind, "flash2", tiles)
                            for n in TILES])
            if times is None:
                break
            report(Measured(("forward", "resident_step", FLASH2, key, k), step_from(*times), "s",
                            _flash2_method(b, tc, instantiation)),
                   f"{times[0] * 1e6:.1f} us at {TILES[0]} K/V tiles, {times[1] * 1e6:.1f} us at {TILES[1]}")
            if instantiation in MASKED:
                masked_part(k, tc, d, instantiation)
            cp.get_default_memory_pool().free_all_blocks()

    def masked_part(k: int, tc, d: int, instantiation: str) -> None:
        """``masked_step`` of the instantiation at tiles ``tc`` and k blocks an SM: causal less plain at
        :func:`mask_tiles` over the tiles the mask pass runs on beyond the plain call's (none: whole tiles)."""
        key, tiles = instantiation_key(d, tc.block_q, tc.block_kv, instantiation), (tc.block_q, tc.block_kv)
        kind = f"bf16-{instantiation}" if instantiation else "bf16"
        times = _timed(f"forward.masked_step.{FLASH2}.{key}.{k}", seconds,
                       [partial(_call, cp, k * b.sms, tc.block_q, m * tc.block_kv, d, kind + mask, "flash2", tiles)
                        for mask in ("", "-causal") for m in mask_tiles(tc)])
        if times is None:
            return
        extra = [extra_masked(desc, tc, d, m, bool(instantiation)) for m in mask_tiles(tc)]
        report(Measured(("forward", "masked_step", FLASH2, key, k), masked_from(times[:2], times[2:], extra), "s",
                        _flash2_method(b, tc, instantiation, masked=True)),
               " / ".join(f"{t * 1e6:.2f}" for t in times) + f" us at {mask_tiles(tc)} K/V tiles, plain then causal")

    for d in sorted(desc.tiles):
        own = desc.tiles_for(d)
        for tc in (own, *(own.with_tiles(o.block_q, o.block_kv) for o in own.others)):
            resident_steps(tc, d)
    for d in sorted(desc.tiles):
        own = desc.tiles_for(d)
        resident_steps(own.with_tiles(*varlen_default_tiles(d, False)), d, "varlen")
        for page in PAGES:  # pages of 64: the PageTiles instantiation's step, where it exists
            if page == 64 and d not in PAGE_TILES_HEAD_DIMS:
                continue
            resident_steps(own.with_tiles(*FLASH_PAGED_TILES[d]), d, f"paged{page}")


def _flash2_method(b: Bench, tc, instantiation: str, masked: bool = False) -> str:
    """The source of a ``resident_step`` (``masked``: ``masked_step``) measurement of ``instantiation`` at tiles
    ``tc``."""
    page = instantiation.removeprefix("paged")
    how = {"": "", "varlen": ", its varlen instantiation (one packed sequence)"}.get(
        instantiation, f", its paged instantiation{' PageTiles' if page == '64' else ''} (one packed sequence, keys "
                       f"in pages of {page} tokens in a random order)")
    first, last = mask_tiles(tc)
    what = (f"causal (bottom-right) less plain at {first} and {last} K/V tiles, each the median of {CALLS} calls "
            f"behind a busy kernel after {REST_S} s idle, over the tiles its mask pass runs on beyond the plain calls' "
            "(iosim/calibrate/forward_step.py)" if masked else _method())
    return (f"iosim's flash2 forward at Br x Bc = {tc.block_q} x {tc.block_kv}{how}, bf16, "
            f"{'' if masked else 'no mask, '}k x {b.sms} query heads of Br queries on one kv head (k blocks on each "
            f"SM, K/V in L2): {what}; by instantiation, then k")


def _method() -> str:
    """How a step is taken from its two calls, for the measurement's source."""
    return (f"(time at {TILES[1]} K/V tiles - time at {TILES[0]}) / {TILES[1] - TILES[0]}, each the median of {CALLS} "
            f"calls behind a busy kernel after {REST_S} s idle (iosim/calibrate/forward_step.py)")


def _timed(label: str, seconds: Callable[[Any], float], makers: list[Callable[[], Any]]) -> list[float] | None:
    """Each call ``makers`` build, timed in turn; None where one cannot be built or run on this GPU (an
    instantiation whose shared memory does not fit), said with the exception's first line under ``label``."""
    try:
        return [seconds(make()) for make in makers]
    except Exception as exc:
        print(f"{label}: skipped ({type(exc).__name__}: {str(exc).splitlines()[0][:120]})", flush=True)
        return None


def builtin_profile(cp):
    """This GPU's built-in profile (by its name), or None."""
    try:
        return get_profile(guess_profile(device_facts(cp)["device"]))
    except RatesError:
        return None


def residency_on(desc, tc, d: int, profile) -> int:
    """Blocks of the instantiation resident on an SM by the fa2 model on ``profile`` (1 without one)."""
    from iosim.timing.fa2 import residency

    return residency(tc, desc, d, 2, profile) if profile is not None else 1
