"""A topology in several worker processes on this machine (``workers: N``).

The supervisor (the process that called ``run``) starts N worker processes, each a
``LocalEngine`` over its share of the tasks (``placement.place``), joined by Unix
domain sockets (``transport``). It then watches them:

* **When is the run over?** No worker can tell alone: a worker whose spouts ended and
  whose queues are empty may still be sent a batch by another. Every 20 ms the
  supervisor asks each worker for its report (spouts done, locally quiescent, work
  frames sent and received); when every worker's spouts are done and it is quiescent,
  and the frames sent equal the frames received across all workers, twice in a row
  with the same totals, nothing is in flight anywhere and it tells every worker to
  finish. This is the drain of a single process, made global.
* **Stop**: SIGINT/SIGTERM (or ``duration``) makes the supervisor tell every worker
  to stop its spouts; the same global drain follows, for at most ``drain_timeout_s``,
  after which the workers are told to finish anyway and fail back what is left
  (with acking on, to their spouts). A second signal finishes at once. Workers
  ignore SIGINT themselves (a terminal sends it to the whole process group).
* **A worker that dies** (``kill -9``) is started again with the same tasks. Batches
  it had not processed are gone; with acking on, their spout tuples time out at
  their owners and are replayed, so nothing is lost; a spout that lived in the dead
  worker starts again from its source's beginning (at-least-once).
* **Checkpoints** (``checkpoint.interval_ms``): the supervisor takes them, one global
  drained cut each (``_checkpoint``: pause every worker's spouts, wait for the same
  drain as the end of a run, take every worker's snapshot, resume them all, write the
  checkpoint itself: one writer, one row), and tells every worker it is complete (sinks commit). A worker
  that dies, or a tuple that fails (``Rollback`` in its worker), rolls *every* worker
  back to the last checkpoint: all are started again and each restores its tasks from
  it, so results stay exact (``checkpoint.max_rollbacks`` in a row, then one line).

Flow control across workers: stepwise signals need a coordinator every worker sees.
With ``coordinator: zookeeper://...`` that is ZooKeeper; with the embedded default the
supervisor serves one embedded tree on a Unix socket in its temporary directory
(``backpressure.coordinator.served``, started through ``drivers.factory.serve_coordinator``)
and each worker's config carries the socket's path under the private key
``factory.SERVED_SOCKET``, so ``make_coordinator`` gives the worker a session on it. A
worker's session ends with its connection, so a killed worker's task states and claims
vanish as they would from ZooKeeper. ``source_stop`` and ``watermark`` cross workers the
same way: each worker's config also carries the topology's graph under
``factory.WORKER_GRAPH`` (no worker sees every component), and their drivers share task
states through the coordinator (``backpressure.drivers.shared_states``).

The console and the status file (``topo status``) of a run in workers: the supervisor
runs those services itself, in a thread with its own event loop, over a ``WorkersView``
of every task of every worker. While a service runs, the supervisor's report request
asks for the tasks' snapshots too (every ``records_every`` seconds); the final frame is
made from the workers' final stats. Each record carries its ``worker``.

Metrics: with ``metrics.port`` set, worker ``i`` serves its own exporter on
``metrics.port + i`` (``metrics.host``), every series labelled ``worker="<i>"``.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import multiprocessing as mp
import pickle
import signal
import tempfile
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Sequence

import msgpack
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from topo.config import ResolvedConfig, resolve
from backpressure.drivers.factory import WORKER_GRAPH, serve_coordinator
from topo.topology import Topology, TopologyError
from topo.api import CheckpointError
from runtime.local.checkpoint_store import CheckpointStore
# (the checkpointer and Rollback are the engine's: reached through its module)
from runtime.local.engine import (BoltTask, Checkpointer, LocalEngine, Rollback, RunResult, end_of_input_order,
                                   keyed_inputs, scalable_components, topology_fingerprint)
from runtime.local.placement import Layout
from runtime.local.rescaling import Rescale, Rescaler
from runtime.local.transport import WorkerNetwork
from runtime.observe.prometheus import CollectorRegistry, MetricsService
from runtime.observe.stats import TaskStats

log = logging.getLogger("topo.workers")

_POLL_S = 0.02
# Once every spout is done the run is in its end phase: a bounded run ends after two equal
# waves of reports per end-of-input round, so each poll there is time the whole command waits
# (about 0.1 s of a 1 s two-worker run at ``_POLL_S``). A report is a counter read in each
# worker, so polling often is cheap; the waves' totals, not their spacing, make the end exact.
_END_PHASE_POLL_S = 0.002
_REPLY_TIMEOUT_S = 5.0


def check_shippable(topology: Topology, config: dict[str, Any]) -> None:
    """What cannot run in worker processes, as one line."""
    if config.get("backpressure.policy") == "adaptive":
        scalable_components(topology, config, across_workers=True)   # autoscale: true and a bolt it cannot keep exact
    port, workers = int(config.get("metrics.port") or 0), int(config.get("workers") or 1)
    if port and port + workers - 1 > 65535:
        raise TopologyError(f"metrics.port {port}: worker i serves its metrics on metrics.port + i, and "
                            f"{port} + {workers - 1} is over 65535")
    if config.get("checkpoint.interval_ms") is not None:
        for c in topology.components.values():
            if c.kind == "spout" and not type(c.instance()).has_state():
                raise TopologyError(f"checkpoint.interval_ms is set but spout {c.id!r} keeps no offsets to resume "
                                    f"from: it must implement snapshot_state/restore_state (the spouts of "
                                    f"topo.sources do)")
    try:
        pickle.dumps(topology)
    except Exception as e:
        raise TopologyError(f"topology {topology.name!r} cannot be shipped to a worker process ({e}); define its "
                            f"components in an importable module, not in a notebook or a function") from None


# Not a component: the entry of a checkpoint that keeps the tasks its states belong to.
LAYOUT_STATE = "topo:layout"


def _layout_of(checkpoint: Any) -> Layout | None:
    """The layout a checkpoint of worker processes was taken with (None: none kept)."""
    if checkpoint is None or LAYOUT_STATE not in checkpoint.states:
        return None
    return Layout.from_record(msgpack.unpackb(checkpoint.states[LAYOUT_STATE][0], raw=False, strict_map_key=False))


def topology_graph(topology: Topology) -> dict[str, tuple[bool, list[int], list[str]]]:
    """component -> (is a spout, its task ids, the components it reads): what a policy that
    decides over the whole topology needs and no worker's own tasks show. Task ids are
    numbered from 1 in component order, as the engine numbers them."""
    graph: dict[str, tuple[bool, list[int], list[str]]] = {}
    next_id = 1
    for c in topology.components.values():
        graph[c.id] = (c.kind == "spout", list(range(next_id, next_id + c.parallelism)),
                       sorted({i.source for i in c.inputs}))
        next_id += c.parallelism
    return graph


def fingerprint_of(topology: Topology) -> dict[str, Any]:
    """The whole topology's checkpoint fingerprint (no worker has an instance of every component)."""
    return topology_fingerprint([(c.id, c.kind, c.instance(), c.parallelism) for c in topology.components.values()])


