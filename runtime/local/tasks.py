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
import types
from bisect import bisect_left
from collections import deque
from typing import TYPE_CHECKING, Any, Callable, Sequence

from topo.api import DEFAULT_STREAM, Bolt, EndOfStream, Spout, TaskContext, Tuple
from runtime.local.outbox import Outbox, TupleEncodingError, UnknownStreamError
from runtime.local.queue import ByteQueue
from runtime.local.ratelimit import EwmaRate, RateLimiter
from runtime.observe.stats import TaskStats

if TYPE_CHECKING:
    from runtime.local.engine import LocalEngine

log = logging.getLogger("topo.task")

# The control item a ticker puts in a bolt's queue to call ``Bolt.tick``.
TICK: list[Any] = [None]

# Shortest wait worth a timer: below it the limiter's debt carries to the next call.
_MIN_SLEEP_S = 0.001
_SPOUT_IDLE_SLEEP_S = 0.001  # Storm's default sleep-spout wait strategy


@types.coroutine
def _yield() -> Any:
    """Give the event loop one turn (what ``asyncio.sleep(0)`` does, without its checks)."""
    yield


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
        stats.emitted += emitted
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


# What a spout task keeps of each tracked root for replay: a plain tuple, made per emit.
# (msg_id, values, stream, retries, born)
_Pending = tuple


class SpoutCollector:
    """The collector a spout emits through (``SpoutOutputCollector``).

    ``emit(values, stream="default", msg_id=None)`` is bound per task at start: with
    acking off it is the outbox's flat untracked emit, with acking on the tracking one.
    """

    __slots__ = ("emit", "emitted")

    def __init__(self, task: "SpoutTask") -> None:
        self.emitted = 0
        if task.engine.acker is None:
            # Storm acks an untracked tuple at once; only bother when the spout listens.
            listens = type(task.instance).ack is not Spout.ack
            self.emit = task.outbox.untracked_emit(self, task.untracked_acks if listens else None)
        else:
            self.emit = _tracked_spout_emit(task, self)


def _tracked_spout_emit(task: "SpoutTask", collector: SpoutCollector) -> Callable[..., None]:
    """The spout's emit with acking on: a tuple with a ``msg_id`` becomes a tracked root.

    The root's edges go into the acker's ledger and its values into ``pending`` for
    replay; ``_retries`` is the engine's own argument when it replays.
    """
    outbox = task.outbox
    fast, tracked = outbox.fast, outbox.tracked
    acker = task.engine.acker
    assert acker is not None
    ledger, timeout = acker.ledger, acker.timeout_s
    pending = task.pending
    getrandbits = task.rng.getrandbits
    perf = time.perf_counter
    on_outcome = task.on_outcome

    def emit(values: Sequence[Any], stream: str = DEFAULT_STREAM, msg_id: Any = None, _retries: int = 0) -> None:
        collector.emitted += 1
        if msg_id is None:
            f = fast.get(stream)
            if f is None:
                raise outbox.unknown_stream(stream)
            f(values, 0.0)
            return
        e = tracked.get(stream)
        if e is None:
            raise outbox.unknown_stream(stream)
        born = perf()  # also the acker's clock: one reading serves both
        root = getrandbits(64) or 1
        edges = e(values, (root,), None, born, getrandbits)
        pending[root] = (msg_id, values, stream, _retries, born)
        if edges:
            ledger[root] = [edges, on_outcome, born + timeout]
        else:
            on_outcome(root, True, "")  # no subscriber: complete at once

    return emit


