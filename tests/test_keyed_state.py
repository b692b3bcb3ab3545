"""KeyedBolt on the local engine's terms: per-key dict state kept by the task."""
from __future__ import annotations

import pytest

from topo.api import FieldIndex, TaskContext, Tuple
from topo.state import KeyedBolt, hashable_key


class Counter(KeyedBolt):
    outputs = ["word", "count"]
    key_fields = ("word",)

    def process(self, tup, state):
        state["n"] = state.get("n", 0) + 1
        self.collector.emit([tup["word"], state["n"]])


class Collect:
    def __init__(self):
        self.out = []

    def emit(self, values, stream="default", anchors=None):
        self.out.append(list(values))

    def ack(self, t):
        pass

    def fail(self, t):
        pass


def tup(*values, fields=("word",)):
    return Tuple(list(values), FieldIndex.of(fields))


def test_state_per_key_persists_between_calls():
    b = Counter()
    c = Collect()
    b.prepare(TaskContext("t", "count", 1, 0, 1, {}), c)
    for w in ["a", "b", "a", "a"]:
        b.execute(tup(w))
    assert c.out == [["a", 1], ["b", 1], ["a", 2], ["a", 3]]
    assert dict(b.keyed_state()) == {"a": {"n": 3}, "b": {"n": 1}}


def test_empty_state_drops_key_and_multi_field_keys():
    class Toggle(KeyedBolt):
        key_fields = ("x", "y")

        def process(self, t, state):
            if state:
                state.clear()
            else:
                state["on"] = True

    b = Toggle()
    b.prepare(TaskContext("t", "tg", 1, 0, 1, {}), Collect())
    b.execute(tup(1, 2, fields=("x", "y")))
    assert dict(b.keyed_state()) == {(1, 2): {"on": True}}
    b.execute(tup(1, 2, fields=("x", "y")))
    assert dict(b.keyed_state()) == {}


def test_key_fields_required():
    class Bad(KeyedBolt):
        pass

    with pytest.raises(TypeError):
        Bad().prepare(TaskContext("t", "b", 1, 0, 1, {}), Collect())


def test_hashable_key():
    assert hashable_key([1, [2, 3]]) == (1, (2, 3))
    assert hashable_key("a") == "a"
