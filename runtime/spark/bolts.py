"""How a bolt runs inside Spark tasks (the code here executes in Python workers).

Every stage reads and writes the same row shape, ``(src, stream, v)``: the emitting
component, the stream, and the tuple's values as a msgpack list. A ``StagePlan`` is the
picklable description of one bolt that the driver builds and the workers use.

Three ways to run a bolt, chosen by the driver (``runtime.spark.plan``):

* ``partition``: a bolt whose inputs are shuffle-like runs once per Spark partition of
  each micro-batch (``mapInArrow``): a fresh instance, ``prepare``, ``execute`` per
  tuple, ``tick`` once at the end of the batch if it asks for ticks, ``cleanup``.
  Instance attributes do not survive the batch.
* ``keyed``: a ``topo.state.KeyedBolt`` runs grouped by its key; each key's dict lives
  in Spark's state store between micro-batches (msgpack).
* ``task``: any other bolt behind a fields, global or all grouping runs as Storm's
  tasks: rows go to task index ``fields_task_index(key, parallelism)`` (the local
  engine's routing), ``0`` (global), every index (all) or round robin (shuffle-like
  inputs mixed in); each task's *instance attributes* are the state, stored in Spark's
  state store after every micro-batch (cloudpickle of ``__dict__`` without
  ``collector``/``context``). Per batch the instance is restored, ``prepare``d, runs its
  tuples, ticks and ``cleanup``s, so a bolt that opens a connection in ``prepare``
  and closes it in ``cleanup`` works unchanged.

On Spark, ``ack`` and ``fail`` are counted but do nothing: a micro-batch is the unit of
replay (a failed task re-runs its whole batch from the same offsets and state
version). An exception from ``prepare``, ``execute``, ``process``, ``tick`` or ``cleanup``
fails the Spark task, and after Spark's retries the query, as a ``BoltFailure`` whose
message names the bolt and the user's exception (``bolt 'work': execute raised
ValueError: boom``): the driver finds that line in the Python worker's trace.

On a cluster on this machine (``runtime.spark.placement``) the plan carries the
driver's working directory, which the Python worker enters before it makes a bolt, so
relative paths mean the same as on ``local[*]``.
"""
from __future__ import annotations

import asyncio
import inspect
import os
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

import msgpack

from topo.api import DEFAULT_STREAM, EmitError, FieldIndex, TaskContext, Tuple, check_emit
from topo.groupings import fields_task_index
from topo.state import hashable_key

BUS_COLUMNS = ("src", "stream", "v")
OUT_CHUNK = 8192
_HIDDEN = ("collector", "context")


@dataclass
class InputRoute:
    """How rows of one (source component, stream) reach the tasks of a stateful bolt."""

    kind: str                         # "fields", "global", "all" or "shuffle"
    positions: tuple[int, ...] = ()   # key field positions (fields)


@dataclass
class StagePlan:
    """One bolt, as the workers need it."""

    component: str
    make: Callable[[], Any]
    parallelism: int
    topology: str
    config: dict[str, Any]
    mode: str                                          # "partition", "keyed" or "task"
    inputs: dict[tuple[str, str], tuple[str, ...]]     # (src, stream) -> field names
    outputs: dict[str, tuple[str, ...]]                # declared output streams
    routes: dict[tuple[str, str], InputRoute] = field(default_factory=dict)
    workdir: str | None = None                         # the driver's directory, on a cluster on this machine

    def instance(self) -> Any:
        """A fresh bolt, made in ``workdir`` when there is one."""
        enter_workdir(self.workdir)
        return self.make()

    def field_index(self) -> dict[tuple[str, str], FieldIndex]:
        return {k: FieldIndex.of(v) for k, v in self.inputs.items()}


class BoltFailure(RuntimeError):
    """A bolt's own code raised inside a Spark task; the message is the one line the
    driver shows (``FAILURE_PREFIX`` marks it in the worker's trace)."""

    def __init__(self, component: str, what: str, error: BaseException) -> None:
        text = " ".join(str(error).split())
        super().__init__(f"bolt {component!r}: {what} raised {type(error).__name__}" + (f": {text}" if text else ""))


FAILURE_PREFIX = f"{BoltFailure.__module__}.{BoltFailure.__name__}: "


def enter_workdir(path: str | None) -> None:
    """Make ``path`` this Python worker's working directory (no-op for None).

    Spark puts the shipped zips on ``sys.path`` relative to the executor's directory
    (``./topo-code-*.zip``); they are made absolute first, and the importers cached
    under the relative names dropped, or imports would look for them in ``path``."""
    if not path:
        return
    here = os.getcwd()
    if here != path:
        sys.path[:] = [p if os.path.isabs(p) else os.path.join(here, p) for p in sys.path]
        sys.path_importer_cache.clear()
        os.chdir(path)


