"""Reference: a plain line-level LRU over the exact trace (for tests; slow, small problems only).

Part of the L2 model; the model as a whole is described in :mod:`iosim.l2`.
"""

from __future__ import annotations

from ..problem import STAT_BYTES, AttentionProblem
from ..profile import Profile, get_profile
from ..schedules import Tiles
from ._common import TENSOR_NAMES
from .cache import _head_slots, simulate_l2
from .launch import launch_model, resident_blocks
from .trace import KernelTrace, trace_program


def reference_lines(
    schedule: str,
    problem: AttentionProblem,
    tiles: Tiles,
    profile: str | Profile | None = None,
    *,
    capacity: int,
    line: int = 128,
    resident: int | list[int] | None = None,
    variant: str = "iosim",
    traces: list[KernelTrace] | None = None,
    dirty_limit: int = 0,
) -> list[tuple[int, int, int]]:
    """(dram_read, dram_write, dirty_at_end) per kernel from an OrderedDict LRU over lines of real addresses.

    Addresses follow the GPU layouts: Q, O (B, N, H, d); K, V (B, N_kv, H_kv, d); S, P (B, H, N, N_kv);
    lse, m, l (B, H, N). Every tensor is line-aligned in its own address range. Each access is walked row by
    row, line by line, in the round-robin order of :func:`simulate_l2` without de-duplication. ``dirty_limit`` > 0:
    past that many dirty bytes the least recent dirty lines are written back and stay in L2, clean."""
    from collections import OrderedDict

    p = problem
    prof = get_profile(profile)
    lm = launch_model(schedule, p, tiles, variant=variant)
    if traces is None:
        traces = trace_program(schedule, p, tiles, kv_order=lm.kv_order)
    head_q, head_kv = _head_slots(p, lm.head_order)
    H, Hk, N, Nk, d, e = p.heads, p.kv_heads, p.seq_len, p.kv_len, p.head_dim, p.elem_bytes
    region = 1 << 40

    def addr(t, qh, kvh, r, c):
        name = TENSOR_NAMES[t]
        base = t * region
        if name in ("Q", "O"):
            b, h = divmod(qh, H)
            return base + (((b * N + r) * H + h) * d + c) * e
        if name in ("K", "V"):
            b, h = divmod(kvh, Hk)
            return base + (((b * Nk + r) * Hk + h) * d + c) * e
        if name in ("S", "P"):
            return base + ((qh * N + r) * Nk + c) * e
        return base + (qh * N + r) * STAT_BYTES

    out = []
    for ki, kt in enumerate(traces):
        klm = lm.kernels[ki]
        if resident is None:
            r_gpu, _ = resident_blocks(prof, klm.threads, klm.smem, klm.registers)
            R = max(1, r_gpu // klm.gpu_blocks_per_block)
        else:
            R = resident[ki] if isinstance(resident, (list, tuple)) else resident
        nb = kt.n_blocks
        order = list(range(nb))[::-1] if klm.block_order == "reverse" else list(range(nb))
        queue = [(h, order[b]) for h in range(len(head_q)) for b in range(nb)]
        cache: OrderedDict = OrderedDict()  # line -> dirty bytes
        dirty: OrderedDict = OrderedDict()  # the dirty lines, least recent first
        n_dirty = 0
        lines_cap = capacity // line
        rd = wr = 0
        slots = [None] * min(R, len(queue))
        nxt_blk = 0
        for s in range(len(slots)):
            h, b = queue[nxt_blk]
            slots[s] = [h, int(kt.ptr[b]), int(kt.ptr[b + 1])]
            nxt_blk += 1
        while any(sl is not None for sl in slots):
            for s, sl in enumerate(slots):
                if sl is None:
                    continue
                h, pos, end = sl
                if pos < end:
                    t = int(kt.tensor[pos])
                    w = bool(kt.write[pos])
                    name = TENSOR_NAMES[t]
                    r0, r1 = int(kt.r0[pos]), int(kt.r1[pos])
                    if name in ("S", "P"):
                        c0, c1 = int(kt.c0[pos]), int(kt.c1[pos])
                    elif name in ("m", "l", "lse"):
                        c0, c1 = 0, 1
                    else:
                        c0, c1 = 0, d
                    el = STAT_BYTES if name in ("m", "l", "lse") else e
                    for r in range(r0, r1):
                        a0 = addr(t, int(head_q[h]), int(head_kv[h]), r, c0)
                        nbytes = (c1 - c0) * el
                        for ln in range(a0 // line, (a0 + nbytes - 1) // line + 1):
                            lo, hi = max(a0, ln * line), min(a0 + nbytes, (ln + 1) * line)
                            if ln in cache:
                                cache.move_to_end(ln)
                                if w:
                                    old = cache[ln]
                                    cache[ln] = min(line, old + hi - lo)  # each byte is written once
                                    n_dirty += cache[ln] - old
                            else:
                                if not w:
                                    rd += hi - lo
                                cache[ln] = hi - lo if w else 0  # dirty bytes of the line
                                n_dirty += cache[ln]
                                if len(cache) > lines_cap:
                                    old, dt = cache.popitem(last=False)
                                    wr += dt
                                    n_dirty -= dt
                                    dirty.pop(old, None)
                            if cache.get(ln):
                                dirty[ln] = True
                                dirty.move_to_end(ln)
                            while dirty_limit and n_dirty > dirty_limit:
                                old, _ = dirty.popitem(last=False)
                                wr += cache[old]
                                n_dirty -= cache[old]
                                cache[old] = 0
                    sl[1] = pos + 1
                    pos += 1
                if pos >= end:
                    if nxt_blk < len(queue):
                        hh, b = queue[nxt_blk]
                        slots[s] = [hh, int(kt.ptr[b]), int(kt.ptr[b + 1])]
                        nxt_blk += 1
                    else:
                        slots[s] = None
        dirty_end = sum(cache.values())
        out.append((rd, wr, dirty_end))
    return out


def compulsory(schedule: str, problem: AttentionProblem, tiles: Tiles) -> list[tuple[int, int]]:
    """Unique bytes read and written per kernel (all heads): DRAM traffic when everything fits in L2 and the
    written bytes are all evicted (upper bound of written bytes under ncu)."""
    res = simulate_l2(schedule, problem, tiles, "h100-sxm5-80gb", capacity=1 << 62)
    return [(k.dram_read, k.dirty_at_end) for k in res.kernels]
