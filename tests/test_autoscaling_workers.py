"""Autoscaling across worker processes (document 004's added parallel task, ``workers: 2``).

A keyed count (fields grouping into a ``KeyedBolt``) spread over two workers is scaled
from 2 to 3 tasks under load and back: the supervisor places the new task, every
worker's routers switch together, the key groups move between the processes with their
state, and the final counts (each word's count emitted once, at the end of the input,
by whichever task then holds it) are exact, on the served embedded coordinator and on a
real ZooKeeper. A worker killed with -9 in the middle of a rescale loses no tuple
(acking replays what it held), whether the rescale was abandoned or already committed,
and the restarted worker is built from the tasks as they then stand.
"""
from __future__ import annotations

import os
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

import pytest

from topo.config import resolve
from topo.sinks import SQLiteSink, read_table
from topo.topology import TopologyBuilder
from runtime.local.engine import RunResult
from runtime.local.workers import Supervisor

sys.path.insert(0, str(Path(__file__).parent / "data"))
from autoscaling_components import (FinalKeyedCount, HeldPacedWords, PacedWords, ScheduledWords,  # noqa: E402
                                   SlowThenFastCount, SlowWhileFileCount, truth)
from zk_server import zookeeper  # noqa: E402,F401  (the session fixture)

pytestmark = pytest.mark.timeout(300)


def _topology(name: str, n: int, db: str, where: str, spout: Any = None, count: Any = None, **over: Any) -> Any:
    # A backpressure window so long that no mark is raised: the drivers ask for nothing
    # themselves, the test asks the supervisor (as a worker's driver would).
    b = TopologyBuilder(name, {
        "acking": True, "backpressure.policy": "adaptive", "backpressure.adaptive.window_ms": 600_000,
        "backpressure.adaptive.max_parallelism": 4, "coordinator": where, "queue.hard_bound": "256KB",
        "queue.high_mark": "128KB", "queue.low_mark": "16KB", **over})
    b.spout("src", spout if spout is not None else PacedWords(n))            # task 1: worker 0
    b.bolt("count", count if count is not None else FinalKeyedCount(),
           parallelism=2).fields("src", "word")                              # tasks 2, 3: workers 1, 0
    b.bolt("sink", SQLiteSink(db, "counts", ["word", "count"], ["word"])).shuffle("count")   # task 4: worker 0
    return b.build()


class Running:
    """A supervisor of 2 workers running in a thread, as ``run_workers`` runs one."""

    def __init__(self, topology: Any, on_phase: Callable[[str, str], None] | None = None) -> None:
        cfg = resolve(topology.config, {})
        self._dir = tempfile.TemporaryDirectory(prefix="topo-autoscale-")
        self.sup = Supervisor(topology, cfg, 2, self._dir.name, want_records=True, on_phase=on_phase)
        self.result: RunResult | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.sup.start()
            self.result = self.sup.supervise(None)
        except BaseException as e:      # the test thread re-raises it
            self.error = e
        finally:
            self.sup.stop_all()
            self._dir.cleanup()

    def executed(self, component: str) -> dict[int, int]:
        """Each task of ``component`` as its worker last reported it: executed count."""
        return {r["task"]: r["executed"] for rs in list(self.sup.records.values()) for r in rs
                if r["component"] == component}

    def emitted(self) -> int:
        return sum(r["emitted"] for rs in list(self.sup.records.values()) for r in rs if r["component"] == "src")

    def until(self, cond: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not cond():
            if self.error is not None:
                raise self.error
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout}s waiting for {what}")
            time.sleep(0.02)

    def rescale(self, kind: str) -> Any:
        done = len(self.sup.rescales)
        self.sup.request_scale("count", kind)
        self.until(lambda: len(self.sup.rescales) > done, 60, f"the {kind} to be carried out")
        return self.sup.rescales[done]

    def join(self) -> RunResult:
        self.thread.join(240)
        if self.error is not None:
            raise self.error
        assert self.result is not None, "the run did not finish"
        return self.result


