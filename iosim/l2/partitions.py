"""The two-partition L2 (``simulate_l2(..., partitions=True)``): each half of L2 an LRU of its own, with copies.

Part of the L2 model (:mod:`iosim.l2`). Hopper's L2 is two partitions; each SM is near one (measured by
:func:`iosim.gpu.topology.l2_partition_map`). What the probes show (docs/validation.md, "One partition's reads"):

* a line has a home partition (by address: half of any tensor's lines in each); DRAM reads fill the home;
* an SM reading a line homed in the other partition leaves a copy in its own partition; the next read from that
  partition hits the copy, and a read that misses the copy but hits the home goes across the chip, not to DRAM;
* written lines are dirty in their home partition, wherever the writer is (one partition's writers leave as many
  dirty lines as every SM does).

So the model keeps, per atom and per partition, one LRU node with two parts: the half of the atom homed there, and
the copy of the half homed in the other partition (a read from the partition refreshes both; a read from the other
partition that misses its copy refreshes the home part's node). Each partition is a byte-weighted LRU of half the
capacity, clean bytes at one unit of room, dirty bytes at ``cost_dirty`` (the probes' dirty room); a node at the
LRU tail gives up its copy bytes before its home bytes. There is no private/shared room factor: a line
read from both partitions takes room in both because both hold it. Other rules are those of
:func:`iosim.l2.cache._simulate_kernel` (rounds, drift, dedupe within a round, partly evicted atoms miss whole,
foreign dirty lines at the start, dirty lines at the end not written).
"""

from __future__ import annotations

import numpy as np

from ._common import FOREIGN, ROOM_UNIT, _njit, numba
from .cache import _access, _refill_slot, _start_grid, _takes_turn

# the LRU steps are inlined into the kernel loop (numba IR inlining)
_inline = numba.njit(cache=True, nogil=True, inline="always") if numba is not None else _njit

# one row of ``st`` per node (atom g in partition p: node 2 g + p): home bytes resident, copy bytes resident, LRU
# links, and the round of the last read from the node's partition shifted left by one, its low bit = home dirty
HOME, COPY, PREV, NEXT, STAMP = 0, 1, 2, 3, 4


@_inline
def _dirty(st, e):
    return (st[e, STAMP] & 1) == 1


@_inline
def _room(st, e, cost_dirty):
    return st[e, HOME] * (cost_dirty if _dirty(st, e) else ROOM_UNIT) + st[e, COPY] * ROOM_UNIT


@_inline
def _relink(e, p, st, head, tail):
    """Node ``e`` becomes partition ``p``'s most recent (linked in if it was not)."""
    if head[p] == e:
        return
    pv, nx = st[e, PREV], st[e, NEXT]
    if pv >= 0 or tail[p] == e:  # linked: take it out
        if pv >= 0:
            st[pv, NEXT] = nx
        if nx >= 0:
            st[nx, PREV] = pv
        else:
            tail[p] = pv
    st[e, PREV] = -1
    st[e, NEXT] = head[p]
    if head[p] >= 0:
        st[head[p], PREV] = e
    head[p] = e
    if tail[p] < 0:
        tail[p] = e


@_inline
def _fill_home(e, size, make_dirty, st, t, out_write):
    """The home part of node ``e`` becomes whole (dirty if ``make_dirty``); returns (bytes missed, bytes written
    back). A partly evicted home part misses whole; its dirty rest is written back first."""
    r = st[e, HOME]
    wb = 0
    if r < size and r > 0 and _dirty(st, e):
        wb = r
        out_write[t] += r
        st[e, STAMP] &= ~1
    if make_dirty:
        st[e, STAMP] |= 1
    st[e, HOME] = size
    return (0 if r == size else size), wb


