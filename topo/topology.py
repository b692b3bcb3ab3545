"""Topology builder and validation.

A topology is a DAG of components. Cycles are rejected: under backpressure a cycle
can deadlock (each task waits for queue space held by the next, STORM-3637), and a
runtime whose point is flow control must not ship that trap.

A component may name the fields it reads from every input in ``input_fields`` (a
sink's columns, say): the topology checks that each input stream declares them, so
a misspelled field is a validation error rather than every tuple failing at run time.
It may name the files it will write in ``writes_to`` (``{argument: path}``): ``topo
run`` checks they can be written before the run starts.

Parallelism is at most ``MAX_PARALLELISM`` tasks per component: each task has its
queue, its outbox lanes to every downstream task and its asyncio task, so a typo of
a few zeros would take the machine before the first tuple.

Each parallel task gets its own instance of the component: the builder keeps a
prototype and the engine deep-copies it per task (Storm serializes the instance for
the same reason), or calls a zero-argument factory when one is given.
"""
from __future__ import annotations

import copy
import functools
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

from topo.api import DEFAULT_STREAM, Bolt, Spout
from topo.groupings import (AllGrouping, FieldsGrouping, GlobalGrouping, Grouping,
                            LoadAwareGrouping, LocalOrShuffleGrouping, ShuffleGrouping)


MAX_PARALLELISM = 1024


class TopologyError(ValueError):
    """A topology that cannot run; the message names the component and what is wrong."""


@dataclass
class Input:
    """One subscription: ``source`` component's ``stream`` into this bolt with ``grouping``."""

    source: str
    stream: str
    grouping: Grouping


@dataclass
class ComponentSpec:
    id: str
    kind: str  # "spout" or "bolt"
    make: Callable[[], Spout | Bolt]
    parallelism: int
    outputs: dict[str, tuple[str, ...]]
    inputs: list[Input] = field(default_factory=list)
    class_name: str = ""
    input_fields: tuple[str, ...] = ()   # fields the component reads from every input
    writes_to: dict[str, str] = field(default_factory=dict)   # argument -> a file it will write

    def instance(self) -> Spout | Bolt:
        return self.make()


class BoltDeclarer:
    """Returned by ``TopologyBuilder.bolt``; chain groupings to subscribe to inputs."""

    def __init__(self, spec: ComponentSpec) -> None:
        self._spec = spec

    def grouping(self, source: str, grouping: Grouping, stream: str = DEFAULT_STREAM) -> "BoltDeclarer":
        self._spec.inputs.append(Input(source, stream, grouping))
        return self

    def shuffle(self, source: str, stream: str = DEFAULT_STREAM) -> "BoltDeclarer":
        return self.grouping(source, ShuffleGrouping(), stream)

    def fields(self, source: str, *fields: str, stream: str = DEFAULT_STREAM) -> "BoltDeclarer":
        return self.grouping(source, FieldsGrouping(fields), stream)

    def all(self, source: str, stream: str = DEFAULT_STREAM) -> "BoltDeclarer":
        return self.grouping(source, AllGrouping(), stream)

    def global_(self, source: str, stream: str = DEFAULT_STREAM) -> "BoltDeclarer":
        return self.grouping(source, GlobalGrouping(), stream)

    def local_or_shuffle(self, source: str, stream: str = DEFAULT_STREAM) -> "BoltDeclarer":
        return self.grouping(source, LocalOrShuffleGrouping(), stream)

    def load_aware(self, source: str, stream: str = DEFAULT_STREAM) -> "BoltDeclarer":
        return self.grouping(source, LoadAwareGrouping(), stream)


def _maker(component: Spout | Bolt | Callable[[], Spout | Bolt]) -> tuple[Callable[[], Any], Any]:
    if isinstance(component, (Spout, Bolt)):
        # A partial, not a lambda: it pickles (by reference to the class), so a topology
        # built with the Python API can be shipped to worker processes.
        return functools.partial(copy.deepcopy, component), component
    if callable(component):
        proto = component()
        return component, proto
    raise TopologyError(f"expected a Spout, a Bolt or a factory, got {component!r}")


