"""The document's message queue and task states, on the embedded tree and on a real ZooKeeper."""
from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import time
from typing import AsyncIterator

import pytest

from backpressure.coordinator.base import Coordinator
from backpressure.signals import BACKPRESSURE, RELEASE, Signal, TaskState
from coord_backends import Backend, backend, until, zookeeper  # noqa: F401

pytestmark = pytest.mark.timeout(120)


class Seen:
    """Collects what a coordinator's state callback reports."""

    def __init__(self) -> None:
        self.states: dict[int, TaskState | None] = {}
        self.log: list[tuple[int, TaskState | None]] = []

    def __call__(self, task: int, state: TaskState | None) -> None:
        self.states[task] = state
        self.log.append((task, state))


async def drain(c: Coordinator, n: int, timeout: float = 10.0) -> list[Signal]:
    out = []
    for _ in range(n):
        out.append(await asyncio.wait_for(c.trigger_queue.get(), timeout))
    return out


def sig(source: int, target: int, k: int = 1, seq: int = 1, kind: str = BACKPRESSURE) -> Signal:
    return Signal(kind, target, source, k, seq, 0.0)


@contextlib.asynccontextmanager
async def one_process(backend: Backend, tasks: list[int]) -> AsyncIterator[Coordinator]:
    c = backend.coordinator()
    await c.start(tasks, Seen())
    try:
        yield c
    finally:
        await c.stop()


@contextlib.asynccontextmanager
async def two_processes(backend: Backend, k: int = 1) -> AsyncIterator[tuple[Coordinator, Coordinator, Seen]]:
    """Process a runs task 1 (state published with ``k``, seen by b); b runs task 2."""
    a, b = backend.coordinator(), backend.coordinator()
    seen_b = Seen()
    await a.start([1], Seen())
    await b.start([2], seen_b)
    try:
        a.publish(TaskState(task=1, k=k, version=(1, 1)))
        await until(lambda: seen_b.states.get(1) is not None, what="b sees task 1")
        yield a, b, seen_b
    finally:
        await a.stop()
        await b.stop()


async def test_signal_travels_to_its_target_and_the_znode_is_deleted(backend: Backend) -> None:
    async with one_process(backend, [1, 2]) as c:
        c.send(sig(2, 1))
        (got,) = await drain(c, 1)
        assert got == sig(2, 1)
        await until(lambda: c.counters["consumed"] == 1 and not c._undeleted, what="consumed")
        assert await c.store.children(c.layout.messages) == []


async def test_messages_are_read_in_sequence_order(backend: Backend) -> None:
    async with one_process(backend, [1]) as c:
        sent = [sig(source, 1, k=source, seq=source) for source in range(10, 40)]
        for s in sent:
            c.send(s)
        assert await drain(c, len(sent)) == sent


async def test_each_process_consumes_only_its_own_targets(backend: Backend) -> None:
    a, b = backend.coordinator(), backend.coordinator()
    await a.start([1], Seen())
    await b.start([2], Seen())
    try:
        a.send(sig(1, 2, seq=5))
        b.send(sig(2, 1, seq=6))
        assert await drain(b, 1) == [sig(1, 2, seq=5)]
        assert await drain(a, 1) == [sig(2, 1, seq=6)]
        await asyncio.sleep(0.2)
        assert a.trigger_queue.empty() and b.trigger_queue.empty()
    finally:
        await a.stop()
        await b.stop()


async def test_send_queue_keeps_the_newest_signal_per_pair(backend: Backend) -> None:
    async with one_process(backend, [1]) as c:
        await c.stop()          # no handlers: signals stay queued
        for seq in range(1, 6):
            c.send(sig(2, 1, k=seq, seq=seq))
        c.send(sig(3, 1, k=1, seq=9))
        assert len(c.send_queue) == 2
        c2 = backend.coordinator()
        await c2.start([1], Seen())
        c2.send_queue = c.send_queue
        c2._tasks.append(asyncio.create_task(c2._create_handler()))
        got = await drain(c2, 2)
        assert got == [sig(2, 1, k=5, seq=5), sig(3, 1, k=1, seq=9)]
        await c2.stop()


async def test_malformed_message_znode_is_logged_skipped_and_deleted(backend: Backend, caplog: pytest.LogCaptureFixture) -> None:
    async with one_process(backend, [1]) as c:
        await c.store.create(c.layout.message_prefix(1), b"\xc1garbage", sequence=True)
        await c.store.create(c.layout.message_prefix(1), b"\x00" * 70_000, sequence=True)     # over the size limit
        await c.store.create(c.layout.message_prefix(1), sig(3, 2).encode(), sequence=True)   # names 1, carries 2
        c.send(sig(2, 1, seq=7))
        assert await drain(c, 1) == [sig(2, 1, seq=7)]
        await until(lambda: c.counters["malformed"] == 3, what="three malformed znodes counted")
        await until(lambda: not c._undeleted)
        assert await c.store.children(c.layout.messages) == []
        assert "malformed" in caplog.text


