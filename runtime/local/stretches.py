"""Stretches of a sequence: where runs of alike neighbours start and end, found by C-level
maps (no Python step per item). The acker counts a batch down by its stretches of one ack
cell; the outbox and the transport cut batches and parents where the cell or the parent
changes."""
from __future__ import annotations

from itertools import compress, count
from operator import is_not, sub
from typing import Any, Callable, Sequence


def stretch_bounds(items: Sequence[Any], differ: Callable[[Any, Any], Any] = is_not) -> list[int]:
    """``[0, s1, ..., len(items)]``: the index where each stretch starts (a neighbour for which
    ``differ(item, previous)`` is true starts a new one), then the end; ``[0]`` when empty.
    Stretch ``i`` is ``items[bounds[i]:bounds[i + 1]]``."""
    if not items:
        return [0]
    return [0, *compress(count(1), map(differ, items[1:], items)), len(items)]


def stretch_lengths(bounds: Sequence[int]) -> list[int]:
    """The length of each stretch of ``stretch_bounds``."""
    return list(map(sub, bounds[1:], bounds))