class WorkerEngine(LocalEngine):
    """One worker's engine. With checkpoints on its checkpointer is driven: the supervisor
    takes every checkpoint as one global cut and writes it; this engine restores its own
    tasks from it at start and rolls back (``Rollback``) when a tuple fails.

    Autoscaling (``seams.Scaler``): the adaptive driver's requests go to the supervisor,
    which carries them out on every worker (``runtime.local.rescaling``); ``add_task``
    returns the new task's handle when it runs here, its id when it runs elsewhere."""

    supervisor: Any = None             # the pipe to the supervisor (set by ``_worker``)
    _requests: dict[int, "asyncio.Future[int | None]"]
    _request_ids = itertools.count(1)

    async def add_task(self, component: str) -> BoltTask | int | None:  # type: ignore[override]
        tid = await self._ask_supervisor("add", component, self.task_count(component) + 1)
        if tid is None:
            return None
        return next((b for b in self.bolt_tasks if b.task_id == tid), tid)

    async def remove_task(self, component: str) -> int | None:
        return await self._ask_supervisor("remove", component, self.task_count(component) - 1)

    async def _ask_supervisor(self, kind: str, component: str, tasks_after: int) -> int | None:
        """One request to the supervisor; None when it declines (another worker's request for
        the same change came first, a bound, the run is stopping) or does not answer."""
        if self.supervisor is None or component not in self.scalable or self.stopping:
            return None
        if not hasattr(self, "_requests"):
            self._requests = {}
        rid = next(self._request_ids)
        fut: asyncio.Future[int | None] = asyncio.get_running_loop().create_future()
        self._requests[rid] = fut
        try:
            self.supervisor.send(("scale", rid, kind, component, tasks_after))
            return await asyncio.wait_for(fut, 2 * self.config["drain_timeout_s"] + 30)
        except (asyncio.TimeoutError, OSError):
            return None
        finally:
            self._requests.pop(rid, None)

    def answered(self, rid: int, task: int | None) -> None:
        fut = getattr(self, "_requests", {}).get(rid)
        if fut is not None and not fut.done():
            fut.set_result(task)

    def rescale_step(self, cmd: tuple[Any, ...]) -> tuple[str, Any]:
        """One step of a rescale the supervisor runs (``rescaling``, all but ``rs_retire``):
        the reply to send, ``(step, value)``; a step that returns nothing answers True."""
        op, args = cmd[0], cmd[1:]
        steps: dict[str, Any] = {
            "rs_open": lambda c, t: self.open_task(c, t) is not None, "rs_fence": self.fence,
            "rs_still": self.keyed_still, "rs_take": self.take_keys_for, "rs_give": self.give_keys_to,
            "rs_apply": self.apply_tasks, "rs_unfence": self.unfence, "rs_drained": self.task_drained,
            "rs_forget": self.forget_task, "rs_resume": self._resume}
        if op not in steps:
            raise ValueError(f"unknown rescale step {op!r}")
        value = steps[op](*args)
        return op, (True if value is None and op not in ("rs_still", "rs_drained") else value)

    def _make_checkpointer(self) -> Checkpointer | None:
        cfg = self.config
        if cfg["checkpoint.interval_ms"] is None:
            return None
        self.run_state.rollback_on_failure = True
        store = CheckpointStore(cfg["checkpoint.dir"], self.topology.name, cfg["checkpoint.keep"])
        return Checkpointer(store, fingerprint_of(self.topology), self.run_state, self.spout_tasks,
                            self.bolt_tasks, self._quiescent, interval_s=None, timeout_s=cfg["checkpoint.timeout_s"])


