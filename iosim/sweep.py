"""Closed forms over whole sweeps at once: every shape parameter may be a NumPy array (they broadcast).

    >>> cols = sweep("flash2", seq_len=np.geomspace(128, 2**20, 14).astype(int), head_dim=128,
    ...              heads=32, block_q=128, block_kv=64)
    >>> cols["global_read_bytes"]          # one integer per sequence length

The closed forms are the very functions ``simulate`` uses (``iosim/schedules/*.py``), evaluated on arrays;
the tests check every element against the scalar path.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .counts import TENSORS
from .problem import ELEMENT_BYTES
from .schedules import ScheduleError, get_schedule


@dataclass(frozen=True)
class ProblemArrays:
    """An AttentionProblem whose sizes are arrays (dtype and causal are shared by the whole sweep)."""

    batch: np.ndarray
    heads: np.ndarray
    seq_len: np.ndarray
    kv_len: np.ndarray
    head_dim: np.ndarray
    dtype: str
    causal: bool

    @property
    def elem_bytes(self) -> int:
        return ELEMENT_BYTES[self.dtype]

    @property
    def n_heads_total(self) -> np.ndarray:
        return self.batch * self.heads


@dataclass(frozen=True)
class TileArrays:
    block_q: np.ndarray | None
    block_kv: np.ndarray | None
    sram_elements: None = None


def sweep(schedule: str, *, seq_len, kv_len=None, head_dim=128, batch=1, heads=1, dtype: str = "fp16",
          causal: bool = False, block_q=None, block_kv=None) -> dict[str, np.ndarray]:
    """Totals over all heads for every point of the broadcast parameters, as a dict of integer arrays.

    Tiled schedules need ``block_q`` and ``block_kv`` (ints or arrays); the fit check is not applied here
    (use :func:`iosim.simulate.check_fit` or ``simulate`` for single points).
    """
    mod = get_schedule(schedule)
    if dtype not in ELEMENT_BYTES:
        raise ScheduleError(f"dtype={dtype!r}: expected fp32, fp16 or bf16")
    kv_len = seq_len if kv_len is None else kv_len
    arrays = np.broadcast_arrays(*(np.asarray(x, dtype=np.int64) for x in (batch, heads, seq_len, kv_len, head_dim)))
    if (np.concatenate([a.ravel() for a in arrays]) < 1).any():
        raise ScheduleError("every size in a sweep must be >= 1")
    p = ProblemArrays(*arrays, dtype=dtype, causal=causal)
    if (block_q is None) != (block_kv is None):
        raise ScheduleError("give block_q and block_kv together")
    if block_q is None and schedule != "naive":
        raise ScheduleError(f"{schedule}: a sweep needs explicit block_q and block_kv")
    t = TileArrays(None, None) if block_q is None else TileArrays(
        *np.broadcast_arrays(np.asarray(block_q, dtype=np.int64), np.asarray(block_kv, dtype=np.int64)))
    shape = np.broadcast_shapes(arrays[0].shape, *(np.shape(x) for x in (t.block_q, t.block_kv) if x is not None))
    zero = np.zeros(shape, dtype=np.int64)
    out = {"global_read_bytes": zero.copy(), "global_write_bytes": zero.copy(), "sram_read_bytes": zero.copy(),
           "sram_write_bytes": zero.copy(), "flops_matmul": zero.copy(), "flops_exp": zero.copy(),
           "flops_other": zero.copy(), "sram_peak_bytes": zero.copy()}
    for tensor in TENSORS:
        out[f"{tensor}_global_read_bytes"] = zero.copy()
        out[f"{tensor}_global_write_bytes"] = zero.copy()
    n = p.n_heads_total
    for k in mod.closed_form(p, t).kernels:
        for tensor, v in k.global_read.items():
            out[f"{tensor}_global_read_bytes"] = out[f"{tensor}_global_read_bytes"] + v * n
            out["global_read_bytes"] = out["global_read_bytes"] + v * n
        for tensor, v in k.global_write.items():
            out[f"{tensor}_global_write_bytes"] = out[f"{tensor}_global_write_bytes"] + v * n
            out["global_write_bytes"] = out["global_write_bytes"] + v * n
        out["sram_read_bytes"] = out["sram_read_bytes"] + k.sram_read * n
        out["sram_write_bytes"] = out["sram_write_bytes"] + k.sram_write * n
        for f in ("matmul", "exp", "other"):
            out[f"flops_{f}"] = out[f"flops_{f}"] + k.flops[f] * n
        if k.sram_peak is not None:
            out["sram_peak_bytes"] = np.maximum(out["sram_peak_bytes"], k.sram_peak)
    return {key: np.broadcast_to(v, shape).astype(np.int64) for key, v in out.items()}
