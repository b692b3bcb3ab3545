"""Source-stop backpressure (Heron's baseline) as the engine's ``FlowControl``.

Glue, not policy: one ``policy.source_stop.SourceStop`` for the topology, fed the
queue bytes of every bolt task; its STOP / RESUME decisions go to every spout task
as a rate limit (``stop_rate``) or the limiter turned off.

In one process, no coordinator: the decision is one bit for the whole topology, and
Heron's stream managers broadcast it the same way. Across worker processes (given a
coordinator) each worker decides for its own spouts, the way each of Heron's stream
managers stops its local spouts: a bolt task's overloaded flag is published as its
task state (``shared_states``) the moment it changes, every worker mirrors the other
workers' flags into its own ``SourceStop`` (so "stopped while any bolt task anywhere
is overloaded" holds topology-wide), and a task whose state vanished (its worker
stopped or died) is forgotten. The conventions of the other flow controls are kept so
consoles and benchmarks read it alike:

* an overloaded bolt task counts one BACKPRESSURE signal sent (RELEASE when it
  recovers); each spout counts one received per STOP (RELEASE per RESUME);
* a stopped spout shows ``backpressure`` set and ``k == 1`` (its limiter has the
  ``stop_rate``); a running one ``k == 0`` and no limit;
* ``on_rate_change(task_id, rate)`` is called on every limit change (benchmarks).

``poll`` runs after each input batch; a timer observes every bolt task as well,
because a bolt blocked on a full downstream queue does not poll.
"""
from __future__ import annotations

import asyncio
import time
from typing import Callable, Sequence

from backpressure.coordinator.base import Coordinator
from backpressure.drivers.shared_states import SharedStates
from backpressure.policy.source_stop import BECAME_OVERLOADED, RESUME, STOP, Outcome, SourceStop, SourceStopParams
from backpressure.seams import FlowDisplay, RateListener, TaskHandle
from backpressure.signals import BACKPRESSURE, RELEASE, TaskState


class SourceStopFlowControl:
    """Stops every spout while any bolt task is over the high mark."""

    def __init__(self, params: SourceStopParams, *, clock: Callable[[], float] = time.monotonic,
                 period: float = 0.01, coordinator: Coordinator | None = None, heartbeat: float = 1.0) -> None:
        self.params = params
        self.clock = clock
        self.period = period
        self.policy = SourceStop(params, clock())
        self.spouts: list[TaskHandle] = []
        self.bolts: list[TaskHandle] = []
        self.on_rate_change: RateListener | None = None
        self._timer_task: asyncio.Task[None] | None = None
        # Across worker processes: the other workers' bolt flags come in as task states.
        self.shared = SharedStates(coordinator, heartbeat=heartbeat) if coordinator is not None else None
        self._handles: dict[int, TaskHandle] = {}

    async def start(self, handles: Sequence[TaskHandle]) -> None:
        self.policy = SourceStop(self.params, self.clock())
        self.spouts = [h for h in handles if h.is_spout]
        self.bolts = [h for h in handles if not h.is_spout]
        self._handles = {h.task_id: h for h in handles}
        for h in self.spouts:
            h.show(FlowDisplay())
        if self.shared is not None:
            await self.shared.start(self._handles, self.state_of, self._on_remote)
        self._timer_task = asyncio.create_task(self._timer())

    def poll(self, handle: TaskHandle) -> None:
        out = self.policy.observe(handle.task_id, handle.queue_bytes(), self.clock())
        if out.task is not None:
            self._apply(handle, out)

    async def stop(self) -> None:
        if self._timer_task is not None:
            self._timer_task.cancel()
            await asyncio.gather(self._timer_task, return_exceptions=True)
            self._timer_task = None
        now = self.clock()
        for h in self.bolts:
            out = self.policy.forget(h.task_id, now)
            if out.task is not None:
                self._apply(h, out)
        if self.shared is not None:
            for task in sorted(self.policy.overloaded):     # other workers' flags no longer hold ours
                self._settled(self.policy.forget(task, now))
            await self.shared.stop()

    async def _timer(self) -> None:
        while True:
            await asyncio.sleep(self.period)
            for h in self.bolts:
                self.poll(h)

    def _apply(self, bolt: TaskHandle, out: Outcome) -> None:
        kind = BACKPRESSURE if out.task == BECAME_OVERLOADED else RELEASE
        bolt.count_signal("sent", kind)
        if self.shared is not None:
            self.shared.publish(bolt.task_id)        # the other workers learn it now
        self._settled(out)

    def _settled(self, out: Outcome) -> None:
        if out.spouts is None:
            return
        rate = self.params.stop_rate if out.spouts == STOP else None
        for h in self.spouts:
            self._set_spout(h, rate, BACKPRESSURE if out.spouts == STOP else RELEASE)

    def _set_spout(self, h: TaskHandle, rate: float | None, kind: str) -> None:
        h.count_signal("received", kind)
        h.set_rate(rate)
        h.show(FlowDisplay(k=0 if rate is None else 1, backpressure=rate is not None))
        if self.on_rate_change is not None:
            self.on_rate_change(h.task_id, rate)
        if self.shared is not None:
            self.shared.publish(h.task_id)

    # -- across worker processes ------------------------------------------------------------

    def _on_remote(self, task: int, state: TaskState | None) -> None:
        """Another worker's task: its own policy decided whether it is overloaded; mirror that
        decision here as an observation at the mark it crossed (or forget the task)."""
        now = self.clock()
        if state is None:
            out = self.policy.forget(task, now)
        elif state.spout:
            return
        else:
            out = self.policy.observe(task, self.params.high_mark if state.backpressure else 0, now)
        self._settled(out)

    def state_of(self, task: int) -> TaskState:
        """What this worker publishes for one of its tasks."""
        assert self.shared is not None
        h = self._handles[task]
        limited = h.is_spout and self.policy.stopped
        return TaskState(task=task, component=h.component, spout=h.is_spout,
                         rate=self.params.stop_rate if limited else None, k=1 if limited else 0,
                         backpressure=limited or task in self.policy.overloaded, queue_bytes=h.queue_bytes(),
                         high_mark=self.params.high_mark, low_mark=self.params.low_mark,
                         observed_rate=float(h.observed_rate()), version=self.shared.version(), ts=time.time())

