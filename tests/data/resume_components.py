"""Components of the resume-point tests (document 002's ack point kept across a kill -9)."""
from __future__ import annotations

import os
import time
from typing import Any

from topo.api import Bolt, EndOfStream, Spout, Tuple


class Counting(Spout):
    """0..total-1, tracked by the number; its state is the next number. Each restore appends
    the number it resumes at to ``restores`` (a file), so a test sees where a restart began."""

    outputs = ["n", "pad"]

    def __init__(self, total: int, restores: str, pad: int = 100) -> None:
        self.total, self.restores, self.pad, self.i = total, restores, "x" * pad, 0

    def next_tuple(self) -> None:
        if self.i >= self.total:
            raise EndOfStream
        self.collector.emit([self.i, self.pad], msg_id=self.i)
        self.i += 1

    def snapshot_state(self) -> Any:
        return {"i": self.i}

    def restore_state(self, state: Any) -> None:
        self.i = int(state["i"])
        with open(self.restores, "a") as f:
            f.write(f"{self.i}\n")


class Record(Bolt):
    """Appends every n it executes to ``path`` (flushed before the tuple is acked), optionally
    sleeping per tuple: a slow sink whose file shows each delivery, duplicates included."""

    def __init__(self, path: str, delay_s: float = 0.0) -> None:
        self.path, self.delay_s = path, delay_s

    def prepare(self, context: Any, collector: Any) -> None:
        super().prepare(context, collector)
        self._f = open(self.path, "a", buffering=1)

    def execute(self, tup: Tuple) -> None:
        if self.delay_s:
            time.sleep(self.delay_s)
        self._f.write(f"{tup['n']}\n")

    def cleanup(self) -> None:
        self._f.flush()
        os.fsync(self._f.fileno())
        self._f.close()


def deliveries(path: str) -> list[int]:
    """Every n the Record bolt wrote, in order (a line cut short by a kill is left out)."""
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [int(line) for line in f.read().split("\n")[:-1] if line.strip().isdigit()]
