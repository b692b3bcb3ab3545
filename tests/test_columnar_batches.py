"""A whole ``emit_many`` into one lane crosses its queue as columns (``topo.api.TupleBatch``):
emission order, the byte bound's exact wire size, acking and fields routing are those of a
batch of tuple objects, and a batch bolt can read it by column without making any."""
from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any, Sequence

import msgpack
import pytest

from topo.api import Bolt, Columns, EmitError, FieldIndex, Origin, Tuple, TupleBatch, column
from topo.examples.wordcount import BatchFinalCountBolt, BatchSplitBolt, SentenceSpout, expected_counts
from topo.groupings import Router
from topo.topology import TopologyBuilder
from runtime.local.acker import Acker, new_group
from runtime.local.engine import run
from runtime.local.outbox import Outbox, StreamRoutes
from runtime.local.queue import ByteQueue

FIELDS = FieldIndex.of(["word"])
TARGET = 7


def _outbox(*, scalable: bool = False) -> tuple[Outbox, ByteQueue]:
    router = Router([TARGET], lambda values: 0,
                    retarget=(lambda new, owners=None: None) if scalable else None)
    queue = ByteQueue(1 << 20)
    return Outbox("split", 3, {"default": StreamRoutes(FIELDS, [router])}, {TARGET: queue}, 10_000, 0.001), queue


def _sent(outbox: Outbox, queue: ByteQueue) -> tuple[Any, int]:
    asyncio.run(outbox.flush())
    item = queue.get_nowait()
    assert item is not None and queue.get_nowait() is None
    return item


def _wire_size(values_list: Sequence[Sequence[Any]]) -> int:
    return sum(len(msgpack.packb(list(v))) for v in values_list)


def test_a_lane_of_emit_many_only_travels_as_one_tuple_batch_of_the_exact_wire_size() -> None:
    outbox, queue = _outbox()
    first = [[f"w{i}" * (i % 40)] for i in range(300)]      # sizes across msgpack's str headers
    second = [["x"], ["y" * 300]]
    outbox.untracked_many["default"](first, 0.0)
    outbox.untracked_many["default"](second, 0.0)
    batch, nbytes = _sent(outbox, queue)
    assert type(batch) is TupleBatch and len(batch) == 302
    assert len(batch.runs) == 1                              # two emits sharing everything: one run
    assert nbytes == _wire_size(first + second) == outbox.batch_bytes(list(batch))
    assert batch.column("word") == [v[0] for v in first + second]
    assert batch.values() == first + second


def test_single_emits_and_emit_many_into_one_lane_keep_their_order() -> None:
    outbox, queue = _outbox()
    emit, many = outbox.untracked["default"], outbox.untracked_many["default"]
    emit(["a"], 0.0)
    many([["b"], ["c"]], 0.0)
    emit(["d"], 0.0)
    emit(["e"], 0.0)
    many([["f"]], 0.0)
    many([["g"], ["h"]], 0.0)
    emit(["i"], 0.0)
    batch, nbytes = _sent(outbox, queue)
    assert type(batch) is list
    assert [t.values[0] for t in batch] == list("abcdefghi")
    assert nbytes == _wire_size([[c] for c in "abcdefghi"])
    assert outbox.pending_count == 0 and not outbox.lanes[TARGET].runs


def test_the_lane_keeps_a_copy_of_the_list_emitted() -> None:
    outbox, queue = _outbox()
    buffer = [["a"], ["b"]]
    outbox.untracked_many["default"](buffer, 0.0)
    buffer.clear()                                           # a caller reusing its buffer
    buffer.append(["z"])
    batch, _ = _sent(outbox, queue)
    assert batch.column("word") == ["a", "b"]


def test_a_lane_a_router_can_retarget_gets_tuple_objects() -> None:
    """Autoscaling reads and reroutes lanes' single tuples: its lanes never hold runs."""
    outbox, queue = _outbox(scalable=True)
    outbox.untracked_many["default"]([["a"], ["b"]], 0.0)
    assert outbox.lanes[TARGET].runs == [] and len(outbox.lanes[TARGET].batch) == 2
    batch, _ = _sent(outbox, queue)
    assert type(batch) is list and [t.values[0] for t in batch] == ["a", "b"]


