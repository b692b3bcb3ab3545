"""Components the autoscaling-across-workers tests ship to worker processes."""
from __future__ import annotations

import asyncio
from typing import Any

from topo.api import EndOfStream, Spout, Tuple
from topo.state import KeyedBolt

WORDS = [f"w{i}" for i in range(200)]


def truth(n: int) -> dict[str, int]:
    """What a count of the first ``n`` words of ``PacedWords`` must give."""
    out: dict[str, int] = {}
    for i in range(n):
        out[WORDS[i % len(WORDS)]] = out.get(WORDS[i % len(WORDS)], 0) + 1
    return out


class PacedWords(Spout):
    """``n`` words (``WORDS`` round robin), tracked by their index, ``per_call`` each call and
    a ``pause_s`` sleep after each: a source of about per_call / pause_s words/s, so a run
    lasts long enough to rescale under load."""

    outputs = ["word", "pad"]

    def __init__(self, n: int, per_call: int = 20, pause_s: float = 0.002, pad: int = 64) -> None:
        self.n, self.per_call, self.pause_s, self.pad, self.i = n, per_call, pause_s, "x" * pad, 0

    async def next_tuple(self) -> None:
        if self.i >= self.n:
            raise EndOfStream
        for _ in range(min(self.per_call, self.n - self.i)):
            self.collector.emit([WORDS[self.i % len(WORDS)], self.pad], msg_id=self.i)
            self.i += 1
        await asyncio.sleep(self.pause_s)


class FinalKeyedCount(KeyedBolt):
    """Counts words in keyed state (what a rescale moves between workers) and emits each
    word's count once, when the input ends."""

    outputs = ["word", "count"]
    key_fields = ("word",)

    def process(self, tup: Tuple, state: dict[str, Any]) -> None:
        state["n"] = state.get("n", 0) + 1

    def end_of_input(self) -> None:
        for word, state in self.keyed_state():
            self.collector.emit([word, state["n"]])
