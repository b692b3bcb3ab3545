"""Components the worker-process tests ship to workers (importable: tests/data is on the path)."""
from __future__ import annotations

import time
from typing import Any

from topo.api import Bolt, EndOfStream, Spout, Tuple


class Numbers(Spout):
    """0..total-1 (total 0: endless), tracked by the number."""

    outputs = ["n"]

    def __init__(self, total: int) -> None:
        self.total, self.i = total, 0

    def next_tuple(self) -> None:
        if self.total and self.i >= self.total:
            raise EndOfStream
        self.collector.emit([self.i], msg_id=self.i)
        self.i += 1


class Pass(Bolt):
    """Passes n on, optionally sleeping per tuple (a slow stage)."""

    outputs = ["n"]

    def __init__(self, delay_s: float = 0.0) -> None:
        self.delay_s = delay_s

    def execute(self, tup: Tuple) -> Any:
        if self.delay_s:
            time.sleep(self.delay_s)
        self.collector.emit([tup["n"]])
