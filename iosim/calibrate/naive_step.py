"""``calibration.forward.naive``: what the naive schedule's kernels (kernels/naive.cu) spend on their tiles and rows,
as timed on this GPU, one kernel at a time (:func:`iosim.gpu.naive_kernels`).

Why it is measured: the naive model composed each thread block's load, multiply and store from the chip's rates
(:mod:`iosim.timing.naive`), and Nsight Compute shows neither kernel bound by a rate: at one query row the scores
kernel keeps the tensor pipe 41% busy and P·V 51% (H100, 8 × 32 heads, 16,384 keys; issue 45-53% of peak, math-pipe
throttle and dependency stalls first), because both multiply whole 128-row tiles whatever the rows; the composition
priced those calls 21-25% fast on both GPUs, and P·V's prefill steps, loaded from DRAM and L2 at once, 3-12% fast.

What, per head dim, at k = the kernel's blocks an SM (the built-in profile's residency), bf16, one kv head:

* ``qk``, ``qk_row``: seconds a round of k tiles of S = scale·QKᵀ takes an SM (k·SMs query heads of 128 query rows,
  or of one, against 128·T keys: T rounds), the slope between T = 8 and T = 24, so the launch and the grid's start
  fall out; S goes to DRAM as in any real call.
* ``qk_masked``, ``pv_masked``: a tile (a step) the causal mask wholly hides, loaded and stored as any, not
  multiplied: k·SMs heads at seq_len = kv_len = 1,024, non-causal then causal; each masked unit costs the whole
  one's time less the calls' difference over a head's masked units (each SM runs k heads' worth of both).
* ``pv``, ``pv_row``: seconds one 64-key step of P·V takes an SM running k blocks (k·SMs heads of 128 query rows,
  or of one; 1,024 then 4,096 keys: the slope over 48 steps), P from DRAM, V from L2.
* ``pv_block``, ``pv_block_row``: what a further block costs an SM beyond its steps (its start, its ring's first
  tiles, O's store), at 128 rows and at one: twice the heads at 1,024 keys, less the first call and 16 steps.
* ``softmax_mb``: seconds the softmax kernel takes a MB of S (read, and as much of P written) where S streams from
  DRAM, by row length: each instantiation (threads a row x 16-byte chunks a thread, 128 to 16,384 keys) with its
  slots full and about half full, and the shared-memory path of longer rows at 32,768 and 65,536 keys; 64 heads,
  the slope between 128 and 384 MB of S. Measured (2026-11-28): 1.4-1.5 TB/s at 128-key rows on both GPUs (a warp a
  row, half its lanes idle), 3.0 TB/s on the H100 from 1,024 keys, 3.5-4.3 TB/s on the H200; 1.8-1.9 TB/s at
  65,536 keys (the shared-memory path, a row a block).

Each time is the median of CALLS calls queued behind a busy kernel after a rest, as the other steps
(:mod:`iosim.calibrate.forward_step`).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from iosim.blocks import cdiv
from iosim.calibrate.backward_step import CALLS, REST_S
from iosim.calibrate.forward_step import _timed, builtin_profile
from iosim.calibrate.rates_kernels import Bench, Measured, busy_timer
from iosim.launch import HEAD_DIMS

ROUNDS = (8, 24)  # rounds of the scores kernel's calls
STEPS = (16, 64)  # P·V's 64-key steps
SQUARE = 1024  # seq_len = kv_len of the masked parts' calls
# row lengths of the softmax's part: each instantiation (threads a row x chunks a thread) full, and about half full
# (and past 16,384 keys, where a row goes through shared memory, two lengths of that path)
SOFTMAX_KEYS = (128, 256, 264, 512, 520, 1024, 1032, 2048, 2056, 4096, 4104, 8192, 8200, 16384, 32768, 65536)
SOFTMAX_MB = (128, 384)  # MB of S the softmax's two calls read (each then writes as much of P), past any L2
SOFTMAX_HEADS = 64
QK, SOFTMAX, PV = 0, 1, 2  # naive.cu's kernels, in launch order


def _kernel(cp, kernel: int, heads: int, n: int, nk: int, d: int, causal: bool = False) -> Callable[[], Any]:
    """One of naive.cu's kernels alone on random bf16 inputs, ``heads`` query heads on one kv head."""
    import ml_dtypes

    from iosim import gpu

    bf16 = ml_dtypes.bfloat16
    q = cp.random.standard_normal((1, n, heads, d), dtype=cp.float32).astype(bf16)
    k, v = (cp.random.standard_normal((1, nk, 1, d), dtype=cp.float32).astype(bf16) for _ in range(2))
    runs, _ = gpu.naive_kernels(q, k, v, causal=causal)
    for before in runs[:kernel]:
        before()  # S (and P) as the kernel meets them (their values do not change the time)
    return runs[kernel]


