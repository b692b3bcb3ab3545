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
import functools
import gc
import logging
import random
import signal
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Protocol, Sequence

import msgpack

from topo.api import Bolt, CheckpointError, ComponentError, FieldIndex, Spout, TaskContext
from topo.config import ConfigError, ResolvedConfig, resolve
from topo.groupings import (FieldsGrouping, LoadAwareGrouping, LocalOrShuffleGrouping, Router, ShuffleGrouping,
                             key_group, spread_key_groups)
from topo.state import KeyedBolt, hashable_key
from topo.topology import Topology
from backpressure.seams import FlowControl
from runtime.local.acker import Acker
from runtime.local.deadletter import DeadLetterWriter
from runtime.local.outbox import Outbox, StreamRoutes
from runtime.local.placement import Layout
from runtime.local.queue import ByteQueue
from runtime.local.send_windows import SendWindows
from runtime.local.fence import HeldQueue
from runtime.local.checkpoint_store import CheckpointStore
from runtime.local.checkpoints import Checkpointer, topology_fingerprint
from runtime.local.tasks import END_MARKER, TICK_MARKER, BoltTask, Rollback, RunState, SpoutTask, TaskWiring
from runtime.local.transport import WorkerNetwork
from runtime.observe.stats import TaskStats

log = logging.getLogger("topo.engine")

_SAMPLE_PERIOD_S = 0.25   # emit rates, time split, queue gauges, tick markers, acker timeouts
# Groupings under which a tuple may go to any task of the component (send windows move it).
_MOVABLE = (ShuffleGrouping, LocalOrShuffleGrouping, LoadAwareGrouping)


class Service(Protocol):
    """Something that runs beside a topology: exporter, console, status writer."""

    async def start(self, engine: "LocalEngine") -> None: ...

    async def stop(self) -> None: ...


@dataclass(repr=False)
class RunResult:
    stats: list[TaskStats]
    reason: str  # "exhausted" | "duration" | "max_tuples" | "signal" | "stopped"

    def __repr__(self) -> str:
        """One line per component: what a user wants to see after ``print(run(...))``."""
        lines = [f"RunResult({self.reason}):"]
        for comp, t in self.component_totals().items():
            parts = [f"emitted={t['emitted']}"] + [f"{k}={v}" for k, v in t.items() if k != "emitted" and v]
            lines.append(f"  {comp}: " + " ".join(parts))
        return "\n".join(lines)

    def component_totals(self) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for s in self.stats:
            t = out.setdefault(s.component, {"emitted": 0, "executed": 0, "acked": 0, "failed": 0,
                                             "replayed": 0, "dead_lettered": 0})
            for k in t:
                t[k] += getattr(s, k)
        return out


def end_of_input_order(topology: Topology, has_hook: Callable[[str], bool] | None = None) -> list[str]:
    """The bolts with an ``end_of_input`` hook, sources before their subscribers: the
    order in which a bounded run ends them, each once everything before it is processed.
    ``has_hook(component)`` answers from instances at hand; without it one instance of
    each bolt is made to ask (the supervisor of worker processes has none)."""
    if has_hook is None:
        def has_hook(c: str) -> bool:
            return hasattr(topology.components[c].instance(), "end_of_input")
    order = [c.id for c in topology.components.values()]
    done: list[str] = []
    while order:     # the topology has no cycle
        ready = [c for c in order if all(i.source in done for i in topology.components[c].inputs)]
        if not ready:
            break
        done += ready
        order = [c for c in order if c not in ready]
    return [c for c in done if topology.components[c].kind == "bolt" and has_hook(c)]


def scalable_components(topology: Topology, config: ResolvedConfig, *, across_workers: bool = False) -> frozenset[str]:
    """The bolts an adaptive run may grow (with ``backpressure.policy: adaptive``).

    ``backpressure.adaptive.autoscale: auto`` leaves out, with one log line each, the
    bolts whose state a rescale could not keep exact; ``true`` refuses the topology in
    one line instead; ``false`` scales nothing."""
    mode = config["backpressure.adaptive.autoscale"]
    if mode == "false":
        return frozenset()
    key, top = "backpressure.adaptive.max_parallelism", config["backpressure.adaptive.max_parallelism"]
    chosen = set()
    for c in topology.bolts:
        if top <= c.parallelism:
            continue
        obstacle = scaling_obstacle(topology, config, c.id, across_workers=across_workers)
        if obstacle is None:
            chosen.add(c.id)
        elif mode == "true":
            raise ConfigError("backpressure.adaptive.autoscale", "true",
                              f"{obstacle}: set it to auto (autoscale only the bolts it can keep exact), "
                              f"false, or {key} to at most {c.parallelism}")
        else:
            log.info("adaptive: bolt %r keeps its %d task(s): %s", c.id, c.parallelism, obstacle)
    return frozenset(chosen)


def keyed_inputs(topology: Topology, component: str) -> list[FieldsGrouping]:
    """The fields groupings ``component`` reads through (its key groups move when it rescales)."""
    return [i.grouping for i in topology.components[component].inputs if isinstance(i.grouping, FieldsGrouping)]


def scaling_obstacle(topology: Topology, config: ResolvedConfig, component: str, *,
                     across_workers: bool = False) -> str | None:
    """Why autoscaling ``component`` could not keep results exact, or None.

    Across workers a keyed rescale sends the tuples held at its fence by their new key
    owners, one by one; under ``acking.granularity: batch`` tuples travel in ack groups
    (one edge for all the tuples one task sent to one target under one parent), which
    that would split.

    With checkpoints a restore gives each task the state of its index: an added task's
    state would be lost by a restore with fewer tasks, unless it is keyed state, which the
    restore gives to the owners of its keys (``_regroup_restored``; across workers the
    checkpoint keeps the tasks as they were, ``placement.Layout``)."""
    keyed = keyed_inputs(topology, component)
    bolt = topology.components[component].instance()
    if config["checkpoint.interval_ms"] is not None and type(bolt).has_state() and not keyed:
        return (f"bolt {component!r} checkpoints state of its own (snapshot_state) and is not a KeyedBolt "
                f"behind fields grouping, so a restore with another number of tasks could not give an added "
                f"task's state back")
    if not keyed:
        return None
    if across_workers and config["acking.granularity"] == "batch":
        return (f"bolt {component!r} is fed by fields grouping, and across workers a rescale re-routes its "
                f"held tuples one by one, which would split acking.granularity batch's ack groups")
    for g in keyed:
        if not isinstance(bolt, KeyedBolt):
            return (f"bolt {component!r} is fed by fields grouping on {list(g.fields)} but is not a "
                    f"KeyedBolt, so autoscaling could not move its state with its keys")
        if tuple(bolt.key_fields) != g.fields:
            return (f"bolt {component!r} is grouped on {list(g.fields)} but its key_fields are "
                    f"{list(bolt.key_fields)}: autoscaling moves keys by the grouping fields, so they "
                    f"must be equal")
    return None