def test_a_tuple_batch_read_as_tuples_makes_each_once() -> None:
    origin = Origin(FIELDS, "default", "split", 3)
    other = Origin(FieldIndex.of(["n", "word"]), "other", "split", 3)
    batch = TupleBatch([[[["a"], ["b"]], origin, None, 0.0, None, 0], [[[1, "c"]], other, None, 0.0, None, 0]], 3)
    tuples = list(batch)
    assert [id(t) for t in batch] == [id(t) for t in tuples] and batch[2] is tuples[2]
    assert [t.stream for t in tuples] == ["default", "default", "other"]
    assert batch.column("word") == ["a", "b", "c"]           # each run by its own stream's fields
    with pytest.raises(KeyError, match="'n'"):
        batch.column("n")
    assert column(tuples, "word") == ["a", "b", "c"]         # any sequence of tuples, one by one


def test_acking_a_tuple_batch_counts_each_run_against_its_group() -> None:
    outcomes: list[tuple[int, bool]] = []
    acker = Acker(30.0)
    edge = 0x1234
    acker.open(99, edge, lambda root, ok, reason: outcomes.append((root, ok)), 0.0)
    origin = Origin(FIELDS, "default", "split", 3)
    group = new_group(0x52)
    group[1] = 5                                             # five tuples in the group, in two batches
    anchors = {99: edge}
    acker.ack_batch(TupleBatch([[[["a"], ["b"], ["c"]], origin, anchors, 0.0, group, 0]], 3))
    assert group[1] == 2 and outcomes == [] and acker.ledger[99][0] == edge
    acker.ack_batch(TupleBatch([[[["d"], ["e"]], origin, anchors, 0.0, group, 0],
                                [[["u"]], origin, None, 0.0, None, 0]], 3))    # (an untracked run)
    assert outcomes == [(99, True)] and 99 not in acker.ledger


class _Column(Bolt):
    """Records what type of batch it was given and the words, read by column."""

    def __init__(self, kinds: Counter[str], words: Counter[str]) -> None:
        self.kinds, self.words = kinds, words

    def execute_batch(self, tuples: Sequence[Tuple]) -> None:
        self.kinds[type(tuples).__name__] += 1
        self.words.update(column(tuples, "word"))

    def __deepcopy__(self, memo: dict) -> "_Column":
        return _Column(self.kinds, self.words)


@pytest.mark.parametrize("acking, granularity", [(False, "tuple"), (True, "tuple"), (True, "batch")])
def test_a_batch_bolt_reads_columns_and_every_word_is_counted_once(acking: bool, granularity: str) -> None:
    kinds: Counter[str] = Counter()
    words: Counter[str] = Counter()
    b = TopologyBuilder("wc-columns", {"acking": acking, "acking.granularity": granularity,
                                       "backpressure.policy": "none"})
    b.spout("sentences", SentenceSpout(repeat=200, batch=100), 2)
    b.bolt("split", BatchSplitBolt(), 2).shuffle("sentences")
    b.bolt("count", _Column(kinds, words), 3).fields("split", "word")
    res = run(b.build())
    assert words == expected_counts(repeat=200)
    if granularity == "tuple" and acking:
        assert kinds == Counter({"list": kinds["list"]})     # an edge per tuple: tuple objects
    else:
        assert kinds["TupleBatch"] > 0
    if acking:
        assert res.component_totals()["sentences"]["acked"] == 1000


def test_the_example_batch_count_gives_the_same_counts_from_columns_and_from_tuples() -> None:
    a, b = BatchFinalCountBolt(), BatchFinalCountBolt()
    origin = Origin(FIELDS, "default", "split", 3)
    values = [["the"], ["cow"], ["the"]]
    a.execute_batch(TupleBatch([[values, origin, None, 0.0, None, 0]], 3))
    b.execute_batch(list(TupleBatch([[values, origin, None, 0.0, None, 0]], 3)))
    assert a.counts == b.counts == Counter({"the": 2, "cow": 1})


