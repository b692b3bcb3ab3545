"""A fast source feeding a slow stage: stepwise backpressure to watch in the console.

``events`` offers ``rate`` tuples/s on a schedule (a source, not a backlog: when it
is throttled it produces fewer, it does not pile them up). ``enrich`` can handle
only ``rate`` tuples/s, so its queue fills, crosses the high mark, and the stepwise
policy steps ``events`` down until ``enrich`` keeps up. ``tally`` is a second,
fast branch from the same source.
"""
from __future__ import annotations

import asyncio
import time

from topo.api import Bolt, Spout, Tuple


class OfferedSpout(Spout):
    """Offers ``rate`` tuples/s of ``(seq, payload)``; ``payload`` is ``pad`` bytes."""

    outputs = ["seq", "payload"]

    def __init__(self, rate: float = 20_000, pad: int = 100) -> None:
        if rate <= 0:
            raise ValueError(f"rate must be > 0, got {rate!r}")
        self.rate = float(rate)
        self.payload = "x" * pad
        self.seq = 0
        self.t0: float | None = None

    async def next_tuple(self) -> None:
        now = time.monotonic()
        if self.t0 is None:
            self.t0 = now
        due = int((now - self.t0) * self.rate) - self.seq
        if due <= 0:
            await asyncio.sleep(0.001)
            return
        if due > 256:  # never catch up by more than a batch after a pause
            self.t0 = now - (self.seq + 256) / self.rate
            due = 256
        for _ in range(due):
            self.collector.emit([self.seq, self.payload])
            self.seq += 1


class PacedBolt(Bolt):
    """Handles at most ``rate`` tuples/s, like a stage bound by an external service."""

    outputs = ["seq"]

    def __init__(self, rate: float = 5_000) -> None:
        if rate <= 0:
            raise ValueError(f"rate must be > 0, got {rate!r}")
        self.rate = float(rate)
        self.t0: float | None = None
        self.done = 0

    async def execute(self, tup: Tuple) -> None:
        now = time.monotonic()
        if self.t0 is None:
            self.t0 = now
        self.done += 1
        ahead = self.done / self.rate - (now - self.t0)
        if ahead > 0.002:
            await asyncio.sleep(ahead)
        elif ahead < -1.0:  # idle for a while: do not bank unused capacity
            self.t0 = now - self.done / self.rate
        self.collector.emit([tup["seq"]])


class CountBolt(Bolt):
    """Counts what it sees (the fast branch)."""

    def __init__(self) -> None:
        self.count = 0

    def execute(self, tup: Tuple) -> None:
        self.count += 1
