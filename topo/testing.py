"""Unit-test your own spouts and bolts without building a topology.

```python
from topo.testing import BoltHarness, SpoutHarness

h = BoltHarness(SplitBolt(), input_fields=["sentence"])
assert [e.values for e in h.feed(["a b"])] == [["a"], ["b"]]
assert len(h.acked) == 1

s = SpoutHarness(SentenceSpout(repeat=1))
first = s.pull(2)
s.ack(first[0].msg_id); s.fail(first[1].msg_id)
```

The harness behaves as the engine does where a test can observe it: ``prepare`` /
``open`` get a ``TaskContext`` and a resolved config; with ``auto_ack`` a bolt's
emits are anchored to the input, which is acked when ``execute`` returns and failed
when it raises; ``execute`` / ``next_tuple`` may be ``async``; an emit on an
undeclared stream, with the wrong number of values, or with a value msgpack cannot
encode raises ``topo.api.EmitError`` at once, as the engine does. It is stricter
than the engine in one way: acking or failing a tuple twice raises ``HarnessError``,
since in a running topology that corrupts the tuple tree silently.
"""
from __future__ import annotations

import asyncio
import inspect
from dataclasses import dataclass
from typing import Any, Callable, Coroutine, Mapping, Sequence, TypeVar


from topo.api import (DEFAULT_STREAM, Bolt, Component, EndOfStream, FieldIndex, Spout, TaskContext, Tuple,
                      EmitError, check_emit)
from topo.config import resolve


class HarnessError(AssertionError):
    """The component under test did something the engine would reject or mis-handle."""


@dataclass
class Emitted:
    """One emit: the values, their stream, and what tracks it.

    ``anchors`` are the input tuples a bolt's emit is anchored to (empty when
    unanchored); ``msg_id`` is the id a spout emitted with (None: untracked).
    """

    values: list[Any]
    stream: str = DEFAULT_STREAM
    anchors: tuple[Tuple, ...] = ()
    msg_id: Any = None


_H = TypeVar("_H", bound="_Harness")


class _Harness:
    """What both harnesses share: the component's declared outputs and a task context."""

    def __init__(self, component: Component, name: str, config: Mapping[str, Any] | None,
                 task_index: int, parallelism: int) -> None:
        self.outputs = component.declare_outputs()
        self.fields = {stream: FieldIndex.of(names) for stream, names in self.outputs.items()}
        self.name = name
        self.context = TaskContext("test", name, task_index + 1, task_index, parallelism,
                                   resolve(dict(config or {})))
        self.emitted: list[Emitted] = []

    def close(self) -> None:
        """``cleanup`` / ``close`` the component, as a task does when the topology stops."""

    def __enter__(self: _H) -> _H:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _check(self, values: Sequence[Any], stream: str) -> list[Any]:
        check_emit(self.name, self.outputs, stream, values, encode=True)
        return list(values)

    def _drive(self, make: Callable[[], Coroutine[Any, Any, Any]], is_async: bool, method: str) -> Any:
        """Run one harness step from sync code.

        Steps are written once, as coroutines. With a plain user method the coroutine
        never suspends, so one ``send`` finishes it (no event loop, so a sync test may
        itself run inside one); an ``async`` user method gets ``asyncio.run``.
        """
        if not is_async:
            coro = make()
            try:
                coro.send(None)
            except StopIteration as done:
                return done.value
            coro.close()
            raise HarnessError(f"{self.name}: a plain (non-async) method awaited; declare it 'async def'")
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(make())
        raise HarnessError(f"{self.name} is async and an event loop is running here: "
                           f"use 'await harness.a{method}(...)'")


