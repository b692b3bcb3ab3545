"""What every in-process flow control writes to a task's stats, written once.

Flow controls see a task only through its ``TaskHandle``; the local engine's
handles also carry a ``TaskStats`` (``stats``) that consoles, exporters and
benchmarks read. A handle without one (a test double) is fine: nothing is written.
"""
from __future__ import annotations

from typing import Any

from backpressure.seams import TaskHandle


def count_signal(h: TaskHandle, direction: str, kind: str) -> None:
    """Count one signal ``sent`` or ``received`` by this task."""
    stats: Any = getattr(h, "stats", None)
    if stats is not None:
        stats.count_signal(direction, kind)


def show_limit(h: TaskHandle, rate: float | None, k: int) -> None:
    """The task's limit as the console shows it: flag, step count, rate (None: limiter off)."""
    stats: Any = getattr(h, "stats", None)
    if stats is not None:
        stats.backpressure = rate is not None
        stats.k = k
        stats.rate_limit = rate
