"""Spout and bolt tasks: the asyncio loops that run one parallel instance each.

Each task is also the ``TaskHandle`` flow control sees: it reports its queue bytes,
observed emit rate and executed count, obeys ``set_rate`` through its limiter, and
is the only writer of its ``stats.rate_limit``.

A task never reaches into the engine: it is given what it needs (``RunState``: the
stop request and the spout budget; the acker; the dead-letter writer; flow
control's ``poll``) when it is built.

Where a task waits is where its time goes in Flink's split: awaiting its empty
input queue is *idle*, awaiting room in a downstream queue or the rate limiter is
*backpressured*, everything else is *busy*.
"""
from __future__ import annotations

import asyncio
import inspect
import logging
import random
import threading
import time
import types
from bisect import bisect_left
from collections import deque
from dataclasses import dataclass, field
from itertools import islice
from typing import Any, Callable, Iterable, Sequence

from backpressure.seams import Direction, FlowDisplay
from topo.api import Bolt, ComponentError, EmitError, EndOfStream, Spout, TaskContext, Tuple, TupleBatch
from runtime.local.acker import Acker
from runtime.local.blocking import BlockingRunner
from runtime.local.collectors import BoltCollector, Pending, SpoutBatch, SpoutCollector
from runtime.local.deadletter import DeadLetterWriter
from runtime.local.failures import FailureLog
from runtime.local.outbox import Outbox
from runtime.local.queue import ByteQueue
from runtime.local.ratelimit import EwmaRate, RateLimiter
from runtime.observe.stats import TaskStats

log = logging.getLogger("topo.task")

# The control item the engine puts in a bolt's queue to call ``Bolt.tick`` (Storm's tick tuple).
TICK_MARKER: list[Any] = [None]
# ... and to call ``Bolt.end_of_input`` once every spout has run out (a bounded input).
END_MARKER: list[Any] = [None]

# Shortest wait worth a timer: below it the limiter's debt carries to the next call.
_MIN_SLEEP_S = 0.001
_SPOUT_IDLE_SLEEP_S = 0.001  # Storm's default sleep-spout wait strategy
_SPOUT_ERROR_BACKOFF_MAX_S = 1.0
_MIN_RATE_SPAN_S = 0.05      # shortest run time a mean emit rate is read over


def batch_granularity(config: Any) -> bool:
    """Whether acking tracks spout batches and ack groups (``acking.granularity: batch``)."""
    return config.get("acking.granularity", "tuple") == "batch"


def bolt_groups_edges(config: Any, outbox: Outbox) -> bool:
    """Whether a bolt's tracked tuples to one task under one parent share an edge (an ack
    group). Always under batch granularity. Under tuple granularity too, where nothing reads
    its tuples one by one: the trees stay one per spout tuple, so which spout tuples a
    failure replays does not change, and a group's tuples cost a count, not an edge id, an
    anchors dict and a ledger update each. Not where a router can retarget (a rescale re-sends
    held tuples one by one, by key) nor under send windows (which ack and re-send tuple by tuple)."""
    if batch_granularity(config):
        return True
    return config.get("backpressure.policy") != "window" and all(
        r.retarget is None for routes in outbox.streams.values() for r in routes.routers)


class Rollback(Exception):
    """A tuple failed or timed out while checkpoints are on: the run goes back to the last
    checkpoint (replaying one tuple into stateful bolts would count it twice)."""


class ExecuteTimeout(Exception):
    """A bolt's execute ran past its ``execute_timeout_s`` and was cancelled (or abandoned)."""


