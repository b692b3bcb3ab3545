"""Stepwise backpressure end to end on the local engine, real clock, small marks.

1. A spout offering 20,000 tuples/s into a bolt that manages 5,000/s: the bolt's
   queue never passes the hard bound, the spout's rate steps down, no tuple is
   lost; once the bolt speeds up the spout climbs back to exactly ``originv``
   (limiter off) and every backpressure flag clears. Run on both coordinators.
2. The document's claim against stopping the source: a slow bolt throttles only its
   *direct* upstream. spout -> relay -> slow and spout -> fast: while ``slow`` is
   overloaded the relay is stepped down, the spout is not, and the ``fast`` branch
   keeps the spout's full rate. (The steps would reach the spout only if the
   overload lasted long enough to fill the relay's own queue to the high mark;
   that is the "stepwise" of the title. The relay makes its tuples 100x larger, so
   the slow bolt's queue is the one that fills.)
"""
from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any, AsyncIterator

import pytest

from backpressure.policy.stepwise import StepwiseParams
from backpressure.drivers.stepwise import StepwiseFlowControl
from coord_backends import Backend, backend, until, zookeeper  # noqa: F401
from runtime.local.engine import LocalEngine
from topo.api import Bolt, Spout, Tuple
from topo.config import resolve
from topo.topology import TopologyBuilder

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]


class Shared:
    """Per-task copies of a component share one of these (the engine deep-copies components)."""

    def __deepcopy__(self, memo: dict) -> "Shared":
        return self


class Box(Shared):
    def __init__(self) -> None:
        self.emitted = 0
        self.seen: dict[str, set[int]] = {}
        self.rate: dict[str, float | None] = {}


class Offered(Spout):
    """Offers ``rate`` tuples/s on a schedule: a source, not a backlog. When throttled it
    generates fewer (it never builds more than one call's worth of catch-up)."""

    outputs = ["n", "pad"]

    def __init__(self, box: Box, rate: float, pad: int = 100) -> None:
        self.box, self.rate, self.pad = box, rate, "x" * pad
        self.t0: float | None = None

    async def next_tuple(self) -> None:
        now = time.monotonic()
        if self.t0 is None:
            self.t0 = now
        due = int((now - self.t0) * self.rate) - self.box.emitted
        if due <= 0:
            await asyncio.sleep(0.001)
            return
        if due > 256:
            self.t0 = now - (self.box.emitted + 256) / self.rate
            due = 256
        for _ in range(due):
            self.collector.emit([self.box.emitted, self.pad])
            self.box.emitted += 1


class Paced(Bolt):
    """Handles at most ``box.rate[name]`` tuples/s (None: as fast as it can); records what it saw."""

    outputs = ["n", "pad"]

    def __init__(self, box: Box, name: str, forward_pad: int = 0) -> None:
        self.box, self.name = box, name
        self.forward = "y" * forward_pad if forward_pad else None
        self.n = 0

    async def execute(self, tup: Tuple) -> None:
        self.box.seen.setdefault(self.name, set()).add(tup[0])
        if self.forward is not None:
            self.collector.emit([tup[0], self.forward])
        self.n += 1
        rate = self.box.rate.get(self.name)
        if rate and self.n % 50 == 0:
            await asyncio.sleep(50 / rate)


def config(**over: Any) -> dict[str, Any]:
    base = {"queue.high_mark": "400KB", "queue.low_mark": "40KB", "queue.hard_bound": "800KB",
            "backpressure.sensitivity_ms": 250, "backpressure.step": 0.5, "drain_timeout_s": 30}
    base.update(over)
    return resolve(base)


def flow_for(backend: Backend, cfg: dict[str, Any], name: str) -> StepwiseFlowControl:
    return StepwiseFlowControl(StepwiseParams.from_config(cfg), backend.coordinator(name))


class Monitor:
    """Samples queue bytes and rate state every millisecond while the topology runs."""

    def __init__(self, engine: LocalEngine) -> None:
        self.engine = engine
        self.by_component = {t.component: t for t in engine.tasks}
        self.max_queue: dict[str, int] = {}
        self.max_k: dict[str, int] = {}
        self.min_limit: dict[str, float] = {}

    async def run(self) -> None:
        while True:
            for name, t in self.by_component.items():
                if t.queue is not None:
                    self.max_queue[name] = max(self.max_queue.get(name, 0), t.queue.bytes)
                self.max_k[name] = max(self.max_k.get(name, 0), t.stats.k)
                if t.stats.rate_limit is not None:
                    self.min_limit[name] = min(self.min_limit.get(name, float("inf")), t.stats.rate_limit)
            await asyncio.sleep(0.001)


@contextlib.asynccontextmanager
async def monitored(engine: LocalEngine) -> AsyncIterator[Monitor]:
    """Run ``engine`` under a ``Monitor``; on exit stop it and wait for the drain."""
    mon = Monitor(engine)
    watcher = asyncio.create_task(mon.run())
    run = asyncio.create_task(engine.run())
    try:
        yield mon
    finally:
        engine.request_stop()
        await asyncio.wait_for(run, 60)
        watcher.cancel()


def spout_into_slow_bolt(backend: Backend, name: str) -> tuple[Box, dict[str, Any], StepwiseFlowControl, LocalEngine]:
    """spout (offers 20,000/s) -> slow (manages 5,000/s until ``box.rate["slow"]`` changes)."""
    box = Box()
    box.rate["slow"] = 5_000.0
    b = TopologyBuilder(name)
    b.spout("spout", Offered(box, 20_000.0))
    b.bolt("slow", Paced(box, "slow")).shuffle("spout")
    cfg = config()
    fc = flow_for(backend, cfg, name)
    return box, cfg, fc, LocalEngine(b.build(), cfg, flow=fc)


