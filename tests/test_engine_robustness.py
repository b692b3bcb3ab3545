"""The local engine when things go wrong: stops that stop, hung and blocking executes,
the byte bound under big batches, failures that are logged, components that fail to start.

Timeouts below (``asyncio.wait_for``) only turn a hang into a failure; no test asserts
how fast anything is.
"""
from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
import time
from typing import Any

import pytest

from topo.api import Bolt, ComponentError, EndOfStream, Spout, Tuple
from topo.topology import TopologyBuilder
from runtime.local.engine import LocalEngine
from runtime.local.failures import FailureLog

pytestmark = pytest.mark.timeout(120)

HANG_GUARD_S = 30.0   # a run that is not over by then is hung


class Shared:
    """State shared by every task copy of a component (tasks get deep copies)."""

    def __init__(self) -> None:
        self.seen: list[Any] = []
        self.closed: list[str] = []
        self.calls = 0
        self.release = threading.Event()


class SharedMixin:
    shared: Shared

    def __deepcopy__(self, memo: dict) -> Any:
        clone = object.__new__(type(self))
        clone.__dict__.update(self.__dict__)   # the copy shares ``shared``
        return clone


class Count(SharedMixin, Spout):
    outputs = ["n"]

    def __init__(self, shared: Shared, total: int, payload: int = 0) -> None:
        self.shared, self.total, self.payload = shared, total, payload
        self.i = 0

    def next_tuple(self) -> None:
        if self.total and self.i >= self.total:
            raise EndOfStream
        value: Any = self.i if not self.payload else b"x" * self.payload
        self.collector.emit([value], msg_id=self.i)
        self.i += 1

    def close(self) -> None:
        self.shared.closed.append("spout")


class HangOnZero(SharedMixin, Bolt):
    """Async: the first time it sees 0 it waits forever; everything else is recorded."""

    outputs = ["n"]

    def __init__(self, shared: Shared, timeout: float | None) -> None:
        self.shared = shared
        self.execute_timeout_s = timeout

    async def execute(self, tup: Tuple) -> None:
        if tup["n"] == 0 and 0 not in self.shared.seen and self.shared.calls == 0:
            self.shared.calls += 1
            await asyncio.Event().wait()
        self.shared.seen.append(tup["n"])


def _engine(spout: Spout, bolt: Bolt, **config: Any) -> LocalEngine:
    b = TopologyBuilder("robust", {"backpressure.policy": "none", **config})
    b.spout("src", spout)
    b.bolt("work", bolt).shuffle("src")
    return LocalEngine(b.build())


# -- 1. a stop always stops ------------------------------------------------------------------

async def test_a_stop_request_ends_a_run_whose_finite_spout_already_ended() -> None:
    shared = Shared()
    engine = _engine(Count(shared, 5), HangOnZero(shared, timeout=1000.0),
                     acking=True, drain_timeout_s=0.5)
    run = asyncio.create_task(engine.run())
    while not all(s.exhausted for s in engine.spout_tasks):
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.2)
    assert not run.done()           # the bolt is stuck on tuple 0: the run would drain forever
    engine.request_stop("stopped")
    result = await asyncio.wait_for(run, HANG_GUARD_S)
    assert result.reason == "stopped"
    assert shared.seen == []                              # the one bolt task never got past 0
    assert result.component_totals()["src"]["failed"] == 5   # all five were failed back


async def test_duration_ends_a_run_whose_finite_spout_already_ended() -> None:
    shared = Shared()
    engine = _engine(Count(shared, 3), HangOnZero(shared, timeout=1000.0),
                     acking=True, drain_timeout_s=0.2)
    result = await asyncio.wait_for(engine.run(duration=0.5), HANG_GUARD_S)
    assert result.reason == "duration"


# -- 2. a hung execute does not poison its task ------------------------------------------------

