"""The collectors spouts and bolts emit, ack and fail through (Storm's output collectors).

Each collector's ``emit`` is one closure built per task at start, over the
outbox's per-stream emit functions (``Outbox.untracked`` / ``Outbox.tracked``) and,
with acking on, the acker's ``open`` / ``ack``: with acking off the common case (the
default stream with one subscriber) is inlined into a single flat function, since
it is the innermost call of every topology. Every emit mistake raises
``topo.api.EmitError``.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Sequence

from topo.api import DEFAULT_STREAM, EmitError, Tuple, WireTuple
from runtime.local.acker import Acker, Outcome
from runtime.local.outbox import Outbox
from runtime.observe.stats import TaskStats

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
    origin, nfields, lanes, select = single
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
            lanes[select(values)].batch.append(WireTuple((values, origin, None, 0.0, None)))
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


class SpoutCollector:
    """The collector a spout emits through (``SpoutOutputCollector``).

    ``emit(values, stream="default", msg_id=None)``: with acking off the flat
    untracked emit, with acking on the tracking one, where a tuple with a
    ``msg_id`` becomes a tracked root: its edges are opened in the acker and its
    values kept in ``pending`` for replay (``_retries`` is the engine's own argument
    when it replays).
    """

    __slots__ = ("emit", "emit_many", "emitted")

    def __init__(self, outbox: Outbox, *, acker: Acker | None, pending: dict[int, Pending],
                 on_outcome: Outcome, getrandbits: Callable[[int], int],
                 untracked_acks: list[Any] | None) -> None:
        self.emitted = 0
        untracked_many = untracked_emit_many(outbox, self, untracked_acks, spout=True)
        if acker is None:
            self.emit = untracked_emit(outbox, self, untracked_acks)
            self.emit_many = untracked_many
        else:
            self.emit = emit = self._tracked_emit(outbox, acker, pending, on_outcome, getrandbits)

            def emit_many(values_list: Sequence[Sequence[Any]], stream: str = DEFAULT_STREAM,
                          msg_ids: Sequence[Any] | None = None) -> None:
                """Tracked roots are opened one by one (each has its own ledger entry)."""
                if msg_ids is None:
                    return untracked_many(values_list, stream)
                if len(msg_ids) != len(values_list):
                    raise count_mismatch_error(outbox.component, values_list, msg_ids, "msg_ids")
                for values, msg_id in zip(values_list, msg_ids):
                    emit(values, stream, msg_id)

            self.emit_many = emit_many

    def _tracked_emit(self, outbox: Outbox, acker: Acker, pending: dict[int, Pending], on_outcome: Outcome,
                      getrandbits: Callable[[int], int]) -> Callable[..., None]:
        collector = self
        untracked, tracked = outbox.untracked, outbox.tracked
        unknown = outbox.unknown_stream
        open_root = acker.open
        perf = time.perf_counter
        # With workers, the low byte of a root id names the worker whose acker owns it.
        tagged = acker.forward_ack is not None
        tag = acker.root_tag

        def emit(values: Sequence[Any], stream: str = DEFAULT_STREAM, msg_id: Any = None,
                 _retries: int = 0) -> None:
            collector.emitted += 1
            if msg_id is None:
                f = untracked.get(stream)
                if f is None:
                    raise unknown(stream)
                f(values, 0.0)
                return
            e = tracked.get(stream)
            if e is None:
                raise unknown(stream)
            born = perf()  # also the acker's clock: one reading serves both
            root = getrandbits(64) or 1
            if tagged:
                root = (root >> 8 << 8 | tag) or 256
            edges = e(values, (root,), None, born, getrandbits)
            pending[root] = (msg_id, values, stream, _retries, born)
            open_root(root, edges, on_outcome, born)

        return emit


class BoltCollector:
    """The collector a bolt emits, acks and fails through (``OutputCollector``)."""

    __slots__ = ("_outbox", "_acker", "_stats", "_name", "_auto_anchor", "_getrandbits", "_untracked_many",
                 "emit", "emit_many", "emitted", "current", "on_loop")

    def __init__(self, outbox: Outbox, *, acker: Acker | None, stats: TaskStats, auto_anchor: bool,
                 getrandbits: Callable[[int], int]) -> None:
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
        self.emit = (untracked_emit(outbox, self, None) if acker is None
                     else self._auto_anchored_emit())
        # emit_many(values_list, stream="default", anchors=None): msg ids are a spout's only.
        self._untracked_many = untracked_emit_many(outbox, self, None, spout=False)
        self.emit_many = self._untracked_many if acker is None else self._emit_many_tracked

    def _auto_anchored_emit(self) -> Callable[..., None]:
        """Tracked emit with the common case first: anchored to the input being executed."""
        collector = self
        tracked = self._outbox.tracked
        getrandbits = self._getrandbits
        general = self._emit_tracked
        auto = self._auto_anchor
        unknown = self._outbox.unknown_stream

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
            self._acker.ack(anchors, tup.ackcell[0])

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