@pytest.mark.parametrize("coordinator", ["embedded", pytest.param("zookeeper", marks=pytest.mark.zookeeper)])
def test_a_keyed_count_scaled_2_to_3_and_back_across_two_workers_counts_exactly(
        request: pytest.FixtureRequest, tmp_path: Path, coordinator: str) -> None:
    where = (request.getfixturevalue("zookeeper").url("/topo-autoscale-workers") if coordinator == "zookeeper"
             else "embedded")
    n = 60_000
    db = str(tmp_path / "counts.db")
    release = tmp_path / "release"       # the spout holds at 50,000 until it exists: still under load
    run = Running(_topology(f"autoscale-workers-{coordinator}", n, db, where,
                            HeldPacedWords(n, hold_at=50_000, release=str(release))))
    run.until(lambda: sum(run.executed("count").values()) > 4_000, 60, "the counts under way")
    out = run.rescale("add")
    assert (out.kind, out.task, out.tasks_after) == ("add", 5, 3), out
    layout = run.sup.layout
    assert layout is not None and layout.task_ids["count"] == [2, 3, 5]
    assert layout.owner[5] == 1, "the new task goes to the worker with fewer tasks (worker 0 has 3)"
    owners = layout.key_owners["count"]
    assert sorted({owners.count(t) for t in (2, 3, 5)}) in ([341, 342], [341]), "key groups not spread evenly"
    run.until(lambda: run.executed("count").get(5, 0) > 1_000, 60, "the new task counting")
    assert run.emitted() < n, "the spout ran out before the scale in: not under load"
    back = run.rescale("remove")
    assert (back.kind, back.task, back.tasks_after) == ("remove", 5, 2), back
    assert layout.task_ids["count"] == [2, 3]
    release.touch()
    result = run.join()
    totals = result.component_totals()
    assert totals["src"]["acked"] == n and not totals["src"]["failed"], totals["src"]
    assert totals["count"]["executed"] == n, "a word was counted twice or not at all"
    assert dict(read_table(db, "counts")) == truth(n), "a count is off: keyed state did not move with its key group"
    print(f"{coordinator}: spouts held {out.paused_ms:.0f} ms to add task 5, {back.paused_ms:.0f} ms to remove it")


@pytest.mark.parametrize("phase", ["fence", "commit"])
def test_a_worker_killed_mid_rescale_loses_no_tuple(tmp_path: Path, phase: str) -> None:
    """Killed as the rescale begins, with tuples queued at its counting task (the rescale is
    abandoned: nothing moved; what it held is replayed) or right after the commit (the
    rescale goes on; the worker comes back with the new task)."""
    n = 40_000
    kills: list[int] = []
    run: Running | None = None
    slow = tmp_path / "slow"            # the counting tasks take 1,000 words/s each while it exists
    slow.touch()

    def kill_worker_1(at: str, component: str) -> None:
        if at == phase and not kills and run is not None:
            w = run.sup.procs[1]
            kills.append(w.process.pid)
            os.kill(w.process.pid, signal.SIGKILL)
            w.process.join(10)
            slow.unlink()

    # In "fence" the counting tasks are slower than the spout until the kill, so worker 1's
    # queue is full when it dies, however late the kill comes on a loaded machine (with
    # counting at full speed, a spout already held at 30,000 left nothing to replay).
    release = tmp_path / "release"       # the spout holds at 30,000 until it exists
    count = SlowWhileFileCount(1000.0, str(slow)) if phase == "fence" else None
    run = Running(_topology(f"autoscale-kill-{phase}", n, str(tmp_path / "c.db"), "embedded",
                            HeldPacedWords(n, hold_at=30_000, release=str(release)), count=count,
                            message_timeout_s=3),
                  on_phase=kill_worker_1)
    run.until(lambda: sum(run.executed("count").values()) > 1_500, 60, "the counts under way")   # type: ignore
    out = run.rescale("add")
    assert kills, "worker 1 was not killed"
    layout = run.sup.layout
    assert layout is not None
    if phase == "fence":
        assert out.task is None and "gone" in out.why, out
        assert layout.task_ids["count"] == [2, 3]
        run.until(lambda: run.sup.procs[1].process.is_alive() and run.sup.procs[1].restarts == 1, 30,
                  "worker 1 restarted")
        again = run.rescale("add")      # the restarted worker takes part in the next one
        assert again.task is not None, again
    else:
        assert out.task == 5 and layout.task_ids["count"] == [2, 3, 5], out
    run.until(lambda: run.executed("count").get(layout.task_ids["count"][-1], 0) > 200, 60,
              "the added task counting (in the restarted worker)")
    release.touch()
    result = run.join()
    src = result.component_totals()["src"]
    assert src["acked"] == n, f"tuples lost: {n - src['acked']} of {n} never acked ({src})"
    assert not src["dead_lettered"]
    if phase == "fence":
        assert src["replayed"] > 0, "the tuples worker 1 held were not replayed"
    print(f"{phase}: {src['replayed']} replayed, {src['acked']} acked")