async def test_slow_bolt_steps_the_spout_down_and_back_to_exactly_originv(backend: Backend) -> None:
    box, cfg, fc, engine = spout_into_slow_bolt(backend, "e2e-direct")
    async with monitored(engine) as mon:
        spout, slow = mon.by_component["spout"], mon.by_component["slow"]
        # The slow bolt cannot keep up: the spout is stepped down.
        await until(lambda: spout.stats.k >= 1, 15, what="the spout stepped down")
        originv = fc.throttles[spout.task_id].originv
        assert originv is not None and originv > 0
        assert spout.stats.rate_limit == originv * 0.5 ** spout.stats.k
        await asyncio.sleep(2.0)
        # The bolt speeds up: one step back per light window, to exactly originv, flags clear.
        box.rate["slow"] = None
        await until(lambda: spout.stats.k == 0 and spout.stats.rate_limit is None, 20,
                    what="the spout back to originv, limiter off")
        th = fc.throttles[spout.task_id]
        assert th.k == 0 and not th.backpressure and th.nominal_rate == th.originv
        assert all(not t.stats.backpressure for t in engine.tasks)
        await until(lambda: fc.states.get(spout.task_id) is not None
                    and not fc.states[spout.task_id].backpressure, 5, what="flag cleared in taskstate")
    hard = cfg["queue.hard_bound"]
    assert mon.max_queue["slow"] <= hard, (mon.max_queue, hard)
    assert mon.max_queue["slow"] >= cfg["queue.high_mark"]           # the overload was real
    assert mon.max_k["spout"] >= 1 and mon.min_limit["spout"] < 5_000.0
    # No tuple lost: every number the spout emitted reached the bolt exactly once.
    assert box.emitted > 5_000
    assert box.seen["slow"] == set(range(box.emitted))
    assert slow.stats.executed == box.emitted


async def test_second_branch_keeps_its_throughput_while_one_branch_is_slow() -> None:
    box = Box()
    box.rate["slow"] = 2_000.0
    b = TopologyBuilder("e2e-branches")
    b.spout("spout", Offered(box, 20_000.0, pad=4))
    b.bolt("relay", Paced(box, "relay", forward_pad=1000)).shuffle("spout")
    b.bolt("slow", Paced(box, "slow")).shuffle("relay")
    b.bolt("fast", Paced(box, "fast")).shuffle("spout")
    cfg = config(**{"queue.high_mark": "1MB", "queue.low_mark": "100KB", "queue.hard_bound": "2MB"})
    from backpressure.coordinator.embedded import EmbeddedCoordinator

    fc = StepwiseFlowControl(StepwiseParams.from_config(cfg), EmbeddedCoordinator("e2e-branches"))
    engine = LocalEngine(b.build(), cfg, flow=fc)
    async with monitored(engine) as mon:
        relay, fast = mon.by_component["relay"], mon.by_component["fast"]
        await until(lambda: relay.stats.k >= 1, 15, what="the relay stepped down")
        before = fast.stats.executed
        t0 = time.monotonic()
        await asyncio.sleep(2.0)
        fast_rate = (fast.stats.executed - before) / (time.monotonic() - t0)
        box.rate["slow"] = None
        await until(lambda: relay.stats.k == 0 and relay.stats.rate_limit is None, 20, what="relay released")
    assert mon.max_k["relay"] >= 1
    assert mon.max_k["spout"] == 0, "the source was never throttled"
    print(f"fast branch: {fast_rate:.0f} tuples/s, relay max k {mon.max_k['relay']}")
    assert fast_rate >= 0.8 * 20_000.0, fast_rate
    assert mon.max_queue["slow"] <= cfg["queue.hard_bound"]
    assert mon.max_queue["relay"] < cfg["queue.high_mark"]
    for name in ("relay", "fast", "slow"):
        assert box.seen[name] == set(range(box.emitted)), name


async def test_coordinator_outage_and_session_expiry_mid_run_lose_nothing(backend: Backend) -> None:
    """ZooKeeper stopped (then started again) and the session expired while the topology runs:
    tuples keep flowing at the last rates set, the hard bound holds, nothing is lost, and once
    the coordinator is back the spout still climbs back to originv."""
    box, cfg, fc, engine = spout_into_slow_bolt(backend, "e2e-outage")
    async with monitored(engine) as mon:
        spout, slow = mon.by_component["spout"], mon.by_component["slow"]
        await until(lambda: spout.stats.k >= 1, 15, what="the spout stepped down")
        await backend.outage_begin()
        before = box.emitted, slow.stats.executed
        await asyncio.sleep(1.5)
        assert box.emitted > before[0] and slow.stats.executed > before[1], "tuples stopped during the outage"
        await backend.outage_end()
        await until(lambda: fc.coordinator.counters["resyncs"] >= 1, 20, what="resynced after the outage")
        await backend.expire(fc.coordinator)
        before = box.emitted
        await asyncio.sleep(1.0)
        assert box.emitted > before, "tuples stopped after the session expired"
        await until(lambda: fc.coordinator.counters["resyncs"] >= 2, 20, what="resynced after the expiry")
        box.rate["slow"] = None
        await until(lambda: spout.stats.k == 0 and spout.stats.rate_limit is None, 30,
                    what="the spout back to originv after the outage")
        assert not any(t.stats.backpressure for t in engine.tasks)
    assert mon.max_queue["slow"] <= cfg["queue.hard_bound"]
    assert box.seen["slow"] == set(range(box.emitted))
