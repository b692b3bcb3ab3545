"""A batch to another worker is packed once: the size its remote queue counts is the size the
outbox gives any queue, and what arrives is what was sent."""
from __future__ import annotations

import asyncio
import random
from typing import Any

import msgpack
import pytest

from topo.api import EmitError, FieldIndex, Origin, TupleBatch, WireTuple
from topo.groupings import Router
from runtime.local.acker import Acker, new_group
from runtime.local.collectors import BoltCollector
from runtime.local.outbox import Lane, Outbox, StreamRoutes
from runtime.local.queue import ByteQueue
from runtime.local.transport import RemoteQueue, TupleCodec
from runtime.observe.stats import TaskStats

FIELDS = FieldIndex.of(["word", "n"])


def _batch(origins: list[Origin], tracked: bool = False) -> list[WireTuple]:
    values = [[f"w{i}" * (i % 7), i * 1000] for i in range(300)]       # sizes across msgpack's headers
    return [WireTuple((v, origins[i % len(origins)], {5: 9} if tracked else None, 1.5 if tracked else 0.0,
                       [0] if tracked else None)) for i, v in enumerate(values)]


def _outbox() -> Outbox:
    return Outbox("split", 3, {"default": StreamRoutes(FIELDS, [])}, {}, 256, 0.001)


def test_the_packed_size_is_the_outbox_size_and_decoding_gives_the_batch_back() -> None:
    codec = TupleCodec({"split": {"default": ("word", "n")}})
    pack = msgpack.Packer(autoreset=True).pack
    one = Origin(FIELDS, "default", "split", 3)
    other = Origin(FIELDS, "default", "split", 4)
    for batch in (_batch([one]), _batch([one, other]), _batch([one], tracked=True)):
        groups, nbytes = TupleCodec.encode_sized(batch, pack)
        assert nbytes == _outbox().batch_bytes(batch)
        assert all(isinstance(g[3], bytes) for g in groups)            # the values travel packed
        wire = msgpack.unpackb(msgpack.packb(["B", 1, nbytes, groups], use_bin_type=True), raw=False,
                               strict_map_key=False)
        back = codec.decode(wire[3])
        assert [(t.values, t.origin, t.anchors, t.born) for t in back] == \
               [(list(t.values), t.origin, t.anchors, t.born) for t in batch]


class _Link:
    def __init__(self) -> None:
        self.credit_waiters: dict[int, Any] = {}
        self.frames: list[list[Any]] = []

    async def send(self, frame: list[Any]) -> None:
        self.frames.append(frame)


def test_a_remote_queue_refuses_what_it_cannot_pack_or_what_is_over_its_bound() -> None:
    one = Origin(FIELDS, "default", "split", 3)
    link = _Link()
    q = RemoteQueue(7, link, 10_000, TupleCodec.encode)       # type: ignore[arg-type]
    ok = _batch([one])[:50]
    assert asyncio.run(q.put_packing(ok)) is not None and q.bytes == _outbox().batch_bytes(ok)
    bad = [WireTuple(([object(), 1], one, None, 0.0, None))]
    assert asyncio.run(q.put_packing(bad)) is None                  # the outbox sizes it and names it
    small = RemoteQueue(8, link, 100, TupleCodec.encode)       # type: ignore[arg-type]
    assert asyncio.run(small.put_packing(ok)) is None               # ... or cuts it into pieces
    assert len(link.frames) == 1 and link.frames[0][2] == q.bytes


def _split_task(select: Any) -> tuple[Outbox, BoltCollector, ByteQueue, _Link]:
    """A split task under batch granularity whose word stream goes to task 7 in this worker
    and task 8 in another (``select``: the index), with the queue and link of each."""
    local, link = ByteQueue(1 << 20), _Link()
    remote = RemoteQueue(8, link, 1 << 20, TupleCodec.encode)       # type: ignore[arg-type]
    outbox = Outbox("split", 3, {"default": StreamRoutes(FieldIndex.of(["word"]), [Router([7, 8], select)])},
                    {7: local, 8: remote}, 10_000, 1.0)
    collector = BoltCollector(outbox, acker=Acker(30.0), stats=TaskStats("t", "split", 3, False),
                              auto_anchor=True, getrandbits=random.Random(5).getrandbits, batches=True)
    return outbox, collector, local, link


def _sentence(anchors: dict[int, int], born: float) -> WireTuple:
    """An input of the split task: a spout tuple of its own ack group."""
    return WireTuple((["s"], Origin(FieldIndex.of(["sentence"]), "default", "sentences", 1), anchors, born,
                      new_group(0x53)))