# -- the worker side -----------------------------------------------------------------------

class _WorkerLabel(Collector):
    """Another collector's families, every sample labelled ``worker``."""

    def __init__(self, inner: Collector, worker: int) -> None:
        self.inner, self.worker = inner, str(worker)

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Any:
        for family in self.inner.collect():
            family.samples = [s._replace(labels={**s.labels, "worker": self.worker}) for s in family.samples]
            yield family


class WorkerMetrics(MetricsService):
    """Worker ``i``'s exporter: ``metrics.port + i``, its series labelled ``worker="<i>"``."""

    worker = 0

    @classmethod
    def for_worker(cls, config: Any, worker: int) -> "WorkerMetrics | None":
        port = int(config.get("metrics.port") or 0)
        if port == 0:
            return None
        service = cls(port=port + worker, host=str(config.get("metrics.host") or "127.0.0.1"))
        service.worker = worker
        return service

    async def start(self, engine: Any) -> None:
        await super().start(engine)
        assert self.server is not None and self.collector is not None
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_WorkerLabel(self.collector, self.worker))
        self.server.registry = registry


def _worker_main(topology: Topology, config: dict[str, Any], worker: int, layout: Layout, directory: str,
                 conn: Any, close: Sequence[Any] = ()) -> None:
    """Entry point of one worker process. ``close``: a forked worker's copies of the
    supervisor's ends of the pipes (its own included: it must see EOF when the supervisor dies)."""
    import uvloop

    for c in close:
        c.close()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)     # (a forked worker has the supervisor's handler)
    logging.basicConfig(level=logging.WARNING, format=f"worker {worker}: %(levelname)s %(name)s: %(message)s",
                        force=True)
    uvloop.run(_worker(topology, ResolvedConfig(config), worker, layout, directory, conn))


