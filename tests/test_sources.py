"""Offset-addressable sources: the message log (file and Redis Streams), the synthetic
profiles, and the spouts that read them on the local engine."""
from __future__ import annotations

import asyncio
import hashlib
import multiprocessing
import pickle
import time
from typing import Any

import pytest

from topo.api import EndOfStream, TaskContext
from topo.sources import (Bursty, Constant, FileLog, MessageLogSpout, RedisLog, SyntheticSource,
                          SyntheticSpout, open_log, partition_for)


# -- producer partitioning --------------------------------------------------------------------

def test_partition_is_md5_mod_num_partitions():
    for key in ("a", "hello", "word-17", "中文"):
        expected = int(hashlib.md5(key.encode()).hexdigest(), 16) % 7
        assert partition_for(key, 7) == expected
    assert partition_for(b"raw", 3) == int(hashlib.md5(b"raw").hexdigest(), 16) % 3


def test_keyless_records_spread():
    import random
    rng = random.Random(1)
    counts = [0] * 4
    for _ in range(4000):
        counts[partition_for(None, 4, rng)] += 1
    assert min(counts) > 800


# -- file-backed log ---------------------------------------------------------------------------

def test_file_log_produce_read_latest(tmp_path):
    log = FileLog(tmp_path, "t", partitions=3)
    placed = [log.produce(f"v{i}", key=f"k{i % 10}") for i in range(100)]
    latest = log.latest()
    assert sum(latest.values()) == 100
    for p in range(3):
        offsets = [o for q, o in placed if q == p]
        assert offsets == list(range(latest[p]))       # contiguous from 0
        rows = list(log.read(p, 0, latest[p]))
        assert [r[1] for r in rows] == offsets
        assert all(r[0] == p for r in rows)
    # same key -> same partition
    by_key = {}
    for i, (p, _) in enumerate(placed):
        by_key.setdefault(f"k{i % 10}", set()).add(p)
    assert all(len(s) == 1 for s in by_key.values())


def test_file_log_range_reads_across_chunks(tmp_path):
    log = FileLog(tmp_path, "t", partitions=1, chunk=7)
    for i in range(50):
        log.produce_to(0, {"i": i, "s": "x" * i}, key=None)
    rows = list(log.read(0, 13, 41))
    assert [r[1] for r in rows] == list(range(13, 41))
    assert [r[3]["i"] for r in rows] == list(range(13, 41))
    assert list(log.read(0, 48, 60))[-1][1] == 49      # past the end: what is there
    assert list(log.read(0, 5, 5)) == []


def test_file_log_reopen_and_pickle(tmp_path):
    FileLog(tmp_path, "t", partitions=2).produce("x", key="a")
    again = open_log(str(tmp_path), "t")
    assert again.num_partitions() == 2 and sum(again.latest().values()) == 1
    clone = pickle.loads(pickle.dumps(again))
    assert clone.latest() == again.latest()
    with pytest.raises(ValueError):
        FileLog(tmp_path, "t", partitions=5)
    with pytest.raises(FileNotFoundError):
        FileLog(tmp_path, "missing")
    assert isinstance(open_log(f"file://{tmp_path}", "t"), FileLog)


def _produce_many(root: str, worker: int, n: int) -> None:
    log = FileLog(root, "t", partitions=2)
    for i in range(n):
        log.produce(f"{worker}-{i}", key=f"{worker}-{i}")


def test_file_log_concurrent_producers(tmp_path):
    FileLog(tmp_path, "t", partitions=2)
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_produce_many, args=(str(tmp_path), w, 300)) for w in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
    log = FileLog(tmp_path, "t")
    latest = log.latest()
    values = sorted(r[3] for p in range(2) for r in log.read(p, 0, latest[p]))
    assert values == sorted(f"{w}-{i}" for w in range(3) for i in range(300))
    for p in range(2):
        assert [r[1] for r in log.read(p, 0, latest[p])] == list(range(latest[p]))


# -- Redis Streams log ---------------------------------------------------------------------------

from redis_server import free_port, redis_url  # noqa: E402,F401  (the fixture; free_port for other tests)


def test_redis_log_contiguous_offsets(redis_url):
    log = RedisLog(redis_url, "words", partitions=3, chunk=5)
    placed = [log.produce(f"v{i}", key=f"k{i}") for i in range(60)]
    latest = log.latest()
    assert sum(latest.values()) == 60
    for p in range(3):
        assert [o for q, o in placed if q == p] == list(range(latest[p]))
        rows = list(log.read(p, 0, latest[p]))
        assert [r[1] for r in rows] == list(range(latest[p]))
        assert all(r[2] is not None and r[0] == p for r in rows)
    p = max(latest, key=latest.get)
    mid = list(log.read(p, 3, latest[p] - 2))
    assert [r[1] for r in mid] == list(range(3, latest[p] - 2))
    assert partition_for("k7", 3) == placed[7][0]


def test_redis_log_pickles_and_reopens(redis_url):
    log = RedisLog(redis_url, "again", partitions=2)
    log.produce("a", key="x")
    clone = pickle.loads(pickle.dumps(log))
    assert clone._client is None and clone.latest() == log.latest()
    assert open_log(redis_url, "again").num_partitions() == 2
    with pytest.raises(LookupError):
        RedisLog(redis_url, "nope")
    with pytest.raises(ValueError):
        RedisLog(redis_url, "again", partitions=3)