def test_per_tuple_emits_towards_another_worker_travel_as_runs_and_arrive_as_sent() -> None:
    """Under batch granularity an auto-anchored bolt's single emits into a lane towards another
    worker are kept as runs of values (no tuple object per emit); the batch is packed whole, one
    wire group per ack group, and arrives with every tuple's values, anchors and born and one
    ack cell per group; the local lane beside it keeps tuple objects."""
    outbox, collector, local, link = _split_task(lambda values: 0 if values[0] < "m" else 1)
    parents = [_sentence({11: 0x71}, 1.5), _sentence({12: 0x72}, 2.5)]
    words = [["zebra", "apple", "moon", "yak"], ["night", "bee", "owl"]]
    for parent, ws in zip(parents, words):
        collector.current = parent
        for w in ws:
            collector.emit([w])
    lane = outbox.lanes[8]
    assert not lane.batch and [len(r[0]) for r in lane.runs] == [3, 2]     # one run per ack group
    assert all(type(t) is WireTuple for t in outbox.lanes[7].batch)
    asyncio.run(outbox.flush())
    (_, target, nbytes, groups), = link.frames
    remote_words = [[w] for ws in words for w in ws if w >= "m"]
    assert target == 8 and nbytes == sum(len(msgpack.packb(v)) for v in remote_words)
    got = TupleCodec({"split": {"default": ("word",)}}).decode(
        msgpack.unpackb(msgpack.packb(groups, use_bin_type=True), raw=False, strict_map_key=False))
    assert type(got) is TupleBatch
    back = got.tuples()
    assert [t.values for t in back] == remote_words
    assert [t.born for t in back] == [1.5, 1.5, 1.5, 2.5, 2.5]
    assert [list(t.anchors) for t in back] == [[11]] * 3 + [[12]] * 2
    assert back[0].ackcell is back[2].ackcell and back[3].ackcell is back[4].ackcell
    assert (back[0].ackcell[1], back[3].ackcell[1]) == (3, 2)
    # Each lane's group XORed its edge into its parent's cell once (parents start at 0).
    sent_here, _ = local.get_nowait()
    for k, (parent, root) in enumerate(zip(parents, (11, 12))):
        here = {t.anchors[root] for t in sent_here if root in t.anchors}
        assert len(here) == 1 and parent.ackcell[0] == here.pop() ^ back[3 * k].anchors[root]


def test_a_lane_extends_its_last_run_only_with_values_that_share_everything_else() -> None:
    one, other = Origin(FIELDS, "default", "split", 3), Origin(FIELDS, "other", "split", 3)
    g, h = new_group(0x81), new_group(0x82)
    lane = Lane(8)
    lane.add_one(["a", 1], one, {1: 5}, 1.0, g)
    lane.add_one(["b", 2], one, {1: 5}, 1.0, g)          # extends
    lane.add_one(["c", 3], other, {1: 5}, 1.0, g)        # another stream: a run of its own
    lane.add_one(["d", 4], other, {1: 5}, 2.0, g)        # another born
    lane.add_one(["e", 5], other, {2: 6}, 2.0, h)        # another ack group
    lane.batch.append(WireTuple((["f", 6], other, {2: 6}, 2.0, h)))
    lane.add_one(["g", 7], other, {2: 6}, 2.0, h)        # a tuple came between
    assert [(len(r[0]), r[1] is one, r[3], r[4] is g, r[5]) for r in lane.runs] == \
        [(2, True, 1.0, True, 0), (1, False, 1.0, True, 0), (1, False, 2.0, True, 0), (1, False, 2.0, False, 0),
         (1, False, 2.0, False, 1)]
    assert lane.run_count == 6
    assert [t.values[0] for t in lane.take()] == list("abcdefg")


def test_an_unencodable_value_emitted_towards_another_worker_is_named_at_the_flush() -> None:
    """A run that cannot be packed is sized value by value, as any batch: the error names
    the component, the stream and the field."""
    outbox, collector, _, link = _split_task(lambda values: 1)
    collector.current = _sentence({11: 1}, 1.5)
    collector.emit(["fine"])
    collector.emit([object()])
    assert outbox.lanes[8].runs and not outbox.lanes[8].batch
    with pytest.raises(EmitError, match="component 'split' emitted on stream 'default' a value for field 'word'"):
        asyncio.run(outbox.flush())
    assert not link.frames
