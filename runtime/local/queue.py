"""A task's input queue, bounded in bytes of the msgpack wire encoding.

Items are transfer batches (a list of tuples and their total wire size). ``put``
waits while the queue holds bytes and the batch would take it past the hard
bound; nothing is ever dropped. The outbox never puts a batch larger than the
bound (it cuts one into pieces that fit), except a single tuple larger than the
bound, which enters an empty queue alone so it cannot deadlock its producer: a
queue's bytes exceed its hard bound by less than one tuple, never more.
"""
from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import Any


class ByteQueue:
    """FIFO of (batch, nbytes); ``bytes`` and ``count`` are exact at every moment."""

    __slots__ = ("hard_bound", "bytes", "count", "peak_bytes", "_items", "_getter", "_putters", "_loop")

    def __init__(self, hard_bound: int) -> None:
        self.hard_bound = hard_bound
        self.bytes = 0
        self.count = 0
        self.peak_bytes = 0  # high-water mark of ``bytes`` over the queue's life
        self._items: deque[tuple[list[Any], int]] = deque()
        self._getter: asyncio.Future[None] | None = None
        self._putters: deque[asyncio.Future[None]] = deque()
        self._loop: asyncio.AbstractEventLoop | None = None

    def _future(self) -> asyncio.Future[None]:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        return self._loop.create_future()

    async def put(self, batch: list[Any], nbytes: int) -> int:
        """Append a batch, waiting for room; returns nanoseconds spent waiting."""
        waited = 0
        if not (self.bytes == 0 or self.bytes + nbytes <= self.hard_bound):
            start = time.perf_counter_ns()
            while not (self.bytes == 0 or self.bytes + nbytes <= self.hard_bound):
                fut = self._future()
                self._putters.append(fut)
                try:
                    await fut
                except BaseException:
                    if fut in self._putters:
                        self._putters.remove(fut)
                    raise
            waited = time.perf_counter_ns() - start
        self._items.append((batch, nbytes))
        self.bytes += nbytes
        self.count += len(batch)
        if self.bytes > self.peak_bytes:
            self.peak_bytes = self.bytes
        g = self._getter
        if g is not None:
            self._getter = None
            if not g.done():
                g.set_result(None)
        return waited

    def put_marker(self, marker: list[Any]) -> None:
        """Append a control item (a tick) that takes no bytes and never waits."""
        self._items.append((marker, 0))
        self.count += len(marker)
        g = self._getter
        if g is not None:
            self._getter = None
            if not g.done():
                g.set_result(None)

    def get_nowait(self) -> tuple[list[Any], int] | None:
        if not self._items:
            return None
        item = self._items.popleft()
        self.bytes -= item[1]
        self.count -= len(item[0])
        self._wake_putters()
        return item

    async def get(self) -> tuple[list[Any], int]:
        while not self._items:
            fut = self._future()
            self._getter = fut
            try:
                await fut
            finally:
                if self._getter is fut:
                    self._getter = None
        item = self._items.popleft()
        self.bytes -= item[1]
        self.count -= len(item[0])
        self._wake_putters()
        return item

    def _wake_putters(self) -> None:
        # Wake every waiting producer; each re-checks the bound, in FIFO order.
        putters = self._putters
        while putters:
            f = putters.popleft()
            if not f.done():
                f.set_result(None)
