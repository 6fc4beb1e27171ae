"""The round loop of the L2 model: the grid's thread blocks take turns issuing tile accesses into a byte-weighted LRU.

Part of the L2 model; the model as a whole is described in :mod:`iosim.l2`. Everything here is compiled by numba
and works on plain arrays, grouped by role into the named tuples of :mod:`iosim.l2.state`: the head's program
(``trace``: :class:`~iosim.l2.state.Trace`), the launch (``grid``: :class:`~iosim.l2.state.Grid`), the resident
blocks (``slots``: :class:`~iosim.l2.state.Slots`), the cache (``c``: :class:`~iosim.l2.state.Cache`), what the loop
knows of atoms and L2 (``m``: :class:`~iosim.l2.state.Model`) and the stock-taking's control (``ctl``:
:class:`~iosim.l2.state.Control`).
"""

from __future__ import annotations

import numpy as np

from ._common import FOREIGN
from ._jit import _njit, _njit_inline
from .state import (
    BLOCKS,
    FULL_ROWS,
    KV_STRIDE,
    REVERSED,
    ROW_STRIDE,
    ROW_WRAP,
    SKIPPED,
    TEMPLATES,
    Batch,
    Cache,
    Slots,
    Window,
)
from .steady import window

BATCH = 1 << 16  # accesses gathered before they go through the cache (more when one round holds more)

# ------------------------------------------------------------------------------------------------------------------
# the grid: which block runs in which slot, and when it takes a turn


@_njit_inline
def _launch_block(launched, s, grid, slots, n_atoms):
    """Put the grid's block number ``launched`` (in launch order) into slot ``s``."""
    ptr, layout, head_q, head_kv = grid.ptr, grid.layout, grid.head_q, grid.head_kv
    nb, tmpl, wrap, full = layout[BLOCKS], layout[TEMPLATES], layout[ROW_WRAP], layout[FULL_ROWS]
    h = launched // nb
    b = nb - 1 - launched % nb if layout[REVERSED] else launched % nb
    t, row = b % tmpl, b // tmpl
    if row >= full:  # the last, partial row: its own template blocks, their atoms as they are
        t += tmpl
        slots.qoff[s] = 0 if wrap > 0 else head_q[h] * n_atoms
    elif wrap > 0:  # the rows of every head in turn share ``wrap`` rows of atoms
        slots.qoff[s] = ((h * full + row) % wrap) * layout[ROW_STRIDE]
    else:
        slots.qoff[s] = head_q[h] * n_atoms + row * layout[ROW_STRIDE]
    slots.pos[s] = ptr[t]
    slots.end[s] = ptr[t + 1]
    slots.kvoff[s] = head_kv[h] * layout[KV_STRIDE]
    slots.age[s] = launched
    slots.rep[s] = 0
    slots.unit[s] = grid.unit_q[head_q[h]]


@_njit_inline
def _set_sm_rates(sm, slots, n_sms, share):
    """Issue shares of the blocks on SM ``sm`` (slots sm, sm + n_sms, ...): the k-th oldest gets a share
    proportional to ``share ** k``; shares sum to one access per round (a lone block runs at the SM's full rate)."""
    live, age, rate = slots.live, slots.age, slots.rate
    n_slots = live.shape[0]
    total, w = 0.0, 1.0
    for s in range(sm, n_slots, n_sms):
        if live[s]:
            total += w
            w *= share
    for s in range(sm, n_slots, n_sms):
        if live[s]:
            w = 1.0
            for t in range(sm, n_slots, n_sms):
                if live[t] and age[t] < age[s]:
                    w *= share
            rate[s] = w / total


@_njit
def _start_grid(n_slots, grid, n_atoms):
    """The slots at the kernel's start, holding the first ``n_slots`` blocks in launch order. Returns
    (slots, launched)."""
    n_sms, share = grid.n_sms, grid.share
    total_blocks = grid.layout[BLOCKS] * grid.head_q.shape[0]
    half = np.zeros(n_slots, np.int8)
    for s in range(n_slots):
        half[s] = 1 if 2 * (s % n_sms) < n_sms else 2  # the lower half of SM numbers near one partition
    slots = Slots(pos=np.zeros(n_slots, np.int64), end=np.zeros(n_slots, np.int64), qoff=np.zeros(n_slots, np.int64),
                  kvoff=np.zeros(n_slots, np.int64), live=np.zeros(n_slots, np.bool_),
                  age=np.arange(n_slots).astype(np.int64), rate=np.ones(n_slots, np.float64),
                  credit=np.zeros(n_slots, np.float64), half=half, rep=np.zeros(n_slots, np.int64),
                  unit=np.zeros(n_slots, np.int64), done=np.zeros(n_slots, np.int64))
    launched = 0
    for s in range(n_slots):
        if launched < total_blocks:
            _launch_block(launched, s, grid, slots, n_atoms)
            slots.live[s] = True
            launched += 1
    if share < 1.0:
        for sm in range(min(n_sms, n_slots)):
            _set_sm_rates(sm, slots, n_sms, share)
    return slots, launched


