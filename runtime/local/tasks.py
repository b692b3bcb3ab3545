"""Spout and bolt tasks: the asyncio loops that run one parallel instance each.

Each task is also the ``TaskHandle`` flow control sees: it reports its queue bytes
and observed emit rate and obeys ``set_rate`` / ``clear_rate`` through its limiter.

Where a task waits is where its time goes in Flink's split: awaiting its empty
input queue is *idle*, awaiting room in a downstream queue or the rate limiter is
*backpressured*, everything else is *busy*.
"""
from __future__ import annotations

import asyncio
import inspect
import logging
import random
import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

from topo.api import DEFAULT_STREAM, Bolt, EndOfStream, Spout, TaskContext, Tuple
from runtime.local.outbox import Outbox, TupleEncodingError, UnknownStreamError
from runtime.local.queue import ByteQueue
from runtime.local.ratelimit import EwmaRate, RateLimiter
from runtime.local.stats import TaskStats

if TYPE_CHECKING:
    from runtime.local.engine import LocalEngine

log = logging.getLogger("topo.task")

# The control item a ticker puts in a bolt's queue to call ``Bolt.tick``.
TICK: list[Any] = [None]

# Shortest wait worth a timer: below it the limiter's debt carries to the next call.
_MIN_SLEEP_S = 0.001
_SPOUT_IDLE_SLEEP_S = 0.001  # Storm's default sleep-spout wait strategy


class _TaskBase:
    """What spout and bolt tasks share: identity, outbox, limiter, stats."""

    is_spout = False

    def __init__(self, engine: "LocalEngine", component: str, task_id: int, index: int,
                 parallelism: int, instance: Spout | Bolt, outbox: Outbox,
                 upstream_task_ids: Sequence[int], stats: TaskStats) -> None:
        self.engine = engine
        self.component = component
        self.task_id = task_id
        self.index = index
        self.instance = instance
        self.outbox = outbox
        self.upstream_task_ids = list(upstream_task_ids)
        self.stats = stats
        self.limiter = RateLimiter()
        self.rate = EwmaRate()
        self.rng = random.Random(engine.seed * 1_000_003 + task_id if engine.seed is not None else None)
        self.context = TaskContext(engine.topology.name, component, task_id, index, parallelism, engine.config)
        self.queue: ByteQueue | None = None

    # --- TaskHandle ---------------------------------------------------------
    def queue_bytes(self) -> int:
        return self.queue.bytes if self.queue is not None else 0

    def observed_rate(self) -> float:
        return self.rate.value

    def set_rate(self, tuples_per_second: float) -> None:
        self.limiter.set_rate(tuples_per_second)
        self.stats.rate_limit = self.limiter.rate

    def clear_rate(self) -> None:
        self.limiter.clear_rate()
        self.stats.rate_limit = None

    # --- shared loop pieces ---------------------------------------------------
    async def _send(self, emitted: int) -> None:
        """After a user call that emitted ``emitted`` tuples: honour the rate, flush if due."""
        stats = self.stats
        if emitted and self.limiter.rate is not None:
            delay = self.limiter.reserve(emitted)
            if delay >= _MIN_SLEEP_S:
                if self.outbox.pending_count:
                    stats.backpressured_ns += await self.outbox.flush()
                t0 = time.perf_counter_ns()
                await asyncio.sleep(delay)
                stats.backpressured_ns += time.perf_counter_ns() - t0
        if self.outbox.due():
            stats.backpressured_ns += await self.outbox.flush()

    def _emit_one(self, values: Sequence[Any], stream: str, anchors: dict[int, int] | None,
                  parents: Sequence[Tuple] | None, born: float) -> int:
        """Route one emitted tuple; returns the XOR of the new edge ids (0 if untracked)."""
        outbox = self.outbox
        routes = outbox.routes(stream, values)
        size = outbox.size_of(values, stream)
        self.stats.emitted += 1
        if anchors is None:
            tup = Tuple(values, routes.fields, stream, self.component, self.task_id, None, born)
            for r in routes.routers:
                if r.broadcast:
                    for target in r.targets:
                        outbox.push(target, tup, size)
                else:
                    outbox.push(r.targets[r.select(values)], tup, size)
            return 0
        # Tracked: every edge (tuple x target) gets its own id in the XOR ledger.
        edges = 0
        getrandbits = self.rng.getrandbits
        for r in routes.routers:
            targets = r.targets if r.broadcast else (r.targets[r.select(values)],)
            for target in targets:
                edge = getrandbits(64) or 1
                edges ^= edge
                tup = Tuple(values, routes.fields, stream, self.component, self.task_id,
                            {root: edge for root in anchors}, born)
                outbox.push(target, tup, size)
                if parents:
                    for p in parents:
                        p.ackval ^= edge
        return edges


