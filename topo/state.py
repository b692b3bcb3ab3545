"""Per-key state for fields-grouped bolts, the same on both engines.

A Storm bolt behind a fields grouping usually keeps a dict from key to something (a
count, a window). On the local engine that dict can live in the bolt instance, but on
Spark a bolt instance lives for one micro-batch in one partition, so instance
attributes do not survive. ``KeyedBolt`` names the state instead: set ``key_fields``
(the fields the bolt is grouped on) and implement ``process(tup, state)``, where
``state`` is a plain ``dict`` that belongs to the tuple's key and persists between
calls.

* **Local engine**: ``execute`` (which the engine calls as for any bolt) keeps one dict
  per key in the task's instance, so the engine needs no change. Fields grouping
  routes a key to one task, so each task holds its own keys.
* **Spark engine**: the bolt runs in ``applyInPandasWithState`` grouped by
  ``key_fields``; each key's dict is stored in Spark's state store between
  micro-batches (msgpack-encoded), and ``process`` is called the same way.

Rules that make the two agree: values in ``state`` must be msgpack-serialisable
(numbers, strings, bytes, lists, dicts, None); an empty dict means "no state" and
the key is dropped; ``process`` is a plain (not ``async``) function. The key that
``key_of`` returns is the single field's value, or a tuple of the values for several
fields.
"""
from __future__ import annotations

from typing import Any, Callable, Iterable, Iterator, Sequence

from topo.api import Bolt, OutputCollector, TaskContext, Tuple


class KeyedBolt(Bolt):
    """A bolt with per-key state (see the module docstring)."""

    key_fields: Sequence[str] = ()

    def prepare(self, context: TaskContext, collector: OutputCollector) -> None:
        super().prepare(context, collector)
        if not self.key_fields:
            raise TypeError(f"{type(self).__name__}: a KeyedBolt must set key_fields")
        self._states: dict[Any, dict[str, Any]] = {}

    def key_of(self, tup: Tuple) -> Any:
        fields = tuple(self.key_fields)
        if len(fields) == 1:
            return tup[fields[0]]
        return tuple(tup[f] for f in fields)

    def execute(self, tup: Tuple) -> Any:
        key = self.key_of(tup)
        states = self._states
        state = states.get(key)
        if state is None:
            state = {}
        result = self.process(tup, state)
        if state:
            states[key] = state
        else:
            states.pop(key, None)
        return result

    def process(self, tup: Tuple, state: dict[str, Any]) -> Any:
        """Handle one tuple with its key's state; emit through ``self.collector``."""
        raise NotImplementedError

    def snapshot_state(self) -> Any:
        """Every key's state as ``[key, state]`` pairs (checkpoints; packed at once by the engine)."""
        return [[k, v] for k, v in self._states.items()]

    def restore_state(self, state: Any) -> None:
        self._states = {hashable_key(k): v for k, v in state}

    def take_keys(self, leaving: Callable[[Any], bool]) -> list[tuple[Any, dict[str, Any]]]:
        """Remove and return the keys (with their state) for which ``leaving(key)``: the
        local engine moves a key group's state to its new task when it rescales."""
        states = self._states
        out = [(k, v) for k, v in states.items() if leaving(k)]
        for k, _ in out:
            del states[k]
        return out

    def give_keys(self, pairs: Iterable[tuple[Any, dict[str, Any]]]) -> None:
        """Take over keys another task of this component held (the other half of ``take_keys``)."""
        self._states.update(pairs)

    def keyed_state(self) -> Iterator[tuple[Any, dict[str, Any]]]:
        """(key, state) for every key this task holds (local engine; for tests and dumps)."""
        return iter(list(getattr(self, "_states", {}).items()))


def hashable_key(value: Any) -> Any:
    """A msgpack-decoded key made hashable (lists become tuples, recursively)."""
    if isinstance(value, list):
        return tuple(hashable_key(v) for v in value)
    return value
