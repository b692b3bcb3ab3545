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
  state is the repair path. Under ``hold_starved`` a bolt holding its upstreams
  also publishes when its queue runs idle (at most every quarter light window), so
  its downstreams' light windows see every idle spell, not the heartbeat's.
* What a published state means (version ordering, which throttles to reconcile,
  forgetting a task whose state stayed gone for ``grace``) is the pure
  ``policy.stepwise.PeerStates``'s decision; the timer asks it which gone tasks
  expired. ``stop`` releases everything this run holds.
* Under ``step_from_recent_rate`` the timer also samples every task's emitted
  count, and each throttle is told what its task emitted over the last
  ``recent_window`` (a ``CountWindow``).
"""
from __future__ import annotations

import asyncio
import logging
import secrets
import time
from typing import Callable, Sequence

from backpressure.coordinator.base import Coordinator
from backpressure.drivers.count_window import CountWindow
from backpressure.policy.stepwise import (Downstream, LimitInUse, PeerStates, RateChange, Recent,
                                          StateOutcome, StepwiseParams, Throttle)
from backpressure.seams import FlowDisplay, RateListener, TaskHandle
from backpressure.signals import Signal, TaskState

log = logging.getLogger(__name__)


class StepwiseFlowControl:
    """Runs the stepwise policy over an engine's task handles."""

    def __init__(self, params: StepwiseParams, coordinator: Coordinator, *,
                 clock: Callable[[], float] = time.monotonic, period: float | None = None,
                 heartbeat: float | None = None, grace: float | None = None) -> None:
        self.params = params
        self.coordinator = coordinator
        self.clock = clock
        self.period = period if period is not None else min(
            0.25, max(0.005, min(params.sensitivity, params.light_window) / 8))
        self.heartbeat = heartbeat if heartbeat is not None else min(1.0, params.sensitivity)
        # A state that vanished and came back within ``grace`` was a session expiry, not
        # a stopped task: its holds are kept, so an expiry does not make rates blink.
        self.grace = grace if grace is not None else max(2.0, 2 * params.sensitivity)
        self.handles: dict[int, TaskHandle] = {}
        self.downstreams: dict[int, Downstream] = {}
        self.throttles: dict[int, Throttle] = {}
        self.peers = PeerStates(self.throttles, self.grace)
        self.dropped = 0                            # messages from sources not alive
        self.on_rate_change: RateListener | None = None
        self._dirty: set[int] = set()
        self._flush_scheduled = False
        # One random id per run: signal seqs and state versions count within it, so a
        # restarted process is newer than its old run whatever its clock says.
        self.run = secrets.randbits(62)
        self._version = 0
        self._tasks: list[asyncio.Task[None]] = []
        self._running = False
        self._idle: dict[int, bool] = {}               # hold_starved: bolt task -> its queue was idle
        self._idle_published: dict[int, float] = {}    # hold_starved: when it last published for that
        self._recent: dict[int, CountWindow] = {}      # step_from_recent_rate: task -> its emitted count
        self._dry_seen: dict[int, int] = {}            # dry_release_window: spout task -> dry count last tick
        self._dry: dict[int, bool] = {}                # dry_release_window: it ran dry under its limit
        self._dry_published: dict[int, tuple[float, bool]] = {}   # (when, what) it last published of that
        self._in_use: dict[int, LimitInUse] = {}        # release_in_use: bolt task -> since when its limit binds

    @property
    def states(self) -> dict[int, TaskState]:
        """Every task's newest published state, as this process has seen it."""
        return self.peers.states

    # -- FlowControl ----------------------------------------------------------------------

    async def start(self, handles: Sequence[TaskHandle]) -> None:
        now = self.clock()
        for h in handles:
            self.handles[h.task_id] = h
            self.throttles[h.task_id] = Throttle(h.task_id, self.params)
            if not h.is_spout and h.upstream_task_ids:
                self.downstreams[h.task_id] = Downstream(h.task_id, h.upstream_task_ids, self.params,
                                                         now, self.run)
            self._show(h.task_id)
        self._sample_recent(now)
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
        self._watch_idle(d, now, q)
        if d.observe(now, q):
            self._check(d, now, q)

    def _watch_idle(self, d: Downstream, now: float, q: int) -> None:
        """``hold_starved``: a bolt holding its upstreams publishes at once when its queue runs idle (at most
        every quarter light window), so a downstream's light window knows whether it was starved in it."""
        idle = q <= self.params.low_mark / 32
        was = self._idle.get(d.task_id, False)
        self._idle[d.task_id] = idle
        if (idle and not was and d.wants and self.params.hold_starved
                and now - self._idle_published.get(d.task_id, -1e9) >= self.params.light_window / 4):
            self._idle_published[d.task_id] = now
            self._publish(d.task_id)

    def _watch_dry(self, now: float) -> None:
        """``dry_release_window``: whether each spout's source ran dry under its limit since the last tick;
        a change is published at once (at most every quarter light window; a change held back goes out at
        a later tick), so a downstream's light window knows whether the limit was in use in it."""
        if not self.params.dry_release_window:
            return
        for task_id, h in self.handles.items():
            if not h.is_spout:
                continue
            n = h.dry_count()
            dry = n != self._dry_seen.get(task_id, n) and self.throttles[task_id].rate is not None
            self._dry_seen[task_id] = n
            self._dry[task_id] = dry
            when, said = self._dry_published.get(task_id, (-1e9, False))
            if dry != said and now - when >= self.params.light_window / 4:
                self._dry_published[task_id] = (now, dry)
                self._publish(task_id)

    def _watch_in_use(self, now: float) -> None:
        """``release_in_use``: since when each bolt's limit has bound its emits, from its limiter's waits;
        a change is published at once, so a downstream's light window knows whether the limit was in use."""
        if not self.params.release_in_use:
            return
        for task_id, h in self.handles.items():
            if h.is_spout:
                continue
            spell = self._in_use.get(task_id)
            if spell is None:
                spell = self._in_use[task_id] = LimitInUse()
            if spell.sample(now, h.wait_count(), self.throttles[task_id].rate):
                self._mark(task_id)

    async def stop(self) -> None:
        if not self._running:
            return
        self._running = False
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        now = self.clock()
        for d in self.downstreams.values():
            for sig in d.release_all(now):
                self._send(sig)
        for task_id, th in self.throttles.items():
            change = th.reset(now)
            if change is not None:
                self._act(task_id, change)
        for task_id in self.handles:
            self._publish(task_id)
        await self.coordinator.stop()

    # -- policy driving -------------------------------------------------------------------

    def _rate_of(self, task_id: int) -> float:
        return self.handles[task_id].observed_rate()

    def _sample_recent(self, now: float) -> None:
        if not self.params.step_from_recent_rate:
            return
        for task_id, h in self.handles.items():
            meter = self._recent.get(task_id)
            if meter is None:
                meter = self._recent[task_id] = CountWindow(self.params.recent_window)
            meter.sample(now, h.emitted_count())

    def _recent_of(self, task_id: int) -> Recent | None:
        meter = self._recent.get(task_id)
        if meter is None:
            return None
        h = self.handles[task_id]
        got = meter.since_oldest(self.clock(), h.emitted_count())
        return None if got is None else Recent(got[0], got[1], None if h.is_spout else h.queue_bytes())

    def _check(self, d: Downstream, now: float, q: int) -> None:
        at_intake = d.at_intake
        for sig in d.check(now, q, self.peers.view):
            self._send(sig)
        if d.at_intake != at_intake:
            self._mark(d.task_id)   # within_intake: its downstreams read whether its limit is in use

    def _send(self, sig: Signal) -> None:
        self.coordinator.send(sig)
        self.handles[sig.source].count_signal("sent", sig.kind)

    async def _consume(self) -> None:
        """The trigger-queue's consumer: each message goes to its target only."""
        queue = self.coordinator.trigger_queue
        while True:
            self._apply(await queue.get())

    def _apply(self, sig: Signal) -> None:
        th = self.throttles.get(sig.target)
        if th is None:
            return
        if not self.peers.alive(sig.source):
            self.dropped += 1     # its state will carry the same hold if it is alive
            return
        self.handles[sig.target].count_signal("received", sig.kind)
        before = th.applied.get(sig.source)
        change = th.on_signal(sig, self._rate_of(sig.target), self.clock(), self._recent_of(sig.target))
        if change is not None:
            self._act(sig.target, change)
        elif th.applied.get(sig.source) != before:
            self._mark(sig.target)      # nothing moved, but the acknowledgement must go out

    def _on_state(self, task: int, state: TaskState | None) -> None:
        """Every state change of every task (the taskstate/ watch)."""
        self._carry_out(self.peers.update(task, state, self.clock(), self._rate_of, self._recent_of))

    def _carry_out(self, out: StateOutcome) -> None:
        for tid, change in out.changes:
            self._act(tid, change)
        for tid in out.acknowledged:
            self._mark(tid)

    def _act(self, task_id: int, change: RateChange) -> None:
        if change.up and task_id in self.downstreams:
            self.downstreams[task_id].own_limit_rose()
        if self.params.within_intake and task_id in self.downstreams:
            self.downstreams[task_id].own_limit(self._intake(task_id, change.rate))
        self.handles[task_id].set_rate(change.rate)
        self._show(task_id)
        if self.on_rate_change is not None:
            self.on_rate_change(task_id, change.rate)
        self._mark(task_id)

    def _intake(self, task_id: int, rate: float | None) -> float | None:
        """``within_intake``: input tuples/s a bolt limited to ``rate`` emits/s can execute, from the
        tuples it has executed per tuple it has emitted so far (None: no limit, or nothing emitted yet)."""
        h = self.handles[task_id]
        emitted, executed = h.emitted_count(), h.executed_count()
        if rate is None or emitted <= 0 or executed <= 0:
            return None
        return rate * executed / emitted

    def _show(self, task_id: int) -> None:
        th = self.throttles[task_id]
        # originv is kept after a release: the last episode's originv.
        self.handles[task_id].show(FlowDisplay(th.k, th.backpressure, th.originv))

    # -- timer and state publishing ---------------------------------------------------------

    async def _timer(self) -> None:
        next_beat = self.clock() + self.heartbeat
        while True:
            await asyncio.sleep(self.period)
            now = self.clock()
            self._sample_recent(now)
            self._watch_dry(now)
            self._watch_in_use(now)
            for task_id, th in self.throttles.items():
                change = (th.refresh(self._rate_of(task_id), now, self._recent_of(task_id))
                          if th.holds and not th.in_episode else th.tick(now))
                if change is not None:
                    self._act(task_id, change)
            self._carry_out(self.peers.expire(now, self._rate_of))
            for task_id, d in self.downstreams.items():
                q = self.handles[task_id].queue_bytes()
                self._watch_idle(d, now, q)
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
        now = self.clock()
        spell = self._in_use.get(task_id)
        in_use = None if spell is None or spell.since is None else max(0.0, now - spell.since)
        return TaskState(
            task=task_id, component=h.component, spout=h.is_spout, rate=th.rate, originv=th.originv,
            k=th.k, backpressure=th.backpressure, at_floor=th.at_floor, queue_bytes=h.queue_bytes(),
            high_mark=self.params.high_mark, low_mark=self.params.low_mark,
            observed_rate=float(h.observed_rate()), holds=dict(d.wants) if d else {},
            seq=d.seq if d else 0, applied=dict(th.applied), granted=dict(th.holds),
            step_age=th.step_age(now), stepped_by=th.stepped_by, version=(self.run, self._version),
            ts=time.time(), dry=self._dry.get(task_id, False), at_intake=d.at_intake if d else False,
            in_use_age=in_use)

    def _publish(self, task_id: int) -> None:
        self._version += 1
        self.coordinator.publish(self.state_of(task_id))
