"""The tensor-core part of ``iosim calibrate rates`` on Hopper: wgmma throughput tables (fp16, bf16, e4m3 by N and
warpgroups per SM) and the fixed cost of waiting for a wgmma result (the round trip a FlashAttention-3 backward step
waits out twice, :mod:`iosim.timing.fa3_bwd`)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from iosim.calibrate.rates_kernels import Bench, Measured
from iosim.gpu.build_rates import (
    RATES_CHAIN_N,
    RATES_CHAIN_WARPGROUPS,
    RATES_WARPGROUPS,
    RATES_WGMMA_N,
    rates_wgmma_chain_names,
    rates_wgmma_names,
)
from iosim.units import fmt_rate

WGMMA_PER_TRIP = 8  # wgmma instructions per warpgroup per loop trip
# wgmma input types: (rates_wgmma_names dtype, the calibration's key, K per instruction: 32 bytes of a row either way)
WGMMA_TYPES = (("float16", "fp16", 16), ("bfloat16", "bf16", 16), ("e4m3", "fp8", 32))


def wgmma_part(b: Bench, cp, report: Callable[[Measured, str], None]) -> None:
    """Every wgmma measurement (Hopper only; the caller checks)."""
    _wgmma(b, cp, report)
    _wgmma_wait(b, cp, report)


def _wgmma(b: Bench, cp, report: Callable[[Measured, str], None]) -> None:
    """wgmma tables (Hopper): fp16, bf16 and fp8 (e4m3), N 128 and 256, 1-3 warpgroups per SM."""
    wnames, i32 = rates_wgmma_names(), cp.int32
    for dt, short, k_inst in WGMMA_TYPES:
        for n in RATES_WGMMA_N:
            for wg in RATES_WARPGROUPS:
                k = b.fn(wnames[(n, dt, wg)], pad=True)
                iters, t = b.sized(lambda it, k=k, wg=wg: lambda: k((b.sms,), (128 * wg,), (i32(it), i32(0), b.out, b.stamps),
                                                                    shared_mem=b.pad), iters=16)
                rate = 2 * 64 * n * k_inst * WGMMA_PER_TRIP * wg * b.sms * iters / t
                report(Measured(("wgmma", short, f"n{n}", wg), rate, "FLOP/s",
                                f"wgmma m64n{n}k{k_inst} {short} fp32 accumulate, A and B from shared memory, one "
                                f"block per SM of wg warpgroups (key), {WGMMA_PER_TRIP} per commit group, chip-wide"),
                       f"at {fmt_rate(b.clock(b.sms), 'Hz')}")


CHAINS_TRIED = (1, 2, 4, 8)  # wgmma per commit group in the round-trip probe (rates_wgmma_chain)
CHAIN_ITERS = 256  # round trips per launch


def wgmma_round_trip(chain_cycles: dict[int, float]) -> tuple[float, float]:
    """(fixed cycles, cycles per wgmma) of a commit-and-wait round trip: the least-squares line through the cycles
    of one round trip against the wgmma it waits for (``chain_cycles``: chain length -> cycles)."""
    x = np.array(sorted(chain_cycles), dtype=float)
    slope, intercept = np.polyfit(x, [chain_cycles[int(c)] for c in x], 1)
    return float(intercept), float(slope)


def _wgmma_wait(b: Bench, cp, report: Callable[[Measured, str], None]) -> None:
    """The fixed cost of waiting for a wgmma result (Hopper): one block, its warpgroups each committing a chain of
    wgmma and waiting for it, the round trip's cycles against the chain's length; the line's intercept, at two
    warpgroups (a FlashAttention-3 backward's consumers) and the median over N, is the wait."""
    names, i32 = rates_wgmma_chain_names(), cp.int32
    for dt, short in (("float16", "fp16"), ("bfloat16", "bf16")):
        fixed, detail = [], []
        for n in RATES_CHAIN_N:
            for wg in RATES_CHAIN_WARPGROUPS:
                k = b.fn(names[(n, dt, wg)])
                got = {c: b.cycles_of(lambda k=k, c=c, wg=wg: k((1,), (128 * wg,), (i32(c), i32(CHAIN_ITERS), b.out,
                                                                                    b.cycles))) / CHAIN_ITERS
                       for c in CHAINS_TRIED}
                a, per = wgmma_round_trip(got)
                detail.append(f"n{n} x{wg}: {a:.0f} + {per:.1f}/wgmma")
                if wg == max(RATES_CHAIN_WARPGROUPS):
                    fixed.append(a)
        report(Measured(("wgmma", short, "wait"), float(np.median(fixed)), "cycles",
                        f"wgmma m64nNk16 {short}, A and B from shared memory: one block of 1 or 2 warpgroups, each "
                        f"committing a chain of {'/'.join(map(str, CHAINS_TRIED))} wgmma and waiting for it, clock64; "
                        "the intercept of cycles against chain length, 2 warpgroups, median over N = "
                        f"{'/'.join(map(str, RATES_CHAIN_N))} ({'; '.join(detail)})"), "")
