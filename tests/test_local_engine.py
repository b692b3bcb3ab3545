"""The local engine: routing, byte accounting, the hard bound, acking, replay, dead letters."""
from __future__ import annotations

import asyncio
import json
from collections import Counter, defaultdict

import msgpack
import pytest

from topo.api import Bolt, EndOfStream, FieldIndex, Spout, Tuple
from topo.groupings import fields_task_index
from topo.topology import TopologyBuilder
from runtime.local.engine import LocalEngine, run
from topo.api import TupleEncodingError
from runtime.local.queue import ByteQueue

NO_BP = {"backpressure.policy": "none"}


class Numbers(Spout):
    """Emits 0..total-1 (tracked by the number itself), then ends."""

    outputs = ["n", "key"]

    def __init__(self, total: int, keys: int = 50, per_call: int = 64) -> None:
        self.total, self.keys, self.per_call = total, keys, per_call
        self.i = 0
        self.acked: list[int] = []
        self.failed: list[int] = []

    def next_tuple(self) -> None:
        if self.i >= self.total:
            raise EndOfStream
        for _ in range(self.per_call):
            if self.i >= self.total:
                return
            self.collector.emit([self.i, f"k{self.i % self.keys}"], msg_id=self.i)
            self.i += 1

    def ack(self, msg_id):
        self.acked.append(msg_id)

    def fail(self, msg_id):
        self.failed.append(msg_id)


class Recorder(Bolt):
    """Records what each task saw; instances are per task, results go to a shared dict."""

    def __init__(self, seen: dict) -> None:
        self.seen = seen

    def execute(self, tup: Tuple) -> None:
        self.seen.setdefault(self.context.task_id, []).append(tuple(tup.values))

    def __deepcopy__(self, memo):  # share the result dict between task copies
        return Recorder(self.seen)


def test_fields_grouping_sends_each_key_to_one_task():
    seen: dict = {}
    b = TopologyBuilder("fields")
    b.spout("nums", Numbers(5000, keys=37))
    b.bolt("rec", Recorder(seen), 4).fields("nums", "key")
    res = run(b.build(), NO_BP)
    assert res.reason == "exhausted"
    owner: dict[str, set[int]] = defaultdict(set)
    for task, values in seen.items():
        for _, key in values:
            owner[key].add(task)
    assert len(owner) == 37
    assert all(len(tasks) == 1 for tasks in owner.values())
    assert sum(len(v) for v in seen.values()) == 5000
    # The routing is the stable CRC32 rule, identical in every process.
    bolt_tasks = sorted(seen)
    for task, values in seen.items():
        for _, key in values:
            assert bolt_tasks[fields_task_index([key], 4)] == task


def test_all_and_global_groupings():
    everyone: dict = {}
    lowest: dict = {}
    b = TopologyBuilder("allglobal")
    b.spout("nums", Numbers(300))
    b.bolt("all", Recorder(everyone), 3).all("nums")
    b.bolt("glob", Recorder(lowest), 3).global_("nums")
    run(b.build(), NO_BP)
    assert len(everyone) == 3 and all(len(v) == 300 for v in everyone.values())
    assert len(lowest) == 1 and len(next(iter(lowest.values()))) == 300
    assert next(iter(lowest)) == min(LocalEngine(b.build(), NO_BP).task_ids["glob"])


async def test_queue_byte_accounting_equals_msgpack_length():
    q = ByteQueue(hard_bound=10_000)
    tuples = [[i, "x" * (i % 13), {"a": [i, 2.5]}] for i in range(100)]
    sizes = [len(msgpack.packb(t)) for t in tuples]
    await q.put(tuples[:60], sum(sizes[:60]))
    await q.put(tuples[60:], sum(sizes[60:]))
    assert q.bytes == sum(sizes) and q.count == 100
    q.get_nowait()
    assert q.bytes == sum(sizes[60:]) and q.count == 40


def test_engine_sizes_each_tuple_by_its_msgpack_encoding():
    class Holder(Bolt):
        def execute(self, tup):
            pass

    b = TopologyBuilder("sizes")
    b.spout("nums", Numbers(10))
    b.bolt("hold", Holder()).shuffle("nums")
    engine = LocalEngine(b.build(), NO_BP)
    spout_task = engine.tasks[0]
    values = [[7, "k7"], [123456, "k6"], [2**40, "k0"]]
    for v in values:
        spout_task.outbox.untracked["default"](v, 0.0)
    lane = spout_task.outbox.lanes[engine.task_ids["hold"][0]]
    assert [t.values for t in lane.batch] == values
    assert spout_task.outbox.batch_bytes(lane.batch) == sum(len(msgpack.packb(v)) for v in values)