async def test_stale_messages_from_an_earlier_run_are_purged(backend: Backend) -> None:
    c = backend.coordinator()
    await c.start([5], Seen())
    await c.stop()
    raw = backend.coordinator()
    await raw.start([99], Seen())
    await raw.store.create(raw.layout.message_prefix(1), sig(2, 1, seq=10**15).encode(), sequence=True)
    c2 = backend.coordinator()
    await c2.start([1], Seen())
    try:
        await asyncio.sleep(0.2)
        assert c2.trigger_queue.empty()
    finally:
        await c2.stop()
        await raw.stop()


async def test_states_are_published_watched_and_removed_when_the_owner_stops(backend: Backend) -> None:
    a, b = backend.coordinator(), backend.coordinator()
    seen_a, seen_b = Seen(), Seen()
    await a.start([1], seen_a)
    await b.start([2], seen_b)
    try:
        a.publish(TaskState(task=1, component="spout", k=0, version=(1, 1)))
        await until(lambda: seen_b.states.get(1) is not None, what="b sees task 1")
        a.publish(TaskState(task=1, component="spout", k=2, backpressure=True, version=(1, 2)))
        await until(lambda: seen_b.states[1] is not None and seen_b.states[1].k == 2, what="b sees k=2")
        # Every task watches, the publisher too; its own watch may fire after b's.
        await until(lambda: seen_a.states.get(1) is not None and seen_a.states[1].k == 2, what="a sees k=2")
        b.publish(TaskState(task=2, component="bolt", holds={1: 2}, version=(2, 1)))
        await until(lambda: seen_a.states.get(2) is not None, what="a sees task 2")
        assert seen_a.states[2].holds == {1: 2}                              # type: ignore[union-attr]
        await b.stop()
        await until(lambda: 2 in seen_a.states and seen_a.states[2] is None, what="a sees task 2 gone")
    finally:
        await a.stop()
        await b.stop()


async def test_malformed_state_is_ignored(backend: Backend) -> None:
    a = backend.coordinator()
    seen = Seen()
    await a.start([1], seen)
    try:
        await a.store.create(a.layout.state(7), b"\x93garbage", ephemeral=True)
        a.publish(TaskState(task=1, version=(1, 1)))
        await until(lambda: seen.states.get(1) is not None)
        await until(lambda: a.counters["malformed"] >= 1, what="malformed state counted")
        assert 7 not in seen.states
    finally:
        await a.stop()


async def test_outage_queues_signals_and_reconnection_delivers_them_and_republishes(backend: Backend) -> None:
    async with two_processes(backend) as (a, b, seen_b):
        await backend.outage_begin()
        await asyncio.sleep(0.3)
        a.send(sig(1, 2, seq=11))                       # while the coordinator is down
        a.publish(TaskState(task=1, k=3, version=(1, 2)))
        await asyncio.sleep(0.3)
        assert b.trigger_queue.empty()
        await backend.outage_end()
        assert await drain(b, 1, timeout=20) == [sig(1, 2, seq=11)]
        await until(lambda: seen_b.states.get(1) is not None and seen_b.states[1].k == 3, 20,
                    what="state published during the outage arrives")
        # watches are re-armed after the reconnection
        a.send(sig(1, 2, seq=12))
        assert await drain(b, 1) == [sig(1, 2, seq=12)]
        a.publish(TaskState(task=1, k=4, version=(1, 3)))
        await until(lambda: seen_b.states[1] is not None and seen_b.states[1].k == 4, what="re-armed state watch")


async def test_session_expiry_republishes_ephemeral_state_and_keeps_delivering(backend: Backend) -> None:
    async with two_processes(backend, k=2) as (a, b, seen_b):
        await backend.expire(a)
        await until(lambda: a.counters["resyncs"] >= 1, 20, what="a resynced after expiry")
        await until(lambda: seen_b.states.get(1) is not None and seen_b.states[1].k == 2, 20,
                    what="task 1's state is back")
        names = await b.store.children(b.layout.states)
        assert "1" in names
        a.send(sig(1, 2, seq=3))
        b.send(sig(2, 1, seq=4))
        assert await drain(b, 1) == [sig(1, 2, seq=3)]
        assert await drain(a, 1) == [sig(2, 1, seq=4)]


