"""The driver's side of rate control: a query listener, a submission ticker, and the
feedback that connects them to the controllers and the reader's state files.

Structured Streaming is not DStreams: there is no queue of submitted batches, a
trigger fires at every multiple of the interval when the engine is idle, and when a
batch overruns, the next one starts as soon as it ends. Document 001's three moments
map onto it like this:

* **submission** (3.2.3) happens at every interval boundary ``T = k * t_interval`` on
  the wall clock (Spark's ``ProcessingTimeExecutor`` aligns triggers the same way).
  ``SubmissionTicker`` wakes ``lead`` seconds before each boundary and asks every
  source's controller for the cap of the batch submitted at ``T``; ``RateFeedback``
  writes it to the source's rate file, which the reader reads when the trigger fires
  (at ``T``, or later if the previous batch is still running: that batch was
  submitted at ``T`` and waits, exactly the DStream picture);
* **batch start** (3.2.1): the reader writes a start report when ``latestOffset``
  admits rows; the ticker passes a report newer than the last finished batch to the
  controller (``on_batch_start``), which is how a controller knows at submission time
  that the previous batch has not finished (case 3);
* **batch end** (3.2.2): ``StreamingQueryListener.onQueryProgress`` gives the
  trigger's start (``timestamp``), its duration (``durationMs.triggerExecution``, our
  ``t_proclast``) and rows per source (``elemnumlast``).

**Scheduling delay** (``t_waitlast``, document 001's ``sdelay = t_batchst - submit_time``).
Spark reports none, so it is derived from trigger times (``scheduling_delay``): a
batch's submission is the boundary its trigger was due at. If the previous data batch
(start ``s'``, end ``e'``) overran its next boundary ``due = next_boundary(s')`` and this
batch started right after it (within ``LATE_GAP`` of an interval), the trigger was due
at ``due`` and fired late; otherwise it fired at the last boundary at or before its
start, ``floor(start / t_interval) * t_interval``. (A data batch that starts at a
boundary less than ``LATE_GAP`` after an overrunning batch, with a no-data trigger in
between, is counted as late: rare, since an overrunning batch means data is waiting.)
The delay is ``start - submission`` (the trigger's own few milliseconds of jitter
included, as in Spark's DStream figure).

``RateFeedback`` takes progress as plain dicts (``json.loads(progress.json)``), so
it is tested without Spark.
"""
from __future__ import annotations

import json
import math
import threading
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any, Callable, Mapping

from backpressure.policy.rate_control import LATE_FLOOR, BatchInfo, RateController
from runtime.observe.spark_progress import offsets_of, progress_rows, source_rows
from runtime.observe.spark_stats import SparkStats
from runtime.spark.datasource import read_start, write_rate

EPS = 1e-6
# A trigger that starts within this fraction of an interval after an overrunning batch
# ended is that batch's successor, fired late; a later start is a fresh boundary trigger
# (the trigger in between found no data).
LATE_GAP = 0.1


def parse_timestamp(text: str) -> float:
    """Spark's progress ``timestamp`` (``2024-01-01T00:00:00.123Z``) -> epoch seconds."""
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def next_boundary(t: float, interval: float) -> float:
    """Spark's ``nextBatchTime``: the first multiple of ``interval`` strictly after ``t``."""
    return (math.floor(t / interval + EPS) + 1) * interval


def submission_time(start: float, interval: float, prev_start: float | None = None,
                    prev_end: float | None = None, origin: float | None = None) -> float:
    """The boundary the trigger that started at ``start`` was due at (module docstring).

    ``origin`` is when the query started: its first trigger fires as soon as the query
    has initialised (sources started), not at a boundary, so a first batch within an
    interval of ``origin`` has no submission delay.
    """
    on_time = math.floor(start / interval + EPS) * interval
    if prev_start is None or prev_end is None:
        if origin is not None and origin <= start < origin + interval:
            return start
        return on_time
    due = next_boundary(prev_start, interval)
    if prev_end > due and start - prev_end < LATE_GAP * interval:
        return min(due, start)
    return max(due, on_time)


def scheduling_delay(start: float, interval: float, prev_start: float | None = None,
                     prev_end: float | None = None, origin: float | None = None) -> float:
    return max(0.0, start - submission_time(start, interval, prev_start, prev_end, origin))


