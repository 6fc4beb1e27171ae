"""What every part of the L2 model shares: the numba decorator, tensor codes, the error type."""

from __future__ import annotations

try:  # numba is a runtime dependency; the pure-Python fallback is only for environments without it
    import numba

    _njit = numba.njit(cache=True, nogil=True)
    # helpers of the hot loop: inlined into it, so their tuples of arrays are not passed by value per call
    _njit_inline = numba.njit(cache=True, nogil=True, inline="always")
except ImportError:  # pragma: no cover
    numba = None

    def _njit(f):
        return f

    _njit_inline = _njit


# tensor codes used in traces
TENSOR_CODES = {"Q": 0, "K": 1, "V": 2, "O": 3, "S": 4, "P": 5, "m": 6, "l": 7, "lse": 8, "foreign": 9}
FOREIGN = TENSOR_CODES["foreign"]  # dirty lines in L2 before the kernel starts (not the kernel's data)
ROOM_UNIT = 64  # the L2 model counts room in 1/64 byte (room factors are multiples of 1/64)
TENSOR_NAMES = {v: k for k, v in TENSOR_CODES.items()}
KV_TENSORS = (TENSOR_CODES["K"], TENSOR_CODES["V"])  # indexed by the key/value head


class L2ModelError(ValueError):
    """The L2 model cannot run as asked (missing profile field, unknown schedule geometry, ...)."""
