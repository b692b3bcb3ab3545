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

    def snapshot_state(self) -> int:      # the offset (checkpoints)
        return self.i

    def restore_state(self, state: int) -> None:
        self.i = state


class HeldPacedWords(PacedWords):
    """``PacedWords`` that emit nothing past ``hold_at`` until the file ``release`` exists:
    a run cannot reach the end of its input while a test still waits for something (a
    checkpoint, a rescale), however slow the machine. The spout idles at a call boundary
    meanwhile, where checkpoints take it; a worker restarted after the file appeared runs on."""

    def __init__(self, n: int, hold_at: int, release: str) -> None:
        super().__init__(n)
        self.hold_at, self.release = hold_at, release

    async def next_tuple(self) -> None:
        import os
        if self.i >= self.hold_at and not os.path.exists(self.release):
            await asyncio.sleep(0.005)
            return
        await super().next_tuple()


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


class ScheduledWords(Spout):
    """Offers ``high`` words/s until the wall-clock time ``calm_at``, then ``low`` words/s until
    ``end_at``, then ends: a source whose load goes away. Words are ``WORDS`` round robin by
    index, tracked by the index, so the words of the indexes acked are what was counted."""

    outputs = ["word", "pad"]

    def __init__(self, high: float, low: float, calm_at: float, end_at: float) -> None:
        self.high, self.low, self.calm_at, self.end_at = high, low, calm_at, end_at
        self.pad, self.i = "x" * 64, 0
        self.t0: float | None = None
        self.base = 0

    async def next_tuple(self) -> None:
        import time
        now = time.time()
        if now >= self.end_at:
            raise EndOfStream
        rate = self.high if now < self.calm_at else self.low
        if self.t0 is None or (now >= self.calm_at and self.t0 < self.calm_at):
            self.t0, self.base = now, self.i
        due = int((now - self.t0) * rate) - (self.i - self.base)
        if due > 256:                 # throttled: owe at most one call's catch-up
            self.t0, self.base, due = now, self.i, 256
        for _ in range(max(0, due)):
            self.collector.emit([WORDS[self.i % len(WORDS)], self.pad], msg_id=self.i)
            self.i += 1
        await asyncio.sleep(0.002)


class _SlowedCount(FinalKeyedCount):
    """``FinalKeyedCount`` at no more than ``per_task`` words/s per task while ``slowed()``."""

    per_task: float
    k: int

    def slowed(self) -> bool:
        raise NotImplementedError

    async def execute(self, tup: Tuple) -> None:   # type: ignore[override]
        KeyedBolt.execute(self, tup)
        self.k += 1
        if self.k % 20 == 0 and self.slowed():
            await asyncio.sleep(20 / self.per_task)


class SlowThenFastCount(_SlowedCount):
    """Slow until the wall-clock time ``fast_at``, then at full speed."""

    def __init__(self, per_task: float, fast_at: float) -> None:
        self.per_task, self.fast_at, self.k = per_task, fast_at, 0

    def slowed(self) -> bool:
        import time
        return time.time() < self.fast_at


class SlowWhileFileCount(_SlowedCount):
    """Slow while the file ``slow`` exists, then at full speed: its queue stays full while the
    spout runs, so a worker killed meanwhile is sure to hold tuples that were never acked."""

    def __init__(self, per_task: float, slow: str) -> None:
        self.per_task, self.slow, self.k = per_task, slow, 0

    def slowed(self) -> bool:
        import os
        return os.path.exists(self.slow)
