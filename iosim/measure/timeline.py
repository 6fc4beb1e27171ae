"""The block timeline of iosim's flash2 kernel: each thread block's SM, start and end (GPU).

The kernel built with ``-DIOSIM_BLOCK_TRACE`` (``iosim.gpu.attention(..., block_trace=buf)``) writes
``start_ns, end_ns, sm_id, 0`` per block at 4 x its linear block id. :func:`iosim.calibrate.block_share` reads the
profile's ``sm.block_share`` from it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace

import numpy as np

from .. import gpu
from .runs import Attention, MeasureError


@dataclass(frozen=True)
class Timeline:
    """One launch's blocks, in linear block order: start and end (ns, the GPU's global timer) and SM."""

    start_ns: np.ndarray
    end_ns: np.ndarray
    sm: np.ndarray
    run: Attention

    def save(self, path) -> None:
        np.savez_compressed(path, start_ns=self.start_ns, end_ns=self.end_ns, sm=self.sm,
                            config=json.dumps(asdict(self.run)))


def block_timeline(run: Attention, warmup: int = 1) -> Timeline:
    """Launch ``run`` (flash2) ``warmup`` times, then once with the block trace; its timeline."""
    if run.kind != "flash2":
        raise MeasureError(f"kind={run.kind!r}: block timelines come from the flash2 kernel only")
    import cupy as cp
    import torch

    dt = {"fp16": torch.float16, "bf16": torch.bfloat16}[run.dtype]
    shape_q = (run.batch, run.seq_len, run.heads, run.head_dim)
    shape_kv = (run.batch, run.kv_len, run.kv_heads, run.head_dim)
    q = torch.randn(shape_q, device="cuda", dtype=dt)
    k, v = torch.randn(shape_kv, device="cuda", dtype=dt), torch.randn(shape_kv, device="cuda", dtype=dt)
    tiles = gpu.AttentionOptions(block_q=run.block_q, block_kv=run.block_kv)
    for _ in range(warmup):
        gpu.attention(q, k, v, causal=run.causal, options=tiles)
    block_q = gpu.last_launch().tiles["block_q"]
    n_blocks = -(-run.seq_len // block_q) * run.heads * run.batch
    buf = cp.zeros(4 * n_blocks, dtype=cp.uint64)
    gpu.attention(q, k, v, causal=run.causal, options=replace(tiles, block_trace=buf))
    cp.cuda.Device().synchronize()
    rec = cp.asnumpy(buf).reshape(-1, 4).astype(np.int64)
    return Timeline(rec[:, 0], rec[:, 1], rec[:, 2], run)
