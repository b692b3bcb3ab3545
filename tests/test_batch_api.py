"""The batch API: ``Bolt.execute_batch`` and the collectors' ``emit_many`` keep every guarantee
of the per-tuple API (routing, acking trees, replay of failures, one-line emit errors)."""
from __future__ import annotations

import functools
import operator
import random
from collections import Counter
from typing import Any, Sequence

import pytest

from topo.api import Bolt, EmitError, EndOfStream, FieldIndex, Origin, Repeated, Spout, Tuple, WireTuple
from topo.examples.wordcount import (BatchFinalCountBolt, BatchSplitBolt, SentenceSpout,
                                     expected_counts)
from topo.testing import BoltHarness
from topo.topology import TopologyBuilder
from topo.groupings import Router
from runtime.local.acker import Acker, new_group
from runtime.local.collectors import BoltCollector
from runtime.local.engine import run
from runtime.local.outbox import Outbox, StreamRoutes
from runtime.local.queue import ByteQueue
from runtime.observe.stats import TaskStats

NO_BP = {"backpressure.policy": "none"}


class Numbers(Spout):
    """Emits 0..total-1 in chunks through ``emit_many`` (tracked by the number), then ends;
    records what was acked and failed."""

    outputs = ["n"]

    def __init__(self, total: int, per_call: int = 50) -> None:
        self.total, self.per_call, self.i = total, per_call, 0
        self.acked: list[int] = []
        self.failed: list[int] = []

    def next_tuple(self) -> None:
        if self.i >= self.total:
            raise EndOfStream
        ids = list(range(self.i, min(self.total, self.i + self.per_call)))
        self.collector.emit_many([[n] for n in ids], msg_ids=ids)
        self.i += len(ids)

    def ack(self, msg_id: Any) -> None:
        self.acked.append(msg_id)

    def fail(self, msg_id: Any) -> None:
        self.failed.append(msg_id)


class Counts(BatchFinalCountBolt):
    """The example's batch count, its counts kept where the test reads them."""

    def __init__(self, registry: list[Counter[str]]) -> None:
        super().__init__()
        self.registry = registry

    def prepare(self, context: Any, collector: Any) -> None:
        super().prepare(context, collector)
        self.registry.append(self.counts)

    def __deepcopy__(self, memo: dict) -> "Counts":
        return Counts(self.registry)


@pytest.mark.parametrize("acking", [False, True])
def test_batch_word_count_is_exact_across_tasks(acking: bool) -> None:
    registry: list[Counter[str]] = []
    b = TopologyBuilder("wc-batch", {"acking": acking, **NO_BP})
    b.spout("sentences", SentenceSpout(repeat=300, batch=64), 2)
    b.bolt("split", BatchSplitBolt(), 2).shuffle("sentences")
    b.bolt("count", Counts(registry), 3).fields("split", "word")
    res = run(b.build())
    total: Counter[str] = Counter()
    for c in registry:
        total.update(c)
    assert total == expected_counts(repeat=300)
    assert len(registry) == 3 and all(registry)           # fields routing spread the words
    assert not set.intersection(*(set(c) for c in registry))   # ... each word to one task
    if acking:
        assert res.component_totals()["sentences"]["acked"] == 1500


class BatchFanout(Bolt):
    """Three children per input, all emitted in one ``emit_many`` anchored each to its input
    (``repeated``: the parents given as ``Repeated(tuples, [3, 3, ...])``)."""

    outputs = ["n"]

    def __init__(self, repeated: bool = False) -> None:
        self.repeated = repeated

    def execute_batch(self, tuples: Sequence[Tuple]) -> None:
        values, parents = [], []
        for t in tuples:
            for i in range(3):
                values.append([t.values[0] * 10 + i])
                parents.append(t)
        each = Repeated(tuples, [3] * len(tuples)) if self.repeated else parents
        self.collector.emit_many(values, anchor_each=each)


class FailOnce(Bolt):
    def __init__(self, bad: int) -> None:
        self.bad, self.failed_once = bad, False

    def execute(self, tup: Tuple) -> None:
        if tup.values[0] == self.bad and not self.failed_once:
            self.failed_once = True
            raise RuntimeError("grandchild failed")


@pytest.mark.parametrize("repeated", [False, True])
def test_anchor_each_fails_only_the_tree_of_the_failed_child(repeated: bool) -> None:
    spout = Numbers(40)
    b = TopologyBuilder("tree", {"acking": True, **NO_BP})
    b.spout("nums", lambda: spout)
    b.bolt("fan", BatchFanout(repeated)).shuffle("nums")
    b.bolt("leaf", FailOnce(bad=172)).shuffle("fan")     # a grandchild of root 17
    run(b.build())
    assert spout.failed == [17]
    assert sorted(spout.acked) == list(range(40))


