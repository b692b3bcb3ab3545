"""The collectors spouts and bolts emit, ack and fail through (Storm's output collectors).

Each collector's ``emit`` is one closure built per task at start, over the
outbox's per-stream emit functions (``Outbox.untracked`` / ``Outbox.tracked`` /
``Outbox.grouped``) and, with acking on, the acker's ``open`` / ``ack``. The common
case (the default stream with one subscriber; for a bolt with acking on, anchored to
the input it executes) is inlined into a single flat function, acking off or on,
since it is the innermost call of every topology. Every emit mistake raises
``topo.api.EmitError``.
"""
from __future__ import annotations

import time
from itertools import repeat
from operator import attrgetter
from typing import Any, Callable, Sequence

from topo.api import DEFAULT_STREAM, EmitError, Repeated, Tuple, WireTuple
from runtime.local.acker import GROUP_CELL, Acker, Outcome
from runtime.local.outbox import Outbox
from runtime.local.stretches import stretch_bounds, stretch_lengths
from runtime.observe.stats import TaskStats

_cell = attrgetter("ackcell")

# What a spout task keeps of each tracked root for replay: a plain tuple, made per emit.
# (msg_id, values, stream, retries, born)
Pending = tuple


def untracked_emit(outbox: Outbox, counter: Any, msg_ids: list[Any] | None) -> Callable[..., None]:
    """A collector's whole ``emit`` for untracked tuples, default stream inlined.

    ``counter.emitted`` counts emits. Spouts pass ``msg_ids``, where each emit's
    ``msg_id`` is collected for Storm's immediate ack of untracked tuples; bolts
    pass None and the third argument (their ``anchors``) means nothing untracked.
    """
    untracked = outbox.untracked
    unknown = outbox.unknown_stream
    single = outbox.single_route(DEFAULT_STREAM)
    if single is None:
        def emit_dispatch(values: Sequence[Any], stream: str = DEFAULT_STREAM, msg_id: Any = None,
                          anchors: Any = None) -> None:
            counter.emitted += 1
            f = untracked.get(stream)
            if f is None:
                raise unknown(stream)
            f(values, 0.0)
            if msg_id is not None and msg_ids is not None:
                msg_ids.append(msg_id)

        return emit_dispatch
    origin, nfields, lanes, select, only = single
    arity_error = outbox.arity_error

    def emit(values: Sequence[Any], stream: str = DEFAULT_STREAM, msg_id: Any = None,
             anchors: Any = None) -> None:
        counter.emitted += 1
        if stream != DEFAULT_STREAM:
            f = untracked.get(stream)
            if f is None:
                raise unknown(stream)
            f(values, 0.0)
        else:
            if len(values) != nfields:
                raise arity_error(values, DEFAULT_STREAM)
            (only or lanes[select(values)]).batch.append(WireTuple((values, origin, None, 0.0, None)))
            outbox.pending_count += 1
        if msg_id is not None and msg_ids is not None:
            msg_ids.append(msg_id)

    return emit


def count_mismatch_error(component: str, values_list: Sequence[Any], others: Sequence[Any],
                         what: str) -> EmitError:
    """``emit_many`` given a list beside its values (``msg_ids``, ``anchor_each``) of another length."""
    return EmitError(f"component {component!r} called emit_many with {len(values_list)} values and "
                     f"{len(others)} {what} (one per values)")


