"""The compiled event walk of :func:`iosim.timing.flash_decode.fluid` (numba; the decode split choice runs it at
every candidate count, on grids of up to thousands of blocks). A module of its own so that only the walk imports
numba, on the first decode prediction (as :mod:`iosim.l2._jit` does for the L2 model's loop)."""

from __future__ import annotations

import numpy as np

from ..l2._jit import _njit


@_njit
def shares(caps: np.ndarray, bandwidth: float) -> np.ndarray:
    """Each streaming block's rate: ``bandwidth`` shared equally, none above its cap, what a capped block leaves
    shared by the others (water-filling)."""
    if caps.sum() <= bandwidth:
        return caps.copy()
    c = np.sort(caps)
    m = len(c)
    below = 0.0  # bytes/s the j smallest caps take
    level = bandwidth / m
    for j in range(m):
        level = (bandwidth - below) / (m - j)  # the common rate if blocks j.. share what is left
        if level <= c[j]:
            break
        below += c[j]
    return np.minimum(caps, level)


@_njit
def walk(stream: np.ndarray, fixed: np.ndarray, sms: int, per_sm: int, bandwidth: float, caps: np.ndarray) -> float:
    """When the last block ends (:func:`iosim.timing.flash_decode.fluid` says what the walk is). Pending starts are
    kept in launch order and taken earliest first (ties in launch order); the streaming blocks in the order they
    started; blocks that end at the same instant free their slots in that order."""
    n = len(stream)
    sm = np.zeros(n, dtype=np.int64)
    first = min(n, sms * per_sm)
    pend_id = np.empty(n, dtype=np.int64)  # blocks in their fixed part, and when it ends
    pend_t = np.empty(n, dtype=np.float64)
    npend = 0
    for i in range(first):
        sm[i] = i % sms
        pend_id[npend] = i
        pend_t[npend] = fixed[i]
        npend += 1
    ids = np.empty(n, dtype=np.int64)  # the streaming blocks
    nids = 0
    load = np.zeros(sms, dtype=np.int64)  # streaming blocks on each SM
    left = stream.astype(np.float64).copy()
    dt = np.empty(n, dtype=np.float64)
    nxt, t = first, 0.0
    while npend > 0 or nids > 0:
        t_stream, rate = np.inf, np.empty(0, dtype=np.float64)
        if nids > 0:
            mine = np.empty(nids, dtype=np.float64)
            for j in range(nids):
                mine[j] = caps[load[sm[ids[j]]]]
            rate = shares(mine, bandwidth)
            for j in range(nids):
                dt[j] = left[ids[j]] / rate[j]
            t_stream = t + dt[:nids].min()
        t_start = np.inf
        for q in range(npend):
            t_start = min(t_start, pend_t[q])
        if t_start <= t_stream:
            for j in range(nids):
                left[ids[j]] -= rate[j] * (t_start - t)
            t = t_start
            starters = np.sort(pend_id[:npend][pend_t[:npend] == t_start])
            keep = 0
            for q in range(npend):
                if pend_t[q] != t_start:
                    pend_id[keep], pend_t[keep] = pend_id[q], pend_t[q]
                    keep += 1
            npend = keep
            for i in starters:
                if stream[i] > 0:
                    ids[nids] = i
                    nids += 1
                    load[sm[i]] += 1
                elif nxt < n:  # no keys: its slot is free at once for the next block in launch order
                    sm[nxt] = sm[i]
                    pend_id[npend], pend_t[npend] = nxt, t + fixed[nxt]
                    npend += 1
                    nxt += 1
        else:
            step = dt[:nids].min()
            for j in range(nids):
                left[ids[j]] -= rate[j] * (t_stream - t)
            t = t_stream
            keep = 0
            ended = np.empty(nids, dtype=np.int64)
            nend = 0
            for j in range(nids):
                if dt[j] == step:
                    ended[nend] = ids[j]
                    nend += 1
                else:
                    ids[keep] = ids[j]
                    keep += 1
            nids = keep
            for e in range(nend):  # each freed slot: the next block in launch order takes it, on the same SM
                i = ended[e]
                load[sm[i]] -= 1
                if nxt < n:
                    sm[nxt] = sm[i]
                    pend_id[npend], pend_t[npend] = nxt, t + fixed[nxt]
                    npend += 1
                    nxt += 1
    return t