@dataclass
class RunState:
    """What every task of one run reads and the engine owns: stop request and spout budget."""

    max_retries: int
    max_spout_pending: int
    max_tuples: int | None = None      # stop once the spouts emitted this many (None: no budget)
    spout_emitted: int = 0
    stopping: bool = False
    stop_reason: str = ""
    stop_event: asyncio.Event | None = None   # set by ``request_stop``; made by the running engine
    topology: str = ""
    # Who holds the spouts at their next call boundary ("checkpoint", "rescale"): a checkpoint
    # and a rescale may drain at once, and neither's end may let the spouts run under the other.
    holds: set[str] = field(default_factory=set)
    rollback_on_failure: bool = False   # checkpoints on: a failed tuple rolls back, never replays

    @property
    def paused(self) -> bool:
        """Someone drains the topology: spouts hold at their next call boundary."""
        return bool(self.holds)

    def request_stop(self, reason: str = "stopped") -> None:
        if not self.stopping:
            self.stopping = True
            self.stop_reason = reason
            log.info("stopping topology %s: %s", self.topology, reason)
        if self.stop_event is not None:
            self.stop_event.set()


@dataclass
class TaskWiring:
    """Everything a task is built with besides its own instance: given, never looked up."""

    component: str
    task_id: int
    context: TaskContext
    outbox: Outbox
    upstream_task_ids: Sequence[int]
    stats: TaskStats
    rng: random.Random
    run: RunState
    acker: Acker | None
    dead_letters: DeadLetterWriter
    flow_poll: Callable[[Any], None] = field(default=lambda handle: None)


# How long a bolt task may go on executing the batches already in its queue before it
# gives the event loop a turn. One batch per turn is not enough: a bolt that emits more
# tuples than it reads (a split) fills its downstream queues faster than tasks taking one
# batch per turn drain them, and with small tuples the byte bound then lets them hold
# hundreds of thousands of tuples (a word count with two tasks per component: 270 MB and
# twice the time, most of it the garbage collector walking the queued tuples and the
# cache misses of touching them). A bolt that works off what is queued, up to this long,
# keeps those queues short (30 MB) without changing any bound or any backpressure signal.
_BOLT_TURN_S = 0.002


@types.coroutine
def _yield() -> Any:
    """Give the event loop one turn (what ``asyncio.sleep(0)`` does, without its checks)."""
    yield


class _TaskBase:
    """What spout and bolt tasks share: identity, outbox, limiter, stats; the ``TaskHandle``."""

    is_spout = False

    def __init__(self, wiring: TaskWiring, instance: Spout | Bolt) -> None:
        self.component = wiring.component
        self.task_id = wiring.task_id
        self.context = wiring.context
        self.instance = instance
        self.outbox = wiring.outbox
        self.upstream_task_ids = list(wiring.upstream_task_ids)
        self.stats = wiring.stats
        self.rng = wiring.rng
        self.run_state = wiring.run
        self.acker = wiring.acker
        self.dead_letters = wiring.dead_letters
        self.limiter = RateLimiter()
        self.dry_rounds = 0               # a spout: rounds in which its source had less than a chunk
        self.emit_meter = EwmaRate()      # observed emit rate (a meter; the limit is the limiter's)
        self.executed_meter = EwmaRate()  # processed (executed) input tuples/s
        self.clock: Callable[[], float] = time.monotonic
        self.started_at = 0.0             # when run() began (0: not yet)
        self.queue: ByteQueue | None = None
        cfg = self.context.config
        kind = "spout" if self.is_spout else "bolt"
        self.failures = FailureLog(f"{kind} {self.component} (task {self.task_id})", log,
                                   log_first=cfg.get("errors.log_first", 10),
                                   interval_s=cfg.get("errors.log_interval_s", 10.0))

    # --- TaskHandle ---------------------------------------------------------
    def queue_bytes(self) -> int:
        return self.queue.bytes if self.queue is not None else 0

    def observed_rate(self) -> float:
        """The emit rate's EWMA; before its first figure (the sampler needs one period),
        the mean since the task started, so flow control never reads a running task as
        idle in its first fraction of a second (a policy stepping it from 0 would have
        no ``originv``)."""
        v = self.emit_meter.value
        if v or not self.started_at:
            return v
        elapsed = self.clock() - self.started_at
        return self.stats.emitted / elapsed if elapsed >= _MIN_RATE_SPAN_S else 0.0

    def _start_meters(self) -> None:
        self.started_at = now = self.clock()
        self.emit_meter.sample(self.stats.emitted, now)     # the baseline: a figure one period on
        self.executed_meter.sample(self.stats.executed, now)

    def executed_count(self) -> int:
        return self.stats.executed

    def emitted_count(self) -> int:
        return self.stats.emitted

    def dry_count(self) -> int:
        return self.dry_rounds

    def wait_count(self) -> int:
        return self.limiter.waits

    def set_rate(self, tuples_per_second: float | None) -> None:
        if tuples_per_second is None:
            if self.limiter.rate is not None and self.stats.emitted_at_first_release is None:
                self.stats.emitted_at_first_release = self.stats.emitted
            self.limiter.clear_rate()
        else:
            self.limiter.set_rate(tuples_per_second)
        self.stats.rate_limit = self.limiter.rate

    def show(self, display: FlowDisplay) -> None:
        self.stats.show(display)

    def count_signal(self, direction: Direction, kind: str) -> None:
        self.stats.count_signal(direction, kind)

    def sample(self, now: float) -> None:
        """Refresh the observed emit rate (the engine's sampler calls this periodically)."""
        self.stats.observed_rate = self.emit_meter.sample(self.stats.emitted, now)
        self.stats.processed_rate = self.executed_meter.sample(self.stats.executed, now)

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