def untracked_emit_many(outbox: Outbox, counter: Any, acks: list[Any] | None, *,
                        spout: bool) -> Callable[..., None]:
    """A collector's ``emit_many`` for untracked tuples; a spout's takes ``msg_ids`` (which
    ``acks`` collects, as ``untracked_emit``'s ``msg_ids`` does), a bolt's ``anchors``."""
    many = outbox.untracked_many
    unknown = outbox.unknown_stream

    def send(values_list: Sequence[Sequence[Any]], stream: str, beside: Sequence[Any] | None, what: str) -> None:
        f = many.get(stream)
        if f is None:
            raise unknown(stream)
        if beside is not None and len(beside) != len(values_list):
            raise count_mismatch_error(outbox.component, values_list, beside, what)
        f(values_list, 0.0)
        counter.emitted += len(values_list)

    def emit_many_bolt(values_list: Sequence[Sequence[Any]], stream: str = DEFAULT_STREAM,
                       anchors: Any = None, anchor_each: Sequence[Tuple] | None = None) -> None:
        send(values_list, stream, anchor_each, "anchor_each tuples")

    def emit_many_spout(values_list: Sequence[Sequence[Any]], stream: str = DEFAULT_STREAM,
                        msg_ids: Sequence[Any] | None = None) -> None:
        send(values_list, stream, msg_ids, "msg_ids")
        if msg_ids is not None and acks is not None:
            acks.extend(m for m in msg_ids if m is not None)

    return emit_many_spout if spout else emit_many_bolt


def spout_emit_many(outbox: Outbox, untracked_many: Callable[..., None],
                    tracked: Callable[[Sequence[Sequence[Any]], str, Sequence[Any]], None]) -> Callable[..., None]:
    """A spout's tracking ``emit_many``: without ``msg_ids`` untracked, with them (one per
    values, checked) through ``tracked(values_list, stream, msg_ids)``."""

    def emit_many(values_list: Sequence[Sequence[Any]], stream: str = DEFAULT_STREAM,
                  msg_ids: Sequence[Any] | None = None) -> None:
        if msg_ids is None:
            return untracked_many(values_list, stream)
        if len(msg_ids) != len(values_list):
            raise count_mismatch_error(outbox.component, values_list, msg_ids, "msg_ids")
        tracked(values_list, stream, msg_ids)

    return emit_many


def _runs(parents: Sequence[Tuple]) -> tuple[list[Tuple], list[int]]:
    """``parents`` as runs of one parent: each run's parent and length (C-level maps)."""
    parents = list(parents)
    bounds = stretch_bounds(parents)
    return [parents[i] for i in bounds[:-1]], stretch_lengths(bounds)


class SpoutBatch:
    """A spout batch under batch granularity: one root for every tracked tuple the spout
    emitted between two closes, kept for ``Spout.ack``/``fail`` of each and the replay."""

    __slots__ = ("root", "roots", "cell", "msg_ids", "values", "streams", "retries", "born")

    def __init__(self, root: int, retries: int, born: float) -> None:
        self.root = root
        self.roots = (root,)
        self.cell = [0]          # the XOR of its groups' edge ids: the root's first ledger value
        self.msg_ids: list[Any] = []
        self.values: list[Sequence[Any]] = []
        self.streams: list[str] = []
        self.retries = retries
        self.born = born


def _nothing(*args: Any) -> None:
    return None


def new_root(getrandbits: Callable[[int], int], acker: Acker) -> int:
    """A fresh root id; with workers its low byte names the worker whose acker owns it."""
    root = getrandbits(64) or 1
    if acker.forward_ack is not None:
        root = (root >> 8 << 8 | acker.root_tag) or 256
    return root


def emit_of(emits: dict[str, Callable[..., Any]], outbox: Outbox) -> Callable[[str], Callable[..., Any]]:
    """``emits[stream]``, an unknown stream being an ``EmitError``."""
    unknown = outbox.unknown_stream

    def of(stream: str) -> Callable[..., Any]:
        e = emits.get(stream)
        if e is None:
            raise unknown(stream)
        return e

    return of


def untracked_by_stream(outbox: Outbox) -> Callable[[Sequence[Any], str], None]:
    """Send ``values`` untracked on ``stream`` (an unknown stream is an ``EmitError``)."""
    untracked_of = emit_of(outbox.untracked, outbox)

    def send(values: Sequence[Any], stream: str) -> None:
        untracked_of(stream)(values, 0.0)

    return send


