"""Quantities as people write them ("80GB", "50MiB", "3.35 TB/s", "989 TFLOP/s") and as iosim prints them.

Parsing accepts decimal prefixes (k, M, G, T, P = 10^3 ...) and binary ones (Ki, Mi, Gi, Ti = 2^10 ...).
Printing always uses decimal units (1 MB = 10^6 B), as docs/concepts.md (Conventions) says.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal

_DECIMAL = {"": 1, "k": 10**3, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15}
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}

# unit family -> accepted spellings of the base unit (after the prefix)
_BASES = {
    "bytes": ("B", "byte", "bytes"),
    "bytes/s": ("B/s", "Bps"),
    "flop/s": ("FLOP/s", "FLOPS", "flop/s", "flops"),
    "op/s": ("op/s", "ops", "OP/s", "OPS"),
    "Hz": ("Hz",),
}

_NUMBER = r"(?P<num>[0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)"


class UnitError(ValueError):
    """A quantity could not be read: the message says what was given and what is accepted."""


def parse_quantity(text: str | int | float, family: str) -> float:
    """Read ``text`` as a quantity of ``family`` ("bytes", "bytes/s", "flop/s", "op/s", "Hz").

    Plain numbers are taken in the base unit. ``parse_quantity("3.35 TB/s", "bytes/s") == 3.35e12``.
    """
    if isinstance(text, bool):
        raise UnitError(f"expected a quantity in {family}, got the boolean {text!r}")
    if isinstance(text, (int, float)):
        if not math.isfinite(text) or text < 0:
            raise UnitError(f"expected a non-negative finite quantity in {family}, got {text!r}")
        return float(text)
    if not isinstance(text, str):
        raise UnitError(f"expected a quantity in {family} such as '80GB', got {type(text).__name__}")
    s = text.strip().replace("_", "")
    m = re.fullmatch(_NUMBER + r"\s*(?P<unit>.*)", s)
    if not m:
        raise UnitError(f"cannot read {text!r} as a quantity in {family} (example: {_example(family)})")
    value = Decimal(m.group("num"))  # exact: '66.9 TFLOP/s' is 66.9e12, not 66.9 * 1e12 = 66900000000000.01
    unit = m.group("unit").strip()
    if unit == "":
        return float(value)
    for prefix_table in (_BINARY, _DECIMAL):
        for prefix, factor in prefix_table.items():
            for base in _BASES[family]:
                if unit == prefix + base:
                    return float(value * factor)  # one rounding, of the exact product
    raise UnitError(
        f"unknown unit {unit!r} in {text!r}: expected a {family} unit such as {_example(family)} "
        "(prefixes k M G T P decimal, Ki Mi Gi Ti binary)"
    )


def _example(family: str) -> str:
    return {
        "bytes": "'80GB', '50MiB', '228KiB'",
        "bytes/s": "'3.35 TB/s'",
        "flop/s": "'989 TFLOP/s'",
        "op/s": "'3.9 Top/s'",
        "Hz": "'1.98 GHz'",
    }[family]


def fmt_bytes(n: float) -> str:
    """Decimal units: ``fmt_bytes(138_412_032) == '138.4 MB'``."""
    return _fmt(n, "B")


def fmt_rate(n: float, unit: str) -> str:
    return _fmt(n, unit)


def _fmt(n: float, unit: str) -> str:
    if n is None:
        return "n/a"
    a = abs(n)
    for prefix, factor in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if a >= factor:
            return f"{n / factor:.4g} {prefix}{unit}"
    return f"{n:.4g} {unit}"


def fmt_seconds(t: float) -> str:
    if t is None:
        return "n/a"
    for unit, factor in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6), ("ns", 1e-9)):
        if t >= factor:
            return f"{t / factor:.4g} {unit}"
    return f"{t:.3g} s"
