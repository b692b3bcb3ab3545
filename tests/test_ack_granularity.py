"""``acking.granularity: batch`` (Trident's granularity): one tuple tree per spout batch and one
ledger edge per group of tuples, with the guarantees of per-tuple acking: every spout tuple
acked exactly once when its batch's tree completes, a failure or a timeout replays the whole
batch, nothing is lost, in one process and across worker processes."""
from __future__ import annotations

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
from runtime.local.acker import Acker, AckGroup, new_group
from runtime.local.collectors import BoltCollector
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
    g = new_group()
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
    g = new_group()
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
    g1, g2 = new_group(), new_group()
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
    g1, g2 = new_group(), new_group()
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
    g = new_group()
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


def test_an_auto_anchored_emit_under_tuple_granularity_gives_each_tuple_its_own_edge_on_every_root() -> None:
    """A bolt's emit anchored to the input it executes: one new edge per tuple, on each root
    of its parent, XORed into the parent's cell; acking the parent, then the children,
    completes both trees. The other emits (named anchors, another stream, a wrong field
    count) keep their rules."""
    seen, owner = _outcomes()
    acker = Acker(30.0)
    lanes = {7: ByteQueue(1 << 20), 8: ByteQueue(1 << 20)}
    outbox = Outbox("split", 3, {"default": StreamRoutes(FieldIndex.of(["word"]),
                                                         [Router([7, 8], lambda values: len(values[0]) % 2)])},
                    lanes, 10_000, 1.0)
    collector = BoltCollector(outbox, acker=acker, stats=TaskStats("t", "split", 3, False), auto_anchor=True,
                              getrandbits=random.Random(5).getrandbits, batches=False)
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


def test_ack_group_compares_by_identity() -> None:
    """(``ack_batch`` and ``emit_many`` find one group's tuples with ``list.count``.)"""
    a, b = new_group(), new_group()
    assert isinstance(a, AckGroup) and a != b and a == a and {a: 1, b: 2}[b] == 2
    assert a != [0, 0] and [0, 0] != a and not a == [0, 0]     # not by contents, either side
    assert [a, b, [0, 0], [0], None, a].count(a) == 2


def test_a_group_received_in_two_batches_from_another_worker_shares_one_cell() -> None:
    codec = TupleCodec({"c": {"default": ("n",)}})
    g = new_group()
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
    g1, g2 = new_group(), new_group()
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
        self.grouped.append(isinstance(tup.ackcell, AckGroup))    # type: ignore[attr-defined]
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
