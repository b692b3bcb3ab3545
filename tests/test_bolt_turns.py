"""A bolt task works off what is already queued for it before it yields (``_BOLT_TURN_S``),
so a component that emits more tuples than it reads cannot fill the queues below it."""
from __future__ import annotations

import asyncio
from collections import Counter

import pytest

import runtime.local.tasks as tasks
from runtime.local.engine import LocalEngine
from topo.examples.wordcount import FinalCountBolt, SentenceSpout, SplitBolt, expected_counts
from topo.topology import TopologyBuilder

SENTENCES = 50_000


class _Kept(FinalCountBolt):
    """The example's final count, its counts kept where the test reads them."""

    kept: list[Counter[str]] = []

    def prepare(self, context, collector) -> None:  # type: ignore[no-untyped-def]
        super().prepare(context, collector)
        _Kept.kept.append(self.counts)


def _peak_queued_words(turn_s: float, monkeypatch: pytest.MonkeyPatch) -> int:
    """Word count with two tasks per component in one process; the largest peak (bytes) of a
    count task's queue, the counts checked."""
    monkeypatch.setattr(tasks, "_BOLT_TURN_S", turn_s)
    _Kept.kept = []
    b = TopologyBuilder("turns", {"acking": False, "backpressure.policy": "none"})
    b.spout("sentences", SentenceSpout(repeat=SENTENCES // 5), parallelism=2)
    b.bolt("split", SplitBolt(), parallelism=2).shuffle("sentences")
    b.bolt("count", _Kept(), parallelism=2).fields("split", "word")
    engine = LocalEngine(b.build())
    asyncio.run(engine.run())
    total: Counter[str] = Counter()
    for c in _Kept.kept:
        total.update(c)
    assert total == expected_counts(repeat=SENTENCES // 5)
    return max(t.queue.peak_bytes for t in engine.bolt_tasks if t.component == "count")


def test_a_bolt_works_off_its_queue_so_the_queues_below_a_split_stay_short(monkeypatch: pytest.MonkeyPatch) -> None:
    # A turn long enough that the load of the machine cannot cut it: every batch queued
    # for a task is executed before it yields.
    drained = _peak_queued_words(60.0, monkeypatch)
    # One batch per turn (the rule before): the splits' output piles up under the counts.
    one_batch = _peak_queued_words(0.0, monkeypatch)
    assert drained * 10 < one_batch, (drained, one_batch)
    assert drained < 64 * 1024       # a few batches of words, where one batch per turn held megabytes
