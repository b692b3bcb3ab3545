"""A bolt task fenced off while its component's key groups move between worker processes.

During a keyed rescale across workers no tuple may reach the rescaled component
between the moment its tasks give up the keys that leave them and the moment every
sender routes by the new owners: such a tuple would start a fresh state for its key
at the old owner. The engine swaps each of the component's targets (its own queues
and its queues to other workers) for a ``HeldQueue``: a batch put into it waits,
without being lost or reordered, until the fence is lifted, and is then routed again
by the routers as they are at that moment (the new owners, or the old ones when the
rescale was abandoned). What was already queued or on the wire drains as usual, so
the component becomes still while its upstreams keep their work.

Lifted, a ``HeldQueue`` stays in place and routes every batch again at once: an
outbox takes all its lanes' batches before its first wait, so a flush that began
before the rescale may still hold a batch routed by the old owners and look its
queue up only later. The engine swaps the queue back once every outbox that feeds
the component has begun a new flush (its earlier one is then over).
"""
from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable


class HeldQueue:
    """Looks to an outbox like the target queue it replaces; holds every put until ``lift``."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.hard_bound = inner.hard_bound
        self._lifted: asyncio.Future[Callable[[list[Any]], Awaitable[int]]] | None = None
        self.held = 0                   # batches waiting here

    @property
    def bytes(self) -> int:
        return int(self.inner.bytes)

    @property
    def count(self) -> int:
        return int(self.inner.count)

    @property
    def peak_bytes(self) -> int:
        return int(self.inner.peak_bytes)

    @property
    def lifted(self) -> bool:
        return self._lifted is not None and self._lifted.done()

    async def put(self, batch: list[Any], nbytes: int) -> int:
        """Wait for the fence to be lifted, then send ``batch`` by the routes at that moment."""
        loop = asyncio.get_running_loop()
        start = loop.time()
        if self._lifted is None:
            self._lifted = loop.create_future()
        elif self._lifted.done():                  # lifted: route again at once
            return await self._lifted.result()(batch)
        self.held += 1
        try:
            route = await asyncio.shield(self._lifted)
        finally:
            self.held -= 1
        waited = await route(batch)
        return int((loop.time() - start) * 1e9) + waited

    def put_marker(self, marker: list[Any]) -> None:
        self.inner.put_marker(marker)

    def lift(self, route: Callable[[list[Any]], Awaitable[int]]) -> None:
        """Let the held batches go: each (and each put from now on) is handed to ``route``,
        which selects its targets again."""
        if self._lifted is None:
            self._lifted = asyncio.get_running_loop().create_future()
        if not self._lifted.done():
            self._lifted.set_result(route)
