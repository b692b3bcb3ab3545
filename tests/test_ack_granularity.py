"""``acking.granularity: batch`` (Trident's granularity): one tuple tree per spout batch and one
ledger edge per group of tuples, with the guarantees of per-tuple acking: every spout tuple
acked exactly once when its batch's tree completes, a failure or a timeout replays the whole
batch, nothing is lost, in one process and across worker processes."""
from __future__ import annotations

import asyncio
import os
import random
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from topo.api import Bolt, EmitError, EndOfStream, FieldIndex, Origin, Spout, Tuple, WireTuple
from topo.config import ConfigError, resolve
from topo.examples.wordcount import (BatchFinalCountBolt, BatchSplitBolt, FinalCountBolt, SentenceSpout,
                                     SplitBolt, expected_counts)
from topo.groupings import Router
from topo.sinks import read_table
from topo.topology import TopologyBuilder
from runtime.local.acker import GROUP_CELL, Acker, new_group
from runtime.local.collectors import BoltCollector, SpoutCollector
from runtime.local.engine import run
from runtime.local.outbox import Outbox, StreamRoutes
from runtime.local.queue import ByteQueue
from runtime.local.transport import TupleCodec
from runtime.observe.stats import TaskStats

ROOT = Path(__file__).resolve().parents[1]
BATCHES = {"acking": True, "acking.granularity": "batch", "backpressure.policy": "none"}


# --- the ledger -------------------------------------------------------------------------

def _outcomes() -> tuple[list[tuple[int, bool, str]], Any]:
    seen: list[tuple[int, bool, str]] = []
    return seen, lambda root, ok, reason: seen.append((root, ok, reason))


def _tup(anchors: dict[int, int] | None, cell: list[int] | None) -> WireTuple:
    return WireTuple(([0], Origin(FieldIndex.of(["n"]), "default", "c", 1), anchors, 0.0, cell))


def test_a_group_is_acked_once_when_its_last_tuple_is_processed() -> None:
    seen, owner = _outcomes()
    acker = Acker(30.0)
    g = new_group(0x51)
    g[1] = 3                                  # three tuples share edge 0x5
    acker.open(7, 0x5, owner, 0.0)
    anchors = {7: 0x5}
    acker.ack_tuple(anchors, g)
    acker.ack_tuple(anchors, g)
    assert seen == [] and acker.ledger[7][0] == 0x5     # two of three: the edge is still open
    acker.ack_tuple(anchors, g)
    assert seen == [(7, True, "")] and len(acker) == 0


def test_ack_batch_of_one_group_and_of_mixed_cells_agree_with_the_ledger_rule() -> None:
    seen, owner = _outcomes()
    acker = Acker(30.0)
    g = new_group(0x51)
    g[0], g[1] = 0x30, 2                      # its tuples emitted one child edge 0x30
    child = [0]
    acker.open(9, 0x3, owner, 0.0)            # root 9: group edge 0x3
    acker.ack_batch([_tup({9: 0x3}, g), _tup({9: 0x3}, g)])
    assert seen == [] and acker.ledger[9][0] == 0x30    # the group's edge out, its child's in
    acker.ack_batch([_tup(None, None), _tup({9: 0x30}, child)])   # a per-tuple edge in the same tree
    assert seen == [(9, True, "")]


def test_ack_batch_of_several_groups_counts_each_group_and_acks_the_one_it_completes() -> None:
    seen, owner = _outcomes()
    acker = Acker(30.0)
    g1, g2 = new_group(0x61), new_group(0x62)
    g1[0], g1[1] = 0, 2                       # both of its tuples in this batch: complete here
    g2[0], g2[1] = 0, 4                       # two of its four: still open after it
    acker.open(9, 0x3, owner, 0.0)
    acker.open(8, 0x5, owner, 0.0)
    acker.ack_batch([_tup({9: 0x3}, g1), _tup({9: 0x3}, g1), _tup({8: 0x5}, g2), _tup({8: 0x5}, g2)])
    assert seen == [(9, True, "")] and g1[1] == 0 and g2[1] == 2 and 8 in acker.ledger
    acker.ack_batch([_tup({8: 0x5}, g2), _tup({8: 0x5}, g2)])
    assert seen == [(9, True, ""), (8, True, "")] and not acker.ledger


