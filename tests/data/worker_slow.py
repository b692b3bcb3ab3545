"""Components the worker-process flow-control and checkpoint tests ship to workers."""
from __future__ import annotations

import time
from typing import Any

from topo.api import Bolt, EndOfStream, Spout, Tuple
from topo.state import KeyedBolt


class SlowThenFast(Bolt):
    """Sleeps ``delay_s`` per tuple for its first ``slow_for`` tuples, then passes at full speed:
    the overload is real, and so is the recovery a policy must release the spouts after."""

    outputs = ["n"]

    def __init__(self, delay_s: float, slow_for: int) -> None:
        self.delay_s, self.slow_for, self.seen = delay_s, slow_for, 0

    def execute(self, tup: Tuple) -> Any:
        self.seen += 1
        if self.seen <= self.slow_for:
            time.sleep(self.delay_s)
        self.collector.emit([tup["n"]])


class Padded(Spout):
    """0..total-1, each with ``pad`` bytes of payload (so a few hundred fill a small queue),
    tracked by the number."""

    outputs = ["n", "pad"]

    def __init__(self, total: int, pad: int) -> None:
        self.total, self.pad, self.i = total, "x" * pad, 0

    def next_tuple(self) -> None:
        if self.i >= self.total:
            raise EndOfStream
        self.collector.emit([self.i, self.pad], msg_id=self.i)
        self.i += 1


class KeyedWordCount(KeyedBolt):
    """Counts words with per-key state (checkpointed with the topology); emits (word, count).
    Sleeps ``pause_s`` once per ``every`` tuples, so a run lasts long enough to kill workers
    in it twice (without the pause the whole run ends in about a second)."""

    outputs = ["word", "count"]
    key_fields = ("word",)

    def __init__(self, pause_s: float = 0.0, every: int = 1) -> None:
        self.pause_s, self.every, self.seen = pause_s, every, 0

    def process(self, tup: Tuple, state: dict[str, Any]) -> None:
        self.seen += 1
        if self.pause_s and self.seen % self.every == 0:
            time.sleep(self.pause_s)
        state["n"] = state.get("n", 0) + 1
        self.collector.emit([tup["word"], state["n"]])
