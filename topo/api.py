"""What a user subclasses: Spout, Bolt, and the Tuple they see.

The shape follows Storm: a spout is pulled (``next_tuple``) by its task and emits
through a collector; a bolt is pushed one tuple at a time (``execute``) and emits,
acks and fails through its collector. ``emit`` is a plain call that never blocks:
the task hands the emitted tuples to the engine when the call returns, and *that*
is where the engine waits for queue space and for the rate limiter, so a user's
code needs no ``await`` and memory stays bounded by what one call emits.
"""
from __future__ import annotations

from collections.abc import Sequence as _SequenceABC
from dataclasses import dataclass, field
from bisect import bisect_right
from itertools import accumulate, chain, compress, repeat
from operator import itemgetter
from typing import Any, Iterator, Mapping, Protocol, Sequence, overload

import msgpack

DEFAULT_STREAM = "default"


class EmitError(ValueError):
    """A component emitted on a stream it did not declare, or not one value per declared field.

    The same mistake raises the same error wherever the component runs: the local
    engine, the Spark engine and the test harness all check emits with ``check_emit``
    (the local engine's hot path inlines the length test and builds the error here).
    """


class ComponentError(RuntimeError):
    """A component's own code made the run stop: ``open``/``prepare`` raised, or a spout's
    ``next_tuple`` kept raising. The message is one line naming the component and task."""


class CheckpointError(RuntimeError):
    """Checkpointing cannot go on: a spout keeps no offsets, the topology changed since its
    last checkpoint, the checkpoint file is unusable, or rollbacks keep failing. One line."""


class TupleEncodingError(EmitError, TypeError):
    """An emitted value has no msgpack encoding (the wire format between tasks)."""


def unknown_stream_error(component: str, stream: str, declared: Sequence[str]) -> EmitError:
    return EmitError(f"component {component!r} emitted on stream {stream!r}, which it does not declare "
                     f"(declared: {sorted(declared)})")


def arity_error(component: str, stream: str, values: Any, fields: Sequence[str]) -> EmitError:
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        return EmitError(f"component {component!r} emitted {values!r:.80} on stream {stream!r}: expected a "
                         f"list of values for fields {list(fields)}")
    return EmitError(f"component {component!r} emitted {len(values)} values on stream {stream!r}, "
                     f"which declares {len(fields)} fields {list(fields)}")


def encoding_error(component: str, stream: str, values: Sequence[Any], fields: Sequence[str],
                   pack: Any = msgpack.packb) -> TupleEncodingError:
    """The error for values ``pack`` cannot encode, naming the first field that fails."""
    for name, v in zip(fields, values):
        try:
            pack(v)
        except (TypeError, ValueError, OverflowError):
            return TupleEncodingError(
                f"component {component!r} emitted on stream {stream!r} a value for field {name!r} that "
                f"msgpack cannot encode: {type(v).__name__} {v!r:.80}")
    return TupleEncodingError(f"component {component!r} emitted on stream {stream!r} values msgpack "
                              f"cannot encode: {values!r:.80}")


def check_emit(component: str, outputs: Mapping[str, Sequence[str]], stream: str,
               values: Any, *, encode: bool = False) -> None:
    """Raise ``EmitError`` unless ``values`` fits ``stream`` as ``component`` declared it.

    With ``encode`` the values are also packed, as they would be on the wire.
    """
    fields = outputs.get(stream)
    if fields is None:
        raise unknown_stream_error(component, stream, list(outputs))
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or len(values) != len(fields):
        raise arity_error(component, stream, values, fields)
    if encode:
        try:
            msgpack.packb(list(values))
        except (TypeError, ValueError, OverflowError):
            raise encoding_error(component, stream, values, fields) from None


class EndOfStream(Exception):
    """Raised by ``Spout.next_tuple`` when a finite source has nothing more to give.

    The task stops pulling that spout; the topology ends when every spout has ended
    and every tuple in flight has been processed (and acked, when acking is on).
    """


try:  # the C accessor namedtuple uses: reads the item, bypassing __getitem__
    from _collections import _tuplegetter
except ImportError:  # pragma: no cover - other Pythons
    def _tuplegetter(index: int, doc: str) -> Any:  # type: ignore[misc]
        return property(lambda self: tuple.__getitem__(self, index), doc=doc)


