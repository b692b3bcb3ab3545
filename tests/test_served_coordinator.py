"""The embedded coordinator served over a Unix socket (what a worker supervisor runs).

Every backend test of ``test_coordinators`` runs here once more with the coordinators
on ``SocketStore`` sessions of one served ``MemoryServer`` (its own thread and loop,
as in the supervisor), so the served store keeps the same semantics. An outage is the
server dropping every connection and refusing new ones for a while; an expiry is the
server dropping one session's connection (a dropped connection ends its session).
Then what is particular to serving: ephemerals vanish with a connection, watches are
pushed, frames are bounded, and a killed worker process takes its session with it.
"""
from __future__ import annotations

import asyncio
import inspect
import os
import signal
import socket
import struct
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Iterator

import msgpack
import pytest

import test_coordinators as _shared
from backpressure.coordinator.base import (CHILD, CONNECTED, DELETED, LOST, SESSION, Coordinator, NodeExists,
                                           NoNode, StoreUnavailable, WatchEvent)
from backpressure.coordinator.served import (MAX_FRAME, ServedCoordinator, ServedThread, SocketStore,
                                             serve_in_thread)
from coord_backends import Backend, until

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[1]

# The shared backend tests, collected here again with the served backend below.
for _name, _test in vars(_shared).items():
    if _name.startswith("test_") and callable(_test) and "backend" in inspect.signature(_test).parameters:
        globals()[_name] = _test


class ServedBackend(Backend):
    name = "served"

    def __init__(self, directory: str) -> None:
        self.served = serve_in_thread(os.path.join(directory, "c.sock"))

    def coordinator(self, topology: str = "t") -> Coordinator:
        return ServedCoordinator(topology, self.served.path)

    async def outage_begin(self) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self._stop_listening)

    def _stop_listening(self) -> None:
        asyncio.run_coroutine_threadsafe(self.served.server.stop(), self.served.loop).result(10)

    async def outage_end(self) -> None:
        fut = asyncio.run_coroutine_threadsafe(self.served.server.start(), self.served.loop)
        await asyncio.wrap_future(fut)

    async def expire(self, coordinator: Coordinator) -> None:
        sid = coordinator.store.session_id  # type: ignore[attr-defined]
        self.served.call(lambda: self.served.server.drop(sid))


@pytest.fixture
def backend() -> Iterator[Backend]:
    with tempfile.TemporaryDirectory(prefix="topo-served-") as d:
        b = ServedBackend(d)
        try:
            yield b
        finally:
            b.served.stop()


@pytest.fixture
def served() -> Iterator[ServedThread]:
    with tempfile.TemporaryDirectory(prefix="topo-served-") as d:
        s = serve_in_thread(os.path.join(d, "c.sock"))
        try:
            yield s
        finally:
            s.stop()


async def test_store_calls_and_errors_round_trip(served: ServedThread) -> None:
    store = SocketStore(served.path)
    await store.start()
    try:
        assert await store.create("/a/b", b"x", makepath=True) == "/a/b"
        assert await store.get("/a/b") == b"x"
        await store.set("/a/b", b"y")
        assert await store.get("/a/b") == b"y"
        first = await store.create("/a/m-", b"", sequence=True)
        second = await store.create("/a/m-", b"", sequence=True)
        assert first < second and first.startswith("/a/m-")
        assert await store.children("/a") == sorted(["b", first[3:], second[3:]])
        with pytest.raises(NoNode):
            await store.get("/nope")
        with pytest.raises(NodeExists):
            await store.create("/a/b")
        with pytest.raises(NodeExists):
            await store.delete("/a")                       # has children
        await store.delete("/a/b")
        with pytest.raises(NoNode):
            await store.delete("/a/b")
    finally:
        await store.close()
    with pytest.raises(StoreUnavailable):
        await store.get("/a")


