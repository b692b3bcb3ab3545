"""The overload matrix's scenarios (bench/policy_comparison.py) end to end under stepwise.

Small marks (32 KB / 8 KB, hard bound 64 KB, sensitivity 100 ms) and sources that
offer a fixed rate, so that once the overload is lifted every task can go back to
``originv``. Each scenario runs on the embedded coordinator and on a real
ZooKeeper: the overload is made to happen, then lifted, and the test asserts

* no tuple lost: every tuple the spout emitted reached every sink meant to see it;
* the bound: no bolt queue ever held more than the hard bound;
* the return to ``originv``: every task that was throttled ends with its limiter
  off, ``k == 0``, its nominal rate ``== originv`` exactly and its flag cleared in
  its published state;
* (f) the first task stepped is the slow bolt's *direct* upstream, the relay.

(d) and (e) run once more with ``backpressure.flat_queue_holds`` and
``backpressure.release_window_ms`` (the matrix's ``stepwise+flat``), and (b), (c), (e)
and (f) with the settings of the matrix's ``stepwise+search`` (``bracket_search``) and
again with those of ``stepwise+slopes`` (``bracket_interpolate`` too); there ``originv`` may have been raised once (a source overloading again as soon as it
was let go), and the return is to the ``originv`` in force. (c) and (f), the scenarios with a
relay bolt, run once more with ``stepwise+hops`` (``hold_starved_upstream`` too: the slow task
does not release the relay while the relay, throttling the spout, is starved): the chain must
still unwind from the top, every limit back to ``originv``. In the other scenarios every upstream
is a spout and the setting changes nothing. (d) and (e), the scenarios whose source runs dry (on/off,
or caught up after the overload), run once more with ``stepwise+dry`` (``dry_release_window_ms``: light
read while the spout's source ran dry releases it only after 1 s): the spout must still come back to
``originv``, its source dry once the overload is lifted. (c) and (e) run once more with ``stepwise+drain``
(``drain_margin_parts``: a step down inside a bracket goes half a step under the rate found light): the
releases that follow must still bring every limit back to ``originv`` exactly. (c) and (f), the scenarios
with a relay bolt, run once more with ``stepwise+intake`` (``release_within_intake``: a relay limited by the slow
task releases the spout no further than one part over what its own limit lets it take in): once the slow task
lets the relay go, the spout must still come back to ``originv``. (c) and (e) run once more with ``stepwise+settle``
(``settle_after_release``: a queue at work reads its next light window only once a release shows in its smoothed
level): the releases, slower, must still bring every limit back to ``originv`` exactly. (c) and (f) run once more
with ``stepwise+inuse`` (``release_after_limit_in_use``: the slow task releases the relay, while the relay's input
is held, only on a light window begun once the relay's limit had bound its emits for a settle time): the chain
must still unwind to ``originv``, the relay's limit binding or, failing that, the wait running out.

Nothing here asserts on wall time; the waits only bound a hang.
"""
from __future__ import annotations

import asyncio
from typing import Any, Callable

import pytest

from backpressure.drivers.stepwise import StepwiseFlowControl
from backpressure.policy.stepwise import StepwiseParams
from bench.policy_comparison import VARIANTS, Box, Relay, Sink, Source
from coord_backends import Backend, backend, until, zookeeper  # noqa: F401
from runtime.local.engine import LocalEngine
from topo.config import resolve
from topo.topology import Topology, TopologyBuilder

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]

R = 4_000.0          # offered tuples/s
C = 1_000.0          # what the slow stage manages until the overload is lifted


class Ctl(Box):
    """The shared box plus the switches the test flips."""

    def __init__(self) -> None:
        super().__init__()
        self.slow = False       # the overload is on (off at first, so every rate is measured)
        self.free = False       # the overload is lifted: the slow stage runs as fast as it can

    def cap(self, c: float) -> Callable[[float], float | None]:
        return lambda t: c if self.slow and not self.free else None


def _single(name: str, box: Ctl, spout: Source, sink: Sink, parallelism: int = 1) -> Topology:
    b = TopologyBuilder(name)
    b.spout("spout", spout)
    b.bolt("sink", sink, parallelism=parallelism).shuffle("spout")
    return b.build()


def _a(box: Ctl, tracked: bool) -> Topology:
    return _single("e2e-a", box, Source(box, lambda t: R, tracked), Sink(box, "sink", box.cap(C)))


def _b(box: Ctl, tracked: bool) -> Topology:
    return _single("e2e-b", box, Source(box, lambda t: R, tracked), Sink(box, "sink", box.cap(C / 4)), 4)


def _c(box: Ctl, tracked: bool) -> Topology:
    b = TopologyBuilder("e2e-c")
    b.spout("spout", Source(box, lambda t: R, tracked))
    b.bolt("fast", Sink(box, "fast")).shuffle("spout")
    b.bolt("relay", Relay(box, every=4)).shuffle("spout")
    b.bolt("sink", Sink(box, "sink", box.cap(C / 4))).shuffle("relay")
    return b.build()


def _d(box: Ctl, tracked: bool) -> Topology:
    on_off = Source(box, lambda t: 2 * R if t % 1.0 < 0.5 else 0.0, tracked)
    return _single("e2e-d", box, on_off, Sink(box, "sink", box.cap(C)))


