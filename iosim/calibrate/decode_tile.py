"""``calibration.decode``: what one warp of iosim's Flash-Decoding kernel (kernels/flash_decode.cu) spends on a tile
of 16 keys when no load keeps it waiting (``decode.tile``), what a call spends beyond its tiles (``decode.fixed_dram``,
``decode.fixed_alone``), and what a round of the combine kernel's split loop costs (``decode.combine_round``) and
what a combine call costs beyond its rounds (``decode.combine_fixed``), on this GPU.

Why it is measured: a warp's tile is a dependent chain (ldmatrix, the QK^T multiplies, the row max and sum across
lanes, exp2, the rescale of O, the PV multiplies; on an fp8 cache the conversion of K and V to fp16 before them), and
with 1-2 warps on each scheduler the warp waits on each step's result more than it issues: Nsight Compute on an H100
(2026-11-27, the decode time record's shapes) counts 3.3-3.6 cycles between a warp's instructions wherever the
kernel is not waiting on DRAM (16 new tokens a sequence, d = 256, grids of a few blocks), with the issue slots
58% busy at most. No rate of the chip (``mma_sync``, ``exp``, ``fp32`` throughputs) gives that time, so the kernel's
own loop is timed.

How: one block on every SM, then two, and so on to as many as an SM holds (``batch`` = k · SMs sequences of one kv
head, one split each, so the grid is one block per sequence; with two blocks the warps on a scheduler share its
issue slots and a warp's tile takes 1.2-1.6x as long on an H100; an fp8 cache's blocks fit three an SM at d = 128,
the count the split choice fills, :mod:`iosim.timing.decode_split`), every sequence's block table pointing at the
same pages, so the cache (at most 8 MiB) sits in L2 and each warp's ring is full when it asks; 8 query heads on the
kv head and 1 new token (one stripe of 16 rows) or 4 (32 rows: two stripes). Each sequence holds ``N1`` and then
``N2`` keys; the time of a call (median CUDA-event time of ``CALLS`` calls queued behind a busy kernel) grows by (N2
− N1) / 64 tiles of each warp, whatever the block's fixed costs (its start, Q, the first tiles' latency, the warps'
merge) are: tile = (t(N2) − t(N1)) · 64 / (N2 − N1). Those fixed costs are measured as calls meet them: the same
calls with each sequence on pages of its own (a cache of up to 1.1 GB, in DRAM), ``decode.fixed_dram`` = t(N1) − N1
/ 64 · (t(N2) − t(N1)) · 64 / (N2 − N1) of those calls (the call's launch included), and ``decode.fixed_alone`` the
same with a grid of 4 blocks: a block that starts beside a block on every other SM costs more than one alone. (Files
measured before 2026-11-29 hold ``decode.fixed``, the intercept of the L2 calls: it missed what a full grid's first
loads cost when every block sends them to DRAM at once. An H200's fixed parts over DRAM differed from it by −0.8 to
+2.5 us at one block an SM and +0.6 to +5.0 us at the most an SM holds, and the decode time record's fp8 rows, 3-4
blocks an SM, had all come out fast.) Both caches: 16-bit (fp16 q and cache; a bf16 call runs the same instructions)
and e4m3 (fp16 q, device scales of 1).

The combine's round: its loop merges :func:`iosim.launch.decode.combine_unroll` splits a round, their loads issued
together; a round is one trip to L2 and back, but for 8 warp-wide rows of 512 B and their lse, not the one 8-byte
load of ``latency.l2`` (an H100 with one sequence of 32K keys, 128 splits, measured about 3x that per round). The
combine is measured where it runs, after the split kernel (on sm_90 as its programmatic dependent, its start
overlapping the split kernel's last blocks): a decode call of one sequence (8 query heads: 2 combine blocks) in 128
and in 8 splits of ``PAGE`` keys is timed whole and with its split kernel alone
(:func:`iosim.gpu.flash_decode.split_kernel_alone`); the combine's part is the difference, and
``decode.combine_round`` how it grows over the rounds between the two. ``decode.combine_fixed`` is what the combine
adds beyond its rounds where the split kernel fills the GPU, as a split choice makes it: as many sequences in
``FULL_SPLITS`` splits as make the split kernel's blocks fill every SM once (blocks an SM × SMs), the combine's part
of that call less its one round. (Measured on the one sequence instead, the intercept was 1.3 us on an H200 where
the calls of the time record took 1.5 us more on average than a combine of that cost: with its few blocks the
combine's start and length read hide in the split kernel's idle SMs, which a full grid does not have.)
"""

from __future__ import annotations

from collections.abc import Callable

from iosim.calibrate.rates_kernels import Bench, Measured, busy_timer
from iosim.hardware.calibration import decode_keys
from iosim.launch import decode as geo

