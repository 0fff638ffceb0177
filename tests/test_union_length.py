"""slime_actors.traces.summary.union_length: the time covered by a set of intervals inside a window, which the
step splits of bench/rl_overhead.py and scripts/compare_trl/split.py are built from."""

import pytest

from slime_actors.traces.summary import union_length


@pytest.mark.parametrize("intervals,lo,hi,expected", [
    ([], 0.0, 10.0, 0.0),
    ([(1.0, 3.0)], 0.0, 10.0, 2.0),
    ([(1.0, 3.0), (2.0, 5.0)], 0.0, 10.0, 4.0),                   # overlapping: counted once
    ([(2.0, 5.0), (1.0, 3.0), (3.0, 4.0)], 0.0, 10.0, 4.0),       # unsorted, one inside another
    ([(1.0, 2.0), (2.0, 3.0)], 0.0, 10.0, 2.0),                   # touching
    ([(1.0, 2.0), (4.0, 6.0)], 0.0, 10.0, 3.0),                   # apart
    ([(-5.0, 2.0), (8.0, 20.0)], 0.0, 10.0, 4.0),                 # clipped to the window
    ([(-5.0, -1.0), (11.0, 12.0), (10.0, 11.0)], 0.0, 10.0, 0.0),  # outside the window (or ending at it)
    ([(0.0, 100.0)], 3.0, 7.0, 4.0),                              # covering the window
    ([(5.0, 3.0), (1.0, 2.0)], 0.0, 10.0, 1.0),                   # an inverted interval counts nothing
    ([(4.0, 4.0), (4.0, 6.0)], 0.0, 10.0, 2.0),                   # an empty one neither
])
def test_union_length(intervals, lo, hi, expected):
    assert union_length(intervals, lo, hi) == pytest.approx(expected)