@_inline
def _evict(p, cap, st, head, tail, used, cost_dirty, A, F, atom_tensor, out_write):
    """Evict partition ``p``'s least recent bytes until it fits (a node's copy bytes before its home bytes);
    returns bytes written back."""
    wb = 0
    while used[p] > cap:
        v = tail[p]
        over = used[p] - cap
        take = min(st[v, COPY], (over + ROOM_UNIT - 1) // ROOM_UNIT)
        st[v, COPY] -= take
        used[p] -= take * ROOM_UNIT
        if used[p] > cap:
            dv = _dirty(st, v)
            cv = cost_dirty if dv else ROOM_UNIT
            take = min(st[v, HOME], (used[p] - cap + cv - 1) // cv)
            st[v, HOME] -= take
            used[p] -= take * cv
            if dv:
                wb += take
                g = v // 2
                out_write[FOREIGN if g == F else atom_tensor[g % A]] += take
        if st[v, HOME] == 0 and st[v, COPY] == 0:
            st[v, STAMP] &= ~1
            pv = st[v, PREV]
            tail[p] = pv
            if pv >= 0:
                st[pv, NEXT] = -1
            else:
                head[p] = -1
            st[v, PREV] = -1
            st[v, NEXT] = -1
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
    pace,
):
    """The grid's execution (as in ``_simulate_kernel``) over two partitions of ``capacity // 2`` bytes; the slot's
    SM is near partition ``sm_half[sm] - 1``. Node ``2 g + p``: atom ``g`` in partition ``p`` (its half homed
    there, and the copy of the half homed across). Returns (dram_read, dram_write, dirty_end, rounds)."""
    nb = block_order.shape[0]
    n_heads = head_q.shape[0]
    A = atom_bytes.shape[0]
    n_slot_heads = max(head_q.max(), head_kv.max()) + 1
    F = n_slot_heads * A  # atom index of the foreign dirty lines present at the start
    E = 2 * (F + 1)
    st = np.zeros((E, 5), np.int64)
    st[:, PREV] = -1
    st[:, NEXT] = -1
    st[:, STAMP] = -2  # round -1, clean
    head = np.full(2, -1, np.int64)
    tail = np.full(2, -1, np.int64)
    used = np.zeros(2, np.int64)
    cap = ROOM_UNIT * (capacity // 2)
    for p in range(2):  # the foreign dirty lines: half homed in each partition, the least recent there
        sz = init_dirty // 2 if p == 0 else init_dirty - init_dirty // 2
        if sz > 0:
            e = 2 * F + p
            st[e, HOME] = sz
            st[e, STAMP] |= 1
            used[p] = sz * cost_dirty
            _relink(e, p, st, head, tail)
    dram_read = 0
    dram_write = 0
    total_blocks = nb * n_heads
    slot_part = np.zeros(n_slots, np.int64)
    for s in range(n_slots):
        slot_part[s] = sm_half[s % n_sms] - 1
    slots, launched, permuted = _start_grid(
        n_slots, total_blocks, block_order, ptr, head_q, head_kv, A, n_sms, share_ratio, fill, pace
    )
    slot_pos, slot_end, slot_qoff, slot_kvoff, slot_live, _, slot_rate, slot_credit = slots
    live = launched
    rnd = 0
    while live > 0:
        rnd += 1
        for i in range(n_slots):
            s = fill[i] if permuted else i  # (the identity fill without a load per turn: the hot loop)
            if not slot_live[s] or not _takes_turn(s, share_ratio, slot_rate, slot_credit):
                continue
            pos = slot_pos[s]
            if pos < slot_end[s]:
                P = slot_part[s]
                Q = 1 - P
                a0, w, nr, nc, stride = _access(pos, acc_atom, acc_write, acc_shape, shapes)
                for ra in range(nr):
                    for ca in range(nc):
                        a = a0 + ra * stride + ca
                        g = a + (slot_kvoff[s] if atom_kv[a] else slot_qoff[s])
                        size = atom_bytes[a]
                        t = atom_tensor[a]
                        half_p = size // 2 if P == 0 else size - size // 2  # bytes homed near this SM
                        half_q = size - half_p  # bytes homed across
                        if w:  # dirty at home in both partitions; copies of the old data are stale
                            for p in range(2):
                                e = 2 * g + p
                                used[p] -= _room(st, e, cost_dirty)
                                st[e, COPY] = 0
                                m, wb = _fill_home(e, half_p if p == P else half_q, True, st, t, out_write)
                                dram_write += wb
                                used[p] += _room(st, e, cost_dirty)
                                _relink(e, p, st, head, tail)
                                dram_write += _evict(
                                    p, cap, st, head, tail, used, cost_dirty, A, F, atom_tensor, out_write
                                )
                            continue
                        e = 2 * g + P
                        if dedupe and (st[e, STAMP] >> 1) == rnd:
                            continue  # read from this partition already this round: both parts are hits
                        st[e, STAMP] = (rnd << 1) | (st[e, STAMP] & 1)
                        if st[e, COPY] < half_q:  # the near copy misses: the home across, else DRAM
                            h = 2 * g + Q
                            used[Q] -= _room(st, h, cost_dirty)
                            m, wb = _fill_home(h, half_q, False, st, t, out_write)
                            dram_read += m
                            out_read[t] += m
                            dram_write += wb
                            used[Q] += _room(st, h, cost_dirty)
                            _relink(h, Q, st, head, tail)
                            dram_write += _evict(
                                Q, cap, st, head, tail, used, cost_dirty, A, F, atom_tensor, out_write
                            )
                        used[P] -= _room(st, e, cost_dirty)
                        m, wb = _fill_home(e, half_p, False, st, t, out_write)
                        dram_read += m
                        out_read[t] += m
                        dram_write += wb
                        st[e, COPY] = half_q
                        used[P] += _room(st, e, cost_dirty)
                        _relink(e, P, st, head, tail)
                        dram_write += _evict(
                            P, cap, st, head, tail, used, cost_dirty, A, F, atom_tensor, out_write
                        )
                pos += 1
                slot_pos[s] = pos
            if pos >= slot_end[s]:
                launched, live = _refill_slot(
                    s,
                    launched,
                    live,
                    total_blocks,
                    block_order,
                    ptr,
                    head_q,
                    head_kv,
                    A,
                    slots,
                    n_sms,
                    share_ratio,
                    pace,
                )
    dirty_end = 0
    for e in range(2 * F):
        if _dirty(st, e):
            dirty_end += st[e, HOME]
    return dram_read, dram_write, dirty_end, rnd
