"""Per-query counters of the Spark engine, read by the Prometheus exporter at scrape time.

The Spark engine runs on the driver's listener thread, not on the local engine's event
loop, so it gets its own small record instead of pretending to be a ``TaskStats``. It
follows the same rule: the engine writes plain attributes once per micro-batch and
``runtime.observe.prometheus.TopoCollector`` turns them into ``topo_spark_*`` metrics when
Prometheus scrapes, so nothing on the engine's path calls into prometheus_client.

It lives beside ``runtime/local`` and ``runtime/spark`` rather than in either, because
the exporter (local) reads it and the Spark engine writes it, and importing it must not
pull in pyspark.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from runtime.observe.stats import Histogram
from runtime.observe.spark_progress import progress_rows

# Micro-batches last from milliseconds to minutes; the latency buckets stop at 30 s.
BATCH_BUCKETS: tuple[float, ...] = (
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
)


def _batch_histogram() -> Histogram:
    return Histogram(bounds=BATCH_BUCKETS, counts=[0] * (len(BATCH_BUCKETS) + 1))


@dataclass
class SparkStats:
    """One streaming query (or one source shard of it); plain numbers, written per batch.

    ``component`` names the topology component the query implements (usually the
    spout feeding it) and ``task`` the shard, so the labels match the local engine's.
    """

    topology: str
    component: str
    task: int = 0
    batches: int = 0                          # micro-batches completed
    input_rows: int = 0                       # rows read, summed over batches
    last_input_rows: int = 0                  # rows in the last batch
    last_batch_duration_s: float = 0.0
    scheduling_delay_s: float = 0.0           # last batch: planned trigger -> start
    controller_rate: float | None = None      # rows/s admission control allows; None = unlimited
    batch_duration: Histogram = field(default_factory=_batch_histogram)

    def record_batch(self, duration_s: float, input_rows: int, scheduling_delay_s: float = 0.0,
                     controller_rate: float | None = None) -> None:
        """One finished micro-batch; call from the query listener (one writer)."""
        self.batches += 1
        self.input_rows += input_rows
        self.last_input_rows = input_rows
        self.last_batch_duration_s = duration_s
        self.scheduling_delay_s = scheduling_delay_s
        self.batch_duration.observe(duration_s)
        if controller_rate is not None:
            self.controller_rate = controller_rate

    def record_progress(self, progress: Mapping[str, Any], scheduling_delay_s: float = 0.0,
                        controller_rate: float | None = None) -> None:
        """``record_batch`` from a ``StreamingQueryProgress`` as a dict (``query.lastProgress``).

        Spark reports ``batchDuration`` in ms; older progress records only carry
        ``durationMs.triggerExecution``, so that is the fallback.
        """
        ms = progress.get("batchDuration")
        if ms is None:
            ms = (progress.get("durationMs") or {}).get("triggerExecution", 0)
        self.record_batch(float(ms) / 1000.0, progress_rows(progress),
                          scheduling_delay_s, controller_rate)
