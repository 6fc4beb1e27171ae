"""What every part of the L2 model shares: tensor codes, room units, the error type (the numba decorators are in
:mod:`iosim.l2._jit`, imported by the compiled loop only)."""

from __future__ import annotations

# tensor codes used in traces; the backward pass's from 10 on (dK, dV: a query head's copies where the design
# expands them, so they are not K/V-side)
TENSOR_CODES = {"Q": 0, "K": 1, "V": 2, "O": 3, "S": 4, "P": 5, "m": 6, "l": 7, "lse": 8, "foreign": 9,
                "dO": 10, "D": 11, "dQacc": 12, "dQ": 13, "dK": 14, "dV": 15}
FOREIGN = TENSOR_CODES["foreign"]  # dirty lines in L2 before the kernel starts (not the kernel's data)
ROOM_UNIT = 64  # the L2 model counts room in 1/64 byte (room factors are multiples of 1/64)
TENSOR_NAMES = {v: k for k, v in TENSOR_CODES.items()}
KV_TENSORS = (TENSOR_CODES["K"], TENSOR_CODES["V"])  # indexed by the key/value head


class L2ModelError(ValueError):
    """The L2 model cannot run as asked (missing profile field, unknown schedule geometry, ...)."""


def room_units(factor: float) -> int:
    """A room factor (L2 bytes one byte takes) in the loop's integer units of 1/ROOM_UNIT byte."""
    return round(factor * ROOM_UNIT)
