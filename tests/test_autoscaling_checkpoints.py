"""Autoscaling with checkpoints: keyed state moves with its checkpoint.

A restore gives each task the state of its index. In one process the restored engine
has the topology's parallelism again, so the keyed state of a task autoscaling had
added (an index past the current tasks) goes to its keys' owners, and every key to its
group's owner now. Across workers the checkpoint keeps the tasks as they were
(``placement.Layout``), and a rollback starts every worker from them. Either way the
final counts are exact.
"""
from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import pytest

from coord_backends import until
from runtime.local.engine import LocalEngine
from test_autoscaling import OffsetWords, adaptive, keyed_totals, truth as words_truth
from test_autoscaling import Count
from test_backpressure_e2e import Shared
from topo.api import Tuple
from test_autoscaling_workers import Running, _topology
from topo.sinks import read_table
from topo.topology import TopologyBuilder

sys.path.insert(0, str(Path(__file__).parent / "data"))
from autoscaling_components import HeldPacedWords, truth  # noqa: E402

pytestmark = [pytest.mark.timeout(240)]


class Release(Shared):
    """Closed until the test opens it (shared by every copy of the spout)."""

    def __init__(self) -> None:
        self.opened = False


class HeldOffsetWords(OffsetWords):
    """``OffsetWords`` that emit nothing past ``hold_at`` until ``release`` is opened: a run
    cannot reach the end of its input while the test still waits for checkpoints, however
    slow the machine (the spout then idles at a call boundary, where checkpoints take it)."""

    def __init__(self, n: int, hold_at: int, release: Release) -> None:
        super().__init__(n)
        self.hold_at, self.release = hold_at, release

    async def next_tuple(self) -> None:
        if self.i >= self.hold_at and not self.release.opened:
            await asyncio.sleep(0.005)
            return
        await super().next_tuple()


async def test_an_added_tasks_keyed_state_comes_back_from_a_checkpoint_with_fewer_tasks(tmp_path: Path) -> None:
    n = 40_000
    release = Release()
    b = TopologyBuilder("scale-checkpoint-restore")
    b.spout("src", HeldOffsetWords(n, hold_at=30_000, release=release))
    b.bolt("count", Count(), parallelism=2).fields("src", "word")
    topology = b.build()
    cfg = adaptive(acking=True, **{"checkpoint.interval_ms": 200, "checkpoint.dir": str(tmp_path)})
    first = LocalEngine(topology, cfg)
    run = asyncio.create_task(first.run())
    count_tasks = lambda: [t for t in first.bolt_tasks if t.component == "count"]   # noqa: E731
    await until(lambda: sum(t.stats.executed for t in count_tasks()) > 5_000, 30, what="traffic")
    added = None
    for _ in range(100):            # None: a checkpoint was draining the topology; try again
        added = await first.add_task("count")
        if added is not None:
            break
        await asyncio.sleep(0.01)
    assert added is not None, "add_task declined 100 times in a row"
    cp = first.checkpointer
    assert cp is not None
    after = cp.stats.completed
    await until(lambda: added.stats.executed > 1_000 and cp.stats.completed > after + 1, 30,
                what="the added task counting, and a checkpoint with its state")
    first.request_stop()
    await asyncio.wait_for(run, 60)
    _, holder = keyed_totals(first, "count")
    assert added.task_id in holder.values(), "the added task held no key at the last checkpoint"
    offset = first.spout_tasks[0].spout.i        # type: ignore[attr-defined]
    assert offset <= 30_000 < n, "the spout ran past its hold: nothing left to restore into"

    release.opened = True
    second = LocalEngine(topology, cfg)          # the topology's 2 counting tasks again
    assert second.task_ids["count"] == [2, 3]
    await asyncio.wait_for(second.run(), 60)
    totals, _ = keyed_totals(second, "count")
    assert totals == words_truth(n), "keyed state of the added task was lost (or counted twice) by the restore"


