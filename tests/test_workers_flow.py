"""source_stop and watermark across worker processes, on the served embedded coordinator and
on a real ZooKeeper: the no-loss slow-stage scenario with the spout on worker 0 and the slow
bolt on worker 1. The spout is throttled (source_stop: stopped; watermark: slowed by the
topology master) by a bolt in another process, the slow bolt's queue stays under its hard
bound, nothing is lost, and the spout is released while it still has tuples to emit (its
task records how far it had got when its limiter went off).

The run is watched the way the console watches it: a service beside the supervisor reads
every task of every worker (``WorkersView``), which the supervisor refreshes every 0.1 s."""
from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import pytest

from topo.config import resolve
from topo.topology import TopologyBuilder
from runtime.local.workers import run_workers

sys.path.insert(0, str(Path(__file__).parent / "data"))
from worker_slow import Padded, SlowThenFast  # noqa: E402
from zk_server import zookeeper  # noqa: E402,F401  (the session fixture)

pytestmark = pytest.mark.timeout(300)

TOTAL, SLOW_FOR = 20000, 4000
_POLICY: dict[str, dict[str, Any]] = {
    "source_stop": {"backpressure.policy": "source_stop", "backpressure.source_stop.stop_rate": 200},
    "watermark": {"backpressure.policy": "watermark", "backpressure.water_mark.high": 0.25,
                  "backpressure.water_mark.low": 0.03, "backpressure.water_mark.check_interval_ms": 250},
}


class Watcher:
    """A service, as the console is one: samples every task of every worker."""

    def __init__(self) -> None:
        self.max_queue = 0
        self.throttled_at: int | None = None      # spout's emitted count when first seen throttled
        self._task: asyncio.Task[None] | None = None
        self.view: Any = None

    async def start(self, view: Any) -> None:
        self.view = view
        self._task = asyncio.create_task(self._loop())

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(0.02)
            records = {r["component"]: r for r in (s.snapshot() for s in self.view.stats)}
            if "numbers" not in records or "slow" not in records:
                continue
            spout, slow = records["numbers"], records["slow"]
            self.max_queue = max(self.max_queue, slow["queue_bytes"])
            if spout["backpressure"] and spout["rate"] is not None and self.throttled_at is None:
                self.throttled_at = spout["emitted"]

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)


@pytest.mark.parametrize("coordinator", ["embedded", pytest.param("zookeeper", marks=pytest.mark.zookeeper)])
@pytest.mark.parametrize("policy", ["source_stop", "watermark"])
def test_a_slow_bolt_in_another_worker_throttles_the_spout_nothing_lost_then_releases(
        request: pytest.FixtureRequest, policy: str, coordinator: str) -> None:
    where = (request.getfixturevalue("zookeeper").url("/topo-workers-flow") if coordinator == "zookeeper"
             else "embedded")
    b = TopologyBuilder(f"flow-{policy.replace('_', '-')}", {
        "acking": True, "max_spout_pending": 20000, "batch.size": 16, "queue.hard_bound": "1MB", "queue.high_mark": "256KB", "queue.low_mark": "32KB", "coordinator": where,
        **_POLICY[policy]})
    b.spout("numbers", Padded(TOTAL, 200))                              # task 1: worker 0
    b.bolt("slow", SlowThenFast(0.001, SLOW_FOR)).shuffle("numbers")   # task 2: worker 1
    topology = b.build()
    cfg = resolve(topology.config, {})
    watcher = Watcher()
    result = run_workers(topology, cfg, workers=2, services=[watcher])
    spout = next(s for s in result.stats if s.component == "numbers")
    slow = next(s for s in result.stats if s.component == "slow")
    # Told by worker 1's bolt, obeyed by worker 0's spout, and released:
    assert slow.signals_sent.get("BACKPRESSURE", 0) >= 1
    assert spout.signals_received.get("BACKPRESSURE", 0) >= 1
    assert spout.signals_received.get("RELEASE", 0) >= 1
    assert watcher.throttled_at is not None, "the spout was never seen throttled"
    # The release is recorded by the spout's task itself: a watcher refreshed every 0.1 s can
    # miss a release that comes shortly before a fast spout's last tuple.
    assert spout.emitted_at_first_release is not None and spout.emitted_at_first_release < TOTAL, \
        f"the spout was not released while it still had tuples to emit ({spout.emitted_at_first_release})"
    assert spout.rate_limit is None and not spout.backpressure
    # The bound held, and the overload was real:
    assert cfg["queue.hard_bound"] >= watcher.max_queue >= (
        cfg["queue.high_mark"] if policy == "source_stop" else 0.25 * cfg["queue.hard_bound"]), watcher.max_queue
    # Nothing lost, nothing twice:
    assert spout.acked == TOTAL and spout.failed == 0 and slow.executed == TOTAL