class Tuple:
    """One tuple as a bolt sees it: values addressed by position or by field name.

    ``Tuple(values, fields, ...)`` builds one (for tests and harnesses); the engine
    makes ``WireTuple`` instances directly. ``isinstance(x, Tuple)`` holds for both.
    """

    __slots__ = ()
    values: Sequence[Any]
    origin: "Origin"
    anchors: dict[int, int] | None
    born: float

    def __new__(cls, values: Sequence[Any], fields: "FieldIndex", stream: str = DEFAULT_STREAM,
                source_component: str = "", source_task: int = -1,
                anchors: dict[int, int] | None = None, born: float = 0.0) -> "Tuple":
        return WireTuple((values, Origin(fields, stream, source_component, source_task), anchors, born, [0]))

    @property
    def fields(self) -> "FieldIndex":
        return self.origin.fields

    @property
    def stream(self) -> str:
        return self.origin.stream

    @property
    def source_component(self) -> str:
        return self.origin.component

    @property
    def source_task(self) -> int:
        return self.origin.task

    def __getitem__(self, key: int | str) -> Any:
        if isinstance(key, str):
            return self.values[self.origin.fields.index[key]]
        return self.values[key]

    def __len__(self) -> int:
        return len(self.values)

    def __iter__(self) -> Any:
        return iter(self.values)

    def get(self, name: str, default: Any = None) -> Any:
        i = self.origin.fields.index.get(name)
        return default if i is None else self.values[i]

    def as_dict(self) -> dict[str, Any]:
        return dict(zip(self.origin.fields.names, self.values))

    def __repr__(self) -> str:
        return f"Tuple({self.source_component}:{self.stream} {self.as_dict()!r})"


class WireTuple(tuple, Tuple):  # type: ignore[misc]
    """The engine's tuple: a builtin tuple ``(values, origin, anchors, born, ackcell)``.

    Building a tuple is on the hot path of every emit. A tuple subclass with no
    ``__init__`` is built by C code in about half the time of a slotted object, and
    the fields are read by namedtuple's C accessor. ``origin`` is shared by every
    tuple of one stream and task. ``ackcell`` is ``[xor]`` for tracked tuples (the
    XOR of the edge ids anchored to this one, Storm's ack value), None otherwise.
    Python-level behaviour is a Tuple's, not a builtin tuple's: indexing and ``len``
    address the values, and equality is identity.
    """

    __slots__ = ()
    values = _tuplegetter(0, "the tuple's values")
    origin = _tuplegetter(1, "stream, fields and source task")
    anchors = _tuplegetter(2, "root id -> edge id in the XOR ledger; None when untracked")
    born = _tuplegetter(3, "perf_counter() of the spout emit this tuple descends from")
    ackcell = _tuplegetter(4, "[XOR of edge ids anchored to this tuple] when tracked")
    __getitem__ = Tuple.__getitem__
    __len__ = Tuple.__len__
    __iter__ = Tuple.__iter__
    __repr__ = Tuple.__repr__
    __eq__ = object.__eq__
    __ne__ = object.__ne__
    __hash__ = object.__hash__

    def __contains__(self, item: object) -> bool:
        return item in self.values

    def __reduce__(self) -> Any:
        return (WireTuple, (tuple(tuple.__iter__(self)),))


class Columns(_SequenceABC):  # type: ignore[type-arg]
    """What ``emit_many`` takes, given by field instead of by tuple: ``Columns(words)`` for
    a one-field stream, ``Columns(words, counts)`` for two (one sequence per declared field,
    all of one length).

    It reads as the list of its rows (a tuple of values each), so every collector takes
    it; the local engine keeps it as columns on its way to the next task (``TupleBatch``),
    so a value costs no tuple of its own unless a bolt reads it as a tuple.
    """

    __slots__ = ("columns", "_n")

    def __init__(self, *columns: Sequence[Any]) -> None:
        if not columns:
            raise EmitError("Columns() needs one sequence per field, got none")
        n = len(columns[0])
        for i, c in enumerate(columns):
            if len(c) != n:
                raise EmitError(f"Columns(): column {i} has {len(c)} values, column 0 has {n} (one length for all)")
        self.columns = columns
        self._n = n

    def __len__(self) -> int:
        return self._n

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        return zip(*self.columns)

    @overload
    def __getitem__(self, i: int) -> tuple[Any, ...]: ...

    @overload
    def __getitem__(self, i: slice) -> list[tuple[Any, ...]]: ...

    def __getitem__(self, i: int | slice) -> tuple[Any, ...] | list[tuple[Any, ...]]:
        if isinstance(i, slice):
            return list(zip(*(c[i] for c in self.columns)))
        return tuple(c[i] for c in self.columns)

    def copy(self) -> "Columns":
        """Columns of its own (lists), whatever the caller does with its sequences later."""
        return Columns(*map(list, self.columns))

    def __repr__(self) -> str:
        return f"Columns({self._n} values x {len(self.columns)} fields)"