def test_a_tuple_batch_crosses_to_another_worker_as_runs_of_the_same_size() -> None:
    from runtime.local.transport import TupleCodec

    codec = TupleCodec({"split": {"default": ("word",)}})
    pack = msgpack.Packer(autoreset=True).pack
    origin = Origin(FIELDS, "default", "split", 3)
    group = new_group(0x52)
    group[1] = 2
    words = [f"w{i}" * (i % 40) for i in range(100)]
    batch = TupleBatch([[Columns(words), origin, None, 0.0, None, 0],
                        [[["a"], ["b"]], origin, {11: 22}, 1.5, group, 0]], 102)
    groups, nbytes = TupleCodec.encode_sized(batch, pack)
    assert nbytes == _wire_size([[w] for w in words] + [["a"], ["b"]]) == _outbox()[0].batch_bytes(batch)
    wire = msgpack.unpackb(msgpack.packb(["B", 1, nbytes, groups], use_bin_type=True), raw=False,
                           strict_map_key=False)
    assert isinstance(groups[0][3], dict) and isinstance(groups[1][3], bytes)   # columns, rows
    back = codec.decode(wire[3])
    assert type(back) is TupleBatch and back.column("word") == words + ["a", "b"]
    assert type(back.runs[0][0]) is Columns                  # no row made on the way
    assert [(t.anchors, t.born) for t in back][-2:] == [({11: 22}, 1.5)] * 2
    assert back[-1].ackcell is back[-2].ackcell and back[-1].ackcell[1] == 2   # one group here too


def test_a_frame_with_tuples_of_their_own_edges_decodes_to_tuples_in_order() -> None:
    from runtime.local.transport import TupleCodec

    codec = TupleCodec({"split": {"default": ("word",)}})
    groups = [["split", "default", 3, [["a"], ["b"]], None, None],
              ["split", "default", 3, [["c"]], [{5: 6}], [2.0]],
              ["split", "default", 3, [["d"]], None, None]]
    back = codec.decode(groups)
    assert type(back) is list
    assert [t.values[0] for t in back] == ["a", "b", "c", "d"]
    assert [t.anchors for t in back] == [None, None, {5: 6}, None]


def test_columns_read_as_rows_and_name_a_length_mismatch_in_one_line() -> None:
    c = Columns(["a", "b"], [1, 2])
    assert list(c) == [("a", 1), ("b", 2)] and c[1] == ("b", 2) and c[:1] == [("a", 1)] and len(c) == 2
    with pytest.raises(EmitError, match="column 1 has 1 values, column 0 has 2"):
        Columns(["a", "b"], [1])


def test_emit_many_of_columns_is_checked_sized_and_sent_as_columns() -> None:
    outbox, queue = _outbox()
    with pytest.raises(EmitError, match="emitted 2 values on stream 'default'"):
        outbox.untracked_many["default"](Columns(["a"], [1]), 0.0)
    words = ["x" * i for i in range(0, 70, 7)]
    outbox.untracked_many["default"](Columns(words), 0.0)
    batch, nbytes = _sent(outbox, queue)
    assert type(batch) is TupleBatch and nbytes == _wire_size([[w] for w in words])
    assert batch.column("word") == words and [t.values for t in batch] == [(w,) for w in words]


@pytest.mark.parametrize("targets", [[7, 8], [7, 8, 9]])
def test_columns_into_several_tasks_are_split_by_the_fields_rule_and_stay_columns(targets: list[int]) -> None:
    import random

    from topo.groupings import FieldsGrouping, fields_task_index

    router = FieldsGrouping("word").router(targets, FIELDS, rng=random.Random(1))
    queues = {t: ByteQueue(1 << 20) for t in targets}
    outbox = Outbox("split", 3, {"default": StreamRoutes(FIELDS, [router])}, queues, 10_000, 0.001)
    words = [f"k{i % 37}" * (1 + i % 5) for i in range(500)]
    outbox.untracked_many["default"](Columns(words), 0.0)
    asyncio.run(outbox.flush())
    got = {}
    for t, q in queues.items():
        item = q.get_nowait()
        assert item is not None
        batch, nbytes = item
        assert type(batch) is TupleBatch and type(batch.runs[0][0]) is Columns
        assert nbytes == _wire_size([[w] for w in batch.column("word")])
        got[t] = batch.column("word")
    for t in targets:      # each task its words, in emission order, by the per-tuple rule
        assert got[t] == [w for w in words if targets[fields_task_index([w], len(targets))] == t]


def test_an_empty_emit_many_leaves_nothing_to_send() -> None:
    outbox, queue = _outbox()
    outbox.untracked_many["default"]([], 0.0)
    outbox.untracked_many["default"](Columns([]), 0.0)
    assert not outbox.lanes[TARGET].runs and outbox.pending_count == 0
    asyncio.run(outbox.flush())
    assert queue.get_nowait() is None