async def test_expired_process_state_disappears_for_others_until_republished(backend: Backend) -> None:
    """A process that dies (its session closes) takes its task states with it."""
    async with two_processes(backend) as (a, b, seen_b):
        for t in a._tasks:
            t.cancel()
        await a.store.close()                       # the process is gone, no clean-up of its own
        a._started = False
        await until(lambda: 1 in seen_b.states and seen_b.states[1] is None, 20, what="state of task 1 gone")


async def test_release_kind_round_trips(backend: Backend) -> None:
    async with one_process(backend, [1]) as c:
        c.send(sig(2, 1, k=0, seq=3, kind=RELEASE))
        assert await drain(c, 1) == [sig(2, 1, k=0, seq=3, kind=RELEASE)]


def test_factory_maps_policy_and_coordinator() -> None:
    from backpressure.coordinator.embedded import EmbeddedCoordinator
    from backpressure.coordinator.zookeeper import ZooKeeperCoordinator
    from backpressure.drivers.factory import make_flow_control
    from backpressure.seams import NoFlowControl
    from backpressure.drivers.stepwise import StepwiseFlowControl
    from topo.config import ConfigError, resolve

    assert isinstance(make_flow_control(resolve({"backpressure.policy": "none"}), "t"), NoFlowControl)
    fc = make_flow_control(resolve({"backpressure.step": 0.25, "queue.high_mark": "10MB"}), "t")
    assert isinstance(fc, StepwiseFlowControl) and isinstance(fc.coordinator, EmbeddedCoordinator)
    assert fc.params.step == 0.25 and fc.params.high_mark == 10_000_000 and fc.coordinator.layout.base == "/topo/t"
    zk = make_flow_control(resolve({"coordinator": "zookeeper://127.0.0.1:1/apps/topo"}), "wc")
    assert isinstance(zk, StepwiseFlowControl) and isinstance(zk.coordinator, ZooKeeperCoordinator)
    assert zk.coordinator.layout.messages == "/apps/topo/wc/taskmessage"
    assert zk.coordinator.layout.states == "/apps/topo/wc/taskstate"
    with pytest.raises(ConfigError):
        resolve({"coordinator": "zk://nowhere"})


@pytest.mark.zookeeper
async def test_engine_run_through_the_factory_on_zookeeper_leaves_no_state(zookeeper) -> None:  # type: ignore[no-untyped-def]
    from kazoo.client import KazooClient

    from runtime.local.engine import LocalEngine
    from topo.api import Bolt, EndOfStream, Spout
    from topo.topology import TopologyBuilder

    class Numbers(Spout):
        outputs = ["n"]

        def __init__(self) -> None:
            self.i = 0

        def next_tuple(self) -> None:
            if self.i >= 5000:
                raise EndOfStream
            self.collector.emit([self.i])
            self.i += 1

    class Sink(Bolt):
        def execute(self, tup) -> None:  # type: ignore[no-untyped-def]
            pass

    zookeeper.start()
    url = zookeeper.url("/topo-factory")
    b = TopologyBuilder("viafactory")
    b.spout("numbers", Numbers())
    b.bolt("sink", Sink(), 2).shuffle("numbers")
    engine = LocalEngine(b.build(), {"coordinator": url, "backpressure.sensitivity_ms": 100})
    result = await engine.run()
    assert result.component_totals()["sink"]["executed"] == 5000
    client = KazooClient(hosts=zookeeper.hosts)
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, client.start, 10)
    try:
        states = await loop.run_in_executor(None, client.get_children, "/topo-factory/viafactory/taskstate")
        messages = await loop.run_in_executor(None, client.get_children, "/topo-factory/viafactory/taskmessage")
    finally:
        await loop.run_in_executor(None, client.stop)
        client.close()
    assert states == [] and messages == []


# --- one run per topology name (issue 9, item 5) ---------------------------------------------

def _dead_pid() -> int:
    import subprocess

    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


async def test_a_second_run_of_the_same_topology_is_refused_until_the_first_stops(backend: Backend) -> None:
    from backpressure.coordinator.base import RunConflict

    a = backend.coordinator()
    await a.start([1, 2], Seen())
    try:
        b = backend.coordinator()
        with pytest.raises(RunConflict) as info:
            await b.start([1, 2], Seen())
        message = str(info.value)
        assert "\n" not in message
        assert message.startswith("topology 't' is already running under ")
        assert f"task 1 is held by pid {os.getpid()} on host {socket.gethostname()} since " in message
        assert message.endswith("; stop that run first or give this one another name (the claim of a run "
                                "that died goes with its ZooKeeper session)")
        other = backend.coordinator("another-name")        # another topology is no conflict
        await other.start([1, 2], Seen())
        await other.stop()
    finally:
        await a.stop()
    c = backend.coordinator()
    await c.start([1, 2], Seen())                          # the first run's claims went with it
    await c.stop()


