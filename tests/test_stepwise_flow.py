"""The stepwise FlowControl over fake task handles, through both coordinators.

Real clock, short ``sensitivity`` (200 ms) so a whole step-down / step-up cycle
takes about a second. The handles stand in for the engine's tasks: the test sets
their queue bytes and observed rates and reads the rates flow control sets.
"""
from __future__ import annotations

import asyncio
import contextlib
from typing import AsyncIterator, Sequence

import pytest

from backpressure.policy.stepwise import StepwiseParams
from backpressure.seams import Direction, FlowDisplay
from backpressure.drivers.stepwise import StepwiseFlowControl
from coord_backends import Backend, backend, until, zookeeper  # noqa: F401
from runtime.observe.stats import TaskStats

pytestmark = pytest.mark.timeout(120)

HIGH, LOW = 1_000_000, 10_000
PARAMS = StepwiseParams(step=0.5, high_mark=HIGH, low_mark=LOW, sensitivity=0.2, rate_floor=1.0)


class FakeTask:
    """A TaskHandle whose queue and observed rate the test sets."""

    def __init__(self, task_id: int, component: str, upstream: Sequence[int] = (), rate: float = 0.0) -> None:
        self.task_id = task_id
        self.component = component
        self.upstream_task_ids = list(upstream)
        self.is_spout = not upstream
        self.q = 0
        self.rate = rate
        self.emitted = 0                    # the test counts what it "emits"
        self.executed = 0                   # ... and what it "executes"
        self.dry = 0                        # the test counts rounds its "source" ran dry
        self.waits = 0                      # ... and emits its limit made wait
        self.limit: float | None = None
        self.history: list[float | None] = []
        self.stats = TaskStats("t", component, task_id, self.is_spout)

    def queue_bytes(self) -> int:
        return self.q

    def observed_rate(self) -> float:
        return self.rate

    def executed_count(self) -> int:
        return self.executed

    def emitted_count(self) -> int:
        return self.emitted

    def dry_count(self) -> int:
        return self.dry

    def wait_count(self) -> int:
        return self.waits

    def set_rate(self, tuples_per_second: float | None) -> None:
        self.limit = tuples_per_second
        self.history.append(tuples_per_second)
        self.stats.rate_limit = tuples_per_second

    def show(self, display: FlowDisplay) -> None:
        self.stats.show(display)

    def count_signal(self, direction: Direction, kind: str) -> None:
        self.stats.count_signal(direction, kind)


def flow(backend: Backend, params: StepwiseParams = PARAMS) -> StepwiseFlowControl:
    return StepwiseFlowControl(params, backend.coordinator(), period=0.02, heartbeat=0.1, grace=1.5)


@contextlib.asynccontextmanager
async def running(backend: Backend, tasks: list[FakeTask],
                  params: StepwiseParams = PARAMS) -> AsyncIterator[StepwiseFlowControl]:
    fc = flow(backend, params)
    await fc.start(tasks)
    try:
        yield fc
    finally:
        await fc.stop()


@contextlib.asynccontextmanager
async def stepped_across_processes(
        backend: Backend) -> AsyncIterator[tuple[FakeTask, FakeTask, StepwiseFlowControl, StepwiseFlowControl]]:
    """Process ``up`` runs spout 1 (4000/s), process ``down`` runs bolt 2, which is overloaded
    and has stepped the spout down once (2000/s) when the body starts."""
    spout, bolt = FakeTask(1, "spout", rate=4_000.0), FakeTask(2, "bolt", [1])
    up, down = flow(backend), flow(backend)
    await up.start([spout])
    await down.start([bolt])
    try:
        await until(lambda: 2 in up.states and 1 in down.states, what="both processes see each other")
        bolt.q = HIGH
        down.poll(bolt)
        await until(lambda: spout.limit == 2_000.0, what="stepped across processes")
        yield spout, bolt, up, down
    finally:
        await down.stop()
        await up.stop()


