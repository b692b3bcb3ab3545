"""JStorm water-mark backpressure (document 003) as the engine's ``FlowControl``.

Glue, not policy: one ``policy.watermark.TaskWaterMark`` per bolt task, and a
``coordinator.topology_master.TopologyMaster`` running the master's policy over
the component graph read off the task handles (``component`` and
``upstream_task_ids``): each component's source spouts are found by walking
upward (R3 of the policy).

* ``poll`` (after each input batch) is a clock read, a queue-bytes read and a
  comparison or two; a report, when one is due, is queued for the master.
* A timer observes every bolt task too (a bolt blocked on a full downstream queue
  does not poll) and measures each bolt task's *service rate*: tuples executed per
  second over the last second in which its queue was never empty, i.e. what it can
  do, not what it was offered (before the first 0.2 s of busy time, whatever span
  there is: a rough figure beats none, and R5 corrects one that is too high). It
  reads ``TaskHandle.executed_count``; a task that has executed nothing reports 0
  and the master falls back to halving the spout's rate.
* Commands from the master set or clear the spout's limiter and what it shows:
  ``backpressure`` while limited, ``k`` = ramp steps left, and ``originv`` = the
  spout's observed rate when it was first throttled in this episode. Signals are
  counted like the other policies: a report is a signal sent by the bolt task
  (BACKPRESSURE when overloaded, RELEASE when recovered), a command one received
  by the spout.
"""
from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import Callable, Sequence

from backpressure.drivers.topology_master import TopologyMaster
from backpressure.policy.watermark import (THROTTLE, Command, MasterPolicy, Report, TaskWaterMark,
                                           WaterMarkParams, source_spouts)
from backpressure.seams import FlowDisplay, RateListener, TaskHandle
from backpressure.signals import BACKPRESSURE, RELEASE


class ServiceMeter:
    """Tuples/s a task executes while its queue is never empty, over a sliding window."""

    def __init__(self, window: float = 1.0, min_span: float = 0.2) -> None:
        self.window = window
        self.min_span = min_span
        self.rate = 0.0                    # the last measurement, kept while idle
        self._samples: deque[tuple[float, int]] = deque()

    def sample(self, now: float, executed: int, busy: bool) -> float:
        s = self._samples
        if not busy:
            s.clear()
            return self.rate
        s.append((now, executed))
        while len(s) > 2 and now - s[1][0] >= self.window:
            s.popleft()
        span = now - s[0][0]
        if span >= self.min_span or (self.rate == 0.0 and span > 0):   # a first, rough figure
            self.rate = (executed - s[0][1]) / span
        return self.rate


class WatermarkFlowControl:
    """Runs the water-mark policy over an engine's task handles through a topology master."""

    def __init__(self, params: WaterMarkParams, *, clock: Callable[[], float] = time.monotonic,
                 period: float | None = None) -> None:
        self.params = params
        self.clock = clock
        self.period = period if period is not None else min(0.05, params.check_interval / 8)
        self.handles: dict[int, TaskHandle] = {}
        self.marks: dict[int, TaskWaterMark] = {}
        self.meters: dict[int, ServiceMeter] = {}
        self.master: TopologyMaster | None = None
        self.originv: dict[int, float] = {}       # spout -> its rate before the last episode
        self.limited: set[int] = set()            # spouts whose limiter is on
        self.on_rate_change: RateListener | None = None
        self._timer_task: asyncio.Task[None] | None = None

    async def start(self, handles: Sequence[TaskHandle]) -> None:
        self.handles = {h.task_id: h for h in handles}
        by_component: dict[str, list[TaskHandle]] = {}
        for h in handles:
            by_component.setdefault(h.component, []).append(h)
        inputs = {c: {self.handles[u].component for h in hs for u in h.upstream_task_ids if u in self.handles}
                  for c, hs in by_component.items()}
        spouts = {c for c, hs in by_component.items() if hs[0].is_spout}
        sources = {c: sorted(h.task_id for s in spout_comps for h in by_component[s])
                   for c, spout_comps in source_spouts(inputs, spouts).items()}
        policy = MasterPolicy(self.params, sources, {c: len(hs) for c, hs in by_component.items()})
        self.master = TopologyMaster(policy, clock=self.clock, period=self.period)
        for h in handles:
            if not h.is_spout:
                self.marks[h.task_id] = TaskWaterMark(h.task_id, h.component, self.params)
                self.meters[h.task_id] = ServiceMeter()
            else:
                h.show(FlowDisplay())
        await self.master.start(self._deliver, lambda task: self.handles[task].observed_rate())
        self._timer_task = asyncio.create_task(self._timer())

    def poll(self, handle: TaskHandle) -> None:
        m = self.marks.get(handle.task_id)
        if m is None:
            return
        r = m.observe(self.clock(), handle.queue_bytes(), self.meters[handle.task_id].rate)
        if r is not None:
            self._report(handle, r)

    async def stop(self) -> None:
        if self._timer_task is not None:
            self._timer_task.cancel()
            await asyncio.gather(self._timer_task, return_exceptions=True)
            self._timer_task = None
        if self.master is not None:
            await self.master.stop()

    def _report(self, handle: TaskHandle, r: Report) -> None:
        handle.count_signal("sent", BACKPRESSURE if r.overloaded else RELEASE)
        assert self.master is not None
        self.master.report(r)

    async def _timer(self) -> None:
        while True:
            await asyncio.sleep(self.period)
            now = self.clock()
            for task_id, meter in self.meters.items():
                h = self.handles[task_id]
                meter.sample(now, h.executed_count(), h.queue_bytes() > 0)
                self.poll(h)

    def _deliver(self, cmd: Command) -> None:
        h = self.handles.get(cmd.spout)
        if h is None:
            return
        h.count_signal("received", BACKPRESSURE if cmd.kind == THROTTLE else RELEASE)
        if cmd.rate is not None and cmd.spout not in self.limited:
            self.originv[cmd.spout] = h.observed_rate()      # the rate before this episode
        if cmd.rate is None:
            self.limited.discard(cmd.spout)
        else:
            self.limited.add(cmd.spout)
        h.set_rate(cmd.rate)
        h.show(FlowDisplay(cmd.k, cmd.rate is not None, self.originv.get(cmd.spout)))
        if self.on_rate_change is not None:
            self.on_rate_change(cmd.spout, cmd.rate)