def test_ack_batch_counts_a_group_split_into_stretches_once_and_mixes_in_own_edges_and_untracked() -> None:
    """A batch whose groups interleave (two senders' batches) and carry tuples of their own
    edges and untracked ones: every group counted once in all, acked when its count ends."""
    seen, owner = _outcomes()
    acker = Acker(30.0)
    g1, g2 = new_group(0x61), new_group(0x62)
    g1[0], g1[1] = 0, 3
    g2[0], g2[1] = 0, 3
    own1, own2 = [0], [0]
    for root, edge in ((1, 0x11), (2, 0x22), (3, 0x33), (4, 0x44)):
        acker.open(root, edge, owner, 0.0)
    a1, a2 = {1: 0x11}, {2: 0x22}
    acker.ack_batch([_tup(a1, g1), _tup(a2, g2), _tup(a1, g1), _tup({3: 0x33}, own1), _tup({4: 0x44}, own2),
                     _tup(None, None), _tup(None, None), _tup(a2, g2)])
    assert sorted(seen) == [(3, True, ""), (4, True, "")]          # own edges at once; g1 2 of 3, g2 2 of 3
    assert (g1[1], g2[1]) == (1, 1) and acker.ledger[1][0] == 0x11 and acker.ledger[2][0] == 0x22
    acker.ack_batch([_tup(a2, g2), _tup(a1, g1)])
    assert sorted(seen) == [(1, True, ""), (2, True, ""), (3, True, ""), (4, True, "")] and not acker.ledger


def test_ack_batch_of_own_edges_acks_each_root_forwards_other_workers_roots_and_skips_gone_ones() -> None:
    """Tuple granularity: each tuple's edge and its children's XOR go into every root it is
    anchored to; a root of another worker is forwarded, a root of this worker that is gone
    (failed or timed out) is skipped; a group's tuple in the same batch is counted."""
    seen, owner = _outcomes()
    forwarded: list[tuple[int, int]] = []
    acker = Acker(30.0, worker=1, forward_ack=lambda root, xor: forwarded.append((root, xor)))
    a, b, c = 0x101, 0x201, 0x401            # this worker's roots (low byte 1)
    acker.open(a, 0x5 ^ 0x9, owner, 0.0)
    acker.open(b, 0x5, owner, 0.0)
    acker.open(c, 0x3, owner, 0.0)
    g = new_group(0x51)
    g[1] = 1
    acker.ack_batch([_tup({a: 0x5, b: 0x5}, [0x30]),      # two roots, one child edge 0x30
                     _tup({a: 0x9}, [0]),
                     _tup({0x102: 0x7}, [0x8]),           # a root of worker 2
                     _tup({0x301: 0x4}, [0]),             # a root of this worker already gone
                     _tup(None, None),
                     _tup({c: 0x3}, g)])                  # the last tuple of a group
    assert seen == [(c, True, "")]
    assert acker.ledger[a][0] == 0x30 and acker.ledger[b][0] == 0x30
    assert forwarded == [(0x102, 0x7 ^ 0x8)]
    acker.ack_batch([_tup({a: 0x30, b: 0x30}, [0])])      # the child
    assert sorted(seen) == [(a, True, ""), (b, True, ""), (c, True, "")] and not acker.ledger


def test_ack_batch_of_own_edges_only_updates_the_ledgers_as_acking_each_tuple_does() -> None:
    """A batch every tuple of which has an edge of its own (a bolt's input at tuple
    granularity) is acked in one pass: the same ledgers, completions and forwards as
    ``ack_tuple`` of each tuple, in any order."""
    rng = random.Random(11)
    results = []
    for one_by_one in (False, True):
        seen, owner = _outcomes()
        forwarded: list[tuple[int, int]] = []
        acker = Acker(30.0, worker=1, forward_ack=lambda root, xor: forwarded.append((root, xor)))
        roots = [0x100 * i + 1 for i in range(1, 41)]
        edges = {r: rng.getrandbits(64) or 1 for r in roots}
        for r in roots:
            acker.open(r, edges[r], owner, 0.0)
        batch = [_tup({r: edges[r]}, [0 if i % 3 else rng.getrandbits(64)]) for i, r in enumerate(roots)]
        batch += [_tup({roots[0]: 0x5, roots[3]: 0x5}, [0x9]), _tup({0x302: 0x4}, [0x8]), _tup({0x9901: 1}, [0])]
        rng.shuffle(batch)
        if one_by_one:
            for t in batch:
                acker.ack_tuple(t.anchors, t.ackcell)
        else:
            acker.ack_batch(batch)
        results.append((sorted(seen), {r: e[0] for r, e in acker.ledger.items()}, forwarded))
        rng = random.Random(11)
    assert results[0] == results[1]
    assert len(results[0][0]) == 26 and results[0][2] == [(0x302, 0x4 ^ 0x8)]     # 2 of 3 have no child


