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
from test_autoscaling_workers import Running, _topology
from topo.sinks import read_table
from topo.topology import TopologyBuilder

sys.path.insert(0, str(Path(__file__).parent / "data"))
from autoscaling_components import truth  # noqa: E402

pytestmark = [pytest.mark.timeout(240)]


async def test_an_added_tasks_keyed_state_comes_back_from_a_checkpoint_with_fewer_tasks(tmp_path: Path) -> None:
    n = 40_000
    b = TopologyBuilder("scale-checkpoint-restore")
    b.spout("src", OffsetWords(n))
    b.bolt("count", Count(), parallelism=2).fields("src", "word")
    topology = b.build()
    cfg = adaptive(acking=True, **{"checkpoint.interval_ms": 200, "checkpoint.dir": str(tmp_path)})
    first = LocalEngine(topology, cfg)
    run = asyncio.create_task(first.run())
    count_tasks = lambda: [t for t in first.bolt_tasks if t.component == "count"]   # noqa: E731
    await until(lambda: sum(t.stats.executed for t in count_tasks()) > 5_000, 30, what="traffic")
    added = await first.add_task("count")
    assert added is not None
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
    assert offset < n, "the spout ran out before the stop: nothing left to restore into"

    second = LocalEngine(topology, cfg)          # the topology's 2 counting tasks again
    assert second.task_ids["count"] == [2, 3]
    await asyncio.wait_for(second.run(), 60)
    totals, _ = keyed_totals(second, "count")
    assert totals == words_truth(n), "keyed state of the added task was lost (or counted twice) by the restore"


def test_across_workers_a_rollback_after_a_keyed_rescale_restores_the_tasks_it_checkpointed(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    n = 40_000
    db = str(tmp_path / "counts.db")
    run = Running(_topology("autoscale-workers-checkpoints", n, db, "embedded",
                            **{"checkpoint.interval_ms": 300, "checkpoint.dir": str(tmp_path)}))
    run.until(lambda: sum(run.executed("count").values()) > 3_000, 60, "the counts under way")
    out = run.rescale("add")
    assert out.task == 5, out
    at_add = run.sup.last_checkpoint
    run.until(lambda: run.sup.last_checkpoint > at_add + 1 and run.executed("count").get(5, 0) > 500, 60,
              "a checkpoint with the third task's state")
    w = run.sup.procs[1]                          # tasks 2 and 5
    os.kill(w.process.pid, signal.SIGKILL)
    result = run.join()
    layout = run.sup.layout
    assert layout is not None and layout.task_ids["count"] == [2, 3, 5], "the rollback lost the added task"
    assert any("every worker rolls back to checkpoint" in r.getMessage() for r in caplog.records), \
        "worker 1's death did not roll the topology back"
    src = result.component_totals()["src"]
    assert dict(read_table(db, "counts")) == truth(n), f"a count is off after the rollback ({src})"