def prepared(plan: StagePlan, bolt: Any, context: TaskContext, collector: Any) -> Any:
    """``bolt.prepare(context, collector)``, its exception a ``BoltFailure``."""
    try:
        bolt.prepare(context, collector)
    except Exception as e:
        raise BoltFailure(plan.component, "prepare", e) from e
    return bolt


class BusCollector:
    """``OutputCollector`` that buffers emits as bus rows."""

    def __init__(self, plan: StagePlan) -> None:
        self.component = plan.component
        self.outputs = plan.outputs
        self.streams: list[str] = []
        self.values: list[bytes] = []
        self.acked = 0
        self.failed = 0

    def emit(self, values: Sequence[Any], stream: str = DEFAULT_STREAM, anchors: Any = None) -> None:
        check_emit(self.component, self.outputs, stream, values)
        self.streams.append(stream)
        self.values.append(msgpack.packb(list(values)))

    def emit_many(self, values_list: Sequence[Sequence[Any]], stream: str = DEFAULT_STREAM,
                  anchors: Any = None, anchor_each: Sequence[Tuple] | None = None) -> None:
        """The local collectors' ``emit_many`` (a batch bolt's), as one ``emit`` per values:
        the bus has no tuple trees, so the anchors only have their lengths checked."""
        if anchor_each is not None and len(anchor_each) != len(values_list):
            raise EmitError(f"component {self.component!r} called emit_many with {len(values_list)} values "
                            f"and {len(anchor_each)} anchor_each tuples (one per values)")
        for values in values_list:
            self.emit(values, stream)

    def ack(self, tup: Tuple) -> None:
        self.acked += 1

    def fail(self, tup: Tuple) -> None:
        self.failed += 1

    def __len__(self) -> int:
        return len(self.values)

    def drain_arrow(self) -> Any:
        import pyarrow as pa

        n = len(self.values)
        batch = pa.RecordBatch.from_arrays(
            [pa.array([self.component] * n, pa.string()), pa.array(self.streams, pa.string()),
             pa.array(self.values, pa.binary())], names=list(BUS_COLUMNS))
        self.streams, self.values = [], []
        return batch

    def drain_pandas(self) -> Any:
        import pandas as pd

        n = len(self.values)
        df = pd.DataFrame({"src": [self.component] * n, "stream": self.streams, "v": self.values})
        self.streams, self.values = [], []
        return df


def empty_pandas() -> Any:
    import pandas as pd

    return pd.DataFrame({"src": pd.Series([], dtype=object), "stream": pd.Series([], dtype=object),
                         "v": pd.Series([], dtype=object)})


def _spark_partition_id() -> int:
    try:
        from pyspark import TaskContext as SparkTaskContext

        ctx = SparkTaskContext.get()
        return ctx.partitionId() if ctx is not None else 0
    except ImportError:  # pragma: no cover
        return 0


def context_for(plan: StagePlan, task_index: int) -> TaskContext:
    return TaskContext(plan.topology, plan.component, task_index, task_index % plan.parallelism,
                       plan.parallelism, plan.config)


class Runner:
    """Calls one bolt instance per tuple, awaiting ``async`` bolts on a private loop."""

    def __init__(self, plan: StagePlan, bolt: Any, call: Callable[..., Any] | None = None) -> None:
        self.component = plan.component
        self.bolt = bolt
        self.call = call or bolt.execute
        self.index = plan.field_index()
        self.loop: asyncio.AbstractEventLoop | None = None
        if inspect.iscoroutinefunction(self.call):
            self.loop = asyncio.new_event_loop()

    def tuple_of(self, src: str, stream: str, v: bytes) -> Tuple:
        return Tuple(msgpack.unpackb(v, raw=False), self.index[(src, stream)], stream, src)

    def run(self, tup: Tuple, *extra: Any) -> None:
        try:
            result = self.call(tup, *extra)
            if inspect.isawaitable(result):
                if self.loop is None:
                    self.loop = asyncio.new_event_loop()
                self.loop.run_until_complete(result)
        except Exception as e:
            raise BoltFailure(self.component, self.call.__name__, e) from e

    def tick(self) -> None:
        if getattr(self.bolt, "tick_interval_s", None) and hasattr(self.bolt, "tick"):
            self.run_plain(self.bolt.tick)

    def run_plain(self, fn: Callable[[], Any]) -> None:
        try:
            result = fn()
            if inspect.isawaitable(result):
                if self.loop is None:
                    self.loop = asyncio.new_event_loop()
                self.loop.run_until_complete(result)
        except Exception as e:
            raise BoltFailure(self.component, getattr(fn, "__name__", "a call"), e) from e

    def close(self) -> None:
        if self.loop is not None:
            self.loop.close()
            self.loop = None