def test_message_log_spout_reads_redis(redis_url):
    log = RedisLog(redis_url, "spout", partitions=2)
    for i in range(40):
        log.produce(f"s{i}", key=str(i))
    got = drain(MessageLogSpout(redis_url, "spout", columns=("value",), fields=("sentence",)), 1)
    assert sorted(v[0] for v, _ in got) == sorted(f"s{i}" for i in range(40))


# -- synthetic ------------------------------------------------------------------------------------

def test_bursty_profile_figure9():
    b = Bursty()
    assert b.count_at(0) == 0
    assert b.count_at(2.5) == 300_000
    assert b.count_at(5.0) == 600_000
    assert b.count_at(9.99) == 600_000
    assert b.count_at(10.0) == 600_000
    assert b.count_at(12.5) == 900_000
    assert b.rate_at(1.0) == 120_000 and b.rate_at(7.0) == 0
    for i in (0, 1, 299_999, 599_999, 600_000, 1_234_567):
        t = b.time_of(i)
        assert b.count_at(t) <= i < b.count_at(t + 1e-4)


def test_constant_profile():
    c = Constant(1000)
    assert c.count_at(1.5) == 1500
    assert c.time_of(1500) == pytest.approx(1.5)


def test_synthetic_deterministic_by_offset():
    a = SyntheticSource(Constant(100), partitions=3, seed=4).started_at(1000.0)
    b = SyntheticSource(Constant(100), partitions=3, seed=4).started_at(2000.0)
    ra = list(a.read(1, 5, 9))
    rb = list(b.read(1, 5, 9))
    assert [r[:2] for r in ra] == [r[:2] for r in rb]
    assert [r[0] for r in ra] == [5 * 3 + 1, 6 * 3 + 1, 7 * 3 + 1, 8 * 3 + 1]
    assert all(16 <= len(r[1]) <= 256 for r in ra)
    assert ra[0][2] == pytest.approx(1000.0 + 16 / 100)
    c = SyntheticSource(Constant(100), partitions=3, seed=5).started_at(0.0)
    assert [len(r[1]) for r in c.read(0, 0, 50)] != [len(r[1]) for r in a.read(0, 0, 50)]


def test_synthetic_latest_and_total():
    s = SyntheticSource(Constant(100), partitions=4, total=10).started_at(0.0)
    assert s.latest(now=0.05) == {0: 2, 1: 1, 2: 1, 3: 1}        # records 0..4
    assert s.latest(now=100) == {0: 3, 1: 3, 2: 2, 3: 2}
    assert s.bound() == {0: 3, 1: 3, 2: 2, 3: 2}
    ids = sorted(r[0] for p in range(4) for r in s.read(p, 0, 5))
    assert ids == list(range(10))
    with pytest.raises(RuntimeError):
        SyntheticSource(Constant(1)).latest()


# -- spouts on the local engine --------------------------------------------------------------------

class ListCollector:
    def __init__(self) -> None:
        self.out: list[tuple[list[Any], Any]] = []

    def emit(self, values, stream="default", msg_id=None) -> None:
        self.out.append((list(values), msg_id))


def drain(spout, parallelism: int, timeout: float = 10.0) -> list[tuple[list[Any], Any]]:
    import copy
    got: list[tuple[list[Any], Any]] = []

    async def one(task_index: int) -> None:
        s = copy.deepcopy(spout)
        c = ListCollector()
        s.open(TaskContext("t", "spout", task_index, task_index, parallelism, {}), c)
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                await s.next_tuple()
            raise AssertionError("spout did not end")
        except EndOfStream:
            pass
        finally:
            s.close()
        got.extend(c.out)

    async def main() -> None:
        await asyncio.gather(*(one(i) for i in range(parallelism)))

    asyncio.run(main())
    return got


def test_message_log_spout_tasks_split_partitions(tmp_path):
    log = FileLog(tmp_path, "t", partitions=3)
    for i in range(200):
        log.produce(f"line {i}", key=str(i))
    spout = MessageLogSpout(str(tmp_path), "t", batch=16)
    assert spout.outputs == ["key", "value"]
    got = drain(spout, 2)
    assert sorted(v[1] for v, _ in got) == sorted(f"line {i}" for i in range(200))
    assert len({m for _, m in got}) == 200          # msg_id = (partition, offset), unique


def test_message_log_spout_follow_sees_new_records(tmp_path):
    log = FileLog(tmp_path, "t", partitions=1)
    log.produce("a")
    spout = MessageLogSpout(str(tmp_path), "t", follow=True, columns=("offset", "value"))
    c = ListCollector()
    spout.open(TaskContext("t", "s", 0, 0, 1, {}), c)

    async def pump(n: int) -> None:
        for _ in range(n):
            await spout.next_tuple()

    asyncio.run(pump(3))
    log.produce("b")
    asyncio.run(pump(3))
    assert [v for v, _ in c.out] == [[0, "a"], [1, "b"]]


def test_synthetic_spout_finite(tmp_path):
    spout = SyntheticSpout("constant", rate=50_000, partitions=3, total=500, fields=("n", "text"))
    got = drain(spout, 2)
    assert sorted(v[0] for v, _ in got) == list(range(500))
    assert spout.outputs == ["n", "text"]


def test_spout_rejects_unknown_columns(tmp_path):
    with pytest.raises(ValueError):
        MessageLogSpout(str(tmp_path), "t", columns=("nope",))
    with pytest.raises(ValueError):
        SyntheticSpout(columns=("id",), fields=("a", "b"))
