"""Routing and batching of one task's emits.

Emitting is synchronous and cheap: each subscribed edge's router picks the target
task and the tuple is appended to that target's *lane* (its pending batch).
``flush`` sizes each batch (its tuples' msgpack encodings are their wire size) and
moves it into the target's byte-bounded queue, waiting where a queue is full.
Batches travel between tasks (Storm 2's batching) because a queue hop costs about
as much as a small tuple's whole processing; spouts and bolts still see one tuple
at a time.

Per declared stream the outbox builds one emit function with everything it needs
bound as locals (``untracked[stream]`` and ``tracked[stream]``): this is the
innermost loop of the runtime. The collectors a user's component emits through
(``runtime.local.collectors``) are built on these; an emit that does not fit its
declared stream raises ``topo.api.EmitError``, built by ``topo.api``'s functions.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from collections import deque
from itertools import chain, compress, repeat
from operator import attrgetter, call, eq, ne, not_
from typing import Any, Callable, Iterable, Sequence

import msgpack

from topo.api import (Columns, EmitError, FieldIndex, Origin, Run, Tuple, TupleBatch, WireTuple, arity_error,
                      encoding_error, interleave, unknown_stream_error)
from topo.groupings import Router
from runtime.local.acker import AckGroup, new_group
from runtime.local.queue import ByteQueue
from runtime.local.stretches import stretch_bounds, stretch_lengths


@dataclass
class StreamRoutes:
    """What the outbox needs for one declared stream of the emitting component."""

    fields: FieldIndex
    routers: list[Router]


class Lane:
    """The pending batch for one target task."""

    __slots__ = ("target", "batch", "runs", "run_count", "group", "group_parent", "group_anchors", "nbytes",
                 "nsized", "sized_at_emit")

    def __init__(self, target: int) -> None:
        self.target = target
        self.batch: list[Tuple] = []
        # Whole ``emit_many``s kept as columns (``topo.api.Run``), each placed among the single
        # tuples of ``batch`` by its ``at``; they travel as one ``TupleBatch`` when ``batch``
        # is empty at the flush. Towards another worker a bolt's single emits under batch
        # granularity are kept as runs too (``add_one``). Only lanes no router can retarget
        # get runs (autoscaling and send windows read ``batch``), so everything outside the
        # outbox sees tuples.
        self.runs: list[Run] = []
        self.run_count = 0
        # Wire bytes of the batch's tuples already sized when emitted (a whole ``emit_many``
        # into this one lane), and how many they are: all of them spares the flush a pass.
        self.nbytes = 0
        self.nsized = 0
        self.sized_at_emit = True    # False towards another worker: its queue packs the batch once
        # Batch granularity: the ack group this lane's tuples of ``group_parent`` join
        # until the next flush (then None), and its anchors (root -> the group's edge id).
        self.group: AckGroup | None = None
        self.group_parent: list[int] | None = None
        self.group_anchors: dict[int, int] | None = None

    def open_group(self, parent: list[int], roots: Iterable[int], getrandbits: Callable[[int], int]) -> AckGroup:
        """A new group of this lane under ``parent`` (an ack cell): its edge id is XORed
        into the parent's cell once, whatever the number of tuples it will hold."""
        edge = getrandbits(64) or 1
        parent[0] ^= edge
        self.group = g = new_group(edge)
        self.group_parent = parent
        self.group_anchors = dict.fromkeys(roots, edge)
        return g

    def add_sized(self, values_list: Sequence[Sequence[Any]], pack: Callable[[Any], bytes]) -> None:
        """Size a whole ``emit_many`` into this lane now, from the list the emit was given
        (an unencodable value is left for the flush, whose error names it)."""
        if not self.sized_at_emit:
            return
        n = len(values_list)
        try:
            if type(values_list) is Columns:     # each column packed alone, each row's header added
                self.nbytes += columns_wire_bytes([pack(c) for c in values_list.columns], n)
            else:
                self.nbytes += len(pack(values_list)) - array_header_len(n)
        except (TypeError, ValueError, OverflowError):
            return
        self.nsized += n

    def add_run(self, values: list[Sequence[Any]] | Columns, origin: Origin, anchors: dict[int, int] | None, born: float,
                cell: AckGroup | None) -> None:
        """Keep ``values`` (a list the lane now owns) as one run; it extends the last run
        when nothing else came between them and they share everything but their values."""
        if not values:
            return
        runs = self.runs
        at = len(self.batch)
        self.run_count += len(values)
        if runs:
            last = runs[-1]
            if (last[5] == at and last[1] is origin and last[2] is anchors and last[4] is cell and last[3] == born
                    and type(values) is list and type(last[0]) is list):
                last[0] += values
                return
        runs.append([values, origin, anchors, born, cell, at])

    def add_one(self, values: Sequence[Any], origin: Origin, anchors: dict[int, int] | None, born: float,
                cell: AckGroup | None) -> None:
        """One emit's ``values`` as a run (a lane towards another worker: no tuple object is
        made, the queue packs the runs whole): it extends the last run when nothing came
        between them and they share everything but their values."""
        runs = self.runs
        self.run_count += 1
        if runs:
            last = runs[-1]
            if (last[4] is cell and last[1] is origin and last[5] == len(self.batch) and last[3] == born
                    and type(last[0]) is list):
                last[0].append(values)
                return
        runs.append([[values], origin, anchors, born, cell, len(self.batch)])

    def take(self) -> list[Tuple] | TupleBatch:
        """Everything pending in this lane, in emission order, and the lane emptied: a
        ``TupleBatch`` when it holds only runs, else a list of tuples."""
        batch, runs = self.batch, self.runs
        self.batch = []
        if not runs:
            return batch
        n = len(batch) + self.run_count
        self.runs = []
        self.run_count = 0
        return interleave(batch, runs) if batch else TupleBatch(runs, n)

    def join(self, parent: list[int], roots: Iterable[int], getrandbits: Callable[[int], int]) -> AckGroup:
        """The group a tuple of this lane under ``parent`` joins (a new one after a flush or
        when the parent changed), counted one tuple larger."""
        g = self.group
        if g is None or self.group_parent is not parent:
            g = self.open_group(parent, roots, getrandbits)
        g[1] += 1
        return g


