"""Closed forms over whole sweeps at once: every shape parameter may be a NumPy array (they broadcast).

    >>> cols = sweep("flash2", dict(seq_len=np.geomspace(128, 2**20, 14).astype(int), head_dim=128, heads=32),
    ...              block_q=128, block_kv=64)
    >>> cols["global_read_bytes"]          # one integer per sequence length

The closed forms are the very functions ``simulate`` uses (``iosim/schedules/*.py``), evaluated on arrays;
the tests check every element against the scalar path.

Counts are exact: the sizes enter as arrays of Python ints (dtype object), so no product wraps around 64 bits.
A column whose values all fit in int64 comes back as int64 (every realistic sweep); a column with a larger
value comes back as an object array of exact Python ints (flash2 at N = 8,388,608, 128 heads, batch 16 executes
73,786,976,294,838,206,464 matmul FLOPs, 7.38e19 > 2^63).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from .counts import TENSORS
from .problem import ELEMENT_BYTES, MAX_LEN
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


SIZES = {"seq_len": None, "kv_len": None, "head_dim": 128, "batch": 1, "heads": 1}  # None: required / = seq_len
SHARED = {"dtype": "fp16", "causal": False}  # one value for the whole sweep


def sweep(schedule: str, problem: Mapping, *, block_q=None, block_kv=None) -> dict[str, np.ndarray]:
    """Totals over all heads for every point of the broadcast parameters, as a dict of integer arrays.

    ``problem``: AttentionProblem's fields by name, as ``simulate`` takes them in a dict, whose sizes may be arrays
    (they broadcast): ``seq_len`` (required), ``kv_len`` (default: seq_len), ``head_dim`` (128), ``batch`` (1),
    ``heads`` (1); ``dtype`` ("fp16") and ``causal`` (False) are one value for the whole sweep. Tiled schedules
    need ``block_q`` and ``block_kv`` (ints or arrays); the fit check is not applied here (use
    :func:`iosim.schedules.check_fit` or ``simulate`` for single points).
    """
    mod = get_schedule(schedule)
    seq_len, kv_len, head_dim, batch, heads, dtype, causal = _fields(problem)
    if dtype not in ELEMENT_BYTES:
        raise ScheduleError(f"dtype={dtype!r}: expected one of {', '.join(ELEMENT_BYTES)}")
    if not isinstance(causal, (bool, np.bool_)):  # causal="no" is a true value: never read truthiness
        raise ScheduleError(f"causal={causal!r}: expected True or False (a bool, one for the whole sweep)")
    causal = bool(causal)
    names = ("batch", "heads", "seq_len", "kv_len", "head_dim")
    arrays = np.broadcast_arrays(*(_exact(name, x) for name, x in zip(names, (batch, heads, seq_len, kv_len,
                                                                             head_dim), strict=True)))
    for name, a in zip(names, arrays, strict=True):
        if name in ("seq_len", "kv_len") and a.size and max(a.flat) > MAX_LEN:
            raise ScheduleError(f"{name}={max(a.flat)} in the sweep: at most {MAX_LEN:,} (2^31), the length up to "
                                "which the tile walks count visited score elements exactly in 64-bit integers")
    p = ProblemArrays(*arrays, dtype=dtype, causal=causal)
    if (block_q is None) != (block_kv is None):
        raise ScheduleError("give block_q and block_kv together")
    if block_q is None and schedule != "naive":
        raise ScheduleError(f"{schedule}: a sweep needs explicit block_q and block_kv")
    t = TileArrays(None, None) if block_q is None else TileArrays(
        *np.broadcast_arrays(_exact("block_q", block_q), _exact("block_kv", block_kv)))
    shape = np.broadcast_shapes(arrays[0].shape, *(np.shape(x) for x in (t.block_q, t.block_kv) if x is not None))
    zero = np.zeros(shape, dtype=object)
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
    return {key: _narrowed(np.broadcast_to(v, shape)) for key, v in out.items()}


def _fields(problem: Mapping) -> tuple:
    """``problem``'s sizes, dtype and causal, with the defaults of the fields not given."""
    if not isinstance(problem, Mapping):
        raise TypeError(f"problem: expected a dict of AttentionProblem's fields (sizes may be arrays), got "
                        f"{type(problem).__name__}; e.g. sweep('flash2', dict(seq_len=[1024, 4096]), ...)")
    unknown = sorted(set(problem) - set(SIZES) - set(SHARED))
    if unknown:
        raise ScheduleError(f"{', '.join(map(repr, unknown))}: not a field a sweep takes; expected "
                            f"{', '.join((*SIZES, *SHARED))}")
    if "seq_len" not in problem:
        raise ScheduleError("seq_len: required (an int or an array of ints)")
    given = {**SIZES, **SHARED, **problem}
    if given["kv_len"] is None:
        given["kv_len"] = given["seq_len"]
    return tuple(given[name] for name in (*SIZES, *SHARED))


def _exact(name: str, x) -> np.ndarray:
    """``x`` as an array of Python ints (dtype object), refusing anything that is not a whole number >= 1."""
    a = np.asarray(x)
    if a.size == 0:  # np.asarray([]) is float64: say what is wrong, not the dtype
        raise ScheduleError(f"{name}=[] in the sweep: empty; expected at least one size")
    if a.dtype.kind not in "iuO" or a.dtype == bool:
        raise ScheduleError(f"{name}: expected whole numbers (ints or an integer array), got dtype {a.dtype}")
    flat = [int(v) for v in a.flat]
    bad = [v for v in flat if v < 1]
    if bad:
        raise ScheduleError(f"{name}={bad[0]} in the sweep: every size must be >= 1")
    return np.array(flat, dtype=object).reshape(a.shape)


def _narrowed(a: np.ndarray) -> np.ndarray:
    """int64 where every value fits (the common case), else the exact Python ints as an object array."""
    lo, hi = np.iinfo(np.int64).min, np.iinfo(np.int64).max
    if all(lo <= int(v) <= hi for v in a.flat):
        return a.astype(np.int64)
    return np.array([int(v) for v in a.flat], dtype=object).reshape(a.shape)
