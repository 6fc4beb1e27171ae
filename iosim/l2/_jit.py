"""The numba decorators of the L2 model's compiled loop (:mod:`iosim.l2.lru`, :mod:`iosim.l2.steady`).

A module of its own so that only the loop imports numba: ``import iosim`` does not (numba takes about a second to
import); :mod:`iosim.l2.walk` imports the loop on the first walk.
"""

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
