"""The persistent grid of kernels/flash3_fwd.cu: which Q tiles each thread block runs.

The kernel numbers its tiles t = x + Tr * (h + H * b) (Q tiles of one head fastest; causal m = Tr - 1 - x, heaviest
first) and, by default, hands them out in a **snake**: round r gives block x tile r * G + x, reversed on odd rounds
(G blocks). A causal call may bring a schedule computed here instead (:func:`tile_schedule`: greedy, each tile to
the block that frees first), where it shrinks the busiest block enough. The launch (:mod:`iosim.gpu.flash3_host`)
and the time model (:mod:`iosim.timing.fa3`, our kernel's description) both take the assignment from here, so the
time model places the tiles where the kernel does.
"""

from __future__ import annotations

import numpy as np

from ..blocks import assign, kv_block_ranges


def snake(tiles: int, blocks: int) -> list[list[int]]:
    """The tiles each of ``blocks`` blocks runs in the kernel's own order (the snake: tile r * G + x in round r,
    G - 1 - x on odd rounds)."""
    out: list[list[int]] = [[] for _ in range(blocks)]
    for r in range(-(-tiles // blocks)):
        for x in range(blocks):
            t = r * blocks + (blocks - 1 - x if r & 1 else x)
            if t < tiles:
                out[x].append(t)
    return out


def block_tiles(batch: int, seq_len: int, kv_len: int, heads: int, block_q: int, block_kv: int, causal: bool,
                blocks: int) -> list[list[int]]:
    """The tiles each block runs for a call, as the launch hands them out: the host schedule where
    :func:`tile_schedule` gives one, else the snake. ``causal``: the kernel's causal instantiation (a sliding
    window runs the Local one: False)."""
    sched = tile_schedule(batch, seq_len, kv_len, heads, block_q, block_kv, causal, blocks)
    T = -(-seq_len // block_q) * heads * batch
    if sched is None:
        return snake(T, blocks)
    offsets, tiles = sched[:blocks + 1], sched[blocks + 1:]
    return [tiles[offsets[x]:offsets[x + 1]] for x in range(blocks)]


def kv_blocks(m_block: int, seq_len: int, kv_len: int, block_q: int, block_kv: int, causal: bool) -> int:
    """K/V tiles that Q tile ``m_block`` visits (mirrors kv_blocks() in kernels/flash3_fwd.cu)."""
    n = -(-kv_len // block_kv)
    if causal:
        last_key = min((m_block + 1) * block_q, seq_len) - 1 + (kv_len - seq_len)
        n = min(n, 0 if last_key < 0 else last_key // block_kv + 1)
    return n


def tile_schedule(batch: int, seq_len: int, kv_len: int, heads: int, block_q: int, block_kv: int, causal: bool,
                  blocks: int) -> list[int] | None:
    """Which Q tiles each block of the persistent grid runs, as CSR: ``[offsets (blocks + 1)..., tiles...]``, or
    None where the kernel's own snake order is as good (non-causal: every tile costs the same).

    Tiles are numbered as in the kernel (t = x + Tr * (h + H * b), causal m = Tr - 1 - x, heaviest first within a
    head) and cost their K/V steps + 1 (the fixed cost of a tile). Greedy in list order: each tile goes to the block
    that frees first, what a dynamic scheduler does, so blocks stay within a head or two of each other (K/V shared in
    L2) and the busiest block ends near the mean (1.005x at N = 16384, d = 128, where the snake gives 1.53x). The snake
    is kept unless the model's busiest block shrinks by SCHEDULE_MIN_GAIN."""
    if not causal:
        return None
    Tr = -(-seq_len // block_q)
    T = Tr * heads * batch
    cost = [kv_blocks(Tr - 1 - (t % Tr), seq_len, kv_len, block_q, block_kv, True) + 1 for t in range(Tr)]
    snake_load = [sum(cost[t % Tr] for t in tiles) for tiles in snake(T, blocks)]
    per_block, loads = assign((cost[t % Tr] for t in range(T)), blocks)
    if max(loads) * SCHEDULE_MIN_GAIN > max(snake_load):
        return None
    offsets = [0]
    for tiles in per_block:
        offsets.append(offsets[-1] + len(tiles))
    return offsets + [t for tiles in per_block for t in tiles]


def varlen_tiles(seqlens: tuple[tuple[int, int], ...], heads: int, block_q: int, block_kv: int, causal: bool,
                 window: tuple[int | None, int | None] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The Q tiles of packed sequences ``seqlens`` ((queries, keys) each) as the varlen kernel numbers them, t = m +
    Tr * (h + H * b) with Tr of the longest sequence, and the K/V tiles each visits (int64 arrays, in list order):
    sequence by sequence, head by head, a sequence's Q tiles from its last where causal or windowed (they see the
    most keys). Tiles past a sequence's end are not listed; a tile that sees no key is (it writes O = 0 and
    lse = -inf)."""
    Tr = max(1, -(-max(n for n, _ in seqlens) // block_q))
    tiles, visits = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)]
    h = np.arange(heads, dtype=np.int64)[:, None]
    for b, (n, nk) in enumerate(seqlens):
        if n == 0:
            continue
        lo, hi = kv_block_ranges(n, nk, block_q, block_kv, causal, window)
        m = np.arange(len(lo), dtype=np.int64)
        m = m[::-1] if causal or window is not None else m
        tiles.append((m[None, :] + Tr * (h + heads * b)).ravel())
        visits.append(np.broadcast_to(np.maximum(hi - lo, 0)[m], (heads, len(m))).ravel())
    return np.concatenate(tiles), np.concatenate(visits)


def varlen_schedule(seqlens: tuple[tuple[int, int], ...], heads: int, block_q: int, block_kv: int, causal: bool,
                    window: tuple[int | None, int | None] | None, blocks: int) -> np.ndarray:
    """The persistent grid's tiles for packed sequences, as CSR (``[offsets (blocks + 1)..., tiles...]``, int64): the
    working tiles of :func:`varlen_tiles` handed out in a snake over their list, or each to the block that frees
    first where that shrinks the busiest block by SCHEDULE_MIN_GAIN (costs: K/V steps + 1), the rule of
    :func:`tile_schedule`. The varlen kernel always runs a host schedule: the kernel's own snake would hand blocks
    the numbers of tiles past a sequence's end. The greedy list (a heap, tile by tile) is only built where the snake's
    busiest block is SCHEDULE_MIN_GAIN over the bound no schedule beats (the mean load, the costliest tile): a
    serving loop's new batch costs milliseconds, not the greedy walk over every tile."""
    tiles, visits = varlen_tiles(seqlens, heads, block_q, block_kv, causal, window)
    cost = visits + 1
    i = np.arange(len(tiles))
    rnd, x = np.divmod(i, blocks)
    owner = np.where(rnd % 2 == 1, blocks - 1 - x, x)  # the snake: round r gives block x tile r * G + x, reversed on odd r
    snake_max = float(np.bincount(owner, weights=cost, minlength=blocks).max()) if len(tiles) else 0.0
    bound = max(float(cost.sum()) / blocks, float(cost.max())) if len(tiles) else 0.0
    if snake_max >= SCHEDULE_MIN_GAIN * bound and len(tiles):
        per_block, loads = assign(cost.tolist(), blocks)
        if max(loads) * SCHEDULE_MIN_GAIN <= snake_max:
            order = np.concatenate([np.asarray(items, dtype=np.int64) for items in per_block])
            counts = np.array([len(items) for items in per_block])
            return np.concatenate([[0], np.cumsum(counts), tiles[order]]).astype(np.int64)
    order = np.lexsort((i, owner))  # each block's tiles in list order
    return np.concatenate([[0], np.cumsum(np.bincount(owner, minlength=blocks)), tiles[order]]).astype(np.int64)


# the host schedule replaces the snake only where the model's busiest block shrinks by this factor: at d=64
# N=8192/16384 it predicted 1.03x -> 1.00x and measured 3-7% slower (H100, docs/kernels.md v5)
SCHEDULE_MIN_GAIN = 1.10
