"""Pre-sharding (document 001, step 2): map each source partition onto several Spark
partitions before any data is read.

With ``source_num`` source partitions and ``core_num`` free cores,
``spark_num = lcm(source_num, core_num)`` and every source partition's offset range
for the batch is split into ``map_num = spark_num / source_num`` consecutive pieces.
Then every batch has a multiple of ``core_num`` Spark partitions, so the cores get
equal shares without a repartition (a shuffle) after reading. A range of ``elem_num``
records gives each piece ``each_num = elem_num // map_num`` records, and the first
``left_num = elem_num % map_num`` pieces one more.

Conventions (the document counts ``elem_num = end_offset - start_offset + 1`` with an
inclusive end): offsets here are half-open, ``[start, end)``, as Spark's and Kafka's
are, so ``elem_num = end - start``. Pieces that would be empty (fewer records than
``map_num``) are left out, so a quiet partition plans no empty Spark tasks. A shard
carries only ``(partition, start, end)``: the records are read when the task runs.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping


@dataclass(frozen=True)
class Shard:
    """One Spark partition: records ``[start, end)`` of source partition ``partition``."""

    partition: int
    start: int
    end: int
    index: int = 0          # which of the source partition's map_num pieces

    @property
    def size(self) -> int:
        return self.end - self.start


def map_num(source_num: int, core_num: int) -> int:
    """Spark partitions per source partition: ``lcm(source_num, core_num) / source_num``."""
    if source_num < 1 or core_num < 1:
        raise ValueError("source_num and core_num must be >= 1")
    return math.lcm(source_num, core_num) // source_num


def split_range(start: int, end: int, pieces: int) -> list[tuple[int, int]]:
    """``[start, end)`` into ``pieces`` consecutive ranges, the first ``left_num`` one longer.

    Returns all ``pieces`` ranges, empty ones included (``preshard`` drops those).
    """
    if pieces < 1:
        raise ValueError("pieces must be >= 1")
    if end < start:
        raise ValueError(f"end {end} is before start {start}")
    elem_num = end - start
    each_num, left_num = divmod(elem_num, pieces)
    out: list[tuple[int, int]] = []
    pos = start
    for i in range(pieces):
        n = each_num + 1 if i < left_num else each_num
        out.append((pos, pos + n))
        pos += n
    return out


def preshard(ranges: Mapping[int, tuple[int, int]], core_num: int) -> list[Shard]:
    """Spark partitions for one batch: ``ranges`` maps source partition -> ``(start, end)``.

    ``source_num`` is the number of partitions the source has (``len(ranges)``), whether
    or not each has data in this batch, so the mapping stays the same from batch to batch.
    """
    if not ranges:
        return []
    m = map_num(len(ranges), core_num)
    shards: list[Shard] = []
    for partition in sorted(ranges):
        start, end = ranges[partition]
        for i, (a, b) in enumerate(split_range(start, end, m)):
            if b > a:
                shards.append(Shard(partition, a, b, i))
    return shards