def naive_part(b: Bench, cp, report: Callable[[Measured, str], None]) -> None:
    """``forward.naive`` by part and head dim (module docstring)."""
    from iosim.timing.naive import residency

    if int(cp.cuda.Device().compute_capability) < 80:
        print("forward: naive skipped (naive.cu's GEMMs need compute capability 8.0)", flush=True)
        return
    profile = builtin_profile(cp)
    seconds = busy_timer(b, cp, CALLS, warmup=2, rest_s=REST_S)
    _softmax(b, cp, report, seconds)
    for d in HEAD_DIMS:
        for kernel in (QK, PV):
            k = residency(profile, d, kernel) if profile is not None else 1
            whole = (_scores if kernel == QK else _products)(b, cp, report, seconds, d, k)
            if whole is not None:
                _masked(b, cp, report, seconds, kernel, d, k, whole)
        cp.get_default_memory_pool().free_all_blocks()


def _report(report, part: str, d: int, value: float, what: str, note: str) -> None:
    report(Measured(("forward", "naive", part, d), max(value, 1e-9), "s", what), note)


def _softmax(b: Bench, cp, report, seconds) -> None:
    """``softmax_mb``: seconds the softmax kernel takes a MB of S read (and a MB of P written) where S streams from
    DRAM, by row length (each its instantiation: threads a row, chunks a thread); the slope between SOFTMAX_MB."""
    from iosim.launch import naive_row_pitch

    for nk in SOFTMAX_KEYS:
        row = naive_row_pitch(nk, 2) * 2
        rows = [cdiv(mb * 10**6, SOFTMAX_HEADS * row) for mb in SOFTMAX_MB]
        t = _timed(f"forward.naive.softmax_mb.{nk}", seconds,
                   [partial(_kernel, cp, SOFTMAX, SOFTMAX_HEADS, n, nk, 64) for n in rows])
        if t is None:
            return
        mb = (rows[1] - rows[0]) * SOFTMAX_HEADS * row / 1e6
        report(Measured(("forward", "naive", "softmax_mb", nk), max((t[1] - t[0]) / mb, 1e-12), "s",
                        f"naive.cu's softmax kernel alone, bf16, {SOFTMAX_HEADS} heads of N rows of kv_len keys (S "
                        f"{SOFTMAX_MB[0]} then {SOFTMAX_MB[1]} MB, from DRAM): (time at {SOFTMAX_MB[1]} MB - time at "
                        f"{SOFTMAX_MB[0]} MB) / the MB of S between, each the median of {CALLS} calls behind a busy "
                        f"kernel after {REST_S} s idle (iosim/calibrate/naive_step.py); seconds a MB of S read and "
                        "of P written, by kv_len"),
               f"{t[0] * 1e6:.1f} us, {t[1] * 1e6:.1f} us")


def _scores(b: Bench, cp, report, seconds, d: int, k: int) -> float | None:
    """``qk`` and ``qk_row``; returns ``qk`` (None where the kernel could not run)."""
    h, slope, out = k * b.sms, ROUNDS[1] - ROUNDS[0], None
    for part, rows in (("qk", 128), ("qk_row", 1)):
        t = _timed(f"forward.naive.{part}.{d}", seconds,
                   [partial(_kernel, cp, QK, h, rows, 128 * r, d) for r in ROUNDS])
        if t is None:
            return None
        value = (t[1] - t[0]) / slope
        out = value if out is None else out
        _report(report, part, d, value,
                f"naive.cu's scores kernel alone, bf16, k x {b.sms} query heads (k: the kernel's blocks an SM) of "
                f"{rows} query row(s) on one kv head against 128 T keys (T rounds of k tiles an SM): (time at T = "
                f"{ROUNDS[1]} - time at T = {ROUNDS[0]}) / {slope}, each the median of {CALLS} calls behind a busy "
                f"kernel after {REST_S} s idle "
                "(iosim/calibrate/naive_step.py); seconds a round, by head dim",
                f"{t[0] * 1e6:.1f} us at T = {ROUNDS[0]}, {t[1] * 1e6:.1f} us at T = {ROUNDS[1]}")
    return out