class SpoutCollector:
    """The collector a spout emits through (``SpoutOutputCollector``).

    ``emit(values, stream="default", msg_id=None)``: with acking off the flat
    untracked emit, with acking on the tracking one, where a tuple with a
    ``msg_id`` becomes a tracked root: its edges are opened in the acker and its
    values kept in ``pending`` for replay (``_retries`` is the engine's own argument
    when it replays).
    """

    __slots__ = ("emit", "emit_many", "emitted", "batch", "pending_tuples", "close_batch", "replay")

    def __init__(self, outbox: Outbox, *, acker: Acker | None, pending: dict[int, Any],
                 on_outcome: Outcome, getrandbits: Callable[[int], int],
                 untracked_acks: list[Any] | None, batches: bool = False) -> None:
        self.emitted = 0
        self.batch: SpoutBatch | None = None   # the spout batch open (batch granularity)
        self.pending_tuples = 0                # tracked tuples of the batches in ``pending``
        self.close_batch: Callable[[], None] = _nothing
        self.replay: Callable[[SpoutBatch], None] = _nothing
        untracked_many = untracked_emit_many(outbox, self, untracked_acks, spout=True)
        if acker is None:
            self.emit = untracked_emit(outbox, self, untracked_acks)
            self.emit_many = untracked_many
        elif batches:
            self._batch_emits(outbox, acker, pending, on_outcome, getrandbits, untracked_many)
        else:
            self.emit = emit = self._tracked_emit(outbox, acker, pending, on_outcome, getrandbits)

            def roots_one_by_one(values_list: Sequence[Sequence[Any]], stream: str, msg_ids: Sequence[Any]) -> None:
                """Tracked roots are opened one by one (each has its own ledger entry)."""
                for values, msg_id in zip(values_list, msg_ids):
                    emit(values, stream, msg_id)

            self.emit_many = spout_emit_many(outbox, untracked_many, roots_one_by_one)

    def _batch_emits(self, outbox: Outbox, acker: Acker, pending: dict[int, Any], on_outcome: Outcome,
                     getrandbits: Callable[[int], int], untracked_many: Callable[..., None]) -> None:
        """Batch granularity: every tracked emit joins the open spout batch (one root), whose
        tuples join their lanes' ack groups; ``close_batch`` opens the root in the acker
        (the spout task calls it after each round of ``next_tuple`` calls, and the outbox
        before any batch leaves)."""
        collector = self
        grouped = outbox.grouped
        grouped_of, grouped_many_of = emit_of(grouped, outbox), emit_of(outbox.grouped_many, outbox)
        send_untracked = untracked_by_stream(outbox)
        open_root = acker.open
        perf = time.perf_counter

        def start(retries: int) -> SpoutBatch:
            b = collector.batch = SpoutBatch(new_root(getrandbits, acker), retries, perf())
            return b

        def close_batch() -> None:
            b = collector.batch
            if b is not None:
                collector.batch = None
                pending[b.root] = b
                collector.pending_tuples += len(b.msg_ids)
                open_root(b.root, b.cell[0], on_outcome, b.born)

        def emit(values: Sequence[Any], stream: str = DEFAULT_STREAM, msg_id: Any = None) -> None:
            collector.emitted += 1
            if msg_id is None:
                return send_untracked(values, stream)
            e = grouped_of(stream)
            b = collector.batch or start(0)
            e(values, b.cell, b.roots, b.born, getrandbits)
            b.msg_ids.append(msg_id)
            b.values.append(values)
            b.streams.append(stream)

        def into_batch(values_list: Sequence[Sequence[Any]], stream: str, msg_ids: Sequence[Any]) -> None:
            e = grouped_many_of(stream)
            b = collector.batch or start(0)
            e(values_list, b.cell, b.roots, b.born, getrandbits)
            b.msg_ids += msg_ids
            b.values += values_list
            b.streams += repeat(stream, len(values_list))
            collector.emitted += len(values_list)

        def replay(old: SpoutBatch) -> None:
            """A failed batch sent again whole, as its own batch, one retry further."""
            close_batch()
            b = start(old.retries + 1)
            for values, stream, msg_id in zip(old.values, old.streams, old.msg_ids):
                grouped[stream](values, b.cell, b.roots, b.born, getrandbits)
                b.msg_ids.append(msg_id)
                b.values.append(values)
                b.streams.append(stream)
            collector.emitted += len(old.msg_ids)
            close_batch()

        self.emit, self.close_batch, self.replay = emit, close_batch, replay
        self.emit_many = spout_emit_many(outbox, untracked_many, into_batch)
        outbox.before_flush = close_batch

    def _tracked_emit(self, outbox: Outbox, acker: Acker, pending: dict[int, Pending], on_outcome: Outcome,
                      getrandbits: Callable[[int], int]) -> Callable[..., None]:
        collector = self
        tracked_of = emit_of(outbox.tracked, outbox)
        send_untracked = untracked_by_stream(outbox)
        open_root = acker.open
        perf = time.perf_counter

        def emit(values: Sequence[Any], stream: str = DEFAULT_STREAM, msg_id: Any = None,
                 _retries: int = 0) -> None:
            collector.emitted += 1
            if msg_id is None:
                return send_untracked(values, stream)
            e = tracked_of(stream)
            born = perf()  # also the acker's clock: one reading serves both
            root = new_root(getrandbits, acker)
            edges = e(values, (root,), None, born, getrandbits)
            pending[root] = (msg_id, values, stream, _retries, born)
            open_root(root, edges, on_outcome, born)

        single = outbox.single_route(DEFAULT_STREAM)
        if single is None:
            return emit
        origin, nfields, lanes, select, only = single
        arity_error = outbox.arity_error
        ledger, timeout_s = acker.ledger, acker.timeout_s
        tag = acker.root_tag if acker.forward_ack is not None else None

        def emit_inlined(values: Sequence[Any], stream: str = DEFAULT_STREAM, msg_id: Any = None,
                         _retries: int = 0) -> None:
            """The common case inlined: a tracked root on the default stream with one
            subscriber. What ``emit`` does through the outbox's tracked emit, ``new_root``
            and ``Acker.open``, in one call: the root's ledger entry is written as ``open``
            writes it (its one edge is never zero)."""
            if msg_id is None or stream != DEFAULT_STREAM:
                return emit(values, stream, msg_id, _retries)
            collector.emitted += 1
            if len(values) != nfields:
                raise arity_error(values, DEFAULT_STREAM)
            born = perf()
            root = getrandbits(64) or 1
            if tag is not None:
                root = (root >> 8 << 8 | tag) or 256
            edge = getrandbits(64) or 1
            (only or lanes[select(values)]).batch.append(WireTuple((values, origin, {root: edge}, born, [0])))
            outbox.pending_count += 1
            pending[root] = (msg_id, values, stream, _retries, born)
            ledger[root] = [edge, on_outcome, born + timeout_s]

        return emit_inlined


