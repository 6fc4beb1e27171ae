"""Skipping the steady part of long K/V loops: the round loop's stock-taking every ``window`` rounds.

Part of the L2 model; the model as a whole is described in :mod:`iosim.l2`. When every resident block is deep in a
repeated group (flash2's K/V loop) and nothing launched for two windows, the loop is periodic: each window makes the
same accesses, shifted, and fetches the same bytes. If the last two windows fetched the same bytes (within 1%) and
wrote nothing, every block advanced alike (within one access), and either no read in them hit on data of an earlier
round or every block ran in every round, the next ``k`` windows are skipped. (A read that hits on data another block
fetched in an earlier round comes from a block trailing another closely enough to reuse what it fetched: as blocks
drift apart such reuse stops at once, and a skip across that point would miss it; blocks that all run every round
keep their distances, and the reuse repeats: a causal grid's blocks, launched a few rounds apart, trail each other so
for all of their K/V loop.)

* DRAM reads: ``k`` times the mean of the two windows, by unit of heads and tensor;
* DRAM writes: in ``k`` windows at least one L2 of fresh data arrives (``k`` is at least ``j``, below), so every
  line in L2 now is evicted by then unless it is touched again; the skipped windows write nothing (windows that
  write, as flash1's inner loop does, are walked), so each dirty byte in L2 now is written back: the cache is
  flushed, counting them;
* the blocks jump ``k - j`` windows ahead and run the last ``j`` windows from the empty cache without counting
  their reads, so that L2 holds what it would hold (``j`` windows fetch at least one L2: LRU keeps the most
  recent data, and the ``j`` windows touched at least an L2's worth).

Each skip stops one window before any block leaves its group. What it approximates: the windows' mean stands for
each skipped window, and blocks that drift (``block_share`` < 1) advance by their mean per window.
"""

from __future__ import annotations

from ._common import FOREIGN
from ._jit import _njit, _njit_inline
from .state import LAST_HITS, LAST_ROOM, LAST_WROTE, REPLAY_END, SKIPPED, WINDOWS


@_njit_inline
def atom_unit(g, c, m):
    """(unit of heads, tensor) of global atom ``g``: the unit of the block that last touched it (``c.owner``);
    the foreign dirty lines are unit ``n_units``, FOREIGN."""
    if g == m.foreign:
        return max(m.unit_q.max(), m.unit_kv.max()) + 1, FOREIGN
    return c.owner[g], m.atom_tensor[g % m.n_atoms]


@_njit
def _flush(c, m):
    """Empty the cache; dirty bytes are written back. Returns the new (used, head, tail)."""
    res, cost, mask, dirty, prev, nxt, out_write = c.res, c.cost, c.mask, c.dirty, c.prev, c.nxt, c.out_write
    for g in range(res.shape[0]):
        if res[g] > 0:
            if dirty[g]:
                u, t = atom_unit(g, c, m)
                out_write[u, t] += res[g]
            res[g], cost[g], mask[g], dirty[g], prev[g], nxt[g] = 0, 0, 0, False, -1, -1
    return 0, -1, -1


