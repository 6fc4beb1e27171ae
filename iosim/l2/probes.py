"""The L2 model run on the probe kernels of :mod:`iosim.measure` (``l2probe``, ``l2write``).

The probes measure how the GPU's L2 keeps and evicts lines; running the model on the same access streams checks its
cache policy against them before any attention kernel is compared (docs/validation.md, "L2 probes").

A probe runs one thread block per SM with grid-stride loops, so at any moment the SMs together sweep a contiguous
front of the buffer; the model sees it as 4 KiB chunks (one 256-thread float4 step of one block), chunk
``k * sms + b`` at step ``k`` of block ``b``. Writes go to rows of ``O``; private reads (each line read by one SM) to
rows of ``Q``; shared reads (every SM reads the whole buffer in the same order) to rows of ``K``, which every block
of the head indexes alike; reads of what was written (``read_written``) to the same rows of ``O``. In the reuse
probe (``l2reuse``) the buffer read again is in rows of ``Q`` (private) or ``K`` (read by a group of SMs, or by
all), the other data in rows of ``V``.
"""

from __future__ import annotations

import numpy as np

from ..blocks import cdiv
from ..problem import AttentionProblem
from ..schedules import Tiles
from ._common import TENSOR_CODES
from .cache import L2Result, simulate_l2
from .trace import KernelTrace

CHUNK = 4096  # bytes one block moves per grid-stride step (256 threads x 16 B)
_ROW = 256  # bytes per row of the stand-in tensors (head_dim 128, fp16)


def probe_trace(
    write_bytes: int,
    read_bytes: int = 0,
    *,
    shared: bool = False,
    reread: bool = False,
    interleave: bool = False,
    read_written: bool = False,
    hot_bytes: int = 0,
    hot_reps: int = 1,
    group: int = 1,
    sms: int = 132,
) -> tuple[KernelTrace, AttentionProblem]:
    """The access stream of ``l2write`` (``write_bytes`` written, then ``read_bytes`` read, private or shared;
    ``interleave``: step k of a block reads its k-th chunk of the read buffer, then writes its k-th of the written
    one; ``read_written``: the written bytes read back, each chunk by the SM that wrote it, ``read_bytes`` unused)
    or, with ``reread``, of ``l2probe`` (``read_bytes`` read twice, private); with ``hot_bytes``, of ``l2reuse``
    (``hot_bytes`` read ``hot_reps`` times, private, by the ``group`` SMs of a group (chunk k by group k mod
    sms / group) or ``shared``, then ``read_bytes`` of other data, private, then ``hot_bytes`` once more; nothing
    written)."""
    rows = CHUNK // _ROW
    nw, nr = cdiv(write_bytes, CHUNK), cdiv(read_bytes, CHUNK)
    nh = cdiv(hot_bytes, CHUNK)
    if group < 1 or sms % group or (group > 1 and not hot_bytes):
        raise ValueError(f"group={group}: a divisor of sms={sms}, for the reuse probe (hot_bytes)")
    if shared:
        group = sms
    if hot_bytes and (write_bytes or reread or interleave or read_written or hot_reps < 1):
        raise ValueError(
            "hot_bytes: the reuse probe reads only (hot_reps >= 1; no writes, reread, interleave)"
        )
    blocks: list[list[tuple]] = [[] for _ in range(sms)]
    for b in range(sms):
        acc = blocks[b]
        if nh:
            code = TENSOR_CODES["K" if group > 1 else "Q"]
            chunks = range(b // group, nh, sms // group)
            hot = [(code, c * rows, (c + 1) * rows, False) for c in chunks]
            acc += hot * hot_reps
            acc += [(TENSOR_CODES["V"], c * rows, (c + 1) * rows, False) for c in range(b, nr, sms)]
            acc += hot
            continue
        if interleave:
            for c in range(b, max(nw, nr), sms):
                if c < nr:
                    acc.append((TENSOR_CODES["Q"], c * rows, (c + 1) * rows, False))
                if c < nw:
                    acc.append((TENSOR_CODES["O"], c * rows, (c + 1) * rows, True))
            continue
        for c in range(b, nw, sms):
            acc.append((TENSOR_CODES["O"], c * rows, (c + 1) * rows, True))
        if read_written:
            acc += [(TENSOR_CODES["O"], c * rows, (c + 1) * rows, False) for c in range(b, nw, sms)]
            continue
        for _ in range(2 if reread else 1):
            chunks = range(nr) if shared else range(b, nr, sms)
            code = TENSOR_CODES["K" if shared else "Q"]
            acc += [(code, c * rows, (c + 1) * rows, False) for c in chunks]
    ptr = np.zeros(sms + 1, dtype=np.int64)
    ptr[1:] = np.cumsum([len(a) for a in blocks])
    flat = np.array([a for acc in blocks for a in acc], dtype=np.int64).reshape(-1, 4)
    zeros = np.zeros(len(flat), dtype=np.int64)
    kt = KernelTrace(
        "probe",
        ptr,
        flat[:, 0].astype(np.int8),
        flat[:, 1].copy(),
        flat[:, 2].copy(),
        zeros,
        zeros.copy(),
        flat[:, 3].astype(bool),
    )
    n_rows = max(nw, nr, nh, 1) * rows
    return kt, AttentionProblem(seq_len=n_rows, heads=1, head_dim=_ROW // 2, dtype="fp16")


def simulate_probe(
    write_bytes: int,
    read_bytes: int = 0,
    profile=None,
    *,
    shared: bool = False,
    reread: bool = False,
    interleave: bool = False,
    read_written: bool = False,
    hot_bytes: int = 0,
    hot_reps: int = 1,
    group: int = 1,
    sms: int = 132,
    **model,
) -> L2Result:
    """DRAM bytes the L2 model predicts for a probe (``model``: simulate_l2's cache options)."""
    kt, p = probe_trace(
        write_bytes,
        read_bytes,
        shared=shared,
        reread=reread,
        interleave=interleave,
        read_written=read_written,
        hot_bytes=hot_bytes,
        hot_reps=hot_reps,
        group=group,
        sms=sms,
    )
    return simulate_l2(
        "flash2", p, Tiles(CHUNK // _ROW, CHUNK // _ROW), profile, traces=[kt], resident=sms, **model
    )
