"""Document 002's cumulative ack point kept where a restarted run finds it.

The engine reports, per spout task, the spout's state at its newest cumulative ack
point (every tuple it emitted up to there is acked or dead-lettered). This module
keeps the newest one per task in the coordinator, as the persistent znode
``ZnodeLayout.resume_point(task)``: on ZooKeeper it outlives the run; on the embedded
tree a worker supervisor serves it outlives a worker (a killed worker's spout goes on
from it), not the supervisor. A restarted spout task reads it before it emits.

Why coalesced: the point moves with every batch acked; the store is written at most
once per ``interval`` per task (newest wins) and once more at stop, so a restart
resumes at most ``interval`` of acked work behind the point (sent again: at least
once, nothing lost). Why bounded: a position is a few offsets; a state whose packed
record is over ``limit`` bytes is not written (logged once per task) and that task
resumes as it would without this.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any, Iterable

import msgpack

from backpressure.coordinator.base import Coordinator, StoreUnavailable
from backpressure.signals import MAX_PAYLOAD

log = logging.getLogger(__name__)


class ResumePoints:
    """Persistent resume points of this process's spout tasks."""

    def __init__(self, coordinator: Coordinator, *, interval: float = 0.1, limit: int = MAX_PAYLOAD) -> None:
        self.coordinator = coordinator
        self.interval = interval
        self.limit = limit
        self.written: dict[int, int] = {}           # task -> the point last written
        self._dirty: dict[int, bytes] = {}
        self._points: dict[int, int] = {}
        self._too_big: set[int] = set()
        self._writer: asyncio.Task[None] | None = None

    async def start(self, local_tasks: Iterable[int]) -> None:
        await self.coordinator.start(local_tasks, lambda task, state: None)
        self._writer = asyncio.create_task(self._write_loop())

    async def read(self, task: int) -> tuple[int, Any] | None:
        """(point, spout state) a previous run of ``task`` kept; None if none (or unreadable)."""
        data = await self.coordinator.read_record(self.coordinator.layout.resume_point(task))
        if not data:
            return None
        try:
            m = msgpack.unpackb(data, raw=False, strict_map_key=False)
            return int(m["point"]), m["state"]
        except Exception as e:        # another client's bytes, or an older format: start as without
            log.warning("resume point of task %d at %s is unreadable (%s); not used", task,
                        self.coordinator.layout.resume_point(task), e)
            return None

    async def discard(self, task: int) -> None:
        """Forget what a previous run kept (``checkpoint.restore: false``, ``--from-scratch``)."""
        await self.coordinator.drop_record(self.coordinator.layout.resume_point(task))

    def keep(self, task: int, point: int, state: Any) -> None:
        """The spout's state at its new ack point; written within ``interval``."""
        payload = msgpack.packb({"point": point, "state": state}, use_bin_type=True)
        if len(payload) > self.limit:
            if task not in self._too_big:
                self._too_big.add(task)
                log.warning("task %d: its resume point is %d bytes, over the %d-byte limit: not kept",
                            task, len(payload), self.limit)
            return
        self._dirty[task] = payload
        self._points[task] = point

    async def stop(self) -> None:
        """Write what is newest, then leave the coordinator."""
        if self._writer is None:
            return
        self._writer.cancel()
        await asyncio.gather(self._writer, return_exceptions=True)
        self._writer = None
        try:
            await asyncio.wait_for(self._flush(), 5.0)
        except (StoreUnavailable, asyncio.TimeoutError) as e:
            log.warning("resume points not written at stop (%s)", type(e).__name__)
        await self.coordinator.stop()

    async def _write_loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self._flush()
            except StoreUnavailable:
                pass                                    # kept dirty: written once it is back

    async def _flush(self) -> None:
        while self._dirty:
            task, payload = next(iter(self._dirty.items()))
            point = self._points[task]
            await self.coordinator.save_record(self.coordinator.layout.resume_point(task), payload)
            if self._dirty.get(task) is payload:
                del self._dirty[task]
            self.written[task] = point