@dataclass(slots=True)
class _Pending:
    msg_id: Any
    values: Sequence[Any]
    stream: str
    retries: int
    born: float


class SpoutCollector:
    """The collector a spout emits through (``SpoutOutputCollector``)."""

    __slots__ = ("_task", "emitted")

    def __init__(self, task: "SpoutTask") -> None:
        self._task = task
        self.emitted = 0

    def emit(self, values: Sequence[Any], stream: str = DEFAULT_STREAM, msg_id: Any = None) -> None:
        self._task.emit(values, stream, msg_id)
        self.emitted += 1


class SpoutTask(_TaskBase):
    is_spout = True

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.spout: Spout = self.instance  # type: ignore[assignment]
        self.collector = SpoutCollector(self)
        self.pending: dict[int, _Pending] = {}
        self.outcomes: deque[tuple[int, bool, str]] = deque()
        self.untracked_acks: list[Any] = []
        self.exhausted = False
        self._wake = asyncio.Event()

    def emit(self, values: Sequence[Any], stream: str, msg_id: Any, retries: int = 0) -> None:
        engine = self.engine
        engine.spout_emitted += 1
        if msg_id is None or engine.acker is None:
            self._emit_one(values, stream, None, None, 0.0)
            if msg_id is not None:
                self.untracked_acks.append(msg_id)  # Storm acks at once when acking is off
            return
        born = time.perf_counter()
        root = self.rng.getrandbits(64) or 1
        edges = self._emit_one(values, stream, {root: 0}, None, born)
        self.pending[root] = _Pending(msg_id, values, stream, retries, born)
        engine.acker.track(root, self.task_id, edges, time.monotonic())

    def on_outcome(self, root: int, ok: bool, reason: str) -> None:
        """Called by the acker (same loop); handled in the spout's own loop."""
        self.outcomes.append((root, ok, reason))
        self._wake.set()

    def _handle_outcomes(self) -> None:
        engine, stats, spout = self.engine, self.stats, self.spout
        while self.outcomes:
            root, ok, reason = self.outcomes.popleft()
            p = self.pending.pop(root, None)
            if p is None:
                continue
            if ok:
                stats.acked += 1
                stats.complete_latency.observe(time.perf_counter() - p.born)
                spout.ack(p.msg_id)
                continue
            stats.failed += 1
            spout.fail(p.msg_id)
            if engine.stopping:
                continue  # failed back to the spout; the source keeps it
            if p.retries < engine.max_retries:
                stats.replayed += 1
                self.emit(p.values, p.stream, p.msg_id, p.retries + 1)
            else:
                stats.dead_lettered += 1
                engine.dead_letters.write(self.component, self.task_id, p.msg_id, p.stream,
                                          p.values, p.retries, reason)

    async def run(self) -> None:
        spout, engine, collector, stats = self.spout, self.engine, self.collector, self.stats
        call = spout.next_tuple
        is_async = inspect.iscoroutinefunction(call)
        max_pending = engine.max_spout_pending
        while True:
            if self.outcomes:
                self._handle_outcomes()
                if self.outbox.due():
                    stats.backpressured_ns += await self.outbox.flush()
            if self.untracked_acks:
                acks, self.untracked_acks = self.untracked_acks, []
                for m in acks:
                    spout.ack(m)
            if engine.stopping or self.exhausted or (engine.max_tuples is not None
                                                     and engine.spout_emitted >= engine.max_tuples):
                if engine.max_tuples is not None and engine.spout_emitted >= engine.max_tuples:
                    engine.request_stop("max_tuples")
                if self.outbox.pending_count:
                    stats.backpressured_ns += await self.outbox.flush()
                if not self.pending:
                    return
                await self._wait_outcome()
                continue
            if len(self.pending) >= max_pending:
                if self.outbox.pending_count:
                    stats.backpressured_ns += await self.outbox.flush()
                await self._wait_outcome()
                continue
            before = collector.emitted
            try:
                if is_async:
                    await call()
                else:
                    call()
            except EndOfStream:
                self.exhausted = True
            except (TupleEncodingError, UnknownStreamError):
                raise
            except Exception:
                log.exception("spout %s (task %d) next_tuple raised", self.component, self.task_id)
                await asyncio.sleep(_SPOUT_IDLE_SLEEP_S)
            emitted = collector.emitted - before
            if emitted:
                await self._send(emitted)
            else:
                if self.outbox.pending_count:
                    stats.backpressured_ns += await self.outbox.flush()
                if not self.exhausted:
                    t0 = time.perf_counter_ns()
                    await asyncio.sleep(_SPOUT_IDLE_SLEEP_S)
                    stats.idle_ns += time.perf_counter_ns() - t0

    async def _wait_outcome(self) -> None:
        self._wake.clear()
        if self.outcomes:
            return
        t0 = time.perf_counter_ns()
        try:
            await asyncio.wait_for(self._wake.wait(), 0.05)
        except asyncio.TimeoutError:
            pass
        self.stats.idle_ns += time.perf_counter_ns() - t0


