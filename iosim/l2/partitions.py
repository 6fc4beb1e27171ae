"""The two-partition L2 (``simulate_l2(..., partitions=True)``): each half of L2 an LRU of its own, with copies.

Part of the L2 model (:mod:`iosim.l2`). Hopper's L2 is two partitions; each SM is near one (measured by
:func:`iosim.gpu.topology.l2_partition_map`). What the probes show (docs/validation.md, "One partition's reads"):

* a line has a home partition (by address: half of any tensor's lines in each); DRAM reads fill the home;
* an SM reading a line homed in the other partition leaves a copy in its own partition; the next read from that
  partition hits the copy, and a read that misses the copy but hits the home goes across the chip, not to DRAM;
* written lines are dirty in their home partition, wherever the writer is (one partition's writers leave as many
  dirty lines as every SM does).

So the model keeps, per atom and per partition, two entries: the half of the atom homed there, and the copy of the
half homed in the other partition. Each partition is a byte-weighted LRU of half the capacity, clean bytes at one
unit of room, dirty bytes at ``cost_dirty`` (the probes' dirty room). There is no private/shared room factor: a line
read from both partitions takes room in both because both hold it. Other rules are those of
:func:`iosim.l2.cache._simulate_kernel` (rounds, drift, dedupe within a round, partly evicted atoms miss whole,
foreign dirty lines at the start, dirty lines at the end not written).
"""

from __future__ import annotations

import numpy as np

from ._common import FOREIGN, ROOM_UNIT, _njit
from .cache import _refill_slot, _start_grid, _takes_turn

HOME, COPY = 0, 1


@_njit
def _unlink(e, p, prev, nxt, head, tail):
    pv, nx = prev[e], nxt[e]
    if pv >= 0:
        nxt[pv] = nx
    else:
        head[p] = nx
    if nx >= 0:
        prev[nx] = pv
    else:
        tail[p] = pv
    prev[e] = -1
    nxt[e] = -1


@_njit
def _push_front(e, p, prev, nxt, head, tail):
    prev[e] = -1
    nxt[e] = head[p]
    if head[p] >= 0:
        prev[head[p]] = e
    head[p] = e
    if tail[p] < 0:
        tail[p] = e


@_njit
def _place(e, p, size, make_dirty, res, dirty, prev, nxt, head, tail, used, cost_dirty, wb_tensor, out_write):
    """Entry ``e`` of partition ``p`` becomes wholly resident and the most recent; returns (bytes missed, bytes
    written back). A partly evicted entry is the LRU tail and misses whole (its dirty rest is written back first)."""
    r = res[e]
    wb = 0
    miss = 0 if r == size else size
    if r > 0:
        used[p] -= r * (cost_dirty if dirty[e] else ROOM_UNIT)
        if r < size and dirty[e]:
            wb = r
            out_write[wb_tensor] += r
            dirty[e] = False
        _unlink(e, p, prev, nxt, head, tail)
    if make_dirty:
        dirty[e] = True
    res[e] = size
    used[p] += size * (cost_dirty if dirty[e] else ROOM_UNIT)
    _push_front(e, p, prev, nxt, head, tail)
    return miss, wb


@_njit
def _drop(e, p, res, dirty, prev, nxt, head, tail, used, cost_dirty):
    """Remove a clean copy (a write made it stale)."""
    if res[e] > 0:
        used[p] -= res[e] * (cost_dirty if dirty[e] else ROOM_UNIT)
        res[e] = 0
        dirty[e] = False
        _unlink(e, p, prev, nxt, head, tail)