N1, N2 = 1024, 8192  # keys of each sequence, the two calls
CALLS = 50  # timed calls of each, queued behind a busy kernel (median)
COMBINE_SPLITS = (8, 128)  # the combine's rounds: one sequence in this many splits
FULL_SPLITS = 2  # the combine's fixed part: a full grid of sequences in this many splits
ALONE_BLOCKS = 4  # decode.fixed_alone's grid: a few blocks, each alone on its SM
PAGE = 256  # the shared pages' size
GROUP = 8  # query heads on the one kv head


def _slope(t1: float, t2: float) -> tuple[float, float]:
    """(tile, fixed) from the calls at N1 and N2 keys: the time a warp adds a tile, and what is left at N1."""
    tile = max(t2 - t1, 1e-12) * 64 / (N2 - N1)
    return tile, max(t1 - N1 // 64 * tile, 1e-12)


def _call(cp, gpu, sms: int, d: int, q_len: int, n: int, fp8: bool, own_pages: bool = False):
    """A launch of the decode kernel as described in the module docstring, ready to time: every sequence on the same
    pages (in L2), or, ``own_pages``, each on pages of its own in a shuffled order (in DRAM)."""
    pages = N2 // PAGE
    pool = pages * (sms if own_pages else 1)
    q = cp.random.standard_normal((sms, q_len, GROUP, d), dtype=cp.float32).astype(cp.float16)
    if fp8:  # e4m3 bits of moderate values (exponent field under 8; no NaN encodings), sign random
        raw = cp.random.randint(0, 0x38, (2, pool, PAGE, 1, d), dtype=cp.int32)
        raw |= cp.random.randint(0, 2, raw.shape, dtype=cp.int32) << 7
        one = cp.ones(1, dtype=cp.float32)  # device scales, read as they are (a number would be copied every call)
        k, v = (gpu.QuantizedKV(x.astype(cp.uint8), one) for x in raw)
    else:
        k, v = (x.astype(cp.float16) for x in cp.random.standard_normal((2, pool, PAGE, 1, d), dtype=cp.float32))
    if own_pages:
        table = cp.random.permutation(pool).astype(cp.int32).reshape(sms, pages)
    else:
        table = cp.tile(cp.arange(pages, dtype=cp.int32), (sms, 1))
    lens = cp.full((sms,), n, dtype=cp.int32)
    plan = gpu.plan_decode(q, k, v, seqlens_k=lens, block_table=table, splits=1)
    o, lse = plan.run(q, k, v)
    return lambda: plan.run(q, k, v, out=(o, lse))


def decode_tile_part(b: Bench, cp, report: Callable[[Measured, str], None]) -> None:
    """Measure ``decode.tile`` for every instantiation the library compiles (both caches); report each."""
    from iosim import gpu  # the kernels themselves: iosim.gpu launches them

    seconds = busy_timer(b, cp, CALLS, warmup=3)
    for fp8 in (False, True):
        for d, stripes in geo.DECODE_STRIPES:
            (cache, key), q_len = decode_keys(d, stripes, fp8), 1 if stripes == 1 else 4
            fit = _blocks_per_sm(d, stripes, fp8)
            for per_sm in range(1, fit + 1):
                t1, t2 = (seconds(_call(cp, gpu, per_sm * b.sms, d, q_len, n, fp8)) for n in (N1, N2))
                tile = _slope(t1, t2)[0]
                d1, d2 = (seconds(_call(cp, gpu, per_sm * b.sms, d, q_len, n, fp8, own_pages=True))
                          for n in (N1, N2))
                fixed = _slope(d1, d2)[1]
                what = (f"iosim's decode kernel, {'e4m3' if fp8 else 'fp16'} cache, d = {d}, {q_len} new token(s) of "
                        f"{GROUP} heads on one kv head ({stripes} stripe(s)), blocks of one sequence each, 1 to {fit} "
                        f"on each of {b.sms} SMs (the key), every sequence on the same {N2 // PAGE} pages of {PAGE} keys "
                        f"(in L2), one split: (time at {N2} keys - time at {N1}) / {(N2 - N1) // 64} tiles a warp")
                report(Measured(("decode", "tile", cache, key, per_sm), tile, "s", what),
                       f"{t1 * 1e6:.1f} us at {N1} keys, {t2 * 1e6:.1f} us at {N2}")
                report(Measured(("decode", "fixed_dram", cache, key, per_sm), fixed, "s",
                                f"the same calls with each sequence on {N2 // PAGE} pages of its own (in DRAM): time at "
                                f"{N1} keys - {N1 // 64} tiles a warp x their (time at {N2} - time at {N1}) / "
                                f"{(N2 - N1) // 64}"), f"{d1 * 1e6:.1f} us at {N1} keys, {d2 * 1e6:.1f} us at {N2}")
            if fit:
                t1, t2 = (seconds(_call(cp, gpu, ALONE_BLOCKS, d, q_len, n, fp8, own_pages=True)) for n in (N1, N2))
                report(Measured(("decode", "fixed_alone", cache, key), _slope(t1, t2)[1], "s",
                                f"as decode.fixed_dram, a grid of {ALONE_BLOCKS} blocks (on {ALONE_BLOCKS} SMs)"),
                       f"{t1 * 1e6:.1f} us at {N1} keys, {t2 * 1e6:.1f} us at {N2}")


def combine_round_part(b: Bench, cp, report: Callable[[Measured, str], None]) -> None:
    """Measure ``decode.combine_round`` and ``decode.combine_fixed`` at each head dim (module docstring): the
    combine's part of a call is the call less its split kernel alone."""
    seconds = busy_timer(b, cp, CALLS, warmup=3)

    def part(d: int, splits: int, batch: int) -> float:
        whole, alone = _combine_calls(cp, d, splits, batch)
        return seconds(whole) - seconds(alone)

    for d in geo.DECODE_HEAD_DIMS:
        fit = _blocks_per_sm(d, 1, False)
        if not fit:  # the plan's split kernel does not fit this GPU's shared memory
            continue
        unroll = geo.combine_unroll(d)
        parts = [part(d, splits, 1) for splits in COMBINE_SPLITS]
        rounds = [-(-x // unroll) for x in COMBINE_SPLITS]
        per = max(parts[1] - parts[0], 1e-12) / (rounds[1] - rounds[0])
        what = (f"iosim's decode call of one sequence ({GROUP} query heads, {PAGE} keys a split) less its split "
                f"kernel alone, at {COMBINE_SPLITS[1]} and at {COMBINE_SPLITS[0]} splits: (the first - the second) / "
                f"{rounds[1] - rounds[0]} rounds of {unroll} splits")
        report(Measured(("decode", "combine_round", d), per, "s", what),
               f"the combine's part {parts[0] * 1e6:.2f} us at {COMBINE_SPLITS[0]} splits, {parts[1] * 1e6:.2f} us "
               f"at {COMBINE_SPLITS[1]}")
        batch = max(1, fit * b.sms // FULL_SPLITS)
        full = part(d, FULL_SPLITS, batch)
        report(Measured(("decode", "combine_fixed", d), max(full - per, 1e-12), "s",
                        f"a decode call of as many sequences in {FULL_SPLITS} splits as fill every SM with split blocks "
                        f"(16-bit cache), less its split kernel alone and its one round"),
               f"the combine's part {full * 1e6:.2f} us ({batch} sequences, {fit} split blocks an SM)")


def _combine_calls(cp, d: int, splits: int, batch: int):
    """(the whole decode call, its split kernel alone) of ``batch`` sequences of GROUP heads, PAGE keys a split,
    ``splits`` splits, ready to time."""
    from iosim.gpu import flash_decode

    q = cp.random.standard_normal((batch, 1, GROUP, d), dtype=cp.float32).astype(cp.float16)
    kv = cp.random.standard_normal((batch, splits * PAGE, 1, d), dtype=cp.float32).astype(cp.float16)
    plan = flash_decode.plan_decode(q, kv, kv, splits=splits)
    o, lse = cp.empty((batch, 1, GROUP, d), cp.float16), cp.empty((batch, GROUP, 1), cp.float32)
    return (lambda: plan.run(q, kv, kv, out=(o, lse))), flash_decode.split_kernel_alone(plan, q, kv, kv)


def decode_part(b: Bench, cp, report: Callable[[Measured, str], None]) -> None:
    """The decode section: the split kernel's tiles, then the combine's rounds (none before compute capability 8.0,
    where the kernels do not run: the decode model then charges no chain)."""
    cc = int(cp.cuda.Device().compute_capability)
    if cc < 80:
        print(f"decode: skipped (iosim's decode kernels need compute capability 8.0; this GPU is {cc / 10:.1f})",
              flush=True)
        return
    decode_tile_part(b, cp, report)
    combine_round_part(b, cp, report)


def _blocks_per_sm(d: int, stripes: int, fp8: bool) -> int:
    """Blocks of this instantiation an SM of the device holds (shared memory and registers, as the launch sees them;
    the registers: ptxas's count that iosim.launch.decode lists)."""
    from iosim.gpu._cupy import require_cupy

    a = require_cupy().cuda.Device().attributes
    regs = (geo.DECODE_REGISTERS_FP8 if fp8 else geo.DECODE_REGISTERS)[(d, stripes)]
    smem = geo.decode_smem_bytes(d, stripes, 2, 1 if fp8 else 2)
    return geo.decode_blocks_per_sm(smem, regs, int(a["MaxSharedMemoryPerMultiprocessor"]),
                                    int(a.get("MaxRegistersPerMultiprocessor", 65536)))