async def test_a_hung_async_execute_is_cancelled_its_tuple_replayed_and_the_task_goes_on() -> None:
    shared = Shared()
    engine = _engine(Count(shared, 50), HangOnZero(shared, timeout=0.3), acking=True)
    result = await asyncio.wait_for(engine.run(), HANG_GUARD_S)
    assert result.reason == "exhausted"
    assert sorted(shared.seen) == list(range(50))     # 0 came back by replay and was processed
    totals = result.component_totals()
    assert totals["work"]["failed"] == 1 and totals["src"]["replayed"] == 1
    assert totals["src"]["dead_lettered"] == 0


class SleepyBlocking(SharedMixin, Bolt):
    """A plain execute that blocks (time.sleep); marked ``blocking``."""

    blocking = True
    outputs = ["n"]

    def __init__(self, shared: Shared, first_sleep: float, each: float, timeout: float) -> None:
        self.shared, self.first_sleep, self.each = shared, first_sleep, each
        self.execute_timeout_s = timeout

    def execute(self, tup: Tuple) -> None:
        if tup["n"] == 0 and self.shared.calls == 0:
            self.shared.calls += 1
            self.shared.release.wait(self.first_sleep)    # blocks its thread, not the loop
        time.sleep(self.each)
        self.shared.seen.append(tup["n"])
        self.collector.emit([tup["n"]])


async def test_a_blocking_execute_runs_off_the_loop_and_times_out() -> None:
    shared = Shared()
    engine = _engine(Count(shared, 20), SleepyBlocking(shared, first_sleep=60.0, each=0.0, timeout=0.3),
                     acking=True)
    loop_turns = 0

    async def count_turns() -> None:
        nonlocal loop_turns
        while True:
            await asyncio.sleep(0.01)
            loop_turns += 1

    ticker = asyncio.create_task(count_turns())
    try:
        result = await asyncio.wait_for(engine.run(), HANG_GUARD_S)
    finally:
        ticker.cancel()
        shared.release.set()
    assert loop_turns > 10                       # the loop ran while the call was stuck
    assert sorted(set(shared.seen)) == list(range(20))
    assert result.component_totals()["work"]["failed"] == 1


async def test_sigterm_stops_a_run_of_an_endless_blocking_bolt() -> None:
    shared = Shared()
    engine = _engine(Count(shared, 0), SleepyBlocking(shared, first_sleep=0.0, each=0.05, timeout=10.0),
                     acking=True, drain_timeout_s=1.0)
    asyncio.get_running_loop().call_later(0.5, os.kill, os.getpid(), signal.SIGTERM)
    result = await asyncio.wait_for(engine.run(handle_signals=True), HANG_GUARD_S)
    assert result.reason == "signal" and shared.seen


# -- 3. the byte bound holds for batches too ---------------------------------------------------

class Slow(SharedMixin, Bolt):
    def __init__(self, shared: Shared) -> None:
        self.shared = shared

    async def execute(self, tup: Tuple) -> None:
        await asyncio.sleep(0.001)
        self.shared.seen.append(len(tup["n"]))


@pytest.mark.parametrize("payload", [100_000, 200_000])
async def test_a_queue_never_passes_its_hard_bound_by_more_than_one_tuple(payload: int) -> None:
    hard = 128 * 1024
    shared = Shared()
    engine = _engine(Count(shared, 300, payload=payload), Slow(shared), **{
        "queue.high_mark": "64KB", "queue.low_mark": "16KB", "queue.hard_bound": "128KB", "batch.size": 256})
    result = await asyncio.wait_for(engine.run(), HANG_GUARD_S)
    assert result.reason == "exhausted" and len(shared.seen) == 300
    peak = max(q.peak_bytes for q in engine.queues.values())
    one_tuple = payload + 8
    assert peak <= max(hard, one_tuple), f"peak {peak} bytes over a {hard}-byte bound"


# -- 4. errors in user code are never silent ---------------------------------------------------

class Raises(SharedMixin, Bolt):
    def __init__(self, shared: Shared) -> None:
        self.shared = shared

    def execute(self, tup: Tuple) -> None:
        raise ValueError(f"bad tuple {tup['n']}")