async def test_overload_steps_down_and_light_steps_back_to_exactly_originv(backend: Backend) -> None:
    spout, bolt = FakeTask(1, "spout", rate=20_000.0), FakeTask(2, "bolt", [1])
    async with running(backend, [spout, bolt]) as fc:
        bolt.q = HIGH
        fc.poll(bolt)
        await until(lambda: spout.limit == 10_000.0, what="first step")
        assert spout.stats.backpressure and spout.stats.k == 1 and spout.stats.originv == 20_000.0
        spout.rate = 10_000.0                                   # what the spout now manages
        await until(lambda: spout.limit == 5_000.0, what="second step while still overloaded")
        await until(lambda: spout.limit == 2_500.0, what="third step")
        bolt.q = LOW
        await until(lambda: spout.history[-1] is None, 5, what="released back to originv")
        down = spout.history[:spout.history.index(2_500.0) + 1]
        assert down[:3] == [10_000.0, 5_000.0, 2_500.0] or down[-3:] == [10_000.0, 5_000.0, 2_500.0]
        assert spout.history[-3:] == [5_000.0, 10_000.0, None]          # one step up per light window
        th = fc.throttles[1]
        assert th.k == 0 and th.nominal_rate == 20_000.0 and th.originv == 20_000.0
        assert not spout.stats.backpressure and spout.stats.rate_limit is None and spout.stats.k == 0
        assert bolt.stats.signals_sent["BACKPRESSURE"] >= 3 and bolt.stats.signals_sent["RELEASE"] >= 3
        assert spout.stats.signals_received["BACKPRESSURE"] >= 3
        await until(lambda: fc.states[1].k == 0 and not fc.states[1].backpressure, what="published")


async def test_steps_are_at_most_one_per_sensitivity(backend: Backend) -> None:
    spout, bolt = FakeTask(1, "spout", rate=1_000.0), FakeTask(2, "bolt", [1])
    async with running(backend, [spout, bolt], StepwiseParams(step=0.5, high_mark=HIGH, low_mark=LOW, sensitivity=0.5, rate_floor=1.0)) as fc:
        bolt.q = HIGH
        for _ in range(100):
            fc.poll(bolt)
            await asyncio.sleep(0.01)
        assert fc.throttles[1].k in (2, 3)          # ~1 s of overload at 0.5 s per step


async def test_idle_task_releases_from_the_timer(backend: Backend) -> None:
    spout, bolt = FakeTask(1, "spout", rate=8_000.0), FakeTask(2, "bolt", [1])
    async with running(backend, [spout, bolt]) as fc:
        bolt.q = HIGH
        fc.poll(bolt)
        await until(lambda: spout.limit == 4_000.0)
        bolt.q = 0                       # the bolt goes idle: nobody calls poll any more
        await until(lambda: spout.limit is None and fc.throttles[1].k == 0, 5, what="timer release")


async def test_second_branch_is_untouched(backend: Backend) -> None:
    """spout -> slow bolt, spout -> fast bolt: only the spout is stepped, and only by the slow
    bolt; a bolt downstream of the slow one is never throttled (direct upstreams only)."""
    spout = FakeTask(1, "spout", rate=20_000.0)
    slow, fast = FakeTask(2, "slow", [1]), FakeTask(3, "fast", [1])
    sink = FakeTask(4, "sink", [2], rate=0.0)
    async with running(backend, [spout, slow, fast, sink]) as fc:
        slow.q = HIGH
        fc.poll(slow)
        await until(lambda: spout.limit == 10_000.0)
        await asyncio.sleep(0.3)
        assert slow.limit is None and fast.limit is None and sink.limit is None
        assert fc.throttles[1].holds == {2: fc.throttles[1].k}