class SpoutTask(_TaskBase):
    is_spout = True

    def __init__(self, wiring: TaskWiring, spout: Spout) -> None:
        super().__init__(wiring, spout)
        self.spout = spout
        self.untracked_acks: list[Any] = []
        self.pending: dict[int, Pending | SpoutBatch] = {}
        # outcome_hook(root, ok, msg_id, sent_again): send windows (document 002) learn acks here
        self.outcome_hook: Callable[[int, bool, Any, bool], None] | None = None
        self.outcomes: deque[tuple[int, bool, str]] = deque()
        # Storm acks an untracked tuple at once; only bother when the spout listens.
        listens = type(spout).ack is not Spout.ack
        self.batches = self.acker is not None and batch_granularity(self.context.config)
        self.collector = SpoutCollector(self.outbox, acker=self.acker, pending=self.pending,
                                        on_outcome=self.on_outcome, getrandbits=self.rng.getrandbits,
                                        untracked_acks=self.untracked_acks if listens else None,
                                        batches=self.batches)
        self.exhausted = False
        self.consecutive_errors = 0
        self.max_consecutive_errors: int = self.context.config.get("spout.max_consecutive_errors", 1000)
        self.parked = False     # waiting in _wait_outcome
        self.holding = False    # parked at a call boundary while a checkpoint drains
        self.finished = False   # run() returned
        self._wake = asyncio.Event()

    def on_outcome(self, root: int, ok: bool, reason: str) -> None:
        """Called by the acker (same loop); handled in the spout's own loop."""
        self.outcomes.append((root, ok, reason))
        if self.parked:
            self._wake.set()

    def handle_outcomes(self) -> None:
        """Acks and fails the acker reported: latency, ``Spout.ack``/``fail``, replay or dead letter."""
        run, stats, spout = self.run_state, self.stats, self.spout
        outcomes, pending = self.outcomes, self.pending
        hist = stats.complete_latency
        bounds, counts = hist.bounds, hist.counts
        ack = spout.ack if type(spout).ack is not Spout.ack else None
        hook = self.outcome_hook
        now = time.perf_counter()
        acked = 0
        latency_sum = 0.0
        while outcomes:
            root, ok, reason = outcomes.popleft()
            p = pending.pop(root, None)
            if p is None:
                continue
            if type(p) is SpoutBatch:
                acked += self._batch_outcome(p, ok, reason, now)
                continue
            msg_id, values, stream, retries, born = p
            if ok:
                acked += 1
                latency = now - born
                latency_sum += latency
                counts[bisect_left(bounds, latency)] += 1
                if ack is not None:
                    ack(msg_id)
                if hook is not None:
                    hook(root, True, msg_id, False)
                continue
            stats.failed += 1
            spout.fail(msg_id)
            if hook is not None:     # (last argument: whether the tuple is sent again)
                hook(root, False, msg_id, not run.stopping and retries < run.max_retries)
            if run.stopping:
                continue  # failed back to the spout; the source keeps it
            if run.rollback_on_failure:
                raise Rollback(f"spout {self.component!r} (task {self.task_id}): tuple {msg_id!r} {reason or 'failed'}")
            if retries < run.max_retries:
                stats.replayed += 1
                stats.emitted += 1
                self.collector.emit(values, stream, msg_id, retries + 1)
            else:
                stats.dead_lettered += 1
                self.dead_letters.write(self.component, self.task_id, msg_id, stream,
                                          values, retries, reason)
        stats.acked += acked
        hist.n += acked
        hist.total += latency_sum

    def _batch_outcome(self, b: SpoutBatch, ok: bool, reason: str, now: float) -> int:
        """A spout batch's tree completed or failed (batch granularity): ``Spout.ack`` or
        ``fail`` of each of its msg ids; a failed batch is replayed whole, or its tuples go
        to the dead letters once its retries are spent. Returns how many were acked."""
        run, stats, spout = self.run_state, self.stats, self.spout
        n = len(b.msg_ids)
        self.collector.pending_tuples -= n
        if ok:
            hist = stats.complete_latency
            latency = now - b.born
            hist.counts[bisect_left(hist.bounds, latency)] += n
            hist.total += latency * n
            if type(spout).ack is not Spout.ack:
                for msg_id in b.msg_ids:
                    spout.ack(msg_id)
            return n
        stats.failed += n
        for msg_id in b.msg_ids:
            spout.fail(msg_id)
        if run.stopping:
            return 0
        if run.rollback_on_failure:
            raise Rollback(f"spout {self.component!r} (task {self.task_id}): a batch of {n} tuples "
                           f"{reason or 'failed'}")
        if b.retries < run.max_retries:
            stats.replayed += n
            stats.emitted += n
            self.collector.replay(b)
        else:
            stats.dead_lettered += n
            for msg_id, values, stream in zip(b.msg_ids, b.values, b.streams):
                self.dead_letters.write(self.component, self.task_id, msg_id, stream, values, b.retries, reason)
        return 0

    def _in_flight(self) -> int:
        """Tracked tuples in flight (``max_spout_pending`` counts tuples, not roots)."""
        return self.collector.pending_tuples if self.batches else len(self.pending)

    def _chunk(self) -> int:
        """How many tuples to emit between bookkeeping rounds.

        A full batch when unlimited; when rate limited, about 2 ms worth of emits so
        the limiter's sleeps stay short and the rate smooth.
        """
        rate = self.limiter.rate
        if rate is None:
            return self.outbox.batch_size
        return max(1, min(self.outbox.batch_size, int(rate * 0.002)))

    def wake(self) -> None:
        """Cut a park short (an outcome arrived, or a checkpoint resumed the spouts)."""
        self._wake.set()

    async def run(self) -> None:
        self._start_meters()
        try:
            await self._run()
        finally:
            self.finished = True

    async def _run(self) -> None:
        spout, run, collector, stats, outbox = self.spout, self.run_state, self.collector, self.stats, self.outbox
        call = spout.next_tuple
        is_async = inspect.iscoroutinefunction(call)
        max_pending = run.max_spout_pending
        loop = asyncio.get_running_loop()
        while True:
            if self.outcomes:
                self.handle_outcomes()
            if self.untracked_acks:
                acks = self.untracked_acks[:]
                self.untracked_acks.clear()  # the same list stays bound in the collector
                for m in acks:
                    spout.ack(m)
            max_tuples = run.max_tuples
            if max_tuples is not None and run.spout_emitted >= max_tuples:
                run.request_stop("max_tuples")
            if run.stopping or self.exhausted:
                if outbox.pending_count:
                    stats.backpressured_ns += await outbox.flush()
                if not self.pending:
                    return
                await self._wait_outcome()
                continue
            if run.paused:
                if outbox.pending_count:
                    stats.backpressured_ns += await outbox.flush()
                self.holding = True
                await self._wait_outcome()
                continue
            self.holding = False
            if self._in_flight() >= max_pending:
                if outbox.pending_count:
                    stats.backpressured_ns += await outbox.flush()
                await self._wait_outcome()
                continue
            if outbox.gate is not None and outbox.pending_count >= outbox.batch_size:
                stats.backpressured_ns += await outbox.flush()
                if outbox.pending_count >= outbox.batch_size:
                    await self._wait_outcome()      # send windows (document 002) hold a batch back: no more
                    continue                        # records are read until acks free room
            before = collector.emitted
            limit = self._chunk()
            if max_tuples is not None:
                limit = max(1, min(limit, max_tuples - run.spout_emitted))
            batch_size = outbox.batch_size
            dry = False
            try:
                while True:
                    mark = collector.emitted
                    if is_async:
                        # If the call waits (for its source), what it or an earlier call
                        # emitted still goes out within the flush interval.
                        timer = loop.call_later(outbox.flush_interval_s, outbox.flush_soon)
                        try:
                            await call()
                        finally:
                            timer.cancel()
                    else:
                        call()
                    if collector.emitted == mark:
                        dry = True  # nothing to give right now
                        break
                    n = collector.emitted - before
                    if n >= limit or outbox.pending_count >= batch_size:
                        break
                    if not n & 7 and outbox.due():
                        break   # a partial batch past the flush interval (checked every 8th tuple)
            except EndOfStream:
                self.exhausted = True
            except EmitError:
                raise
            except Exception as exc:
                await self._after_error(exc)
                dry = True
            else:
                self.consecutive_errors = 0
            if dry:
                self.dry_rounds += 1
            collector.close_batch()     # (batch granularity: this round's tuples are one root)
            emitted = collector.emitted - before
            run.spout_emitted += emitted
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

    async def _after_error(self, exc: Exception) -> None:
        """``next_tuple`` raised: log it, back off (1 ms doubling to 1 s), give up after too many."""
        self.consecutive_errors += 1
        n = self.consecutive_errors
        self.failures.record("next_tuple raised", exc)
        if n >= self.max_consecutive_errors:
            self.failures.flush(force=True)
            raise ComponentError(
                f"spout {self.component!r} (task {self.task_id}): next_tuple raised {n} times in a row "
                f"(spout.max_consecutive_errors); last: {type(exc).__name__}: {exc}"[:400]) from exc
        t0 = time.perf_counter_ns()
        await asyncio.sleep(min(_SPOUT_ERROR_BACKOFF_MAX_S, _SPOUT_IDLE_SLEEP_S * 2 ** min(n, 20)))
        self.stats.idle_ns += time.perf_counter_ns() - t0

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


