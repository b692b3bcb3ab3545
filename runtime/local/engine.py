"""The local engine: a whole topology in one process, one asyncio task per task.

Task ids are assigned from 1 in component order (Storm numbers tasks the same
way). Every bolt task owns one byte-bounded input queue; every task owns an
outbox that routes and batches its emits. A ticker samples emit rates and time
splits into the tasks' stats and expires timed-out tuples.

Stopping drains: spouts stop pulling, the tuples already in flight are processed
(and acked, when acking is on) for up to ``drain_timeout_s``; what is still
pending after that is failed back to its spout, so nothing vanishes silently.
"""
from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import random
import signal
import time
from dataclasses import dataclass
from typing import Any, Iterator, Protocol, Sequence

from topo.api import FieldIndex
from topo.config import resolve
from topo.topology import Topology
from backpressure.seams import FlowControl
from runtime.local.acker import Acker
from runtime.local.deadletter import DeadLetterWriter
from runtime.local.outbox import Outbox, StreamRoutes
from runtime.local.queue import ByteQueue
from runtime.observe.stats import TaskStats
from runtime.local.tasks import TICK, BoltTask, SpoutTask, _TaskBase

log = logging.getLogger("topo.engine")

_TICK_S = 0.25


class Service(Protocol):
    """Something that runs beside a topology: exporter, console, status writer."""

    async def start(self, engine: "LocalEngine") -> None: ...

    async def stop(self) -> None: ...


@dataclass
class RunResult:
    stats: list[TaskStats]
    reason: str  # "exhausted" | "duration" | "max_tuples" | "signal" | "stopped"

    def component_totals(self) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for s in self.stats:
            t = out.setdefault(s.component, {"emitted": 0, "executed": 0, "acked": 0, "failed": 0,
                                             "replayed": 0, "dead_lettered": 0})
            for k in t:
                t[k] += getattr(s, k)
        return out