async def test_watches_are_pushed_once_and_ephemerals_go_with_the_connection(served: ServedThread) -> None:
    a, b = SocketStore(served.path), SocketStore(served.path)
    await a.start()
    await b.start()
    events: list[WatchEvent] = []
    try:
        await a.create("/s", b"")
        await a.create("/s/1", b"v", ephemeral=True)
        assert await b.children("/s", watch=events.append) == ["1"]
        assert await b.get("/s/1", watch=events.append) == b"v"
        await a.close()                                     # a's session ends: its ephemeral goes
        await until(lambda: len(events) == 2, what="both watches fire")
        assert sorted((e.type, e.path) for e in events) == [(CHILD, "/s"), (DELETED, "/s/1")]
        assert await b.children("/s") == []
        await b.create("/s/2", b"")                         # one-shot: nothing fires again
        await asyncio.sleep(0.1)
        assert len(events) == 2
    finally:
        await a.close()
        await b.close()


async def test_a_lost_server_fires_watches_reports_lost_and_reconnects(served: ServedThread) -> None:
    store = SocketStore(served.path)
    states: list[str] = []
    events: list[WatchEvent] = []
    store.listen(states.append)
    await store.start()
    try:
        await store.create("/e", b"", ephemeral=True)
        await store.children("/", watch=events.append)
        first = store.session_id
        served.call(lambda: served.server.drop(first))
        await until(lambda: states[-1:] == [CONNECTED] and LOST in states, what="lost, then connected again")
        assert [e.type for e in events] == [SESSION]
        assert store.session_id != first
        with pytest.raises(NoNode):
            await store.get("/e")                           # the old session's ephemeral is gone
    finally:
        await store.close()


def _raw(path: str) -> socket.socket:
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(5)
    s.connect(path)
    (n,) = struct.unpack(">I", s.recv(4))
    assert msgpack.unpackb(s.recv(n))[1] == "hello"
    return s


async def test_an_oversized_or_garbled_frame_closes_that_connection_only(served: ServedThread) -> None:
    good = SocketStore(served.path)
    await good.start()
    try:
        loop = asyncio.get_running_loop()
        for payload in (struct.pack(">I", MAX_FRAME + 1), struct.pack(">I", 3) + b"\xc1\xc1\xc1",
                        struct.pack(">I", 2) + msgpack.packb("x")[:2]):
            s = await loop.run_in_executor(None, _raw, served.path)
            try:
                s.sendall(payload)
                assert await loop.run_in_executor(None, s.recv, 1) == b""     # the server hung up
            finally:
                s.close()
        s = await loop.run_in_executor(None, _raw, served.path)
        try:                                              # a well-formed bad request is an error reply
            body = msgpack.packb([7, "get", 42, False])
            s.sendall(struct.pack(">I", len(body)) + body)
            (n,) = struct.unpack(">I", await loop.run_in_executor(None, s.recv, 4))
            assert msgpack.unpackb(await loop.run_in_executor(None, s.recv, n))[:3] == [7, "err", "BadRequest"]
        finally:
            s.close()
        with pytest.raises(ValueError, match="frame limit"):
            await good.create("/big", b"x" * (MAX_FRAME + 1))
        assert await good.create("/fine", b"") == "/fine"  # the good client was never disturbed
    finally:
        await good.close()


KILLED = """
import asyncio, sys
from backpressure.coordinator.served import SocketStore

async def main():
    s = SocketStore(sys.argv[1])
    await s.start()
    await s.create("/claim", b"", ephemeral=True)
    print("ready", flush=True)
    await asyncio.sleep(60)

asyncio.run(main())
"""


async def test_a_killed_process_takes_its_ephemerals_with_it(served: ServedThread) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-c", KILLED, served.path], env=env, stdout=subprocess.PIPE, text=True)
    store = SocketStore(served.path)
    await store.start()
    try:
        loop = asyncio.get_running_loop()
        assert (await loop.run_in_executor(None, proc.stdout.readline)).strip() == "ready"  # type: ignore[union-attr]
        assert await store.get("/claim") == b""
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)

        async def gone() -> bool:
            try:
                await store.get("/claim")
            except NoNode:
                return True
            return False
        for _ in range(200):
            if await gone():
                break
            await asyncio.sleep(0.02)
        assert await gone()
    finally:
        await store.close()
        if proc.poll() is None:
            proc.kill()
        proc.stdout.close()  # type: ignore[union-attr]
