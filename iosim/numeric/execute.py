"""Run a schedule's tile programs numerically, head by head, on the same global memory a GPU kernel would use.

Global outputs start poisoned (NaN), so an element the schedule never writes fails the exactness tests.

    >>> O, stats = execute("flash2", problem, q, k, v)      # q: (batch, seq_len, heads, head_dim)
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ..hardware.gpu import get_profile
from ..problem import AttentionProblem
from ..schedules import ScheduleError, Tiles, get_schedule, resolve_tiles
from ..schedules.decode_layout import PagedDecodingTiles
from .machine import F32, NumericMachine, round_to_dtype


def _check_inputs(p: AttentionProblem, q, k, v) -> None:
    want_q = (p.batch, p.seq_len, p.heads, p.head_dim)
    want_kv = (p.batch, p.kv_len, p.kv_heads, p.head_dim)
    for name, a, want in (("q", q, want_q), ("k", k, want_kv), ("v", v, want_kv)):
        if tuple(np.shape(a)) != want:
            raise ValueError(f"{name} has shape {tuple(np.shape(a))}, expected (batch, seq, heads, head_dim) = {want}")


def execute(schedule: str, problem: AttentionProblem, q, k, v, tiles: Tiles | None = None, *,
            kv_order=None) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Run ``schedule`` numerically. Inputs (batch, seq, heads, head_dim) are first rounded to the problem dtype.

    Returns O (batch, seq_len, heads, head_dim) as float32 holding dtype-rounded values, and the global
    statistics the schedule wrote (``lse`` for flash2; ``m``, ``l`` for flash1), each (batch, heads, seq_len).
    ``tiles``: None = the schedule's default tiles on the default profile (another profile's:
    ``resolve_tiles(schedule, problem, get_profile(name))``). ``kv_order`` (a function of the list of K/V block
    indices) changes the order of the K/V loop.
    """
    p = problem
    _check_inputs(p, q, k, v)
    mod = get_schedule(schedule)
    if tiles is None:
        tiles = resolve_tiles(schedule, p, get_profile())
    if isinstance(tiles, PagedDecodingTiles):
        raise ScheduleError("flash-decoding with iosim's decode kernel's tiles is counted, not executed here: that "
                            "program's numbers are the GPU kernel's, checked against float64 by "
                            "tests/gpu/test_decode_gpu.py")
    if getattr(tiles, "window", None) is not None or getattr(tiles, "seqlens", ()):
        raise ScheduleError("flash2's window and packed sequences are counted, not executed: the numeric machine's "
                            "masks are the dense batch's (iosim.gpu.attention_varlen runs them)")
    q, k, v = (round_to_dtype(a, p.dtype) for a in (q, k, v))
    if mod.unit == "kv_head":
        return _execute_kv_heads(mod, p, q, k, v, tiles, kv_order)
    O = np.full((p.batch, p.seq_len, p.heads, p.head_dim), np.nan, F32)
    stats = {s: np.full((p.batch, p.heads, p.seq_len), np.nan, F32) for s in mod.stats}
    for b in range(p.batch):
        for h in range(p.heads):
            hk = h // p.group
            g = {
                "Q": q[b, :, h], "K": k[b, :, hk], "V": v[b, :, hk],
                "O": np.full((p.seq_len, p.head_dim), np.nan, F32),
                "S": np.full((p.seq_len, p.kv_len), np.nan, F32),
                "P": np.full((p.seq_len, p.kv_len), np.nan, F32),
            }
            for s in mod.stats:
                g[s] = np.full(p.seq_len, np.nan, F32)
            mod.program(NumericMachine(p, g, kv_order), p, tiles)
            O[b, :, h] = g["O"]
            for s in mod.stats:
                stats[s][b, h] = g[s]
    return O, stats


def _execute_kv_heads(mod, p: AttentionProblem, q, k, v, tiles: Tiles, kv_order):
    """``execute`` for a schedule whose unit is one kv head: its group of query heads packed as rows
    (row r = n·group + g), so that one program run reads K and V once for the whole group."""
    N, d, G = p.seq_len, p.head_dim, p.group
    R, S = G * N, getattr(tiles, "splits", 1)
    O = np.full((p.batch, N, p.heads, d), np.nan, F32)
    stats = {s: np.full((p.batch, p.heads, N), np.nan, F32) for s in mod.stats}
    for b in range(p.batch):
        for hk in range(p.kv_heads):
            heads = slice(hk * G, (hk + 1) * G)
            g = {
                "Q": q[b, :, heads].reshape(R, d),  # (N, G, d) -> rows n·G + g
                "K": k[b, :, hk], "V": v[b, :, hk],
                "O": np.full((R, d), np.nan, F32),
                "Opart": np.full((S * R, d), np.nan, F32),
                "lsepart": np.full(S * R, np.nan, F32),
                **{s: np.full(R, np.nan, F32) for s in mod.stats},
            }
            x = NumericMachine(p, g, kv_order)
            x.rows_per_query = G  # causal mask: packed row r is query position r // G
            mod.program(x, p, tiles)
            O[b, :, heads] = g["O"].reshape(N, G, d)
            for s in mod.stats:
                stats[s][b, heads] = g[s].reshape(N, G).T
    return O, stats


