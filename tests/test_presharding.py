"""Document 001's pre-sharding arithmetic: map_num, even and uneven splits."""
from __future__ import annotations

import random

import pytest

from runtime.spark.presharding import Shard, map_num, preshard, split_range


@pytest.mark.parametrize("source_num,core_num,expected", [
    (4, 2, 1), (2, 4, 2), (4, 6, 3), (3, 2, 2), (1, 8, 8), (6, 4, 2), (5, 5, 1), (7, 3, 3)])
def test_map_num_is_lcm_over_source_num(source_num, core_num, expected):
    assert map_num(source_num, core_num) == expected
    # every batch then has a multiple of core_num Spark partitions
    assert (source_num * map_num(source_num, core_num)) % core_num == 0


def test_map_num_rejects_zero():
    with pytest.raises(ValueError):
        map_num(0, 2)
    with pytest.raises(ValueError):
        map_num(2, 0)


def test_even_split():
    assert split_range(100, 112, 3) == [(100, 104), (104, 108), (108, 112)]


def test_uneven_split_first_left_num_one_larger():
    # elem_num 11, map_num 3: each_num 3, left_num 2 -> 4, 4, 3
    assert split_range(0, 11, 3) == [(0, 4), (4, 8), (8, 11)]
    # elem_num 10, map_num 4: each 2, left 2 -> 3, 3, 2, 2
    assert [b - a for a, b in split_range(5, 15, 4)] == [3, 3, 2, 2]


def test_split_fewer_records_than_pieces():
    assert split_range(0, 2, 3) == [(0, 1), (1, 2), (2, 2)]
    assert split_range(7, 7, 2) == [(7, 7), (7, 7)]


def test_split_rejects_bad_input():
    with pytest.raises(ValueError):
        split_range(5, 4, 2)
    with pytest.raises(ValueError):
        split_range(0, 4, 0)


def test_preshard_maps_each_source_partition_to_map_num_shards():
    shards = preshard({0: (0, 10), 1: (100, 111)}, core_num=4)   # map_num 2
    assert shards == [Shard(0, 0, 5, 0), Shard(0, 5, 10, 1), Shard(1, 100, 106, 0), Shard(1, 106, 111, 1)]
    assert len(shards) % 4 == 0


def test_preshard_drops_empty_pieces():
    shards = preshard({0: (0, 1), 1: (3, 3)}, core_num=2)         # map_num 2
    assert shards == [Shard(0, 0, 1, 0)]


def test_preshard_random_ranges_cover_exactly():
    rng = random.Random(7)
    for _ in range(200):
        source_num = rng.randint(1, 6)
        core_num = rng.randint(1, 8)
        ranges = {}
        for p in range(source_num):
            a = rng.randint(0, 1000)
            ranges[p] = (a, a + rng.randint(0, 50))
        shards = preshard(ranges, core_num)
        m = map_num(source_num, core_num)
        for p, (a, b) in ranges.items():
            mine = [s for s in shards if s.partition == p]
            assert len(mine) == min(m, b - a)
            pos = a
            for s in mine:
                assert s.start == pos and s.size > 0
                pos = s.end
            assert pos == b
            sizes = [s.size for s in mine]
            if sizes:
                assert max(sizes) - min(sizes) <= 1
                assert sizes == sorted(sizes, reverse=True)