def _products(b: Bench, cp, report, seconds, d: int, k: int) -> float | None:
    """``pv``, ``pv_row`` and ``pv_block``; returns ``pv`` (None where the kernel could not run)."""
    h, slope, step = k * b.sms, STEPS[1] - STEPS[0], {}
    for part, rows in (("pv", 128), ("pv_row", 1)):
        t = _timed(f"forward.naive.{part}.{d}", seconds, [partial(_kernel, cp, PV, h, rows, 64 * s, d) for s in STEPS]
                   + [partial(_kernel, cp, PV, 2 * h, rows, 64 * STEPS[0], d)])
        if t is None:
            return None
        step[part] = (t[1] - t[0]) / slope
        _report(report, part, d, step[part],
                f"naive.cu's P V kernel alone, bf16, k x {b.sms} query heads (k: the kernel's blocks an SM) of "
                f"{rows} query row(s) on one kv head (one round of k blocks an SM; P from DRAM, V from L2): (time "
                f"at {64 * STEPS[1]} keys - time at {64 * STEPS[0]}) / {slope} 64-key steps, each the median of "
                f"{CALLS} calls behind a busy kernel after {REST_S} s idle (iosim/calibrate/naive_step.py); seconds a "
                "step of the round, by head dim",
                f"{t[0] * 1e6:.1f} us at {64 * STEPS[0]} keys, {t[1] * 1e6:.1f} us at {64 * STEPS[1]}")
        _report(report, "pv_block" if rows == 128 else "pv_block_row", d, t[2] - t[0] - STEPS[0] * step[part],
                f"the same kernel, twice the heads at {64 * STEPS[0]} keys (two rounds): time - the one-round call's "
                f"- {STEPS[0]} steps (iosim/calibrate/naive_step.py); seconds a round beyond its steps, by head dim",
                f"{t[2] * 1e6:.1f} us with two rounds")
    return step["pv"]


def masked_units(kernel: int, n: int) -> tuple[int, int]:
    """A head's masked units (scores: 128 x 128 tiles; P V: 64-key steps) under the causal mask at n = seq_len =
    kv_len (a multiple of 128), and all its units: what the causal call skips of the non-causal one."""
    tiles = n // 128
    if kernel == QK:
        return tiles * (tiles - 1) // 2, tiles * tiles
    steps = n // 64
    return sum(steps - 2 * (i + 1) for i in range(tiles)), tiles * steps


def _masked(b: Bench, cp, report, seconds, kernel: int, d: int, k: int, whole: float) -> None:
    """``qk_masked`` or ``pv_masked``: the causal call against the non-causal one at seq_len = kv_len = SQUARE,
    k x SMs heads; the causal call skips the multiplies of its masked units, so each costs the whole unit's time
    less the difference over them (both calls load and store alike)."""
    part = "qk_masked" if kernel == QK else "pv_masked"
    t = _timed(f"forward.naive.{part}.{d}", seconds,
               [partial(_kernel, cp, kernel, k * b.sms, SQUARE, SQUARE, d, c) for c in (False, True)])
    if t is None:
        return
    masked, _ = masked_units(kernel, SQUARE)
    unit = "a round of tiles" if kernel == QK else "a 64-key step of a round"
    _report(report, part, d, whole - (t[0] - t[1]) / masked,
            f"naive.cu's {'scores' if kernel == QK else 'P V'} kernel alone, bf16, k x {b.sms} query heads (k: the "
            f"kernel's blocks an SM) on one kv head at seq_len = kv_len = {SQUARE}, non-causal then causal "
            f"(bottom-right: {masked} units a head masked, loaded and stored alike, not multiplied): "
            f"{'qk' if kernel == QK else 'pv'} - (non-causal time - "
            f"causal time) / {masked} (iosim/calibrate/naive_step.py); seconds {unit}, by head dim",
            f"{t[0] * 1e6:.1f} us non-causal, {t[1] * 1e6:.1f} us causal")