@pytest.mark.parametrize("acking", [False, True])
async def test_a_raising_bolt_is_logged_naming_component_task_and_exception(acking: bool, caplog) -> None:
    shared = Shared()
    engine = _engine(Count(shared, 200), Raises(shared), acking=acking, max_retries=0,
                     dead_letter_path=os.devnull, **{"errors.log_first": 5})
    with caplog.at_level(logging.ERROR, logger="topo.task"):
        await asyncio.wait_for(engine.run(), HANG_GUARD_S)
    lines = [r.getMessage() for r in caplog.records if r.name == "topo.task"]
    assert "bolt work (task 2) execute failed a tuple (1 so far): ValueError: bad tuple 0" in lines[0]
    assert len([m for m in lines if "so far" in m]) == 5          # one by one, then counted
    assert any("195 more failures" in m for m in lines), lines[-3:]


class AlwaysRaises(SharedMixin, Spout):
    outputs = ["n"]

    def __init__(self, shared: Shared) -> None:
        self.shared = shared

    def next_tuple(self) -> None:
        self.shared.calls += 1
        raise TypeError("next_tuple() got an unexpected keyword argument 'pth'")

    def close(self) -> None:
        self.shared.closed.append("spout")


async def test_a_spout_that_always_raises_backs_off_then_stops_the_run_naming_it() -> None:
    shared = Shared()
    engine = _engine(AlwaysRaises(shared), Raises(Shared()), **{"spout.max_consecutive_errors": 6})
    with pytest.raises(ComponentError, match=r"spout 'src' \(task 1\): next_tuple raised 6 times in a row"):
        await asyncio.wait_for(engine.run(), HANG_GUARD_S)
    assert shared.calls == 6 and shared.closed == ["spout"]


class PrepareRaises(SharedMixin, Bolt):
    def __init__(self, shared: Shared) -> None:
        self.shared = shared

    def prepare(self, context: Any, collector: Any) -> None:
        raise ConnectionError("database refused")

    def execute(self, tup: Tuple) -> None:
        pass


async def test_prepare_raising_names_the_component_and_closes_what_was_opened() -> None:
    shared = Shared()
    engine = _engine(Count(shared, 10), PrepareRaises(shared))
    with pytest.raises(ComponentError, match=r"bolt 'work' \(task 2\): prepare raised ConnectionError: "
                                             r"database refused"):
        await asyncio.wait_for(engine.run(), HANG_GUARD_S)
    assert shared.closed == ["spout"]      # the spout was opened, so it was closed


def test_failure_log_logs_the_first_n_then_a_count_per_interval(caplog) -> None:
    now = [0.0]
    flog = FailureLog("bolt b (task 3)", logging.getLogger("t.flog"), log_first=2, interval_s=10.0,
                      clock=lambda: now[0])
    with caplog.at_level(logging.ERROR, logger="t.flog"):
        for i in range(5):
            flog.record("execute failed a tuple", ValueError(i))
        now[0] = 9.9
        flog.flush()
        assert len(caplog.records) == 2          # two one by one; the rest waits for the interval
        now[0] = 10.0
        flog.flush()
    assert caplog.records[-1].getMessage() == (
        "bolt b (task 3): 3 more failures in the last 10 s (5 in all); last: ValueError: 4")


# -- the YAML form of blocking / execute_timeout_s -------------------------------------------

def test_yaml_sets_blocking_and_execute_timeout_per_bolt(tmp_path) -> None:
    from topo.spec import SpecError, load_spec

    base = """
name: y
spouts:
  - {id: s, class: topo.examples.wordcount.SentenceSpout, kwargs: {repeat: 1}}
bolts:
  - {id: b, class: topo.examples.wordcount.SplitBolt, %s}
streams:
  - {from: s, to: b, grouping: {type: shuffle}}
"""
    good = tmp_path / "good.yaml"
    good.write_text(base % "blocking: true, execute_timeout_s: 5")
    engine = LocalEngine(load_spec(str(good)).topology)
    bolt = engine.bolt_tasks[0]
    assert bolt.blocking and bolt.execute_timeout_s == 5.0
    bad = tmp_path / "bad.yaml"
    bad.write_text(base % "execute_timeout_s: -1")
    with pytest.raises(SpecError, match=r"bad.yaml:6: bolts\[0\].execute_timeout_s: must be a number of seconds "
                                        r"above 0 and at most 86400 \(got -1\)"):
        load_spec(str(bad))