class TopologyBuilder:
    """Python API for building a topology; ``build()`` validates and freezes it."""

    def __init__(self, name: str, config: dict[str, Any] | None = None) -> None:
        self.name = name
        self.config: dict[str, Any] = dict(config or {})
        self._components: dict[str, ComponentSpec] = {}
        self._errors: list[str] = []

    def _add(self, cid: str, kind: str, component: Any, parallelism: int) -> ComponentSpec:
        if cid in self._components:
            self._errors.append(f"duplicate component id {cid!r}")
        make, proto = _maker(component)
        expected = Spout if kind == "spout" else Bolt
        if not isinstance(proto, expected):
            raise TopologyError(f"component {cid!r}: {type(proto).__name__} is not a {expected.__name__}")
        spec = ComponentSpec(cid, kind, make, parallelism, proto.declare_outputs(),
                             class_name=f"{type(proto).__module__}.{type(proto).__qualname__}",
                             input_fields=tuple(getattr(proto, "input_fields", ()) or ()),
                             writes_to=dict(getattr(proto, "writes_to", {}) or {}))
        self._components.setdefault(cid, spec)
        return spec

    def spout(self, cid: str, spout: Spout | Callable[[], Spout], parallelism: int = 1) -> None:
        self._add(cid, "spout", spout, parallelism)

    def bolt(self, cid: str, bolt: Bolt | Callable[[], Bolt], parallelism: int = 1) -> BoltDeclarer:
        return BoltDeclarer(self._add(cid, "bolt", bolt, parallelism))

    def build(self) -> "Topology":
        topology = Topology(self.name, dict(self._components), dict(self.config))
        errors = self._errors + topology.problems()
        if errors:
            raise TopologyError(f"topology {self.name!r}: " + "; ".join(errors))
        return topology


@dataclass
class Topology:
    name: str
    components: dict[str, ComponentSpec]
    config: dict[str, Any] = field(default_factory=dict)

    @property
    def spouts(self) -> list[ComponentSpec]:
        return [c for c in self.components.values() if c.kind == "spout"]

    @property
    def bolts(self) -> list[ComponentSpec]:
        return [c for c in self.components.values() if c.kind == "bolt"]

    def downstream(self, cid: str) -> Iterator[tuple[ComponentSpec, Input]]:
        for c in self.components.values():
            for i in c.inputs:
                if i.source == cid:
                    yield c, i

    def problems(self) -> list[str]:
        """Every reason this topology cannot run, each naming the component."""
        errs: list[str] = []
        if not self.spouts:
            errs.append("no spouts")
        for c in self.components.values():
            if not isinstance(c.parallelism, int) or isinstance(c.parallelism, bool) or c.parallelism < 1:
                errs.append(f"component {c.id!r}: parallelism must be an integer >= 1, got {c.parallelism!r}")
            elif c.parallelism > MAX_PARALLELISM:
                errs.append(f"component {c.id!r}: parallelism must be at most {MAX_PARALLELISM}, got {c.parallelism!r}")
            if c.kind == "bolt" and not c.inputs:
                errs.append(f"bolt {c.id!r} has no inputs")
            subscribed: set[tuple[str, str]] = set()
            for i in c.inputs:
                if (i.source, i.stream) in subscribed:
                    errs.append(f"bolt {c.id!r} subscribes to stream {i.stream!r} of {i.source!r} twice "
                                "(each tuple would be delivered twice)")
                    continue
                subscribed.add((i.source, i.stream))
                src = self.components.get(i.source)
                if src is None:
                    errs.append(f"bolt {c.id!r} reads from unknown component {i.source!r}")
                    continue
                if i.stream not in src.outputs:
                    errs.append(f"bolt {c.id!r} reads stream {i.stream!r} that {i.source!r} does not "
                                f"declare (declared: {sorted(src.outputs)})")
                    continue
                err = i.grouping.check(src.outputs[i.stream])
                if err:
                    errs.append(f"bolt {c.id!r} from {i.source!r}: {err}")
                missing = [f for f in c.input_fields if f not in src.outputs[i.stream]]
                if missing:
                    errs.append(f"bolt {c.id!r} reads fields {missing} that stream {i.stream!r} of {i.source!r} "
                                f"does not declare (declared: {list(src.outputs[i.stream])})")
        cycle = self.find_cycle()
        if cycle:
            errs.append("cycle " + " -> ".join(cycle) + " (cycles can deadlock under "
                        "backpressure, see STORM-3637; break it with an external queue)")
        return errs

    def find_cycle(self) -> list[str] | None:
        graph = {c.id: [i.source for i in c.inputs if i.source in self.components]
                 for c in self.components.values()}
        state: dict[str, int] = {}
        path: list[str] = []

        def visit(n: str) -> list[str] | None:
            state[n] = 1
            path.append(n)
            for m in graph[n]:
                if state.get(m) == 1:
                    return list(reversed(path[path.index(m):] + [m]))
                if m not in state:
                    found = visit(m)
                    if found:
                        return found
            state[n] = 2
            path.pop()
            return None

        for n in graph:
            if n not in state:
                found = visit(n)
                if found:
                    return found
        return None

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "components": [
                {"id": c.id, "kind": c.kind, "class": c.class_name, "parallelism": c.parallelism,
                 "outputs": {s: list(f) for s, f in c.outputs.items()},
                 "inputs": [{"from": i.source, "stream": i.stream, **i.grouping.describe()} for i in c.inputs]}
                for c in self.components.values()
            ],
        }


__all__: Sequence[str] = ["TopologyBuilder", "Topology", "TopologyError", "ComponentSpec", "Input"]