def _split_outbox(batches: bool, acker: Acker) -> tuple[Outbox, BoltCollector]:
    """A bolt task (3) whose default stream goes to task 7 or 8 by the word's length."""
    lanes = {7: ByteQueue(1 << 20), 8: ByteQueue(1 << 20)}
    outbox = Outbox("split", 3, {"default": StreamRoutes(FieldIndex.of(["word"]),
                                                         [Router([7, 8], lambda values: len(values[0]) % 2)])},
                    lanes, 10_000, 1.0)
    collector = BoltCollector(outbox, acker=acker, stats=TaskStats("t", "split", 3, False), auto_anchor=True,
                              getrandbits=random.Random(5).getrandbits, batches=batches)
    return outbox, collector


def test_an_auto_anchored_emit_under_tuple_granularity_gives_each_tuple_its_own_edge_on_every_root() -> None:
    """A bolt's emit anchored to the input it executes: one new edge per tuple, on each root
    of its parent, XORed into the parent's cell; acking the parent, then the children,
    completes both trees. The other emits (named anchors, another stream, a wrong field
    count) keep their rules."""
    seen, owner = _outcomes()
    acker = Acker(30.0)
    outbox, collector = _split_outbox(False, acker)
    parent = WireTuple((["a bb"], Origin(FieldIndex.of(["sentence"]), "default", "sentences", 1),
                        {11: 0x71, 12: 0x72}, 1.5, [0]))
    acker.open(11, 0x71, owner, 0.0)
    acker.open(12, 0x72, owner, 0.0)
    collector.current = parent
    collector.emit(["a"])
    collector.emit(["bb"])
    collector.emit(["cc"], anchors=parent)                # named: the general path, the same rule
    sent = [t for target in (7, 8) for t in outbox.lanes[target].batch]
    assert [t.values for t in sent] == [["bb"], ["cc"], ["a"]] and collector.emitted == 3
    edges = [t.anchors[11] for t in sent]
    assert all(list(t.anchors) == [11, 12] and t.anchors[12] == t.anchors[11] for t in sent)
    assert len(set(edges)) == 3 and 0 not in edges and all(t.born == 1.5 and t.ackcell == [0] for t in sent)
    assert parent.ackcell[0] == edges[0] ^ edges[1] ^ edges[2]
    with pytest.raises(EmitError, match="'word'"):
        collector.emit(["x", "y"])
    with pytest.raises(EmitError, match="'nowhere'"):
        collector.emit(["x"], "nowhere")
    acker.ack_batch([parent])
    assert seen == []
    acker.ack_batch(sent)
    assert sorted(seen) == [(11, True, ""), (12, True, "")] and not acker.ledger