async def test_two_downstreams_overloaded_together_step_the_upstream_once(backend: Backend) -> None:
    spout = FakeTask(1, "spout", rate=16_000.0)
    a, b = FakeTask(2, "a", [1]), FakeTask(3, "b", [1])
    async with running(backend, [spout, a, b], StepwiseParams(step=0.5, high_mark=HIGH, low_mark=LOW, sensitivity=5.0, rate_floor=1.0)) as fc:
        a.q = b.q = HIGH
        fc.poll(a)
        fc.poll(b)
        await until(lambda: spout.limit is not None)
        await asyncio.sleep(0.3)
        assert spout.history == [8_000.0] and sum(fc.throttles[1].holds.values()) == 1   # one step, one holder
        # a recovers; b still holds: no release
        a.q = 0
        b.q = HIGH // 2
        await asyncio.sleep(0.5)
        assert spout.limit == 8_000.0


async def test_stop_releases_everything(backend: Backend) -> None:
    spout, bolt = FakeTask(1, "spout", rate=1_000.0), FakeTask(2, "bolt", [1])
    fc = flow(backend)
    await fc.start([spout, bolt])
    bolt.q = HIGH
    fc.poll(bolt)
    await until(lambda: spout.limit == 500.0)
    await fc.stop()
    assert spout.limit is None and not spout.stats.backpressure


async def test_downstream_in_another_process_stopping_releases_its_upstream(backend: Backend) -> None:
    async with stepped_across_processes(backend) as (spout, bolt, up, down):
        await down.stop()
        await until(lambda: spout.limit is None, 10, what="released when the downstream stopped")
        assert spout.history == [2_000.0, None]


async def test_downstream_process_dying_releases_its_upstream(backend: Backend) -> None:
    """No clean stop: the dead process's ephemeral state vanishes, and with it its hold."""
    async with stepped_across_processes(backend) as (spout, bolt, up, down):
        for t in down._tasks + down.coordinator._tasks:
            t.cancel()
        down._running = False
        await down.coordinator.store.close()
        await until(lambda: spout.limit is None, 20, what="released when the downstream's session ended")


async def test_lost_signal_is_repaired_by_the_state_record(backend: Backend) -> None:
    spout, bolt = FakeTask(1, "spout", rate=4_000.0), FakeTask(2, "bolt", [1])
    fc = flow(backend)
    await fc.start([spout, bolt])
    real_send = fc.coordinator.send
    lost: list[object] = []
    fc.coordinator.send = lambda s: lost.append(s)          # type: ignore[method-assign]
    try:
        bolt.q = HIGH
        fc.poll(bolt)
        assert len(lost) == 1
        fc.coordinator.send = real_send                     # type: ignore[method-assign]
        await until(lambda: spout.limit == 2_000.0, 5, what="hold repaired from the heartbeat state")
        bolt.q = 0
        await until(lambda: spout.limit is None, 5)
    finally:
        fc.coordinator.send = real_send                     # type: ignore[method-assign]
        await fc.stop()


async def test_duplicated_signals_change_nothing(backend: Backend) -> None:
    spout, bolt = FakeTask(1, "spout", rate=4_000.0), FakeTask(2, "bolt", [1])
    fc = flow(backend)
    await fc.start([spout, bolt])
    real_send = fc.coordinator.send
    sent: list = []

    def twice(s) -> None:  # type: ignore[no-untyped-def]
        sent.append(s)
        real_send(s)
        fc.coordinator.send_queue._items[(s.source + 1000, s.target)] = s     # a second copy
        fc.coordinator.send_queue._ready.set()

    fc.coordinator.send = twice                              # type: ignore[method-assign]
    try:
        bolt.q = HIGH
        fc.poll(bolt)
        await until(lambda: spout.limit == 2_000.0)
        await asyncio.sleep(0.1)
        bolt.q = HIGH // 2
        await asyncio.sleep(0.3)
        assert spout.history == [2_000.0]
    finally:
        fc.coordinator.send = real_send                      # type: ignore[method-assign]
        await fc.stop()