class SpoutTask(_TaskBase):
    is_spout = True

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.spout: Spout = self.instance  # type: ignore[assignment]
        self.untracked_acks: list[Any] = []
        self.pending: dict[int, _Pending] = {}
        self.outcomes: deque[tuple[int, bool, str]] = deque()
        self.collector = SpoutCollector(self)
        self.exhausted = False
        self._errors_logged = 0
        self.parked = False  # waiting in _wait_outcome
        self._wake = asyncio.Event()

    def on_outcome(self, root: int, ok: bool, reason: str) -> None:
        """Called by the acker (same loop); handled in the spout's own loop."""
        self.outcomes.append((root, ok, reason))
        if self.parked:
            self._wake.set()

    def _handle_outcomes(self) -> None:
        engine, stats, spout = self.engine, self.stats, self.spout
        outcomes, pending = self.outcomes, self.pending
        hist = stats.complete_latency
        bounds, counts = hist.bounds, hist.counts
        ack = spout.ack if type(spout).ack is not Spout.ack else None
        now = time.perf_counter()
        acked = 0
        latency_sum = 0.0
        while outcomes:
            root, ok, reason = outcomes.popleft()
            p = pending.pop(root, None)
            if p is None:
                continue
            msg_id, values, stream, retries, born = p
            if ok:
                acked += 1
                latency = now - born
                latency_sum += latency
                counts[bisect_left(bounds, latency)] += 1
                if ack is not None:
                    ack(msg_id)
                continue
            stats.failed += 1
            spout.fail(msg_id)
            if engine.stopping:
                continue  # failed back to the spout; the source keeps it
            if retries < engine.max_retries:
                stats.replayed += 1
                stats.emitted += 1
                self.collector.emit(values, stream, msg_id, retries + 1)
            else:
                stats.dead_lettered += 1
                engine.dead_letters.write(self.component, self.task_id, msg_id, stream,
                                          values, retries, reason)
        stats.acked += acked
        hist.n += acked
        hist.total += latency_sum

    def _chunk(self) -> int:
        """How many tuples to emit between bookkeeping rounds.

        A full batch when unlimited; when rate limited, about 2 ms worth of emits so
        the limiter's sleeps stay short and the rate smooth.
        """
        rate = self.limiter.rate
        if rate is None:
            return self.outbox.batch_size
        return max(1, min(self.outbox.batch_size, int(rate * 0.002)))

    async def run(self) -> None:
        spout, engine, collector, stats, outbox = self.spout, self.engine, self.collector, self.stats, self.outbox
        call = spout.next_tuple
        is_async = inspect.iscoroutinefunction(call)
        max_pending = engine.max_spout_pending
        while True:
            if self.outcomes:
                self._handle_outcomes()
            if self.untracked_acks:
                acks = self.untracked_acks[:]
                self.untracked_acks.clear()  # the same list stays bound in the collector
                for m in acks:
                    spout.ack(m)
            max_tuples = engine.max_tuples
            if max_tuples is not None and engine.spout_emitted >= max_tuples:
                engine.request_stop("max_tuples")
            if engine.stopping or self.exhausted:
                if outbox.pending_count:
                    stats.backpressured_ns += await outbox.flush()
                if not self.pending:
                    return
                await self._wait_outcome()
                continue
            if len(self.pending) >= max_pending:
                if outbox.pending_count:
                    stats.backpressured_ns += await outbox.flush()
                await self._wait_outcome()
                continue
            before = collector.emitted
            limit = self._chunk()
            if max_tuples is not None:
                limit = max(1, min(limit, max_tuples - engine.spout_emitted))
            batch_size = outbox.batch_size
            dry = False
            try:
                while True:
                    mark = collector.emitted
                    if is_async:
                        await call()
                    else:
                        call()
                    if collector.emitted == mark:
                        dry = True  # nothing to give right now
                        break
                    if collector.emitted - before >= limit or outbox.pending_count >= batch_size:
                        break
            except EndOfStream:
                self.exhausted = True
            except (TupleEncodingError, UnknownStreamError):
                raise
            except Exception as exc:
                self._errors_logged += 1
                if self._errors_logged <= 10 or self._errors_logged % 1000 == 0:
                    log.error("spout %s (task %d) next_tuple raised (%d so far): %s: %s", self.component,
                              self.task_id, self._errors_logged, type(exc).__name__, exc,
                              exc_info=exc if self._errors_logged <= 3 else None)
                dry = True
            emitted = collector.emitted - before
            engine.spout_emitted += emitted
            if emitted:
                await self._send(emitted)
                if not dry and not self.exhausted:
                    # Awaiting a queue with room does not suspend: yield so other tasks,
                    # timers and signal handlers run even when nothing is full.
                    await _yield()
                    continue
            # The source had nothing (or less than a chunk): send what we have and wait a bit.
            if outbox.pending_count:
                stats.backpressured_ns += await outbox.flush()
            if not self.exhausted and not emitted:
                t0 = time.perf_counter_ns()
                await asyncio.sleep(_SPOUT_IDLE_SLEEP_S)
                stats.idle_ns += time.perf_counter_ns() - t0

    async def _wait_outcome(self) -> None:
        self._wake.clear()
        if self.outcomes:
            return
        t0 = time.perf_counter_ns()
        self.parked = True
        try:
            await asyncio.wait_for(self._wake.wait(), 0.05)
        except asyncio.TimeoutError:
            pass
        finally:
            self.parked = False
        self.stats.idle_ns += time.perf_counter_ns() - t0


