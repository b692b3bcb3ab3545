"""Components the checkpoint tests name from YAML (tests/data is put on PYTHONPATH)."""
from __future__ import annotations

import time

from topo.api import Bolt, Tuple


class SlowPass(Bolt):
    """Passes (word, count) on after ``delay_s``: a slow stage ahead of the sink."""

    outputs = ["word", "count"]

    def __init__(self, delay_s: float = 0.001) -> None:
        self.delay_s = delay_s

    def execute(self, tup: Tuple) -> None:
        time.sleep(self.delay_s)
        self.collector.emit([tup["word"], tup["count"]])