async def _worker(topology: Topology, config: ResolvedConfig, worker: int, layout: Layout, directory: str,
                  conn: Any) -> None:
    placement = layout.placement(worker)
    streams = {c.id: dict(c.outputs) for c in topology.components.values()}
    network = WorkerNetwork(directory, worker, placement.owner, layout.workers, streams)
    exporter = WorkerMetrics.for_worker(config, worker)
    engine = WorkerEngine(topology, config, network=network, services=[exporter] if exporter else [],
                          layout=layout)
    engine.supervisor = conn
    checkpointer = engine.checkpointer
    loop = asyncio.get_running_loop()

    def on_command() -> None:
        try:
            cmd = conn.recv()
        except (EOFError, OSError):
            engine.request_stop("supervisor gone")
            if network.finish is not None:
                network.drained = False
                network.finish.set()
            return
        if cmd[0] == "report":
            report = engine.report()
            report["holding"] = checkpointer.holding() if checkpointer is not None else True
            if len(cmd) > 1 and cmd[1]:        # for the console and the status file
                report["records"] = [s.snapshot() for s in engine.stats]
            conn.send(report)
        elif checkpointer is not None and cmd[0] in ("pause", "resume", "snapshot", "complete"):
            if cmd[0] == "pause":
                checkpointer.pause()
            elif cmd[0] == "resume":
                checkpointer.resume()
            elif cmd[0] == "snapshot":            # drained: this instant is the cut (the spouts
                conn.send(("states", checkpointer.snapshot()))   # hold until every worker took it)
            else:
                checkpointer.complete(cmd[1])
        elif cmd[0] == "end":                     # a bounded run's end-of-input round
            engine.end_component(cmd[1])
        elif cmd[0] == "scaled":                  # the supervisor's answer to this worker's request
            engine.answered(cmd[1], cmd[2])
        elif cmd[0] == "rs_retire":               # a rescale's last step: the task stops, then reply
            task = loop.create_task(engine.retire_task(cmd[1]))
            task.add_done_callback(lambda t: conn.send(("rs_retire", not t.cancelled() and t.exception() is None)))
        elif cmd[0].startswith("rs_"):            # a rescale's other steps: one turn of this loop each
            conn.send(engine.rescale_step(cmd))
        elif cmd[0] == "stop":
            engine.request_stop(cmd[1])
        elif cmd[0] == "finish":
            network.drained = cmd[1]
            if network.finish is not None:
                network.finish.set()

    loop.add_reader(conn.fileno(), on_command)
    try:
        result = await engine.run()
        conn.send(("result", result.reason, result.stats))
    except Rollback as e:            # the whole topology goes back to its last checkpoint
        conn.send(("rollback", str(e)))
    except BaseException as e:       # the supervisor prints it and stops the others
        conn.send(("error", f"{type(e).__name__}: {e}"))
        raise
    finally:
        loop.remove_reader(conn.fileno())


# -- the supervisor side -------------------------------------------------------------------

def poll_interval(reports: list[dict[str, Any]], workers: int) -> float:
    """Seconds until the supervisor's next wave of reports: short once every worker answered
    that its spouts are done (the end phase, where every poll is time the run waits)."""
    if len(reports) == workers and all(r["spouts_done"] for r in reports):
        return _END_PHASE_POLL_S
    return _POLL_S


@dataclass
class _Worker:
    index: int
    process: Any
    conn: Any
    restarts: int = 0
    result: tuple[str, list[TaskStats]] | None = None
    error: str | None = None
    rollback: str | None = None        # why this worker asks the topology to roll back