@_njit_inline
def _turn(credit, rate):
    """Whether a block with issue share ``rate`` and ``credit`` so far makes an access this round (in a fraction
    ``rate`` of the rounds), and its new credit. Scalars in, scalars out: an array passed to a helper or taken
    from a tuple in the loop costs two atomic reference counts per use, which were half the loop's time."""
    credit += rate
    if credit < 1.0 - 1e-9:
        return False, credit
    return True, credit - 1.0


@_njit_inline
def _refill_slot(s, launched, live, grid, slots, n_atoms):
    """The block in slot ``s`` has finished: launch the grid's next block there, or retire the slot; the shares
    of that SM's blocks change. Returns the new (``launched``, ``live``)."""
    n_sms, share = grid.n_sms, grid.share
    if launched < grid.layout[BLOCKS] * grid.head_q.shape[0]:
        _launch_block(launched, s, grid, slots, n_atoms)
        slots.credit[s] = 0.0
        launched += 1
    else:
        slots.live[s] = False
        live -= 1
    if share < 1.0:
        _set_sm_rates(s % n_sms, slots, n_sms, share)
    return launched, live


@_njit_inline
def _next_record(pos, q, gidx, glen, reps):
    """The record after ``pos`` (the ``gidx``-th of a group of ``glen`` records run ``reps`` times, now its
    ``q``-th time): the group's first again after its last, or the next one. Returns (record, repetition)."""
    if gidx == glen - 1:  # the group's last record: again, or on
        if q + 1 < reps:
            return pos - (glen - 1), q + 1
        return pos + 1, 0
    return pos + 1, q


# ------------------------------------------------------------------------------------------------------------------
# the loop: the resident blocks' accesses of a run of rounds are gathered, then run through the cache in order
#
# The blocks' turns never depend on what the cache holds, so a run of rounds (up to the next stock-taking, or as
# many as the batch holds) is gathered first, then walked through the cache: the same accesses in the same order as
# a loop that does both a round at a time. Two functions, each called once a run: numba keeps the list ends, the
# room used and the counters in registers only inside one function, and every array a function takes (passed, or
# taken from a tuple) costs an atomic reference count per call (NRT_incref / NRT_decref were half the time under
# perf when helpers took arrays per access: flash1 at N = 32768, 32 heads, H200 ran 0.29 s written out in one loop,
# 0.56-0.72 s with the eviction alone in a helper). Called once a run of thousands of accesses, that cost vanishes.


@_njit
def run_kernel(trace, grid, m, n_slots, init_dirty, n_tensors, ctl):
    """Round-robin execution of the grid over the LRU, ``n_slots`` blocks resident at once. Returns (DRAM read and
    written by unit of heads and tensor, dirty bytes left at the end, rounds, accesses skipped); row ``n_units`` of
    the written bytes, tensor FOREIGN, counts the foreign dirty lines written back."""
    n_units = max(m.unit_q.max(), m.unit_kv.max()) + 1
    c, lru = _new_cache(m, init_dirty, n_units, n_tensors)
    slots, launched = _start_grid(n_slots, grid, m.n_atoms)
    out_read = c.out_read
    win = Window(done0=np.zeros(n_slots, np.int64), d1=np.zeros(n_slots, np.int64), d2=np.zeros(n_slots, np.int64),
                 r_snap=np.zeros_like(out_read), rd1=np.zeros_like(out_read), rd2=np.zeros_like(out_read),
                 restore=np.zeros_like(out_read), stats=np.zeros(6, np.int64))
    batch = _new_batch(n_slots, trace.shapes)
    # the counters window() takes start as int64, not as the literal 0: numba would compile window() once for each
    # type its arguments pass through (literal, then int64), three times, 12 of the first run's 20 s
    zero = np.int64(0)
    live, rnd, issued, refill_rnd, hits, fetched, wrote = launched, zero, zero, zero, zero, zero, zero
    used, head, tail = lru
    while live > 0:
        rnd += 1
        if rnd % ctl.window == 0:
            rnd, used, head, tail = window((rnd, refill_rnd, used, head, tail), (hits, fetched, wrote), trace, slots,
                                           c, m, win, ctl)
            hits = fetched = wrote = zero
            ctl.progress[0] = issued + win.stats[SKIPPED]
        n, rnd, records, launched, live, refill_rnd = _gather(trace, grid, slots, batch, m,
                                                              (rnd, launched, live, refill_rnd), ctl.window)
        issued += records
        used, head, tail, h, f, w = _touch(batch, n, c, m, (used, head, tail))
        hits, fetched, wrote = hits + h, fetched + f, wrote + w
    dirty_end = 0
    for g in range(m.foreign):
        if c.dirty[g]:
            dirty_end += c.res[g]
    ctl.progress[0] = issued + win.stats[SKIPPED]
    return out_read, c.out_write, dirty_end, rnd, win.stats[SKIPPED]


