"""The two coordinator backends behind one test interface (embedded and real ZooKeeper).

``backend`` is a parametrized fixture (import it, with ``zookeeper``, into the test
module): every test that takes it runs once on the
embedded tree and once on a real ZooKeeper (marked ``zookeeper``). A backend
makes coordinators that share one tree (several of them play several processes)
and injects what goes wrong in production: an outage (embedded: the connection
drops; ZooKeeper: the server process is stopped, then started again on the same
port and data) and a forced session expiry.
"""
from __future__ import annotations

import asyncio
import uuid
from typing import Callable, Iterator

import pytest

from backpressure.coordinator.base import Coordinator
from backpressure.coordinator.embedded import EmbeddedCoordinator, MemoryServer, MemoryStore
from zk_server import ZooKeeperServer, zookeeper  # noqa: F401  (the session fixture)


class Backend:
    name = ""

    def coordinator(self, topology: str = "t") -> Coordinator:
        raise NotImplementedError

    async def outage_begin(self) -> None:
        raise NotImplementedError

    async def outage_end(self) -> None:
        raise NotImplementedError

    async def expire(self, coordinator: Coordinator) -> None:
        raise NotImplementedError


class EmbeddedBackend(Backend):
    name = "embedded"

    def __init__(self) -> None:
        self.server = MemoryServer()
        self.stores: list[MemoryStore] = []

    def coordinator(self, topology: str = "t") -> Coordinator:
        c = EmbeddedCoordinator(topology, server=self.server)
        self.stores.append(c.store)  # type: ignore[arg-type]
        return c

    async def outage_begin(self) -> None:
        for s in self.stores:
            s.disconnect()

    async def outage_end(self) -> None:
        for s in self.stores:
            s.reconnect()

    async def expire(self, coordinator: Coordinator) -> None:
        self.server.expire(coordinator.store)  # type: ignore[arg-type]


class ZooKeeperBackend(Backend):
    name = "zookeeper"

    def __init__(self, server: ZooKeeperServer) -> None:
        self.server = server
        self.root = f"/topo-test-{uuid.uuid4().hex[:8]}"

    def coordinator(self, topology: str = "t") -> Coordinator:
        from backpressure.coordinator.zookeeper import ZooKeeperCoordinator

        return ZooKeeperCoordinator(self.server.url(self.root), topology, session_timeout=4.0)

    async def outage_begin(self) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.server.stop)

    async def outage_end(self) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.server.start)

    async def expire(self, coordinator: Coordinator) -> None:
        client_id = coordinator.store.client.client_id  # type: ignore[attr-defined]
        await asyncio.get_running_loop().run_in_executor(None, self.server.expire_session, client_id)


@pytest.fixture(params=["embedded", pytest.param("zookeeper", marks=pytest.mark.zookeeper)])
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    if request.param == "embedded":
        yield EmbeddedBackend()
        return
    server: ZooKeeperServer = request.getfixturevalue("zookeeper")
    server.start()
    yield ZooKeeperBackend(server)
    server.start()


async def until(cond: Callable[[], bool], timeout: float = 10.0, what: str = "condition") -> None:
    """Poll ``cond`` on the loop until it holds; fail the test after ``timeout``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not cond():
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.005)
