"""window (document 002) and adaptive (document 004) end to end on the local engine, real clock.

A spout offering 20,000 tuples/s into a bolt that manages 5,000/s: the spout is
throttled, the bolt's queue never passes the hard bound, no tuple is lost, and once
the bolt speeds up the spout's limiter goes off. ``window`` runs with acking (it
needs it) on the local engine's fallback path (no ``WindowGate``); ``adaptive``
runs without a ``Scaler``, so its scale decisions are only counted.
"""
from __future__ import annotations

import asyncio
from typing import Any

import pytest

from backpressure.drivers.factory import make_flow_control
from coord_backends import until
from runtime.local.engine import LocalEngine
from test_backpressure_e2e import Box, Offered, Paced, config, monitored
from topo.topology import TopologyBuilder

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]

_POLICY_CONFIG: dict[str, dict[str, Any]] = {
    "window": {"backpressure.policy": "window", "acking": True},
    "adaptive": {"backpressure.policy": "adaptive", "backpressure.adaptive.window_ms": 1000,
                 "backpressure.adaptive.samples": 10, "backpressure.adaptive.check_interval_ms": 100},
}


@pytest.mark.parametrize("policy", ["window", "adaptive"])
async def test_slow_bolt_throttles_the_spout_loses_nothing_and_releases(policy: str) -> None:
    box = Box()
    box.rate["slow"] = 5_000.0
    b = TopologyBuilder(f"e2e-{policy}")
    b.spout("spout", Offered(box, 20_000.0))
    b.bolt("slow", Paced(box, "slow")).shuffle("spout")
    cfg = config(**_POLICY_CONFIG[policy])
    engine = LocalEngine(b.build(), cfg, flow=make_flow_control(cfg, b.name))
    limits: list[float | None] = []
    engine.flow.on_rate_change = lambda task, rate: limits.append(rate)
    async with monitored(engine) as mon:
        spout = mon.by_component["spout"]
        await asyncio.sleep(3.0)
        assert any(r is not None and r < 20_000.0 for r in limits), limits[:20]
        assert spout.stats.signals_received.get("BACKPRESSURE", 0) >= 1
        box.rate["slow"] = None
        await until(lambda: spout.stats.rate_limit is None and spout.limiter.rate is None, 20,
                    what="the spout back at full speed, limiter off")
        assert not spout.stats.backpressure
    assert mon.max_queue["slow"] <= cfg["queue.hard_bound"], mon.max_queue
    assert box.emitted > 5_000
    assert box.seen["slow"] == set(range(box.emitted)), "a tuple was lost"
    if policy == "adaptive":
        fc = engine.flow
        assert fc.marks and all(rc.coefficient == 1.0 for rc in fc.coefficients.values())  # type: ignore[attr-defined]