@dataclass
class Supervisor:
    topology: Topology
    config: ResolvedConfig
    workers: int
    directory: str = ""
    procs: list[_Worker] = field(default_factory=list)
    stopping: str = ""
    finish_now: bool = False
    coordinator: Any = None            # the embedded coordinator this supervisor serves, if any
    worker_config: dict[str, Any] = field(default_factory=dict)
    # Every task of every worker as last reported (worker -> snapshots), for ``WorkersView``;
    # asked for every ``records_every`` seconds while ``want_records`` (a service reads them).
    records: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    want_records: bool = False
    records_every: float = 0.1
    # Checkpoints (``checkpoint.interval_ms``): the supervisor takes them (one writer) and
    # rolls every worker back to the last one when a worker dies or a tuple fails.
    store: CheckpointStore | None = None
    last_checkpoint: int = 0
    rollbacks: int = 0                 # in a row, without a checkpoint between
    signals: int = 0                   # SIGINT/SIGTERM received (``signalled``) ...
    signals_seen: int = 0              # ... and acted on by the supervisor's loop
    # Autoscaling: every task as it stands (a restarted worker is built from it), the scale
    # requests waiting (from the workers' adaptive drivers, or ``request_scale``), what was done.
    layout: Layout | None = None
    requests: deque[tuple[int | None, int, str, str, int | None]] = field(default_factory=deque)
    rescales: list[Rescale] = field(default_factory=list)
    on_phase: Any = None               # (phase, component) at each step of a rescale: for tests

    def request_scale(self, component: str, kind: str) -> None:
        """Add (``kind="add"``) or remove a task of ``component`` (any thread): done by the
        supervisor's loop; the outcome is appended to ``rescales``."""
        self.requests.append((None, 0, kind, component, None))

    def start(self) -> None:
        ctx = mp.get_context("spawn")
        self._ctx = ctx
        self.layout = Layout.initial(self.topology, self.workers)
        self._scalable = (scalable_components(self.topology, self.config, across_workers=True)
                          if self.config["backpressure.policy"] == "adaptive" else frozenset())
        self.coordinator, extra = serve_coordinator(self.config, self.directory)
        self.worker_config = {**self.config, **extra, WORKER_GRAPH: topology_graph(self.topology)}
        if self.config["checkpoint.interval_ms"] is not None:
            cfg = self.config
            self.store = CheckpointStore(cfg["checkpoint.dir"], self.topology.name, cfg["checkpoint.keep"])
            self._fingerprint = fingerprint_of(self.topology)
            if not cfg["checkpoint.restore"]:
                self.store.discard()            # once, here: every worker restores what is left
            latest = self.store.latest()
            self.last_checkpoint = latest.id if latest is not None else 0
            self.worker_config["checkpoint.restore"] = True
            self.layout = _layout_of(latest) or self.layout     # the tasks its states belong to
        for i in range(self.workers):
            self.procs.append(self._spawn(i))

    def _forkable(self) -> bool:
        """Whether a worker may be forked, not spawned: a forked worker starts in milliseconds
        with every module imported (a spawned one imports them all again, a third of a second
        of a short run), and forking is safe only from a process with one thread and nothing a
        child must not share (a served coordinator, an open checkpoint store)."""
        return ("fork" in mp.get_all_start_methods() and threading.active_count() == 1
                and self.coordinator is None and self.store is None)

    def _spawn(self, i: int, restarts: int = 0) -> _Worker:
        parent, child = self._ctx.Pipe()
        assert self.layout is not None
        ctx, close = ((mp.get_context("fork"), (parent, *(w.conn for w in self.procs))) if self._forkable()
                      else (self._ctx, ()))
        p = ctx.Process(target=_worker_main, name=f"topo-worker-{i}",
                        args=(self.topology, self.worker_config, i, self.layout, self.directory, child, close),
                        daemon=True)
        p.start()
        child.close()
        return _Worker(i, p, parent, restarts)

    def _ask(self, w: _Worker, records: bool = False) -> dict[str, Any] | None:
        """One report (with its tasks' snapshots if ``records``), or None if the worker is gone
        or has already sent its result."""
        try:
            w.conn.send(("report", records))
            deadline = time.monotonic() + _REPLY_TIMEOUT_S
            while time.monotonic() < deadline:
                if w.conn.poll(0.05):
                    msg = w.conn.recv()
                    if isinstance(msg, dict):
                        if "records" in msg:
                            self.records[w.index] = [{**r, "worker": w.index} for r in msg.pop("records")]
                        return msg
                    if self._scale_request(w, msg):
                        continue
                    self._final(w, msg)
                    return None
                if not w.process.is_alive():
                    return None
        except (EOFError, OSError, BrokenPipeError):
            return None
        return None

    def _scale_request(self, w: _Worker, msg: Any) -> bool:
        """A worker's adaptive driver asks for a rescale: queued for the loop (True), or not one."""
        if isinstance(msg, tuple) and msg and msg[0] == "scale":
            _, rid, kind, component, tasks_after = msg
            self.requests.append((w.index, rid, kind, component, tasks_after))
            return True
        return False

    def _serve_requests(self) -> None:
        """Carry out the queued rescales, one at a time (``rescaling.Rescaler``)."""
        while self.requests:
            worker, rid, kind, component, tasks_after = self.requests.popleft()
            if kind == "stop":                       # (``stop_soon``)
                self.request_stop(component)
                continue
            outcome = self._rescale(kind, component, tasks_after)
            if outcome is not None:
                outcome.asked_by = worker
                self.rescales.append(outcome)
            if worker is not None:
                task = outcome.task if outcome is not None else None
                try:
                    self.procs[worker].conn.send(("scaled", rid, task))
                except (OSError, BrokenPipeError):
                    pass

    def _rescale(self, kind: str, component: str, tasks_after: int | None) -> Rescale | None:
        assert self.layout is not None
        now = len(self.layout.task_ids.get(component, ()))
        top = self.config["backpressure.adaptive.max_parallelism"]
        if (self.stopping or component not in self._scalable
                or (tasks_after is not None and tasks_after != now + (1 if kind == "add" else -1))):
            return None       # not scalable, or another worker's request for this change came first
        if kind == "add" and now >= top:
            return Rescale(kind, component, None, now, why=f"backpressure.adaptive.max_parallelism {top}")
        rescaler = Rescaler(self.layout, lambda c: bool(keyed_inputs(self.topology, c)), self._send_to,
                            self._reply_from, self.config["drain_timeout_s"], on_phase=self.on_phase)
        outcome = rescaler.add(component) if kind == "add" else rescaler.remove(component)
        log.info("autoscaling: %s %r -> %s", kind, component, outcome)
        return outcome

    def _send_to(self, worker: int, cmd: tuple[Any, ...]) -> bool:
        w = self.procs[worker]
        if not w.process.is_alive():
            return False
        try:
            w.conn.send(cmd)
            return True
        except (OSError, BrokenPipeError):
            return False

    def _reply_from(self, worker: int, kind: str) -> Any:
        return self._await(self.procs[worker], kind)

    def _decline_requests(self) -> None:
        while self.requests:
            worker, rid, kind, *_ = self.requests.popleft()
            if kind == "stop":
                continue
            if worker is not None:
                try:
                    self.procs[worker].conn.send(("scaled", rid, None))
                except (OSError, BrokenPipeError):
                    pass

    def _final(self, w: _Worker, msg: Any) -> None:
        if msg[0] == "result":
            w.result = (msg[1], msg[2])
        elif msg[0] == "error":
            w.error = msg[1]
        elif msg[0] == "rollback":
            w.rollback = msg[1]

    def _tell(self, *cmd: Any) -> None:
        for w in self.procs:
            try:
                w.conn.send(cmd)
            except (OSError, BrokenPipeError):
                pass

    def signalled(self) -> None:
        """What SIGINT/SIGTERM do: only count the signal. A handler runs between any two
        bytecodes of the main thread, possibly halfway through writing a frame to a
        worker's pipe, so the loop of ``supervise`` acts on it, not the handler."""
        self.signals += 1

    def stop_soon(self, reason: str) -> None:
        """``request_stop`` from another thread: the loop acts on it (one writer per pipe)."""
        self.requests.append((None, 0, "stop", reason, None))

    def _act_on_signals(self) -> None:
        while self.signals_seen < self.signals:
            self.signals_seen += 1
            self.request_stop("signal")
        if self.requests and self.requests[0][2] == "stop":
            self.request_stop(self.requests.popleft()[3])

    def request_stop(self, reason: str) -> None:
        if self.stopping:
            self.finish_now = True        # a second signal: no drain
            return
        self.stopping = reason
        self._tell("stop", reason)

    def supervise(self, duration: float | None) -> RunResult:
        started = time.monotonic()
        drain_deadline: float | None = None
        previous: tuple[int, int] | None = None
        ending = end_of_input_order(self.topology)    # as one process ends a bounded run
        next_records = 0.0
        interval = self.config["checkpoint.interval_ms"]
        next_checkpoint = time.monotonic() + interval / 1000.0 if self.store is not None else float("inf")
        pause = _POLL_S
        while True:
            time.sleep(pause)
            pause = _POLL_S
            self._act_on_signals()
            if not self.stopping and time.monotonic() >= next_checkpoint:
                self._checkpoint()
                next_checkpoint = time.monotonic() + interval / 1000.0
            records = self.want_records and time.monotonic() >= next_records
            if records:
                next_records = time.monotonic() + self.records_every
            if duration is not None and not self.stopping and time.monotonic() - started >= duration:
                self.request_stop("duration")
            if self.stopping and drain_deadline is None:
                drain_deadline = time.monotonic() + self.config["drain_timeout_s"]
            errors = [w.error for w in self.procs if w.error]
            if errors:
                self._finish(False)
                raise RuntimeError(f"worker failed: {errors[0]}")
            reports = []
            rollback = ""
            for w in self.procs:
                if not w.process.is_alive() and w.result is None:
                    self._drain_pipe(w)
                    if w.error:
                        break
                    if w.rollback or (w.result is None and self.store is not None):
                        rollback = w.rollback or f"worker {w.index} exited (code {w.process.exitcode})"
                    elif w.result is None:
                        self._restart(w)
                    continue
                r = self._ask(w, records)
                if r is not None:
                    reports.append(r)
                rollback = rollback or w.rollback or ""
            if rollback:
                self._roll_back(rollback)
                previous = None
                continue
            if self.requests:
                if self.stopping:
                    self._decline_requests()
                elif len(reports) == len(self.procs):    # every worker up: rescale now
                    self._serve_requests()
                    previous = None
                    continue
            if self.finish_now or (drain_deadline is not None and time.monotonic() >= drain_deadline):
                return self._finish(False)
            pause = poll_interval(reports, len(self.procs))
            if len(reports) == len(self.procs) and all(r["spouts_done"] and r["quiescent"] for r in reports):
                totals = (sum(r["sent"] for r in reports), sum(r["received"] for r in reports))
                # A restarted worker's counters started over, so after a restart the sums
                # cannot match; quiescence that holds with unchanged totals must do.
                balanced = totals[0] == totals[1] or any(w.restarts for w in self.procs)
                if balanced and totals == previous:
                    if not self.stopping and ending:     # bounded input: end the next component
                        self._tell("end", ending.pop(0))
                        previous = None
                        continue
                    if self.store is not None and not self._checkpoint():   # the last one seals the output
                        previous = None
                        continue
                    return self._finish(True)
                previous = totals
            else:
                previous = None

    # -- checkpoints across workers ----------------------------------------------------------

    def _checkpoint(self) -> bool:
        """One global drained cut: pause every spout, wait until nothing is in flight anywhere,
        take every worker's snapshot, resume them all, write the checkpoint, tell them all.
        False when it was abandoned (a worker gone, ``checkpoint.timeout_s``, a second signal)."""
        assert self.store is not None
        self._tell("pause")
        deadline = time.monotonic() + self.config["checkpoint.timeout_s"]
        previous: tuple[int, int] | None = None
        while True:
            time.sleep(_POLL_S)
            self._act_on_signals()
            reports = [self._ask(w) for w in self.procs]
            if any(r is None for r in reports) or self.finish_now:
                self._tell("resume")
                return False                 # the watch loop sees what happened to the worker
            if all(r["holding"] and r["quiescent"] for r in reports):  # type: ignore[index]
                totals = (sum(r["sent"] for r in reports), sum(r["received"] for r in reports))  # type: ignore[index]
                if totals[0] == totals[1] and totals == previous:
                    break
                previous = totals
            else:
                previous = None
            if time.monotonic() >= deadline:
                self._tell("resume")
                log.warning("checkpoint abandoned: the workers did not drain within %.1f s (checkpoint.timeout_s)",
                            self.config["checkpoint.timeout_s"])
                return False
        # No worker resumes before every worker took its snapshot: a spout that went on at
        # once would feed another worker's bolts before that worker's snapshot, and the
        # restored state would count those tuples while the spout's offset does not.
        self._tell("snapshot")
        assert self.layout is not None
        states: dict[str, dict[int, bytes]] = {LAYOUT_STATE: {0: msgpack.packb(self.layout.to_record())}}
        for w in self.procs:
            reply = self._await(w, "states")
            if reply is None:
                self._tell("resume")
                return False
            for component, tasks in reply[1].items():
                states.setdefault(component, {}).update(tasks)
        self._tell("resume")
        cid = self.store.next_id(self.last_checkpoint)
        self.store.save(cid, self._fingerprint, states)
        self.last_checkpoint, self.rollbacks = cid, 0
        self._tell("complete", cid)
        return True

    def _await(self, w: _Worker, kind: str) -> Any:
        """The worker's next message of ``kind`` (reports in between are dropped), or None."""
        deadline = time.monotonic() + 30
        try:
            while time.monotonic() < deadline:
                if w.conn.poll(0.05):
                    msg = w.conn.recv()
                    if isinstance(msg, tuple) and msg and msg[0] == kind:
                        return msg
                    if self._scale_request(w, msg):
                        continue
                    if not isinstance(msg, dict):
                        self._final(w, msg)
                        return None
                elif not w.process.is_alive():
                    return None
        except (EOFError, OSError):
            return None
        return None

    def _roll_back(self, why: str) -> None:
        """Every worker starts again from the last checkpoint: spouts from its offsets, bolts
        from its state, sinks skipping what it already committed."""
        self.rollbacks += 1
        if self.rollbacks > self.config["checkpoint.max_rollbacks"]:
            self._finish(False)
            raise CheckpointError(f"{why}; gave up after {self.rollbacks - 1} rollbacks to the last checkpoint in a "
                                  f"row (checkpoint.max_rollbacks)")
        self.worker_config["message_timeout_s"] = self.worker_config["message_timeout_s"] * 2
        assert self.store is not None     # the tasks as they were at that checkpoint (autoscaling)
        self.layout = _layout_of(self.store.latest()) or Layout.initial(self.topology, self.workers)
        log.warning("%s: every worker rolls back to checkpoint %d (message_timeout_s now %g s)", why,
                    self.last_checkpoint, self.worker_config["message_timeout_s"])
        for w in self.procs:
            if w.process.is_alive():
                w.process.kill()
            w.process.join(10)
            w.conn.close()
        self.procs = [self._spawn(w.index, w.restarts) for w in self.procs]
        if self.stopping:
            self._tell("stop", self.stopping)

    def _drain_pipe(self, w: _Worker) -> None:
        try:
            while w.conn.poll(0):
                msg = w.conn.recv()
                if not isinstance(msg, dict):
                    self._final(w, msg)
        except (EOFError, OSError):
            pass

    def _restart(self, w: _Worker) -> None:
        log.warning("worker %d exited (code %s): starting it again", w.index, w.process.exitcode)
        fresh = self._spawn(w.index, w.restarts + 1)
        self.procs[w.index] = fresh
        if self.stopping:
            fresh.conn.send(("stop", self.stopping))

    def _finish(self, drained: bool) -> RunResult:
        self._tell("finish", drained)
        stats: list[TaskStats] = []
        reason = self.stopping or "exhausted"
        for w in self.procs:
            deadline = time.monotonic() + 30
            while w.result is None and w.error is None and time.monotonic() < deadline:
                if w.conn.poll(0.05):
                    try:
                        msg = w.conn.recv()
                    except (EOFError, OSError):
                        break
                    if not isinstance(msg, dict):
                        self._final(w, msg)
                elif not w.process.is_alive():
                    break
            w.process.join(10)
            if w.process.is_alive():
                w.process.kill()
            if w.result is not None:
                stats.extend(w.result[1])
                self.records[w.index] = [{**s.snapshot(), "worker": w.index} for s in w.result[1]]
        return RunResult(sorted(stats, key=lambda s: s.task_id), reason)

    def stop_all(self) -> None:
        for w in self.procs:
            if w.process.is_alive():
                w.process.kill()
                w.process.join(5)
        coordinator, self.coordinator = self.coordinator, None
        if coordinator is not None:
            coordinator.stop()
        if self.store is not None:
            self.store.close()