class BoltCollector:
    """The collector a bolt emits, acks and fails through (``OutputCollector``)."""

    __slots__ = ("_outbox", "_acker", "_stats", "_name", "_auto_anchor", "_getrandbits", "_untracked_many",
                 "emit", "emit_many", "emitted", "current", "on_loop")

    def __init__(self, outbox: Outbox, *, acker: Acker | None, stats: TaskStats, auto_anchor: bool,
                 getrandbits: Callable[[int], int], batches: bool = False) -> None:
        self._outbox = outbox
        self._acker = acker
        self._stats = stats
        self._name = stats.task_name
        self._auto_anchor = auto_anchor
        self._getrandbits = getrandbits
        self.emitted = 0
        self.current: Tuple | None = None  # the input being executed (auto-anchoring)
        # For a blocking bolt (execute on a worker thread): runs an ack/fail on the event
        # loop's thread, where the acker's ledger lives. Emits need no such care: they only
        # fill this task's own lanes, which its task does not touch while it awaits execute.
        self.on_loop: Callable[..., None] | None = None
        # emit(values, stream="default", anchors=None), bound per task like the spout's.
        self.emit = untracked_emit(outbox, self, None) if acker is None else self._one_parent_emit(batches)
        # emit_many(values_list, stream="default", anchors=None): msg ids are a spout's only.
        self._untracked_many = untracked_emit_many(outbox, self, None, spout=False)
        self.emit_many = (self._untracked_many if acker is None
                          else self._emit_many_grouped if batches else self._emit_many_tracked)

    def _one_parent_emit(self, batches: bool) -> Callable[..., None]:
        """Tracked emit with the common case first: anchored to one parent (the input being
        executed, or one named). It joins its lane's ack group under that parent where this
        bolt groups its edges (``batches``), else gets its own edge. Several parents: the
        general path."""
        collector = self
        emits = self._outbox.grouped if batches else self._outbox.tracked
        getrandbits = self._getrandbits
        general = self._emit_tracked
        auto = self._auto_anchor
        unknown = self._outbox.unknown_stream

        def emit(values: Sequence[Any], stream: str = DEFAULT_STREAM,
                 anchors: Tuple | Sequence[Tuple] | None = None) -> None:
            if anchors is None:
                parent = collector.current if auto else None
            elif isinstance(anchors, Tuple):
                parent = anchors
            else:
                parent = anchors[0] if len(anchors) == 1 else None
            if parent is not None:
                roots = parent.anchors
                if roots:
                    e = emits.get(stream)
                    if e is None:
                        raise unknown(stream)
                    collector.emitted += 1
                    if batches:
                        e(values, parent.ackcell, roots, parent.born, getrandbits)
                    else:
                        e(values, roots, (parent,), parent.born, getrandbits)
                    return
            general(values, stream, anchors)

        routes = self._outbox.streams.get(DEFAULT_STREAM)
        if routes is not None and not routes.routers:
            # No component subscribes to the default stream (a last bolt's running results): no
            # tuple leaves, so there is nothing to anchor or track; checked and counted, as untracked.
            nfields, arity = len(routes.fields.names), self._outbox.arity_error

            def emit_unsubscribed(values: Sequence[Any], stream: str = DEFAULT_STREAM,
                                  anchors: Tuple | Sequence[Tuple] | None = None) -> None:
                if stream == DEFAULT_STREAM and anchors is None:
                    if len(values) != nfields:
                        raise arity(values, DEFAULT_STREAM)
                    collector.emitted += 1
                    return
                emit(values, stream, anchors)

            return emit_unsubscribed
        single = self._outbox.single_route(DEFAULT_STREAM)
        if single is None or not auto:
            return emit
        origin, nfields, lanes, select, only = single
        arity_error = self._outbox.arity_error
        outbox = self._outbox
        fromkeys = dict.fromkeys

        if not batches:
            def emit_inlined(values: Sequence[Any], stream: str = DEFAULT_STREAM,
                             anchors: Tuple | Sequence[Tuple] | None = None) -> None:
                """The common case inlined: default stream, one subscriber, auto-anchored. The
                tuple gets its own edge, XORed into its parent's cell."""
                if anchors is None and stream == DEFAULT_STREAM:
                    cur = collector.current
                    if cur is not None:
                        roots = cur.anchors
                        if roots:
                            if len(values) != nfields:
                                raise arity_error(values, DEFAULT_STREAM)
                            edge = getrandbits(64) or 1
                            (only or lanes[select(values)]).batch.append(
                                WireTuple((values, origin, fromkeys(roots, edge), cur.born, [0])))
                            cur.ackcell[0] ^= edge
                            outbox.pending_count += 1
                            collector.emitted += 1
                            return
                emit(values, stream, anchors)

            return emit_inlined

        # Towards another worker a lane keeps its tuples as runs of values (no tuple object per
        # emit): its queue packs them whole. Only where no router can retarget the lane
        # (autoscaling and send windows read single tuples), so its lanes are the ones now.
        runs_ok = (outbox.streams[DEFAULT_STREAM].routers[0].retarget is None
                   and not all(lane.sized_at_emit for lane in lanes))

        # The input being executed and the fields its emits read, read once per input (a
        # tuple's fields are read through descriptors) and held while it is the current one.
        seen: Tuple | None = None
        roots: dict[int, int] | None = None
        parent: list[int] = [0]
        born = 0.0

        def emit_grouped_inlined(values: Sequence[Any], stream: str = DEFAULT_STREAM,
                                 anchors: Tuple | Sequence[Tuple] | None = None) -> None:
            """The common case inlined: default stream, one subscriber, auto-anchored. The
            tuple joins its lane's ack group under its parent (this bolt groups its edges:
            ``tasks.bolt_groups_edges``)."""
            nonlocal seen, roots, parent, born
            if anchors is None and stream == DEFAULT_STREAM:
                cur = collector.current
                if cur is not seen:
                    if cur is None:
                        return emit(values, stream, anchors)
                    seen, roots, parent, born = cur, cur.anchors, cur.ackcell, cur.born
                if roots:
                    if len(values) != nfields:
                        raise arity_error(values, DEFAULT_STREAM)
                    lane = only or lanes[select(values)]
                    g = lane.group
                    if g is None or lane.group_parent is not parent:
                        # ``Lane.open_group``, inlined: once per input and lane
                        edge = getrandbits(64) or 1
                        parent[0] ^= edge
                        lane.group = g = [0, 0, edge]
                        lane.group_parent = parent
                        lane.group_anchors = fromkeys(roots, edge)
                    g[1] += 1
                    if runs_ok and not lane.sized_at_emit:
                        lane.add_one(values, origin, lane.group_anchors, born, g)
                    else:
                        lane.batch.append(WireTuple((values, origin, lane.group_anchors, born, g)))
                    outbox.pending_count += 1
                    collector.emitted += 1
                    return
            emit(values, stream, anchors)

        return emit_grouped_inlined

    def _emit_many_grouped(self, values_list: Sequence[Sequence[Any]], stream: str = DEFAULT_STREAM,
                           anchors: Tuple | Sequence[Tuple] | None = None,
                           anchor_each: Sequence[Tuple] | None = None) -> None:
        """The grouped ``emit_many`` (every bolt under batch granularity; under tuple
        granularity where ``tasks.bolt_groups_edges`` says so): parents that all share one
        ack cell (one input, or inputs of one group: the usual batch) cost one group per
        lane; parents of several cells, one group per parent and lane."""
        if anchor_each is not None:
            if len(anchor_each) != len(values_list):
                raise count_mismatch_error(self._outbox.component, values_list, anchor_each, "anchor_each tuples")
            parents: Sequence[Tuple] = anchor_each
        elif anchors is None:
            cur = self.current if self._auto_anchor else None
            parents = () if cur is None else (cur,)
        else:
            parents = (anchors,) if isinstance(anchors, Tuple) else tuple(anchors)
        if parents:
            first = parents[0].ackcell
            # Each parent is checked once: a ``Repeated`` names each of its parents once.
            distinct = parents.present() if type(parents) is Repeated else parents
            if first is not None and (len(distinct) == 1 or (len(first) == GROUP_CELL and    # an ack group
                                                              list(map(_cell, distinct)).count(first) == len(distinct))):
                many = self._outbox.grouped_many.get(stream)
                if many is None:
                    raise self._outbox.unknown_stream(stream)
                p = parents[0]
                many(values_list, first, p.anchors, p.born, self._getrandbits)   # type: ignore[arg-type]
                self.emitted += len(values_list)
                return
        if anchor_each is not None and stream in self._outbox.grouped_runs:
            # Parents of several groups: each run of values under its parent, a group per
            # parent and lane (``Outbox._make_grouped_runs``); a ``Repeated`` names its runs.
            if type(anchor_each) is Repeated:
                items, counts = anchor_each.items, anchor_each.counts
            else:
                items, counts = _runs(anchor_each)
            self._outbox.grouped_runs[stream](values_list, items, counts, self._getrandbits)
            self.emitted += len(values_list)
            return
        if anchor_each is not None:      # (a stream of several subscribers) each values under its own parent
            one = self._outbox.grouped.get(stream)
            untracked = self._outbox.untracked.get(stream)
            if one is None or untracked is None:
                raise self._outbox.unknown_stream(stream)
            getrandbits = self._getrandbits
            for values, p in zip(values_list, anchor_each):
                if p.anchors:
                    one(values, p.ackcell, p.anchors, p.born, getrandbits)
                else:
                    untracked(values, 0.0)
            self.emitted += len(values_list)
            return
        self._emit_many_tracked(values_list, stream, anchors)

    def _anchored(self, anchors: Tuple | Sequence[Tuple] | None) -> tuple[Sequence[Tuple], Any]:
        """The parents of an emit and their roots (an emit is tracked when any parent is)."""
        if anchors is None and self._auto_anchor:
            anchors = self.current
        if isinstance(anchors, Tuple):
            return (anchors,), anchors.anchors     # one parent: its anchors dict's keys are its roots
        parents = () if anchors is None else tuple(anchors)
        roots: dict[int, None] = {}
        for p in parents:
            if p.anchors:
                roots.update(dict.fromkeys(p.anchors))
        return parents, roots

    def _emit_tracked(self, values: Sequence[Any], stream: str = DEFAULT_STREAM,
                      anchors: Tuple | Sequence[Tuple] | None = None) -> None:
        """Explicit anchors (or none): the emit is tracked when any anchor is."""
        self.emitted += 1
        parents, roots = self._anchored(anchors)
        emit = self._outbox.tracked.get(stream)
        if emit is None:
            raise self._outbox.unknown_stream(stream)
        if roots:
            emit(values, roots, parents, parents[0].born, self._getrandbits)
        else:
            self._outbox.untracked[stream](values, 0.0)

    def _emit_many_tracked(self, values_list: Sequence[Sequence[Any]], stream: str = DEFAULT_STREAM,
                           anchors: Tuple | Sequence[Tuple] | None = None,
                           anchor_each: Sequence[Tuple] | None = None) -> None:
        """``emit`` of each values in one call (a batch bolt's emit): all anchored alike
        (``anchors``), or each to its own parent (``anchor_each[i]`` for ``values_list[i]``)."""
        if anchor_each is not None:
            each = self._outbox.tracked_each.get(stream)
            if each is None:
                raise self._outbox.unknown_stream(stream)
            if len(anchor_each) != len(values_list):
                raise count_mismatch_error(self._outbox.component, values_list, anchor_each, "anchor_each tuples")
            each(values_list, anchor_each, self._getrandbits)
            self.emitted += len(values_list)
            return
        parents, roots = self._anchored(anchors)
        if not roots:
            return self._untracked_many(values_list, stream)
        many = self._outbox.tracked_many.get(stream)
        if many is None:
            raise self._outbox.unknown_stream(stream)
        many(values_list, roots, parents, parents[0].born, self._getrandbits)
        self.emitted += len(values_list)

    def ack(self, tup: Tuple) -> None:
        if self.on_loop is not None:
            return self.on_loop(self._ack, tup)
        self._ack(tup)

    def _ack(self, tup: Tuple) -> None:
        self._stats.acked += 1
        self.ack_silently(tup)

    def ack_silently(self, tup: Tuple) -> None:
        """XOR the tuple's edge (and its children's) out of each root's ledger; no count."""
        anchors = tup.anchors
        if self._acker is not None and anchors:
            self._acker.ack_tuple(anchors, tup.ackcell)

    def fail(self, tup: Tuple, reason: str = "") -> None:
        if self.on_loop is not None:
            return self.on_loop(self._fail, tup, reason)
        self._fail(tup, reason)

    def _fail(self, tup: Tuple, reason: str = "") -> None:
        self._stats.failed += 1
        acker = self._acker
        if acker is not None and tup.anchors:
            why = reason or f"failed by {self._name}"
            for root in tup.anchors:
                acker.fail(root, why)