class BoltCollector:
    """The collector a bolt emits, acks and fails through (``OutputCollector``)."""

    __slots__ = ("_task", "_fast", "_tracked_emit", "_acker", "_auto_anchor", "_getrandbits",
                 "emit", "emitted", "current")

    def __init__(self, task: "BoltTask") -> None:
        self._task = task
        self._fast = task.outbox.fast
        self._tracked_emit = task.outbox.tracked
        self._acker = task.engine.acker
        self._auto_anchor = task.auto_ack
        self._getrandbits = task.rng.getrandbits
        self.emitted = 0
        self.current: Tuple | None = None  # the input being executed (auto-anchoring)
        # emit(values, stream="default", anchors=None), bound per task like the spout's.
        self.emit = (task.outbox.untracked_emit(self, None) if self._acker is None
                     else self._auto_anchored_emit())

    def _auto_anchored_emit(self) -> Callable[..., None]:
        """Tracked emit with the common case first: anchored to the input being executed."""
        collector = self
        tracked = self._tracked_emit
        getrandbits = self._getrandbits
        general = self._emit_tracked
        auto = self._auto_anchor
        unknown = self._task.outbox.unknown_stream

        def emit(values: Sequence[Any], stream: str = DEFAULT_STREAM,
                 anchors: Tuple | Sequence[Tuple] | None = None) -> None:
            if anchors is None and auto:
                cur = collector.current
                if cur is not None:
                    roots = cur.anchors
                    if roots:
                        e = tracked.get(stream)
                        if e is None:
                            raise unknown(stream)
                        collector.emitted += 1
                        e(values, roots, (cur,), cur.born, getrandbits)
                        return
            general(values, stream, anchors)

        return emit

    def _emit_tracked(self, values: Sequence[Any], stream: str = DEFAULT_STREAM,
                      anchors: Tuple | Sequence[Tuple] | None = None) -> None:
        self.emitted += 1
        if anchors is None and self._auto_anchor:
            cur = self.current
            if cur is not None and cur.anchors:  # the common case: anchored to the input
                emit = self._tracked_emit.get(stream)
                if emit is None:
                    raise self._task.outbox.unknown_stream(stream)
                emit(values, cur.anchors, (cur,), cur.born, self._getrandbits)
                return
            anchors = cur
        parents = () if anchors is None else (anchors,) if isinstance(anchors, Tuple) else tuple(anchors)
        roots: dict[int, None] = {}
        for p in parents:
            if p.anchors:
                roots.update(dict.fromkeys(p.anchors))
        emit = self._tracked_emit.get(stream)
        if emit is None:
            raise self._task.outbox.unknown_stream(stream)
        if roots:
            emit(values, roots, parents, parents[0].born, self._getrandbits)
        else:
            self._fast[stream](values, 0.0)

    def ack(self, tup: Tuple) -> None:
        self._task.stats.acked += 1
        self.ack_silently(tup)

    def ack_silently(self, tup: Tuple) -> None:
        """XOR the tuple's edge (and its children's) out of each root's ledger; no count."""
        acker = self._acker
        anchors = tup.anchors
        if acker is not None and anchors:
            ledger = acker.ledger
            v = tup.ackcell[0]
            for root, edge in anchors.items():
                e = ledger.get(root)
                if e is not None:  # gone: already failed or timed out
                    x = e[0] ^ edge ^ v
                    e[0] = x
                    if not x:
                        acker.complete(root, e)

    def fail(self, tup: Tuple, reason: str = "") -> None:
        task = self._task
        task.stats.failed += 1
        acker = self._acker
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
        if isinstance(exc, (TupleEncodingError, UnknownStreamError)):
            raise exc  # a programming error: stop the topology with the precise message
        reason = f"{self.component}:{self.task_id} raised {type(exc).__name__}: {exc}"
        if self.engine.acker is None or not tup.anchors:
            self._errors_logged += 1
            if self._errors_logged <= 10 or self._errors_logged % 1000 == 0:
                log.error("bolt %s (task %d) failed a tuple (%d so far): %s", self.component,
                          self.task_id, self._errors_logged, reason,
                          exc_info=exc if self._errors_logged <= 3 else None)
        self.collector.fail(tup, reason)

    async def _execute_batch(self, batch: list[Tuple]) -> None:
        """Execute each tuple; ack (auto_ack) or fail it. One tuple per batch is timed.

        With acking on, the auto-ack is the ledger update of ``ack_silently`` written
        out in the loop: it runs once per tuple per hop.
        """
        execute = self.bolt.execute
        collector = self.collector
        is_async = self._is_async
        acker = self.engine.acker
        ledger_get = acker.ledger.get if acker is not None else None
        complete = acker.complete if acker is not None else None
        auto_ack = self.auto_ack
        perf = time.perf_counter
        ok = 0
        t_first = perf()
        first = True
        for tup in batch:
            collector.current = tup
            try:
                if is_async:
                    await execute(tup)
                else:
                    execute(tup)
            except Exception as exc:
                self._on_error(tup, exc)
            else:
                if auto_ack:
                    ok += 1
                    anchors = tup.anchors
                    if anchors and ledger_get is not None:
                        v = tup.ackcell[0]
                        for root, edge in anchors.items():
                            e = ledger_get(root)
                            if e is not None:  # gone: already failed or timed out
                                x = e[0] ^ edge ^ v
                                e[0] = x
                                if not x:
                                    complete(root, e)
            if first:
                # Execute latency is sampled: the first tuple of every transfer batch.
                self.stats.execute_latency.observe(perf() - t_first)
                first = False
        collector.current = None
        self.stats.acked += ok

    async def _execute_batch_fast(self, batch: list[Tuple]) -> None:
        """The common case: sync execute, untracked; errors go to ``_on_error``."""
        execute = self.bolt.execute
        perf = time.perf_counter
        t_first = perf()
        it = iter(batch)
        n = len(batch)
        failed = self.stats.failed
        try:
            execute(next(it))
        except Exception as exc:
            self._on_error(batch[0], exc)
        self.stats.execute_latency.observe(perf() - t_first)
        for tup in it:
            try:
                execute(tup)
            except Exception as exc:
                self._on_error(tup, exc)
        if self.auto_ack:
            self.stats.acked += n - (self.stats.failed - failed)

    async def run(self) -> None:
        bolt, collector, stats, queue = self.bolt, self.collector, self.stats, self.queue
        assert queue is not None
        self._is_async = inspect.iscoroutinefunction(bolt.execute)
        run_batch = (self._execute_batch_fast if not self._is_async and self.engine.acker is None
                     else self._execute_batch)
        flow_poll = self.engine.flow.poll
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
            await run_batch(batch)
            stats.executed += len(batch)
            await self._send(collector.emitted - before)
            flow_poll(self)
            await _yield()  # a busy bolt with room downstream would otherwise never suspend