class _Reported:
    """One task's stats as its worker last reported them: what a service reads (``snapshot``)."""

    __slots__ = ("record",)

    def __init__(self, record: dict[str, Any]) -> None:
        self.record = record

    def snapshot(self) -> dict[str, Any]:
        return self.record


class WorkersView:
    """What the console and the status file see of a run in workers, as they see an engine:
    ``topology``, ``config`` and ``stats``: every task of every worker, by task id."""

    def __init__(self, supervisor: Supervisor) -> None:
        self.supervisor = supervisor
        self.topology = supervisor.topology
        self.config = supervisor.config

    @property
    def stats(self) -> list[_Reported]:
        records = [r for rs in list(self.supervisor.records.values()) for r in rs]
        return [_Reported(r) for r in sorted(records, key=lambda r: r["task"])]


class ServiceThread:
    """The supervisor's services (console, status file) on an event loop of their own: the
    supervisor's loop is a blocking one."""

    def __init__(self, services: list[Any], view: WorkersView) -> None:
        self.services, self.view = services, view
        self._loop: asyncio.AbstractEventLoop | None = None
        self._done: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), name="topo-services", daemon=True)

    def start(self) -> None:
        """Start every service; a service that cannot start raises here."""
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            self._thread.join()
            raise self._error

    async def _main(self) -> None:
        self._loop, self._done = asyncio.get_running_loop(), asyncio.Event()
        started: list[Any] = []
        try:
            for s in self.services:
                await s.start(self.view)
                started.append(s)
        except BaseException as e:
            self._error = e
        self._ready.set()
        if self._error is None:
            await self._done.wait()
        for s in reversed(started):
            await s.stop()

    def stop(self) -> None:
        """Stop every service (each writes its last frame from the final records)."""
        if self._thread.ident is None:       # never started
            return
        if self._loop is not None and self._done is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._done.set)
        self._thread.join(30)


def run_workers(topology: Topology, config: dict[str, Any] | None = None, *, workers: int,
                duration: float | None = None, handle_signals: bool = False,
                services: Sequence[Any] = ()) -> RunResult:
    """Run ``topology`` in ``workers`` processes; returns the merged result of all tasks.
    ``services`` (console, status file) run in the supervisor over a ``WorkersView``."""
    cfg = config if isinstance(config, ResolvedConfig) else resolve(topology.config, config or {})
    check_shippable(topology, cfg)
    with tempfile.TemporaryDirectory(prefix="topo-workers-") as directory:
        sup = Supervisor(topology, cfg, workers, directory, want_records=bool(services))
        previous = {}
        if handle_signals:
            for sig in (signal.SIGINT, signal.SIGTERM):
                previous[sig] = signal.signal(sig, lambda *_: sup.signalled())
        beside = ServiceThread(list(services), WorkersView(sup)) if services else None
        try:
            sup.start()
            if beside is not None:
                beside.start()
            return sup.supervise(duration)
        finally:
            sup.stop_all()
            if beside is not None:
                beside.stop()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
