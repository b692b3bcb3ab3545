"""``runtime.local.stretches``: where runs of alike neighbours start and end."""
from __future__ import annotations

from operator import ne

from runtime.local.stretches import stretch_bounds, stretch_lengths


def test_stretches_start_where_a_neighbour_differs_and_end_at_the_end() -> None:
    a, b = [1], [1]                                   # equal lists, two objects
    assert stretch_bounds([a, a, b, b, b, a]) == [0, 2, 5, 6]       # by identity
    assert stretch_bounds([1, 1, 2, 1], ne) == [0, 2, 3, 4]
    assert stretch_bounds([a]) == [0, 1] and stretch_bounds([]) == [0]
    assert stretch_lengths([0, 2, 5, 6]) == [2, 3, 1] and stretch_lengths([0]) == []
