"""Per-task plain counters, written on the hot path and read by exporters.

A labelled prometheus ``inc()`` costs about a microsecond, more than a queue hop,
so tasks bump plain attributes here and the Prometheus collector, the console and
the status file read them when they are scraped or refreshed.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from backpressure.seams import FlowDisplay

# Latency bucket upper bounds in seconds (Prometheus-style cumulative on export).
LATENCY_BUCKETS: tuple[float, ...] = (
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
)


@dataclass
class Histogram:
    """Fixed buckets, non-cumulative counts; ``observe`` is one bisect and two adds."""

    bounds: tuple[float, ...] = LATENCY_BUCKETS
    counts: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BUCKETS) + 1))
    total: float = 0.0
    n: int = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value
        self.n += 1

    def quantile(self, q: float) -> float:
        """Upper bound of the bucket holding quantile ``q`` (what Prometheus would estimate)."""
        if self.n == 0:
            return 0.0
        rank = q * self.n
        seen = 0
        for i, c in enumerate(self.counts):
            seen += c
            if seen >= rank:
                return self.bounds[i] if i < len(self.bounds) else float("inf")
        return float("inf")


@dataclass
class TaskStats:
    """Everything observable about one task; plain numbers, no locks (one event loop)."""

    topology: str
    component: str
    task_id: int
    is_spout: bool
    emitted: int = 0
    executed: int = 0
    acked: int = 0
    failed: int = 0
    replayed: int = 0
    dead_lettered: int = 0
    # Flink's three-way split of wall time, accumulated in nanoseconds.
    busy_ns: int = 0
    idle_ns: int = 0
    backpressured_ns: int = 0
    queue_bytes: int = 0
    queue_tuples: int = 0
    high_mark: int = 0
    low_mark: int = 0
    hard_bound: int = 0
    rate_limit: float | None = None      # tuples/s; None = limiter off (written by the task only)
    # ``emitted`` when flow control first turned the limiter off after it had been on: how
    # far a spout had got when its first episode ended, recorded by the task itself so that
    # a test need not catch the moment by sampling.
    emitted_at_first_release: int | None = None
    observed_rate: float = 0.0           # EWMA of emits/s
    processed_rate: float = 0.0          # EWMA of executed input tuples/s (bolts)
    upstream: tuple[int, ...] = ()       # direct upstream task ids (who this task can throttle)
    originv: float | None = None         # rate before the first backpressure step
    k: int = 0                           # backpressure step count
    backpressure: bool = False           # backpressure flag (document 000)
    backpressure_episodes: int = 0       # times the flag went up: a short episode is counted too
    signals_sent: dict[str, int] = field(default_factory=dict)
    signals_received: dict[str, int] = field(default_factory=dict)
    execute_latency: Histogram = field(default_factory=Histogram)
    complete_latency: Histogram = field(default_factory=Histogram)  # spout emit -> ack

    @property
    def task_name(self) -> str:
        return f"{self.component}:{self.task_id}"

    def show(self, display: FlowDisplay) -> None:
        """What flow control says of this task (the limit itself is the limiter's, set apart)."""
        self.k = display.k
        if display.backpressure and not self.backpressure:
            self.backpressure_episodes += 1
        self.backpressure = display.backpressure
        if display.originv is not None:
            self.originv = display.originv      # kept after a release: the last episode's

    def count_signal(self, direction: str, kind: str) -> None:
        book = self.signals_sent if direction == "sent" else self.signals_received
        book[kind] = book.get(kind, 0) + 1

    def snapshot(self) -> dict:
        """A JSON/msgpack-friendly record (status file, console, taskstate)."""
        return {
            "topology": self.topology, "component": self.component, "task": self.task_id,
            "spout": self.is_spout, "emitted": self.emitted, "executed": self.executed,
            "acked": self.acked, "failed": self.failed, "replayed": self.replayed,
            "dead_lettered": self.dead_lettered, "queue_bytes": self.queue_bytes,
            "queue_tuples": self.queue_tuples, "high_mark": self.high_mark, "low_mark": self.low_mark,
            "hard_bound": self.hard_bound, "rate": self.rate_limit, "observed_rate": self.observed_rate,
            "processed_rate": self.processed_rate, "upstream": list(self.upstream),
            "originv": self.originv, "k": self.k, "backpressure": self.backpressure,
        }
