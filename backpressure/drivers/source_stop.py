"""Source-stop backpressure (Heron's baseline) as the engine's ``FlowControl``.

Glue, not policy: one ``policy.source_stop.SourceStop`` for the topology, fed the
queue bytes of every bolt task; its STOP / RESUME decisions go to every spout task
as a rate limit (``stop_rate``) or the limiter turned off.

In process, no coordinator: the decision is one bit for the whole topology, and
Heron's stream managers broadcast it the same way. The conventions of the other
flow controls are kept so consoles and benchmarks read it alike:

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

from backpressure.policy.source_stop import BECAME_OVERLOADED, RESUME, STOP, Outcome, SourceStop, SourceStopParams
from backpressure.seams import FlowDisplay, RateListener, TaskHandle
from backpressure.signals import BACKPRESSURE, RELEASE


class SourceStopFlowControl:
    """Stops every spout while any bolt task is over the high mark."""

    def __init__(self, params: SourceStopParams, *, clock: Callable[[], float] = time.monotonic,
                 period: float = 0.01) -> None:
        self.params = params
        self.clock = clock
        self.period = period
        self.policy = SourceStop(params, clock())
        self.spouts: list[TaskHandle] = []
        self.bolts: list[TaskHandle] = []
        self.on_rate_change: RateListener | None = None
        self._timer_task: asyncio.Task[None] | None = None

    async def start(self, handles: Sequence[TaskHandle]) -> None:
        self.policy = SourceStop(self.params, self.clock())
        self.spouts = [h for h in handles if h.is_spout]
        self.bolts = [h for h in handles if not h.is_spout]
        for h in self.spouts:
            h.show(FlowDisplay())
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

    async def _timer(self) -> None:
        while True:
            await asyncio.sleep(self.period)
            for h in self.bolts:
                self.poll(h)

    def _apply(self, bolt: TaskHandle, out: Outcome) -> None:
        kind = BACKPRESSURE if out.task == BECAME_OVERLOADED else RELEASE
        bolt.count_signal("sent", kind)
        if out.spouts is None:
            return
        rate = self.params.stop_rate if out.spouts == STOP else None
        for h in self.spouts:
            h.count_signal("received", BACKPRESSURE if out.spouts == STOP else RELEASE)
            h.set_rate(rate)
            h.show(FlowDisplay(k=0 if rate is None else 1, backpressure=rate is not None))
            if self.on_rate_change is not None:
                self.on_rate_change(h.task_id, rate)