class BoltCollector:
    """The collector a bolt emits, acks and fails through (``OutputCollector``)."""

    __slots__ = ("_task", "emitted", "current")

    def __init__(self, task: "BoltTask") -> None:
        self._task = task
        self.emitted = 0
        self.current: Tuple | None = None  # the input being executed (auto-anchoring)

    def emit(self, values: Sequence[Any], stream: str = DEFAULT_STREAM,
             anchors: Tuple | Sequence[Tuple] | None = None) -> None:
        task = self._task
        if anchors is None and task.auto_ack:
            anchors = self.current
        self.emitted += 1
        if anchors is None or task.engine.acker is None:
            born = anchors.born if isinstance(anchors, Tuple) else 0.0
            task._emit_one(values, stream, None, None, born)
            return
        parents = (anchors,) if isinstance(anchors, Tuple) else tuple(anchors)
        roots: dict[int, int] = {}
        for p in parents:
            if p.anchors:
                roots.update(p.anchors)
        task._emit_one(values, stream, roots or None, parents if roots else None,
                       parents[0].born if parents else 0.0)

    def ack(self, tup: Tuple) -> None:
        task = self._task
        task.stats.acked += 1
        acker = task.engine.acker
        if acker is not None and tup.anchors:
            for root, edge in tup.anchors.items():
                acker.update(root, edge ^ tup.ackval)

    def fail(self, tup: Tuple, reason: str = "") -> None:
        task = self._task
        task.stats.failed += 1
        acker = task.engine.acker
        if acker is not None and tup.anchors:
            why = reason or f"failed by {task.component}:{task.task_id}"
            for root in tup.anchors:
                acker.fail(root, why)


class BoltTask(_TaskBase):
    def __init__(self, *a: Any, queue: ByteQueue, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.bolt: Bolt = self.instance  # type: ignore[assignment]
        self.queue = queue
        self.auto_ack = bool(getattr(self.bolt, "auto_ack", True))
        self.collector = BoltCollector(self)
        self.waiting = False   # parked on an empty queue with nothing pending (drain check)
        self.tick_interval_s = getattr(self.bolt, "tick_interval_s", None)
        self.last_tick = time.monotonic()
        self._errors_logged = 0

    def _on_error(self, tup: Tuple, exc: BaseException) -> None:
        reason = f"{self.component}:{self.task_id} raised {type(exc).__name__}: {exc}"
        if self.engine.acker is None or not tup.anchors:
            self._errors_logged += 1
            if self._errors_logged <= 10 or self._errors_logged % 1000 == 0:
                log.error("bolt %s (task %d) failed a tuple (%d so far): %s", self.component,
                          self.task_id, self._errors_logged, reason,
                          exc_info=exc if self._errors_logged <= 3 else None)
        self.collector.fail(tup, reason)

    async def run(self) -> None:
        bolt, collector, stats, queue = self.bolt, self.collector, self.stats, self.queue
        assert queue is not None
        execute = bolt.execute
        is_async = inspect.iscoroutinefunction(execute)
        auto_ack = self.auto_ack
        flow_poll = self.engine.flow.poll
        hist = stats.execute_latency
        perf = time.perf_counter
        while True:
            item = queue.get_nowait()
            if item is None:
                if self.outbox.pending_count:
                    stats.backpressured_ns += await self.outbox.flush()
                    continue
                flow_poll(self)
                self.waiting = True
                t0 = time.perf_counter_ns()
                item = await queue.get()
                stats.idle_ns += time.perf_counter_ns() - t0
                self.waiting = False
            batch = item[0]
            before = collector.emitted
            if batch is TICK:
                try:
                    bolt.tick()
                except Exception:
                    log.exception("bolt %s (task %d) tick raised", self.component, self.task_id)
                await self._send(collector.emitted - before)
                continue
            first = True
            for tup in batch:
                collector.current = tup
                if first:
                    t_first = perf()
                try:
                    if is_async:
                        await execute(tup)
                    else:
                        execute(tup)
                except (TupleEncodingError, UnknownStreamError):
                    raise
                except Exception as exc:
                    self._on_error(tup, exc)
                else:
                    if auto_ack:
                        collector.ack(tup)
                if first:
                    # Execute latency is sampled: the first tuple of every transfer batch.
                    hist.observe(perf() - t_first)
                    first = False
            collector.current = None
            stats.executed += len(batch)
            await self._send(collector.emitted - before)
            flow_poll(self)
