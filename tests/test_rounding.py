"""The numeric executor's bf16 and fp8 rounding (ml_dtypes, iosim.numeric.round_to_dtype) against the bit arithmetic
iosim used before ml_dtypes: round to nearest, ties to even, from float32, fp8 saturating at ±448.

Every float32 input (2^32 of them) gave the same bits when the switch was made (a one-off run of 11 minutes,
issue 30 item 4); here, every bf16 and every fp8 value with the float32 inputs around it (exact, ties, one ulp either
side of a tie), the specials (±0, ±inf, NaN, float32 subnormals, the saturation edge) and float64 inputs, which
both round through float32 first (as ml_dtypes' own float64 conversion does)."""

from __future__ import annotations

import numpy as np
import pytest

from iosim.numeric import E4M3_MAX, round_to_dtype

F32 = np.float32


def bf16_by_bits(x: np.ndarray) -> np.ndarray:
    """Round-to-nearest-even on the float32 bits: add 0x7FFF plus the lowest kept bit, drop the low 16 bits."""
    x = np.asarray(x, dtype=F32)
    bits = x.view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return np.where(np.isnan(x), x, rounded.astype(np.uint32).view(F32))


def e4m3_by_quantum(x: np.ndarray) -> np.ndarray:
    """Round |x| to its e4m3 quantum (3 mantissa bits, subnormals down to 2^-9) with np.rint (ties to even)."""
    x = np.asarray(x, dtype=F32)
    a = np.abs(x).astype(np.float64)
    _, e = np.frexp(np.where(a > 0, a, 1.0))
    quantum = np.exp2(np.maximum(e - 1, -6) - 3)
    with np.errstate(invalid="ignore"):
        r = np.minimum(np.rint(a / quantum) * quantum, E4M3_MAX)
    return np.where(np.isnan(x), x, np.copysign(r, x)).astype(F32)


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return np.array_equal(np.asarray(a, F32).view(np.uint32), np.asarray(b, F32).view(np.uint32))


def around(values: np.ndarray, ulps=(-3, -2, -1, 0, 1, 2, 3)) -> np.ndarray:
    """``values`` (float32) and their float32 neighbours ``ulps`` steps away, both signs, NaN-free."""
    bits = np.abs(values.astype(F32)).view(np.uint32).astype(np.int64)
    near = (bits[:, None] + np.array(ulps)[None, :]).ravel()
    near = near[(near >= 0) & (near <= 0x7F800000)].astype(np.uint32).view(F32)
    return np.concatenate([near, -near])


SPECIALS = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, np.finfo(F32).max, -np.finfo(F32).max,
                     np.finfo(F32).smallest_subnormal, np.finfo(F32).tiny, 448.0, 449.0, 463.99, 464.0, 464.01,
                     480.0, 1e6, -1e6], F32)


def test_bf16_every_value_its_ties_and_their_neighbours():
    every = (np.arange(2**16, dtype=np.uint32) << 16).view(F32)
    every = every[~np.isnan(every)]
    ties = (every.view(np.uint32) | 0x8000).view(F32)  # halfway to the next bf16 value
    x = np.concatenate([around(every), around(ties[np.isfinite(ties)]), SPECIALS])
    assert x.size > 1_000_000
    assert same_bits(round_to_dtype(x, "bf16"), bf16_by_bits(x))
    assert same_bits(round_to_dtype(every, "bf16"), every)  # a bf16 value is its own rounding


def test_fp8_every_value_its_ties_and_their_neighbours():
    subnormal = [k * 2.0**-9 for k in range(8)]  # 0 and the 7 subnormals
    normal = [(1 + m / 8) * 2.0**e for e in range(-6, 9) for m in range(8)]  # 15 binades of 8
    grid = np.array([v for v in subnormal + normal if v <= E4M3_MAX], F32)  # e4m3fn: 1.875 * 2^8 is NaN
    assert grid.size == 127 and grid[-1] == E4M3_MAX
    ties = (grid[:-1].astype(np.float64) + grid[1:]) / 2
    x = np.concatenate([around(grid), around(ties.astype(F32)), SPECIALS])
    assert same_bits(round_to_dtype(x, "fp8"), e4m3_by_quantum(x))
    assert same_bits(round_to_dtype(grid, "fp8"), grid)


@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
def test_float64_inputs_round_through_float32_as_before(dtype):
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.standard_normal(100_000) * 10.0 ** rng.integers(-12, 6, 100_000),
                        # just above a tie by less than float32 keeps: float32 lands on the tie, which goes to even
                        [1 + 2**-8 + 2**-30, 1.0625 + 2**-40, 2.0**-10 + 2**-40, np.inf, np.nan]])
    by_bits = bf16_by_bits if dtype == "bf16" else e4m3_by_quantum
    assert same_bits(round_to_dtype(x, dtype), by_bits(x.astype(F32)))
