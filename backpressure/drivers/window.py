"""Per-downstream send windows (document 002) as the engine's ``FlowControl``.

Glue, not policy (the rules are ``policy.window``'s, W1-W8). One ``WindowSender``
per spout task over its direct downstream tasks, and one ``CumulativeAck``.

Two ways to run, chosen by what the engine offers:

* **With a ``seams.WindowGate``** (``self.window_gate`` set by the engine before
  ``start``; the local engine does with acking on, in one process): the engine asks
  ``room`` before a spout's batch goes to a task, reports every tracked tuple sent,
  acked and failed (``on_sent``, ``on_acked``, ``on_failed``) and asks
  ``resend_target`` for a failed tuple's replay. That is the document's method
  exactly: windows count tuples in flight, round trips are measured per ack.
* **Without it** (an engine with no per-tuple hooks), every ``check_interval``
  each spout's window towards a task ``d``
  takes the tuples ``d`` executed since the last period as its acks, classified by
  ``d``'s queue: a queue at or over ``queue.high_mark`` means a round trip over
  the threshold (SLOW), one at the hard bound is an emit that waits, the local
  engine's stand-in for a timeout (BUSY), anything else NORMAL. The windows then
  become the spout's rate limit: throughput is window / round trip, so the limit is
  ``sum of windows / rtt_threshold``; when every window is at ``max`` the limiter
  goes off. Nothing is re-routed on this path (the engine routes).
"""
from __future__ import annotations

import asyncio
import time
from typing import Callable, Hashable, Sequence

from backpressure.policy.window import BUSY, CumulativeAck, WindowParams, WindowSender
from backpressure.seams import FlowDisplay, RateListener, TaskHandle, WindowGate
from backpressure.signals import BACKPRESSURE, RELEASE


