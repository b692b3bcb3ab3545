"""topo.testing: users test spouts and bolts without a topology, with engine semantics."""
from __future__ import annotations

import asyncio

import pytest

from topo.api import Bolt, EmitError, EndOfStream, Spout, Tuple
from topo.examples.wordcount import CountBolt, SentenceSpout, SplitBolt
from topo.testing import BoltHarness, Emitted, HarnessError, SpoutHarness


class Upper(Bolt):
    outputs = {"default": ["word"], "rejects": ["word", "why"]}

    def execute(self, tup: Tuple) -> None:
        word = tup["word"]
        if not word:
            raise ValueError("empty word")
        if not word.isalpha():
            self.collector.emit([word, "not alpha"], stream="rejects")
            return
        self.collector.emit([word.upper()])


class AsyncLookup(Bolt):
    outputs = ["key", "value"]

    async def execute(self, tup: Tuple) -> None:
        await asyncio.sleep(0)
        self.collector.emit([tup["key"], len(tup["key"])])


class ManualAck(Bolt):
    """Acks even keys, fails odd ones, leaves negatives pending (auto_ack off)."""

    auto_ack = False
    outputs = ["n"]

    def execute(self, tup: Tuple) -> None:
        n = tup[0]
        if n < 0:
            return
        self.collector.emit([n], anchors=tup)
        (self.collector.ack if n % 2 == 0 else self.collector.fail)(tup)


class DoubleAck(Bolt):
    def execute(self, tup: Tuple) -> None:
        self.collector.ack(tup)  # wrong with auto_ack on: the task acks again


class BadEmits(Bolt):
    outputs = ["a", "b"]

    def execute(self, tup: Tuple) -> None:
        kind = tup[0]
        if kind == "arity":
            self.collector.emit([1])
        elif kind == "stream":
            self.collector.emit([1, 2], stream="nope")
        elif kind == "encode":
            self.collector.emit([1, object()])


class Numbers(Spout):
    outputs = ["n"]

    def __init__(self, upto: int, every: int = 1) -> None:
        self.upto, self.every, self.i, self.acked, self.failed = upto, every, 0, [], []

    def next_tuple(self) -> None:
        self.i += 1
        if self.i > self.upto:
            raise EndOfStream
        if self.i % self.every == 0:
            self.collector.emit([self.i], msg_id=f"m{self.i}")

    def ack(self, msg_id) -> None:
        self.acked.append(msg_id)

    def fail(self, msg_id) -> None:
        self.failed.append(msg_id)


class AsyncNumbers(Numbers):
    async def next_tuple(self) -> None:
        await asyncio.sleep(0)
        super().next_tuple()


# --- bolts -------------------------------------------------------------------------------

def test_feed_returns_emits_anchored_and_auto_acks() -> None:
    h = BoltHarness(SplitBolt(), input_fields=["sentence"])
    emits = h.feed(["The cow jumped"])
    assert [e.values for e in emits] == [["the"], ["cow"], ["jumped"]]
    assert all(e.stream == "default" and e.anchors == (h.fed[0],) for e in emits)
    assert h.acked == h.fed and h.failed == [] and h.pending == []


def test_state_carries_over_between_feeds() -> None:
    h = BoltHarness(CountBolt(), input_fields=["word"])
    h.feed(["a"])
    h.feed(["b"])
    assert h.feed(["a"]) == [Emitted(["a", 2], "default", (h.fed[2],))]
    assert len(h.emitted) == 3


def test_exception_fails_the_tuple_and_is_kept() -> None:
    h = BoltHarness(Upper(), input_fields=["word"])
    assert h.feed([""]) == []
    assert h.failed == h.fed and h.acked == []
    assert isinstance(h.errors[0], ValueError)
    with pytest.raises(ValueError, match="empty word"):
        h.feed([""], raise_errors=True)
    assert len(h.failed) == 2


def test_named_stream_and_source() -> None:
    h = BoltHarness(Upper(), input_fields={"words": ["word"]})
    [rejected] = h.feed(["a1"], stream="words", source="split")
    assert (rejected.stream, rejected.values) == ("rejects", ["a1", "not alpha"])
    assert h.fed[0].source_component == "split" and h.fed[0].stream == "words"
    with pytest.raises(HarnessError, match="no input fields for stream 'default'"):
        h.feed(["x"])


def test_fed_values_must_match_input_fields() -> None:
    h = BoltHarness(Upper(), input_fields=["word"])
    with pytest.raises(HarnessError, match="fed 2 values on stream 'default', whose fields are \\['word'\\]"):
        h.feed(["a", "b"])


def test_async_execute_from_sync_test() -> None:
    h = BoltHarness(AsyncLookup(), input_fields=["key"])
    assert [e.values for e in h.feed(["abc"])] == [["abc", 3]]
    assert len(h.acked) == 1