# One subscriber of a stream: (broadcast, the lanes of its targets, its router's select).
Route = tuple[bool, list[Lane], Callable[[Sequence[Any]], int]]
# emit(values, born) for untracked tuples.
UntrackedEmit = Callable[[Sequence[Any], float], None]
# emit(values, roots, parents, born, getrandbits) -> XOR of new edge ids, for tracked ones;
# ``roots`` is any iterable of root ids (an anchors dict works: its keys are the roots).
TrackedEmit = Callable[[Sequence[Any], Sequence[int], Sequence[Tuple] | None, float, Callable[[int], int]], int]
# The same for a list of values in one call (``emit_many``): one tuple per values.
UntrackedEmitMany = Callable[[Sequence[Sequence[Any]], float], None]
TrackedEmitMany = Callable[[Sequence[Sequence[Any]], Sequence[int], Sequence[Tuple] | None, float,
                            Callable[[int], int]], int]
# ... and anchored one by one: emit_each(values_list, parents, getrandbits), parents[i] the
# parent of values_list[i].
TrackedEmitEach = Callable[[Sequence[Sequence[Any]], Sequence[Tuple], Callable[[int], int]], None]
# Batch granularity: emit(values, parent, roots, born, getrandbits) puts the tuple in its
# lane's ack group under ``parent`` (the ack cell of the input, or of a spout batch) ...
GroupedEmit = Callable[[Sequence[Any], list, Iterable[int], float, Callable[[int], int]], None]
# ... and the same for a whole values list under one parent.
GroupedEmitMany = Callable[[Sequence[Sequence[Any]], list, Iterable[int], float, Callable[[int], int]], None]
# emit_runs(values_list, parents, counts, getrandbits): ``counts[i]`` values in a row under
# ``parents[i]``, each parent's in one ack group per lane.
GroupedEmitRuns = Callable[[Sequence[Sequence[Any]], Sequence[Tuple], Sequence[int], Callable[[int], int]], None]


