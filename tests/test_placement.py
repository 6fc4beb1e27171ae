"""Thread-block placement (iosim.blocks.assign, makespan): the one list scheduler the time models and the flash3
host scheduler share."""

import numpy as np

from iosim.blocks import assign, makespan


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