async def test_coordinator_outage_keeps_rates_and_reconciles_after(backend: Backend) -> None:
    async with stepped_across_processes(backend) as (spout, bolt, up, down):
        bolt.q = HIGH // 2                          # between the marks: hold steady
        await backend.outage_begin()
        bolt.q = 0                                  # light now, but the release cannot travel
        await asyncio.sleep(1.0)
        assert spout.limit == 2_000.0 and spout.stats.backpressure    # last known rate, still flowing
        await backend.outage_end()
        await until(lambda: spout.limit is None, 30, what="release delivered after reconnection")
        await until(lambda: up.states.get(1) is not None and up.states[1].k == 0 and 1 in down.states
                    and down.states[1].k == 0, 10, what="states re-published and reconciled")


async def test_session_expiry_mid_run_keeps_rates_and_reconciles(backend: Backend) -> None:
    async with stepped_across_processes(backend) as (spout, bolt, up, down):
        bolt.q = HIGH // 2
        await backend.expire(down.coordinator)                  # the downstream's session: its ephemeral state goes
        await until(lambda: down.coordinator.counters["resyncs"] >= 1, 20, what="down resynced")
        await until(lambda: 2 in up.states and up.states[2].holds == {1: 1}, 10, what="down's state is back")
        assert spout.history == [2_000.0]           # the hold never blinked
        await backend.expire(up.coordinator)
        await until(lambda: up.coordinator.counters["resyncs"] >= 1, 20, what="up resynced")
        await asyncio.sleep(0.5)
        assert spout.history == [2_000.0]           # expiry of the throttled task's own session changes nothing
        bolt.q = 0
        await until(lambda: spout.limit is None, 10, what="release works after both expiries")


@pytest.mark.parametrize("hold_starved", [True, False])
async def test_hold_starved_a_relay_holding_its_upstream_publishes_when_its_queue_runs_idle(
        backend: Backend, hold_starved: bool) -> None:
    from dataclasses import replace
    params = replace(PARAMS, hold_starved=hold_starved)
    spout, relay = FakeTask(1, "spout", rate=4_000.0), FakeTask(2, "relay", [1])
    fc = StepwiseFlowControl(params, backend.coordinator(), period=0.02, heartbeat=30.0, grace=1.5)
    relay.q = HIGH                                # published at the start; no heartbeat after that
    await fc.start([spout, relay])
    try:
        fc.poll(relay)                            # the relay steps the spout: it holds a step
        await until(lambda: spout.limit == 2_000.0 and 2 in fc.states and fc.states[2].queue_bytes == HIGH,
                    what="stepped")
        relay.q = 0                               # it runs idle: nothing else publishes (no heartbeat)
        fc.poll(relay)
        if hold_starved:
            await until(lambda: fc.states[2].queue_bytes == 0, 1.0, what="the idle queue published")
        else:
            await asyncio.sleep(0.05)             # the timer observes it idle meanwhile: no publish
            assert fc.states[2].queue_bytes == HIGH
    finally:
        await fc.stop()


async def test_step_from_recent_rate_steps_a_spout_under_what_it_emitted_and_back_to_exactly_originv(
        backend: Backend) -> None:
    """The spout's meter says 20,000/s; it emits about 1,000/s (it waits on a full queue)."""
    spout, bolt = FakeTask(1, "spout", rate=20_000.0), FakeTask(2, "bolt", [1])
    params = StepwiseParams(step=0.5, high_mark=HIGH, low_mark=LOW, sensitivity=0.2, rate_floor=1.0,
                            step_from_recent_rate=True)

    async def emit() -> None:
        while True:
            await asyncio.sleep(0.01)
            spout.emitted += 10

    emitter = asyncio.create_task(emit())
    try:
        async with running(backend, [spout, bolt], params) as fc:
            await asyncio.sleep(0.3)                     # a full window of emits
            bolt.q = HIGH
            fc.poll(bolt)
            # One step under ~1,000/s on originv's steps: 20,000 x 0.5**6 (any rate in 625-1,250/s).
            await until(lambda: spout.limit is not None, what="first step")
            assert spout.limit == 20_000.0 * 0.5 ** 6 and fc.throttles[1].originv == 20_000.0
            bolt.q = LOW
            await until(lambda: spout.history[-1] is None, 10, what="released back to originv")
            th = fc.throttles[1]
            assert th.k == 0 and th.nominal_rate == 20_000.0 and th.originv == 20_000.0
            assert spout.history == [20_000.0 * 0.5 ** k for k in range(6, 0, -1)] + [None]
    finally:
        emitter.cancel()


