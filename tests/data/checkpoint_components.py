"""Components the checkpoint tests name from YAML (tests/data is put on PYTHONPATH)."""
from __future__ import annotations

import time

from topo.api import Bolt, Tuple


class SlowPass(Bolt):
    """Passes (word, count) on after ``delay_s``: a slow stage ahead of the sink. With
    ``every`` > 1 it sleeps ``delay_s`` once per ``every`` tuples instead."""

    outputs = ["word", "count"]

    def __init__(self, delay_s: float = 0.001, every: int = 1) -> None:
        self.delay_s, self.every, self.seen = delay_s, every, 0

    def execute(self, tup: Tuple) -> None:
        self.seen += 1
        if self.seen % self.every == 0:
            time.sleep(self.delay_s)
        self.collector.emit([tup["word"], tup["count"]])
