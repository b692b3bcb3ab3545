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

Across worker processes (given a coordinator and the topology's ``graph``, which no
worker can read off its own handles) the master is replicated: every worker runs one
over the reports of every bolt task and obeys only the commands for its own spouts. A
spout's commands depend only on the reports of the components it feeds and on its own
rate, which its worker has, so each spout is governed exactly as by one master, with
no election and nothing to hand over when a worker dies. Reports travel as task
states (``shared_states``): a local report is also published at once as the bolt's
state (overloaded flag, queue bytes, service rate, and a report count in ``seq`` that
tells a report from a heartbeat); another worker's master takes each state with a new
count as that report, and a bolt whose state vanished (its worker stopped or died) is
forgotten.
"""
from __future__ import annotations

import asyncio
import time
from typing import Callable, Mapping, Sequence

from backpressure.coordinator.base import Coordinator
from backpressure.drivers.count_window import CountWindow
from backpressure.drivers.shared_states import SharedStates
from backpressure.drivers.topology_master import TopologyMaster
from backpressure.policy.watermark import (THROTTLE, Command, MasterPolicy, Report, TaskWaterMark,
                                           WaterMarkParams, source_spouts)
from backpressure.seams import FlowDisplay, RateListener, TaskHandle
from backpressure.signals import BACKPRESSURE, RELEASE, TaskState

# component -> (is a spout, its task ids, the components it reads from)
Graph = Mapping[str, tuple[bool, Sequence[int], Sequence[str]]]


class ServiceMeter:
    """Tuples/s a task executes while its queue is never empty, over a sliding window."""

    def __init__(self, window: float = 1.0, min_span: float = 0.2) -> None:
        self.window = window
        self.min_span = min_span
        self.rate = 0.0                    # the last measurement, kept while idle
        self._executed = CountWindow(window)

    def sample(self, now: float, executed: int, busy: bool) -> float:
        if not busy:
            self._executed.clear()
            return self.rate
        self._executed.sample(now, executed)
        done, span = self._executed.since_oldest(now, executed) or (0, 0.0)
        if span >= self.min_span or (self.rate == 0.0 and span > 0):   # a first, rough figure
            self.rate = done / span
        return self.rate


class WatermarkFlowControl:
    """Runs the water-mark policy over an engine's task handles through a topology master."""

    def __init__(self, params: WaterMarkParams, *, clock: Callable[[], float] = time.monotonic,
                 period: float | None = None, coordinator: Coordinator | None = None,
                 graph: Graph | None = None, heartbeat: float = 1.0) -> None:
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
        self.graph = graph
        self.shared = SharedStates(coordinator, heartbeat=heartbeat) if coordinator is not None else None
        self.reports: dict[int, int] = {}                      # local bolt -> reports it made
        self._seen: dict[int, tuple[int, int]] = {}           # remote bolt -> (run, report count) taken

    async def start(self, handles: Sequence[TaskHandle]) -> None:
        self.handles = {h.task_id: h for h in handles}
        graph = self.graph if self.graph is not None else _graph_of(handles)
        inputs = {c: set(ins) for c, (_, _, ins) in graph.items()}
        spouts = {c for c, (spout, _, _) in graph.items() if spout}
        sources = {c: sorted(t for s in spout_comps for t in graph[s][1])
                   for c, spout_comps in source_spouts(inputs, spouts).items()}
        policy = MasterPolicy(self.params, sources, {c: len(tasks) for c, (_, tasks, _) in graph.items()})
        self.master = TopologyMaster(policy, clock=self.clock, period=self.period)
        for h in handles:
            if not h.is_spout:
                self.marks[h.task_id] = TaskWaterMark(h.task_id, h.component, self.params)
                self.meters[h.task_id] = ServiceMeter()
            else:
                h.show(FlowDisplay())
        await self.master.start(self._deliver, self._spout_rate)
        if self.shared is not None:
            await self.shared.start(self.handles, self.state_of, self._on_remote)
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
        if self.shared is not None:
            await self.shared.stop()

    def _spout_rate(self, task: int) -> float:
        h = self.handles.get(task)
        return h.observed_rate() if h is not None else 0.0     # another worker's spout: not ours to command

    def _report(self, handle: TaskHandle, r: Report) -> None:
        handle.count_signal("sent", BACKPRESSURE if r.overloaded else RELEASE)
        assert self.master is not None
        self.master.report(r)
        if self.shared is not None:
            self.reports[r.task] = self.reports.get(r.task, 0) + 1
            self.shared.publish(r.task)              # the other workers' masters take it now

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
        if self.shared is not None:
            self.shared.publish(cmd.spout)

    # -- across worker processes ------------------------------------------------------------

    def _on_remote(self, task: int, state: TaskState | None) -> None:
        """Another worker's task state: a bolt's with a new report count is that report."""
        assert self.master is not None
        if state is None:
            self._seen.pop(task, None)
            self.master.forget(task)
            return
        if state.spout:
            return
        key = (state.version[0], state.seq)
        if self._seen.get(task) == key:
            return                                   # a heartbeat: nothing new was reported
        self._seen[task] = key
        if state.seq == 0:                           # a (re)started worker: nothing reported yet
            if not state.backpressure:
                self.master.forget(task)
            return
        self.master.report(Report(task, state.component, state.backpressure,
                                  state.queue_bytes / self.params.capacity, state.service_rate, self.clock()))

    def state_of(self, task: int) -> TaskState:
        """What this worker publishes for one of its tasks (a bolt's carries its last report)."""
        assert self.shared is not None and self.master is not None
        h = self.handles[task]
        version = self.shared.version()
        if h.is_spout:
            rate = self.master.policy.rate(task)
            st = self.master.policy.spouts.get(task)
            return TaskState(task=task, component=h.component, spout=True, rate=rate,
                             originv=self.originv.get(task), k=st.k if st is not None and rate else 0,
                             backpressure=task in self.limited, observed_rate=float(h.observed_rate()),
                             version=version, ts=time.time())
        m = self.marks[task]
        return TaskState(task=task, component=h.component, spout=False, backpressure=m.overloaded,
                         queue_bytes=h.queue_bytes(), high_mark=int(self.params.high_bytes),
                         low_mark=int(self.params.low_bytes), observed_rate=float(h.observed_rate()),
                         seq=self.reports.get(task, 0), version=version, ts=time.time(),
                         service_rate=self.meters[task].rate)


def _graph_of(handles: Sequence[TaskHandle]) -> dict[str, tuple[bool, list[int], set[str]]]:
    """The component graph read off one process's handles (all of a single-process run's)."""
    by_id = {h.task_id: h for h in handles}
    graph: dict[str, tuple[bool, list[int], set[str]]] = {}
    for h in handles:
        spout, tasks, inputs = graph.setdefault(h.component, (h.is_spout, [], set()))
        tasks.append(h.task_id)
        inputs.update(by_id[u].component for u in h.upstream_task_ids if u in by_id)
    return graph