def _e(box: Ctl, tracked: bool) -> Topology:
    def cap(t: float) -> float | None:
        return None if box.free else (C / 5 if box.slow else C)
    return _single("e2e-e", box, Source(box, lambda t: 0.8 * C, tracked), Sink(box, "sink", cap))


def _f(box: Ctl, tracked: bool) -> Topology:
    b = TopologyBuilder("e2e-f")
    b.spout("spout", Source(box, lambda t: R, tracked))
    b.bolt("relay", Relay(box)).shuffle("spout")
    b.bolt("sink", Sink(box, "sink", box.cap(C))).shuffle("relay")
    return b.build()


def _g(box: Ctl, tracked: bool) -> Topology:
    return _single("e2e-g", box, Source(box, lambda t: R, tracked), Sink(box, "sink", pause=0.002))


BUILD = {"a": _a, "b": _b, "c": _c, "d": _d, "e": _e, "f": _f, "g": _g}
# Settings beyond the document: the matrix's named variants (stepwise+flat, +search, +slopes, +hops, +dry,
# +drain, +intake, +settle, +inuse), read from the bench so the two cannot drift apart.
SETTINGS = {"": {}, **{name: VARIANTS[f"stepwise+{name}"]
                       for name in ("flat", "search", "slopes", "hops", "dry", "drain", "intake", "settle",
                                    "inuse")}}
CASES = [(k, False, "") for k in BUILD] + [("a", True, ""), ("b", True, ""), ("d", False, "flat"),
                                           ("e", False, "flat")] + [(k, False, "search") for k in "bcef"] + [
                                           (k, False, "slopes") for k in "bcef"] + [
                                           (k, False, "hops") for k in "cf"] + [
                                           (k, False, "dry") for k in "de"] + [
                                           (k, False, "drain") for k in "ce"] + [
                                           (k, False, "intake") for k in "cf"] + [
                                           (k, False, "settle") for k in "ce"] + [
                                           (k, False, "inuse") for k in "cf"]


def _config(acking: bool, settings: str = "") -> Any:
    return resolve({"queue.high_mark": "32KB", "queue.low_mark": "8KB", "queue.hard_bound": "64KB",
                    "backpressure.sensitivity_ms": 100, "backpressure.step": 0.5,
                    "drain_timeout_s": 60, "acking": acking, **SETTINGS[settings]})


@pytest.mark.parametrize(("key", "acking", "settings"), CASES,
                         ids=[f"{k}-acking-{'on' if a else 'off'}" + (f"-{s}" if s else "") for k, a, s in CASES])
async def test_overload_scenario_loses_nothing_keeps_the_bound_and_returns_to_originv(
        backend: Backend, key: str, acking: bool, settings: str) -> None:
    box = Ctl()
    cfg = _config(acking, settings)
    topology = BUILD[key](box, acking)
    fc = StepwiseFlowControl(StepwiseParams.from_config(cfg), backend.coordinator(topology.name))
    engine = LocalEngine(topology, cfg, flow=fc)
    changes: list[tuple[int, float | None]] = []
    fc.on_rate_change = lambda task, rate: changes.append((task, rate))
    by_name = {t.component: t for t in engine.tasks}
    loop = asyncio.get_running_loop()
    box.t0 = loop.time()
    run = asyncio.create_task(engine.run())
    try:
        # The runtime's rate meter needs about half a second for a first figure; the
        # overload starts after that, so the steps follow the document (a task whose
        # rate is not measured yet is stepped only once it is).
        await until(lambda: box.emitted >= 3_000, 30, what="running at full capacity first")
        box.slow = True
        if key != "g":          # (g) may or may not cross the high mark: its pauses are short
            await until(lambda: any(th.k > 0 for th in fc.throttles.values()), 30, what="a step down")
        await until(lambda: box.emitted >= 6_000, 60, what="some overload")
        box.free = True
        await until(lambda: all(th.k == 0 for th in fc.throttles.values())
                    and all(t.stats.rate_limit is None for t in engine.tasks), 60,
                    what="every task back to originv, limiters off")
        await until(lambda: all(not fc.states[t].backpressure for t in fc.throttles if t in fc.states), 15,
                    what="flags cleared in the published states")
    finally:
        engine.request_stop()
        await asyncio.wait_for(run, 120)
    # no tuple lost
    emitted = set(range(box.emitted))
    every = 4 if key == "c" else 1
    assert box.seen["sink"] == {n for n in emitted if n % every == 0}
    if key == "c":
        assert box.seen["fast"] == emitted
    # the bound
    for t in engine.tasks:
        if t.queue is not None:
            assert t.queue.peak_bytes <= t.queue.hard_bound, (t.component, t.queue.peak_bytes)
    # exactly originv again
    throttled = [th for th in fc.throttles.values() if th.originv is not None]
    if key != "g":
        assert throttled
    for th in throttled:
        assert th.k == 0 and th.rate is None and not th.backpressure
        assert th.nominal_rate == th.originv
    if key == "f":
        assert changes and changes[0][0] == by_name["relay"].task_id, changes[:3]
