"""Task states shared between worker processes, for the policies that decide over the
whole topology (``source_stop``, ``watermark``).

In one process those policies read every task's queue directly. When the tasks live
in several worker processes, each process publishes its own tasks' states through the
coordinator (``taskstate/<task_id>`` znodes: ZooKeeper, or the embedded tree the
supervisor serves) and is handed every other task's state by the coordinator's watch.
What a state means is the policy's business; this module only carries them:

* ``publish(task_id)`` queues a fresh state at once (a task's flag changed: the other
  processes must learn it now, that is the signal path); a heartbeat re-publishes every
  local task once per ``heartbeat`` (queue bytes for ``topo status``; it also repairs a
  state a watch coalesced away);
* ``on_remote(task, state)`` is called for every state change of a task of another
  process, and with ``None`` when its state vanished (its process stopped or died: the
  znodes are ephemeral), so a dead task never holds anything;
* ``version`` orders a task's publishes: ``(run, counter)``, ``run`` drawn at random per
  process start, so a restarted worker's states are newer whatever its clock says.
"""
from __future__ import annotations

import asyncio
import secrets
from typing import Callable, Iterable

from backpressure.coordinator.base import Coordinator
from backpressure.signals import TaskState

StateOf = Callable[[int], TaskState]
RemoteState = Callable[[int, "TaskState | None"], None]


class SharedStates:
    """Publishes this process's task states and hands the others' to ``on_remote``."""

    def __init__(self, coordinator: Coordinator, *, heartbeat: float = 1.0) -> None:
        self.coordinator = coordinator
        self.heartbeat = heartbeat
        self.run = secrets.randbits(62)
        self.local: frozenset[int] = frozenset()
        self._version = 0
        self._state_of: StateOf = lambda task: TaskState(task)
        self._on_remote: RemoteState = lambda task, state: None
        self._beat: asyncio.Task[None] | None = None

    async def start(self, local: Iterable[int], state_of: StateOf, on_remote: RemoteState) -> None:
        """Claim the local tasks, publish their states, read everyone else's."""
        self.local = frozenset(local)
        self._state_of, self._on_remote = state_of, on_remote
        await self.coordinator.start(self.local, self._on_state)
        for task in sorted(self.local):
            self.publish(task)
        self._beat = asyncio.create_task(self._heartbeat())

    def version(self) -> tuple[int, int]:
        self._version += 1
        return (self.run, self._version)

    def publish(self, task: int) -> None:
        self.coordinator.publish(self._state_of(task))

    async def stop(self) -> None:
        """Publish the last states (flags cleared by the caller), then leave: our states vanish."""
        if self._beat is None:
            return
        self._beat.cancel()
        await asyncio.gather(self._beat, return_exceptions=True)
        self._beat = None
        for task in sorted(self.local):
            self.publish(task)
        await self.coordinator.stop()

    def _on_state(self, task: int, state: TaskState | None) -> None:
        if task not in self.local:
            self._on_remote(task, state)

    async def _heartbeat(self) -> None:
        while True:
            await asyncio.sleep(self.heartbeat)
            for task in sorted(self.local):
                self.publish(task)