class WindowFlowControl:
    def __init__(self, params: WindowParams, *, slow_bytes: int, capacity: int,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.params = params
        self.slow_bytes = slow_bytes
        self.capacity = capacity
        self.clock = clock
        self.on_rate_change: RateListener | None = None
        self.window_gate: WindowGate | None = None
        self.handles: dict[int, TaskHandle] = {}
        self.senders: dict[int, WindowSender[Hashable]] = {}
        self.acks: dict[int, CumulativeAck] = {}
        self.numbers: dict[int, dict[Hashable, int]] = {}     # send order of each root in flight (W5)
        self.last_number: dict[int, int] = {}
        self.limits: dict[int, float | None] = {}
        self._executed: dict[int, int] = {}
        self._shown: dict[int, tuple[int, bool]] = {}
        self._timer_task: asyncio.Task[None] | None = None

    async def start(self, handles: Sequence[TaskHandle]) -> None:
        self.handles = {h.task_id: h for h in handles}
        gate = self.window_gate if self.window_gate is not None and self.window_gate.routes_tracked_tuples() else None
        for s in (h for h in handles if h.is_spout):
            comps: dict[str, list[int]] = {}
            for d in handles:
                if s.task_id in d.upstream_task_ids:
                    comps.setdefault(d.component, []).append(d.task_id)
            keyed = gate.keyed_components(s.task_id) if gate is not None else frozenset()
            self.senders[s.task_id] = WindowSender(self.params, comps, keyed)
            self.acks[s.task_id] = CumulativeAck()
            self.numbers[s.task_id] = {}
            self.last_number[s.task_id] = 0
            self.limits[s.task_id] = None
            s.show(FlowDisplay())
        if gate is None:
            self._executed = {h.task_id: h.executed_count() for h in handles if not h.is_spout}
            self._timer_task = asyncio.create_task(self._timer())

    def poll(self, handle: TaskHandle) -> None:
        return None          # the windows move on acks (gate) or once per period (fallback)

    async def stop(self) -> None:
        if self._timer_task is not None:
            self._timer_task.cancel()
            await asyncio.gather(self._timer_task, return_exceptions=True)
            self._timer_task = None
        for s, limit in self.limits.items():
            if limit is not None:
                self._limit(s, None)

    # --- with a WindowGate: the document's per-tuple method -------------------------
    def may_send(self, spout: int, target: int) -> bool:
        return self.senders[spout].windows[target].has_room()

    def room(self, spout: int, target: int) -> int:
        """W1: tracked tuples the window towards ``target`` admits now (0: full)."""
        w = self.senders[spout].windows.get(target)
        return max(0, int(w.window) - len(w.in_flight)) if w is not None else 1 << 30

    def on_sent(self, spout: int, target: int, root: Hashable, now: float,
                resend_of: Hashable | None = None) -> None:
        nums = self.numbers[spout]
        if resend_of is not None and resend_of in nums:
            nums[root] = nums.pop(resend_of)       # W5: a re-sent tuple keeps its number
        elif root not in nums:
            self.last_number[spout] += 1
            nums[root] = self.last_number[spout]
        self.senders[spout].on_sent(root, target, now)

    def on_acked(self, spout: int, root: Hashable, now: float) -> None:
        sender = self.senders[spout]
        target = sender.target_of.get(root)
        rt = sender.on_ack(root, now)
        number = self.numbers[spout].pop(root, None)
        if rt is not None and number is not None:
            self.acks[spout].on_ack(number, rt)
        if target is not None:
            self._show(spout)

    def on_failed(self, spout: int, root: Hashable, now: float) -> int | None:
        """W4: the busy task (its window one smaller); the tuple keeps its number for the resend."""
        busy = self.senders[spout].on_fail(root)
        if busy is not None:
            self.handles[spout].count_signal("received", BACKPRESSURE)
            self._show(spout)
        return busy

    def on_dropped(self, spout: int, root: Hashable) -> None:
        """A failed tuple that is not sent again (dead letter, stop): the ack point passes it."""
        number = self.numbers[spout].pop(root, None)
        if number is not None:
            self.acks[spout].on_ack(number, 0.0)

    def resume_position(self, spout: int) -> int:
        """W5: the first tuple number (in send order) a restart of ``spout`` sends again."""
        return self.acks[spout].resume_position

    def _show(self, spout: int) -> None:
        """Windows under ``max`` as the step count; the flag while any is under ``initial``."""
        ws = self.senders[spout].windows.values()
        small = sum(1 for w in ws if w.window < self.params.max)
        shown = (small, any(w.window < self.params.initial for w in ws))
        if shown != self._shown.get(spout):
            self._shown[spout] = shown
            self.handles[spout].show(FlowDisplay(small, shown[1], None))

    def resend_target(self, spout: int, busy: int) -> int | None:
        return self.senders[spout].resend_target(self.handles[busy].component, busy)

    # --- without one: windows from executed counts and queue levels --------------------
    async def _timer(self) -> None:
        while True:
            await asyncio.sleep(self.params.check_interval)
            self.advance()

    def advance(self) -> None:
        acked: dict[int, int] = {}
        for d, before in self._executed.items():
            now_count = self.handles[d].executed_count()
            acked[d] = now_count - before
            self._executed[d] = now_count
        p = self.params
        for s, sender in self.senders.items():
            for d, w in sender.windows.items():
                h = self.handles[d]
                q = h.queue_bytes()
                share = acked[d] // max(1, len(h.upstream_task_ids))
                if q >= self.capacity:
                    if w.state != BUSY:
                        h.count_signal("sent", BACKPRESSURE)
                    w.busy()
                elif share:
                    w.classify(q < self.slow_bytes, share)
            windows = sender.windows.values()
            if all(w.window >= p.max for w in windows):
                limit = None
            else:
                limit = max(p.rate_floor, sum(w.window for w in windows) / p.rtt_threshold)
            if limit != self.limits[s]:
                self._limit(s, limit)

    def _limit(self, s: int, limit: float | None) -> None:
        h = self.handles[s]
        was = self.limits[s]
        self.limits[s] = limit
        if (was is None) != (limit is None):
            h.count_signal("received", BACKPRESSURE if limit is not None else RELEASE)
        h.set_rate(limit)
        small = sum(1 for w in self.senders[s].windows.values() if w.window < self.params.max)
        h.show(FlowDisplay(small, limit is not None, None))
        if self.on_rate_change is not None:
            self.on_rate_change(s, limit)