@pytest.mark.slow
def test_the_adaptive_driver_scales_a_keyed_count_out_and_back_in_across_workers(tmp_path: Path) -> None:
    """Document 004's rule across workers: the spout's driver (worker 0) sees its coefficient
    at the floor with both counting tasks flagged (one of them in worker 1, through the
    coordinator) and asks the supervisor for a third task; when the load goes away a
    worker's driver asks for it to go. Counts stay exact."""
    now = time.time()
    calm_at, end_at = now + 14, now + 26
    db = str(tmp_path / "counts.db")
    b = TopologyBuilder("autoscale-driver-workers", {
        "acking": True, "backpressure.policy": "adaptive", "queue.high_mark": "50KB", "queue.low_mark": "5KB",
        "queue.hard_bound": "100KB", "backpressure.adaptive.window_ms": 1000, "backpressure.adaptive.samples": 10,
        "backpressure.adaptive.check_interval_ms": 100, "backpressure.adaptive.max_parallelism": 3,
        "backpressure.adaptive.cooldown_ms": 2000, "max_spout_pending": 100_000})
    b.spout("src", ScheduledWords(high=5000.0, low=200.0, calm_at=calm_at, end_at=end_at))
    b.bolt("count", SlowThenFastCount(per_task=400.0, fast_at=calm_at), parallelism=2).fields("src", "word")
    b.bolt("sink", SQLiteSink(db, "counts", ["word", "count"], ["word"])).shuffle("count")
    run = Running(b.build())
    result = run.join()
    kinds = [(r.kind, r.task, r.tasks_after, r.asked_by is not None) for r in run.sup.rescales if r.task is not None]
    assert kinds[:2] == [("add", 5, 3, True), ("remove", 5, 2, True)], run.sup.rescales
    out, back = (r for r in run.sup.rescales if r.task is not None)
    src = result.component_totals()["src"]
    assert not src["failed"] and not src["dead_lettered"], src
    assert dict(read_table(db, "counts")) == truth(src["acked"]), "a count is off across the driver's rescales"
    print(f"driver across workers: add asked by worker {out.asked_by} (spouts held {out.paused_ms:.0f} ms), "
          f"remove asked by worker {back.asked_by}; {src['acked']} words counted exactly")


def test_a_keyed_bolt_under_batch_acking_is_left_unscaled_across_workers_and_refused_under_true(
        tmp_path: Path) -> None:
    """Across workers a keyed rescale sends held tuples one by one by their new owners: it
    would split acking.granularity batch's ack groups. One process drains instead."""
    from runtime.local.engine import scalable_components
    from runtime.local.workers import check_shippable
    from topo.config import ConfigError

    t = _topology("autoscale-batch-acking", 10, str(tmp_path / "c.db"), "embedded",
                  **{"acking.granularity": "batch"})
    cfg = resolve(t.config, {})
    assert scalable_components(t, cfg, across_workers=True) == frozenset({"sink"})
    assert scalable_components(t, cfg) == frozenset({"count", "sink"})
    with pytest.raises(ConfigError, match=r"^config 'backpressure.adaptive.autoscale': bolt 'count' is fed by fields "
                                          r"grouping, and across workers .* split acking.granularity batch's ack groups"):
        check_shippable(t, resolve(t.config, {"backpressure.adaptive.autoscale": True}))