async def test_step_from_recent_rate_a_relay_released_by_its_downstream_forgets_where_its_spout_overloaded_it(
        backend: Backend) -> None:
    spout, relay, sink = FakeTask(1, "spout", rate=20_000.0), FakeTask(2, "relay", [1], rate=5_000.0), \
        FakeTask(3, "sink", [2])
    params = StepwiseParams(step=0.5, high_mark=HIGH, low_mark=LOW, sensitivity=0.2, rate_floor=1.0,
                            fine_steps=8, bracket_search=True, step_from_recent_rate=True)
    async with running(backend, [spout, relay, sink], params) as fc:
        sink.q = relay.q = HIGH
        fc.poll(sink)
        fc.poll(relay)
        await until(lambda: fc.downstreams[2].over.get(1, 0) > 0, what="the relay saw its spout overload it")
        relay.q = (HIGH + LOW) // 2                 # neither overloaded nor light: it holds what it has
        assert relay.limit is not None
        limited = relay.limit
        sink.q = 0                                  # the sink releases the relay
        await until(lambda: relay.limit is None or relay.limit > limited, 5, what="the relay's limit rose")
        assert 1 not in fc.downstreams[2].over and fc.throttles[1].k > 0


async def test_release_within_intake_a_limited_relay_knows_the_input_rate_its_limit_lets_it_execute(
        backend: Backend) -> None:
    """The relay has executed 4 tuples per tuple it emitted: limited to L emits/s it takes in 4 L."""
    spout, relay, sink = FakeTask(1, "spout", rate=20_000.0), FakeTask(2, "relay", [1], rate=5_000.0), \
        FakeTask(3, "sink", [2])
    relay.executed, relay.emitted = 40_000, 10_000
    params = StepwiseParams(step=0.5, high_mark=HIGH, low_mark=LOW, sensitivity=0.2, rate_floor=1.0,
                            fine_steps=8, bracket_search=True, within_intake=True)
    async with running(backend, [spout, relay, sink], params) as fc:
        assert fc.downstreams[2].intake is None          # not limited
        sink.q = HIGH
        fc.poll(sink)
        await until(lambda: relay.limit is not None, what="the sink limited the relay")
        assert relay.limit == 2_500.0 and fc.downstreams[2].intake == 10_000.0
        sink.q = 0
        await until(lambda: relay.limit is None, 5, what="released")
        assert fc.downstreams[2].intake is None


async def test_release_within_intake_a_relay_held_at_its_intake_bound_is_released_though_its_queue_is_idle(
        backend: Backend) -> None:
    """With ``hold_starved`` too: the relay keeps the spout at what its own limit lets it execute, so its queue
    runs idle. It publishes that it holds the spout at its intake bound, and the sink still releases it; were it
    read as starved, neither would release the other (the hang of the overload matrix's (c) end to end)."""
    spout, relay, sink = FakeTask(1, "spout", rate=20_000.0), FakeTask(2, "relay", [1], rate=5_000.0), \
        FakeTask(3, "sink", [2])
    relay.executed, relay.emitted = 40_000, 10_000
    params = StepwiseParams(step=0.5, high_mark=HIGH, low_mark=LOW, sensitivity=0.2, rate_floor=1.0,
                            fine_steps=8, bracket_search=True, within_intake=True, hold_starved=True)
    async with running(backend, [spout, relay, sink], params) as fc:
        sink.q = HIGH
        fc.poll(sink)
        await until(lambda: relay.limit == 2_500.0, what="the sink stepped the relay")
        assert fc.downstreams[2].intake == 10_000.0
        sink.q, relay.q = 0, HIGH
        fc.poll(relay)
        await until(lambda: spout.limit == 10_000.0, what="the relay stepped the spout to its intake")
        relay.q = 0                                   # both light, the relay's queue idle
        await until(lambda: 2 in fc.states and fc.states[2].at_intake, 5,
                    what="the relay published that it holds the spout at its intake bound")
        await until(lambda: relay.limit is None and spout.limit is None, 15, what="the chain unwound")
        for task in (1, 2):
            th = fc.throttles[task]
            assert th.k == 0 and th.nominal_rate == th.originv
        await until(lambda: not fc.states[2].at_intake, 5, what="the relay let go of its bound")


