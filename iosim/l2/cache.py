"""Atoms and the L2 simulation: byte-weighted LRU (and the stack-distance variant) over the block schedule.

Part of the L2 model; the model as a whole is described in :mod:`iosim.l2`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..problem import STAT_BYTES, AttentionProblem
from ..profile import Profile, SMTopology, get_profile
from ..schedules import Tiles
from ._common import FOREIGN, KV_TENSORS, ROOM_UNIT, TENSOR_CODES, TENSOR_NAMES, L2ModelError, _njit
from .launch import LaunchModel, launch_model, resident_blocks
from .trace import KernelTrace, head_program


@dataclass
class _Atoms:
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


def _atomize(kt: KernelTrace, p: AttentionProblem) -> _Atoms:
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
            width = np.array([1 if name in ("m", "l", "lse") else p.head_dim])
        ra0, ra1 = rlut[r0], rlut[r1]
        nr, nc = len(rb) - 1, len(cb) - 1
        acc_atom[sel] = nxt + ra0 * nc + ca0
        nr_all[sel], nc_all[sel], stride_all[sel] = ra1 - ra0, ca1 - ca0, nc
        elem = STAT_BYTES if name in ("m", "l", "lse") else p.elem_bytes
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

    return _Atoms(
        cat(bytes_parts, np.int64),
        cat(kv_parts, bool),
        cat(t_parts, np.int64),
        acc_atom.astype(np.int32),
        acc_shape,
        shapes,
    )


@_njit
def _launch_block(
    launched, s, block_order, ptr, head_q, head_kv, A, slot_pos, slot_end, slot_qoff, slot_kvoff
):
    """Put the grid's next thread block (number ``launched`` in launch order) into residency slot ``s``: its
    accesses are ``ptr[b]:ptr[b+1]`` of the trace, offset into its head's Q-side and K/V-side atoms."""
    nb = block_order.shape[0]
    h = launched // nb
    b = block_order[launched % nb]
    slot_pos[s] = ptr[b]
    slot_end[s] = ptr[b + 1]
    slot_qoff[s] = head_q[h] * A
    slot_kvoff[s] = head_kv[h] * A


@_njit
def _set_sm_rates(m, n_sms, n_slots, slot_live, slot_age, slot_rate, ratio, pace):
    """Issue shares of the blocks resident on SM ``m`` (slots m, m + n_sms, ...): the k-th oldest gets a share
    proportional to ``ratio ** k``; shares sum to 1 access per round (a lone block runs at the SM's full rate).

    ``ratio`` = 0 (a measured timeline replayed): each block runs at its own rate ``pace[launch number]``,
    whatever runs beside it."""
    if ratio == 0.0:
        for s in range(m, n_slots, n_sms):
            if slot_live[s]:
                slot_rate[s] = pace[slot_age[s]]
        return
    k = 0
    for s in range(m, n_slots, n_sms):
        if slot_live[s]:
            k += 1
    total = 0.0
    for i in range(k):
        total += ratio**i
    for s in range(m, n_slots, n_sms):
        if slot_live[s]:
            rank = 0
            for t in range(m, n_slots, n_sms):
                if slot_live[t] and slot_age[t] < slot_age[s]:
                    rank += 1
            slot_rate[s] = ratio**rank / total


@_njit
def _start_grid(n_slots, total_blocks, block_order, ptr, head_q, head_kv, A, n_sms, share_ratio, fill, pace):
    """Slot state at the kernel's start: the first ``n_slots`` blocks in launch order, block ``i`` in slot
    ``fill[i]``, and their issue shares (:func:`_set_sm_rates`; all 1 in lockstep). Slot ``s`` is on SM
    ``s % n_sms``, so ``fill`` says where the hardware puts each block of the first wave.

    Returns (slots, launched, permuted): ``slots`` = (pos, end, qoff, kvoff, live, age, rate, credit) arrays by
    slot; ``permuted``: ``fill`` is not the identity (the turn loop visits slots in ``fill`` order, and skips the
    load of ``fill[i]`` per turn when it is the identity)."""
    slot_pos = np.zeros(n_slots, np.int64)
    slot_end = np.zeros(n_slots, np.int64)
    slot_qoff = np.zeros(n_slots, np.int64)
    slot_kvoff = np.zeros(n_slots, np.int64)
    slot_live = np.zeros(n_slots, np.bool_)
    slot_age = np.arange(n_slots).astype(np.int64)  # launch number of the block in the slot
    slot_rate = np.ones(n_slots, np.float64)
    slot_credit = np.zeros(n_slots, np.float64)
    launched = 0
    for i in range(n_slots):
        s = fill[i]
        if launched < total_blocks:
            _launch_block(
                launched, s, block_order, ptr, head_q, head_kv, A, slot_pos, slot_end, slot_qoff, slot_kvoff
            )
            slot_live[s] = True
            slot_age[s] = launched
            launched += 1
    if share_ratio < 1.0:
        for m in range(min(n_sms, n_slots)):
            _set_sm_rates(m, n_sms, n_slots, slot_live, slot_age, slot_rate, share_ratio, pace)
    permuted = False
    for i in range(n_slots):
        if fill[i] != i:
            permuted = True
    slots = (slot_pos, slot_end, slot_qoff, slot_kvoff, slot_live, slot_age, slot_rate, slot_credit)
    return slots, launched, permuted


