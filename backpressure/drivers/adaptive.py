"""Adaptive thresholds (document 004) as the engine's ``FlowControl``.

Glue, not policy (the rules are ``policy.adaptive``'s, A1-A10):

* one ``TaskMarks`` per bolt task, observed after each input batch (``poll``) and
  by a timer on the backpressure window's sample grid (a bolt blocked on a full
  downstream queue does not poll); a flag added or removed counts one
  BACKPRESSURE / RELEASE signal sent by that task. The flags live in this driver:
  it is the document's "flag management software" for one process;
* every ``check_interval`` each upstream task (a spout, or a bolt something
  subscribes to) checks its direct downstream tasks' flags (``RateCoefficient``):
  its limit becomes ``coefficient x max rate`` (the rate it had before its first
  step), the limiter goes off at 1.0; it counts one signal received per change;
* scale requests go through ``Autoscaler`` (max parallelism, cool-down, scale in)
  to ``self.scaler`` (``seams.Scaler``) when the engine gave one; otherwise each
  decision is logged and counted in ``counters`` and kept in ``decisions``;
* load balancing: per upstream task and downstream component a ``Balancer`` moves
  shares by water levels each check; they go to ``self.share_router``
  (``seams.ShareRouter``) when there is one, else they are counted.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable, Sequence

from backpressure.policy.adaptive import (FLAG_ADDED, SCALE_OUT, AdaptiveParams, Autoscaler, Balancer,
                                          FlagView, RateCoefficient, ScaleDecision, TaskMarks)
from backpressure.seams import FlowDisplay, RateListener, Scaler, ShareRouter, TaskHandle
from backpressure.signals import BACKPRESSURE, RELEASE

log = logging.getLogger(__name__)


class AdaptiveFlowControl:
    def __init__(self, params: AdaptiveParams, *, clock: Callable[[], float] = time.monotonic,
                 period: float | None = None) -> None:
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

    # --- FlowControl -------------------------------------------------------
    async def start(self, handles: Sequence[TaskHandle]) -> None:
        for h in handles:
            self._add(h)
        counts: dict[str, int] = {}
        for h in handles:
            counts[h.component] = counts.get(h.component, 0) + 1
        self.autoscaler = Autoscaler(self.params, counts)
        self._last_check = self.clock()
        self._timer_task = asyncio.create_task(self._timer())

    def poll(self, handle: TaskHandle) -> None:
        m = self.marks.get(handle.task_id)
        if m is None:
            return
        ch = m.observe(self.clock(), handle.queue_bytes() / self.params.capacity)
        if ch.flag is not None:
            handle.count_signal("sent", BACKPRESSURE if ch.flag == FLAG_ADDED else RELEASE)
            handle.show(FlowDisplay(m.generation, m.flagged, None))

    async def stop(self) -> None:
        if self._timer_task is not None:
            self._timer_task.cancel()
            await asyncio.gather(self._timer_task, return_exceptions=True)
            self._timer_task = None
        for t in list(self._pending):
            t.cancel()
        await asyncio.gather(*self._pending, return_exceptions=True)
        for task_id, rc in self.coefficients.items():
            if rc.coefficient < 1.0:
                rc.coefficient, rc.max_rate = 1.0, None
                self._apply_rate(self.handles[task_id], rc)

    # --- the periodic work -------------------------------------------------
    async def _timer(self) -> None:
        while True:
            await asyncio.sleep(self.period)
            for task_id in list(self.marks):
                self.poll(self.handles[task_id])
            now = self.clock()
            if now - self._last_check >= self.params.check_interval:
                self._last_check = now
                self.check(now)

    def check(self, now: float) -> None:
        """Every upstream's check of its downstream flags (A6-A8), scale in (A9), balance (A10)."""
        assert self.autoscaler is not None
        parallel = dict(self.autoscaler.parallelism)
        for up, rc in self.coefficients.items():
            flags = {d: FlagView(self.handles[d].component, self.marks[d].flagged, self.marks[d].generation)
                     for d in self.downstream.get(up, ()) if d in self.marks}
            before = rc.coefficient
            ch = rc.check(flags, parallel)
            if ch is None:
                continue
            h = self.handles[up]
            if rc.coefficient < 1.0 and (before >= 1.0 or not rc.max_rate):
                rc.max_rate = h.observed_rate()          # A7: the rate before the first step
            h.count_signal("received", BACKPRESSURE if ch.added else RELEASE)
            self._apply_rate(h, rc)
            for comp in ch.scale_out:
                self._decided(self.autoscaler.request_out(comp, now))
        for comp, n in parallel.items():
            if n > self.autoscaler.initial.get(comp, 1):
                tasks = [t for t, h in self.handles.items() if h.component == comp]
                ups = {u for t in tasks for u in self.handles[t].upstream_task_ids}
                quiet = (not any(self.marks[t].flagged for t in tasks if t in self.marks)
                         and all(self.coefficients[u].coefficient >= 1.0 for u in ups if u in self.coefficients))
                self._decided(self.autoscaler.consider_in(comp, quiet, now))
        for (up, comp), b in self.balancers.items():
            shares = b.rebalance({d: self.handles[d].queue_bytes() / self.params.capacity for d in b.shares})
            if shares is None:
                continue
            self.counters["rebalance"] += 1
            if self.share_router is not None and self.share_router.set_shares(up, comp, shares):
                self.counters["rebalance_applied"] += 1

    # --- helpers -----------------------------------------------------------
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
        t = asyncio.create_task(self._scale(d))
        self._pending.add(t)
        t.add_done_callback(self._pending.discard)

    async def _scale(self, d: ScaleDecision) -> None:
        assert self.scaler is not None
        if d.kind == SCALE_OUT:
            h = await self.scaler.add_task(d.component)
            if h is not None:
                self._add(h)
                self.counters["scale_applied"] += 1
                return
        else:
            gone = await self.scaler.remove_task(d.component)
            if gone is not None:
                self.forget(gone)
                self.counters["scale_applied"] += 1
                return
        assert self.autoscaler is not None      # declined: the count goes back
        self.autoscaler.parallelism[d.component] += -1 if d.kind == SCALE_OUT else 1

    def _add(self, h: TaskHandle) -> None:
        self.handles[h.task_id] = h
        if not h.is_spout:
            self.marks[h.task_id] = TaskMarks(self.params)
        for up in h.upstream_task_ids:
            self.downstream.setdefault(up, []).append(h.task_id)
            self.coefficients.setdefault(up, RateCoefficient(self.params))
            b = self.balancers.get((up, h.component))
            if b is None:
                self.balancers[(up, h.component)] = Balancer(self.params, [h.task_id])
            else:
                b.resize([*b.shares, h.task_id])
        h.show(FlowDisplay())

    def forget(self, task_id: int) -> None:
        """A task is gone (scaled in, or died): its flag no longer holds its upstreams."""
        h = self.handles.pop(task_id, None)
        self.marks.pop(task_id, None)
        if h is None:
            return
        for up in h.upstream_task_ids:
            ds = self.downstream.get(up, [])
            if task_id in ds:
                ds.remove(task_id)
            b = self.balancers.get((up, h.component))
            if b is not None:
                b.resize([t for t in b.shares if t != task_id])
