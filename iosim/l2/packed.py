"""DRAM bytes of flash2's forward on packed sequences (varlen): each sequence walked by the L2 model as its own problem.

The varlen grid (:mod:`iosim.launch.varlen`) runs sequence b's Q blocks for every head before sequence b + 1's
(``blockIdx.z`` is the sequence), and no two sequences share a byte of Q, K, V, O or lse. So each sequence's DRAM
reads are, to first order, what it reads run alone: the dense model (:func:`iosim.l2.simulate_l2`) on a batch-1
problem of its queries and keys, at the same tiles and window. Sequences of the same lengths move the same bytes (one
walk each). Its writes are those of its walk plus the lines its walk leaves dirty at the end, except those still in
L2 when the kernel ends: LRU at the grain of sequences, a sequence's dirty lines stay where the sequences after it
bring in less than the L2's capacity of new bytes (their Q, K, V, O and lse once each), the rest are written back.
What this leaves out: sequences in flight together at a wave's edge share the cache (a sequence that would fit L2
alone may not beside its neighbours), and a sequence with no key, whose blocks only write O = 0 and lse (counted as
those writes).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from ..problem import AttentionProblem
from ..schedules import Tiles
from ..schedules.flash2 import Flash2Tiles
from .model import PROFILE_INPUTS, L2Inputs, WalkOptions, simulate_l2

NOTE = ("l2-lru per packed sequence, each walked as if it ran alone (the varlen grid runs them one after another and "
        "they share no data), its dirty lines written back once later sequences bring in an L2 of new bytes")


@dataclass(frozen=True)
class PackedDram:
    """DRAM (read, write) bytes of a packed batch, and the model's text (``hbm_model``)."""

    read_bytes: int
    write_bytes: int
    text: str


def packed_dram(problem: AttentionProblem, tiles: Flash2Tiles, profile, walk: WalkOptions | None = None,
                inputs: L2Inputs = PROFILE_INPUTS) -> PackedDram:
    """DRAM bytes of flash2's forward on ``tiles.seqlens`` (``problem``: batch 1, the packed totals): the sum over
    the sequences of each one's own walk (one per distinct (queries, keys)); ``walk`` and ``inputs`` as
    :func:`iosim.l2.simulate_l2` takes them."""
    dense = Tiles(tiles.block_q, tiles.block_kv) if tiles.window is None else Flash2Tiles(
        tiles.block_q, tiles.block_kv, window=tiles.window)
    walks = {}
    for n, nk in Counter(s for s in tiles.seqlens if s[0] > 0 and s[1] > 0):
        walks[n, nk] = simulate_l2("flash2", problem.model_copy(update={"batch": 1, "seq_len": n, "kv_len": nk}),
                                   dense, profile, inputs, walk=walk or WalkOptions())
    capacity = next(iter(walks.values())).capacity if walks else 0
    read = write = after = 0.0  # after: bytes the sequences after this one bring into L2
    for n, nk in reversed(tiles.seqlens):
        if n == 0:
            continue  # every block of the sequence exits at once
        rows, keys = n * problem.heads, nk * problem.kv_heads
        if nk == 0:  # no key: O = 0 and lse written
            write += rows * (problem.head_dim * problem.elem_bytes + 4)
        else:
            k = walks[n, nk].kernels[0]
            stays = min(k.dirty_at_end, max(0.0, capacity - after))
            read, write = read + k.dram_read, write + k.dram_write + k.dirty_at_end - stays
        after += (2 * rows + 2 * keys) * problem.head_dim * problem.elem_bytes + 4 * rows
    inner = f"; {next(iter(walks.values())).describe()} (the first walk)" if walks else ""
    return PackedDram(round(read), round(write), f"{NOTE}: {len(walks)} walks for {len(tiles.seqlens)} sequences{inner}; iosim.l2")