@pytest.mark.parametrize("window", [1.0, 0.0])
async def test_dry_release_window_a_throttled_spout_publishes_when_its_source_runs_dry_and_when_it_binds_again(
        backend: Backend, window: float) -> None:
    from dataclasses import replace
    params = replace(PARAMS, dry_release_window=window)
    spout, bolt = FakeTask(1, "spout", rate=4_000.0), FakeTask(2, "bolt", [1])
    fc = StepwiseFlowControl(params, backend.coordinator(), period=0.02, heartbeat=30.0, grace=1.5)
    await fc.start([spout, bolt])
    try:
        spout.dry += 5                            # dry while not throttled: its limit is not what idles it
        await asyncio.sleep(0.1)
        assert 1 in fc.states and not fc.states[1].dry
        bolt.q = HIGH
        fc.poll(bolt)
        await until(lambda: spout.limit == 2_000.0 and fc.states[1].k == 1, what="stepped")
        spout.dry += 1                            # its source ran dry under the limit
        if window:
            await until(lambda: fc.states[1].dry, 1.0, what="the dry spout published")
            await asyncio.sleep(0.1)              # no more dry rounds: it binds again
            await until(lambda: not fc.states[1].dry, 1.0, what="binding again published")
        else:
            await asyncio.sleep(0.1)
            assert not fc.states[1].dry
    finally:
        await fc.stop()


async def test_release_in_use_the_sink_releases_a_relay_only_once_the_relay_s_limit_binds(backend: Backend) -> None:
    """``release_after_limit_in_use``: the relay (holding its spout) emits under its limit, so the light sink
    withholds its release; once the relay's limiter makes it wait, its state says since when, and the sink
    releases it after a settle time and a light window."""
    spout, relay, sink = FakeTask(1, "spout", rate=20_000.0), FakeTask(2, "relay", [1], rate=5_000.0), \
        FakeTask(3, "sink", [2])
    params = StepwiseParams(step=0.5, high_mark=HIGH, low_mark=LOW, sensitivity=0.2, rate_floor=1.0,
                            hold_starved=True, release_in_use=True, queue_smoothing=0.02)
    async with running(backend, [spout, relay, sink], params) as fc:
        relay.q = HIGH
        await until(lambda: spout.limit == 10_000.0, what="the relay stepped the spout")
        relay.q = 3 * LOW                       # between its marks: it keeps holding its spout
        sink.q = HIGH
        await until(lambda: relay.limit is not None, what="the sink stepped the relay")
        sink.q = 0                              # the sink is light from now on
        held = relay.limit
        await asyncio.sleep(0.6)                # three light windows, under the patience (0.8 s)
        assert relay.limit == held and fc.states[2].in_use_age is None and fc.throttles[1].k == 1
        assert fc.downstreams[3].unproven
        binding = True

        async def waits() -> None:              # the relay's limiter makes it wait from now on
            while binding:
                relay.waits += 1
                await asyncio.sleep(0.005)

        feeder = asyncio.create_task(waits())
        try:
            await until(lambda: fc.states[2].in_use_age is not None, 5, what="the relay published its spell")
            await until(lambda: relay.limit is None, 5, what="the sink released the relay")
            assert fc.throttles[2].k == 0 and fc.throttles[2].nominal_rate == fc.throttles[2].originv
        finally:
            binding = False
            await feeder
