"""JStorm's topology master (document 003), in process.

Document 003 moves backpressure coordination from ZooKeeper to the topology
master: tasks send it control messages ("this task is overloaded" / "recovered"),
it decides which upstreams slow down and sends them control messages in turn.
This is that master for one local run:

* ``report`` is a task's message: it is queued (never waits, never runs the
  master's logic inside the task's batch loop) and the master's consumer takes
  reports off in order, as a master process would off its socket;
* decisions are ``policy.watermark.MasterPolicy``'s; each resulting ``Command``
  goes to ``deliver`` (the flow control, which applies it to the spout task);
* a timer advances the policy so ramps advance while no report arrives;
* ``stop`` releases every spout it throttled.

The same messages over a socket would make it multi-process; nothing here
assumes that the tasks share the master's memory beyond the ``Report`` values.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable

from backpressure.policy.watermark import Command, MasterPolicy, Report

log = logging.getLogger(__name__)


class TopologyMaster:
    """Receives task reports, runs the master policy, sends spout commands."""

    def __init__(self, policy: MasterPolicy, *, clock: Callable[[], float] = time.monotonic,
                 period: float | None = None) -> None:
        self.policy = policy
        self.clock = clock
        self.period = period if period is not None else min(0.05, policy.params.check_interval / 8)
        self.inbox: asyncio.Queue[Report] = asyncio.Queue()
        self.counters = {"reports": 0, "commands": 0}
        self._deliver: Callable[[Command], None] = lambda cmd: None
        self._spout_rate: Callable[[int], float] = lambda task: 0.0
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def throttled(self) -> bool:
        """The topology's throttled flag (R7)."""
        return self.policy.throttled

    async def start(self, deliver: Callable[[Command], None], spout_rate: Callable[[int], float]) -> None:
        self._deliver = deliver
        self._spout_rate = spout_rate
        self._tasks = [asyncio.create_task(self._consume()), asyncio.create_task(self._timer())]

    def report(self, r: Report) -> None:
        """A task's control message to the master."""
        self.inbox.put_nowait(r)

    def forget(self, task: int) -> None:
        """A task is gone (its process died): nothing it reported holds a spout any more."""
        self._send(self.policy.forget(task, self.clock()))

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        while not self.inbox.empty():       # reports in flight no longer matter
            self.inbox.get_nowait()
        self._send(self.policy.release_all())

    async def _consume(self) -> None:
        while True:
            r = await self.inbox.get()
            self.counters["reports"] += 1
            try:
                self._send(self.policy.on_report(r, self.clock(), self._spout_rate))
            except Exception:      # one bad report must not kill the master
                log.exception("topology master: report %r", r)

    async def _timer(self) -> None:
        while True:
            await asyncio.sleep(self.period)
            self._send(self.policy.advance(self.clock()))

    def _send(self, commands: list[Command]) -> None:
        for cmd in commands:
            self.counters["commands"] += 1
            self._deliver(cmd)