@_njit
def _access(pos, acc_atom, acc_write, acc_shape, shapes):
    """Access ``pos`` of the trace: (first atom, write, rows of atoms, atoms per row, row stride)."""
    k = acc_shape[pos]
    if k == 0:
        return acc_atom[pos], acc_write[pos], 1, 1, 1
    return acc_atom[pos], acc_write[pos], shapes[k, 0], shapes[k, 1], shapes[k, 2]


@_njit
def _takes_turn(s, share_ratio, slot_rate, slot_credit):
    """Whether the block in slot ``s`` makes an access this round: with share r, in a fraction r of the rounds
    (every round in lockstep)."""
    if share_ratio >= 1.0:
        return True
    slot_credit[s] += slot_rate[s]
    if slot_credit[s] < 1.0 - 1e-9:
        return False
    slot_credit[s] -= 1.0
    return True


@_njit
def _refill_slot(
    s, launched, live, total_blocks, block_order, ptr, head_q, head_kv, A, slots, n_sms, share_ratio, pace
):
    """The block in slot ``s`` has finished: launch the grid's next block there, or retire the slot; the shares
    of that SM's blocks change. Returns the new (``launched``, ``live``)."""
    slot_pos, slot_end, slot_qoff, slot_kvoff, slot_live, slot_age, slot_rate, slot_credit = slots
    n_slots = slot_pos.shape[0]
    if launched < total_blocks:
        _launch_block(
            launched, s, block_order, ptr, head_q, head_kv, A, slot_pos, slot_end, slot_qoff, slot_kvoff
        )
        slot_age[s] = launched
        slot_credit[s] = 0.0
        launched += 1
    else:
        slot_live[s] = False
        live -= 1
    if share_ratio < 1.0:
        _set_sm_rates(s % n_sms, n_sms, n_slots, slot_live, slot_age, slot_rate, share_ratio, pace)
    return launched, live


@_njit
def _d_unlink(g, dprev, dnxt, dends):
    """Take atom ``g`` out of the list of dirty atoms (``dends`` = [most recent, least recent])."""
    pv = dprev[g]
    nx = dnxt[g]
    if pv >= 0:
        dnxt[pv] = nx
    else:
        dends[0] = nx
    if nx >= 0:
        dprev[nx] = pv
    else:
        dends[1] = pv
    dprev[g] = -1
    dnxt[g] = -1


@_njit
def _d_push(g, dprev, dnxt, dends):
    """Put atom ``g`` at the most recent end of the list of dirty atoms."""
    dprev[g] = -1
    dnxt[g] = dends[0]
    if dends[0] >= 0:
        dprev[dends[0]] = g
    dends[0] = g
    if dends[1] < 0:
        dends[1] = g


