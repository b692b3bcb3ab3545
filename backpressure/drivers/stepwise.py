"""Stepwise backpressure (document 000) as the engine's ``FlowControl``.

Glue, not policy: one ``policy.stepwise.Downstream`` per bolt task (watching its
queue) and one ``policy.stepwise.Throttle`` per task (holding its emit rate),
with a ``Coordinator`` carrying what they say to each other.

* ``poll`` (after each input batch, on the hot path) is one clock read, one
  queue-bytes read and a few comparisons until a check is due; a timer does the
  same for every bolt task so an idle task still releases.
* Signals go out through the coordinator's send-queue; messages for our tasks come
  back through its trigger-queue and are applied only by their target, and only
  when their source is alive (one of ours, or a task whose state is published), so
  a late message from a dead task cannot strand an upstream.
* States: a throttled task publishes at once when its rate, flag or
  acknowledgements change (that is what ends a downstream's mid-step); every task
  re-publishes on a heartbeat (queue bytes for ``topo status``, and its ``holds``,
  which repair any lost message). Holds are deliberately *not* published the
  moment they change: the document's message path stays the fast path and the
  state is the repair path.
* A task state that disappears and stays gone for ``grace`` (its process stopped
  or died) releases whatever that task held; one that comes back within ``grace``
  (a session expiry, then the re-publish) changes nothing. ``stop`` releases
  everything this run holds.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Callable, Sequence

from backpressure.coordinator.base import Coordinator
from backpressure.policy.stepwise import Downstream, RateChange, StepwiseParams, Throttle, UpstreamView
from backpressure.seams import TaskHandle
from backpressure.signals import Signal, TaskState

log = logging.getLogger(__name__)


class StepwiseFlowControl:
    """Runs the stepwise policy over an engine's task handles."""

    def __init__(self, params: StepwiseParams, coordinator: Coordinator, *,
                 clock: Callable[[], float] = time.monotonic, tick: float | None = None,
                 heartbeat: float | None = None, grace: float | None = None) -> None:
        self.params = params
        self.coordinator = coordinator
        self.clock = clock
        self.tick = tick if tick is not None else min(0.25, max(0.005, params.sensitivity / 8))
        self.heartbeat = heartbeat if heartbeat is not None else min(1.0, params.sensitivity)
        # A state that vanished and came back within ``grace`` was a session expiry, not
        # a stopped task: its holds are kept, so an expiry does not make rates blink.
        self.grace = grace if grace is not None else max(2.0, 2 * params.sensitivity)
        self.handles: dict[int, TaskHandle] = {}
        self.downstreams: dict[int, Downstream] = {}
        self.throttles: dict[int, Throttle] = {}
        self.states: dict[int, TaskState] = {}       # every task's newest published state
        self.dropped = 0                            # messages from sources not alive
        self.on_rate_change: Callable[[int, float | None], None] | None = None   # benchmarks
        self._views: dict[int, UpstreamView] = {}
        self._gone: dict[int, asyncio.TimerHandle] = {}
        self._dirty: set[int] = set()
        self._flush_scheduled = False
        self._epoch = time.time_ns()
        self._version = 0
        self._tasks: list[asyncio.Task[None]] = []
        self._running = False

    # -- FlowControl ----------------------------------------------------------------------

    async def start(self, handles: Sequence[TaskHandle]) -> None:
        now = self.clock()
        # Signal seqs start from the wall clock in microseconds so a restarted task's
        # new signals are never mistaken for stale ones by an upstream that outlived it.
        seq_start = time.time_ns() // 1000
        for h in handles:
            self.handles[h.task_id] = h
            self.throttles[h.task_id] = Throttle(h.task_id, self.params)
            if not h.is_spout and h.upstream_task_ids:
                self.downstreams[h.task_id] = Downstream(h.task_id, h.upstream_task_ids, self.params,
                                                         now, seq_start)
            self._set_stats(h, self.throttles[h.task_id])
        await self.coordinator.start(self.handles, self._on_state)
        self._running = True
        for task_id in self.handles:
            self._publish(task_id)
        self._tasks = [asyncio.create_task(self._consume()), asyncio.create_task(self._timer())]

    def poll(self, handle: TaskHandle) -> None:
        d = self.downstreams.get(handle.task_id)
        if d is None:
            return
        now = self.clock()
        q = handle.queue_bytes()
        if d.observe(now, q):
            self._check(d, now, q)

    async def stop(self) -> None:
        if not self._running:
            return
        self._running = False
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for h in self._gone.values():
            h.cancel()
        self._gone.clear()
        now = self.clock()
        for d in self.downstreams.values():
            for sig in d.release_all(now):
                self._send(sig)
        for task_id, th in self.throttles.items():
            change = th.reset()
            if change is not None:
                self._act(task_id, change)
        for task_id in self.handles:
            self._publish(task_id)
        await self.coordinator.stop()

    # -- policy driving -------------------------------------------------------------------

    def _check(self, d: Downstream, now: float, q: int) -> None:
        for sig in d.check(now, q, self._views.get):
            self._send(sig)

    def _send(self, sig: Signal) -> None:
        self.coordinator.send(sig)
        stats = getattr(self.handles.get(sig.source), "stats", None)
        if stats is not None:
            stats.count_signal("sent", sig.kind)

    async def _consume(self) -> None:
        """The trigger-queue's consumer: each message goes to its target only."""
        queue = self.coordinator.trigger_queue
        while True:
            self._apply(await queue.get())

    def _apply(self, sig: Signal) -> None:
        th = self.throttles.get(sig.target)
        h = self.handles.get(sig.target)
        if th is None or h is None:
            return
        if sig.source not in self.handles and sig.source not in self.states:
            self.dropped += 1     # its state will carry the same hold if it is alive
            return
        stats = getattr(h, "stats", None)
        if stats is not None:
            stats.count_signal("received", sig.kind)
        before = th.applied.get(sig.source)
        change = th.on_signal(sig, h.observed_rate())
        if change is not None:
            self._act(sig.target, change)
        elif th.applied.get(sig.source) != before:
            self._mark(sig.target)      # nothing moved, but the acknowledgement must go out

    def _on_state(self, task: int, state: TaskState | None) -> None:
        """Every state change of every task (the taskstate/ watch)."""
        if state is None:
            self.states.pop(task, None)
            self._views.pop(task, None)
            if task not in self.handles and task not in self._gone:
                loop = asyncio.get_running_loop()
                self._gone[task] = loop.call_later(self.grace, self._forget, task)
            return
        gone = self._gone.pop(task, None)
        if gone is not None:
            gone.cancel()
        old = self.states.get(task)
        if old is not None and old.version > state.version:
            return
        self.states[task] = state
        self._views[task] = UpstreamView(state.k, state.at_floor, state.applied)
        for tid, th in self.throttles.items():
            held = state.holds.get(tid, 0)
            if held or task in th.holds:
                before = th.applied.get(task)
                change = th.reconcile(task, held, state.seq, self.handles[tid].observed_rate())
                if change is not None:
                    self._act(tid, change)
                elif th.applied.get(task) != before:
                    self._mark(tid)

    def _forget(self, task: int) -> None:
        """A task's state stayed gone for ``grace``: it stopped, release what it held."""
        self._gone.pop(task, None)
        for tid, th in self.throttles.items():
            change = th.forget(task, self.handles[tid].observed_rate())
            if change is not None:
                self._act(tid, change)

    def _act(self, task_id: int, change: RateChange) -> None:
        h = self.handles[task_id]
        if change.rate is None:
            h.clear_rate()
        else:
            h.set_rate(change.rate)
        self._set_stats(h, self.throttles[task_id])
        if self.on_rate_change is not None:
            self.on_rate_change(task_id, change.rate)
        self._mark(task_id)

    @staticmethod
    def _set_stats(h: TaskHandle, th: Throttle) -> None:
        stats: Any = getattr(h, "stats", None)
        if stats is None:
            return
        stats.k = th.k
        stats.backpressure = th.backpressure
        stats.rate_limit = th.rate
        if th.originv is not None:
            stats.originv = th.originv      # kept after release: the last episode's originv

    # -- timer and state publishing ---------------------------------------------------------

    async def _timer(self) -> None:
        next_beat = self.clock() + self.heartbeat
        while True:
            await asyncio.sleep(self.tick)
            now = self.clock()
            for task_id, th in self.throttles.items():
                if th.holds and not th.in_episode:
                    change = th.refresh(self.handles[task_id].observed_rate())
                    if change is not None:
                        self._act(task_id, change)
            for task_id, d in self.downstreams.items():
                q = self.handles[task_id].queue_bytes()
                if d.observe(now, q):
                    self._check(d, now, q)
            if now >= next_beat:
                next_beat = now + self.heartbeat
                for task_id in self.handles:
                    self._publish(task_id)

    def _mark(self, task_id: int) -> None:
        self._dirty.add(task_id)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        dirty, self._dirty = self._dirty, set()
        for task_id in dirty:
            self._publish(task_id)

    def state_of(self, task_id: int) -> TaskState:
        """What this process publishes for one of its tasks right now."""
        h = self.handles[task_id]
        th = self.throttles[task_id]
        d = self.downstreams.get(task_id)
        return TaskState(
            task=task_id, component=h.component, spout=h.is_spout, rate=th.rate, originv=th.originv,
            k=th.k, backpressure=th.backpressure, at_floor=th.at_floor, queue_bytes=h.queue_bytes(),
            high_mark=self.params.high_mark, low_mark=self.params.low_mark,
            observed_rate=float(h.observed_rate()), holds=dict(d.holds) if d else {},
            seq=d.seq if d else 0, applied=dict(th.applied), version=(self._epoch, self._version),
            ts=time.time())

    def _publish(self, task_id: int) -> None:
        self._version += 1
        self.coordinator.publish(self.state_of(task_id))