class BoltHarness(_Harness):
    """Drives one bolt instance the way a bolt task would.

    ``input_fields`` names the fields of the tuples you feed: a list for every
    stream, or ``{stream: [fields]}``. ``feed`` returns what that one call emitted;
    ``emitted``, ``acked``, ``failed`` and ``errors`` accumulate over the harness's
    life, and ``pending`` lists inputs neither acked nor failed yet (with
    ``auto_ack = False`` these would time out and replay in a topology).
    """

    def __init__(self, bolt: Bolt, input_fields: Sequence[str] | Mapping[str, Sequence[str]] = (), *,
                 config: Mapping[str, Any] | None = None, component: str = "bolt",
                 task_index: int = 0, parallelism: int = 1) -> None:
        if not isinstance(bolt, Bolt):
            raise TypeError(f"BoltHarness needs a topo.Bolt instance, got {bolt!r:.80}")
        super().__init__(bolt, component, config, task_index, parallelism)
        self.bolt = bolt
        self.auto_ack = bool(getattr(bolt, "auto_ack", True))
        if isinstance(input_fields, Mapping):
            self.input_fields = {s: FieldIndex.of(f) for s, f in input_fields.items()}
            self._any_stream: FieldIndex | None = None
        else:
            self.input_fields = {}
            self._any_stream = FieldIndex.of(input_fields)
        self.acked: list[Tuple] = []
        self.failed: list[Tuple] = []
        self.errors: list[BaseException] = []
        self.fed: list[Tuple] = []
        self._settled: set[int] = set()
        self._current: Tuple | None = None
        self._is_async = inspect.iscoroutinefunction(bolt.execute)
        bolt.prepare(self.context, _BoltCollector(self))

    @property
    def pending(self) -> list[Tuple]:
        return [t for t in self.fed if id(t) not in self._settled]

    def tuple(self, values: Sequence[Any], stream: str = DEFAULT_STREAM, source: str = "source") -> Tuple:
        """The ``Tuple`` the bolt would receive for ``values`` from ``source`` on ``stream``."""
        fields = self.input_fields.get(stream, self._any_stream)
        if fields is None:
            raise HarnessError(f"no input fields for stream {stream!r}; input_fields declares "
                               f"{sorted(self.input_fields)}")
        if fields.names and len(values) != len(fields.names):
            raise HarnessError(f"fed {len(values)} values on stream {stream!r}, whose fields are "
                               f"{list(fields.names)}")
        return Tuple(list(values), fields, stream, source, 0, None, 0.0)

    def feed(self, values: Sequence[Any] | Tuple, stream: str = DEFAULT_STREAM, source: str = "source",
             *, raise_errors: bool = False) -> list[Emitted]:
        """Execute one input; returns its emits. An exception fails the input (as the
        engine does) and is kept in ``errors``; ``raise_errors=True`` re-raises it."""
        tup = values if isinstance(values, Tuple) else self.tuple(values, stream, source)
        return self._drive(lambda: self._execute(tup, raise_errors), self._is_async, "feed")

    async def afeed(self, values: Sequence[Any] | Tuple, stream: str = DEFAULT_STREAM, source: str = "source",
                    *, raise_errors: bool = False) -> list[Emitted]:
        """``feed`` for use inside an event loop (async tests)."""
        tup = values if isinstance(values, Tuple) else self.tuple(values, stream, source)
        return await self._execute(tup, raise_errors)

    async def _execute(self, tup: Tuple, raise_errors: bool) -> list[Emitted]:
        start = self._begin(tup)
        try:
            result = self.bolt.execute(tup)
            if inspect.isawaitable(result):
                await result
        except (HarnessError, EmitError):  # a mistake in the component, not a failed tuple
            raise
        except Exception as exc:
            return self._end(tup, start, exc, raise_errors)
        return self._end(tup, start, None, raise_errors)

    def _begin(self, tup: Tuple) -> int:
        self.fed.append(tup)
        self._current = tup
        return len(self.emitted)

    def _end(self, tup: Tuple, start: int, exc: Exception | None, raise_errors: bool) -> list[Emitted]:
        self._current = None
        if exc is not None:
            self.errors.append(exc)
            self._settle(tup, self.failed, "failed")
            if raise_errors:
                raise exc
        elif self.auto_ack:
            self._settle(tup, self.acked, "acked")
        return self.emitted[start:]

    def _settle(self, tup: Tuple, book: list[Tuple], verb: str) -> None:
        if id(tup) in self._settled:
            was = "acked" if any(t is tup for t in self.acked) else "failed"
            hint = " (auto_ack is on: the harness acks when execute returns)" if self.auto_ack else ""
            raise HarnessError(f"{self.name} {verb} a tuple it already {was}{hint}: {tup!r:.100}")
        self._settled.add(id(tup))
        book.append(tup)

    def tick(self) -> list[Emitted]:
        """Call ``Bolt.tick`` as the engine's ticker would; returns its emits."""
        start = len(self.emitted)
        self.bolt.tick()
        return self.emitted[start:]

    def close(self) -> None:
        self.bolt.cleanup()


class _BoltCollector:
    """The ``OutputCollector`` a harnessed bolt sees."""

    def __init__(self, harness: BoltHarness) -> None:
        self._h = harness

    def emit(self, values: Sequence[Any], stream: str = DEFAULT_STREAM,
             anchors: Tuple | Sequence[Tuple] | None = None) -> None:
        h = self._h
        checked = h._check(values, stream)
        if anchors is None:
            anchors = h._current if h.auto_ack else None
        anchored = () if anchors is None else (anchors,) if isinstance(anchors, Tuple) else tuple(anchors)
        h.emitted.append(Emitted(checked, stream, anchored))

    def emit_many(self, values_list: Sequence[Sequence[Any]], stream: str = DEFAULT_STREAM,
                  anchors: Tuple | Sequence[Tuple] | None = None,
                  anchor_each: Sequence[Tuple] | None = None) -> None:
        for values, anchor in _beside(self._h.name, values_list, anchor_each, anchors, "anchor_each tuples"):
            self.emit(values, stream, anchor)

    def ack(self, tup: Tuple) -> None:
        self._h._settle(tup, self._h.acked, "acked")

    def fail(self, tup: Tuple, reason: str = "") -> None:
        self._h._settle(tup, self._h.failed, "failed")


