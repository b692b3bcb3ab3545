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

from topo.api import DEFAULT_STREAM, Tuple, WireTuple
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


class SpoutCollector:
    """The collector a spout emits through (``SpoutOutputCollector``).

    ``emit(values, stream="default", msg_id=None)``: with acking off the flat
    untracked emit, with acking on the tracking one, where a tuple with a
    ``msg_id`` becomes a tracked root: its edges are opened in the acker and its
    values kept in ``pending`` for replay (``_retries`` is the engine's own argument
    when it replays).
    """

    __slots__ = ("emit", "emitted")

    def __init__(self, outbox: Outbox, *, acker: Acker | None, pending: dict[int, Pending],
                 on_outcome: Outcome, getrandbits: Callable[[int], int],
                 untracked_acks: list[Any] | None) -> None:
        self.emitted = 0
        if acker is None:
            self.emit = untracked_emit(outbox, self, untracked_acks)
        else:
            self.emit = self._tracked_emit(outbox, acker, pending, on_outcome, getrandbits)

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

    __slots__ = ("_outbox", "_acker", "_stats", "_name", "_auto_anchor", "_getrandbits",
                 "emit", "emitted", "current", "on_loop")

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

    def _emit_tracked(self, values: Sequence[Any], stream: str = DEFAULT_STREAM,
                      anchors: Tuple | Sequence[Tuple] | None = None) -> None:
        """Explicit anchors (or none): the emit is tracked when any anchor is."""
        self.emitted += 1
        if anchors is None and self._auto_anchor:
            anchors = self.current
        parents = () if anchors is None else (anchors,) if isinstance(anchors, Tuple) else tuple(anchors)
        roots: dict[int, None] = {}
        for p in parents:
            if p.anchors:
                roots.update(dict.fromkeys(p.anchors))
        emit = self._outbox.tracked.get(stream)
        if emit is None:
            raise self._outbox.unknown_stream(stream)
        if roots:
            emit(values, roots, parents, parents[0].born, self._getrandbits)
        else:
            self._outbox.untracked[stream](values, 0.0)

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
