"""Sourced values: a number with where it comes from (``{value, source}``; ``value: null`` = not published), the
strict pydantic base of every profile model (unknown keys rejected, frozen), and the unit parsing behind them:
sizes, rates and clocks as people write them (``80GB``, ``3.35 TB/s``, ``1.98 GHz``), times (``2.5 us``), cycles
and FLOP/s tables.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal
from typing import Annotated

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from ..units import UnitError, parse_quantity


def _positive(x: float, family: str, given) -> float:
    """A size or a rate of 0 (or less) is never right: every model divides by it or fits tiles into it."""
    if x <= 0:
        raise ValueError(f"{given!r} is not a positive quantity in {family}: a rate or a size must be > 0 "
                         "(write `value: null` and say so in the source if the number is not published)")
    return x


def _unit(family: str):
    def convert(v):
        if v is None:
            return None
        try:
            return _positive(parse_quantity(v, family), family, v)
        except UnitError as exc:
            raise ValueError(str(exc)) from None

    return BeforeValidator(convert)


def _whole_bytes(v, *, positive: bool):
    if v is None:
        return None
    try:
        x = parse_quantity(v, "bytes")
    except UnitError as exc:
        raise ValueError(str(exc)) from None
    if x != int(x):
        raise ValueError(f"{v!r} is not a whole number of bytes")
    return int(_positive(x, "bytes", v) if positive else x)


def _int_bytes(v):
    return _whole_bytes(v, positive=True)


def _int_bytes_or_zero(v):
    return _whole_bytes(v, positive=False)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SourcedBytes(_Strict):
    """A size in bytes (``value`` accepts '50MiB'), with where the number comes from."""

    value: Annotated[int | None, BeforeValidator(_int_bytes)] = Field(
        description="bytes; null = not published"
    )
    source: str = Field(min_length=1, description="datasheet, paper, or 'measured on ... with ...'")


class SourcedByteCount(_Strict):
    """A number of bytes that may be 0 (dirty lines in L2 at a kernel's start)."""

    value: Annotated[int | None, BeforeValidator(_int_bytes_or_zero)] = Field(description="bytes, >= 0")
    source: str = Field(min_length=1)


class SourcedBandwidth(_Strict):
    value: Annotated[float | None, _unit("bytes/s")] = Field(description="bytes per second")
    source: str = Field(min_length=1)


class SourcedFlops(_Strict):
    value: Annotated[float | None, _unit("flop/s")] = Field(
        description="floating-point operations per second"
    )
    source: str = Field(min_length=1)


class SourcedOps(_Strict):
    value: Annotated[float | None, _unit("op/s")] = Field(description="operations (results) per second")
    source: str = Field(min_length=1)


class SourcedHz(_Strict):
    value: Annotated[float | None, _unit("Hz")] = Field(description="cycles per second")
    source: str = Field(min_length=1)


class SourcedCount(_Strict):
    value: int | None = Field(ge=1, description="a count; null = not published")
    source: str = Field(min_length=1)


class SourcedRatio(_Strict):
    value: float | None = Field(gt=0, le=1, description="a ratio in (0, 1]; null = not measured")
    source: str = Field(min_length=1)


# -- times, cycles and tables (what the calibration section measures) -------------------------------------------------

_TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}


def _seconds(v):
    """A time: a number of seconds, or a string such as '2.5 us' (s, ms, us, ns)."""
    if isinstance(v, str):
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*(s|ms|us|µs|ns)?\s*", v)
        if m is None:
            raise ValueError(f"{v!r} is not a time such as '2.5 us' (a number of seconds, or units s, ms, us, ns)")
        v = float(Decimal(m.group(1)) * Decimal(str(_TIME_UNITS[m.group(2) or "s"])))  # exact, then one rounding
    elif isinstance(v, bool) or not isinstance(v, (int, float)):
        return v  # None is a null value; anything else fails the float check with pydantic's message
    if not math.isfinite(v):
        raise ValueError(f"{v!r} is not a finite time")
    return _positive(float(v), "seconds", v)


class SourcedSeconds(_Strict):
    value: Annotated[float | None, BeforeValidator(_seconds)] = Field(description="seconds ('2.5 us' accepted)")
    source: str = Field(min_length=1)


class SourcedCycles(_Strict):
    value: float | None = Field(gt=0, description="SM clock cycles")
    source: str = Field(min_length=1)


class SourcedHzTable(_Strict):
    """Clocks by a count (SMs busy)."""

    value: dict[Annotated[int, Field(ge=1)], Annotated[float, _unit("Hz")]] = Field(min_length=1)
    source: str = Field(min_length=1)


class SourcedSecondsTable(_Strict):
    """Times by a count per SM (resident blocks)."""

    value: dict[Annotated[int, Field(ge=1)], Annotated[float, BeforeValidator(_seconds)]] = Field(min_length=1)
    source: str = Field(min_length=1)


class SourcedFlopsTable(_Strict):
    """FLOP/s over the chip by a count per SM (resident warps, or warpgroups)."""

    value: dict[Annotated[int, Field(ge=1)], Annotated[float, _unit("flop/s")]] = Field(min_length=1)
    source: str = Field(min_length=1)