def test_grouped_emits_share_one_group_per_input_and_lane_and_a_new_one_after_a_switch_or_a_flush() -> None:
    """Where a bolt groups its edges, an input's auto-anchored emits to one lane share one ack
    group; another input's emit between them, or a flush, starts a new group (each group's
    edge XORed into its parent's cell once); every tuple carries its group's anchors and its
    parent's birth. With no input being executed the emit is untracked. Acking the parents,
    then the children, completes both trees."""
    seen, owner = _outcomes()
    acker = Acker(30.0)
    outbox, collector = _split_outbox(True, acker)
    origin = Origin(FieldIndex.of(["sentence"]), "default", "sentences", 1)
    a = WireTuple((["a"], origin, {11: 0x71}, 1.5, [0]))
    b = WireTuple((["b"], origin, {12: 0x72}, 2.5, [0]))
    acker.open(11, 0x71, owner, 0.0)
    acker.open(12, 0x72, owner, 0.0)
    emit = collector.emit
    collector.current = a
    emit(["x"]), emit(["yy"]), emit(["zz"])              # lane 8, lane 7, lane 7
    collector.current = b
    emit(["bb"])                                         # lane 7: b's group
    collector.current = a
    emit(["ww"])                                         # lane 7 again: a's second group there
    seven, eight = outbox.lanes[7].batch, outbox.lanes[8].batch
    assert [t.values for t in seven] == [["yy"], ["zz"], ["bb"], ["ww"]] and [t.values for t in eight] == [["x"]]
    cells = [t.ackcell for t in seven]
    assert cells[0] is cells[1] and len({id(c) for c in cells[1:]}) == 3 and cells[0][1] == 2
    assert [len(c) for c in cells] == [GROUP_CELL] * 4 and cells[2][1] == cells[3][1] == eight[0].ackcell[1] == 1
    groups_of_a = [cells[0], cells[3], eight[0].ackcell]
    assert a.ackcell[0] == groups_of_a[0][2] ^ groups_of_a[1][2] ^ groups_of_a[2][2]
    assert b.ackcell[0] == cells[2][2]
    assert [t.anchors for t in seven] == [{11: cells[0][2]}] * 2 + [{12: cells[2][2]}, {11: cells[3][2]}]
    assert [t.born for t in seven] == [1.5, 1.5, 2.5, 1.5]
    asyncio.run(outbox.flush())                          # the lanes' groups end with the flush
    emit(["vv"])                                         # a, after the flush: a new group
    after = outbox.lanes[7].batch[0]
    assert after.ackcell not in cells and after.ackcell[1] == 1 and a.ackcell[0] == (
        groups_of_a[0][2] ^ groups_of_a[1][2] ^ groups_of_a[2][2] ^ after.ackcell[2])
    collector.current = None
    emit(["uu"])                                         # no input: untracked
    assert outbox.lanes[7].batch[1].anchors is None and collector.emitted == 7
    sent = [t for q in (7, 8) for t in outbox.queues[q].get_nowait()[0]] + outbox.lanes[7].batch
    acker.ack_batch([a, b])
    assert seen == []
    acker.ack_batch(sent)
    assert sorted(seen) == [(11, True, ""), (12, True, "")] and not acker.ledger


def test_a_spouts_tracked_emit_opens_its_root_as_open_does_and_keeps_it_for_replay() -> None:
    """A spout's tracked emit on its default stream (one subscriber): one tuple with its own
    edge on a new root, the root's ledger entry as ``Acker.open`` writes it, the values kept
    in ``pending``; with worker processes the root's low byte names this worker. Without a
    msg id the emit is untracked; another stream and a wrong field count keep their rules."""
    seen, owner = _outcomes()
    for worker, forward in ((0, None), (3, lambda root, xor: None)):
        acker = Acker(30.0, worker=worker, forward_ack=forward)
        queues = {7: ByteQueue(1 << 20), 9: ByteQueue(1 << 20)}
        outbox = Outbox("sentences", 1, {"default": StreamRoutes(FieldIndex.of(["sentence"]), [Router([7], lambda values: 0)]),
                                         "other": StreamRoutes(FieldIndex.of(["n"]), [Router([9], lambda values: 0)])},
                        queues, 10_000, 1.0)
        pending: dict[int, Any] = {}
        collector = SpoutCollector(outbox, acker=acker, pending=pending, on_outcome=owner,
                                   getrandbits=random.Random(7).getrandbits, untracked_acks=None)
        collector.emit(["s one"], msg_id="m1")
        collector.emit(["s two"])                          # no msg id: untracked
        collector.emit([5], "other", msg_id="m2")
        with pytest.raises(EmitError, match="'sentence'"):
            collector.emit(["a", "b"], msg_id="m3")
        one, untracked = outbox.lanes[7].batch
        other = outbox.lanes[9].batch[0]
        root = next(iter(one.anchors))
        assert list(pending) == [root, next(iter(other.anchors))] and pending[root][:4] == ("m1", ["s one"], "default", 0)
        assert acker.ledger[root] == [one.anchors[root], owner, one.born + 30.0] and one.ackcell == [0]
        assert one.born == pending[root][4] and untracked.anchors is None and collector.emitted == 4
        assert all(r & 0xFF == worker for r in pending) if forward else len(acker.ledger) == 2
        acker.ack_batch([one, other])
        assert not acker.ledger and sorted(seen[-2:]) == sorted([(r, True, "") for r in pending])