@pytest.mark.parametrize("n", [1, 15, 16, 300, 70_000])
def test_batch_size_equals_sum_of_tuple_encodings_across_array_header_sizes(n):
    b = TopologyBuilder("sizes2", NO_BP)
    b.spout("nums", Numbers(10))
    b.bolt("rec", Recorder({})).shuffle("nums")
    outbox = LocalEngine(b.build()).tasks[0].outbox
    tuples = [Tuple([i * 7919, "k" * (i % 40)], FieldIndex.of(["n", "key"])) for i in range(n)]
    assert outbox.batch_bytes(tuples) == sum(len(msgpack.packb(t.values)) for t in tuples)


async def test_put_waits_at_the_hard_bound_and_resumes():
    q = ByteQueue(hard_bound=100)
    await q.put(["a"], 80)
    blocked = asyncio.ensure_future(q.put(["b"], 30))
    await asyncio.sleep(0.01)
    assert not blocked.done() and q.bytes == 80
    q.get_nowait()
    waited = await asyncio.wait_for(blocked, 1)
    assert waited > 0 and q.bytes == 30


class SlowCounter(Bolt):
    """Slower than the spout: yields to the loop every few tuples."""

    def __init__(self, box: dict) -> None:
        self.box = box

    async def execute(self, tup: Tuple) -> None:
        self.box["n"] = self.box.get("n", 0) + 1
        self.box["sum"] = self.box.get("sum", 0) + tup[0]
        if tup[0] % 64 == 0:
            await asyncio.sleep(0)

    def __deepcopy__(self, memo):
        return SlowCounter(self.box)


def test_hard_bound_blocks_and_nothing_is_lost_with_a_million_tuples():
    n = 1_000_000
    box: dict = {}
    b = TopologyBuilder("bound", {"queue.high_mark": "40KB", "queue.low_mark": "4KB",
                                  "queue.hard_bound": "64KB", "backpressure.policy": "none",
                                  "batch.size": 128})
    b.spout("nums", Numbers(n, per_call=256))
    b.bolt("slow", SlowCounter(box)).shuffle("nums")
    engine = LocalEngine(b.build())
    asyncio.run(engine.run())
    assert box["n"] == n and box["sum"] == n * (n - 1) // 2
    queue = engine.queues[engine.task_ids["slow"][0]]
    one_batch = 128 * 16
    assert queue.peak_bytes <= 64_000 + one_batch
    assert queue.peak_bytes > 64_000 - one_batch  # it really reached the bound
    assert engine.tasks[0].stats.backpressured_ns > 0  # the spout did wait


class FailFirstTime(Bolt):
    """Fails every tuple whose number is a multiple of 10 the first time it sees it."""

    def __init__(self, seen: Counter) -> None:
        self.seen = seen

    def execute(self, tup: Tuple) -> None:
        n = tup[0]
        self.seen[n] += 1
        if n % 10 == 0 and self.seen[n] == 1:
            raise RuntimeError(f"injected failure on {n}")

    def __deepcopy__(self, memo):
        return FailFirstTime(self.seen)


def test_failed_tuples_are_replayed_and_then_acked():
    seen: Counter = Counter()
    spout = Numbers(1000)
    b = TopologyBuilder("replay", {"acking": True, "backpressure.policy": "none"})
    b.spout("nums", lambda: spout)
    b.bolt("flaky", FailFirstTime(seen), 2).shuffle("nums")
    res = run(b.build())
    assert sorted(spout.acked) == list(range(1000))
    assert sorted(spout.failed) == list(range(0, 1000, 10))
    assert all(seen[n] == (2 if n % 10 == 0 else 1) for n in range(1000))
    totals = res.component_totals()
    assert totals["nums"]["replayed"] == 100 and totals["nums"]["dead_lettered"] == 0


class AlwaysFails(Bolt):
    def execute(self, tup: Tuple) -> None:
        if tup[0] == 3:
            raise ValueError("bad record")


def test_dead_letter_after_max_retries(tmp_path):
    path = tmp_path / "dead.jsonl"
    spout = Numbers(20)
    b = TopologyBuilder("dead", {"acking": True, "max_retries": 2, "dead_letter_path": str(path),
                                 "backpressure.policy": "none"})
    b.spout("nums", lambda: spout)
    b.bolt("bad", AlwaysFails()).shuffle("nums")
    res = run(b.build())
    assert sorted(spout.acked) == [n for n in range(20) if n != 3]
    assert spout.failed == [3, 3, 3]  # first try + 2 retries
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(records) == 1
    r = records[0]
    assert (r["msg_id"], r["values"], r["retries"], r["component"]) == (3, [3, "k3"], 2, "nums")
    assert "ValueError: bad record" in r["error"]
    assert res.component_totals()["nums"]["dead_lettered"] == 1