class FailFirstBatch(Bolt):
    """Raises on the first batch it is given; records every number it executed."""

    def __init__(self, seen: Counter[int]) -> None:
        self.seen, self.raised = seen, False

    def execute_batch(self, tuples: Sequence[Tuple]) -> None:
        if not self.raised:
            self.raised = True
            self.first = [t.values[0] for t in tuples]
            raise ValueError("bad batch")
        self.seen.update(t.values[0] for t in tuples)

    def __deepcopy__(self, memo: dict) -> "FailFirstBatch":
        return FailFirstBatch(self.seen)


def test_a_raising_execute_batch_fails_its_whole_batch_and_it_is_replayed() -> None:
    seen: Counter[int] = Counter()
    spout = Numbers(500)
    b = TopologyBuilder("batch-fail", {"acking": True, **NO_BP})
    b.spout("nums", lambda: spout)
    b.bolt("bad", FailFirstBatch(seen)).shuffle("nums")
    res = run(b.build())
    assert sorted(spout.failed) and len(spout.failed) == len(set(spout.failed))
    assert sorted(spout.acked) == list(range(500))
    assert seen == Counter(range(500))       # every number executed once it was replayed
    assert res.component_totals()["bad"]["failed"] == len(spout.failed)


class EmitsWrong(Bolt):
    outputs = ["a", "b"]

    def __init__(self, how: str) -> None:
        self.how = how

    def execute_batch(self, tuples: Sequence[Tuple]) -> None:
        if self.how == "arity":
            self.collector.emit_many([[1, 2], [3]])
        elif self.how == "stream":
            self.collector.emit_many([[1, 2]], "nope")
        else:
            self.collector.emit_many([[1, 2], [3, 4]], anchor_each=list(tuples[:1]))


@pytest.mark.parametrize("how, words", [("arity", ["emitted 1 values", "'b'"]),
                                        ("stream", ["'nope'", "does not declare"]),
                                        ("each", ["2 values and 1 anchor_each"])])
@pytest.mark.parametrize("acking", [False, True])
def test_emit_many_mistakes_stop_the_run_with_one_line_naming_the_component(how: str, words: list[str],
                                                                            acking: bool) -> None:
    b = TopologyBuilder("wrong", {"acking": acking, **NO_BP})
    b.spout("nums", lambda: Numbers(10))
    b.bolt("wrong", EmitsWrong(how)).shuffle("nums")
    b.bolt("sink", FailOnce(bad=-1)).shuffle("wrong")
    with pytest.raises(EmitError) as e:
        run(b.build())
    msg = str(e.value)
    assert "'wrong'" in msg and "\n" not in msg and all(w in msg for w in words)


def test_spout_emit_many_with_mismatched_msg_ids_is_an_emit_error() -> None:
    class Mismatched(Numbers):
        def next_tuple(self) -> None:
            self.collector.emit_many([[1], [2]], msg_ids=[1])

    b = TopologyBuilder("mismatch", {"acking": True, **NO_BP})
    b.spout("nums", lambda: Mismatched(10))
    b.bolt("sink", FailOnce(bad=-1)).shuffle("nums")
    with pytest.raises(EmitError, match="'nums' called emit_many with 2 values and 1 msg_ids"):
        run(b.build())


def test_the_harness_runs_a_batch_bolt_one_tuple_at_a_time() -> None:
    h = BoltHarness(BatchSplitBolt(), ["sentence"])
    out = h.feed(["The cow"])
    assert [list(e.values) for e in out] == [["the"], ["cow"]]
    assert [e.anchors for e in out] == [(h.fed[0],), (h.fed[0],)]
    assert h.acked == h.fed