def test_two_ack_groups_never_compare_equal_however_their_counts_stand() -> None:
    """(``ack_batch`` and ``emit_many`` find one group's tuples with ``list.count``, which
    tries identity and then equality: a group's edge id keeps two groups apart even when
    their XOR and count are the same, as at a leaf, where nothing is anchored to them.)"""
    a, b = new_group(0x71), new_group(0x72)
    assert a[:2] == b[:2] == [0, 0] and a != b and a == a
    assert len(a) == GROUP_CELL and a != [0] and a != [0, 0]       # not a per-tuple cell
    assert [a, b, [0, 0], [0], None, a].count(a) == 2
    b[1] = a[1] = 3
    assert [b, a, b, a].count(a) == 2 and new_group(0x71, 3) == a    # (the edge, not the object)


def test_a_group_received_in_two_batches_from_another_worker_shares_one_cell() -> None:
    codec = TupleCodec({"c": {"default": ("n",)}})
    g = new_group(0x51)
    g[1] = 3
    anchors = {11: 0x77}
    own = [0]
    sent = [_tup(anchors, g), _tup(anchors, g), _tup({11: 0x99}, own)]
    first = list(codec.decode(codec.encode(sent)))
    second = list(codec.decode(codec.encode([_tup(anchors, g)])))    # (a batch all of one group)
    cells = [t.ackcell for t in first + second]
    assert cells[0] is cells[1] is cells[3] and cells[0][1] == 3    # one group of three, across batches
    assert cells[2] is not cells[0] and len(cells[2]) == 1           # a per-tuple edge keeps its own cell
    assert [t.anchors for t in first + second] == [anchors, anchors, {11: 0x99}, anchors]
    assert not codec._groups                                          # every tuple of the group arrived
    whole = codec.decode(codec.encode([_tup(anchors, g)] * 3))       # a group in one batch: sent once
    assert len({id(t.ackcell) for t in whole}) == 1 and whole[0].ackcell[1] == 3 and not codec._groups


def test_a_batch_of_two_whole_groups_travels_as_two_groups_and_arrives_as_runs() -> None:
    """A lane's batch that spans two ack groups (its task moved on to the next spout batch
    mid-batch) is cut where the group changes: each piece carries its anchors, born and size
    once, and arrives without a tuple object or a cell per tuple."""
    from topo.api import TupleBatch
    codec = TupleCodec({"c": {"default": ("n",)}})
    g1, g2 = new_group(0x61), new_group(0x62)
    g1[1], g2[1] = 3, 2
    a1, a2 = {11: 0x71}, {12: 0x72}
    sent = [_tup(a1, g1), _tup(a1, g1), _tup(a1, g1), _tup(a2, g2), _tup(a2, g2)]
    groups = codec.encode(sent)
    assert [(g[4], g[6]) for g in groups] == [(a1, 3), (a2, 2)]       # anchors and size once each
    got = codec.decode(groups)
    assert type(got) is TupleBatch
    back = list(got.tuples())
    cells = [t.ackcell for t in back]
    assert cells[0] is cells[1] is cells[2] and cells[3] is cells[4] and cells[0] is not cells[3]
    assert (cells[0][1], cells[3][1]) == (3, 2) and not codec._groups
    assert [t.anchors for t in back] == [a1, a1, a1, a2, a2]
    # Acked there, each group is one ledger update of its own root.
    seen, owner = _outcomes()
    acker = Acker(30.0)
    acker.open(11, 0x71, owner, 0.0)
    acker.open(12, 0x72, owner, 0.0)
    acker.ack_batch(got)
    assert sorted(seen) == [(11, True, ""), (12, True, "")]
    # A batch with a tuple of its own edge among them goes tuple by tuple, as before.
    own = [0]
    mixed = codec.encode([_tup(a1, g1), _tup({11: 0x99}, own), _tup(a2, g2)])
    assert len(mixed) == 1 and isinstance(mixed[0][4], list)


# --- one process ------------------------------------------------------------------------