def run_batch(runner: Runner, collector: BusCollector, rows: Iterator[tuple[str, str, bytes]],
              drain: Callable[[], Any]) -> Iterator[Any]:
    """One instance's share of a micro-batch: execute each tuple, tick, cleanup.

    Yields a drained chunk whenever ``OUT_CHUNK`` emits are buffered; the caller
    drains what is left.
    """
    try:
        for src, stream, v in rows:
            runner.run(runner.tuple_of(src, stream, v))
            if len(collector) >= OUT_CHUNK:
                yield drain()
        runner.tick()
        runner.run_plain(runner.bolt.cleanup)
    finally:
        runner.close()


def _arrow_rows(batches: Iterator[Any]) -> Iterator[tuple[str, str, bytes]]:
    for rb in batches:
        cols = rb.to_pydict()
        yield from zip(cols["src"], cols["stream"], cols["v"])


# -- partition mode (mapInArrow) ---------------------------------------------------------------

def partition_function(plan: StagePlan) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """The ``mapInArrow`` function of a bolt in ``partition`` mode."""

    def run(batches: Iterator[Any]) -> Iterator[Any]:
        bolt = plan.instance()
        collector = BusCollector(plan)
        prepared(plan, bolt, context_for(plan, _spark_partition_id()), collector)
        yield from run_batch(Runner(plan, bolt), collector, _arrow_rows(batches), collector.drain_arrow)
        if len(collector):
            yield collector.drain_arrow()

    return run


# -- routing rows to tasks / keys before a stateful stage ----------------------------------------

def key_bytes(values: Sequence[Any], positions: Sequence[int]) -> bytes:
    key = values[positions[0]] if len(positions) == 1 else [values[p] for p in positions]
    return msgpack.packb(key)