class LocalEngine:
    def __init__(self, topology: Topology, config: dict[str, Any] | None = None, *,
                 flow: FlowControl | None = None, services: Sequence[Service] = ()) -> None:
        self.topology = topology
        self.config = config if config is not None and "queue.hard_bound" in config else resolve(
            topology.config, config or {})
        cfg = self.config
        self.seed: int | None = cfg["seed"]
        if flow is None:
            from backpressure.drivers.factory import make_flow_control
            flow = make_flow_control(cfg, topology.name)
        self.flow: FlowControl = flow
        self.services = list(services)
        self.max_retries: int = cfg["max_retries"]
        self.max_spout_pending: int = cfg["max_spout_pending"]
        self.max_tuples: int | None = None
        self.spout_emitted = 0
        self.stopping = False
        self.stop_reason = ""
        self.dead_letters = DeadLetterWriter(cfg["dead_letter_path"], topology.name)
        self.tasks: list[_TaskBase] = []
        self.acker: Acker | None = (Acker(cfg["message_timeout_s"])
                                    if cfg["acking"] else None)
        self._stop_event: asyncio.Event | None = None
        self._build()

    # --- construction ---------------------------------------------------------
    def _build(self) -> None:
        cfg, topo = self.config, self.topology
        ids: dict[str, list[int]] = {}
        next_id = 1
        for c in topo.components.values():
            ids[c.id] = list(range(next_id, next_id + c.parallelism))
            next_id += c.parallelism
        self.task_ids = ids
        queues = {tid: ByteQueue(cfg["queue.hard_bound"])
                  for c in topo.bolts for tid in ids[c.id]}
        self.queues = queues
        all_tasks = frozenset(queues)
        rng = random.Random(self.seed)
        for c in topo.components.values():
            upstream = sorted({t for i in c.inputs for t in ids[i.source]})
            for index, tid in enumerate(ids[c.id]):
                streams = {}
                for stream, fields in c.outputs.items():
                    fi = FieldIndex.of(fields)
                    routers = [i.grouping.router(ids[d.id], fi, rng=rng, local_tasks=all_tasks, load=self)
                               for d, i in topo.downstream(c.id) if i.stream == stream]
                    streams[stream] = StreamRoutes(fi, routers)
                outbox = Outbox(c.id, tid, streams, queues, cfg["batch.size"],
                                cfg["batch.flush_interval_ms"] / 1000.0)
                stats = TaskStats(topo.name, c.id, tid, c.kind == "spout",
                                  high_mark=cfg["queue.high_mark"], low_mark=cfg["queue.low_mark"],
                                  hard_bound=cfg["queue.hard_bound"] if c.kind == "bolt" else 0)
                args = (self, c.id, tid, index, c.parallelism, c.instance(), outbox, upstream, stats)
                task: _TaskBase = SpoutTask(*args) if c.kind == "spout" else BoltTask(*args, queue=queues[tid])
                self.tasks.append(task)

    # --- views -----------------------------------------------------------------
    @property
    def stats(self) -> list[TaskStats]:
        return [t.stats for t in self.tasks]

    @property
    def handles(self) -> list[_TaskBase]:
        return list(self.tasks)

    def water_level(self, task_id: int) -> float:
        """LoadView for load-aware grouping: fraction of the hard bound in use."""
        q = self.queues.get(task_id)
        return q.bytes / q.hard_bound if q is not None else 0.0

    # --- control ---------------------------------------------------------------
    def request_stop(self, reason: str = "stopped") -> None:
        if not self.stopping:
            self.stopping = True
            self.stop_reason = reason
            log.info("stopping topology %s: %s", self.topology.name, reason)
        if self._stop_event is not None:
            self._stop_event.set()

    def _quiescent(self) -> bool:
        for t in self.tasks:
            if t.outbox.pending_count:
                return False
            if isinstance(t, BoltTask):
                if t.queue.count or not t.waiting:  # type: ignore[union-attr]
                    return False
            elif t.pending:  # type: ignore[attr-defined]
                return False
        return True

    async def _tick(self) -> None:
        start = time.perf_counter_ns()
        while True:
            await asyncio.sleep(_TICK_S)
            now = time.monotonic()
            wall = time.perf_counter_ns() - start
            for t in self.tasks:
                s = t.stats
                s.observed_rate = t.rate.sample(s.emitted, now)
                s.busy_ns = max(0, wall - s.idle_ns - s.backpressured_ns)
                if t.queue is not None:
                    s.queue_bytes = t.queue.bytes
                    s.queue_tuples = t.queue.count
                if isinstance(t, BoltTask) and t.tick_interval_s and now - t.last_tick >= t.tick_interval_s:
                    t.last_tick = now
                    t.queue.put_marker(TICK)
            if self.acker is not None:
                self.acker.expire(time.perf_counter())  # the acker runs on perf_counter time

    async def run(self, duration: float | None = None, max_tuples: int | None = None,
                  handle_signals: bool = False) -> RunResult:
        with _young_gc_threshold(self.config["gc.young_threshold"]):
            return await self._run(duration, max_tuples, handle_signals)

    async def _run(self, duration: float | None, max_tuples: int | None, handle_signals: bool) -> RunResult:
        loop = asyncio.get_running_loop()
        self.max_tuples = max_tuples
        self._stop_event = asyncio.Event()
        if self.stopping:
            self._stop_event.set()
        for t in self.tasks:
            if isinstance(t, SpoutTask):
                t.spout.open(t.context, t.collector)
            else:
                t.bolt.prepare(t.context, t.collector)  # type: ignore[attr-defined]
        await self.flow.start(self.tasks)
        started_services: list[Service] = []
        for s in self.services:
            await s.start(self)
            started_services.append(s)
        if handle_signals:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, self._on_signal)
        ticker = asyncio.create_task(self._tick(), name="ticker")
        spouts = [asyncio.create_task(t.run(), name=f"{t.component}:{t.task_id}")
                  for t in self.tasks if isinstance(t, SpoutTask)]
        bolts = [asyncio.create_task(t.run(), name=f"{t.component}:{t.task_id}")
                 for t in self.tasks if isinstance(t, BoltTask)]
        timer = loop.call_later(duration, self.request_stop, "duration") if duration else None
        try:
            await self._supervise(spouts, bolts)
        finally:
            if timer:
                timer.cancel()
            if handle_signals:
                for sig in (signal.SIGINT, signal.SIGTERM):
                    loop.remove_signal_handler(sig)
            for task in spouts + bolts + [ticker]:
                task.cancel()
            await asyncio.gather(*spouts, *bolts, ticker, return_exceptions=True)
            for s in reversed(started_services):
                await s.stop()
            await self.flow.stop()
            for t in self.tasks:
                try:
                    if isinstance(t, SpoutTask):
                        t.spout.close()
                    else:
                        t.bolt.cleanup()  # type: ignore[attr-defined]
                except Exception:
                    log.exception("%s (task %d) close/cleanup raised", t.component, t.task_id)
            self.dead_letters.close()
            now = time.monotonic()
            for t in self.tasks:
                t.stats.observed_rate = t.rate.sample(t.stats.emitted, now)
        return RunResult(self.stats, self.stop_reason or "exhausted")

    def _on_signal(self) -> None:
        if self.stopping:
            log.warning("second signal: stopping without drain")
            self.drain_deadline = 0.0
        self.request_stop("signal")

    async def _supervise(self, spouts: list[asyncio.Task], bolts: list[asyncio.Task]) -> None:
        """Wait for the spouts to finish (exhausted or stopped), then drain the bolts."""
        assert self._stop_event is not None
        watch = set(spouts) | set(bolts)
        stop_wait = asyncio.ensure_future(self._stop_event.wait())
        try:
            while any(not t.done() for t in spouts) and not self.stopping:
                done, _ = await asyncio.wait(watch | {stop_wait}, return_when=asyncio.FIRST_COMPLETED)
                for d in done:
                    if d in watch and d.exception() is not None:
                        raise d.exception()  # a programming error in a component (e.g. unencodable tuple)
                watch -= done
        finally:
            stop_wait.cancel()
        # Drain: spouts finish their in-flight trees, bolts empty their queues. A topology
        # whose spouts ended by themselves finishes all its work; a stopped one gets
        # drain_timeout_s before what is left is failed back.
        self.drain_deadline = (time.monotonic() + self.config["drain_timeout_s"]) if self.stopping else float("inf")
        while time.monotonic() < self.drain_deadline:
            for t in spouts + bolts:
                if t.done() and not t.cancelled() and t.exception() is not None:
                    raise t.exception()
            if all(t.done() for t in spouts) and self._quiescent():
                break
            await asyncio.sleep(0.005)
        else:
            if self.acker is not None and len(self.acker):
                n = self.acker.fail_all("drain timeout")
                log.warning("drain timeout: %d tuple trees failed back to their spouts", n)
                for t in self.tasks:
                    if isinstance(t, SpoutTask):
                        t._handle_outcomes()


@contextlib.contextmanager
def _young_gc_threshold(threshold: int) -> Iterator[None]:
    """Raise the young-generation GC threshold for the run, restore it after.

    Every tuple allocates a few container objects, so with Python's default of 700
    allocations between passes a busy topology spends a large share of its time in
    young-generation collections that find nothing (tuples die young by being
    processed, not by becoming garbage cycles). Older generations keep their
    thresholds, so cyclic garbage is still collected.
    """
    if threshold <= 0:
        yield
        return
    old = gc.get_threshold()
    gc.set_threshold(threshold, *old[1:])
    try:
        yield
    finally:
        gc.set_threshold(*old)


def run(topology: Topology, config: dict[str, Any] | None = None, *, duration: float | None = None,
        max_tuples: int | None = None, flow: FlowControl | None = None, services: Sequence[Service] = (),
        handle_signals: bool = False) -> RunResult:
    """Run ``topology`` on uvloop until its spouts end, ``duration`` passes, ``max_tuples``
    spout tuples were emitted, or SIGINT/SIGTERM (with ``handle_signals``)."""
    import uvloop

    engine = LocalEngine(topology, config, flow=flow, services=services)
    return uvloop.run(engine.run(duration, max_tuples, handle_signals))
