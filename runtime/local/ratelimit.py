"""A task's emit rate limiter and its observed emit rate.

The limiter is off until flow control sets a rate (``set_rate``) and off again
after ``clear_rate``: with no rate set, ``reserve`` is one attribute test. With a
rate it is a virtual-time scheduler: each emit of ``n`` tuples is due ``n / rate``
seconds after the previous one, with at most ``burst_s`` of unused credit carried
over, so a limited task neither drifts slower nor bursts after an idle spell.
The clock is injected so the arithmetic is tested exactly.
"""
from __future__ import annotations

import math
import time
from typing import Callable

Clock = Callable[[], float]


class RateLimiter:
    __slots__ = ("rate", "burst_s", "waits", "_due", "_clock")

    def __init__(self, clock: Clock = time.monotonic, burst_s: float = 0.005) -> None:
        self.rate: float | None = None
        self.burst_s = burst_s
        self.waits = 0              # reserves that found the limit binding (a wait, however short)
        self._due = 0.0
        self._clock = clock

    def set_rate(self, tuples_per_second: float) -> None:
        if not tuples_per_second > 0 or math.isinf(tuples_per_second):
            raise ValueError(f"rate must be a positive finite number, got {tuples_per_second!r}")
        self.rate = float(tuples_per_second)

    def clear_rate(self) -> None:
        self.rate = None

    def reserve(self, n: int) -> float:
        """Account for ``n`` emits; returns how many seconds the caller should wait."""
        rate = self.rate
        if rate is None or n <= 0:
            return 0.0
        now = self._clock()
        start = self._due if self._due > now - self.burst_s else now - self.burst_s
        self._due = start + n / rate
        if self._due > now:
            self.waits += 1
            return self._due - now
        return 0.0


class EwmaRate:
    """Events per second, smoothed exponentially with time constant ``tau_s``.

    ``sample(total, now)`` is fed the running count; the weight of each sample
    depends on the time since the previous one, so irregular ticks are fine. The
    average is bias-corrected (divided by the total weight given so far, as Adam
    does): an average started at zero would read a task that has run for half a
    second at a steady 20,000/s as about 4,400/s, and the stepwise policy takes
    ``originv`` from this figure when it first throttles a task.
    """

    __slots__ = ("tau_s", "value", "_raw", "_weight", "_last_total", "_last_time")

    def __init__(self, tau_s: float = 2.0) -> None:
        self.tau_s = tau_s
        self.value = 0.0
        self._raw = 0.0
        self._weight = 0.0
        self._last_total: int | None = None
        self._last_time = 0.0

    def sample(self, total: int, now: float) -> float:
        if self._last_total is None:
            self._last_total, self._last_time = total, now
            return self.value
        dt = now - self._last_time
        if dt <= 0:
            return self.value
        instant = (total - self._last_total) / dt
        alpha = 1.0 - math.exp(-dt / self.tau_s)
        self._raw += alpha * (instant - self._raw)
        self._weight += alpha * (1.0 - self._weight)
        self.value = self._raw / self._weight
        self._last_total, self._last_time = total, now
        return self.value