def keyer_function(plan: StagePlan) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """``mapInArrow`` that adds the group column ``g`` (key or task index, msgpack)."""

    def run(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        turn = _spark_partition_id()
        n = plan.parallelism
        for rb in batches:
            cols = rb.to_pydict()
            src_out: list[str] = []
            stream_out: list[str] = []
            v_out: list[bytes] = []
            g_out: list[bytes] = []
            for src, stream, v in zip(cols["src"], cols["stream"], cols["v"]):
                route = plan.routes[(src, stream)]
                if plan.mode == "keyed":
                    targets = [key_bytes(msgpack.unpackb(v, raw=False), route.positions)]
                elif route.kind == "fields":
                    values = msgpack.unpackb(v, raw=False)
                    targets = [msgpack.packb(fields_task_index([values[p] for p in route.positions], n))]
                elif route.kind == "global":
                    targets = [msgpack.packb(0)]
                elif route.kind == "all":
                    targets = [msgpack.packb(i) for i in range(n)]
                else:
                    turn += 1
                    targets = [msgpack.packb(turn % n)]
                for g in targets:
                    src_out.append(src)
                    stream_out.append(stream)
                    v_out.append(v)
                    g_out.append(g)
            yield pa.RecordBatch.from_arrays(
                [pa.array(src_out, pa.string()), pa.array(stream_out, pa.string()),
                 pa.array(v_out, pa.binary()), pa.array(g_out, pa.binary())],
                names=["src", "stream", "v", "g"])

    return run


# -- stateful modes: one group (a key, or a task) per call ---------------------------------------

class GroupState:
    """The two operations a stateful stage needs from Spark's per-group state."""

    def __init__(self, load: Callable[[], bytes | None], save: Callable[[bytes | None], None]) -> None:
        self.load = load
        self.save = save


def _rows(pdfs: Iterator[Any]) -> Iterator[tuple[str, str, bytes]]:
    for pdf in pdfs:
        yield from zip(pdf["src"], pdf["stream"], pdf["v"])


class KeyedStage:
    """A ``KeyedBolt``: one prepared instance per Spark task, one state dict per key."""

    def __init__(self, plan: StagePlan) -> None:
        self.plan = plan
        self.runner: Runner | None = None
        self.collector: BusCollector | None = None

    def _ready(self) -> Runner:
        if self.runner is None:
            bolt = self.plan.instance()
            self.collector = BusCollector(self.plan)
            prepared(self.plan, bolt, context_for(self.plan, _spark_partition_id()), self.collector)
            self.runner = Runner(self.plan, bolt, bolt.process)
        return self.runner

    def group(self, pdfs: Iterator[Any], state: GroupState) -> Iterator[Any]:
        runner = self._ready()
        collector = self.collector
        assert collector is not None
        raw = state.load()
        current: dict[str, Any] = {} if raw is None else msgpack.unpackb(raw, raw=False)
        for src, stream, v in _rows(pdfs):
            runner.run(runner.tuple_of(src, stream, v), current)
            if len(collector) >= OUT_CHUNK:
                yield collector.drain_pandas()
        state.save(msgpack.packb(current) if current else None)
        yield collector.drain_pandas() if len(collector) else empty_pandas()

    def close(self) -> None:
        if self.runner is not None:
            self.runner.run_plain(self.runner.bolt.cleanup)
            self.runner.close()
            self.runner = None


class TaskStage:
    """Any bolt as one of ``parallelism`` Storm tasks whose attributes are the state."""

    def __init__(self, plan: StagePlan) -> None:
        self.plan = plan

    def group(self, task_index: int, pdfs: Iterator[Any], state: GroupState) -> Iterator[Any]:
        from pyspark import cloudpickle

        plan = self.plan
        bolt = plan.instance()
        raw = state.load()
        if raw is not None:
            bolt.__dict__.update(cloudpickle.loads(raw))
        collector = BusCollector(plan)
        prepared(plan, bolt, context_for(plan, task_index), collector)
        yield from run_batch(Runner(plan, bolt), collector, _rows(pdfs), collector.drain_pandas)
        kept = {k: v for k, v in bolt.__dict__.items() if k not in _HIDDEN}
        try:
            blob = cloudpickle.dumps(kept)
        except Exception as e:
            raise TypeError(f"bolt {plan.component!r} (task {task_index}): its attributes are its state on "
                            f"Spark and must pickle after cleanup(), but: {e}") from e
        state.save(blob)
        yield collector.drain_pandas() if len(collector) else empty_pandas()


def task_index_of(group_key: Sequence[Any]) -> int:
    return int(msgpack.unpackb(group_key[0]))


def unpack_key(group_key: Sequence[Any]) -> Any:
    return hashable_key(msgpack.unpackb(group_key[0], raw=False))


# -- Spark's stateful operators ------------------------------------------------------------------

STATE_SCHEMA = "s binary"


def apply_in_pandas_function(plan: StagePlan) -> Callable[..., Iterator[Any]]:
    """The function for ``groupBy("g").applyInPandasWithState`` (one stateful stage)."""
    holder: dict[str, Any] = {}

    def run(key: tuple[Any, ...], pdfs: Iterator[Any], state: Any) -> Iterator[Any]:
        def load() -> bytes | None:
            return bytes(state.get[0]) if state.exists else None

        def save(blob: bytes | None) -> None:
            if blob is None:
                if state.exists:
                    state.remove()
            else:
                state.update((blob,))

        gs = GroupState(load, save)
        if plan.mode == "keyed":
            stage = holder.get("stage")
            if stage is None:
                stage = holder["stage"] = KeyedStage(plan)
            yield from stage.group(pdfs, gs)
        else:
            yield from TaskStage(plan).group(task_index_of(key), pdfs, gs)

    return run


def stateful_processor(plan: StagePlan) -> Any:
    """A ``StatefulProcessor`` for ``transformWithStateInPandas`` (several stateful stages)."""
    from pyspark.sql.streaming import StatefulProcessor
    from pyspark.sql.types import BinaryType, StructField, StructType

    class BoltProcessor(StatefulProcessor):  # type: ignore[misc]
        def init(self, handle: Any) -> None:
            self.value = handle.getValueState("s", StructType([StructField("s", BinaryType(), True)]))
            self.keyed = KeyedStage(plan) if plan.mode == "keyed" else None

        def _state(self) -> GroupState:
            def load() -> bytes | None:
                return bytes(self.value.get()[0]) if self.value.exists() else None

            def save(blob: bytes | None) -> None:
                if blob is None:
                    self.value.clear()
                else:
                    self.value.update((blob,))

            return GroupState(load, save)

        def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any) -> Iterator[Any]:
            if self.keyed is not None:
                yield from self.keyed.group(rows, self._state())
            else:
                yield from TaskStage(plan).group(task_index_of(key), rows, self._state())

        def close(self) -> None:
            if self.keyed is not None:
                self.keyed.close()

    return BoltProcessor()