@_njit
def window(loop, counts, trace, slots, c, m, win, ctl):
    """Take stock at round ``rnd`` (a multiple of the window); skip ahead when the loop is steady (see above).
    ``loop`` = (rnd, the last round a block ended in, the LRU's room used, its most and least recent atom);
    ``win``: :class:`~iosim.l2.state.Window`; ``counts`` = (hits: reads in this window that found data fetched
    in an earlier round, fetched: the L2 room (units of 1/ROOM_UNIT byte) its misses took, writes it made).
    Returns the new (rnd, used, head, tail)."""
    rnd, refill_rnd, used, head, tail = loop
    done0, d1, d2, r_snap, rd1, rd2, restore, st = win.done0, win.d1, win.d2, win.r_snap, win.rd1, win.rd2, \
        win.restore, win.stats
    hits, fetched, wrote = counts
    period, skip = ctl.window, ctl.skip
    out_read, live, done = c.out_read, slots.live, slots.done
    if st[REPLAY_END] > 0:  # replaying the last windows of a skip
        if rnd < st[REPLAY_END]:
            return rnd, used, head, tail
        st[WINDOWS], st[REPLAY_END] = 0, 0
        for s in range(done.shape[0]):
            done0[s] = done[s]
        for u in range(out_read.shape[0]):
            for t in range(out_read.shape[1]):
                out_read[u, t] = r_snap[u, t] = restore[u, t]  # the replay has ended: the skip counted its reads
        return rnd, used, head, tail
    # the last two windows' advance and reads (loops written out: numba takes a second or two to compile each
    # array expression, and this function is compiled on the first run after an install)
    for s in range(done.shape[0]):
        d2[s], d1[s], done0[s] = d1[s], done[s] - done0[s], done[s]
    tot1 = tot2 = diff = 0
    for u in range(out_read.shape[0]):
        for t in range(out_read.shape[1]):
            rd2[u, t], rd1[u, t], r_snap[u, t] = rd1[u, t], out_read[u, t] - r_snap[u, t], out_read[u, t]
            tot1, tot2, diff = tot1 + rd1[u, t], tot2 + rd2[u, t], diff + abs(rd1[u, t] - rd2[u, t])
    st[WINDOWS] += 1
    hits2, st[LAST_HITS] = st[LAST_HITS] + hits, hits
    room2, st[LAST_ROOM] = st[LAST_ROOM] + fetched, fetched
    wrote2, st[LAST_WROTE] = st[LAST_WROTE] + wrote, wrote
    if not skip or st[WINDOWS] < 2 or refill_rnd > rnd - 2 * period or wrote2 > 0 or room2 <= 0:
        return rnd, used, head, tail
    if hits2 > 0:  # reuse between blocks holds only while none drifts from another: every block ran every round
        for s in range(live.shape[0]):
            if live[s] and (d1[s] != period or d2[s] != period):
                return rnd, used, head, tail
    if tot1 <= 0 or tot2 <= 0 or 100 * diff > tot1 + tot2:
        return rnd, used, head, tail
    gidx, glen, reps = trace.gidx, trace.glen, trace.reps
    kmax = 1 << 62
    for s in range(live.shape[0]):
        if not live[s]:
            continue
        pos = slots.pos[s]
        two = d1[s] + d2[s]  # twice the mean advance
        if reps[pos] <= 1 or abs(d1[s] - d2[s]) > 1 or two <= 0:
            return rnd, used, head, tail
        left = reps[pos] * glen[pos] - 1 - (slots.rep[s] * glen[pos] + gidx[pos]) - two  # a window to spare
        kmax = min(kmax, max(0, 2 * left // two))
    j = (2 * m.capacity + room2 - 1) // room2 + 1  # windows that fetch one L2 from empty, and one more
    if kmax - j < 3:
        return rnd, used, head, tail
    for u in range(out_read.shape[0]):
        for t in range(out_read.shape[1]):
            restore[u, t] = out_read[u, t] + (kmax * (rd1[u, t] + rd2[u, t])) // 2
    used, head, tail = _flush(c, m)
    skipped = 0
    for s in range(live.shape[0]):
        if live[s]:
            pos, L = slots.pos[s], glen[slots.pos[s]]
            adv = ((kmax - j) * (d1[s] + d2[s])) // 2
            e = slots.rep[s] * L + gidx[pos] + adv
            slots.pos[s] = pos - gidx[pos] + e % L
            slots.rep[s] = e // L
            done[s] += adv
            skipped += adv
    rnd += (kmax - j) * period
    st[REPLAY_END], st[SKIPPED] = rnd + j * period, st[SKIPPED] + skipped
    for s in range(done.shape[0]):
        done0[s] = done[s]
    return rnd, used, head, tail
