"""``sm.block_share`` from flash2's block timeline: how two co-resident blocks of one SM share its issue slots.

In the first wave each SM runs two blocks; the older (first dispatched) finishes after D0, the younger after D1.
With issue shares f (older) and 1 - f, and a lone block at the SM's full rate, f D0 = (1 - f) D0 + f (D1 - D0), so
f = D0 / (3 D0 - D1), and block_share = (1 - f) / f. Causal timelines are left out: their blocks do unequal work.
"""

from __future__ import annotations

import numpy as np

from .l2 import CalibrationError


def block_share(start_ns: np.ndarray, end_ns: np.ndarray, sm: np.ndarray) -> float:
    """The younger block's issue share relative to the older one's, from one launch's first wave."""
    start_ns, end_ns, sm = (np.asarray(a, dtype=np.int64) for a in (start_ns, end_ns, sm))
    n_sm = len(np.unique(sm))
    if len(start_ns) < 2 * n_sm:
        raise CalibrationError(f"block_share needs two blocks per SM in the first wave: {len(start_ns)} blocks on "
                               f"{n_sm} SMs")
    first = np.argsort(start_ns, kind="stable")[: 2 * n_sm]
    d = np.sort(end_ns[first] - start_ns[first])
    half = len(d) // 2
    d0, d1 = float(np.median(d[:half])), float(np.median(d[half:]))
    f_old = d0 / (3 * d0 - d1)
    return (1 - f_old) / f_old


def median_block_share(timelines: list[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> float:
    """The median of :func:`block_share` over several launches (start, end, sm each)."""
    if not timelines:
        raise CalibrationError("block_share needs at least one block timeline of flash2 without a mask")
    return float(np.median([block_share(*t) for t in timelines]))
