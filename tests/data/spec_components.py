"""Spouts and bolts the topology-file tests name by class (``spec_components.X``)."""
from __future__ import annotations

from typing import Any

from topo.api import Bolt, EndOfStream, Spout, Tuple


class Sentences(Spout):
    """Emits ``count`` sentences, then ends."""

    outputs = ["sentence"]

    def __init__(self, count: int = 10, text: str = "the quick brown fox") -> None:
        self.count = count
        self.text = text
        self.sent = 0

    def next_tuple(self) -> None:
        if self.sent >= self.count:
            raise EndOfStream
        self.sent += 1
        self.collector.emit([self.text], msg_id=self.sent)


class Split(Bolt):
    outputs = ["word"]

    def __init__(self, lower: bool = False) -> None:
        self.lower = lower

    def execute(self, tup: Tuple) -> None:
        for word in tup["sentence"].split():
            self.collector.emit([word.lower() if self.lower else word])


class Count(Bolt):
    outputs = {"default": ["word", "count"], "totals": ["total"]}

    def __init__(self, seen: list[str] | None = None) -> None:
        self.counts: dict[str, int] = {}
        self.seen = seen if seen is not None else []

    def execute(self, tup: Tuple) -> None:
        word = tup["word"]
        self.seen.append(word)
        self.counts[word] = self.counts.get(word, 0) + 1
        self.collector.emit([word, self.counts[word]])


class NeedsPath(Bolt):
    """A constructor with a required argument."""

    outputs = ["line"]

    def __init__(self, path: str) -> None:
        self.path = path

    def execute(self, tup: Tuple) -> None:
        pass


class Picky(Bolt):
    """A constructor that rejects a value it was given."""

    def __init__(self, level: int = 1) -> None:
        if level > 3:
            raise ValueError(f"level must be at most 3, not {level}")
        self.level = level

    def execute(self, tup: Tuple) -> None:
        pass


class NotAComponent:
    pass


def make_spout() -> Any:
    return Sentences()
