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

Resume positions (W5 made durable): given a coordinator (ZooKeeper, or in worker
processes the tree the supervisor serves), the driver asks the gate to report each
spout's state at its cumulative ack point (``track_ack_points``) and keeps the newest
in the coordinator (``resume_points``); at start it reads what a previous run of each
local spout kept and has the gate put the spout back there (``restore_spout``), or
drops it when ``discard_resume`` (``checkpoint.restore: false``). Across worker
processes the windows need nothing else from other workers: a spout's windows, acks
and round trips are all in its own process; only which tasks it feeds comes from the
topology's ``graph`` (no worker has a handle on every task).
"""
from __future__ import annotations

import asyncio
import time
from typing import Any, Callable, Hashable, Mapping, Sequence

from backpressure.coordinator.base import Coordinator
from backpressure.drivers.resume_points import ResumePoints
from backpressure.policy.window import BUSY, NORMAL, CumulativeAck, WindowParams, WindowSender
from backpressure.seams import FlowDisplay, RateListener, TaskHandle, WindowGate
from backpressure.signals import BACKPRESSURE, RELEASE


# component -> (is a spout, its task ids, the components it reads from)
Graph = Mapping[str, tuple[bool, Sequence[int], Sequence[str]]]


class WindowFlowControl:
    def __init__(self, params: WindowParams, *, slow_bytes: int, capacity: int,
                 clock: Callable[[], float] = time.monotonic, graph: Graph | None = None,
                 coordinator: Coordinator | None = None, discard_resume: bool = False) -> None:
        self.params = params
        self.graph = graph
        self.resume = ResumePoints(coordinator) if coordinator is not None else None
        self.discard_resume = discard_resume
        self.resumed: dict[int, int] = {}       # spout -> the ack point it resumed from (a previous run's)
        self.component_of: dict[int, str] = {}
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
        fed = self._fed_by(handles)
        for s in (h for h in handles if h.is_spout):
            comps = fed.get(s.task_id, {})
            keyed = gate.keyed_components(s.task_id) if gate is not None else frozenset()
            self.senders[s.task_id] = WindowSender(self.params, comps, keyed)
            self.acks[s.task_id] = CumulativeAck()
            self.numbers[s.task_id] = {}
            self.last_number[s.task_id] = 0
            self.limits[s.task_id] = None
            s.show(FlowDisplay())
        if self.resume is not None:
            spouts = sorted(self.senders)
            await self.resume.start(spouts)
            if gate is not None:
                await self._resume_spouts(gate, spouts)
        if gate is None:
            self._executed = {h.task_id: h.executed_count() for h in handles if not h.is_spout}
            self._timer_task = asyncio.create_task(self._timer())

    def _fed_by(self, handles: Sequence[TaskHandle]) -> dict[int, dict[str, list[int]]]:
        """spout -> downstream component -> its tasks: off the handles, or the graph in workers."""
        fed: dict[int, dict[str, list[int]]] = {}
        if self.graph is None:
            for d in handles:
                self.component_of[d.task_id] = d.component
                for up in d.upstream_task_ids:
                    fed.setdefault(up, {}).setdefault(d.component, []).append(d.task_id)
            return fed
        for comp, (_, tasks, inputs) in self.graph.items():
            for t in tasks:
                self.component_of[t] = comp
            for src in inputs:
                for up in self.graph[src][1]:
                    fed.setdefault(up, {})[comp] = list(tasks)
        return fed

    async def _resume_spouts(self, gate: WindowGate, spouts: Sequence[int]) -> None:
        """W5 across restarts: each spout goes on from the state a previous run kept."""
        assert self.resume is not None
        tracked = gate.track_ack_points(self.resume.keep)
        for s in spouts:
            if s not in tracked:
                continue
            if self.discard_resume:
                await self.resume.discard(s)
                continue
            kept = await self.resume.read(s)
            if kept is not None and gate.restore_spout(s, kept[1]):
                self.resumed[s] = kept[0]

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
        if self.resume is not None:
            await self.resume.stop()

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

    def on_sent_many(self, spout: int, target: int, roots: Sequence[Hashable], now: float) -> None:
        """``on_sent`` for tuples sent for the first time, in one call per batch (hot path)."""
        nums = self.numbers[spout]
        n = self.last_number[spout]
        sent = self.senders[spout].on_sent
        for root in roots:
            if root not in nums:
                n += 1
                nums[root] = n
            sent(root, target, now)
        self.last_number[spout] = n

    def on_acked(self, spout: int, root: Hashable, now: float) -> None:
        self.on_acked_many(spout, [(root, now)])

    def on_acked_many(self, spout: int, acked: Sequence[tuple[Hashable, float]]) -> None:
        """W2/W3 for every window each tuple was in (``(root, ack time)`` pairs); W5 over send
        order. On the hot path (once per tuple): the display is redone only when a window
        changed state (NORMAL, SLOW, BUSY)."""
        sender = self.senders[spout]
        nums, cum = self.numbers[spout], self.acks[spout]
        target_of, windows = sender.target_of, sender.windows
        show = False
        for root, now in acked:
            number = nums.pop(root, None)
            targets = target_of.get(root)
            if targets is None:
                continue
            if show:
                rt = sender.on_ack(root, now)
            elif len(targets) == 1:
                w = windows[targets[0]]
                was = w.state
                rt = sender.on_ack(root, now)
                show = was != w.state
            else:
                before = [windows[t].state for t in targets]
                rt = sender.on_ack(root, now)
                show = before != [windows[t].state for t in targets]
            if rt is not None and number is not None:
                cum.on_ack(number, rt)
        if show:
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
        """Windows that hold their task back (SLOW or BUSY: their last ack or fail shrank them)
        as the step count, and the flag while there is one. (A window under ``max`` is not
        one: by W2b it stops growing where it no longer limits the spout.)"""
        ws = self.senders[spout].windows.values()
        small = sum(1 for w in ws if w.state != NORMAL)
        shown = (small, small > 0)
        if shown != self._shown.get(spout):
            self._shown[spout] = shown
            self.handles[spout].show(FlowDisplay(small, shown[1], None))

    def resend_target(self, spout: int, busy: int) -> int | None:
        return self.senders[spout].resend_target(self.component_of[busy], busy)

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
