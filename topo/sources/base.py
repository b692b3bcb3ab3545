"""What both engines read: a source whose records are addressed by (partition, offset).

An ``OffsetSource`` is a small picklable description (a path, a URL, a rate profile),
not an open connection: the Spark engine ships it to the reader process and to every
task, and each opens what it needs when it reads. Offsets are contiguous integers per
partition, half-open ranges ``[start, end)``; ``latest()`` says where each partition
ends now. Reading ``[start, end)`` twice gives the same records, which is what makes a
replayed batch (Spark) or a replayed tuple (local acking) safe.
"""
from __future__ import annotations

from typing import Any, Iterator, Protocol, Sequence


class OffsetSource(Protocol):
    """A partitioned, offset-addressable record source."""

    #: record fields, in the order ``read`` yields them
    columns: tuple[str, ...]

    def describe(self) -> str:
        """One line naming the source (for errors and the query's name)."""
        ...

    def num_partitions(self) -> int: ...

    def latest(self) -> dict[int, int]:
        """Per partition, the offset one past the last record available now."""
        ...

    def read(self, partition: int, start: int, end: int) -> Iterator[tuple[Any, ...]]:
        """Records ``[start, end)`` of ``partition`` as tuples in ``columns`` order.

        Reads in bounded chunks; may stop early only if the records are not there.
        """
        ...

    def close(self) -> None: ...


def check_range(partition: int, start: int, end: int, partitions: int) -> None:
    if not 0 <= partition < partitions:
        raise ValueError(f"partition {partition} out of range 0..{partitions - 1}")
    if start < 0 or end < start:
        raise ValueError(f"bad offset range [{start}, {end})")


def select_columns(columns: Sequence[str], wanted: Sequence[str] | None) -> list[int]:
    """Positions of ``wanted`` among ``columns`` (all of them when ``wanted`` is None)."""
    if wanted is None:
        return list(range(len(columns)))
    missing = [w for w in wanted if w not in columns]
    if missing:
        raise ValueError(f"unknown record column(s) {missing}; this source has {list(columns)}")
    return [list(columns).index(w) for w in wanted]