@_njit
def _new_cache(m, init_dirty, n_units, n_tensors):
    """An empty cache over every head's atoms and the foreign dirty lines present at the start (``init_dirty``
    bytes, the least recent). Returns (cache, (room used, most recent atom, least recent atom))."""
    G = m.foreign + 1
    c = Cache(np.zeros(G, np.int64), np.zeros(G, np.int64), np.zeros(G, np.int8), np.zeros(G, np.bool_),
              np.full(G, -1, np.int64), np.full(G, -1, np.int64), np.full(G, -1, np.int64),
              np.zeros((n_units + 1, n_tensors), np.int64), np.zeros((n_units + 1, n_tensors), np.int64),
              np.zeros(G, np.int64))
    head = tail = np.int64(-1)  # most and least recent
    used = np.int64(0)  # room in units of 1/ROOM_UNIT byte
    if init_dirty > 0:
        f = m.foreign
        c.res[f], c.cost[f], c.dirty[f] = init_dirty, m.cost_dirty, True
        head = tail = np.int64(f)
        used = np.int64(init_dirty * m.cost_dirty)
    return c, (used, head, tail)


@_njit_inline
def _largest_record(shapes):
    """Atoms of the largest record (a rectangle of ``shapes[k, 0]`` x ``shapes[k, 1]`` atoms; shape 0 is one)."""
    most = 1
    for k in range(shapes.shape[0]):
        most = max(most, shapes[k, 0] * shapes[k, 1])
    return most


@_njit
def _new_batch(n_slots, shapes):
    """Room for BATCH accesses, and at least one round's: a record of the largest shape from every resident block."""
    size = max(n_slots * _largest_record(shapes), BATCH)
    return Batch(np.zeros(size, np.int64), np.zeros(size, np.int64), np.zeros(size, np.bool_), np.zeros(size, np.int8),
                 np.zeros(size, np.int64), np.zeros(size, np.int64))


@_njit
def _gather(trace, grid, slots, batch, m, loop, period):
    """The resident blocks' turns from round ``rnd`` on, ``loop`` = (rnd, blocks launched, live, the last round a
    block ended in): the atoms of the record each block taking its turn is at go into ``batch``, in round and slot
    order; the blocks move on, and a block that has ended hands its slot to the grid's next block. Stops before a
    round that takes stock (a multiple of ``period``), when no block is left, or when another round may not fit.
    Returns (atoms in the batch, the last round, records, launched, live, the last round a block ended in)."""
    rnd, launched, live, refill_rnd = loop
    acc_atom, acc_shape, acc_write, shapes, acc_step = trace.atom, trace.shape, trace.write, trace.shapes, trace.step
    acc_gidx, acc_glen, acc_reps = trace.gidx, trace.glen, trace.reps
    s_pos, s_end, s_qoff, s_kvoff, s_live = slots.pos, slots.end, slots.qoff, slots.kvoff, slots.live
    s_rate, s_credit, s_half, s_rep, s_unit, s_done = slots.rate, slots.credit, slots.half, slots.rep, slots.unit, \
        slots.done
    b_g, b_a, b_write, b_half, b_unit, b_rnd = batch
    share, n_atoms, kv_atom, n_slots = grid.share, m.n_atoms, m.atom_kv, s_live.shape[0]
    room = b_g.shape[0] - n_slots * _largest_record(shapes)  # a further round fits while n <= room
    n = records = 0
    while True:
        for s in range(n_slots):
            if not s_live[s]:
                continue
            if share < 1.0:  # not in lockstep: the block takes a turn in a fraction of the rounds
                go, s_credit[s] = _turn(s_credit[s], s_rate[s])
                if not go:
                    continue
            pos = s_pos[s]
            if pos < s_end[s]:
                k, q = acc_shape[pos], s_rep[s]
                nr, nc, stride = (1, 1, 1) if k == 0 else (shapes[k, 0], shapes[k, 1], shapes[k, 2])
                a0, write = acc_atom[pos] + q * acc_step[pos], acc_write[pos]
                for ra in range(nr):
                    for ca in range(nc):
                        a = a0 + ra * stride + ca
                        b_g[n] = a + (s_kvoff[s] if kv_atom[a] else s_qoff[s])
                        b_a[n], b_write[n], b_half[n], b_unit[n], b_rnd[n] = a, write, s_half[s], s_unit[s], rnd
                        n += 1
                records += 1
                s_done[s] += 1
                pos, s_rep[s] = _next_record(pos, q, acc_gidx[pos], acc_glen[pos], acc_reps[pos])
                s_pos[s] = pos
            if pos >= s_end[s]:
                launched, live = _refill_slot(s, launched, live, grid, slots, n_atoms)
                refill_rnd = rnd
        if live == 0 or (rnd + 1) % period == 0 or n > room:
            return n, rnd, records, launched, live, refill_rnd
        rnd += 1