# One run of a ``TupleBatch``: tuples that share everything but their values, as
# ``[values_list, origin, anchors, born, ackcell, at]`` (``values_list``: a list, or ``Columns``) (``at``: where the run stands among
# the single tuples of the lane it was emitted into; the batch itself ignores it).
Run = list


class Repeated(_SequenceABC):  # type: ignore[type-arg]
    """``items[i]`` repeated ``counts[i]`` times, in order, as one sequence, with no list of
    the repeats: ``emit_many(words, anchor_each=Repeated(sentences, words_per_sentence))``
    anchors each word to its sentence. The local engine then checks each parent once,
    not once per values; anywhere else it reads as the plain sequence it stands for."""

    __slots__ = ("items", "counts", "_ends")

    def __init__(self, items: Sequence[Any], counts: Sequence[int]) -> None:
        self.items = list(items)
        self.counts = list(counts)
        if len(self.items) != len(self.counts):
            raise ValueError(f"Repeated: {len(self.items)} items and {len(self.counts)} counts (one count per item)")
        if self.counts and min(self.counts) < 0:
            raise ValueError(f"Repeated: a count is negative ({min(self.counts)})")
        self._ends = list(accumulate(self.counts))      # the index one past each item's last repeat

    def __len__(self) -> int:
        return self._ends[-1] if self._ends else 0

    def __iter__(self) -> Iterator[Any]:
        return chain.from_iterable(map(repeat, self.items, self.counts))

    @overload
    def __getitem__(self, i: int) -> Any: ...
    @overload
    def __getitem__(self, i: slice) -> list[Any]: ...

    def __getitem__(self, i: int | slice) -> Any:
        if isinstance(i, slice):
            return list(self)[i]
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("Repeated index out of range")
        return self.items[bisect_right(self._ends, i)]

    def present(self) -> list[Any]:
        """The items that occur at least once (those with a count over 0), in order."""
        return list(compress(self.items, self.counts))


class TupleBatch(_SequenceABC):  # type: ignore[type-arg]
    """A transfer batch kept as columns: runs of values that share origin, anchors, born
    and ack cell (what one ``emit_many`` into one target makes), not one object per tuple.

    A whole-batch bolt (``Bolt.execute_batch``) may read it by column (``column``,
    ``values``) and never pay for tuple objects; read as a sequence of tuples it makes
    them once, by C-level maps, and keeps them (the same objects on every pass, since
    acking and failing go by identity).
    """

    __slots__ = ("runs", "_n", "_tuples")

    def __init__(self, runs: list[Run], n: int) -> None:
        self.runs = runs
        self._n = n              # the runs' values, all told
        self._tuples: list[Tuple] | None = None

    def __len__(self) -> int:
        return self._n

    def tuples(self) -> list[Tuple]:
        """The batch as tuple objects, made on the first call."""
        out = self._tuples
        if out is None:
            out = []
            for r in self.runs:
                out += run_tuples(r)
            self._tuples = out
        return out

    def __iter__(self) -> Iterator[Tuple]:
        return iter(self.tuples())

    @overload
    def __getitem__(self, i: int) -> Tuple: ...

    @overload
    def __getitem__(self, i: slice) -> list[Tuple]: ...

    def __getitem__(self, i: int | slice) -> Tuple | list[Tuple]:
        return self.tuples()[i]

    def values(self) -> list[Sequence[Any]]:
        """Every tuple's values, in order (a new list)."""
        runs = self.runs
        if len(runs) == 1:
            return list(runs[0][0])
        out: list[Sequence[Any]] = []
        for r in runs:
            out += r[0]
        return out

    def column(self, name: str) -> list[Any]:
        """The value of field ``name`` of every tuple, in order."""
        out: list[Any] = []
        for r in self.runs:
            index = r[1].fields.index.get(name)
            if index is None:
                raise KeyError(f"field {name!r} is not among {list(r[1].fields.names)} of stream {r[1].stream!r}")
            values = r[0]
            out += values.columns[index] if type(values) is Columns else map(itemgetter(index), values)
        return out

    def __repr__(self) -> str:
        return f"TupleBatch({self._n} tuples in {len(self.runs)} runs)"