class Gate(Shared):
    """Open unless the test closes it; the counting tasks wait at it (shared by every copy)."""

    def __init__(self) -> None:
        self.open: asyncio.Event | None = None

    def event(self) -> asyncio.Event:
        if self.open is None:
            self.open = asyncio.Event()
            self.open.set()
        return self.open


class GatedCount(Count):
    def __init__(self, gate: Gate) -> None:
        super().__init__()
        self.gate = gate

    async def execute(self, tup: Tuple) -> None:   # type: ignore[override]
        await self.gate.event().wait()
        await super().execute(tup)


async def test_a_checkpoint_that_ends_inside_a_rescales_drain_leaves_the_spouts_held(tmp_path: Path) -> None:
    """The spouts are held by whoever drains: a checkpoint finishing first must not let them
    emit (to the old key owners) while the rescale still waits for its drain."""
    gate = Gate()
    b = TopologyBuilder("scale-under-checkpoint")
    b.spout("src", OffsetWords(1_000_000))
    b.bolt("count", GatedCount(gate), parallelism=2).fields("src", "word")
    cfg = adaptive(acking=True, drain_timeout_s=3,
                   **{"checkpoint.interval_ms": 600_000, "checkpoint.dir": str(tmp_path)})
    engine = LocalEngine(b.build(), cfg)
    run = asyncio.create_task(engine.run())
    spout = engine.spout_tasks[0]
    counting = [t for t in engine.bolt_tasks if t.component == "count"]
    await until(lambda: sum(t.stats.executed for t in counting) > 1_000, 30, what="traffic")
    gate.event().clear()
    await until(lambda: any(not t.waiting for t in counting), 10, what="a counting task held at the gate")
    started: list[int] = []
    start_task = engine._start_task

    def starting(component: str) -> object:
        started.append(spout.stats.emitted)
        return start_task(component)

    engine._start_task = starting  # type: ignore[method-assign]
    add = asyncio.create_task(engine.add_task("count"))
    await until(lambda: engine.run_state.paused and spout.holding, 10, what="the rescale holding the spouts")
    cp = engine.checkpointer
    assert cp is not None
    take = asyncio.create_task(cp.take())
    await asyncio.sleep(0.05)
    held_at = spout.stats.emitted
    gate.event().set()
    assert await take, "the checkpoint did not complete"
    added = await add
    assert added is not None, "the rescale's drain never settled: the spouts ran on after the checkpoint"
    assert started == [held_at], "the spouts emitted between the checkpoint's end and the key move"
    engine.request_stop()
    await asyncio.wait_for(run, 60)


def test_across_workers_a_rollback_after_a_keyed_rescale_restores_the_tasks_it_checkpointed(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    n = 40_000
    db = str(tmp_path / "counts.db")
    release = tmp_path / "release"       # the spout holds at 30,000 until it exists
    run = Running(_topology("autoscale-workers-checkpoints", n, db, "embedded",
                            HeldPacedWords(n, hold_at=30_000, release=str(release)),
                            **{"checkpoint.interval_ms": 300, "checkpoint.dir": str(tmp_path)}))
    run.until(lambda: sum(run.executed("count").values()) > 3_000, 60, "the counts under way")
    out = run.rescale("add")
    assert out.task == 5, out
    at_add = run.sup.last_checkpoint
    run.until(lambda: run.sup.last_checkpoint > at_add + 1 and run.executed("count").get(5, 0) > 500, 60,
              "a checkpoint with the third task's state")
    release.touch()                               # the rolled-back run goes on to the end
    w = run.sup.procs[1]                          # tasks 2 and 5
    os.kill(w.process.pid, signal.SIGKILL)
    result = run.join()
    layout = run.sup.layout
    assert layout is not None and layout.task_ids["count"] == [2, 3, 5], "the rollback lost the added task"
    assert any("every worker rolls back to checkpoint" in r.getMessage() for r in caplog.records), \
        "worker 1's death did not roll the topology back"
    src = result.component_totals()["src"]
    assert dict(read_table(db, "counts")) == truth(n), f"a count is off after the rollback ({src})"
