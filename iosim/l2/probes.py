"""The L2 model run on the calibration probes of :mod:`iosim.measure` (``l2probe``, ``l2write``).

The probes measure how the GPU's L2 keeps and evicts lines, and so give the profile's ``l2.room`` factors and
``l2.dirty_at_start``: the values that make the model reproduce the probes' DRAM bytes (:mod:`iosim.calibrate`).

A probe runs one thread block per SM with grid-stride loops, so at any moment the SMs together sweep a contiguous
front of the buffer; the model sees it as 4 KiB chunks (one 256-thread float4 step of one block), chunk
``k * sms + b`` at step ``k`` of block ``b``. Writes go to rows of ``O``; private reads (each line read by one SM) to
rows of ``Q``; shared reads (every SM reads the whole buffer in the same order) to rows of ``K``, which every block
of the head indexes alike.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..blocks import cdiv
from ..problem import AttentionProblem
from ..schedules import Tiles
from ._common import TENSOR_CODES
from .model import PROFILE_INPUTS, L2Inputs, L2Result, simulate_traces
from .trace import KernelTrace

CHUNK = 4096  # bytes one block moves per grid-stride step (256 threads x 16 B)
_ROW = 256  # bytes per row of the stand-in tensors (head_dim 128, fp16)


def _block_accesses(b: int, nw: int, nr: int, sms: int, shared: bool, reread: bool, interleave: bool) -> list:
    """Probe block ``b``'s accesses as (tensor, first row, end row, write)."""
    rows, acc = CHUNK // _ROW, []
    if interleave:
        for c in range(b, max(nw, nr), sms):
            if c < nr:
                acc.append((TENSOR_CODES["Q"], c * rows, (c + 1) * rows, False))
            if c < nw:
                acc.append((TENSOR_CODES["O"], c * rows, (c + 1) * rows, True))
        return acc
    acc += [(TENSOR_CODES["O"], c * rows, (c + 1) * rows, True) for c in range(b, nw, sms)]
    for _ in range(2 if reread else 1):
        chunks = range(nr) if shared else range(b, nr, sms)
        code = TENSOR_CODES["K" if shared else "Q"]
        acc += [(code, c * rows, (c + 1) * rows, False) for c in chunks]
    return acc


def probe_trace(write_bytes: int, read_bytes: int = 0, *, shared: bool = False, reread: bool = False,
                interleave: bool = False, sms: int = 132) -> tuple[KernelTrace, AttentionProblem]:
    """The access stream of ``l2write`` (``write_bytes`` written, then ``read_bytes`` read, private or ``shared``;
    ``interleave``: step k of a block reads its k-th chunk of the read buffer, then writes its k-th of the written
    one) or, with ``reread``, of ``l2probe`` (``read_bytes`` read twice, private)."""
    nw, nr = cdiv(write_bytes, CHUNK), cdiv(read_bytes, CHUNK)
    blocks = [_block_accesses(b, nw, nr, sms, shared, reread, interleave) for b in range(sms)]
    ptr = np.zeros(sms + 1, dtype=np.int64)
    ptr[1:] = np.cumsum([len(a) for a in blocks])
    flat = np.array([a for acc in blocks for a in acc], dtype=np.int64).reshape(-1, 4)
    zeros = np.zeros(len(flat), dtype=np.int64)
    kt = KernelTrace("probe", ptr, flat[:, 0].astype(np.int8), flat[:, 1].copy(), flat[:, 2].copy(), zeros,
                     zeros.copy(), flat[:, 3].astype(bool))
    n_rows = max(nw, nr, 1) * (CHUNK // _ROW)
    return kt, AttentionProblem(seq_len=n_rows, heads=1, head_dim=_ROW // 2, dtype="fp16")


def simulate_probe(write_bytes: int, read_bytes: int = 0, profile=None, inputs: L2Inputs = PROFILE_INPUTS, *,
                   shared: bool = False, reread: bool = False, interleave: bool = False, sms: int = 132) -> L2Result:
    """DRAM bytes the L2 model predicts for a probe (``inputs``: the L2 inputs to try instead of the profile's)."""
    kt, p = probe_trace(write_bytes, read_bytes, shared=shared, reread=reread, interleave=interleave, sms=sms)
    return simulate_traces([kt], p, Tiles(CHUNK // _ROW, CHUNK // _ROW), profile, replace(inputs, resident=sms))