class Outbox:
    """Pending lanes of one task, and the per-stream emit functions that fill them."""

    def __init__(self, component: str, task_id: int, streams: dict[str, StreamRoutes],
                 queues: dict[int, ByteQueue], batch_size: int, flush_interval_s: float) -> None:
        self.component = component
        self.task_id = task_id
        self.streams = streams
        self.queues = queues
        self.batch_size = batch_size
        self.flush_interval_s = flush_interval_s
        self.lanes: dict[int, Lane] = {}
        self._router_lanes: dict[int, list[Lane]] = {}   # one list per router, shared by its emits
        self.pending_count = 0
        self.last_flush_at = time.monotonic()
        self._background: asyncio.Future[int] | None = None   # a flush_soon under way
        # Send windows (document 002): how many of each lane's tuples may go now (target ->
        # count; a target absent: all); the rest wait in their lane. None: everything goes.
        self.gate: Callable[[Outbox], dict[int, int]] | None = None
        self._pack = msgpack.Packer(autoreset=True).pack
        self.untracked: dict[str, UntrackedEmit] = {}
        self.tracked: dict[str, TrackedEmit] = {}
        self.untracked_many: dict[str, UntrackedEmitMany] = {}
        self.tracked_many: dict[str, TrackedEmitMany] = {}
        self.tracked_each: dict[str, TrackedEmitEach] = {}
        self.grouped: dict[str, GroupedEmit] = {}
        self.grouped_many: dict[str, GroupedEmitMany] = {}
        self.grouped_runs: dict[str, GroupedEmitRuns] = {}    # (streams with one subscriber)
        # Called before any batch leaves (a spout under batch granularity closes its batch).
        self.before_flush: Callable[[], None] | None = None
        for stream, routes in streams.items():
            self.untracked[stream] = self._make_untracked(stream, routes)
            self.tracked[stream] = self._make_tracked(stream, routes)
            self.untracked_many[stream] = self._make_untracked_many(stream, routes)
            self.tracked_many[stream] = self._make_tracked_many(stream, routes)
            self.tracked_each[stream] = self._make_tracked_each(stream, routes)
            self.grouped[stream] = self._make_grouped(stream, routes)
            self.grouped_many[stream] = self._make_grouped_many(stream, routes)
            runs = self._make_grouped_runs(stream, routes)
            if runs is not None:
                self.grouped_runs[stream] = runs

    def _lane(self, target: int) -> Lane:
        lane = self.lanes.get(target)
        if lane is None:
            lane = self.lanes[target] = Lane(target)
            lane.sized_at_emit = not hasattr(self.queues.get(target), "put_packing")
        return lane

    def _lanes_of(self, router: Router) -> list[Lane]:
        """The lanes of a router's targets: one list, which ``retarget`` changes in place."""
        lanes = self._router_lanes.get(id(router))
        if lanes is None:
            lanes = self._router_lanes[id(router)] = [self._lane(t) for t in router.targets]
        return lanes

    def retarget(self, router: Router) -> None:
        """After ``router.retarget`` (autoscaling): its lanes follow its targets; a lane no
        router uses any more goes once it is empty (the engine drained it first)."""
        self._lanes_of(router)[:] = [self._lane(t) for t in router.targets]
        for lane in self.lanes.values():     # tuples may have moved between lanes: size at the flush
            lane.nsized = _NEVER
        used = {lane.target for lanes in self._router_lanes.values() for lane in lanes}
        for t in [t for t, lane in self.lanes.items() if t not in used and not lane.batch]:
            del self.lanes[t]

    def size_of(self, values: Sequence[Any], stream: str) -> int:
        """Wire size of one tuple's ``values``; a clear error naming component and field if unencodable."""
        fields = self.streams[stream].fields.names
        if len(values) != len(fields):
            raise self.arity_error(values, stream)
        try:
            return len(self._pack(values))
        except (TypeError, ValueError, OverflowError):
            raise encoding_error(self.component, stream, values, fields, self._pack) from None

    def unknown_stream(self, stream: str) -> EmitError:
        return unknown_stream_error(self.component, stream, list(self.streams))

    def arity_error(self, values: Sequence[Any], stream: str) -> EmitError:
        return arity_error(self.component, stream, values, self.streams[stream].fields.names)

    def single_route(self, stream: str) -> tuple[Origin, int, list[Lane], Callable[[Sequence[Any]], int],
                                                 Lane | None] | None:
        """For a stream with exactly one non-broadcast subscriber: what an inlined emit needs
        (origin, field count, lanes, the router's ``select``, and the one lane when the
        subscriber has one task for good: no ``select`` call then); None otherwise."""
        routes = self.streams.get(stream)
        if routes is None or len(routes.routers) != 1 or routes.routers[0].broadcast:
            return None
        router = routes.routers[0]
        origin = Origin(routes.fields, stream, self.component, self.task_id)
        lanes = self._lanes_of(router)
        only = lanes[0] if len(lanes) == 1 and router.retarget is None else None
        return origin, len(routes.fields.names), lanes, router.select, only

    def _stream_parts(self, stream: str, routes: StreamRoutes) -> tuple[Origin, int, list[Route]]:
        """What every per-stream emit binds: the stream's origin, its field count, its routing plan."""
        origin = Origin(routes.fields, stream, self.component, self.task_id)
        return origin, len(routes.fields.names), self._plan(routes)

    def _plan(self, routes: StreamRoutes) -> list[Route]:
        return [(r.broadcast, self._lanes_of(r), r.select) for r in routes.routers]

    def _make_untracked(self, stream: str, routes: StreamRoutes) -> UntrackedEmit:
        origin, nfields, plan = self._stream_parts(stream, routes)
        arity_error = self.arity_error
        outbox = self
        if len(plan) == 1 and not plan[0][0]:
            _, lanes, select = plan[0]

            def emit_routed(values: Sequence[Any], born: float) -> None:
                if len(values) != nfields:
                    raise arity_error(values, stream)
                lanes[select(values)].batch.append(WireTuple((values, origin, None, born, None)))
                outbox.pending_count += 1

            return emit_routed

        if not plan:
            def emit_nowhere(values: Sequence[Any], born: float) -> None:
                """No component subscribes to this stream: checked, counted by the collector, dropped."""
                if len(values) != nfields:
                    raise arity_error(values, stream)

            return emit_nowhere

        def emit_general(values: Sequence[Any], born: float) -> None:
            if len(values) != nfields:
                raise arity_error(values, stream)
            tup = WireTuple((values, origin, None, born, None))
            n = 0
            for broadcast, lanes, select in plan:
                for lane in (lanes if broadcast else (lanes[select(values)],)):
                    lane.batch.append(tup)
                    n += 1
            outbox.pending_count += n

        return emit_general

    def _make_tracked(self, stream: str, routes: StreamRoutes) -> TrackedEmit:
        origin, nfields, plan = self._stream_parts(stream, routes)
        arity_error = self.arity_error
        outbox = self
        fromkeys = dict.fromkeys
        if len(plan) == 1 and not plan[0][0]:
            _, lanes, select = plan[0]

            only = lanes[0] if len(lanes) == 1 and routes.routers[0].retarget is None else None

            def emit_tracked_routed(values: Sequence[Any], roots: Sequence[int], parents: Sequence[Tuple] | None,
                                    born: float, getrandbits: Callable[[int], int]) -> int:
                if len(values) != nfields:
                    raise arity_error(values, stream)
                edge = getrandbits(64) or 1
                (only if only is not None else lanes[select(values)]).batch.append(
                    WireTuple((values, origin, fromkeys(roots, edge), born, [0])))
                outbox.pending_count += 1
                if parents:
                    for p in parents:
                        p.ackcell[0] ^= edge
                return edge

            return emit_tracked_routed

        def emit_tracked(values: Sequence[Any], roots: Sequence[int], parents: Sequence[Tuple] | None,
                         born: float, getrandbits: Callable[[int], int]) -> int:
            """Every edge (tuple x target) gets its own id in the XOR ledger."""
            if len(values) != nfields:
                raise arity_error(values, stream)
            edges = 0
            for broadcast, lanes, select in plan:
                for lane in (lanes if broadcast else (lanes[select(values)],)):
                    edge = getrandbits(64) or 1
                    edges ^= edge
                    lane.batch.append(WireTuple((values, origin, fromkeys(roots, edge), born, [0])))
                    outbox.pending_count += 1
                    if parents:
                        for p in parents:
                            p.ackcell[0] ^= edge
            return edges

        return emit_tracked

    def _arity_check(self, stream: str, nfields: int) -> Callable[[Sequence[Sequence[Any]]], None]:
        """For ``emit_many``: every values of a list has one value per field (one C-speed
        pass over the lengths; the error names the first that has not)."""
        arity_error = self.arity_error

        def check(values_list: Sequence[Sequence[Any]]) -> None:
            if type(values_list) is Columns:
                if len(values_list.columns) == nfields or not len(values_list):
                    return
                raise arity_error(values_list[0], stream)
            try:
                lengths = list(map(len, values_list))
                if lengths.count(nfields) == len(lengths):   # (count compares small ints by identity)
                    return
            except TypeError:
                pass
            for values in values_list:
                if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or len(values) != nfields:
                    raise arity_error(values, stream)

        return check

    def _single(self, stream: str, routes: StreamRoutes) -> tuple[list[Lane], Callable[[Sequence[Any]], int],
                                                                  Origin, Callable[..., None]] | None:
        """What an ``emit_many`` of a stream with one non-broadcast subscriber inlines (its
        lanes, the router's ``select``, the origin, the arity check); None otherwise."""
        plan = self._plan(routes)
        if len(plan) != 1 or plan[0][0]:
            return None
        origin = Origin(routes.fields, stream, self.component, self.task_id)
        return plan[0][1], plan[0][2], origin, self._arity_check(stream, len(routes.fields.names))

    @staticmethod
    def _select_many(routes: StreamRoutes) -> Callable[[Sequence[Sequence[Any]]], Iterable[int]]:
        """The one router's ``select`` of a whole values list (see ``Router.select_many``)."""
        router = routes.routers[0]
        if router.select_many is not None:
            return router.select_many
        select = router.select
        return lambda values_list: map(select, values_list)

    def _make_untracked_many(self, stream: str, routes: StreamRoutes) -> UntrackedEmitMany:
        """``emit_many`` untracked: the tuples made by C code when one target takes them all."""
        one_by_one = self.untracked[stream]
        single = self._single(stream, routes)
        if single is None:
            def emit_many_general(values_list: Sequence[Sequence[Any]], born: float) -> None:
                for values in values_list:
                    one_by_one(values, born)

            return emit_many_general
        lanes, select, origin, check = single
        select_many = self._select_many(routes)
        outbox = self
        consume = deque(maxlen=0).extend    # runs an iterator to its end, keeping nothing
        pack = self._pack
        columns = routes.routers[0].retarget is None

        def emit_many_routed(values_list: Sequence[Sequence[Any]], born: float) -> None:
            check(values_list)
            if len(lanes) == 1:     # maps over zips: no Python loop per tuple
                parts: Iterable[tuple[Lane, Sequence[Sequence[Any]]]] = ((lanes[0], values_list),)
                if columns:         # one run: the caller keeps its list, the lane a copy
                    lane = lanes[0]
                    lane.add_sized(values_list, pack)
                    lane.add_run(_own(values_list), origin, None, born, None)
                    outbox.pending_count += len(values_list)
                    return
            elif len(lanes) <= _PARTITION_LANES:   # each lane's share picked out by C-level maps
                parts = _partition(lanes, values_list, select_many(values_list))
            else:                   # each tuple appended to its lane's batch, by C-level maps too
                tuples = map(WireTuple, zip(values_list, repeat(origin), repeat(None), repeat(born), repeat(None)))
                appends = [lane.batch.append for lane in lanes]
                consume(map(call, map(appends.__getitem__, select_many(values_list)), tuples))
                parts = ()
            for lane, part in parts:
                lane.add_sized(part, pack)
                if columns:         # (a part is a new list)
                    lane.add_run(part, origin, None, born, None)    # type: ignore[arg-type]
                else:
                    lane.batch += map(WireTuple, zip(part, repeat(origin), repeat(None), repeat(born), repeat(None)))
            outbox.pending_count += len(values_list)

        return emit_many_routed

    def _make_tracked_many(self, stream: str, routes: StreamRoutes) -> TrackedEmitMany:
        """``emit_many`` tracked: a fresh edge id per tuple, their XOR into the parents once."""
        one_by_one = self.tracked[stream]
        single = self._single(stream, routes)
        if single is None:
            def emit_many_general(values_list: Sequence[Sequence[Any]], roots: Sequence[int],
                                  parents: Sequence[Tuple] | None, born: float,
                                  getrandbits: Callable[[int], int]) -> int:
                edges = 0
                for values in values_list:
                    edges ^= one_by_one(values, roots, parents, born, getrandbits)
                return edges

            return emit_many_general
        lanes, select, origin, check = single
        outbox = self
        fromkeys = dict.fromkeys

        def emit_many_routed(values_list: Sequence[Sequence[Any]], roots: Sequence[int],
                             parents: Sequence[Tuple] | None, born: float,
                             getrandbits: Callable[[int], int]) -> int:
            check(values_list)
            edges = 0
            only = lanes[0].batch.append if len(lanes) == 1 else None
            for v in values_list:
                edge = getrandbits(64) or 1
                edges ^= edge
                (only or lanes[select(v)].batch.append)(WireTuple((v, origin, fromkeys(roots, edge), born, [0])))
            outbox.pending_count += len(values_list)
            if parents:
                for p in parents:
                    p.ackcell[0] ^= edges
            return edges

        return emit_many_routed

    def _make_tracked_each(self, stream: str, routes: StreamRoutes) -> TrackedEmitEach:
        """``emit_many`` with one parent per values (``anchor_each``): each tuple gets a fresh
        edge id under its own parent's roots; a values whose parent is untracked goes untracked."""
        tracked, untracked = self.tracked[stream], self.untracked[stream]
        single = self._single(stream, routes)
        if single is None:
            def emit_each_general(values_list: Sequence[Sequence[Any]], parents: Sequence[Tuple],
                                  getrandbits: Callable[[int], int]) -> None:
                for values, p in zip(values_list, parents):
                    if p.anchors:
                        tracked(values, p.anchors, (p,), p.born, getrandbits)
                    else:
                        untracked(values, 0.0)

            return emit_each_general
        lanes, select, origin, check = single
        outbox = self
        fromkeys = dict.fromkeys

        def emit_each_routed(values_list: Sequence[Sequence[Any]], parents: Sequence[Tuple],
                             getrandbits: Callable[[int], int]) -> None:
            check(values_list)
            only = lanes[0].batch.append if len(lanes) == 1 else None
            for v, p in zip(values_list, parents):
                roots = p.anchors
                if roots:
                    edge = getrandbits(64) or 1
                    p.ackcell[0] ^= edge
                    t = WireTuple((v, origin, fromkeys(roots, edge), p.born, [0]))
                else:
                    t = WireTuple((v, origin, None, 0.0, None))
                (only or lanes[select(v)].batch.append)(t)
            outbox.pending_count += len(values_list)

        return emit_each_routed

    def _make_grouped(self, stream: str, routes: StreamRoutes) -> GroupedEmit:
        """Batch granularity's emit: the tuple joins its lane's current group under
        ``parent`` (a new group when the parent changed or the lane was flushed)."""
        origin, nfields, plan = self._stream_parts(stream, routes)
        arity_error = self.arity_error
        outbox = self
        if len(plan) == 1 and not plan[0][0]:
            _, lanes, select = plan[0]

            def emit_grouped_routed(values: Sequence[Any], parent: list, roots: Iterable[int], born: float,
                                    getrandbits: Callable[[int], int]) -> None:
                if len(values) != nfields:
                    raise arity_error(values, stream)
                lane = lanes[select(values)]
                g = lane.group
                if g is None or lane.group_parent is not parent:
                    g = lane.open_group(parent, roots, getrandbits)
                g[1] += 1
                lane.batch.append(WireTuple((values, origin, lane.group_anchors, born, g)))
                outbox.pending_count += 1

            return emit_grouped_routed

        def emit_grouped(values: Sequence[Any], parent: list, roots: Iterable[int], born: float,
                         getrandbits: Callable[[int], int]) -> None:
            if len(values) != nfields:
                raise arity_error(values, stream)
            for broadcast, lanes, select in plan:
                for lane in (lanes if broadcast else (lanes[select(values)],)):
                    g = lane.join(parent, roots, getrandbits)
                    lane.batch.append(WireTuple((values, origin, lane.group_anchors, born, g)))
                    outbox.pending_count += 1

        return emit_grouped

    def _make_grouped_many(self, stream: str, routes: StreamRoutes) -> GroupedEmitMany:
        """Batch granularity's ``emit_many`` under one parent: one group per lane reached,
        the tuples made and appended by C-level maps."""
        one_by_one = self.grouped[stream]
        single = self._single(stream, routes)
        if single is None:
            def emit_many_general(values_list: Sequence[Sequence[Any]], parent: list, roots: Iterable[int],
                                  born: float, getrandbits: Callable[[int], int]) -> None:
                for values in values_list:
                    one_by_one(values, parent, roots, born, getrandbits)

            return emit_many_general
        lanes, select, origin, check = single
        select_many = self._select_many(routes)
        outbox = self
        roots_list = list   # (roots may be an iterator: read once)
        pack = self._pack
        columns = routes.routers[0].retarget is None

        def emit_many_grouped(values_list: Sequence[Sequence[Any]], parent: list, roots: Iterable[int],
                              born: float, getrandbits: Callable[[int], int]) -> None:
            n = len(values_list)
            if not n:
                return
            check(values_list)
            roots = roots_list(roots)
            if len(lanes) == 1:
                parts: Iterable[tuple[Lane, Any]] = ((lanes[0], _own(values_list)),)   # (a part: its own list)
            else:
                parts = _partition(lanes, values_list, select_many(values_list))
            for lane, part in parts:      # one group per lane reached
                lane.add_sized(part, pack)
                g = lane.join(parent, roots, getrandbits)
                g[1] += len(part) - 1
                if columns:
                    lane.add_run(part, origin, lane.group_anchors, born, g)   # type: ignore[arg-type]
                else:
                    lane.batch += map(WireTuple, zip(part, repeat(origin), repeat(lane.group_anchors),
                                                     repeat(born), repeat(g)))
            outbox.pending_count += n

        return emit_many_grouped

    def _make_grouped_runs(self, stream: str, routes: StreamRoutes) -> GroupedEmitRuns | None:
        """``emit_many`` of values each under its own parent, in runs (``anchor_each`` of a
        batch of inputs): one ack group per parent and lane reached, as the grouped emit of
        each values would make them, with the tuples made by C-level maps and a Python step
        per group, not per values. A parent with no roots sends its values untracked. For a
        stream with one non-broadcast subscriber; None otherwise."""
        single = self._single(stream, routes)
        if single is None:
            return None
        lanes, select, origin, check = single
        select_many = self._select_many(routes)
        outbox = self
        fromkeys = dict.fromkeys

        def emit_runs(values_list: Sequence[Sequence[Any]], parents: Sequence[Tuple], counts: Sequence[int],
                      getrandbits: Callable[[int], int]) -> None:
            n = len(values_list)
            if not n:
                return
            check(values_list)
            rows = list(values_list)
            cells = list(map(_ackcell, parents))
            bounds = stretch_bounds(cells)
            if len(bounds) <= len(cells):
                # Neighbours that share a cell (inputs of one ack group) share their groups
                # too, as each values' grouped emit would join them: one run.
                counts = [sum(counts[a:b]) for a, b in zip(bounds, bounds[1:])]
                parents = [parents[i] for i in bounds[:-1]]
            owners = list(_spread(range(len(parents)), counts))     # each values' parent, by index
            if len(lanes) == 1:
                parts = [(lanes[0], rows, owners)]
            else:
                targets = list(select_many(values_list))
                parts = []
                for i in sorted(set(targets)):
                    mask = list(map(eq, targets, repeat(i)))
                    parts.append((lanes[i], list(compress(rows, mask)), list(compress(owners, mask))))
            for lane, part, part_owners in parts:
                bounds = stretch_bounds(part_owners, ne)
                sizes = stretch_lengths(bounds)
                anchors_of, born_of, cell_of = [], [], []
                for at, size in zip(bounds, sizes):
                    p = parents[part_owners[at]]
                    roots = p.anchors
                    if roots:
                        edge = getrandbits(64) or 1
                        p.ackcell[0] ^= edge       # (the group's edge, once per parent and lane)
                        anchors_of.append(fromkeys(roots, edge))
                        born_of.append(p.born)
                        cell_of.append(new_group(edge, size))
                    else:
                        anchors_of.append(None)
                        born_of.append(0.0)
                        cell_of.append(None)
                lane.batch += map(WireTuple, zip(part, repeat(origin), _spread(anchors_of, sizes),
                                                 _spread(born_of, sizes), _spread(cell_of, sizes)))
            outbox.pending_count += n

        return emit_runs

    def due(self) -> bool:
        """Whether pending batches should go now: a full batch, or the interval has passed."""
        n = self.pending_count
        return n >= self.batch_size or (n > 0 and time.monotonic() - self.last_flush_at >= self.flush_interval_s)

    def batch_bytes(self, batch: list[Tuple] | TupleBatch) -> int:
        """Wire size of a batch: the sum of its tuples' msgpack lengths, exactly.

        One ``pack`` of the list of value lists, less the array header msgpack puts
        in front (an array encodes as header + its elements' encodings), costs far
        less than packing each tuple. When a value cannot be encoded the tuples are
        sized one by one so the error names the culprit's component and field.
        """
        values = batch.values() if type(batch) is TupleBatch else [t.values for t in batch]
        try:
            return len(self._pack(values)) - array_header_len(len(values))
        except (TypeError, ValueError, OverflowError):
            return sum(self.size_of(t.values, t.origin.stream) for t in batch)

    async def flush(self) -> int:
        """Send every pending batch; returns nanoseconds spent waiting for queue room.

        A background flush (``flush_soon``) may be under way when the task flushes: the
        task waits for it first, so batches to one target keep their order. (The task's
        own flushes never overlap each other, and a background flush is started only
        while the task is inside a user call, never while it flushes.)
        """
        if self._background is not None:
            await asyncio.shield(self._background)
        self.last_flush_at = time.monotonic()
        if self.before_flush is not None:
            self.before_flush()
        if not self.pending_count:
            return 0
        return await self._flush()

    def flush_soon(self) -> None:
        """A flush from outside the task's own loop: its task is busy inside a user call
        (an async ``next_tuple`` that waits) while a partial batch is due."""
        if self.pending_count and self._background is None:
            if self.before_flush is not None:
                self.before_flush()
            self._background = asyncio.ensure_future(self._flush_in_background())

    async def _flush_in_background(self) -> int:
        try:
            self.last_flush_at = time.monotonic()
            return await self._flush()
        finally:
            self._background = None

    async def _flush(self) -> int:
        """Every lane's batch is taken before the first wait, so what is emitted meanwhile
        (a spout's async call during a background flush) waits for the next flush, and
        every ack group is complete before its first tuple leaves."""
        admitted = None
        if self.gate is not None:
            for lane in self.lanes.values():     # the gate reads (and moves) single tuples
                if lane.runs:
                    lane.batch = list(lane.take())
            admitted = self.gate(self)
        self.pending_count = 0
        sends: list[tuple[int, list[Tuple] | TupleBatch, int | None]] = []
        for lane in list(self.lanes.values()):
            lane.group = lane.group_parent = lane.group_anchors = None
            sized = lane.nbytes if lane.nsized == len(lane.batch) + lane.run_count else None
            lane.nbytes = lane.nsized = 0
            batch = lane.take()
            if batch:
                if admitted is not None and admitted.get(lane.target, len(batch)) < len(batch):
                    k = admitted[lane.target]
                    lane.batch = batch[k:]               # waits for room in its send window
                    self.pending_count += len(lane.batch)
                    batch = batch[:k]
                    sized = None
                    if not batch:
                        continue
                sends.append((lane.target, batch, sized))
        waited = 0
        queues = self.queues
        for target, batch, sized in sends:
            queue = queues[target]
            if sized is None and hasattr(queue, "put_packing"):     # another worker's task
                w = await queue.put_packing(batch)
                if w is not None:
                    waited += w
                    continue
            nbytes = self.batch_bytes(batch) if sized is None else sized
            if nbytes <= queue.hard_bound:
                waited += await queue.put(batch, nbytes)
            else:
                for piece, piece_bytes in self._split(batch, queue.hard_bound):
                    waited += await queue.put(piece, piece_bytes)
        return waited

    def _split(self, batch: list[Tuple], bound: int) -> list[tuple[list[Tuple], int]]:
        """A batch larger than the target's hard bound, cut into pieces that each fit it.

        A queue admits a piece into any room it has and a whole piece into an empty
        queue, so with pieces no larger than the bound a queue's bytes never pass it;
        a single tuple larger than the bound travels alone and enters only an empty
        queue, so the bound is then exceeded by less than that one tuple.
        """
        pieces: list[tuple[list[Tuple], int]] = []
        piece: list[Tuple] = []
        piece_bytes = 0
        for t in batch:
            n = self.size_of(t.values, t.origin.stream)
            if piece and piece_bytes + n > bound:
                pieces.append((piece, piece_bytes))
                piece, piece_bytes = [], 0
            piece.append(t)
            piece_bytes += n
        if piece:
            pieces.append((piece, piece_bytes))
        return pieces