def test_timed_out_tuples_are_replayed():
    class DropsFirst(Bolt):
        auto_ack = False

        def __init__(self):
            self.dropped = False

        def execute(self, tup):
            if tup[0] == 5 and not self.dropped:
                self.dropped = True  # neither ack nor fail: only the timeout can save it
                return
            self.collector.ack(tup)

    spout = Numbers(10)
    b = TopologyBuilder("timeout", {"acking": True, "message_timeout_s": 0.3, "backpressure.policy": "none"})
    b.spout("nums", lambda: spout)
    b.bolt("drop", DropsFirst()).shuffle("nums")
    res = run(b.build())
    assert sorted(spout.acked) == list(range(10))
    assert spout.failed == [5]
    assert res.component_totals()["nums"]["replayed"] == 1


def test_bolt_exception_without_acking_is_logged_and_the_topology_keeps_running(caplog):
    seen: Counter = Counter()
    b = TopologyBuilder("noack", NO_BP)
    b.spout("nums", Numbers(100))
    b.bolt("flaky", FailFirstTime(seen)).shuffle("nums")
    res = run(b.build())
    assert sum(seen.values()) == 100  # every tuple reached the bolt once, none replayed
    assert res.component_totals()["flaky"]["failed"] == 10
    assert "flaky" in caplog.text and "injected failure" in caplog.text


def test_unencodable_value_names_component_and_field():
    class BadSpout(Spout):
        outputs = ["id", "payload"]

        def next_tuple(self):
            self.collector.emit([1, object()])

    b = TopologyBuilder("badvalue", NO_BP)
    b.spout("bad", BadSpout())
    b.bolt("rec", Recorder({})).shuffle("bad")
    with pytest.raises(TupleEncodingError, match=r"'bad'.*field 'payload'.*object"):
        run(b.build())


def test_max_tuples_stops_and_drains():
    box: dict = {}
    b = TopologyBuilder("bounded", NO_BP)
    b.spout("nums", Numbers(10**9))
    b.bolt("count", SlowCounter(box)).shuffle("nums")
    res = run(b.build(), max_tuples=20_000)
    emitted = res.component_totals()["nums"]["emitted"]
    assert res.reason == "max_tuples"
    assert 20_000 <= emitted < 20_000 + 64
    assert box["n"] == emitted  # everything emitted was processed before the run ended


def test_async_bolt_and_named_streams():
    class Router(Bolt):
        outputs = {"even": ["n"], "odd": ["n"]}

        async def execute(self, tup):
            await asyncio.sleep(0)
            self.collector.emit([tup[0]], stream="even" if tup[0] % 2 == 0 else "odd")

    evens: dict = {}
    odds: dict = {}
    b = TopologyBuilder("streams", NO_BP)
    b.spout("nums", Numbers(100))
    b.bolt("route", Router()).shuffle("nums")
    b.bolt("evens", Recorder(evens)).shuffle("route", stream="even")
    b.bolt("odds", Recorder(odds)).shuffle("route", stream="odd")
    run(b.build())
    assert sorted(v[0] for vs in evens.values() for v in vs) == list(range(0, 100, 2))
    assert sorted(v[0] for vs in odds.values() for v in vs) == list(range(1, 100, 2))


def test_anchored_tree_acks_only_when_every_branch_is_done():
    class Fanout(Bolt):
        outputs = ["n"]

        def execute(self, tup):
            for i in range(3):
                self.collector.emit([tup[0] * 10 + i])

    class FailOne(Bolt):
        def __init__(self):
            self.failed_once = False

        def execute(self, tup):
            if tup[0] == 42 and not self.failed_once:  # one grandchild of root 4
                self.failed_once = True
                raise RuntimeError("grandchild failed")

    spout = Numbers(10)
    b = TopologyBuilder("tree", {"acking": True, "backpressure.policy": "none"})
    b.spout("nums", lambda: spout)
    b.bolt("fan", Fanout()).shuffle("nums")
    b.bolt("leaf", FailOne()).shuffle("fan")
    run(b.build())
    assert spout.failed == [4]
    assert sorted(spout.acked) == list(range(10))


class Trickle(Spout):
    """Emits one tuple every other call (the other call finds its source empty), then ends."""

    outputs = ["n"]

    def __init__(self, total: int) -> None:
        self.total, self.calls, self.i = total, 0, 0

    def next_tuple(self) -> None:
        if self.i >= self.total:
            raise EndOfStream
        self.calls += 1
        if self.calls % 2:
            self.collector.emit([self.i])
            self.i += 1


async def test_a_spout_counts_the_rounds_its_source_had_nothing_and_an_endless_one_counts_none():
    # what stepwise's dry_release_window reads: a limit is not in use while the source runs dry
    for spout, dry in ((Trickle(50), True), (Numbers(5_000), False)):
        box: dict = {}
        b = TopologyBuilder("dry", NO_BP)
        b.spout("src", spout)
        b.bolt("rec", Recorder(box)).shuffle("src")
        engine = LocalEngine(b.build(), NO_BP)
        await engine.run()
        task = next(t for t in engine.tasks if t.component == "src")
        assert (task.dry_count() > 0) is dry, type(spout).__name__
        assert sum(len(v) for v in box.values()) == (50 if dry else 5_000)