async def test_a_dead_runs_claim_is_waited_out_and_a_live_ones_is_not(backend: Backend) -> None:
    from backpressure.coordinator.base import RunConflict

    holder = backend.coordinator()                         # plays a killed run whose session lingers
    await holder.store.start()
    lock = holder.layout.lock(1)
    claim = {"host": socket.gethostname(), "pid": _dead_pid(), "started": time.time()}
    await holder.store.create(lock, json.dumps(claim).encode(), ephemeral=True, makepath=True)
    try:
        b = backend.coordinator()
        b.claim_wait = 20.0
        starting = asyncio.ensure_future(b.start([1], Seen()))
        await asyncio.sleep(1.0)
        assert not starting.done()                         # waiting for the dead run's session
        await holder.store.close()                         # its session ends: the claim goes
        await asyncio.wait_for(starting, 10)
        assert json.loads(await b.store.get(lock))["pid"] == os.getpid()
        await b.stop()

        live = backend.coordinator()
        await live.start([1], Seen())
        c = backend.coordinator()
        c.claim_wait = 20.0
        started = time.monotonic()
        with pytest.raises(RunConflict):
            await c.start([1], Seen())                     # a live holder: refused at once
        assert time.monotonic() - started < 2
        await live.stop()
    finally:
        await holder.store.close()


async def test_claims_are_taken_again_after_a_session_expiry(backend: Backend) -> None:
    async with one_process(backend, [1]) as a:
        await backend.expire(a)
        await until(lambda: a.counters["resyncs"] >= 1, 20, what="a resynced after expiry")
        await until(lambda: bool(a._tasks) and a._tasks[-1].done(), 20, what="claims retaken")
        assert json.loads(await a.store.get(a.layout.lock(1)))["pid"] == os.getpid()


@pytest.mark.zookeeper
def test_a_second_topo_run_of_one_name_on_zookeeper_is_one_line(zookeeper, tmp_path) -> None:  # type: ignore[no-untyped-def]
    import signal
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parent.parent
    exe = repo / ".venv" / "bin" / "topo"
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "topo.cli"]
    zookeeper.start()
    url = zookeeper.url("/topo-twice")
    # The example's input is bounded (2,000 passes): a first run could finish, and free its
    # claim, before the second one starts. This one reads the sentences forever.
    text = (repo / "configs" / "wordcount.yaml").read_text()
    assert "repeat: 2000" in text
    spec = tmp_path / "wordcount.yaml"
    spec.write_text(text.replace("repeat: 2000", "repeat: 0"))
    args = ["run", str(spec), "--quiet", "--zk", url]
    first = subprocess.Popen([*cmd, *args, "--duration", "60"], cwd=tmp_path, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        from kazoo.client import KazooClient

        client = KazooClient(hosts=zookeeper.hosts)
        client.start(10)
        try:
            deadline = time.monotonic() + 30
            while not client.exists("/topo-twice/wordcount/tasklock/1"):
                assert time.monotonic() < deadline and first.poll() is None, "the first run did not start"
                time.sleep(0.1)
        finally:
            client.stop()
            client.close()
        second = subprocess.run([*cmd, *args, "--max-tuples", "100"], cwd=tmp_path / "..", capture_output=True,
                                text=True, timeout=60)
        assert (second.returncode, second.stdout) == (1, "")
        assert second.stderr.count("\n") == 1, second.stderr
        assert second.stderr.startswith(f"topo run: topology 'wordcount' is already running under "
                                        f"{zookeeper.hosts}/topo-twice: task 1 is held by pid {first.pid} ")
    finally:
        first.send_signal(signal.SIGTERM)
        first.communicate(timeout=60)


async def test_zookeeper_where_nothing_listens_fails_within_the_connect_timeout() -> None:
    from backpressure.coordinator.base import StoreUnavailable
    from backpressure.coordinator.zookeeper import ZooKeeperCoordinator

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]          # nothing listens once closed
    c = ZooKeeperCoordinator(f"zookeeper://127.0.0.1:{port}/topo", "t", connect_timeout=1.0)
    started = time.monotonic()
    with pytest.raises(StoreUnavailable) as info:
        await c.start([1], Seen())
    assert time.monotonic() - started < 3
    assert str(info.value) == f"cannot reach ZooKeeper at 127.0.0.1:{port} within 1s"
    assert not c.store.client.connected     # stopped: no retrying behind the caller's back