class _Registered:
    def __init__(self, registry: list[Counter[str]]) -> None:
        super().__init__()  # type: ignore[call-arg]
        self.registry = registry

    def prepare(self, context: Any, collector: Any) -> None:
        super().prepare(context, collector)  # type: ignore[misc]
        self.registry.append(self.counts)  # type: ignore[attr-defined]

    def __deepcopy__(self, memo: dict) -> Any:
        return type(self)(self.registry)


class Final(_Registered, FinalCountBolt):
    pass


class BatchFinal(_Registered, BatchFinalCountBolt):
    pass


class Sentences(SentenceSpout):
    """The example's spout, recording the msg ids acked and failed."""

    acked: list[int] = []

    def ack(self, msg_id: Any) -> None:
        self.acked.append(msg_id)


@pytest.mark.parametrize("variant", ["per_tuple", "batch"])
def test_word_counts_are_exact_and_every_sentence_is_acked_once(variant: str) -> None:
    registry: list[Counter[str]] = []
    Sentences.acked = []
    batch = variant == "batch"
    b = TopologyBuilder("wc-groups", {**BATCHES, "batch.size": 64})
    b.spout("sentences", Sentences(repeat=200, batch=50 if batch else 1), 2)
    b.bolt("split", BatchSplitBolt() if batch else SplitBolt(), 2).shuffle("sentences")
    b.bolt("count", (BatchFinal if batch else Final)(registry), 3).fields("split", "word")
    res = run(b.build())
    total: Counter[str] = Counter()
    for c in registry:
        total.update(c)
    assert total == expected_counts(repeat=200)
    assert sorted(Sentences.acked) == list(range(1000))          # each sentence acked exactly once
    assert res.component_totals()["sentences"]["acked"] == 1000


class Numbers(Spout):
    """0..total-1, one tracked emit per call; records acks and fails."""

    outputs = ["n"]

    def __init__(self, total: int) -> None:
        self.total, self.i = total, 0
        self.acked: list[int] = []
        self.failed: list[int] = []

    def next_tuple(self) -> None:
        if self.i >= self.total:
            raise EndOfStream
        self.collector.emit([self.i], msg_id=self.i)
        self.i += 1

    def ack(self, msg_id: Any) -> None:
        self.acked.append(msg_id)

    def fail(self, msg_id: Any) -> None:
        self.failed.append(msg_id)


class Twice(Bolt):
    """Two children per input (n*10, n*10+1)."""

    outputs = ["n"]

    def execute(self, tup: Tuple) -> None:
        self.collector.emit([tup.values[0] * 10])
        self.collector.emit([tup.values[0] * 10 + 1])


class FailOnce(Bolt):
    """Raises once on ``bad``; counts what it executed."""

    def __init__(self, bad: int, seen: Counter[int]) -> None:
        self.bad, self.seen, self.raised = bad, seen, False

    def execute(self, tup: Tuple) -> None:
        if tup.values[0] == self.bad and not self.raised:
            self.raised = True
            raise RuntimeError("one grandchild fails")
        self.seen[tup.values[0]] += 1


class TwiceWrong(Twice):
    """``Twice`` that emits one value too many on input 7."""

    def execute(self, tup: Tuple) -> None:
        if tup.values[0] == 7:
            self.collector.emit([1, 2])
        super().execute(tup)


@pytest.mark.parametrize("granularity", ["tuple", "batch"])
def test_a_last_bolts_emits_no_one_subscribes_to_are_counted_checked_and_its_inputs_acked(
        granularity: str) -> None:
    """No tuple leaves an emit nobody subscribes to, so acking has nothing to track there:
    the emits are counted and checked as untracked ones, and the inputs are acked."""
    b = TopologyBuilder("last", {"acking": True, "acking.granularity": granularity, "backpressure.policy": "none"})
    spout = Numbers(500)
    b.spout("nums", spout)
    b.bolt("twice", Twice()).shuffle("nums")
    res = run(b.build())
    totals = res.component_totals()
    assert totals["twice"]["emitted"] == 1000 and totals["twice"]["executed"] == 500
    assert totals["nums"]["acked"] == 500 and not totals["nums"]["failed"]
    wrong = TopologyBuilder("last-wrong", {"acking": True, "acking.granularity": granularity,
                                           "backpressure.policy": "none"})
    wrong.spout("nums", Numbers(10))
    wrong.bolt("twice", TwiceWrong()).shuffle("nums")
    with pytest.raises(EmitError, match="'twice' emitted 2 values on stream 'default', which declares 1 field"):
        run(wrong.build())


