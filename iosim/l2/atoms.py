"""Atoms: each tensor's accesses within one kernel, cut into rectangles between consecutive tile edges.

Part of the L2 model; the model as a whole is described in :mod:`iosim.l2`. Every access is a whole number of
atoms and a line belongs to exactly one atom, so the LRU can keep recency per atom instead of per line.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..counts import FP32_TENSORS, ROW_TENSORS
from ..problem import STAT_BYTES, AttentionProblem
from ._common import KV_TENSORS, TENSOR_CODES, TENSOR_NAMES, L2ModelError
from .trace import KernelTrace


@dataclass
class Atoms:
    """The atoms of one kernel (one head) and each access as (first atom, shape)."""

    atom_bytes: np.ndarray  # int64 [A]
    atom_kv: np.ndarray  # bool [A]: indexed by the kv head (K, V), else by the query head
    atom_tensor: np.ndarray  # int64 [A]
    acc_atom: np.ndarray  # int32 per access: its first atom
    # int32 per access: 0 = one atom; k > 0 = shapes row k (rows of atoms, cols, stride)
    acc_shape: np.ndarray
    shapes: np.ndarray  # int64 [K, 3]


def _bounds(starts, stops, size):
    mark = np.zeros(size + 1, dtype=bool)
    mark[starts] = True
    mark[stops] = True
    rb = np.flatnonzero(mark).astype(np.int64)
    lut = np.cumsum(mark) - 1  # lut[x] = index of boundary x in rb (x a boundary)
    return rb, lut


def atomize(kt: KernelTrace, p: AttentionProblem) -> Atoms:
    n_acc = len(kt.tensor)
    acc_atom = np.zeros(n_acc, dtype=np.int64)
    nr_all = np.ones(n_acc, dtype=np.int64)
    nc_all = np.ones(n_acc, dtype=np.int64)
    stride_all = np.ones(n_acc, dtype=np.int64)
    bytes_parts, kv_parts, t_parts = [], [], []
    nxt = 0
    for t in range(len(TENSOR_CODES)):
        sel = np.nonzero(kt.tensor == t)[0]
        if len(sel) == 0:
            continue
        name = TENSOR_NAMES[t]
        r0, r1 = kt.r0[sel], kt.r1[sel]
        rb, rlut = _bounds(r0, r1, int(r1.max()))
        has_cols = name in ("S", "P")
        if has_cols:
            c0, c1 = kt.c0[sel], kt.c1[sel]
            cb, clut = _bounds(c0, c1, int(c1.max()))
            ca0, ca1 = clut[c0], clut[c1]
            width = np.diff(cb)
        else:
            cb = np.array([0, 1], np.int64)
            ca0, ca1 = np.zeros(len(sel), np.int64), np.ones(len(sel), np.int64)
            width = np.array([1 if name in ROW_TENSORS else p.head_dim])
        ra0, ra1 = rlut[r0], rlut[r1]
        nr, nc = len(rb) - 1, len(cb) - 1
        acc_atom[sel] = nxt + ra0 * nc + ca0
        nr_all[sel], nc_all[sel], stride_all[sel] = ra1 - ra0, ca1 - ca0, nc
        elem = STAT_BYTES if name in FP32_TENSORS else p.elem_bytes
        bytes_parts.append((np.diff(rb)[:, None] * width[None, :] * elem).reshape(-1).astype(np.int64))
        kv_parts.append(np.full(nr * nc, t in KV_TENSORS))
        t_parts.append(np.full(nr * nc, t, dtype=np.int64))
        nxt += nr * nc
    single = (nr_all == 1) & (nc_all == 1)
    shape_keys = np.stack([nr_all, nc_all, stride_all], axis=1)
    acc_shape = np.zeros(n_acc, dtype=np.int32)
    shapes = np.zeros((1, 3), dtype=np.int64)
    if not single.all():
        uniq, inv = np.unique(shape_keys[~single], axis=0, return_inverse=True)
        shapes = np.concatenate([shapes, uniq])
        acc_shape[~single] = inv.reshape(-1) + 1
    if nxt >= 2**31:
        raise L2ModelError(f"{kt.name}: {nxt} atoms per head is too many for the model")

    def cat(xs, dt):
        return np.concatenate(xs) if xs else np.zeros(0, dt)

    return Atoms(
        cat(bytes_parts, np.int64),
        cat(kv_parts, bool),
        cat(t_parts, np.int64),
        acc_atom.astype(np.int32),
        acc_shape,
        shapes,
    )


def _access_bytes(kt: KernelTrace, p: AttentionProblem) -> np.ndarray:
    """Bytes of each access of a trace."""
    nbytes = np.zeros(len(kt.tensor), dtype=np.int64)
    rows = kt.r1 - kt.r0
    for t in np.unique(kt.tensor):
        sel = kt.tensor == t
        name = TENSOR_NAMES[int(t)]
        if name in ("S", "P"):
            nbytes[sel] = rows[sel] * (kt.c1[sel] - kt.c0[sel]) * p.elem_bytes
        else:
            width = 1 if name in ROW_TENSORS else p.head_dim
            nbytes[sel] = rows[sel] * width * (STAT_BYTES if name in FP32_TENSORS else p.elem_bytes)
    return nbytes


def global_bytes(kt: KernelTrace, p: AttentionProblem, n_heads: int) -> tuple[int, int]:
    """The trace's requested bytes (all heads): equal to the schedule's ``global`` count (tested)."""
    nbytes = _access_bytes(kt, p)
    return int(nbytes[~kt.write].sum()) * n_heads, int(nbytes[kt.write].sum()) * n_heads