def test_fields_routing_of_a_whole_list_is_the_per_tuple_rule_for_every_key_type() -> None:
    """The router remembers string keys only: 1, 1.0 and True are equal dict keys, and each
    must still go where its own encoding sends it."""

    from topo.groupings import FieldsGrouping, fields_task_index

    router = FieldsGrouping("k").router([7, 8, 9, 10, 11], FieldIndex.of(["k", "v"]), rng=random.Random(0))
    keys: list[Any] = [f"w{i}" for i in range(300)] + [1, 1.0, True, 2, 2.5, False, 0, b"x", None]
    values_list = [[k, i] for i, k in enumerate(keys * 2)]
    want = [fields_task_index([v[0]], 5) for v in values_list]
    assert list(router.select_many(values_list)) == want      # the first pass fills the memo
    assert list(router.select_many(values_list)) == want      # the second reads it
    assert [router.select(v) for v in values_list] == want
    assert len(set(want)) == 5
    # The same rows given as columns: read from the key's column, the same targets.
    from topo.api import Columns
    fresh = FieldsGrouping("k").router([7, 8, 9, 10, 11], FieldIndex.of(["k", "v"]), rng=random.Random(0))
    columns = Columns([v[0] for v in values_list], [v[1] for v in values_list])
    assert list(fresh.select_many(columns)) == want            # not all strings: one by one
    words = Columns([v[0] for v in values_list[:300]], [v[1] for v in values_list[:300]])
    assert list(fresh.select_many(words)) == want[:300]        # strings, remembered: from the column
    by_key = FieldsGrouping("v").router([7, 8], FieldIndex.of(["k", "v"]), rng=random.Random(0))
    assert list(by_key.select_many(columns)) == [fields_task_index([v[1]], 2) for v in values_list]


def test_repeated_reads_as_the_sequence_it_stands_for() -> None:
    r = Repeated(["a", "b", "c"], [2, 0, 3])
    assert len(r) == 5 and list(r) == ["a", "a", "c", "c", "c"]
    assert [r[i] for i in range(5)] == list(r) and r[-1] == "c" and r[1:4] == ["a", "c", "c"]
    assert r.present() == ["a", "c"]
    with pytest.raises(IndexError):
        r[5]
    with pytest.raises(ValueError, match="2 items and 1 counts"):
        Repeated(["a", "b"], [1])
    with pytest.raises(ValueError, match="a count is negative"):
        Repeated(["a"], [-1])


def test_repeated_parents_under_batch_granularity_cost_one_group_per_lane_and_mixed_ones_fall_back() -> None:
    """Parents of one ack group: one lane group under it, whatever the number of values; parents
    of two groups: each values joins a group under its own parent, as a plain list would."""

    def fan(parents: list[WireTuple], counts: list[int]) -> Outbox:
        outbox = Outbox("fan", 2, {"default": StreamRoutes(FieldIndex.of(["n"]), [Router([7], lambda v: 0)])},
                        {7: ByteQueue(1 << 20)}, 10_000, 1.0)
        collector = BoltCollector(outbox, acker=Acker(30.0), stats=TaskStats("t", "fan", 2, False),
                                  auto_anchor=True, getrandbits=random.Random(3).getrandbits, batches=True)
        collector.emit_many([[i] for i in range(sum(counts))], anchor_each=Repeated(parents, counts))
        return outbox

    spout = Origin(FieldIndex.of(["n"]), "default", "nums", 1)
    g = new_group(0x51)
    one = [WireTuple(([k], spout, {5: 1}, 1.0, g)) for k in range(3)]
    lane = fan(one, [2, 0, 3]).lanes[7]
    (run_,) = lane.runs                                   # one run, one group of five values
    assert len(run_[0]) == 5 and run_[4][1] == 5 and g[0] == next(iter(run_[2].values()))
    g1, g2 = new_group(0x61), new_group(0x62)
    two = [WireTuple(([0], spout, {5: 1}, 1.0, g1)), WireTuple(([1], spout, {6: 1}, 1.0, g2))]
    lane = fan(two, [2, 3]).lanes[7]
    cells = [t.ackcell for t in lane.take()]
    assert cells[0] is cells[1] and cells[2] is cells[3] is cells[4] and cells[0] is not cells[2]
    assert (cells[0][1], cells[2][1]) == (2, 3) and g1[0] != 0 and g2[0] != 0
    three = [two[0], WireTuple(([2], spout, {5: 1}, 1.0, g1)), two[1]]      # two neighbours of one group
    lane = fan(three, [2, 1, 3]).lanes[7]
    cells = [t.ackcell for t in lane.take()]
    assert cells[0] is cells[1] is cells[2] and cells[0][1] == 3 and cells[3] is cells[5] and cells[3][1] == 3