class SpoutHarness(_Harness):
    """Pulls one spout instance the way a spout task would.

    Every emit with a ``msg_id`` is pending until you ``ack`` or ``fail`` it, which
    calls the spout's ``ack`` / ``fail`` (the engine would replay a failed tuple's
    values; ``fail`` returns them so a test can check what would be replayed).
    An exception from ``next_tuple`` other than ``EndOfStream`` propagates (the
    engine would log it and keep pulling).
    """

    def __init__(self, spout: Spout, *, config: Mapping[str, Any] | None = None, component: str = "spout",
                 task_index: int = 0, parallelism: int = 1) -> None:
        if not isinstance(spout, Spout):
            raise TypeError(f"SpoutHarness needs a topo.Spout instance, got {spout!r:.80}")
        super().__init__(spout, component, config, task_index, parallelism)
        self.spout = spout
        self.ended = False
        self.calls = 0
        self.pending: dict[Any, Emitted] = {}
        self.acked: list[Any] = []
        self.failed: list[Any] = []
        self._is_async = inspect.iscoroutinefunction(spout.next_tuple)
        spout.open(self.context, _SpoutCollector(self))

    def pull(self, n: int = 1, *, max_calls: int | None = None) -> list[Emitted]:
        """Call ``next_tuple`` until ``n`` tuples came out, the spout raised ``EndOfStream``
        (then ``ended`` is true), or ``max_calls`` calls (default ``100 * n``) emitted fewer."""
        return self._drive(lambda: self._pull(n, max_calls), self._is_async, "pull")

    async def apull(self, n: int = 1, *, max_calls: int | None = None) -> list[Emitted]:
        """``pull`` for use inside an event loop (async tests)."""
        return await self._pull(n, max_calls)

    async def _pull(self, n: int, max_calls: int | None) -> list[Emitted]:
        start = len(self.emitted)
        for _ in range(max_calls if max_calls is not None else 100 * max(n, 1)):
            if self.ended or len(self.emitted) - start >= n:
                break
            self.calls += 1
            try:
                result = self.spout.next_tuple()
                if inspect.isawaitable(result):
                    await result
            except EndOfStream:
                self.ended = True
        return self.emitted[start:]

    def ack(self, msg_id: Any) -> None:
        """The tuple tree of ``msg_id`` completed: call ``Spout.ack``."""
        self._take(msg_id, "ack")
        self.acked.append(msg_id)
        self.spout.ack(msg_id)

    def fail(self, msg_id: Any) -> list[Any]:
        """The tuple tree of ``msg_id`` failed: call ``Spout.fail``; returns the values
        the engine would replay."""
        emitted = self._take(msg_id, "fail")
        self.failed.append(msg_id)
        self.spout.fail(msg_id)
        return emitted.values

    def ack_all(self) -> None:
        for msg_id in list(self.pending):
            self.ack(msg_id)

    def _take(self, msg_id: Any, verb: str) -> Emitted:
        try:
            return self.pending.pop(msg_id)
        except KeyError:
            raise HarnessError(f"cannot {verb} msg_id {msg_id!r}: not pending (pending: "
                               f"{list(self.pending)[:10]!r})") from None

    def close(self) -> None:
        self.spout.close()


class _SpoutCollector:
    """The ``SpoutOutputCollector`` a harnessed spout sees."""

    def __init__(self, harness: SpoutHarness) -> None:
        self._h = harness

    def emit(self, values: Sequence[Any], stream: str = DEFAULT_STREAM, msg_id: Any = None) -> None:
        h = self._h
        emitted = Emitted(h._check(values, stream), stream, (), msg_id)
        if msg_id is not None:
            if msg_id in h.pending:
                raise HarnessError(f"{h.name} emitted msg_id {msg_id!r} while it is still pending")
            h.pending[msg_id] = emitted
        h.emitted.append(emitted)

    def emit_many(self, values_list: Sequence[Sequence[Any]], stream: str = DEFAULT_STREAM,
                  msg_ids: Sequence[Any] | None = None) -> None:
        for values, msg_id in _beside(self._h.name, values_list, msg_ids, None, "msg_ids"):
            self.emit(values, stream, msg_id)


def _beside(name: str, values_list: Sequence[Any], each: Sequence[Any] | None, default: Any,
            what: str) -> list[tuple[Any, Any]]:
    """``emit_many``'s values paired with what goes beside each (its msg_id or anchor)."""
    if each is None:
        return [(v, default) for v in values_list]
    if len(each) != len(values_list):
        raise EmitError(f"{name} called emit_many with {len(values_list)} values and {len(each)} {what} "
                        f"(one per values)")
    return list(zip(values_list, each))


__all__ = ["BoltHarness", "SpoutHarness", "Emitted", "HarnessError"]
