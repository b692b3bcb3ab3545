"""Adaptive thresholds (document 004) as the engine's ``FlowControl``.

Glue, not policy (the rules are ``policy.adaptive``'s, A1-A10):

* one ``TaskMarks`` per bolt task, observed after each input batch (``poll``) and
  by a timer on the backpressure window's sample grid (a bolt blocked on a full
  downstream queue does not poll); a flag added or removed counts one
  BACKPRESSURE / RELEASE signal sent by that task. The flags live in this driver:
  it is the document's "flag management software" for one process;
* every ``check_interval``, and at once for the upstreams of a task whose flag was
  just added or removed (ours: the document's node "may actively notify" its upstreams;
  waiting for the next check let an unlimited spout run a queue from its first
  threshold to its hard bound), each upstream task (a spout, or a bolt something
  subscribes to) checks its direct downstream tasks' flags (``RateCoefficient``):
  its limit becomes ``coefficient x max rate``; at 1.0 a metered max rate stays the
  limit until every downstream queue it sees is empty (A7d), an unmetered one turns the
  limiter off; it counts one signal received per change. The max rate (A7c) is what the flagged downstream
  component executed of this upstream's tuples over about one ``check_interval``
  (each local bolt task's ``executed_count`` is sampled on the timer, divided by its
  number of upstream tasks); with a downstream task in another worker, the upstream's
  own rate before its first step, measured again at a step it sent under its limit (A7,
  A7b);
* scale requests go through ``Autoscaler`` (max parallelism, cool-down, scale in)
  to ``self.scaler`` (``seams.Scaler``) when the engine gave one (the local engine
  does, in one process); otherwise each decision is logged and counted in
  ``counters`` and kept in ``decisions``. One action per component at a time: while
  one is carried out (adding a task to a fields-grouped component drains the
  topology) no other is decided for it, and its cool-down restarts when it is done;
* load balancing: per upstream task and downstream component a ``Balancer`` moves
  shares by water levels each check; they go to ``self.share_router``
  (``seams.ShareRouter``) when there is one, else they are counted.

Across worker processes (given a coordinator and the topology's ``graph``) the flags
are the document's flag store made shared: each worker keeps the marks of its own
bolt tasks and publishes each task's flag, its generation (``k``) and queue bytes as
its task state (``shared_states``) the moment the flag changes, and once per heartbeat;
every worker mirrors the other workers' flags and levels, and each upstream task is
governed by its own worker from its downstream tasks' flags wherever those run. A
task whose state vanished (its worker stopped or died) holds nothing. Autoscaling
crosses workers too: the scaler a worker's engine gives asks the supervisor, which
carries a rescale out on every worker; ``add_task`` then returns a handle when the new
task runs in this worker and its id when it runs in another. Every worker's engine
reports each change of a component's tasks (``rescaled``, whoever asked), so every
worker's counts, links and cool-downs follow the same tasks.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable, Mapping, Sequence

from backpressure.coordinator.base import Coordinator
from backpressure.drivers.count_window import CountWindow
from backpressure.drivers.shared_states import SharedStates
from backpressure.policy.adaptive import (FLAG_ADDED, SCALE_OUT, AdaptiveParams, Autoscaler, Balancer,
                                          FlagView, RateCoefficient, ScaleDecision, TaskMarks)
from backpressure.seams import FlowDisplay, RateListener, Scaler, ShareRouter, TaskHandle
from backpressure.signals import BACKPRESSURE, RELEASE, TaskState

# component -> (is a spout, its task ids, the components it reads from)
Graph = Mapping[str, tuple[bool, Sequence[int], Sequence[str]]]

log = logging.getLogger(__name__)


class AdaptiveFlowControl:
    def __init__(self, params: AdaptiveParams, *, clock: Callable[[], float] = time.monotonic,
                 period: float | None = None, coordinator: Coordinator | None = None,
                 graph: Graph | None = None, heartbeat: float = 1.0) -> None:
        self.params = params
        self.clock = clock
        self.period = period if period is not None else min(
            params.check_interval, params.backpressure_window / params.samples)
        self.on_rate_change: RateListener | None = None
        self.scaler: Scaler | None = None
        self.share_router: ShareRouter | None = None
        self.handles: dict[int, TaskHandle] = {}
        self.marks: dict[int, TaskMarks] = {}
        self.coefficients: dict[int, RateCoefficient] = {}
        self.downstream: dict[int, list[int]] = {}
        self.balancers: dict[tuple[int, str], Balancer] = {}
        self.autoscaler: Autoscaler | None = None
        self.decisions: list[ScaleDecision] = []
        self.counters = {"scale_out": 0, "scale_in": 0, "scale_applied": 0, "rebalance": 0,
                         "rebalance_applied": 0}
        self._last_check = 0.0
        self._timer_task: asyncio.Task[None] | None = None
        self._pending: set[asyncio.Task[None]] = set()
        self._scaling: set[str] = set()   # components with an action under way (a drain can take seconds)
        # Across worker processes: the graph, and the other workers' tasks as last published.
        self.graph = graph
        self.shared = SharedStates(coordinator, heartbeat=heartbeat) if coordinator is not None else None
        self.component_of: dict[int, str] = {}
        self.remote: dict[int, TaskState] = {}
        self._served: dict[int, CountWindow] = {}    # local bolt task -> its executed count

    # --- FlowControl -------------------------------------------------------
    async def start(self, handles: Sequence[TaskHandle]) -> None:
        for h in handles:
            self._add(h)
        counts: dict[str, int] = {}
        for h in handles:
            counts[h.component] = counts.get(h.component, 0) + 1
        if self.graph is not None:
            counts = {c: len(tasks) for c, (_, tasks, _) in self.graph.items()}
            self._link_remote(self.graph)
        self.autoscaler = Autoscaler(self.params, counts)
        self._last_check = self.clock()
        self._meter(self._last_check)
        if self.shared is not None:
            await self.shared.start(self.handles, self.state_of, self._on_remote)
        self._timer_task = asyncio.create_task(self._timer())

    def poll(self, handle: TaskHandle) -> None:
        m = self.marks.get(handle.task_id)
        if m is None:
            return
        now = self.clock()
        ch = m.observe(now, handle.queue_bytes() / self.params.capacity)
        if ch.flag is not None:
            handle.count_signal("sent", BACKPRESSURE if ch.flag == FLAG_ADDED else RELEASE)
            handle.show(FlowDisplay(m.generation, m.flagged, None))
            if self.shared is not None:
                self.shared.publish(handle.task_id)      # the other workers' upstreams read it now
            if self.autoscaler is not None:              # its upstreams here act on it now
                parallel = dict(self.autoscaler.parallelism)
                for up in handle.upstream_task_ids:
                    self._check_one(up, parallel, now)

    async def stop(self) -> None:
        if self._timer_task is not None:
            self._timer_task.cancel()
            await asyncio.gather(self._timer_task, return_exceptions=True)
            self._timer_task = None
        for t in list(self._pending):
            t.cancel()
        await asyncio.gather(*self._pending, return_exceptions=True)
        for task_id, rc in self.coefficients.items():
            if rc.coefficient < 1.0 or rc.metered:
                rc.coefficient, rc.max_rate, rc.metered = 1.0, None, False
                self._apply_rate(self.handles[task_id], rc)
        if self.shared is not None:
            await self.shared.stop()

    # --- the periodic work -------------------------------------------------
    async def _timer(self) -> None:
        while True:
            await asyncio.sleep(self.period)
            for task_id in list(self.marks):
                self.poll(self.handles[task_id])
            now = self.clock()
            self._meter(now)
            if now - self._last_check >= self.params.check_interval:
                self._last_check = now
                self.check(now)

    def check(self, now: float) -> None:
        """Every upstream's check of its downstream flags (A6-A8), scale in (A9), balance (A10)."""
        assert self.autoscaler is not None
        parallel = dict(self.autoscaler.parallelism)
        for up in list(self.coefficients):
            self._check_one(up, parallel, now)
        for comp, n in parallel.items():
            if n > self.autoscaler.initial.get(comp, 1) and comp not in self._scaling:
                tasks = [t for t, c in self.component_of.items() if c == comp]     # in any worker
                ups = {u for u, ds in self.downstream.items() if any(d in tasks for d in ds)}
                quiet = (not any((f := self._flag(t)) is not None and f.flagged for t in tasks)
                         and all(self.coefficients[u].coefficient >= 1.0 for u in ups if u in self.coefficients))
                self._decided(self.autoscaler.consider_in(comp, quiet, now))
        for (up, comp), b in self.balancers.items():
            if up not in self.handles:
                continue
            shares = b.rebalance({d: self._level(d) for d in b.shares})
            if shares is None:
                continue
            self.counters["rebalance"] += 1
            if self.share_router is not None and self.share_router.set_shares(up, comp, shares):
                self.counters["rebalance_applied"] += 1

    def _check_one(self, up: int, parallel: Mapping[str, int], now: float) -> None:
        """One upstream task's check of its downstream flags (A6-A8)."""
        rc = self.coefficients.get(up)
        h = self.handles.get(up)
        if rc is None or h is None:
            return                                        # another worker's task: governed there
        assert self.autoscaler is not None
        flags = {d: v for d in self.downstream.get(up, ()) if (v := self._flag(d)) is not None}
        empty = [self.handles[d].queue_bytes() == 0 for d in self.downstream.get(up, ()) if d in self.handles]
        ch = rc.check(flags, parallel, observed=h.observed_rate(), taken=self._taken(up, now),
                      idle=all(empty), starved=any(empty))
        if ch is None:
            return
        if not ch.remeasured:
            h.count_signal("received", BACKPRESSURE if ch.added else RELEASE)
        self._apply_rate(h, rc)
        for comp in ch.scale_out:
            if comp not in self._scaling:
                self._decided(self.autoscaler.request_out(comp, now))

    def _meter(self, now: float) -> None:
        """Sample each local bolt task's executed count, keeping about one check_interval (two
        lagged a capacity drop: scenario e's queue rose to 0.75 of its bound, not 0.5)."""
        for t, h in self.handles.items():
            if h.is_spout:
                continue
            w = self._served.get(t)
            if w is None:
                w = self._served[t] = CountWindow(self.params.check_interval)
            w.sample(now, h.executed_count())

    def _taken(self, up: int, now: float) -> dict[str, float]:
        """A7c: per downstream component, the tuples/s of ``up``'s share it executes: its
        flagged tasks' mean rate (busy: their service rate) times its tasks ``up`` feeds, as
        a shuffle deals them alike (summing the tasks' rates counted what unflagged tasks,
        idle part of the time, were sent; it starved the others in scenario b). A component
        with a task not metered here (another worker's) is left out."""
        rates: dict[str, list[tuple[bool, float]]] = {}
        blind: set[str] = set()
        for d in self.downstream.get(up, ()):
            comp = self.component_of.get(d, "")
            h, w, m = self.handles.get(d), self._served.get(d), self.marks.get(d)
            got = w.since_oldest(now, h.executed_count()) if h is not None and w is not None else None
            if m is None or got is None or got[1] <= 1e-3:
                blind.add(comp)
                continue
            rate = got[0] / got[1] / max(1, len(h.upstream_task_ids))
            rates.setdefault(comp, []).append((m.flagged, rate))
        out: dict[str, float] = {}
        for comp, rs in rates.items():
            busy = [r for f, r in rs if f]
            if comp not in blind:
                out[comp] = sum(busy) / len(busy) * len(rs) if busy else sum(r for _, r in rs)
        return out

    # --- helpers -----------------------------------------------------------
    def _flag(self, task: int) -> FlagView | None:
        """A downstream task's flag: from its marks here, or as its worker last published it."""
        m = self.marks.get(task)
        if m is not None:
            return FlagView(self.component_of[task], m.flagged, m.generation, m.removals)
        st = self.remote.get(task)
        return None if st is None else FlagView(st.component, st.backpressure, st.k)

    def _level(self, task: int) -> float:
        h = self.handles.get(task)
        if h is not None:
            return h.queue_bytes() / self.params.capacity
        st = self.remote.get(task)
        return 0.0 if st is None else st.queue_bytes / self.params.capacity

    def _apply_rate(self, h: TaskHandle, rc: RateCoefficient) -> None:
        rate = rc.rate()
        h.set_rate(rate)
        steps = round((1.0 - rc.coefficient) / self.params.coefficient_step)
        h.show(FlowDisplay(steps, rate is not None, rc.max_rate if rate is not None else None))
        if self.on_rate_change is not None:
            self.on_rate_change(h.task_id, rate)

    def _decided(self, d: ScaleDecision | None) -> None:
        if d is None:
            return
        self.decisions.append(d)
        self.counters[d.kind] += 1
        if self.scaler is None:
            log.info("adaptive: %s %s to %d tasks (no scaler: decision only)", d.kind, d.component, d.parallelism)
            assert self.autoscaler is not None      # nothing changed: the count stays true
            self.autoscaler.parallelism[d.component] += -1 if d.kind == SCALE_OUT else 1
            return
        self._scaling.add(d.component)
        t = asyncio.create_task(self._scale(d))
        self._pending.add(t)
        t.add_done_callback(self._pending.discard)

    async def _scale(self, d: ScaleDecision) -> None:
        try:
            await self._carry_out(d)
        finally:
            self._scaling.discard(d.component)

    async def _carry_out(self, d: ScaleDecision) -> None:
        assert self.scaler is not None and self.autoscaler is not None
        if d.kind == SCALE_OUT:
            h = await self.scaler.add_task(d.component)
            if isinstance(h, int):                     # added in another worker (``rescaled`` linked it)
                self._carried_out(d)
                return
            if h is not None:
                if h.task_id not in self.handles:
                    self._add(h)
                self._carried_out(d)
                return
        else:
            gone = await self.scaler.remove_task(d.component)
            if gone is not None:
                self.forget(gone)
                self._carried_out(d)
                return
        # declined: the count goes back (to the engine's, where it keeps one: across workers
        # another worker's request may have changed it meanwhile)
        count = getattr(self.scaler, "task_count", None)
        if count is not None:
            self.autoscaler.parallelism[d.component] = count(d.component)
        else:
            self.autoscaler.parallelism[d.component] += -1 if d.kind == SCALE_OUT else 1

    def _carried_out(self, d: ScaleDecision) -> None:
        """The engine did it (after a drain, perhaps): count it and restart the cool-down, so
        queues a drain emptied are not read as the load gone (A9)."""
        assert self.autoscaler is not None
        self.counters["scale_applied"] += 1
        self.autoscaler.completed(d.component, self.clock())

    def _add(self, h: TaskHandle) -> None:
        """A task joins (at start, or added by the scaler): it and the tasks it feeds are linked."""
        self.handles[h.task_id] = h
        self.component_of[h.task_id] = h.component
        if not h.is_spout:
            self.marks[h.task_id] = TaskMarks(self.params)
        for up in h.upstream_task_ids:
            self._link(up, h.task_id, h.component)
        for d in self.handles.values():            # a scaled-out upstream: its downstream tasks
            if h.task_id in d.upstream_task_ids and d.task_id not in self.downstream.get(h.task_id, ()):
                self._link(h.task_id, d.task_id, d.component)
        h.show(FlowDisplay())

    def _link_remote(self, graph: Graph) -> None:
        """Workers: each local upstream task also watches the flags of its downstream tasks in
        other workers (what no local handle shows)."""
        for comp, (_, tasks, inputs) in graph.items():
            for t in tasks:
                if t in self.handles:
                    continue
                self.component_of[t] = comp
                for src in inputs:
                    for up in graph[src][1]:
                        if up in self.handles:
                            self._link(up, t, comp)

    def rescaled(self, component: str, tasks: Sequence[int], added: TaskHandle | None = None) -> None:
        """The engine's word that ``component`` now has ``tasks`` (any worker's rescale, or
        the layout a restarted worker was built from): count, links and cool-down follow;
        ``added`` is the new task's handle when it runs in this process."""
        known = [t for t, c in self.component_of.items() if c == component]
        for t in known:
            if t not in tasks:
                self.forget(t)
        for t in tasks:
            if t in known:
                continue
            if added is not None and added.task_id == t:
                self._add(added)
                continue
            self.component_of[t] = component
            inputs = self.graph[component][2] if self.graph is not None and component in self.graph else ()
            for up, c in list(self.component_of.items()):
                if c in inputs and up in self.handles:
                    self._link(up, t, component)
        if self.autoscaler is not None:
            self.autoscaler.parallelism[component] = len(tasks)
            self.autoscaler.completed(component, self.clock())
        self._share_local()

    def _share_local(self) -> None:
        """Across workers: publish the states of exactly the tasks this process now runs."""
        if self.shared is not None and self.shared.local != frozenset(self.handles):
            self.shared.local = frozenset(self.handles)
            for t in self.handles:
                self.shared.publish(t)

    def _link(self, up: int, task: int, component: str) -> None:
        if task in self.downstream.get(up, ()):
            return
        self.downstream.setdefault(up, []).append(task)
        self.coefficients.setdefault(up, RateCoefficient(self.params))
        b = self.balancers.get((up, component))
        if b is None:
            self.balancers[(up, component)] = Balancer(self.params, [task])
        else:
            b.resize([*b.shares, task])

    def forget(self, task_id: int) -> None:
        """A task is gone (scaled in, or died; in this worker or another): its flag no
        longer holds its upstreams, and as an upstream it neither checks flags nor
        balances any more."""
        self.handles.pop(task_id, None)
        self.marks.pop(task_id, None)
        self.downstream.pop(task_id, None)
        self.coefficients.pop(task_id, None)
        self.remote.pop(task_id, None)
        self._served.pop(task_id, None)
        component = self.component_of.pop(task_id, None)
        for key in [k for k in self.balancers if k[0] == task_id]:
            del self.balancers[key]
        for up, ds in self.downstream.items():
            if task_id in ds:
                ds.remove(task_id)
                b = self.balancers.get((up, component)) if component is not None else None
                if b is not None:
                    b.resize([t for t in b.shares if t != task_id])
        self._share_local()

    # --- across worker processes ------------------------------------------------------
    def _on_remote(self, task: int, state: TaskState | None) -> None:
        """Another worker's task: its flag and level as published (None: it is gone)."""
        if state is None:
            self.remote.pop(task, None)
        else:
            self.remote[task] = state

    def state_of(self, task: int) -> TaskState:
        """What this worker publishes for one of its tasks: a bolt's flag, generation and level."""
        assert self.shared is not None
        h = self.handles.get(task)
        if h is None:                                   # scaled in a moment ago: holds nothing
            return TaskState(task=task, version=self.shared.version(), ts=time.time())
        m = self.marks.get(task)
        rc = self.coefficients.get(task)
        rate = rc.rate() if rc is not None else None
        return TaskState(task=task, component=h.component, spout=h.is_spout, rate=rate,
                         k=m.generation if m is not None else 0,
                         backpressure=m.flagged if m is not None else rate is not None,
                         queue_bytes=h.queue_bytes(), observed_rate=float(h.observed_rate()),
                         version=self.shared.version(), ts=time.time())