async def test_async_execute_from_async_test() -> None:
    h = BoltHarness(AsyncLookup(), input_fields=["key"])
    assert [e.values for e in await h.afeed(["ab"])] == [["ab", 2]]
    with pytest.raises(HarnessError, match="afeed"):
        h.feed(["x"])
    # a plain bolt works with both inside a loop
    s = BoltHarness(SplitBolt(), input_fields=["sentence"])
    assert len(s.feed(["a b"])) == 2 and len(await s.afeed(["c"])) == 1


def test_manual_ack_fail_and_pending() -> None:
    h = BoltHarness(ManualAck(), input_fields=["n"])
    for n in (2, 3, -1):
        h.feed([n])
    assert [t[0] for t in h.acked] == [2]
    assert [t[0] for t in h.failed] == [3]
    assert [t[0] for t in h.pending] == [-1]
    assert [e.anchors for e in h.emitted] == [(h.fed[0],), (h.fed[1],)]


def test_double_ack_is_reported() -> None:
    h = BoltHarness(DoubleAck(), input_fields=["x"])
    with pytest.raises(HarnessError, match="already acked .auto_ack is on"):
        h.feed([1])


@pytest.mark.parametrize("kind, message", [
    ("arity", "emitted 1 values on stream 'default', which declares 2 fields \\['a', 'b'\\]"),
    ("stream", "emitted on stream 'nope', which it does not declare"),
    ("encode", "a value for field 'b' that msgpack cannot encode: object"),
])
def test_bad_emits_raise_like_the_engine(kind: str, message: str) -> None:
    h = BoltHarness(BadEmits(), input_fields=["kind"])
    with pytest.raises(EmitError, match=message):
        h.feed([kind])


def test_context_and_config_reach_prepare() -> None:
    h = BoltHarness(SplitBolt(), input_fields=["sentence"], config={"acking": True},
                    component="split", task_index=1, parallelism=3)
    ctx = h.bolt.context
    assert (ctx.component, ctx.task_index, ctx.parallelism) == ("split", 1, 3)
    assert ctx.config["acking"] is True and ctx.config["queue.hard_bound"] == 100_000_000


def test_tick_and_close() -> None:
    class Buffered(Bolt):
        outputs = ["n"]
        closed = False

        def prepare(self, context, collector) -> None:
            super().prepare(context, collector)
            self.buf: list[int] = []

        def execute(self, tup: Tuple) -> None:
            self.buf.append(tup[0])

        def tick(self) -> None:
            self.collector.emit([sum(self.buf)])
            self.buf.clear()

        def cleanup(self) -> None:
            self.closed = True

    with BoltHarness(Buffered(), input_fields=["n"]) as h:
        h.feed([1])
        h.feed([2])
        assert [e.values for e in h.tick()] == [[3]]
        assert h.tick()[0].anchors == ()
    assert h.bolt.closed


def test_wrong_component_kind() -> None:
    with pytest.raises(TypeError, match="needs a topo.Bolt"):
        BoltHarness(SentenceSpout(), input_fields=["x"])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="needs a topo.Spout"):
        SpoutHarness(SplitBolt())  # type: ignore[arg-type]


# --- spouts ------------------------------------------------------------------------------

def test_pull_collects_msg_ids_and_forwards_acks() -> None:
    spout = Numbers(upto=5)
    h = SpoutHarness(spout)
    got = h.pull(3)
    assert [(e.values, e.msg_id) for e in got] == [([1], "m1"), ([2], "m2"), ([3], "m3")]
    h.ack("m1")
    assert h.fail("m2") == [2]
    assert (spout.acked, spout.failed) == (["m1"], ["m2"])
    assert list(h.pending) == ["m3"]
    with pytest.raises(HarnessError, match="cannot ack msg_id 'm1': not pending"):
        h.ack("m1")
    assert len(h.pull(10)) == 2 and h.ended
    h.ack_all()
    assert spout.acked == ["m1", "m3", "m4", "m5"] and h.pending == {}


def test_pull_counts_tuples_not_calls() -> None:
    h = SpoutHarness(Numbers(upto=100, every=3))
    assert [e.values for e in h.pull(2)] == [[3], [6]]
    assert h.calls == 6
    assert h.pull(5, max_calls=6) == [Emitted([9], msg_id="m9"), Emitted([12], msg_id="m12")]


def test_open_gets_context_with_parallelism() -> None:
    h = SpoutHarness(SentenceSpout(sentences=["a", "b", "c", "d"], repeat=1), task_index=1, parallelism=2)
    assert [e.values for e in h.pull(5)] == [["b"], ["d"]]
    assert [e.msg_id for e in h.emitted] == [1, 3] and h.ended


def test_async_spout() -> None:
    h = SpoutHarness(AsyncNumbers(upto=2))
    assert [e.msg_id for e in h.pull(5)] == ["m1", "m2"] and h.ended


async def test_async_spout_in_loop() -> None:
    h = SpoutHarness(AsyncNumbers(upto=3))
    assert [e.values for e in await h.apull(2)] == [[1], [2]]
