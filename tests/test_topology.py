"""Host side of iosim.gpu.topology (no GPU): the pointer chains and the split into two groups."""

from __future__ import annotations

import numpy as np

from iosim.gpu import topology as topo


def test_each_chain_is_one_cycle_through_distinct_lines_of_its_own_window():
    lines, window = 64, 1 << 16
    chain, heads = topo._chains(5, lines, window, np.random.default_rng(3))
    wpl = topo.LINE // 4
    for r, h in enumerate(heads):
        seen, i = [], int(h)
        for _ in range(lines):
            seen.append(i)
            i = int(chain[i])
        assert i == h  # closes after exactly `lines` steps
        assert len(set(seen)) == lines
        assert all(s % wpl == 0 and r * window // 4 <= s < (r + 1) * window // 4 for s in seen)


def test_split_halves_cuts_at_the_widest_gap_and_maps_blocks_to_sm_ids():
    n = 8
    sm = [5, 3, 0, 1, 2, 4, 7, 6]  # block b ran on SM sm[b]
    own = [200.0] * n
    after = [np.nan, 205, 203, 330, 340, 201, 335, 338]  # blocks 3, 4, 6, 7 pay the far trip
    p = topo.PartitionProbe(0, 5, sm, [600.0] * n, after, own, [700.0] * n)
    part, gap = topo.split_halves(p)
    # by SM id: SMs 1, 2, 7, 6 (blocks 3, 4, 6, 7) are the other group
    assert part == [0, 1, 1, 0, 0, 0, 1, 1]
    assert gap == 330 - 205