@dataclass
class BatchRecord:
    """One finished data batch as the engine saw it (the bench's raw data)."""

    batch_id: int
    submit: float
    start: float
    end: float
    processing_time: float
    scheduling_delay: float
    rows: int
    rows_by_source: dict[str, int] = field(default_factory=dict)
    cap_by_source: dict[str, float | None] = field(default_factory=dict)
    case_by_source: dict[str, int | None] = field(default_factory=dict)   # doc001's case of that submission
    # Spark's breakdown of the trigger's time (ms): addBatch, walCommit, commitOffsets, ...
    duration_ms: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class SourceControl:
    """One source's controller and where its rate file lives."""

    component: str
    controller: RateController
    bound: dict[int, int] | None = None
    done: bool = False
    caps: list[tuple[float, float | None, int | None]] = field(default_factory=list)  # (submit, cap, case)
    last_start_report: float = 0.0

    def submission_at(self, t: float, tolerance: float) -> tuple[float | None, int | None]:
        """``(cap, case)`` of the latest submission at or before ``t``."""
        for when, cap, case in reversed(self.caps):
            if when <= t + tolerance:
                return cap, case
        return (self.caps[0][1], self.caps[0][2]) if self.caps else (None, None)


class RateFeedback:
    """Connects progress events and submission ticks to the controllers (thread-safe)."""

    def __init__(self, interval: float, sources: Mapping[str, SourceControl], state_dir: str,
                 stats: Mapping[str, SparkStats] | None = None, clock: Callable[[], float] = time.time,
                 keep: int = 100_000) -> None:
        self.interval = interval
        self.sources = dict(sources)
        self.state_dir = state_dir
        self.stats = dict(stats or {})
        self.clock = clock
        self.keep = keep
        self.lock = threading.Lock()
        self.batches: list[BatchRecord] = []
        self.input_rows = 0
        self.last_start: float | None = None
        self.last_end: float | None = None
        self.error: BaseException | None = None
        self.updated = threading.Event()
        self.origin: float | None = None   # when the query started (set by the engine)

    def wait_for_batch(self, batch_id: int, timeout: float) -> bool:
        """Whether the record of batch ``batch_id`` (or a later one) is here within
        ``timeout`` s: progress events reach the listener asynchronously, so the last
        batch of a stopped query may still be on its way."""
        deadline = time.monotonic() + timeout
        while True:
            with self.lock:
                if self.batches and self.batches[-1].batch_id >= batch_id:
                    return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self.updated.wait(min(left, 0.05))
            self.updated.clear()

    # -- submission ------------------------------------------------------------------------
    def submit(self, submit_time: float) -> dict[str, float | None]:
        """Ask each controller for the cap of the batch submitted at ``submit_time``."""
        out: dict[str, float | None] = {}
        with self.lock:
            for sc in self.sources.values():
                report = read_start(self.state_dir, sc.component)
                if report is not None:
                    t = float(report.get("t", 0.0))
                    if t > sc.last_start_report and (self.last_end is None or t > self.last_end):
                        sc.last_start_report = t
                        sc.controller.on_batch_start(t)
                rate = sc.controller.on_submit(submit_time)
                sc.caps.append((submit_time, rate, getattr(sc.controller, "last_case", None)))
                del sc.caps[:-1000]
                write_rate(self.state_dir, sc.component, rate, submit_time, sc.controller.marginal_rate(),
                           getattr(sc.controller, "late_floor", LATE_FLOOR))
                out[sc.component] = rate
                stat = self.stats.get(sc.component)
                if stat is not None:
                    stat.controller_rate = rate
        return out

    # -- batch end --------------------------------------------------------------------------
    def on_progress(self, progress: Mapping[str, Any]) -> BatchRecord | None:
        """One ``StreamingQueryProgress`` (as a dict). Returns the record of a data batch."""
        rows = progress_rows(progress)
        if rows <= 0:
            return None
        start = parse_timestamp(str(progress["timestamp"]))
        duration = float((progress.get("durationMs") or {}).get("triggerExecution", 0)) / 1000.0
        end = start + duration
        by_source = self._rows_by_source(progress)
        with self.lock:
            delay = scheduling_delay(start, self.interval, self.last_start, self.last_end, self.origin)
            submit = start - delay
            used = {c: self.sources[c].submission_at(start, 0.05 * self.interval)
                    for c in by_source if c in self.sources}
            record = BatchRecord(int(progress.get("batchId", -1)), submit, start, end, duration, delay, rows,
                                 by_source, {c: u[0] for c, u in used.items()}, {c: u[1] for c, u in used.items()},
                                 {k: float(v) for k, v in (progress.get("durationMs") or {}).items()})
            self.last_start, self.last_end = start, end
            self.input_rows += rows
            self.batches.append(record)
            del self.batches[:-self.keep]
            for component, n in by_source.items():
                sc = self.sources.get(component)
                if sc is None:
                    continue
                sc.controller.on_batch_end(BatchInfo(start, end, duration, delay, n))
                stat = self.stats.get(component)
                if stat is not None:
                    stat.record_batch(duration, n, delay, record.cap_by_source.get(component))
            self._mark_done(progress)
        self.updated.set()
        return record

    def _rows_by_source(self, progress: Mapping[str, Any]) -> dict[str, int]:
        out: dict[str, int] = {}
        sources = progress.get("sources") or []
        names = list(self.sources)
        for i, src in enumerate(sources):
            component = _component_of(src, names, i)
            if component is not None:
                out[component] = out.get(component, 0) + source_rows(src)
        return out

    def _mark_done(self, progress: Mapping[str, Any]) -> None:
        names = list(self.sources)
        for i, src in enumerate(progress.get("sources") or []):
            component = _component_of(src, names, i)
            sc = self.sources.get(component) if component else None
            if sc is None or sc.bound is None:
                continue
            end = offsets_of(src.get("endOffset"))
            if end is not None and all(end.get(str(p), 0) >= o for p, o in sc.bound.items()):
                sc.done = True

    def exhausted(self) -> bool:
        """Every source is finite and has been read to its end."""
        with self.lock:
            return bool(self.sources) and all(sc.bound is not None and sc.done for sc in self.sources.values())