ROW_TENSORS = ("Q", "dO", "O", "dQ", "dQacc", "lse", "D", "m", "l")  # a query head's tensors along its rows


def execute_backward(schedule: str, problem: AttentionProblem, q, k, v, do,
                     tiles: Tiles | Mapping[str, Tiles] | None = None, *,
                     kv_order=None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Run ``schedule``'s forward tile program, then its backward tile program, on the same global memory
    (the backward reads the O, statistics, and for naive P, that the forward stored).

    ``tiles``: one Tiles for both passes, or each pass's by name, ``{"forward": ..., "backward": ...}`` (the shape
    of ``Result.tiles_by_pass``); a pass not given runs the schedule's default tiles on the default profile (as
    ``simulate``'s passes do). ``kv_order``: as :func:`execute`'s.

    Inputs (batch, seq, heads, head_dim) are rounded to the problem dtype first. Returns dQ (batch, seq_len,
    heads, d) and dK, dV (batch, kv_len, kv_heads, d) as float32 arrays holding dtype-rounded values. With
    grouped-query heads and a backward program per query head, each query head's dK, dV are summed over the group
    in fp32 and rounded once (the group-sum kernel of ``iosim.schedules.backward``); a program per kv head
    (flash2's ``gqa="grouped"`` tiles) runs once on its group's rows and writes dK, dV summed itself.
    """
    p = problem
    _check_inputs(p, q, k, v)
    if tuple(np.shape(do)) != tuple(np.shape(q)):
        raise ValueError(f"do has shape {tuple(np.shape(do))}, expected the shape of q {tuple(np.shape(q))}")
    fwd, bwd = get_schedule(schedule), get_schedule(schedule, "backward")
    fwd_tiles, tiles = _pass_tiles(schedule, p, tiles)
    q, k, v, do = (round_to_dtype(a, p.dtype) for a in (q, k, v, do))
    N, Nk, d, G = p.seq_len, p.kv_len, p.head_dim, p.group
    dq = np.full((p.batch, N, p.heads, d), np.nan, F32)
    dk, dv = (np.full((p.batch, Nk, p.kv_heads, d), np.nan, F32) for _ in range(2))
    grouped = bwd.unit_of(tiles) == "kv_head"
    for b in range(p.batch):
        for hk in range(p.kv_heads):
            heads = range(hk * G, (hk + 1) * G)
            mems = [_head_memory(p, q[b, :, h], k[b, :, hk], v[b, :, hk], do[b, :, h]) for h in heads]
            for g in mems:
                fwd.program(NumericMachine(p, g, kv_order), p, fwd_tiles)
            if grouped:  # one program for the kv head: its query heads' rows stacked, head g's at g·N
                g = {**mems[0], **{t: np.concatenate([m[t] for m in mems]) for t in ROW_TENSORS}}
                bwd.program(NumericMachine(p, g, kv_order), p, tiles)
                dq[b, :, heads.start:heads.stop] = g["dQ"].reshape(G, N, d).transpose(1, 0, 2)
                dk[b, :, hk], dv[b, :, hk] = g["dK"], g["dV"]  # summed over the group on chip, rounded once
                continue
            for h, g in zip(heads, mems, strict=True):
                bwd.program(NumericMachine(p, g, kv_order), p, tiles)
                dq[b, :, h] = g["dQ"]
            for out, t in ((dk, "dK"), (dv, "dV")):  # the group-sum kernel: fp32 sum of the copies, rounded once
                out[b, :, hk] = round_to_dtype(np.stack([m[t] for m in mems]).sum(axis=0, dtype=F32), p.dtype)
    return dq, dk, dv


def _pass_tiles(schedule: str, p: AttentionProblem, tiles) -> tuple[Tiles, Tiles]:
    """(forward tiles, backward tiles) from ``execute_backward``'s ``tiles``."""
    by_pass = dict(tiles) if isinstance(tiles, Mapping) else {} if tiles is None else {"forward": tiles,
                                                                                      "backward": tiles}
    unknown = set(by_pass) - {"forward", "backward"}
    if unknown:
        raise ValueError(f"tiles: unknown pass {sorted(unknown)}; expected 'forward' and/or 'backward'")
    return tuple(by_pass.get(ps) or resolve_tiles(schedule, p, get_profile(), pass_=ps)
                 for ps in ("forward", "backward"))


def _head_memory(p: AttentionProblem, q, k, v, do) -> dict[str, np.ndarray]:
    """One query head's global memory: its inputs, and every output poisoned (NaN)."""
    N, Nk, d = p.seq_len, p.kv_len, p.head_dim
    return {
        "Q": q, "K": k, "V": v, "dO": do,
        **{t: np.full((N, d), np.nan, F32) for t in ("O", "dQ", "dQacc")},
        **{t: np.full((Nk, d), np.nan, F32) for t in ("dK", "dV")},
        **{t: np.full((N, Nk), np.nan, F32) for t in ("S", "P", "dS", "dP")},
        **{t: np.full(N, np.nan, F32) for t in ("m", "l", "lse", "D")},
    }
