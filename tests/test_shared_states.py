"""source_stop and watermark when the spout and the bolt are in different processes: two
flow controls, each with its own coordinator on one tree (embedded, and a real ZooKeeper),
fake task handles (``test_stepwise_flow.FakeTask``) and a fake clock for the policies' timing. Signals travel for real."""
from __future__ import annotations

import asyncio
import pytest

from backpressure.drivers.source_stop import SourceStopFlowControl
from backpressure.drivers.watermark import WatermarkFlowControl
from backpressure.policy.source_stop import SourceStopParams
from backpressure.policy.watermark import WaterMarkParams
from coord_backends import Backend, backend, until  # noqa: F401  (the parametrized fixture)
from test_stepwise_flow import FakeTask
from zk_server import zookeeper  # noqa: F401  (the session fixture)

pytestmark = pytest.mark.timeout(60)


async def test_source_stop_a_bolt_in_one_process_stops_and_resumes_a_spout_in_another(backend: Backend) -> None:
    now = [0.0]
    params = SourceStopParams(high_mark=1000, low_mark=100, stop_rate=50.0)
    spout, bolt = FakeTask(1, "s"), FakeTask(2, "b", [1])
    spouts_side = SourceStopFlowControl(params, clock=lambda: now[0], coordinator=backend.coordinator("ss"),
                                        heartbeat=0.05)
    bolts_side = SourceStopFlowControl(params, clock=lambda: now[0], coordinator=backend.coordinator("ss"),
                                       heartbeat=0.05)
    await spouts_side.start([spout])
    await bolts_side.start([bolt])
    try:
        bolt.q = 1500                                         # over the high mark
        await until(lambda: spout.limit == 50.0, what="the other process's spout stopped")
        assert bolt.stats.signals_sent == {"BACKPRESSURE": 1} and spout.stats.signals_received == {"BACKPRESSURE": 1}
        assert spout.stats.backpressure
        bolt.q = 500                                          # between the marks: still stopped
        await asyncio.sleep(0.3)                                  # (heartbeats went by meanwhile)
        assert spout.limit == 50.0 and spout.stats.signals_received == {"BACKPRESSURE": 1}
        bolt.q = 50                                           # under the low mark: resumed
        await until(lambda: spout.limit is None, what="the spout resumed")
        assert spout.stats.signals_received == {"BACKPRESSURE": 1, "RELEASE": 1} and not spout.stats.backpressure
        bolt.q = 1500
        await until(lambda: spout.limit == 50.0, what="stopped again")
    finally:
        await bolts_side.stop()       # the overloaded bolt's process leaves: it holds nothing any more
    try:
        await until(lambda: spout.limit is None, what="the spout released when the bolt's process left")
    finally:
        await spouts_side.stop()


async def test_watermark_reports_travel_as_states_and_only_the_spouts_process_commands_it(backend: Backend) -> None:
    now = [0.0]
    params = WaterMarkParams(capacity=1000, high=0.5, low=0.1, check_interval=1.0, ramp_steps=2)
    graph = {"s": (True, [1], []), "b": (False, [2], ["s"])}
    spout, bolt = FakeTask(1, "s", rate=400.0), FakeTask(2, "b", [1])
    spouts_side = WatermarkFlowControl(params, clock=lambda: now[0], period=0.01, graph=graph,
                                       coordinator=backend.coordinator("wm"), heartbeat=0.05)
    bolts_side = WatermarkFlowControl(params, clock=lambda: now[0], period=0.01, graph=graph,
                                      coordinator=backend.coordinator("wm"), heartbeat=0.05)
    await spouts_side.start([spout])
    await bolts_side.start([bolt])
    master = spouts_side.master
    assert master is not None
    try:
        bolt.q = 600                                  # over 0.5 x 1000: one report
        await until(lambda: spout.limit == 200.0, what="the spout halved (R4, no service rate measured)")
        assert master.counters["reports"] == 1 and bolt.stats.signals_sent == {"BACKPRESSURE": 1}
        await asyncio.sleep(0.3)                          # heartbeats re-publish the bolt's state ...
        assert master.counters["reports"] == 1            # ... but a heartbeat is not a report
        now[0] = 1.0                                      # R2: re-report after check_interval, level not
        await until(lambda: spout.limit == 100.0, what="slowed further (R5)")   # falling: slower
        assert master.counters["reports"] == 2
        bolt.q = 50                                   # recovered: the ramp's first step at once
        await until(lambda: spout.limit == pytest.approx(200.0), what="the ramp's first step (R6)")
        now[0] = 2.5
        await until(lambda: spout.limit is None, what="the limiter off after the ramp")
        assert bolts_side.master is not None and 1 not in bolts_side.handles   # (the bolt's side commands
        assert spout.stats.signals_received["BACKPRESSURE"] == 2                 # no spout of its own)
    finally:
        await bolts_side.stop()
        await spouts_side.stop()