@pytest.mark.parametrize("as_repeated", [True, False])
def test_values_under_many_parents_make_one_group_per_parent_and_lane_as_emitting_each_does(as_repeated: bool) -> None:
    """``emit_many(..., anchor_each=parents)`` where the parents have cells of their own (a
    batch of inputs at tuple granularity) sends what emitting each values under its parent
    sends: per lane, the same values in the same order, one ack group per run of one parent
    (a parent coming back after another starts a new one), each group's edge XORed once
    into its parent's cell; a parent with no roots sends its values untracked. Acking the
    parents and then every tuple completes every tree."""
    spout = Origin(FieldIndex.of(["sentence"]), "default", "sentences", 1)
    runs = [("a", 3), ("b", 0), ("c", 4), ("u", 2), ("a", 2)]          # u: untracked; a comes back

    def send(batched: bool) -> tuple[dict[int, list[Any]], dict[str, int], Acker, list[WireTuple], list[Any]]:
        seen: list[Any] = []
        acker = Acker(30.0)
        parents = {name: WireTuple(([name], spout, None if name == "u" else {ord(name): 0x10 + ord(name)},
                                    float(ord(name)), None if name == "u" else [0])) for name, _ in runs}
        for name, p in parents.items():
            if p.anchors:
                acker.open(ord(name), 0x10 + ord(name), lambda root, ok, why: seen.append((root, ok)), 0.0)
        outbox = Outbox("split", 3, {"default": StreamRoutes(FieldIndex.of(["word"]),
                                                             [Router([7, 8], lambda v: len(v[0]) % 2)])},
                        {7: ByteQueue(1 << 20), 8: ByteQueue(1 << 20)}, 10_000, 1.0)
        collector = BoltCollector(outbox, acker=acker, stats=TaskStats("t", "split", 3, False),
                                  auto_anchor=True, getrandbits=random.Random(3).getrandbits, batches=True)
        words = [[name * (1 + i)] for name, k in runs for i in range(k)]
        each = [parents[name] for name, k in runs for _ in range(k)]
        if not batched:
            for values, p in zip(words, each):
                collector.emit(values, anchors=p)
        else:
            collector.emit_many(words, anchor_each=Repeated([parents[n] for n, _ in runs], [k for _, k in runs])
                                if as_repeated else each)
        lanes = {t: outbox.lanes[t].batch for t in (7, 8)}
        cells = {name: p.ackcell[0] for name, p in parents.items() if p.ackcell}
        return lanes, cells, acker, list(parents.values()), seen

    def shape(lanes: dict[int, list[Any]]) -> list[Any]:
        """Per lane: each tuple's values, roots, birth and the index of its group (by identity)."""
        out = []
        for t in (7, 8):
            ids: dict[int, int] = {}
            out.append([(list(tup.values), None if tup.anchors is None else sorted(tup.anchors), tup.born,
                         None if tup.ackcell is None else (ids.setdefault(id(tup.ackcell), len(ids)), tup.ackcell[1]))
                        for tup in lanes[t]])
        return out

    one_by_one, _, _, _, _ = send(False)
    lanes, cells, acker, parents, seen = send(True)
    assert shape(lanes) == shape(one_by_one)
    groups = {id(t.ackcell): t for t in lanes[7] + lanes[8] if t.ackcell is not None}
    for name in "ac":        # a's two runs: a group per run and lane; each group's edge once in its parent
        mine = [t.ackcell for t in groups.values() if ord(name) in t.anchors]
        assert cells[name] == functools.reduce(operator.xor, (c[2] for c in mine))
        assert all(t.anchors == {ord(name): t.ackcell[2]} for t in groups.values() if ord(name) in t.anchors)
    assert len([t for t in groups.values() if ord("a") in t.anchors]) == 4      # (each of its runs on both lanes)
    assert [t.anchors for t in lanes[7] + lanes[8] if t.values[0].startswith("u")] == [None, None]
    acker.ack_batch([p for p in parents if p.anchors])
    acker.ack_batch(lanes[7] + lanes[8])
    assert sorted(seen) == [(ord("a"), True), (ord("b"), True), (ord("c"), True)] and not acker.ledger


def test_an_empty_emit_many_under_each_parent_sends_nothing() -> None:
    """``emit_many([], anchor_each=[])`` (a batch bolt whose inputs had no words) sends and
    counts nothing, with a plain list as with a ``Repeated``."""
    outbox = Outbox("split", 3, {"default": StreamRoutes(FieldIndex.of(["word"]), [Router([7], lambda v: 0)])},
                    {7: ByteQueue(1 << 20)}, 10_000, 1.0)
    collector = BoltCollector(outbox, acker=Acker(30.0), stats=TaskStats("t", "split", 3, False),
                              auto_anchor=True, getrandbits=random.Random(3).getrandbits, batches=True)
    collector.emit_many([], anchor_each=[])
    collector.emit_many([], anchor_each=Repeated([], []))
    assert collector.emitted == 0 and outbox.pending_count == 0 and outbox.lanes[7].batch == []