# -- a slow spout's tuples are not held for a full batch ------------------------------------

class Gated(SharedMixin, Spout):
    """Emits one tuple per call, then waits for the test to open the gate again."""

    outputs = ["n"]

    def __init__(self, shared: Shared) -> None:
        self.shared, self.i = shared, 0

    async def next_tuple(self) -> None:
        if self.i >= 3:
            raise EndOfStream
        self.collector.emit([self.i])
        self.i += 1
        while not self.shared.release.is_set():
            await asyncio.sleep(0.001)
        self.shared.release.clear()


class Seen(SharedMixin, Bolt):
    def __init__(self, shared: Shared) -> None:
        self.shared = shared

    def execute(self, tup: Tuple) -> None:
        self.shared.seen.append(tup["n"])


async def test_a_spout_that_waits_between_tuples_has_each_delivered_within_the_flush_interval() -> None:
    shared = Shared()
    engine = _engine(Gated(shared), Seen(shared))     # batch.size 256: a batch never fills here
    run = asyncio.create_task(engine.run())
    for n in range(3):
        deadline = time.monotonic() + HANG_GUARD_S
        while len(shared.seen) <= n:            # tuple n arrives while the spout still waits
            assert time.monotonic() < deadline, f"tuple {n} held back in a partial batch"
            await asyncio.sleep(0.005)
        shared.release.set()
    await asyncio.wait_for(run, HANG_GUARD_S)
    assert shared.seen == [0, 1, 2]


def test_the_emit_rate_has_a_figure_before_the_sampler_gives_one() -> None:
    shared = Shared()
    engine = _engine(Count(shared, 10), Seen(shared))
    spout = engine.spout_tasks[0]
    now = [100.0]
    spout.clock = lambda: now[0]
    assert spout.observed_rate() == 0.0                 # not started
    spout._start_meters()
    spout.stats.emitted = 300
    now[0] = 100.04
    assert spout.observed_rate() == 0.0                 # under 50 ms: no figure yet
    now[0] = 100.1
    assert spout.observed_rate() == pytest.approx(3000.0)   # the mean since the start
    spout.sample(100.25)                                 # the sampler's first period
    assert spout.observed_rate() == pytest.approx(300 / 0.25)


# -- seams.ShareRouter: weighted shuffle for load balancing -------------------------------------

def test_set_shares_weights_a_shuffle_edge_and_leaves_a_fields_edge_alone() -> None:
    b = TopologyBuilder("shares", {"backpressure.policy": "none"})
    b.spout("src", Count(Shared(), 1))
    b.bolt("work", Seen(Shared()), parallelism=2).shuffle("src")
    b.bolt("keyed", Seen(Shared()), parallelism=2).fields("src", "n")
    engine = LocalEngine(b.build())
    spout = engine.spout_tasks[0]
    w1, w2 = engine.task_ids["work"]
    assert engine.set_shares(spout.task_id, "work", {w1: 0.8, w2: 0.2})
    assert not engine.set_shares(spout.task_id, "keyed", {t: 0.5 for t in engine.task_ids["keyed"]})
    router = next(r for routes in spout.outbox.streams.values() for r in routes.routers
                  if r.targets == [w1, w2])
    picks = [router.targets[router.select([i])] for i in range(1000)]
    assert picks.count(w1) == 800 and picks.count(w2) == 200
    assert max(len(run) for run in "".join("a" if p == w1 else "b" for p in picks).split("a")) <= 1