def interleave(tuples: list[Tuple], runs: list[Run]) -> list[Tuple]:
    """``tuples`` with the tuples of each run made and placed where its ``at`` says (a new list)."""
    out: list[Tuple] = []
    done = 0
    for r in runs:
        at = r[5]
        out += tuples[done:at]
        done = at
        out += run_tuples(r)
    out += tuples[done:]
    return out


def run_tuples(run: Run) -> Iterator[Tuple]:
    """The tuple objects of one run, made by C-level maps (each call makes new ones)."""
    return map(WireTuple, zip(run[0], repeat(run[1]), repeat(run[2]), repeat(run[3]), repeat(run[4])))


def column(tuples: Sequence[Tuple], name: str) -> list[Any]:
    """Field ``name`` of every tuple of a batch (what ``Bolt.execute_batch`` is given), in
    order: read straight from the columns of an engine's ``TupleBatch``, tuple by tuple from
    any other sequence of tuples (a harness's list)."""
    if type(tuples) is TupleBatch:
        return tuples.column(name)
    if not tuples:
        return []
    fields = tuples[0].origin.fields
    index = fields.index.get(name)
    if index is not None:     # the first tuple's position, for every tuple of the same fields
        out = [t.values[index] for t in tuples if t.origin.fields is fields]
        if len(out) == len(tuples):
            return out
    return [t[name] for t in tuples]


@dataclass(frozen=True, slots=True)
class Origin:
    """Where tuples of one stream come from: shared by every tuple of that stream and task."""

    fields: "FieldIndex"
    stream: str
    component: str
    task: int


@dataclass(frozen=True)
class FieldIndex:
    """Declared output fields of one stream, with a name -> position map."""

    names: tuple[str, ...]
    index: dict[str, int] = field(compare=False, hash=False, repr=False, default_factory=dict)

    @classmethod
    def of(cls, names: Sequence[str]) -> "FieldIndex":
        names = tuple(names)
        return cls(names, {n: i for i, n in enumerate(names)})


class OutputCollector(Protocol):
    """What a bolt emits, acks and fails through."""

    def emit(self, values: Sequence[Any], stream: str = DEFAULT_STREAM,
             anchors: "Tuple | Sequence[Tuple] | None" = None) -> None: ...

    def emit_many(self, values_list: Sequence[Sequence[Any]], stream: str = DEFAULT_STREAM,
                  anchors: "Tuple | Sequence[Tuple] | None" = None,
                  anchor_each: "Sequence[Tuple] | None" = None) -> None:
        """``emit`` of each values in turn, in one call: all with the same ``anchors``, or
        ``values_list[i]`` anchored to ``anchor_each[i]``."""

    def ack(self, tup: Tuple) -> None: ...

    def fail(self, tup: Tuple) -> None: ...


class SpoutOutputCollector(Protocol):
    """What a spout emits through. ``msg_id`` makes the tuple tracked when acking is on."""

    def emit(self, values: Sequence[Any], stream: str = DEFAULT_STREAM, msg_id: Any = None) -> None: ...

    def emit_many(self, values_list: Sequence[Sequence[Any]], stream: str = DEFAULT_STREAM,
                  msg_ids: Sequence[Any] | None = None) -> None:
        """``emit`` of each values in turn (with the msg_id at the same position), in one call."""


@dataclass(frozen=True)
class TaskContext:
    """Where a task sits in the topology; handed to ``open`` and ``prepare``."""

    topology: str
    component: str
    task_id: int
    task_index: int
    parallelism: int
    config: dict[str, Any]
    #: "component:stream" -> the task ids of each input this task subscribes to (windows wait
    #: for every upstream task's watermark, Flink's rule); empty where an engine does not say
    inputs: Mapping[str, tuple[int, ...]] = field(default_factory=dict)