# ------------------------------------------------------------------------------------------------------------------
# the cache: a byte-weighted LRU with room factors


@_njit
def _touch(batch, n, c, m, lru):
    """Run the ``n`` accesses of ``batch`` through the byte-weighted LRU, in order, from ``lru`` = (room used, most
    recent atom, least recent atom). Returns (room used, most recent, least recent, reads that hit on data fetched in
    an earlier round, room the misses took, writes)."""
    b_g, b_a, b_write, b_half, b_unit, b_rnd = batch
    res, cost, mask, dirty, prev, nxt, last_round, out_read, out_write, owner = c
    atom_bytes, atom_tensor, n_atoms, foreign = m.atom_bytes, m.atom_tensor, m.n_atoms, m.foreign
    cost_private, cost_shared, cost_dirty, cap_units, dedupe = m.cost_private, m.cost_shared, m.cost_dirty, \
        m.capacity, m.dedupe
    n_units = out_write.shape[0] - 1
    used, head, tail = lru
    hits = fetched = wrote = 0
    for i in range(n):
        g, a, write, unit, rnd = b_g[i], b_a[i], b_write[i], b_unit[i], b_rnd[i]
        size, t, r = atom_bytes[a], atom_tensor[a], res[g]
        mask[g] |= b_half[i]
        want = cost_shared if mask[g] == 3 else cost_private
        if write or (dirty[g] and r > 0):
            want = cost_dirty
        if dedupe and (not write) and last_round[g] == rnd:
            # read again this round: a hit; now by both partitions, a second copy takes room
            if r > 0 and cost[g] != want:
                used += r * (want - cost[g])
                cost[g] = want
        else:
            last_round[g] = rnd
            owner[g] = unit
            used -= r * cost[g]  # the atom's old room; it is re-linked as the most recent below
            if 0 < r < size and dirty[g]:
                # partly evicted: it is the LRU tail, and a line-level LRU walking its lines in order evicts each
                # remaining line just before reaching it: all of it misses
                out_write[unit, t] += r
                dirty[g] = False
            if r > 0:  # unlink
                if prev[g] >= 0:
                    nxt[prev[g]] = nxt[g]
                else:
                    head = nxt[g]
                if nxt[g] >= 0:
                    prev[nxt[g]] = prev[g]
                else:
                    tail = prev[g]
            if write:
                dirty[g] = True
                wrote += 1
            elif r != size:
                out_read[unit, t] += size
                fetched += size * want
            else:  # a hit on data another block brought in an earlier round
                hits += 1
            res[g], cost[g] = size, want
            used += size * want
            prev[g], nxt[g] = -1, head  # link as the most recent
            if head >= 0:
                prev[head] = g
            head = g
            if tail < 0:
                tail = g
        if used > cap_units:  # evict the least recent bytes; dirty bytes evicted reach DRAM
            while used > cap_units:
                v = tail  # (the atom just touched only when it is larger than L2: its first bytes go)
                cv = cost[v]
                take = min(res[v], (used - cap_units + cv - 1) // cv)
                res[v] -= take
                used -= take * cv
                if dirty[v]:  # the bytes of the unit of heads that last touched it (atom_unit)
                    if v == foreign:
                        out_write[n_units, FOREIGN] += take
                    else:
                        out_write[owner[v], atom_tensor[v % n_atoms]] += take
                if res[v] == 0:
                    dirty[v], mask[v], cost[v] = False, 0, 0
                    tail = prev[v]
                    if tail >= 0:
                        nxt[tail] = -1
                    prev[v] = -1
            if tail < 0:
                head = -1
    return used, head, tail, hits, fetched, wrote