@_njit
def _simulate_kernel(
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
    cost_private,
    cost_shared,
    cost_dirty,
    init_dirty,
    n_sms,
    share_ratio,
    fill,
    sm_half,
    pace,
    dirty_limit,
):
    """Round-robin execution of the grid over a byte-weighted LRU. Returns (dram_read, dram_write, dirty_end,
    rounds); ``out_read``/``out_write`` (per tensor) are incremented.

    Capacity is counted in units of 1/ROOM_UNIT byte: a clean atom occupies ``cost * bytes`` units where ``cost`` is
    ``cost_private`` until SMs of both L2 partitions (``sm_half`` of the slot's SM, 1 or 2) have touched it,
    then ``cost_shared``; a dirty atom ``cost_dirty`` (all ROOM_UNIT: a plain LRU). ``init_dirty`` bytes of other
    dirty lines are in L2 when the kernel starts (the least recent), written back if evicted (reported in
    ``out_write[FOREIGN]``).

    ``dirty_limit`` > 0: when more than that many bytes are dirty, the least recent dirty atoms are written back and
    stay in L2, clean (their room becomes a clean atom's); 0: dirty bytes leave L2 only by eviction."""
    nb = block_order.shape[0]
    n_heads = head_q.shape[0]
    A = atom_bytes.shape[0]
    n_slot_heads = max(head_q.max(), head_kv.max()) + 1
    F = n_slot_heads * A  # the foreign dirty lines present at the start
    G = F + 1
    res = np.zeros(G, np.int64)
    cost = np.zeros(G, np.int64)
    mask = np.zeros(G, np.int8)
    dirty = np.zeros(G, np.bool_)
    prev = np.full(G, -1, np.int64)
    nxt = np.full(G, -1, np.int64)
    last_round = np.full(G, -1, np.int64)
    dprev = np.full(G, -1, np.int64)  # the dirty atoms, most recent first (only with a dirty_limit)
    dnxt = np.full(G, -1, np.int64)
    dends = np.full(2, -1, np.int64)
    dbytes = 0  # dirty bytes in L2
    limit = dirty_limit > 0
    cap_units = ROOM_UNIT * capacity
    lru_head = -1  # most recent
    lru_tail = -1  # least recent
    used = 0  # units of 1/ROOM_UNIT byte
    if init_dirty > 0:
        res[F] = init_dirty
        cost[F] = cost_dirty
        dirty[F] = True
        lru_head = F
        lru_tail = F
        used = init_dirty * cost_dirty
        dbytes = init_dirty
        if limit:
            _d_push(F, dprev, dnxt, dends)
    dram_read = 0
    dram_write = 0
    total_blocks = nb * n_heads
    slot_half = np.zeros(n_slots, np.int8)
    for s in range(n_slots):
        slot_half[s] = sm_half[s % n_sms]
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
                a0, w, nr, nc, stride = _access(pos, acc_atom, acc_write, acc_shape, shapes)
                for ra in range(nr):
                    for ca in range(nc):
                        a = a0 + ra * stride + ca
                        g = a + (slot_kvoff[s] if atom_kv[a] else slot_qoff[s])
                        size = atom_bytes[a]
                        t = atom_tensor[a]
                        r = res[g]
                        mask[g] |= slot_half[s]
                        want = cost_shared if mask[g] == 3 else cost_private
                        if w or (dirty[g] and r > 0):
                            want = cost_dirty
                        if dedupe and (not w) and last_round[g] == rnd:
                            if r > 0 and cost[g] != want:  # now shared: a second copy takes room
                                used += r * (want - cost[g])
                                cost[g] = want
                            else:
                                continue
                        else:
                            last_round[g] = rnd
                            used -= r * cost[g]  # the atom's old room; it is re-linked at the head below
                            if 0 < r < size:
                                # partly evicted: it is the LRU tail, and a line-level LRU walking its lines in
                                # order evicts each remaining line just before reaching it: all of it misses
                                if dirty[g]:
                                    dram_write += r
                                    out_write[t] += r
                                    dirty[g] = False
                                    dbytes -= r
                                    if limit:
                                        _d_unlink(g, dprev, dnxt, dends)
                            if r > 0:  # unlink
                                pv = prev[g]
                                nx = nxt[g]
                                if pv >= 0:
                                    nxt[pv] = nx
                                else:
                                    lru_head = nx
                                if nx >= 0:
                                    prev[nx] = pv
                                else:
                                    lru_tail = pv
                            miss = 0 if r == size else size
                            if limit and dirty[g]:  # touched again: the most recent dirty atom
                                _d_unlink(g, dprev, dnxt, dends)
                                _d_push(g, dprev, dnxt, dends)
                            if w:
                                if not dirty[g]:
                                    dbytes += size
                                    if limit:
                                        _d_push(g, dprev, dnxt, dends)
                                dirty[g] = True
                            else:
                                dram_read += miss
                                out_read[t] += miss
                            res[g] = size
                            cost[g] = want
                            used += size * want
                            prev[g] = -1  # link at the head (most recent)
                            nxt[g] = lru_head
                            if lru_head >= 0:
                                prev[lru_head] = g
                            lru_head = g
                            if lru_tail < 0:
                                lru_tail = g
                            while limit and dbytes > dirty_limit:  # write back the least recent dirty atom
                                v = dends[1]
                                b = res[v]
                                dram_write += b
                                out_write[FOREIGN if v == F else atom_tensor[v % A]] += b
                                dbytes -= b
                                dirty[v] = False
                                _d_unlink(v, dprev, dnxt, dends)
                                clean = cost_shared if mask[v] == 3 else cost_private
                                used += b * (clean - cost[v])
                                cost[v] = clean
                        while used > cap_units:  # evict the least recent bytes
                            v = lru_tail  # (v == g only for an atom larger than L2: its first bytes go)
                            cv = cost[v]
                            take = min(res[v], (used - cap_units + cv - 1) // cv)
                            res[v] -= take
                            used -= take * cv
                            if dirty[v]:
                                dram_write += take
                                out_write[FOREIGN if v == F else atom_tensor[v % A]] += take
                                dbytes -= take
                            if res[v] == 0:
                                if limit and dirty[v]:
                                    _d_unlink(v, dprev, dnxt, dends)
                                dirty[v] = False
                                mask[v] = 0
                                cost[v] = 0
                                pv = prev[v]
                                lru_tail = pv
                                if pv >= 0:
                                    nxt[pv] = -1
                                else:
                                    lru_head = -1
                                prev[v] = -1
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
    for g in range(F):
        if dirty[g]:
            dirty_end += res[g]
    return dram_read, dram_write, dirty_end, rnd


@_njit
def _miss(curve_x, curve_y, d):
    """Miss probability of a reuse at stack distance ``d`` bytes (linear interpolation, 1 beyond the curve)."""
    n = curve_x.shape[0]
    if d >= curve_x[n - 1]:
        return 1.0
    if d <= curve_x[0]:
        return curve_y[0]
    lo, hi = 0, n - 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if curve_x[mid] <= d:
            lo = mid
        else:
            hi = mid
    f = (d - curve_x[lo]) / (curve_x[hi] - curve_x[lo])
    return curve_y[lo] + f * (curve_y[hi] - curve_y[lo])


@_njit
def _bit_add(tree, i, v):
    i += 1
    n = tree.shape[0]
    while i < n:
        tree[i] += v
        i += i & (-i)


@_njit
def _bit_prefix(tree, i):  # sum of [0, i]
    s = 0
    i += 1
    while i > 0:
        s += tree[i]
        i -= i & (-i)
    return s


@_njit
def _simulate_kernel_sd(
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
    dedupe,
    out_read,
    out_write,
    curve_x,
    curve_y,
    window,
    n_sms,
    share_ratio,
    cost_private,
    cost_shared,
    cost_dirty,
    init_dirty,
    fill,
    sm_half,
    pace,
    dirty_limit,
    clean_ahead,
):
    """The same execution as :func:`_simulate_kernel`, with L2 hits decided by a measured miss curve: a reuse of
    an atom after ``d`` distinct bytes (its LRU stack distance) misses with probability ``curve(d)``; a dirty
    atom is written back with the probability that it was evicted. Expected bytes (floats).

    Distances are in room units (1/ROOM_UNIT byte, as in :func:`_simulate_kernel`: an atom weighs its bytes times
    its cost, private / shared / dirty); ``init_dirty`` bytes of foreign dirty lines are the oldest entry.

    ``dirty_limit`` > 0: when the expected dirty bytes exceed it, the least recently touched dirty atom is written
    back whole and stays, clean (its weight becomes a clean atom's). Whole: its dirty bytes leave L2 exactly once,
    evicted before or written back now. The bytes counted against the limit are those not yet found evicted (an
    atom's eviction is only known at its next touch), so the limit acts a little early where dirty atoms are
    evicted before it, which needs clean traffic of most of L2 on top of them.

    ``clean_ahead`` (room units): a dirty atom is written back with probability ``curve(d + clean_ahead)``, ahead of
    its eviction (``curve(d)``): the lines written back but not yet evicted stay, clean."""
    nb = block_order.shape[0]
    n_heads = head_q.shape[0]
    A = atom_bytes.shape[0]
    n_slot_heads = max(head_q.max(), head_kv.max()) + 1
    F = n_slot_heads * A  # the foreign dirty lines present at the start
    G = F + 1
    dmax = curve_x[curve_x.shape[0] - 1]
    last_t = np.full(G, -1, np.int64)
    wgt = np.zeros(G, np.int64)  # room of each atom in the window
    mask = np.zeros(G, np.int8)
    dirty = np.zeros(G, np.float64)  # expected dirty bytes in L2
    last_round = np.full(G, -1, np.int64)
    TW = window
    tree = np.zeros(TW + 1, np.int64)
    atom_at = np.full(TW, -1, np.int64)
    total = 0  # room of atoms in the window
    tau = 0
    oldest = 0
    dprev = np.full(G, -1, np.int64)  # the dirty atoms, most recent first (only with a dirty_limit)
    dnxt = np.full(G, -1, np.int64)
    dends = np.full(2, -1, np.int64)
    dtotal = 0.0  # expected dirty bytes of the listed atoms
    limit = dirty_limit > 0
    if init_dirty > 0:
        wgt[F] = init_dirty * cost_dirty
        dirty[F] = init_dirty
        last_t[F] = 0
        atom_at[0] = F
        _bit_add(tree, 0, wgt[F])
        total = wgt[F]
        tau = 1
        if limit:
            _d_push(F, dprev, dnxt, dends)
            dtotal = float(init_dirty)
    slot_half = np.zeros(n_slots, np.int8)
    for s in range(n_slots):
        slot_half[s] = sm_half[s % n_sms]
    dram_read = 0.0
    dram_write = 0.0
    total_blocks = nb * n_heads
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
                a0, w, nr, nc, stride = _access(pos, acc_atom, acc_write, acc_shape, shapes)
                for ra in range(nr):
                    for ca in range(nc):
                        a = a0 + ra * stride + ca
                        g = a + (slot_kvoff[s] if atom_kv[a] else slot_qoff[s])
                        size = atom_bytes[a]
                        mask[g] |= slot_half[s]
                        want = cost_shared if mask[g] == 3 else cost_private
                        if w or dirty[g] > 0:
                            want = cost_dirty
                        if dedupe and (not w) and last_round[g] == rnd:
                            if last_t[g] >= 0 and wgt[g] != size * want:  # now shared: more room
                                _bit_add(tree, last_t[g], size * want - wgt[g])
                                total += size * want - wgt[g]
                                wgt[g] = size * want
                            continue
                        last_round[g] = rnd
                        t = atom_tensor[a]
                        lt = last_t[g]
                        if lt >= 0:
                            d = total - _bit_prefix(tree, lt)
                            m = _miss(curve_x, curve_y, d)
                            mc = _miss(curve_x, curve_y, d + clean_ahead)
                            _bit_add(tree, lt, -wgt[g])
                            total -= wgt[g]
                            atom_at[lt] = -1
                        else:
                            m = 1.0
                            mc = 1.0
                        was_dirty = dirty[g] > 0
                        if was_dirty:
                            wb = dirty[g] * mc
                            dram_write += wb
                            out_write[t] += wb
                            dirty[g] -= wb
                            dtotal -= wb
                        if limit and was_dirty:
                            _d_unlink(g, dprev, dnxt, dends)
                        if w:
                            dtotal += size - dirty[g]
                            dirty[g] = size
                        if limit and dirty[g] > 0:
                            _d_push(g, dprev, dnxt, dends)
                        if not w:
                            dram_read += size * m
                            out_read[t] += size * m
                        if tau == TW:  # renumber the window's timestamps from 0
                            j = 0
                            for u in range(oldest, TW):
                                v = atom_at[u]
                                if v >= 0:
                                    atom_at[j] = v
                                    last_t[v] = j
                                    j += 1
                            for u in range(j, TW):
                                atom_at[u] = -1
                            tree[:] = 0
                            for u in range(j):
                                _bit_add(tree, u, wgt[atom_at[u]])
                            tau = j
                            oldest = 0
                        last_t[g] = tau
                        atom_at[tau] = g
                        wgt[g] = size * want
                        _bit_add(tree, tau, wgt[g])
                        total += wgt[g]
                        tau += 1
                        while limit and dtotal > dirty_limit:  # write back the least recent dirty atom
                            v = dends[1]
                            dram_write += dirty[v]
                            out_write[FOREIGN if v == F else atom_tensor[v % A]] += dirty[v]
                            dtotal -= dirty[v]
                            dirty[v] = 0.0
                            _d_unlink(v, dprev, dnxt, dends)
                            if last_t[v] >= 0:
                                vb = init_dirty if v == F else atom_bytes[v % A]
                                clean = vb * (cost_shared if mask[v] == 3 else cost_private)
                                _bit_add(tree, last_t[v], clean - wgt[v])
                                total += clean - wgt[v]
                                wgt[v] = clean
                        # atoms more than the curve's reach behind are surely gone: drop them
                        while oldest < tau:
                            v = atom_at[oldest]
                            if v < 0:
                                oldest += 1
                                continue
                            vb = wgt[v]
                            if total - _bit_prefix(tree, oldest) < dmax:
                                break
                            if dirty[v] > 0:
                                dram_write += dirty[v]
                                out_write[FOREIGN if v == F else atom_tensor[v % A]] += dirty[v]
                                dtotal -= dirty[v]
                                dirty[v] = 0.0
                                if limit:
                                    _d_unlink(v, dprev, dnxt, dends)
                            mask[v] = 0
                            _bit_add(tree, oldest, -vb)
                            total -= vb
                            last_t[v] = -1
                            atom_at[oldest] = -1
                            oldest += 1
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
    dirty_end = 0.0
    for u in range(oldest, tau):
        v = atom_at[u]
        if v >= 0 and dirty[v] > 0:
            m = _miss(curve_x, curve_y, total - _bit_prefix(tree, u) + clean_ahead)
            dram_write += dirty[v] * m
            out_write[FOREIGN if v == F else atom_tensor[v % A]] += dirty[v] * m
            if v != F:
                dirty_end += dirty[v] * (1.0 - m)
    return dram_read, dram_write, dirty_end, rnd


def _head_slots(p: AttentionProblem, head_order: str) -> tuple[np.ndarray, np.ndarray]:
    """Query-head and kv-head slot of each head, in the order the grid launches them."""
    B, H, Hk = p.batch, p.heads, p.kv_heads
    g = H // Hk
    if head_order == "batch_major":
        b, h = np.divmod(np.arange(B * H, dtype=np.int64), H)
    elif head_order == "head_major":
        h, b = np.divmod(np.arange(B * H, dtype=np.int64), B)
    else:
        raise L2ModelError(f"head_order={head_order!r}")
    return b * H + h, b * Hk + h // g


@dataclass
class KernelL2:
    name: str
    grid: int  # thread blocks of the schedule's program (all heads)
    resident: int  # program blocks running at once
    resident_limits: dict
    dram_read: int
    dram_write: int
    dirty_at_end: int
    read_by_tensor: dict = field(default_factory=dict)
    write_by_tensor: dict = field(default_factory=dict)
    global_read: int = 0
    global_write: int = 0
    rounds: int = 0


@dataclass
class L2Result:
    schedule: str
    profile: str
    capacity: int
    kernels: list[KernelL2]
    launch: LaunchModel
    dedupe: bool
    seconds: float = 0.0
    block_share: float = 1.0
    room: tuple[float, float, float] = (1.0, 1.0, 1.0)
    dirty_at_start: int = 0
    placement: str = "assumed"  # "measured": the profile's sm.topology placed the blocks (see simulate_l2)
    partitions: int = 1  # 2: the two-partition L2 (iosim.l2.partitions)
    timeline: bool = False  # True: block rates from a measured timeline (block_rate), not shares
    dirty_limit: int = 0  # bytes dirty past which the oldest dirty lines are written back (0: none)
    clean_ahead: float = 0.0  # soft edge: dirty lines written back this many room bytes ahead of eviction

    def describe(self) -> str:
        """The model's inputs in one line (what ``iosim simulate`` prints under its table)."""
        extra = []
        if self.timeline:
            extra.append("block rates from a measured timeline")
        elif self.block_share < 1.0:
            extra.append(f"block share {self.block_share:g}")
        if self.partitions == 2:
            extra.append(f"two partitions, dirty room {self.room[2]:g}")
        elif self.room != (1.0, 1.0, 1.0):
            extra.append("room private/shared/dirty " + "/".join(f"{x:g}" for x in self.room))
        if self.dirty_at_start:
            extra.append(f"{self.dirty_at_start:,} B dirty at start")
        if self.dirty_limit:
            extra.append(f"at most {self.dirty_limit:,} B dirty")
        if self.clean_ahead:
            extra.append(f"written back {self.clean_ahead:,.0f} B ahead of eviction")
        if self.placement != "assumed":
            extra.append(f"{self.placement} block placement")
        return f"{self.capacity:,} B L2, {self.kernels[0].resident} blocks resident" + "".join(
            ", " + e for e in extra
        )

    @property
    def read_bytes(self) -> int:
        return sum(k.dram_read for k in self.kernels)

    @property
    def write_bytes(self) -> int:
        return sum(k.dram_write for k in self.kernels)

    def to_json(self) -> dict:
        return {
            "model": "l2-lru-2p" if self.partitions == 2 else "l2-lru",
            "conditions": "L2 flushed before each kernel; dirty lines left in L2 at kernel end not written (ncu)",
            "capacity_bytes": self.capacity,
            "block_share": self.block_share,
            "timeline": self.timeline,
            "room": {"private": self.room[0], "shared": self.room[1], "dirty": self.room[2]},
            "dirty_at_start_bytes": self.dirty_at_start,
            "dirty_limit_bytes": self.dirty_limit,
            "clean_ahead_bytes": self.clean_ahead,
            "placement": self.placement,
            "partitions": self.partitions,
            "dedupe": self.dedupe,
            "launch": self.launch.note,
            "kernels": [
                {
                    "name": k.name,
                    "grid": k.grid,
                    "resident": k.resident,
                    "hbm_read_bytes": k.dram_read,
                    "hbm_write_bytes": k.dram_write,
                    "dirty_at_end_bytes": k.dirty_at_end,
                    "hbm_read_by_tensor": k.read_by_tensor,
                    "hbm_write_by_tensor": k.write_by_tensor,
                }
                for k in self.kernels
            ],
        }


def simulate_l2(
    schedule: str,
    problem: AttentionProblem,
    tiles: Tiles,
    profile: str | Profile | None = None,
    *,
    capacity: int | None = None,
    resident: int | list[int] | None = None,
    dedupe: bool = True,
    variant: str = "iosim",
    registers: int | list[int] | None = None,
    fast: bool | None = None,
    traces: list[KernelTrace] | None = None,
    room: tuple[float, float, float] | None = None,
    dirty_at_start: int | None = None,
    dirty_limit: int | None = None,
    clean_ahead: float = 0.0,
    miss_curve: list[tuple[float, float]] | None = None,
    block_share: float | None = None,
    topology: SMTopology | bool | None = None,
    partitions: bool | None = None,
    block_rate=None,
) -> L2Result:
    """DRAM read/write bytes of every kernel of ``schedule`` under the L2 model (see the module docstring).

    ``capacity`` overrides the profile's L2 size; ``resident`` the number of program blocks running at once (one
    number, or one per kernel); ``variant``: ``"iosim"`` (our kernels' launch) or ``"fa2"`` (FlashAttention-2's).
    ``block_share``: issue share of a block relative to the next older block on its SM (the profile's
    ``sm.block_share``; 1 = every resident block makes one access per round, the blocks in lockstep).
    ``room``: L2 bytes one byte takes when (clean and read by the SMs of one half of the chip, clean and read by
    both halves, dirty); ``dirty_at_start``: bytes of dirty lines already in L2 when the kernel starts. Both default
    to the profile's ``l2.room`` and ``l2.dirty_at_start`` (else 1, 1, 1 and 0: a plain LRU of ``capacity``).
    ``clean_ahead`` (stack-distance variant only): dirty lines are written back as if ``clean_ahead`` more room bytes
    were on top of them, and stay in L2, clean, until the curve evicts them (0: written back when evicted).
    ``dirty_limit``: bytes of dirty lines past which L2 writes back the least recent ones, keeping them clean; the
    profile's ``l2.dirty_limit`` by default, 0 = none (dirty lines leave only by eviction). Not in the two-partition
    model.
    ``miss_curve``: the stack-distance variant, a soft edge in place of the LRU's hard one: a reuse after d room
    bytes of distinct data (the room-weighted LRU stack distance) misses with probability curve(d), and a dirty
    line is written back with the probability that it was evicted (expected bytes). It uses the same block drift,
    room and dirty lines at start; the curve replaces ``capacity``.
    ``topology``: where blocks land and which SMs share an L2 partition (:class:`~iosim.profile.SMTopology`);
    None takes the profile's ``sm.topology``, False ignores it (block i of the first wave on SM i mod SM-count, the
    lower half of SM numbers on one partition).
    ``partitions``: the two-partition L2 (:mod:`iosim.l2.partitions`): each half of the capacity an LRU of its own,
    lines homed by address in either, copies in the reader's partition; ``room`` then only gives the dirty factor.
    None takes the profile's ``l2.partitions`` (2: on); False is the one-pool LRU with room factors.
    ``block_rate``: a measured block timeline replayed in place of the shares: one rate per block in launch order
    (accesses per round, in (0, 1]: the fastest block's duration over each block's, :func:`timeline_rates`).
    The cache model then sees the schedule the GPU ran (docs/validation.md, "Long grids")."""
    import time

    t0 = time.perf_counter()
    prof = get_profile(profile)
    cap = int(capacity if capacity is not None else prof.require("l2.capacity"))
    lm = launch_model(schedule, problem, tiles, variant=variant, registers=registers)
    share = float(block_share if block_share is not None else prof.block_share())
    rooms = tuple(room) if room is not None else prof.l2_room()
    init_dirty = int(dirty_at_start if dirty_at_start is not None else prof.l2_dirty_at_start())
    dlimit = int(dirty_limit if dirty_limit is not None else prof.l2_dirty_limit())
    if dlimit < 0:
        raise L2ModelError(f"dirty_limit={dlimit}: expected bytes >= 0 (0: no limit)")
    if len(rooms) != 3 or min(rooms) < 1.0 / ROOM_UNIT:
        raise L2ModelError(f"room={rooms}: expected three positive factors (private, shared, dirty)")
    if not 0.0 < share <= 1.0:
        raise L2ModelError(f"block_share={share}: expected 0 < block_share <= 1")
    if traces is None:
        traces = head_program(schedule, problem, tiles, kv_order=lm.kv_order, fast=fast)
    head_q, head_kv = _head_slots(problem, lm.head_order)
    topo = prof.sm_topology() if topology is None else (topology or None)
    two = prof.l2_partitions() == 2 if partitions is None else bool(partitions)
    if two and miss_curve is not None:
        raise L2ModelError(
            "miss_curve (the stack-distance variant) is a one-pool model: give partitions=False"
        )
    if dlimit and two:
        raise L2ModelError(f"dirty_limit={dlimit}: the two-partition model has none; give dirty_limit=0")
    if clean_ahead < 0 or (clean_ahead and miss_curve is None):
        raise L2ModelError(f"clean_ahead={clean_ahead}: expected room bytes >= 0, with a miss_curve")
    pace, pace_share = np.zeros(0), share
    if block_rate is not None:  # a timeline replayed: its rates instead of the shares (share 0 says so)
        pace, pace_share = np.asarray(block_rate, dtype=np.float64), 0.0
        blocks = max(kt.n_blocks for kt in traces) * len(head_q)
        if pace.ndim != 1 or pace.size == 0 or len(pace) < blocks or not (pace.min() > 0 and pace.max() <= 1):
            raise L2ModelError(
                f"block_rate: expected one rate in (0, 1] per block ({blocks} blocks), got shape {pace.shape}"
            )
    out = []
    for ki, kt in enumerate(traces):
        klm = lm.kernels[ki]
        per_sm = 0  # blocks per SM, where the measured placement applies
        if resident is None:
            r_gpu, limits = resident_blocks(prof, klm.threads, klm.smem, klm.registers)
            r = max(1, r_gpu // klm.gpu_blocks_per_block)
            per_sm = r_gpu // int(prof.require("sm_count")) if klm.gpu_blocks_per_block == 1 else 0
        else:
            r = resident[ki] if isinstance(resident, (list, tuple)) else resident
            limits = {"given": r}
            per_sm = -(-int(r) // int(prof.require("sm_count")))
        at = _atomize(kt, problem)
        nb = kt.n_blocks
        costs = [round(x * ROOM_UNIT) for x in rooms]
        sms = int(prof.require("sm_count"))
        order = np.arange(nb, dtype=np.int64)
        if klm.block_order == "reverse":
            order = order[::-1].copy()
        r = int(min(r, nb * len(head_q))) if nb else 1
        n_slots, fill, sm_half = _placement(topo, per_sm, sms, r)
        rd_t = np.zeros(len(TENSOR_CODES), np.int64)
        wr_t = np.zeros(len(TENSOR_CODES), np.int64)
        if nb == 0:
            rd = wr = dirty = rounds = 0
        elif miss_curve is not None:
            cx = np.array([x for x, _ in miss_curve], dtype=np.float64) * ROOM_UNIT  # room bytes -> units
            cy = np.array([y for _, y in miss_curve], dtype=np.float64)
            rdf, wrf = np.zeros(len(TENSOR_CODES)), np.zeros(len(TENSOR_CODES))
            rd, wr, dirty, rounds = _simulate_kernel_sd(
                kt.ptr,
                at.acc_atom,
                at.acc_shape,
                kt.write,
                at.shapes,
                at.atom_bytes,
                at.atom_kv,
                at.atom_tensor,
                order,
                head_q,
                head_kv,
                n_slots,
                dedupe,
                rdf,
                wrf,
                cx,
                cy,
                1 << 22,
                sms,
                pace_share,
                costs[0],
                costs[1],
                costs[2],
                init_dirty,
                fill,
                sm_half,
                pace,
                dlimit,
                clean_ahead * ROOM_UNIT,
            )
            rd, wr, dirty = round(rd), round(wr), round(dirty)
            rd_t, wr_t = np.round(rdf).astype(np.int64), np.round(wrf).astype(np.int64)
        elif two:
            from .partitions import _simulate_kernel_2p

            rd, wr, dirty, rounds = _simulate_kernel_2p(
                kt.ptr,
                at.acc_atom,
                at.acc_shape,
                kt.write,
                at.shapes,
                at.atom_bytes,
                at.atom_kv,
                at.atom_tensor,
                order,
                head_q,
                head_kv,
                n_slots,
                cap,
                dedupe,
                rd_t,
                wr_t,
                costs[2],
                init_dirty,
                sms,
                pace_share,
                fill,
                sm_half,
                pace,
            )
        else:
            rd, wr, dirty, rounds = _simulate_kernel(
                kt.ptr,
                at.acc_atom,
                at.acc_shape,
                kt.write,
                at.shapes,
                at.atom_bytes,
                at.atom_kv,
                at.atom_tensor,
                order,
                head_q,
                head_kv,
                n_slots,
                cap,
                dedupe,
                rd_t,
                wr_t,
                costs[0],
                costs[1],
                costs[2],
                init_dirty,
                sms,
                pace_share,
                fill,
                sm_half,
                pace,
                dlimit,
            )
        gr, gw = _global_bytes(kt, problem, len(head_q))
        out.append(
            KernelL2(
                kt.name,
                nb * len(head_q),
                r,
                limits,
                int(rd),
                int(wr),
                int(dirty),
                {TENSOR_NAMES[i]: int(v) for i, v in enumerate(rd_t) if v},
                {TENSOR_NAMES[i]: int(v) for i, v in enumerate(wr_t) if v},
                gr,
                gw,
                int(rounds),
            )
        )
    return L2Result(
        schedule,
        prof.name,
        cap,
        out,
        lm,
        dedupe,
        time.perf_counter() - t0,
        share,
        rooms,
        init_dirty,
        "assumed" if topo is None else "measured",
        2 if two else 1,
        block_rate is not None,
        dlimit,
        float(clean_ahead),
    )


def timeline_rates(start_ns, end_ns, work=None) -> np.ndarray:
    """``block_rate`` for :func:`simulate_l2` from a block timeline (``gpu.attention(block_trace=)``,
    benchmarks/validate_timeline.py): a block's rate is its accesses per unit time, over the fastest block's.
    ``work``: each block's number of accesses, in launch order (:func:`block_accesses`); None where every block
    makes the same number (no causal mask), so that the rate is the fastest block's duration over its own."""
    d = np.asarray(end_ns, dtype=np.float64) - np.asarray(start_ns, dtype=np.float64)
    if d.ndim != 1 or len(d) == 0 or d.min() <= 0:
        raise L2ModelError("timeline: expected one positive duration per block (end_ns > start_ns)")
    if work is None:
        return d.min() / d
    w = np.asarray(work, dtype=np.float64)
    if w.shape != d.shape or w.min() <= 0:
        raise L2ModelError(
            f"timeline: expected one positive access count per block ({len(d)}), got {w.shape}"
        )
    speed = w / d
    return speed / speed.max()


def block_accesses(
    schedule: str, problem: AttentionProblem, tiles: Tiles, *, variant: str = "iosim", kernel: int = 0
) -> np.ndarray:
    """Tile accesses of every thread block of one kernel of ``schedule``, in launch order (all heads): the
    ``work`` of :func:`timeline_rates`, for schedules whose blocks differ (a causal mask)."""
    lm = launch_model(schedule, problem, tiles, variant=variant)
    kt = head_program(schedule, problem, tiles, kv_order=lm.kv_order)[kernel]
    per_block = np.diff(kt.ptr)
    if lm.kernels[kernel].block_order == "reverse":
        per_block = per_block[::-1]
    head_q, _ = _head_slots(problem, lm.head_order)
    return np.tile(per_block, len(head_q))


def _placement(topo: SMTopology | None, per_sm: int, n_sms: int, r: int):
    """(slots, fill, sm_half) for the kernels: ``fill[i]`` is the slot of the first wave's block i (slot s is on
    SM s mod ``n_sms``), ``sm_half[m]`` the L2 partition of SM m (1 or 2). With the measured topology for
    ``per_sm`` blocks per SM, block i goes to SM ``dispatch[per_sm][i]``; the slots are then all ``per_sm`` x
    ``n_sms`` of a full wave (those past the grid stay empty). Otherwise block i is on SM i mod ``n_sms`` and the
    lower half of SM numbers is one partition."""
    if topo is not None and per_sm in topo.dispatch and r <= per_sm * n_sms:
        n_slots = per_sm * n_sms
        fill = np.zeros(n_slots, np.int64)
        seen = np.zeros(n_sms, np.int64)
        for i, m in enumerate(topo.dispatch[per_sm]):
            fill[i] = m + seen[m] * n_sms
            seen[m] += 1
        return n_slots, fill, np.array([1 + x for x in topo.l2_partition], np.int8)
    half = np.array([1 if 2 * m < n_sms else 2 for m in range(n_sms)], np.int8)
    if topo is not None:
        half = np.array([1 + x for x in topo.l2_partition], np.int8)
    return r, np.arange(r, dtype=np.int64), half


def _access_bytes(kt: KernelTrace, p: AttentionProblem) -> np.ndarray:
    """Bytes of each access of a trace."""
    nbytes = np.zeros(len(kt.tensor), dtype=np.int64)
    rows = kt.r1 - kt.r0
    for t in np.unique(kt.tensor):
        sel = kt.tensor == t
        name = TENSOR_NAMES[int(t)]
        if name in ("S", "P"):
            nbytes[sel] = rows[sel] * (kt.c1[sel] - kt.c0[sel]) * p.elem_bytes
        elif name in ("m", "l", "lse"):
            nbytes[sel] = rows[sel] * STAT_BYTES
        else:
            nbytes[sel] = rows[sel] * p.head_dim * p.elem_bytes
    return nbytes


def _global_bytes(kt: KernelTrace, p: AttentionProblem, n_heads: int) -> tuple[int, int]:
    """The trace's requested bytes (all heads): equal to the schedule's ``global`` count (tested)."""
    nbytes = _access_bytes(kt, p)
    return int(nbytes[~kt.write].sum()) * n_heads, int(nbytes[kt.write].sum()) * n_heads
