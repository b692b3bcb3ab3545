"""A running count sampled on a timer and kept for about one window: what it grew by lately.

Drivers meter a task's counters this way (the water-mark policy's service rate, the adaptive
policy's per-check executed rate, stepwise's recent emits): a rate meter averaged over seconds
cannot say what a task did just now.
"""
from __future__ import annotations

from collections import deque


class CountWindow:
    """Samples ``(time, count)`` of one counter, the oldest kept the newest at least ``window`` old."""

    def __init__(self, window: float) -> None:
        self.window = window
        self._samples: deque[tuple[float, int]] = deque()

    def sample(self, now: float, count: int) -> None:
        s = self._samples
        s.append((now, count))
        while len(s) > 2 and now - s[1][0] >= self.window:
            s.popleft()           # keep the newest sample at least a window old

    def clear(self) -> None:
        self._samples.clear()

    def since_oldest(self, now: float, count: int) -> tuple[int, float] | None:
        """``(count - count then, now - then)`` since the oldest sample kept; None before any."""
        if not self._samples:
            return None
        t0, c0 = self._samples[0]
        return count - c0, now - t0