class Component:
    """Shared by spouts and bolts: declared outputs.

    Set ``outputs`` to a list of field names for the default stream, or to a dict
    ``{stream: [fields...]}`` for named streams; or override ``declare_outputs``.
    """

    outputs: Sequence[str] | dict[str, Sequence[str]] = ()

    def declare_outputs(self) -> dict[str, tuple[str, ...]]:
        out = self.outputs
        if isinstance(out, dict):
            return {str(s): tuple(f) for s, f in out.items()}
        return {DEFAULT_STREAM: tuple(out)} if out else {}

    # -- checkpointed state (``checkpoint.interval_ms``) ---------------------------------
    # A component with state overrides ``snapshot_state`` and ``restore_state``; the
    # engine calls ``snapshot_state`` at a point in the stream where every tuple emitted
    # before it has been processed everywhere, and ``restore_state`` (after ``open`` /
    # ``prepare``) with what it returned when a run resumes from that checkpoint.

    def snapshot_state(self) -> Any:
        """This task's state now, msgpack-serialisable (values, not live objects)."""
        raise NotImplementedError

    def restore_state(self, state: Any) -> None:
        """Take back what ``snapshot_state`` returned."""
        raise NotImplementedError

    def checkpoint_complete(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` is durable: a sink commits the output it sealed for it."""

    @classmethod
    def has_state(cls) -> bool:
        """Whether this component checkpoints state (it overrides ``snapshot_state``)."""
        return cls.snapshot_state is not Component.snapshot_state


class Spout(Component):
    """A source. ``next_tuple`` is called repeatedly; it may be sync or ``async``.

    When acking is on, tuples emitted with a ``msg_id`` are tracked; ``ack(msg_id)``
    is called once the whole tuple tree is processed and ``fail(msg_id)`` when a
    bolt failed it or it timed out. Replay is done by the engine (it keeps the
    values of every pending tuple), so ``fail`` is a notification.
    """

    def open(self, context: TaskContext, collector: SpoutOutputCollector) -> None:
        self.collector = collector
        self.context = context

    def next_tuple(self) -> Any:
        raise NotImplementedError

    def ack(self, msg_id: Any) -> None:
        pass

    def fail(self, msg_id: Any) -> None:
        pass

    def close(self) -> None:
        pass


class Bolt(Component):
    """A processing step. ``execute`` may be a plain or an ``async`` function.

    With ``auto_ack = True`` (the default, like Storm's BasicBolt) the engine anchors
    every emit to the input tuple and acks it when ``execute`` returns; an exception
    fails it. Set ``auto_ack = False`` to anchor, ack and fail by hand.

    A bolt may instead (or also) define a plain ``execute_batch(tuples)``: the local
    engine then hands it each transfer batch whole (Bytewax's ``flat_map_batch``), which
    saves the per-tuple call and lets it use C-speed loops. Inside it there is no current
    tuple, so emits are anchored only as they say (``emit_many(values, anchors=t)``, or
    ``emit_many(values_list, anchor_each=parents)`` with one parent per values);
    with ``auto_ack`` every tuple of the batch is acked when it returns, and all of them
    fail if it raises. Where no batch is at hand (the test harness, Spark) ``execute``
    calls it with a batch of one.
    """

    auto_ack: bool = True
    # Storm's tick tuples: when set, ``tick()`` is called about this often from the
    # task's own loop (between tuples, never concurrently with ``execute``).
    tick_interval_s: float | None = None
    # An ``async`` (or blocking) execute running longer than this is cancelled and its
    # tuple failed; None takes the ``execute_timeout_s`` setting. A plain synchronous
    # execute cannot be cancelled: one that may block (I/O, sleeps) sets ``blocking``.
    execute_timeout_s: float | None = None
    # Run ``execute`` on a worker thread of this task, one tuple at a time, so a call
    # that blocks stops neither the other tasks nor signals, and can time out.
    blocking: bool = False

    def prepare(self, context: TaskContext, collector: OutputCollector) -> None:
        self.collector = collector
        self.context = context

    def execute(self, tup: Tuple) -> Any:
        if type(self).execute_batch is not Bolt.execute_batch:
            return self.execute_batch([tup])
        raise NotImplementedError

    def execute_batch(self, tuples: Sequence[Tuple]) -> Any:
        """Every tuple of one batch in one call (optional; see the class docstring)."""
        for tup in tuples:
            self.execute(tup)

    @classmethod
    def batched(cls) -> bool:
        """Whether this bolt takes whole batches (it overrides ``execute_batch``)."""
        return cls.execute_batch is not Bolt.execute_batch

    def tick(self) -> None:
        """Periodic hook (see ``tick_interval_s``), e.g. to flush a buffered sink."""

    def cleanup(self) -> None:
        pass