class BoltTask(_TaskBase):
    def __init__(self, wiring: TaskWiring, bolt: Bolt, queue: ByteQueue) -> None:
        super().__init__(wiring, bolt)
        self.bolt = bolt
        self.queue: ByteQueue = queue
        self.flow_poll = wiring.flow_poll
        self.auto_ack = bool(getattr(bolt, "auto_ack", True))
        self.collector = BoltCollector(self.outbox, acker=self.acker, stats=self.stats,
                                       auto_anchor=self.auto_ack, getrandbits=self.rng.getrandbits,
                                       batches=self.acker is not None
                                       and bolt_groups_edges(self.context.config, self.outbox))
        self.waiting = False   # parked on an empty queue with nothing pending (drain check)
        self.tick_interval_s: float | None = getattr(bolt, "tick_interval_s", None)
        self.last_tick = time.monotonic()
        self._is_async = inspect.iscoroutinefunction(bolt.execute)
        self.blocking = bool(getattr(bolt, "blocking", False))
        own_timeout = getattr(bolt, "execute_timeout_s", None)
        self.execute_timeout_s: float = float(own_timeout if own_timeout is not None
                                              else self.context.config.get("execute_timeout_s", 60.0))
        self.executing_since = 0.0          # perf_counter() when a cancellable execute began; 0 = none
        self._timed_out = False             # the watchdog cancelled the execute in progress
        self._runner_task: asyncio.Task[Any] | None = None
        self._thread: BlockingRunner | None = (BlockingRunner(f"{self.component}:{self.task_id}")
                                               if self.blocking else None)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_ident = 0
        if self.blocking:
            self.collector.on_loop = self._call_on_loop

    def _call_on_loop(self, fn: Callable[..., None], *args: Any) -> None:
        """Run ``fn`` on the event loop's thread (an ack or fail from a blocking execute)."""
        if threading.get_ident() == self._loop_ident:
            fn(*args)
        else:
            assert self._loop is not None
            self._loop.call_soon_threadsafe(fn, *args)

    def _on_error(self, tup: Tuple, exc: BaseException) -> None:
        if isinstance(exc, EmitError):
            raise exc  # a programming error: stop the topology with the precise message
        reason = f"{self.component}:{self.task_id} raised {type(exc).__name__}: {exc}"
        self.failures.record("execute failed a tuple", exc)
        self.collector.fail(tup, reason)

    def check_overrun(self, now: float) -> None:
        """Watchdog (the engine's sampler): cancel an execute running past its timeout.

        Only an ``async`` or blocking execute is cancellable; the cancellation lands in
        the execute's own await and ``_execute_batch`` turns it into a failed tuple.
        """
        since = self.executing_since
        if since and not self._timed_out and now - since > self.execute_timeout_s \
                and self._runner_task is not None:
            self._timed_out = True
            self._runner_task.cancel()

    def close_thread(self) -> None:
        if self._thread is not None:
            self._thread.close()

    async def _execute_batch(self, batch: list[Tuple]) -> None:
        """Execute each tuple; ack (auto_ack) or fail it. One tuple per batch is timed."""
        execute = self.bolt.execute
        collector = self.collector
        is_async = self._is_async
        blocking = self._thread is not None
        ack = self.acker.ack_tuple if self.acker is not None else None
        auto_ack = self.auto_ack
        perf = time.perf_counter
        ok = 0
        t_first = perf()
        first = True
        for tup in batch:
            collector.current = tup
            try:
                if blocking or is_async:   # cancellable: the watchdog sees when it began
                    self.executing_since = perf()
                    try:
                        if blocking:
                            await self._thread.run(execute, tup)  # type: ignore[union-attr]
                        else:
                            await execute(tup)
                    finally:
                        self.executing_since = 0.0
                else:
                    execute(tup)
            except asyncio.CancelledError:
                if not self._timed_out:
                    raise       # the run is stopping
                self._overrun(tup)
                continue
            except Exception as exc:
                self._on_error(tup, exc)
            else:
                if auto_ack:
                    ok += 1
                    anchors = tup.anchors
                    if anchors and ack is not None:
                        ack(anchors, tup.ackcell)
            if first:
                # Execute latency is sampled: the first tuple of every transfer batch.
                self.stats.execute_latency.observe(perf() - t_first)
                first = False
        collector.current = None
        self.stats.acked += ok

    def _overrun(self, tup: Tuple) -> None:
        """The watchdog cancelled this tuple's execute: fail it and go on."""
        self._timed_out = False
        task = asyncio.current_task()
        if task is not None:
            task.uncancel()
        if self._thread is not None:   # the stuck call keeps its thread: take a fresh one
            self._thread.close()
            self._thread = BlockingRunner(f"{self.component}:{self.task_id}")
        self._on_error(tup, ExecuteTimeout(f"execute ran past execute_timeout_s={self.execute_timeout_s:g}"))

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

    def _execute_each(self, tuples: Iterable[Tuple], failed: list[Tuple]) -> None:
        """Sync execute of each tuple as the current input; the ones that raised into ``failed``."""
        execute = self.bolt.execute
        collector = self.collector
        for tup in tuples:
            collector.current = tup
            try:
                execute(tup)
            except Exception as exc:
                self._on_error(tup, exc)
                failed.append(tup)
        collector.current = None

    async def _execute_batch_tracked(self, batch: list[Tuple]) -> None:
        """A sync execute with acking on: each tuple executed as the current input (its
        emits auto-anchored to it), then the batch's successes acked in one ``ack_batch``
        (under batch granularity usually one group: one ledger update)."""
        perf = time.perf_counter
        failed: list[Tuple] = []
        t_first = perf()
        self._execute_each(islice(batch, 1), failed)     # the first tuple's time is sampled
        self.stats.execute_latency.observe(perf() - t_first)
        self._execute_each(islice(batch, 1, None), failed)
        if self.auto_ack:
            acker = self.acker
            assert acker is not None
            if failed:
                gone = set(map(id, failed))
                acker.ack_batch([t for t in batch if id(t) not in gone])
            else:
                acker.ack_batch(batch)
            self.stats.acked += len(batch) - len(failed)

    async def _execute_whole(self, batch: list[Tuple] | TupleBatch) -> None:
        """A bolt with ``execute_batch``: one call for the whole batch, which is acked
        (``auto_ack``) or failed as a whole; the execute latency observed is the call's
        time per tuple."""
        t0 = time.perf_counter()
        try:
            self.bolt.execute_batch(batch)
        except EmitError:
            raise
        except Exception as exc:
            reason = f"{self.component}:{self.task_id} execute_batch raised {type(exc).__name__}: {exc}"
            self.failures.record("execute_batch failed a batch", exc)
            for tup in batch:
                self.collector.fail(tup, reason)
            return
        self.stats.execute_latency.observe((time.perf_counter() - t0) / len(batch))
        if self.auto_ack:
            if self.acker is not None:
                self.acker.ack_batch(batch)
            self.stats.acked += len(batch)

    def _batch_runner(self) -> Callable[[list[Tuple]], Any]:
        """How this bolt executes a batch: whole (``execute_batch``), the untracked fast
        loop, or tuple by tuple with acking, cancellation and threads."""
        if type(self.bolt).batched():
            if self.blocking or inspect.iscoroutinefunction(self.bolt.execute_batch):
                raise ComponentError(f"bolt {self.component!r}: execute_batch must be a plain function "
                                     f"(an async or blocking bolt executes tuple by tuple)")
            return self._execute_whole
        if not self._is_async and not self.blocking:
            return self._execute_batch_fast if self.acker is None else self._execute_batch_tracked
        return self._execute_batch

    async def run(self) -> None:
        bolt, collector, stats, queue = self.bolt, self.collector, self.stats, self.queue
        self._start_meters()
        self._runner_task = asyncio.current_task()
        self._loop = asyncio.get_running_loop()
        self._loop_ident = threading.get_ident()
        run_batch = self._batch_runner()
        whole = type(bolt).batched()     # takes a ``TupleBatch`` as it is; the others get tuples
        flow_poll = self.flow_poll
        perf_counter = time.perf_counter
        turn_end = perf_counter() + _BOLT_TURN_S
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
                turn_end = perf_counter() + _BOLT_TURN_S
            batch = item[0]
            before = collector.emitted
            if batch is TICK_MARKER or batch is END_MARKER:
                try:
                    bolt.tick() if batch is TICK_MARKER else bolt.end_of_input()  # type: ignore[attr-defined]
                except Exception as exc:
                    self.failures.record("tick raised" if batch is TICK_MARKER else "end_of_input raised", exc)
                await self._send(collector.emitted - before)
                continue
            if not whole and type(batch) is TupleBatch:
                batch = batch.tuples()
            await run_batch(batch)
            stats.executed += len(batch)
            await self._send(collector.emitted - before)
            flow_poll(self)
            if queue.count and perf_counter() < turn_end:
                continue    # more waiting, and this turn has time left: see _BOLT_TURN_S
            await _yield()  # a busy bolt with room downstream would otherwise never suspend
            turn_end = perf_counter() + _BOLT_TURN_S
