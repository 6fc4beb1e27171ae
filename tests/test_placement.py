"""Thread-block placement (iosim.blocks.assign, makespan, tail_makespan): the one list scheduler the time models
and the flash3 host scheduler share, and the tail of a grid whose SMs empty."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from iosim.blocks import assign, makespan, tail_makespan


def test_each_item_goes_to_the_slot_that_frees_first_the_lowest_on_a_tie():
    per_slot, loads = assign([3, 1, 1, 1], 2)
    assert per_slot == [[0], [1, 2, 3]] and loads == [3, 3]
    per_slot, loads = assign([2, 2, 2], 2)
    assert per_slot == [[0, 2], [1]] and loads == [4, 2]


def test_launch_order_and_longest_first_differ_as_by_hand():
    d = np.array([1.0, 1.0, 3.0])
    assert makespan(d, 2) == 4.0  # 1 | 1, then 3 joins the first slot
    assert makespan(d, 2, longest_first=True) == 3.0  # 3 | 1 + 1


def test_short_grids_and_equal_work_take_their_shortcuts_exactly():
    assert makespan(np.array([2.0, 5.0]), 4) == 5.0
    assert makespan(np.full(10, 1.5), 4) == 4.5  # three waves
    assert makespan(np.array([]), 4) == 0.0


FASTER_ALONE = {1: 2.0, 2: 1.0}  # 2 slots an SM: a block alone on its SM runs twice as fast


def test_the_last_waves_blocks_run_at_the_pace_of_their_sms_count():
    # 2 SMs of 2 slots, blocks of 1 s at 2 an SM. 3 blocks: SM 0 holds two (slots 0, 2), SM 1 one: 1 s
    assert tail_makespan(np.ones(3), 2, 2, FASTER_ALONE) == pytest.approx(1.0)
    # 5: a wave of 4, then the fifth alone on SM 0 at twice the pace
    assert tail_makespan(np.ones(5), 2, 2, FASTER_ALONE) == pytest.approx(1.5)
    assert tail_makespan(np.ones(4), 2, 2, FASTER_ALONE) == pytest.approx(1.0)  # full waves: no tail
    assert tail_makespan(np.array([]), 2, 2, FASTER_ALONE) == 0.0


def test_a_long_block_speeds_up_once_its_sm_empties():
    """Blocks 4, 1, 1, 1, 1 s: the fifth takes slot 1 at 1 s, the last placement. Then SM 0 runs block 0 alone (3 s
    of work at twice the pace: 1.5 s more) and SM 1 block 4 alone; plain list scheduling says 4 s."""
    d = np.array([4.0, 1.0, 1.0, 1.0, 1.0])
    assert makespan(d, 4) == 4.0
    assert tail_makespan(d, 2, 2, FASTER_ALONE) == pytest.approx(2.5)


@given(st.lists(st.floats(0.1, 10.0), min_size=1, max_size=60), st.integers(1, 6), st.integers(1, 4))
@settings(max_examples=50, deadline=None)
def test_no_speedup_is_list_scheduling_and_a_speedup_never_slows(durations, sms, per_sm):
    d = np.asarray(durations)
    same = {j: 1.0 for j in range(1, per_sm + 1)}
    faster = {j: 1.0 + (per_sm - j) * 0.5 for j in range(1, per_sm + 1)}
    plain = makespan(d, sms * per_sm)
    assert tail_makespan(d, sms, per_sm, same) == pytest.approx(plain, rel=1e-9)
    assert tail_makespan(d, sms, per_sm, faster) <= plain * (1 + 1e-9)
    assert tail_makespan(d, sms, per_sm, faster) >= d.max() / faster[1] * (1 - 1e-9)  # none beats running alone