@_njit
def _evict(p, cap, res, dirty, prev, nxt, head, tail, used, cost_dirty, A, F, atom_tensor, out_write):
    """Evict partition ``p``'s least recent bytes until it fits; returns bytes written back."""
    wb = 0
    if used[p] <= cap:
        return wb
    while used[p] > cap:
        v = tail[p]
        cv = cost_dirty if dirty[v] else ROOM_UNIT
        take = min(res[v], (used[p] - cap + cv - 1) // cv)
        res[v] -= take
        used[p] -= take * cv
        if dirty[v]:
            wb += take
            g = v // 4
            out_write[FOREIGN if g == F else atom_tensor[g % A]] += take
        if res[v] == 0:
            dirty[v] = False
            _unlink(v, p, prev, nxt, head, tail)
    return wb


@_njit
def _simulate_kernel_2p(
    ptr,
    acc_atom,
    acc_shape,
    acc_write,
    shapes,
    atom_bytes,
    atom_kv,
    atom_tensor,
    block_order,
    head_q,
    head_kv,
    n_slots,
    capacity,
    dedupe,
    out_read,
    out_write,
    cost_dirty,
    init_dirty,
    n_sms,
    share_ratio,
    fill,
    sm_half,
):
    """The grid's execution (as in ``_simulate_kernel``) over two partitions of ``capacity // 2`` bytes; the slot's
    SM is near partition ``sm_half[sm] - 1``. Entry ``4 g + 2 p + k``: atom ``g``'s half homed in ``p`` (k = 0) or,
    in ``p``, the copy of the half homed in the other partition (k = 1). Returns (dram_read, dram_write, dirty_end,
    rounds)."""
    nb = block_order.shape[0]
    n_heads = head_q.shape[0]
    A = atom_bytes.shape[0]
    n_slot_heads = max(head_q.max(), head_kv.max()) + 1
    F = n_slot_heads * A  # atom index of the foreign dirty lines present at the start
    E = 4 * (F + 1)
    res = np.zeros(E, np.int64)
    dirty = np.zeros(E, np.bool_)
    prev = np.full(E, -1, np.int64)
    nxt = np.full(E, -1, np.int64)
    last_round = np.full(E, -1, np.int64)
    head = np.full(2, -1, np.int64)
    tail = np.full(2, -1, np.int64)
    used = np.zeros(2, np.int64)
    cap = ROOM_UNIT * (capacity // 2)
    for p in range(2):  # the foreign dirty lines: half homed in each partition, the least recent there
        sz = init_dirty // 2 if p == 0 else init_dirty - init_dirty // 2
        if sz > 0:
            e = 4 * F + 2 * p + HOME
            res[e] = sz
            dirty[e] = True
            used[p] = sz * cost_dirty
            _push_front(e, p, prev, nxt, head, tail)
    dram_read = 0
    dram_write = 0
    total_blocks = nb * n_heads
    slot_part = np.zeros(n_slots, np.int64)
    for s in range(n_slots):
        slot_part[s] = sm_half[s % n_sms] - 1
    slot_pos, slot_end, slot_qoff, slot_kvoff, slot_live, slot_age, slot_rate, slot_credit, launched = (
        _start_grid(n_slots, total_blocks, block_order, ptr, head_q, head_kv, A, n_sms, share_ratio, fill)
    )
    live = launched
    rnd = 0
    while live > 0:
        rnd += 1
        for i in range(n_slots):
            s = fill[i]
            if not slot_live[s] or not _takes_turn(s, share_ratio, slot_rate, slot_credit):
                continue
            pos = slot_pos[s]
            if pos < slot_end[s]:
                P = slot_part[s]
                Q = 1 - P
                a0 = acc_atom[pos]
                w = acc_write[pos]
                k = acc_shape[pos]
                if k == 0:
                    nr, nc, stride = 1, 1, 1
                else:
                    nr, nc, stride = shapes[k, 0], shapes[k, 1], shapes[k, 2]
                for ra in range(nr):
                    for ca in range(nc):
                        a = a0 + ra * stride + ca
                        g = a + (slot_kvoff[s] if atom_kv[a] else slot_qoff[s])
                        size = atom_bytes[a]
                        t = atom_tensor[a]
                        half = (size // 2, size - size // 2)  # bytes homed in partition 0, 1
                        if w:  # dirty at home in both partitions; copies of the old data are stale
                            for p in range(2):
                                _drop(
                                    4 * g + 2 * p + COPY,
                                    p,
                                    res,
                                    dirty,
                                    prev,
                                    nxt,
                                    head,
                                    tail,
                                    used,
                                    cost_dirty,
                                )
                                e = 4 * g + 2 * p + HOME
                                last_round[e] = rnd
                                m, wb = _place(
                                    e,
                                    p,
                                    half[p],
                                    True,
                                    res,
                                    dirty,
                                    prev,
                                    nxt,
                                    head,
                                    tail,
                                    used,
                                    cost_dirty,
                                    t,
                                    out_write,
                                )
                                dram_write += wb
                                dram_write += _evict(
                                    p,
                                    cap,
                                    res,
                                    dirty,
                                    prev,
                                    nxt,
                                    head,
                                    tail,
                                    used,
                                    cost_dirty,
                                    A,
                                    F,
                                    atom_tensor,
                                    out_write,
                                )
                            continue
                        # the half homed near this SM
                        e = 4 * g + 2 * P + HOME
                        if not (dedupe and last_round[e] == rnd) and half[P] > 0:
                            last_round[e] = rnd
                            m, wb = _place(
                                e,
                                P,
                                half[P],
                                False,
                                res,
                                dirty,
                                prev,
                                nxt,
                                head,
                                tail,
                                used,
                                cost_dirty,
                                t,
                                out_write,
                            )
                            dram_read += m
                            out_read[t] += m
                            dram_write += wb
                            dram_write += _evict(
                                P,
                                cap,
                                res,
                                dirty,
                                prev,
                                nxt,
                                head,
                                tail,
                                used,
                                cost_dirty,
                                A,
                                F,
                                atom_tensor,
                                out_write,
                            )
                        # the half homed across: the near copy, else the home (across the chip), else DRAM
                        c = 4 * g + 2 * P + COPY
                        if half[Q] == 0 or (dedupe and last_round[c] == rnd):
                            continue
                        last_round[c] = rnd
                        if res[c] < half[Q]:
                            h = 4 * g + 2 * Q + HOME
                            last_round[h] = rnd
                            m, wb = _place(
                                h,
                                Q,
                                half[Q],
                                False,
                                res,
                                dirty,
                                prev,
                                nxt,
                                head,
                                tail,
                                used,
                                cost_dirty,
                                t,
                                out_write,
                            )
                            dram_read += m
                            out_read[t] += m
                            dram_write += wb
                            dram_write += _evict(
                                Q,
                                cap,
                                res,
                                dirty,
                                prev,
                                nxt,
                                head,
                                tail,
                                used,
                                cost_dirty,
                                A,
                                F,
                                atom_tensor,
                                out_write,
                            )
                        m, wb = _place(
                            c,
                            P,
                            half[Q],
                            False,
                            res,
                            dirty,
                            prev,
                            nxt,
                            head,
                            tail,
                            used,
                            cost_dirty,
                            t,
                            out_write,
                        )
                        dram_write += wb
                        dram_write += _evict(
                            P,
                            cap,
                            res,
                            dirty,
                            prev,
                            nxt,
                            head,
                            tail,
                            used,
                            cost_dirty,
                            A,
                            F,
                            atom_tensor,
                            out_write,
                        )
                pos += 1
                slot_pos[s] = pos
            if pos >= slot_end[s]:
                launched = _refill_slot(
                    s,
                    launched,
                    total_blocks,
                    block_order,
                    ptr,
                    head_q,
                    head_kv,
                    A,
                    slot_pos,
                    slot_end,
                    slot_qoff,
                    slot_kvoff,
                    slot_live,
                    slot_age,
                    slot_rate,
                    slot_credit,
                    n_sms,
                    share_ratio,
                )
                if not slot_live[s]:
                    live -= 1
    dirty_end = 0
    for e in range(4 * F):
        if dirty[e]:
            dirty_end += res[e]
    return dram_read, dram_write, dirty_end, rnd