_PARTITION_LANES = 8   # up to this many lanes an emit_many picks each lane's share in its own pass


def _partition(lanes: list[Lane], values_list: Sequence[Sequence[Any]],
               targets: Iterable[int]) -> list[tuple[Lane, list[Sequence[Any]] | Columns]]:
    """Each reached lane with its share of ``values_list`` (``targets[i]``: the lane index of
    ``values_list[i]``), in order, one C-level pass per lane (and per column of ``Columns``,
    whose share is ``Columns`` again: no row is kept)."""
    targets = list(targets)
    if len(lanes) == 2:
        ones = _pick(values_list, targets)
        zeros = _pick(values_list, list(map(not_, targets)))
        return [(lane, part) for lane, part in ((lanes[0], zeros), (lanes[1], ones)) if part]
    out = []
    for i in set(targets):
        out.append((lanes[i], _pick(values_list, list(map(eq, targets, repeat(i))))))
    return out


def _pick(values_list: Sequence[Sequence[Any]], mask: list[Any]) -> list[Sequence[Any]] | Columns:
    """The values whose ``mask`` entry is true, as a new list (or new ``Columns``)."""
    if type(values_list) is Columns:
        return Columns(*[list(compress(c, mask)) for c in values_list.columns])
    return list(compress(values_list, mask))


_ackcell = attrgetter("ackcell")


def _spread(items: Iterable[Any], counts: Iterable[int]) -> Iterable[Any]:
    """Each of ``items`` repeated its count of times, in order (C-level)."""
    return chain.from_iterable(map(repeat, items, counts))


def _own(values_list: Sequence[Sequence[Any]]) -> list[Sequence[Any]] | Columns:
    """A copy of an emitted values list that the lane keeps (the caller may reuse its own)."""
    return values_list.copy() if type(values_list) is Columns else list(values_list)


_NEVER = -(1 << 62)    # a lane's ``nsized`` that no batch length can equal


def array_header_len(n: int) -> int:
    """Bytes of msgpack's array header for ``n`` elements (fixarray, array 16, array 32)."""
    return 1 if n < 16 else 3 if n < 0x10000 else 5


def columns_wire_bytes(packed: Sequence[bytes], rows: int) -> int:
    """Wire size of ``rows`` tuples given as columns, each column packed alone: what packing
    each row would give (the columns' encodings less their array headers, plus one row header
    each), so the byte bound counts ``Columns`` as it counts rows."""
    return sum(map(len, packed)) - len(packed) * array_header_len(rows) + rows * array_header_len(len(packed))
