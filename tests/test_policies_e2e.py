"""Every in-process policy end to end on the local engine, real clock, small marks.

1. source_stop, watermark, adaptive (document 004) and window (document 002): a spout
   offering 20,000 tuples/s into a bolt that manages 5,000/s. The spout is throttled
   (stopped, slowed by the topology master or by its rate coefficient, or held by its
   send window), the bolt's queue never passes the hard bound, no tuple is lost, and
   once the bolt speeds up the spout is back at full speed: its limiter off, every
   flag clear, its send windows back at their largest.
2. source_stop's known cost: spout -> relay -> slow and spout -> fast, the topology
   of ``test_backpressure_e2e.test_second_branch_keeps_its_throughput_while_one_branch_is_slow``
   where stepwise keeps the fast branch at >= 80 % of the source's rate (that test
   is the stepwise half of the comparison and is not repeated here). Under
   source_stop the slow bolt stops the spout itself, so the fast branch starves too.
"""
from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from backpressure.drivers.factory import make_flow_control
from backpressure.policy.window import NORMAL, SLOW
from coord_backends import until
from runtime.local.engine import LocalEngine
from test_backpressure_e2e import Box, Offered, Paced, config, monitored
from topo.topology import TopologyBuilder

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]

# Water marks as fractions of the 800KB hard bound: 400KB / 40KB, the stepwise tests' marks.
_POLICY_CONFIG: dict[str, dict[str, Any]] = {
    "source_stop": {"backpressure.policy": "source_stop"},
    "watermark": {"backpressure.policy": "watermark", "backpressure.water_mark.high": 0.5,
                  "backpressure.water_mark.low": 0.05, "backpressure.water_mark.check_interval_ms": 250},
    "adaptive": {"backpressure.policy": "adaptive", "backpressure.adaptive.window_ms": 1000,
                 "backpressure.adaptive.samples": 10, "backpressure.adaptive.check_interval_ms": 100,
                 "backpressure.adaptive.max_parallelism": 1},
    # Windows grow by one tuple per round trip (W2): one that starts over what the slow bolt
    # takes in 50 ms (250 tuples) is SLOW within its first round trip, however busy the machine.
    "window": {"backpressure.policy": "window", "acking": True, "backpressure.window.initial": 512},
}


def engine_for(policy: str, builder: TopologyBuilder, **over: Any) -> tuple[dict[str, Any], LocalEngine]:
    cfg = config(**_POLICY_CONFIG[policy], **over)
    return cfg, LocalEngine(builder.build(), cfg, flow=make_flow_control(cfg, builder.name))


class Numbered:
    """A collector proxy giving every emit its number as msg_id: tracked tuples (window needs acks)."""

    def __init__(self, collector: Any) -> None:
        self.inner = collector

    def emit(self, values: list[Any], stream: str = "default") -> None:
        self.inner.emit(values, stream, msg_id=values[0])


class TrackedOffered(Offered):
    def open(self, context: Any, collector: Any) -> None:
        super().open(context, collector)
        self.collector = Numbered(collector)


async def _watch_windows(engine: LocalEngine, spout_id: int, slow_id: int, seen: dict[str, Any]) -> None:
    """Every millisecond: the window towards the slow task never holds more in flight than its size."""
    w = engine.flow.senders[spout_id].windows[slow_id]   # type: ignore[attr-defined]
    while True:
        seen["over"] = seen.get("over", 0) + (len(w.in_flight) > int(w.window))
        seen["slow"] = seen.get("slow", False) or w.state == SLOW
        seen["least"] = min(seen.get("least", w.window), w.window)
        seen["most_in_flight"] = max(seen.get("most_in_flight", 0), len(w.in_flight))
        await asyncio.sleep(0.001)