class LocalEngine:
    def __init__(self, topology: Topology, config: dict[str, Any] | None = None, *,
                 flow: FlowControl | None = None, services: Sequence[Service] = (),
                 network: WorkerNetwork | None = None, layout: Layout | None = None) -> None:
        self.topology = topology
        self.network = network   # set when this engine is one worker process of several
        self.layout = layout     # ... and the tasks as autoscaling left them (a restarted worker)
        self.config: ResolvedConfig = (config if isinstance(config, ResolvedConfig)
                                       else resolve(topology.config, config or {}))
        cfg = self.config
        self.seed: int | None = cfg["seed"]
        if flow is None:
            from backpressure.drivers.factory import make_flow_control
            flow = make_flow_control(cfg, topology.name)
        self.flow: FlowControl = flow
        self.services = list(services)
        self.run_state = RunState(max_retries=cfg["max_retries"], max_spout_pending=cfg["max_spout_pending"],
                                  topology=topology.name)
        self.dead_letters = DeadLetterWriter(cfg["dead_letter_path"], topology.name)
        self.acker: Acker | None = None
        if cfg["acking"]:
            self.acker = (Acker(cfg["message_timeout_s"]) if network is None else
                          Acker(cfg["message_timeout_s"], worker=network.worker,
                                forward_ack=network.forwarder.ack, forward_fail=network.forwarder.fail))
        self.drain_deadline = float("inf")
        self._ending: list[str] | None = None   # components whose end-of-input round is still to come
        self.task_ids: dict[str, list[int]] = {}
        self.queues: dict[int, ByteQueue] = {}
        self.spout_tasks: list[SpoutTask] = []
        self.bolt_tasks: list[BoltTask] = []
        self.tasks: list[SpoutTask | BoltTask] = []
        # Autoscaling (seams.Scaler): routers per downstream component, canonical key-group
        # owners of components fed by fields grouping, tasks taken out, runs of tasks added.
        self._edges: dict[str, list[tuple[Outbox, Router]]] = {}
        self.key_owners: dict[str, list[int]] = {}
        self.retired: list[BoltTask] = []
        self._bolt_runs: list[asyncio.Task[None]] = []
        self._rescaling = asyncio.Lock()
        self._drained_ms = 0.0
        # (what, component, tasks after, ms the topology was paused to drain: 0 without a pause)
        self.rescales: list[tuple[str, str, int, float]] = []
        self._held: dict[int, HeldQueue] = {}     # a keyed rescale across workers: targets fenced off
        self._build()
        self.checkpointer: Checkpointer | None = self._make_checkpointer()

    # --- construction ---------------------------------------------------------
    def _build(self) -> None:
        cfg, topo = self.config, self.topology
        next_id = 1
        for c in topo.components.values():
            self.task_ids[c.id] = list(range(next_id, next_id + c.parallelism))
            next_id += c.parallelism
        if self.layout is not None:      # tasks added (or removed) by autoscaling before a restart
            self.task_ids = {c: list(ids) for c, ids in self.layout.task_ids.items()}
            next_id = self.layout.next_id
        ids = self.task_ids
        net = self.network
        bound = cfg["queue.hard_bound"]
        self.queues = {tid: ByteQueue(bound) for c in topo.bolts for tid in ids[c.id]
                       if net is None or net.local(tid)}
        # What an outbox puts batches into: local queues, and other workers' tasks by socket.
        targets: dict[int, Any] = dict(self.queues)
        if net is not None:
            targets.update({tid: net.remote_queue(tid, bound) for c in topo.bolts for tid in ids[c.id]
                            if not net.local(tid)})
        self.targets = targets
        self._all_tasks = frozenset(self.queues)     # local_or_shuffle prefers these
        self._route_rng = random.Random(self.seed)
        self.scalable = self._scalable_components()
        for c in topo.components.values():
            for index, tid in enumerate(ids[c.id]):
                if net is not None and not net.local(tid):
                    continue
                self._add_task_object(self._make_task(c, tid, index))
        self._next_id = next_id
        for comp in self.scalable:
            owners = [r.key_owners for _, r in self._edges.get(comp, ()) if r.key_owners is not None]
            if owners:
                self.key_owners[comp] = list(owners[0])
        if self.layout is not None:
            for comp, owners in self.layout.key_owners.items():
                if comp in self.key_owners:
                    self.key_owners[comp] = list(owners)
                    self._retarget_to(comp, owners)

    def _make_task(self, c: Any, tid: int, index: int) -> SpoutTask | BoltTask:
        """One task of component ``c``, wired to the current tasks of its neighbours."""
        cfg, topo, ids = self.config, self.topology, self.task_ids
        upstream = sorted({t for i in c.inputs for t in ids[i.source]})
        streams = {}
        edges: list[tuple[str, Router]] = []
        for stream, fields in c.outputs.items():
            fi = FieldIndex.of(fields)
            routers = []
            for d, i in topo.downstream(c.id):
                if i.stream != stream:
                    continue
                r = i.grouping.router(ids[d.id], fi, rng=self._route_rng, local_tasks=self._all_tasks,
                                      load=self, scalable=d.id in self.scalable)
                owners = self.key_owners.get(d.id)
                if r.key_owners is not None and owners is not None and r.retarget is not None:
                    r.retarget(ids[d.id], owners)    # a task added later routes keys as its siblings do
                routers.append(r)
                edges.append((d.id, r))
            streams[stream] = StreamRoutes(fi, routers)
        wiring = TaskWiring(
            component=c.id, task_id=tid,
            context=TaskContext(topo.name, c.id, tid, index, len(ids[c.id]), cfg,
                                {f"{i.source}:{i.stream}": tuple(ids[i.source]) for i in c.inputs}),
            outbox=Outbox(c.id, tid, streams, self.targets, cfg["batch.size"],
                          cfg["batch.flush_interval_ms"] / 1000.0),
            upstream_task_ids=upstream,
            stats=TaskStats(topo.name, c.id, tid, c.kind == "spout",
                            high_mark=cfg["queue.high_mark"], low_mark=cfg["queue.low_mark"],
                            hard_bound=cfg["queue.hard_bound"] if c.kind == "bolt" else 0,
                            upstream=tuple(upstream)),
            rng=random.Random(self.seed * 1_000_003 + tid if self.seed is not None else None),
            run=self.run_state, acker=self.acker, dead_letters=self.dead_letters,
            flow_poll=self.flow.poll)
        for d_id, r in edges:
            self._edges.setdefault(d_id, []).append((wiring.outbox, r))
        instance = c.instance()
        if c.kind == "spout":
            assert isinstance(instance, Spout)
            return SpoutTask(wiring, instance)
        assert isinstance(instance, Bolt)
        return BoltTask(wiring, instance, self.queues[tid])

    def _add_task_object(self, task: SpoutTask | BoltTask) -> None:
        if isinstance(task, SpoutTask):
            self.spout_tasks.append(task)
        else:
            self.bolt_tasks.append(task)
        self.tasks.append(task)
        self._checkpoint_tasks()

    def _checkpoint_tasks(self) -> None:
        """The checkpointer snapshots the tasks there are now (autoscaling adds and removes some)."""
        checkpointer = getattr(self, "checkpointer", None)
        if checkpointer is not None:
            checkpointer.bolts = list(self.bolt_tasks)

    def _make_checkpointer(self) -> Checkpointer | None:
        """With ``checkpoint.interval_ms`` set: every spout must keep offsets; failed tuples
        roll back to the last checkpoint instead of being replayed one by one."""
        cfg = self.config
        if cfg["checkpoint.interval_ms"] is None:
            return None
        for t in self.spout_tasks:
            if not type(t.spout).has_state():
                raise CheckpointError(
                    f"checkpoint.interval_ms is set but spout {t.component!r} ({type(t.spout).__name__}) keeps "
                    f"no offsets to resume from: it must implement snapshot_state/restore_state "
                    f"(the spouts of topo.sources do)")
        first = {t.component: t.instance for t in reversed(self.tasks)}
        fingerprint = topology_fingerprint([(c.id, c.kind, first[c.id], c.parallelism)
                                            for c in self.topology.components.values()])
        store = CheckpointStore(cfg["checkpoint.dir"], self.topology.name, cfg["checkpoint.keep"])
        if not cfg["checkpoint.restore"]:
            store.discard()
        self.run_state.rollback_on_failure = True
        return Checkpointer(store, fingerprint, self.run_state, self.spout_tasks, self.bolt_tasks, self._quiescent,
                            interval_s=cfg["checkpoint.interval_ms"] / 1000.0, timeout_s=cfg["checkpoint.timeout_s"])

    # --- autoscaling (seams.Scaler, document 004) ------------------------------
    # A task is added or removed while the topology runs. Under shuffle-like, all and
    # global groupings nothing needs to stop: the upstreams' routers take the new task
    # at once, or stop routing to the leaving one, whose queue then drains before it
    # stops. A component fed by fields grouping routes by key groups whose keyed state
    # (KeyedBolt) must move with them, so there the spouts hold until nothing routed by
    # the old owners is left on its way to that component (its queues and the lanes into
    # it empty, its tasks idle; queues upstream of it and everything downstream keep their
    # work), the groups and their state move in one synchronous step, and the spouts go
    # on: exact, at the cost of draining that component (bench/rescale_pause.py).

    def _scalable_components(self) -> frozenset[str]:
        """Bolts a flow control with a ``scaler`` may grow (in one process or across workers)."""
        if not hasattr(self.flow, "scaler"):
            return frozenset()
        return scalable_components(self.topology, self.config, across_workers=self.network is not None)

    async def add_task(self, component: str) -> BoltTask | None:
        """One more task of bolt ``component``, routed to by every upstream once it runs."""
        if (component not in self.scalable or self.stopping
                or len(self.task_ids[component]) >= self.config["backpressure.adaptive.max_parallelism"]):
            return None
        async with self._rescaling:
            keyed = component in self.key_owners
            self._drained_ms = 0.0
            if keyed and self.run_state.paused:       # a checkpoint is draining the topology
                return None
            if keyed and not await self._pause_drained(component):
                return None
            try:
                task = self._start_task(component)
            finally:
                if keyed:
                    self._resume()
            if task is not None:
                self.rescales.append(("add", component, len(self.task_ids[component]), self._drained_ms))
            return task

    def _start_task(self, component: str) -> BoltTask | None:
        tid = self._next_id
        self._next_id += 1
        self.task_ids[component].append(tid)
        task = self.open_task(component, tid)
        if task is None:
            self.task_ids[component].remove(tid)
            return None
        self._retarget(component)
        if component in self.key_owners:
            self._move_keys(component, [b for b in self.bolt_tasks if b.component == component])
        self._link_downstream(tid, component, add=True)
        log.info("autoscaling: %r now has %d tasks (task %d added)", component, len(self.task_ids[component]), tid)
        return task

    def open_task(self, component: str, tid: int) -> BoltTask | None:
        """Task ``tid`` of bolt ``component`` made, prepared and running, with its own queue;
        no upstream routes to it yet. None (logged) if its ``prepare`` raised."""
        c = self.topology.components[component]
        self.queues[tid] = self.targets[tid] = ByteQueue(self.config["queue.hard_bound"])
        if self.network is not None:
            self.network.owner[tid] = self.network.worker
        self._all_tasks = self._all_tasks | {tid}
        ids = self.task_ids[component]
        task = self._make_task(c, tid, ids.index(tid) if tid in ids else len(ids))
        assert isinstance(task, BoltTask)
        try:
            task.bolt.prepare(task.context, task.collector)
        except Exception as exc:
            log.warning("autoscaling: a new task of %r failed to prepare (%s: %s); not added",
                        component, type(exc).__name__, exc)
            del self.queues[tid], self.targets[tid]
            self._all_tasks = self._all_tasks - {tid}
            self._forget_edges_of(task.outbox)
            return None
        self._add_task_object(task)
        self._bolt_runs.append(asyncio.create_task(task.run(), name=f"{component}:{tid}"))
        return task

    async def remove_task(self, component: str) -> int | None:
        """Take the newest task of ``component`` out: upstreams stop routing to it, its
        queue drains (with acking its trees complete), then it stops. None if declined."""
        ids = self.task_ids.get(component, [])
        if component not in self.scalable or self.stopping or len(ids) <= 1:
            return None
        async with self._rescaling:
            self._drained_ms = 0.0
            victim = ids[-1]
            task = next(b for b in self.bolt_tasks if b.task_id == victim)
            keyed = component in self.key_owners
            if keyed:
                if self.run_state.paused or not await self._pause_drained(component):
                    return None
                try:
                    ids.remove(victim)
                    self._retarget(component)
                    self._move_keys(component, [b for b in self.bolt_tasks if b.component == component])
                    await self._retire(task)
                finally:
                    self._resume()
                self.rescales.append(("remove", component, len(ids), self._drained_ms))
                return victim
            ids.remove(victim)
            self._retarget(component)
            if not await self._drained_task(task):
                ids.append(victim)       # it could not drain in time: it stays
                self._retarget(component)
                return None
            await self._retire(task)
            self.rescales.append(("remove", component, len(ids), 0.0))
            return victim

    def _retarget(self, component: str) -> None:
        """Every router into ``component`` switches to its current tasks (and key owners)."""
        owners = None
        if component in self.key_owners:
            owners = self.key_owners[component] = spread_key_groups(self.key_owners[component],
                                                                    self.task_ids[component])
        self._retarget_to(component, owners)

    def _retarget_to(self, component: str, owners: Sequence[int] | None) -> None:
        ids = self.task_ids[component]
        for outbox, r in self._edges.get(component, ()):
            if r.retarget is not None:
                r.retarget(list(ids), owners)
                _retarget_lanes(outbox, r)

    def _move_keys(self, component: str, tasks: Sequence[BoltTask]) -> None:
        """Each key's state goes to its group's owner (the topology is drained: synchronous)."""
        owners = self.key_owners[component]
        bolts = {b.task_id: b.bolt for b in tasks}
        moving: list[tuple[int, list[tuple[Any, dict[str, Any]]]]] = []
        for tid, bolt in bolts.items():
            assert isinstance(bolt, KeyedBolt)
            moving.append((tid, bolt.take_keys(lambda k, tid=tid: owners[key_group(k)] != tid)))
        n = 0
        for _, pairs in moving:
            for k, v in pairs:
                bolts[owners[key_group(k)]].give_keys([(k, v)])   # type: ignore[attr-defined]
                n += 1
        log.info("autoscaling: %d keys of %r moved with their key groups", n, component)

    def _regroup_restored(self, states: dict[str, dict[int, bytes]]) -> None:
        """After a restore in one process: the keyed state of tasks autoscaling had added
        (indexes past the current tasks) goes to its keys' owners, and every key of a
        scalable keyed component moves to its group's owner now (the checkpoint may have
        been taken under other owners)."""
        for comp in self.key_owners:
            tasks = [b for b in self.bolt_tasks if b.component == comp]
            owners = self.key_owners[comp]
            bolts = {b.task_id: b.bolt for b in tasks}
            for index, packed in states.get(comp, {}).items():
                if index >= len(tasks):
                    for k, v in msgpack.unpackb(packed, raw=False, strict_map_key=False):
                        k = hashable_key(k)
                        bolts[owners[key_group(k)]].give_keys([(k, v)])   # type: ignore[attr-defined]
            self._move_keys(comp, tasks)

    def _link_downstream(self, tid: int, component: str, *, add: bool) -> None:
        """Tasks fed by ``component`` list ``tid`` among their upstreams (or no longer)."""
        fed = {d.id for d, _ in self.topology.downstream(component)}
        for t in self.tasks:
            if t.component in fed:
                if add and tid not in t.upstream_task_ids:
                    t.upstream_task_ids.append(tid)
                elif not add and tid in t.upstream_task_ids:
                    t.upstream_task_ids.remove(tid)
                t.stats.upstream = tuple(t.upstream_task_ids)

    def _forget_edges_of(self, outbox: Outbox) -> None:
        for comp, edges in self._edges.items():
            self._edges[comp] = [(o, r) for o, r in edges if o is not outbox]

    async def _retire(self, task: BoltTask) -> None:
        """Stop a drained task that no router sends to any more; its stats stay in the result."""
        for run in self._bolt_runs:
            if run.get_name() == f"{task.component}:{task.task_id}":
                run.cancel()
                await asyncio.gather(run, return_exceptions=True)
        if task.outbox.pending_count:
            await task.outbox.flush()
        self._close_components([task])
        self.bolt_tasks.remove(task)
        self.tasks.remove(task)
        self.retired.append(task)
        self._checkpoint_tasks()
        del self.queues[task.task_id], self.targets[task.task_id]
        self._all_tasks = self._all_tasks - {task.task_id}
        self._forget_edges_of(task.outbox)
        self._link_downstream(task.task_id, task.component, add=False)
        log.info("autoscaling: %r now has %d tasks (task %d removed)", task.component,
                 len(self.task_ids[task.component]), task.task_id)

    def _motion(self) -> tuple[int, int] | None:
        """None while a tuple is anywhere between an emit and the end of its execute;
        otherwise the work counters, which must then stay still between two looks."""
        for t in self.tasks:
            if t.outbox.pending_count:
                return None
        for b in self.bolt_tasks:
            if b.queue.count or not b.waiting:
                return None
        return sum(t.stats.emitted for t in self.tasks), sum(b.stats.executed for b in self.bolt_tasks)

    async def _settle(self, still: Callable[[], Any]) -> bool:
        """Wait until ``still()`` gives the same non-None mark twice in a row (a wake-up
        already scheduled runs in between), within ``drain_timeout_s``."""
        deadline = time.monotonic() + self.config["drain_timeout_s"]
        last = None
        while time.monotonic() < deadline and not self.stopping:
            await asyncio.sleep(0.005)
            mark = still()
            if mark is not None and mark == last:
                return True
            last = mark
        return False

    def _keys_still(self, component: str) -> tuple[int, int] | None:
        """None while a tuple routed by the old key owners can still reach ``component``: in
        a lane towards one of its tasks, in one of its queues, or in its ``execute``; else its
        executed count. Queues upstream of it and everything downstream may hold work:
        what upstreams emit later is routed by the new owners."""
        mine = [b for b in self.bolt_tasks if b.component == component]
        ids = {b.task_id for b in mine}
        for t in self.tasks:
            lanes = t.outbox.lanes
            for tid in ids:
                lane = lanes.get(tid)
                if lane is not None and lane.batch:
                    return None
        for b in mine:
            if b.queue.count or not b.waiting:
                return None
        return sum(b.stats.executed for b in mine), 0

    async def _pause_drained(self, component: str) -> bool:
        """Spouts hold at their next call boundary until nothing routed by the old key owners
        is left on its way to ``component`` (``_keys_still``)."""
        self.run_state.holds.add("rescale")
        t0 = time.monotonic()
        if await self._settle(functools.partial(self._keys_still, component)):
            self._drained_ms = (time.monotonic() - t0) * 1000
            return True
        self._resume()
        log.warning("autoscaling: the topology did not drain within drain_timeout_s; not rescaled")
        return False

    def _resume(self) -> None:
        self.run_state.holds.discard("rescale")
        for s in self.spout_tasks:
            s.wake()

    async def _drained_task(self, task: BoltTask) -> bool:
        """No upstream lane holds a tuple for ``task``, its queue is empty, it waits."""
        tid = task.task_id

        def still() -> tuple[int, int] | None:
            for t in self.tasks:
                lane = t.outbox.lanes.get(tid)
                if lane is not None and lane.batch:
                    return None
            if task.queue.count or not task.waiting:
                return None
            return task.stats.executed, 0

        return await self._settle(still)

    # --- autoscaling across worker processes: the steps a supervisor asks for ----------
    # ``runtime.local.rescaling`` runs them on every worker in turn (its docstring says why
    # in this order); each is one synchronous step of this worker's event loop, except
    # ``retire_task``.

    def task_count(self, component: str) -> int:
        """How many tasks ``component`` has now (the adaptive driver's count after a decline)."""
        return len(self.task_ids.get(component, ()))

    def fence(self, component: str) -> None:
        """Spouts hold, and every batch this worker sends towards ``component``'s tasks waits
        at a ``HeldQueue`` until ``apply_tasks`` (or ``unfence``) routes it again."""
        self.run_state.holds.add("rescale")
        for tid in self.task_ids[component]:
            q = self.targets.get(tid)
            if q is not None and tid not in self._held:
                self._held[tid] = HeldQueue(q.inner if isinstance(q, HeldQueue) else q)
                self.targets[tid] = self._held[tid]

    def keyed_still(self, component: str) -> int | None:
        """After ``fence``: None while a tuple this worker sent may still be on its way to
        ``component`` or one of its tasks here has work; else their executed count."""
        ids = set(self.task_ids[component])
        for tid, q in self._held.items():
            if tid in ids and not isinstance(q.inner, ByteQueue) and q.inner.bytes:
                return None              # on the wire to another worker, not yet credited
        mine = [b for b in self.bolt_tasks if b.component == component]
        for b in mine:
            if b.queue.count or not b.waiting:
                return None
        return sum(b.stats.executed for b in mine)

    def take_keys_for(self, component: str, owners: Sequence[int]) -> list[list[Any]]:
        """``[from task, to task, key, state]`` for each key of this worker's tasks of
        ``component`` whose group gets another owner; the state leaves its task."""
        out: list[list[Any]] = []
        for b in self.bolt_tasks:
            if b.component != component:
                continue
            tid = b.task_id
            assert isinstance(b.bolt, KeyedBolt)
            for k, v in b.bolt.take_keys(lambda k, tid=tid: owners[key_group(k)] != tid):
                out.append([tid, owners[key_group(k)], k, v])
        return out

    def give_keys_to(self, items: Sequence[Sequence[Any]]) -> int:
        """``[to task, key, state]``: each key's state to its new owner (a task of this worker)."""
        bolts = {b.task_id: b.bolt for b in self.bolt_tasks}
        for dst, k, v in items:
            bolts[dst].give_keys([(k, v)])   # type: ignore[attr-defined]
        return len(items)

    def apply_tasks(self, component: str, ids: Sequence[int], owners: Sequence[int] | None,
                    where: dict[int, int]) -> None:
        """``component``'s tasks are now ``ids`` (``where``: the worker of each), and its key
        groups ``owners``: every router here switches, held batches and pending lanes go
        by the new routes, and the fence (if any) is lifted."""
        net = self.network
        old = list(self.task_ids[component])
        for tid, w in where.items():
            if net is not None:
                net.owner[tid] = w
                if tid not in self.targets and not net.local(tid):
                    self.targets[tid] = net.remote_queue(tid, self.config["queue.hard_bound"])
        self.task_ids[component] = list(ids)
        if owners is not None:
            self.key_owners[component] = list(owners)
        self._retarget_to(component, owners)
        if self._held:
            self._reroute_lanes(component, {*old, *ids})
        for tid in ids:
            if tid not in old:
                self._link_downstream(tid, component, add=True)
        self.unfence(component)
        added = next((b for b in self.bolt_tasks if b.task_id in ids and b.task_id not in old), None)
        rescaled = getattr(self.flow, "rescaled", None)
        if rescaled is not None:
            rescaled(component, list(ids), added)

    def _routes_into(self, component: str) -> dict[tuple[int, str], tuple[Outbox, Router]]:
        """(sending task, stream) -> its outbox and router into ``component``."""
        found: dict[tuple[int, str], tuple[Outbox, Router]] = {}
        for outbox, r in self._edges.get(component, ()):
            for stream, routes in outbox.streams.items():
                if any(x is r for x in routes.routers):
                    found[(outbox.task_id, stream)] = (outbox, r)
        return found

    def _reroute_lanes(self, component: str, tasks: set[int]) -> None:
        """Tuples still in a lane towards a task of ``component`` (``tasks``: its tasks before
        and after) go to the lane their key's owner has now (one synchronous pass: order
        per key is kept)."""
        routes = self._routes_into(component)
        for outbox in {id(o): o for o, _ in self._edges.get(component, ())}.values():
            moved = False
            for lane in list(outbox.lanes.values()):
                if lane.target not in tasks or not lane.batch:
                    continue
                keep = []
                for t in lane.batch:
                    found = routes.get((outbox.task_id, t.origin.stream))
                    if found is None or found[1].broadcast:
                        keep.append(t)
                        continue
                    r = found[1]
                    target = r.targets[r.select(t.values)]
                    if target == lane.target:
                        keep.append(t)
                    else:
                        outbox.lanes[target].batch.append(t)
                        moved = True
                lane.batch[:] = keep
            if moved:
                for _, r in self._edges.get(component, ()):
                    _retarget_lanes(outbox, r)      # lanes of targets no router uses any more go

    def unfence(self, component: str) -> None:
        """Lift the fence: each held batch, and each put into a fenced target until every
        outbox feeding ``component`` began a new flush, is routed by the routers as they
        are now (``fence.HeldQueue``)."""
        routes = self._routes_into(component)
        held, self._held = self._held, {}
        for hq in held.values():
            hq.lift(functools.partial(self._route_again, routes, hq.inner))
        # (an outbox without a ``before_flush`` hook looks each queue up as it takes the lane)
        outboxes = {id(o): o for o, _ in self._edges.get(component, ()) if hasattr(o, "before_flush")}
        if not outboxes:
            self._unwrap(held)
            return
        waiting = set(outboxes)

        def flushing(key: int, outbox: Outbox, inner: Callable[[], None] | None) -> None:
            outbox.before_flush = inner          # (its own hook, if any, back in place)
            if inner is not None:
                inner()
            waiting.discard(key)
            if not waiting:
                self._unwrap(held)

        for key, outbox in outboxes.items():
            outbox.before_flush = functools.partial(flushing, key, outbox, outbox.before_flush)

    def _unwrap(self, held: dict[int, HeldQueue]) -> None:
        """No flush from before a rescale is left: its fenced targets are plain queues again
        (or gone, for a task removed meanwhile)."""
        live = {t for ids in self.task_ids.values() for t in ids} | set(self.queues)
        for tid, hq in held.items():
            if self.targets.get(tid) is hq:
                if tid in live:
                    self.targets[tid] = hq.inner
                else:
                    del self.targets[tid]

    async def _route_again(self, routes: dict[tuple[int, str], tuple[Outbox, Router]], fallback: Any,
                           batch: list[Any]) -> int:
        parts: dict[int, list[Any]] = {}
        outbox = None
        for t in batch:
            found = routes.get((t.origin.task, t.origin.stream))
            if found is None:
                parts.setdefault(-1, []).append(t)
                continue
            outbox, r = found
            parts.setdefault(r.targets[r.select(t.values)], []).append(t)
        waited = 0
        for tid, part in parts.items():
            queue = fallback if tid == -1 else self.targets[tid]
            if isinstance(queue, HeldQueue) and queue.lifted:
                queue = queue.inner             # (a held batch of a fence lifted: routed already)
            nbytes = outbox.batch_bytes(part) if outbox is not None else 0
            waited += await queue.put(part, nbytes)
        return waited

    def task_drained(self, tid: int) -> int | None:
        """None while this worker still has a tuple for task ``tid`` in a lane, on the wire,
        or (its own task) queued or in execution; else its executed count (0 elsewhere)."""
        for t in self.tasks:
            lane = t.outbox.lanes.get(tid)
            if lane is not None and lane.batch:
                return None
        q = self.targets.get(tid)
        if q is not None and not isinstance(q, ByteQueue) and q.bytes:
            return None
        task = next((b for b in self.bolt_tasks if b.task_id == tid), None)
        if task is None:
            return 0
        if task.queue.count or not task.waiting:
            return None
        return task.stats.executed

    async def retire_task(self, tid: int) -> bool:
        """Stop this worker's task ``tid`` (drained, routed to by nobody)."""
        task = next((b for b in self.bolt_tasks if b.task_id == tid), None)
        if task is None:
            return False
        wrapper = self.targets.get(tid)
        await self._retire(task)
        if isinstance(wrapper, HeldQueue):    # a flush from before the rescale may still look it up
            self.targets[tid] = wrapper
        return True

    def forget_task(self, component: str, tid: int) -> None:
        """Task ``tid`` of ``component`` (another worker's, or this one's) is gone."""
        q = self.targets.get(tid)
        if q is not None and not isinstance(q, HeldQueue) and tid not in self.queues:
            del self.targets[tid]
        self._link_downstream(tid, component, add=False)

    # --- send windows (seams.WindowGate, document 002) ---------------------------
    def _send_windows(self) -> SendWindows:
        """Gate every spout's flushes by the flow control's windows and tell it each outcome."""
        component_of = {tid: c for c, ids in self.task_ids.items() for tid in ids}
        movable: dict[int, frozenset[str]] = {}
        keyed: dict[int, frozenset[str]] = {}
        for s in self.spout_tasks:
            free, fixed = set(), set()
            for d, i in self.topology.downstream(s.component):
                (free if isinstance(i.grouping, _MOVABLE) else fixed).add(d.id)
            movable[s.task_id], keyed[s.task_id] = frozenset(free - fixed), frozenset(fixed)
        # Spouts that can resume from their ack point (W5); with checkpoints the checkpoint does.
        positions = {s.task_id: (s.spout.snapshot_state, s.spout.restore_state) for s in self.spout_tasks
                     if type(s.spout).has_state()} if self.checkpointer is None else {}
        gate = SendWindows(self.flow, {s.task_id: s.pending for s in self.spout_tasks},  # type: ignore[arg-type]
                           component_of, movable, keyed, positions=positions,
                           stopping=lambda: self.run_state.stopping)
        for s in self.spout_tasks:
            s.outbox.gate = gate.admit
            s.outbox.batch_size = self.config["backpressure.window.batch"]   # W6: a spout's batches
            s.outcome_hook = functools.partial(gate.on_outcome, s.task_id)
        return gate

    # --- views -----------------------------------------------------------------
    @property
    def stats(self) -> list[TaskStats]:
        return [t.stats for t in self.tasks] + [t.stats for t in self.retired]

    @property
    def handles(self) -> list[SpoutTask | BoltTask]:
        return list(self.tasks)

    @property
    def stopping(self) -> bool:
        return self.run_state.stopping

    @property
    def stop_reason(self) -> str:
        return self.run_state.stop_reason

    def set_shares(self, upstream_task_id: int, component: str, shares: Any) -> bool:
        """``seams.ShareRouter``: weight one upstream task's routing to ``component``'s tasks
        (shuffle-like edges only: a fields, all or global edge is never re-weighted)."""
        task = next((t for t in self.tasks if t.task_id == upstream_task_id), None)
        targets = self.task_ids.get(component)
        if task is None or targets is None or set(shares) != set(targets):
            return False       # (shares from before a rescale would starve a task they do not name)
        applied = False
        for routes in task.outbox.streams.values():
            for router in routes.routers:
                if router.weigh is not None and router.targets == targets:
                    router.weigh([float(shares.get(t, 0.0)) for t in targets])
                    applied = True
        return applied

    def water_level(self, task_id: int) -> float:
        """LoadView for load-aware grouping: fraction of the hard bound in use (for a task
        of another worker: the bytes in flight to it)."""
        q = self.targets.get(task_id)
        return q.bytes / q.hard_bound if q is not None else 0.0

    # --- control ---------------------------------------------------------------
    def request_stop(self, reason: str = "stopped") -> None:
        self.run_state.request_stop(reason)

    def _quiescent(self) -> bool:
        return self._motion() is not None and not any(s.pending for s in self.spout_tasks)

    async def _sample(self) -> None:
        """Every ``_SAMPLE_PERIOD_S``: stats gauges, Storm tick markers, acker timeouts."""
        start = time.perf_counter_ns()
        while True:
            await asyncio.sleep(_SAMPLE_PERIOD_S)
            now = time.monotonic()
            wall = time.perf_counter_ns() - start
            for t in self.tasks:
                t.sample(now)
                s = t.stats
                s.busy_ns = max(0, wall - s.idle_ns - s.backpressured_ns)
            perf_now = time.perf_counter()
            for t in self.tasks:
                t.failures.flush()
            for b in self.bolt_tasks:
                b.check_overrun(perf_now)
                b.stats.queue_bytes = b.queue.bytes
                b.stats.queue_tuples = b.queue.count
                if b.tick_interval_s and now - b.last_tick >= b.tick_interval_s:
                    b.last_tick = now
                    b.queue.put_marker(TICK_MARKER)
            if self.acker is not None:
                self.acker.expire(time.perf_counter())  # the acker runs on perf_counter time

    async def run(self, duration: float | None = None, max_tuples: int | None = None,
                  handle_signals: bool = False) -> RunResult:
        with _young_gc_threshold(self.config["gc.young_threshold"]):
            return await self._run(duration, max_tuples, handle_signals)

    async def _run(self, duration: float | None, max_tuples: int | None, handle_signals: bool) -> RunResult:
        loop = asyncio.get_running_loop()
        run = self.run_state
        run.max_tuples = max_tuples
        run.stop_event = asyncio.Event()
        if run.stopping:
            run.stop_event.set()
        self._open_components()
        try:
            if self.checkpointer is not None:
                restored = self.checkpointer.restore()
                if restored is not None and self.network is None:
                    self._regroup_restored(restored.states)
            if self.network is not None:
                acker = self.acker     # (an Acker is falsy while its ledger is empty: test for None)
                await self.network.start(self.queues,
                                         acker.apply if acker is not None else (lambda r, x: None),
                                         acker.fail if acker is not None else (lambda r, why: None))
            if hasattr(self.flow, "share_router"):    # a flow control that balances load (004)
                self.flow.share_router = self
            if self.scalable:                         # and one that scales components (004)
                self.flow.scaler = self  # type: ignore[attr-defined]
            if hasattr(self.flow, "window_gate") and self.acker is not None:
                self.flow.window_gate = self._send_windows()    # per-tuple send windows (002)
            await self.flow.start(self.tasks)
            rescaled = getattr(self.flow, "rescaled", None)
            if self.layout is not None and rescaled is not None:   # tasks autoscaling added before a restart
                for comp in self.scalable:
                    rescaled(comp, list(self.task_ids[comp]), None)
        except BaseException:     # a refused claim, an unreachable ZooKeeper, a bad checkpoint
            self._close_components(self.tasks)
            self.dead_letters.close()
            raise
        started_services: list[Service] = []
        for s in self.services:
            await s.start(self)
            started_services.append(s)
        if handle_signals:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, self._on_signal)
        sampler = asyncio.create_task(self._sample(), name="sampler")
        spouts = [asyncio.create_task(t.run(), name=f"{t.component}:{t.task_id}") for t in self.spout_tasks]
        bolts = self._bolt_runs     # autoscaling appends the runs of tasks it adds
        bolts.extend(asyncio.create_task(t.run(), name=f"{t.component}:{t.task_id}") for t in self.bolt_tasks)
        timer = loop.call_later(duration, self.request_stop, "duration") if duration else None
        checkpoints = (asyncio.create_task(self.checkpointer.loop(), name="checkpoints")
                       if self.checkpointer is not None else None)
        try:
            drained = await self._supervise(spouts, bolts)
            if checkpoints is not None:
                checkpoints.cancel()
                await asyncio.gather(checkpoints, return_exceptions=True)
                if drained:   # the last checkpoint seals the output of the whole run
                    await self.checkpointer.take(final=True)  # type: ignore[union-attr]
        finally:
            if checkpoints is not None:
                checkpoints.cancel()
            if timer:
                timer.cancel()
            if handle_signals:
                for sig in (signal.SIGINT, signal.SIGTERM):
                    loop.remove_signal_handler(sig)
            for task in spouts + bolts + [sampler]:
                task.cancel()
            await asyncio.gather(*spouts, *bolts, sampler, return_exceptions=True)
            for s in reversed(started_services):
                await s.stop()
            await self.flow.stop()
            if self.network is not None:
                await self.network.close()
            if self.checkpointer is not None:
                await self.checkpointer.close()
            self._close_components(self.tasks)
            self.dead_letters.close()
            now = time.monotonic()
            for t in self.tasks:
                t.sample(now)
        return RunResult(self.stats, self.stop_reason or "exhausted")

    async def _await_finish(self, spouts: list[asyncio.Task], bolts: list[asyncio.Task]) -> bool:
        """One worker of several: only the supervisor sees whether anything is in flight
        anywhere; it says when the run is over (drained, or past the drain deadline)."""
        net = self.network
        assert net is not None and net.finish is not None
        while not net.finish.is_set():
            for t in spouts + bolts:
                if t.done() and not t.cancelled() and t.exception() is not None:
                    raise t.exception()
            await asyncio.sleep(0.005)
        if not net.drained and self.acker is not None and len(self.acker):
            n = self.acker.fail_all("drain timeout")
            log.warning("drain timeout: %d tuple trees failed back to their spouts", n)
            for st in self.spout_tasks:
                st.handle_outcomes()
        return net.drained

    def report(self) -> dict[str, Any]:
        """For the supervisor: may this worker be finished, and its traffic counters."""
        net = self.network
        spouts_done = all(s.finished or (s.exhausted and not s.pending) for s in self.spout_tasks)
        return {"spouts_done": spouts_done, "quiescent": self._quiescent(),
                "sent": net.counters.sent if net else 0, "received": net.counters.received if net else 0}

    def _open_components(self) -> None:
        """``open`` every spout and ``prepare`` every bolt; if one raises, close what was
        opened and stop with one line naming the component."""
        opened: list[SpoutTask | BoltTask] = []
        for t in [*self.spout_tasks, *self.bolt_tasks]:
            try:
                if isinstance(t, SpoutTask):
                    t.spout.open(t.context, t.collector)
                else:
                    t.bolt.prepare(t.context, t.collector)
            except Exception as exc:
                log.debug("%s (task %d) failed to start", t.component, t.task_id, exc_info=exc)
                self._close_components(opened)
                self.dead_letters.close()
                verb = "open" if isinstance(t, SpoutTask) else "prepare"
                raise ComponentError(f"{'spout' if t.is_spout else 'bolt'} {t.component!r} (task {t.task_id}): "
                                     f"{verb} raised {type(exc).__name__}: {exc}"[:400]) from exc
            opened.append(t)

    @staticmethod
    def _close_components(tasks: Sequence[SpoutTask | BoltTask]) -> None:
        for t in tasks:
            try:
                if isinstance(t, SpoutTask):
                    t.spout.close()
                else:
                    t.close_thread()
                    t.bolt.cleanup()
            except Exception:
                log.exception("%s (task %d) close/cleanup raised", t.component, t.task_id)
            t.failures.flush(force=True)

    def _end_of_input(self) -> bool:
        """Every spout ran out by itself (bounded input) and all is processed: hand the next
        component (topological order) with an ``end_of_input`` hook an END marker per task,
        so its open windows close (Flink's MAX_WATERMARK); False once none is left."""
        if self._ending is None:
            hooked = {b.component for b in self.bolt_tasks if hasattr(b.bolt, "end_of_input")}
            self._ending = end_of_input_order(self.topology, hooked.__contains__)
        if not self._ending:
            return False
        self.end_component(self._ending.pop(0))
        return True

    def end_component(self, component: str) -> None:
        """An END marker to each of this process's tasks of ``component``."""
        for b in self.bolt_tasks:
            if b.component == component and hasattr(b.bolt, "end_of_input"):
                b.queue.put_marker(END_MARKER)

    def _on_signal(self) -> None:
        if self.stopping:
            log.warning("second signal: stopping without drain")
            self.drain_deadline = 0.0
        self.request_stop("signal")

    async def _supervise(self, spouts: list[asyncio.Task], bolts: list[asyncio.Task]) -> bool:
        """Wait for the spouts to finish (exhausted or stopped), then drain the bolts;
        True when everything in flight was processed, False when the drain timed out."""
        stop_event = self.run_state.stop_event
        assert stop_event is not None
        watch = set(spouts) | set(bolts)
        stop_wait = asyncio.ensure_future(stop_event.wait())
        try:
            while any(not t.done() for t in spouts) and not self.stopping:
                done, _ = await asyncio.wait(watch | {stop_wait}, return_when=asyncio.FIRST_COMPLETED)
                for d in done:
                    if d in watch and not d.cancelled() and d.exception() is not None:
                        raise d.exception()  # a programming error in a component (e.g. unencodable tuple)
                watch -= done
        finally:
            stop_wait.cancel()
        if self.network is not None:
            return await self._await_finish(spouts, bolts)
        # Drain: spouts finish their in-flight trees, bolts empty their queues. A topology
        # whose spouts ended by themselves finishes all its work unless a stop is requested
        # meanwhile (--duration, a signal, request_stop): from the moment of any stop
        # request it gets drain_timeout_s before what is left is failed back.
        drain_timeout = self.config["drain_timeout_s"]
        if self.stopping:
            self.drain_deadline = min(self.drain_deadline, time.monotonic() + drain_timeout)
        while time.monotonic() < self.drain_deadline:
            for t in spouts + bolts:
                if t.done() and not t.cancelled() and t.exception() is not None:
                    raise t.exception()
            if all(t.done() for t in spouts) and self._quiescent():
                if self.stopping or not self._end_of_input():
                    return True
                continue
            await asyncio.sleep(0.005)
            if self.stopping and self.drain_deadline == float("inf"):
                self.drain_deadline = time.monotonic() + drain_timeout
        else:
            left = sum(b.queue.count for b in self.bolt_tasks)
            if left:
                log.warning("drain timeout: %d tuples still queued%s", left,
                            "" if self.acker is not None else " are dropped (acking is off: nothing replays them)")
            if self.acker is not None and len(self.acker):
                n = self.acker.fail_all("drain timeout")
                log.warning("drain timeout: %d tuple trees failed back to their spouts", n)
                for st in self.spout_tasks:
                    st.handle_outcomes()
        return False