def test_one_failed_grandchild_replays_its_whole_spout_batch_and_nothing_is_lost() -> None:
    seen: Counter[int] = Counter()
    spout = Numbers(400)
    b = TopologyBuilder("groups-fail", {**BATCHES, "batch.size": 32})
    b.spout("nums", lambda: spout)
    b.bolt("twice", Twice()).shuffle("nums")
    leaf = FailOnce(bad=1731, seen=seen)
    b.bolt("leaf", lambda: leaf).shuffle("twice")                    # 1731: a grandchild of 173
    res = run(b.build())
    failed = set(spout.failed)
    assert 173 in failed and len(failed) > 1                        # the whole batch, not one tuple
    assert len(spout.failed) == len(failed) <= 32                   # ... one batch, failed once
    assert sorted(spout.acked) == list(range(400))                  # everything acked in the end
    assert set(seen) == {n * 10 + i for n in range(400) for i in (0, 1)}   # nothing lost
    assert all(seen[n * 10 + i] == 2 for n in failed for i in (0, 1) if n * 10 + i != 1731)   # replayed
    assert res.component_totals()["nums"]["replayed"] == len(failed)


class Cells(FailOnce):
    """``FailOnce`` that records whether each input came in an ack group (a shared edge)."""

    def __init__(self, bad: int, seen: Counter[int], grouped: list[bool]) -> None:
        super().__init__(bad, seen)
        self.grouped = grouped

    def execute(self, tup: Tuple) -> None:
        self.grouped.append(len(tup.ackcell) == GROUP_CELL)    # type: ignore[arg-type]
        super().execute(tup)


@pytest.mark.parametrize("policy", ["none", "window"])
def test_under_tuple_granularity_one_failed_grandchild_replays_only_its_own_spout_tuple(policy: str) -> None:
    """A tree per spout tuple, whatever carries the edges: a bolt's two children of one input
    share one ack group (not under send windows, which ack tuple by tuple), and a failure of
    one of them fails and replays that spout tuple alone."""
    seen: Counter[int] = Counter()
    grouped: list[bool] = []
    spout = Numbers(400)
    b = TopologyBuilder("tuple-fail", {"acking": True, "acking.granularity": "tuple", "backpressure.policy": policy})
    b.spout("nums", lambda: spout)
    b.bolt("twice", Twice()).shuffle("nums")
    b.bolt("leaf", lambda: Cells(bad=1731, seen=seen, grouped=grouped)).global_("twice")
    res = run(b.build())
    assert spout.failed == [173]
    assert sorted(spout.acked) == list(range(400))
    assert set(seen) == {n * 10 + i for n in range(400) for i in (0, 1)}   # nothing lost
    assert seen[1730] == 2 and seen[1731] == 1 and seen[1740] == 1          # only 173 replayed
    assert res.component_totals()["nums"]["replayed"] == 1
    assert len(grouped) == 802 and all(grouped) == (policy == "none") and any(grouped) == (policy == "none")


class DropOnce(Bolt):
    """Acks by hand and never acks ``bad`` the first time (a lost tuple: only the timeout sees it)."""

    auto_ack = False

    def __init__(self, bad: int) -> None:
        self.bad, self.dropped = bad, False

    def execute(self, tup: Tuple) -> None:
        if tup.values[0] == self.bad and not self.dropped:
            self.dropped = True
            return
        self.collector.ack(tup)


def test_a_tuple_never_acked_times_its_batch_out_and_the_batch_is_replayed() -> None:
    spout = Numbers(200)
    b = TopologyBuilder("groups-timeout", {**BATCHES, "batch.size": 16, "message_timeout_s": 0.5})
    b.spout("nums", lambda: spout)
    b.bolt("drop", DropOnce(bad=77)).shuffle("nums")
    res = run(b.build())
    assert 77 in spout.failed and len(spout.failed) > 1
    assert sorted(spout.acked) == list(range(200))
    assert res.component_totals()["nums"]["replayed"] == len(spout.failed)