@pytest.mark.parametrize("policy", ["source_stop", "watermark", "adaptive", "window"])
async def test_slow_bolt_throttles_the_spout_loses_nothing_and_releases(policy: str) -> None:
    box = Box()
    box.rate["slow"] = 5_000.0
    b = TopologyBuilder(f"e2e-{policy}")
    b.spout("spout", (TrackedOffered if policy == "window" else Offered)(box, 20_000.0))
    b.bolt("slow", Paced(box, "slow")).shuffle("spout")
    cfg, engine = engine_for(policy, b)
    windows: dict[str, Any] = {}
    async with monitored(engine) as mon:
        spout, slow = mon.by_component["spout"], mon.by_component["slow"]
        if policy == "window":     # held by its window: SLOW acks shrink it (no rate limit)
            watcher = asyncio.create_task(_watch_windows(engine, spout.task_id, slow.task_id, windows))
            await until(lambda: windows.get("slow", False), 15, what="a SLOW ack")
            t0, before = time.monotonic(), spout.stats.emitted
            await asyncio.sleep(1.0)
            held_rate = (spout.stats.emitted - before) / (time.monotonic() - t0)
            assert held_rate < 0.6 * 20_000.0
        else:
            await until(lambda: spout.stats.backpressure, 15, what="the spout throttled")
            assert spout.stats.rate_limit is not None and spout.stats.rate_limit < 20_000.0
            assert spout.stats.signals_received.get("BACKPRESSURE", 0) >= 1
            assert slow.stats.signals_sent.get("BACKPRESSURE", 0) >= 1
        await asyncio.sleep(2.5)
        box.rate["slow"] = None
        if policy == "window":
            w = engine.flow.senders[spout.task_id].windows[slow.task_id]   # type: ignore[attr-defined]
            # W2b: a window grows only while it holds the spout back, so it grows back until it no
            # longer does (not to max; not at all if it no longer holds it): the spout then sends at
            # the rate it offers.
            await until(lambda: w.state == NORMAL, 20, what="NORMAL acks again")
            rates: list[float] = []

            async def rate() -> bool:
                t0, before = time.monotonic(), spout.stats.emitted
                await asyncio.sleep(0.5)
                rates.append((spout.stats.emitted - before) / (time.monotonic() - t0))
                return rates[-1] >= 0.9 * 20_000.0

            deadline = time.monotonic() + 20
            while not await rate():
                assert time.monotonic() < deadline, f"the window still holds the spout back: {rates}"
            watcher.cancel()
        await until(lambda: not spout.stats.backpressure and spout.stats.rate_limit is None, 20,
                    what="the spout back at full speed, limiter off")
        assert spout.limiter.rate is None and spout.stats.k == 0
        assert not any(t.stats.backpressure for t in engine.tasks)
    hard = cfg["queue.hard_bound"]
    assert mon.max_queue["slow"] <= hard, (mon.max_queue, hard)
    assert box.emitted > 5_000
    assert box.seen["slow"] == set(range(box.emitted)), "a tuple was lost or duplicated"
    assert slow.stats.executed == box.emitted
    if policy in ("source_stop", "watermark"):
        assert mon.max_queue["slow"] >= cfg["queue.high_mark"]           # the overload was real
    if policy == "watermark":
        master = engine.flow.master  # type: ignore[attr-defined]
        assert not master.throttled and master.counters["reports"] >= 2
    if policy == "adaptive":
        fc = engine.flow
        assert fc.marks and all(rc.coefficient == 1.0 for rc in fc.coefficients.values())  # type: ignore
    if policy == "window":
        assert engine.flow.window_gate is not None        # type: ignore[attr-defined]
        assert windows["most_in_flight"] > 0, "the engine reported no tuple sent"
        assert windows["over"] == 0, "more tuples in flight than the window"
        assert windows["least"] < cfg["backpressure.window.max"]
        assert spout.stats.acked == box.emitted and not spout.stats.failed
        print(f"window: spout held at {held_rate:,.0f} tuples/s while the bolt managed 5,000; window "
              f"down to {windows['least']:.0f}, at most {windows['most_in_flight']} in flight, queue peak "
              f"{mon.max_queue['slow']:,} bytes (hard bound {hard:,}); {box.emitted:,} tuples, none lost")


async def test_source_stop_also_stops_the_fast_branch() -> None:
    box = Box()
    box.rate["slow"] = 2_000.0
    b = TopologyBuilder("e2e-source-stop-branches")
    b.spout("spout", Offered(box, 20_000.0, pad=4))
    b.bolt("relay", Paced(box, "relay", forward_pad=1000)).shuffle("spout")
    b.bolt("slow", Paced(box, "slow")).shuffle("relay")
    b.bolt("fast", Paced(box, "fast")).shuffle("spout")
    cfg, engine = engine_for("source_stop", b, **{"queue.high_mark": "1MB", "queue.low_mark": "100KB",
                                                  "queue.hard_bound": "2MB"})
    async with monitored(engine) as mon:
        spout, fast = mon.by_component["spout"], mon.by_component["fast"]
        await until(lambda: spout.stats.backpressure, 15, what="the spout stopped")
        before = fast.stats.executed
        t0 = time.monotonic()
        await asyncio.sleep(2.0)
        fast_rate = (fast.stats.executed - before) / (time.monotonic() - t0)
        stops = engine.flow.policy.stops  # type: ignore[attr-defined]
        box.rate["slow"] = None
        await until(lambda: not spout.stats.backpressure, 20, what="the spout resumed")
    print(f"source_stop fast branch: {fast_rate:.0f} tuples/s, {stops} stops")
    assert mon.max_k["spout"] == 1, "the source itself was stopped"
    assert mon.max_k.get("relay", 0) == 0, "source_stop throttles spouts only"
    assert fast_rate < 0.5 * 20_000.0, fast_rate       # stepwise keeps >= 0.8 x on this topology
    assert mon.max_queue["slow"] <= cfg["queue.hard_bound"]
    for name in ("relay", "fast", "slow"):
        assert box.seen[name] == set(range(box.emitted)), name