def _retarget_lanes(outbox: Outbox, router: Router) -> None:
    """``outbox.retarget`` on a copy of its lanes dict: a flush of that outbox suspended
    halfway through iterating its lanes (waiting for a queue) goes on over the old dict,
    where adding or dropping a lane would stop it with "dictionary changed size"."""
    outbox.lanes = dict(outbox.lanes)
    outbox.retarget(router)


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
    spout tuples were emitted, or SIGINT/SIGTERM (with ``handle_signals``).

    With checkpoints on, a failed or timed-out tuple rolls the whole topology back to
    its last checkpoint (a new engine restores it and goes on, as Flink restarts a job
    from its last checkpoint); ``message_timeout_s`` doubles after each rollback so a
    timeout set too small for the load cannot roll back forever.
    """
    import uvloop

    return uvloop.run(run_async(topology, config, duration=duration, max_tuples=max_tuples, flow=flow,
                                services=services, handle_signals=handle_signals))


async def run_async(topology: Topology, config: dict[str, Any] | None = None, *, duration: float | None = None,
                    max_tuples: int | None = None, flow: FlowControl | None = None,
                    services: Sequence[Service] = (), handle_signals: bool = False) -> RunResult:
    """``run`` inside a running event loop."""
    cfg = config if isinstance(config, ResolvedConfig) else resolve(topology.config, config or {})
    rollbacks = 0
    deadline = None if duration is None else time.monotonic() + duration
    while True:
        engine = LocalEngine(topology, cfg, flow=flow, services=services)
        left = None if deadline is None else max(0.001, deadline - time.monotonic())
        try:
            return await engine.run(left, max_tuples, handle_signals)
        except Rollback as why:
            completed = engine.checkpointer.stats.completed if engine.checkpointer is not None else 0
            rollbacks = 1 if completed else rollbacks + 1
            if flow is not None or rollbacks > cfg["checkpoint.max_rollbacks"]:
                raise CheckpointError(f"{why}; gave up after {rollbacks - 1} rollbacks to the last checkpoint in a "
                                      f"row (checkpoint.max_rollbacks)") from None
            cfg = ResolvedConfig({**cfg, "message_timeout_s": cfg["message_timeout_s"] * 2,
                                  "checkpoint.restore": True})
            log.warning("%s: rolling back to the last checkpoint (message_timeout_s now %g s)", why,
                        cfg["message_timeout_s"])