def _component_of(src: Mapping[str, Any], names: list[str], index: int) -> str | None:
    """Which spout a progress ``sources[i]`` entry belongs to.

    The description of a Python data source names its class, not its options, so the
    engine names each source's rows by their order: Spark lists sources in the order of
    the plan's leaves, which is the order the engine created them in (``names``).
    """
    desc = str(src.get("description") or "")
    for n in names:
        if f"[{n}]" in desc:
            return n
    return names[index] if index < len(names) else None


class SubmissionTicker:
    """Calls ``feedback.submit(T)`` ``lead`` seconds before every boundary ``T``."""

    def __init__(self, feedback: RateFeedback, interval: float, lead: float = 0.03,
                 clock: Callable[[], float] = time.time) -> None:
        self.feedback = feedback
        self.interval = interval
        self.lead = min(lead, interval / 4)
        self.clock = clock
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="topo-rate-ticker", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                boundary = next_boundary(self.clock() + self.lead, self.interval)
                wait = boundary - self.lead - self.clock()
                if wait > 0 and self._stop.wait(wait):
                    return
                self.feedback.submit(boundary)
        except BaseException as e:  # surfaced by the engine's main loop
            self.feedback.error = e

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)


def make_listener(feedback: RateFeedback, query_name: str) -> Any:
    """A ``StreamingQueryListener`` feeding ``feedback`` with this query's progress."""
    from pyspark.sql.streaming import StreamingQueryListener

    class ProgressListener(StreamingQueryListener):  # type: ignore[misc]
        def onQueryStarted(self, event: Any) -> None:
            # The first trigger fires when the query's thread starts, not at a boundary.
            if event.name == query_name:
                try:
                    feedback.origin = parse_timestamp(str(event.timestamp))
                except ValueError:
                    pass

        def onQueryProgress(self, event: Any) -> None:
            progress = event.progress
            if progress.name != query_name:
                return
            try:
                feedback.on_progress(json.loads(progress.json))
            except BaseException as e:  # never kill Spark's listener bus
                feedback.error = e

        def onQueryIdle(self, event: Any) -> None:
            return None

        def onQueryTerminated(self, event: Any) -> None:
            feedback.updated.set()

    return ProgressListener()