class InFlight(Numbers):
    """Records the most tracked tuples in flight it saw at any call."""

    def __init__(self, total: int) -> None:
        super().__init__(total)
        self.most = 0

    def next_tuple(self) -> None:
        self.most = max(self.most, self.i - len(self.acked))
        super().next_tuple()


class Slow(Bolt):
    def execute(self, tup: Tuple) -> None:
        sum(range(2000))


def test_max_spout_pending_counts_tuples_not_batches() -> None:
    spout = InFlight(3000)
    b = TopologyBuilder("groups-pending", {**BATCHES, "batch.size": 20, "max_spout_pending": 100})
    b.spout("nums", lambda: spout)
    b.bolt("slow", Slow()).shuffle("nums")
    run(b.build())
    assert sorted(spout.acked) == list(range(3000))
    assert spout.most <= 100 + 20          # the limit, passed by at most the round that reached it


def test_granularity_is_checked_and_refused_with_window() -> None:
    with pytest.raises(ConfigError, match="acking.granularity.*must be one of"):
        resolve({"acking.granularity": "root"})
    with pytest.raises(ConfigError, match="acking.granularity.*window acks and re-sends tuple by tuple"):
        resolve({"acking": True, "acking.granularity": "batch", "backpressure.policy": "window"})


# --- worker processes -------------------------------------------------------------------

def _final_counts_spec(batch: bool) -> str:
    """Sentences -> split -> final count -> SQLite, two tasks each, batch granularity."""
    example = "topo.examples.wordcount."
    spec = {
        "name": "final-counts-groups",
        "config": {"acking": True, "acking.granularity": "batch", "backpressure.policy": "none"},
        "spouts": [{"id": "sentences", "class": example + "SentenceSpout", "parallelism": 2,
                    "kwargs": {"repeat": 400, "batch": 100 if batch else 1}}],
        "bolts": [{"id": "split", "class": example + ("BatchSplitBolt" if batch else "SplitBolt"), "parallelism": 2},
                  {"id": "count", "class": example + ("BatchFinalCountBolt" if batch else "FinalCountBolt"),
                   "parallelism": 2},
                  {"id": "sink", "class": "topo.sinks.SQLiteSink",
                   "kwargs": {"path": "final.db", "table": "word_counts", "fields": ["word", "count"],
                              "key_fields": ["word"]}}],
        "streams": [{"from": "sentences", "to": "split", "grouping": {"type": "shuffle"}},
                    {"from": "split", "to": "count", "grouping": {"type": "fields", "fields": ["word"]}},
                    {"from": "count", "to": "sink", "grouping": {"type": "fields", "fields": ["word"]}}],
    }
    return yaml.safe_dump(spec)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("variant", ["per_tuple", "batch"])
def test_final_counts_are_exact_across_two_workers_with_batch_granularity(tmp_path: Path, variant: str) -> None:
    """Groups cross workers by columns (their sizes travel), so each is acked once there."""
    (tmp_path / "final.yaml").write_text(_final_counts_spec(variant == "batch"))
    proc = subprocess.run([sys.executable, "-m", "topo.cli", "run", "final.yaml", "--quiet", "--workers", "2"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=240,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert dict(read_table(str(tmp_path / "final.db"), "word_counts")) == dict(expected_counts(repeat=400))


@pytest.mark.timeout(300)
def test_with_checkpoints_timeouts_roll_back_and_the_table_is_exact(tmp_path: Path) -> None:
    """A batch that times out rolls the run back to its last checkpoint, as a tuple does."""
    spec = yaml.safe_load((Path(__file__).parent / "test_checkpoints.py").read_text()
                          .split('REPLAYING = """', 1)[1].split('"""', 1)[0])
    spec["config"]["acking.granularity"] = "batch"
    (tmp_path / "replaying.yaml").write_text(yaml.safe_dump(spec))
    proc = subprocess.run([sys.executable, "-m", "topo.cli", "run", "replaying.yaml", "--quiet",
                           "--config", "checkpoint.interval_ms=100", "--config", "message_timeout_s=0.3",
                           "--config", f"checkpoint.dir={tmp_path / 'ck'}"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=240,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests" / "data")])})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "rolling back to the last checkpoint" in proc.stderr      # a batch did time out
    assert dict(read_table(str(tmp_path / "wordcount.db"), "word_counts")) == dict(expected_counts(repeat=300))
