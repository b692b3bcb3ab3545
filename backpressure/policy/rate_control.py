"""Rate controllers for micro-batch admission: document 001's adaptive controller,
Spark's DStream PID rules, and a fixed cap.

All three are pure: they are told what happened (a batch started, a batch ended, a
batch is being submitted now) with times as plain floats in **seconds** on any clock,
and they answer with a rate cap in **records per second for the whole source**. The
engine turns the cap into offsets: each of the source's ``P`` partitions may admit
``rate * t_interval / P`` records per batch, or all that remains (``per_partition_cap``).
Nothing here reads a clock, sleeps or touches Spark; the Spark engine's listener and
submission ticker feed them (``runtime/spark/listener.py``), and the tests feed them
with a fake clock.

Document 001 (adaptive rate control for micro-batch streaming)
===============================================================

Names follow the document: ``t_interval`` (batch interval), ``t_batchst`` (batch start),
``t_batched`` (batch end), ``t_proclast`` / ``t_waitlast`` / ``elemnumlast`` (processing
time, waiting time and element count of the latest finished batch), ``submit_time``,
``prelx``, ``brelx``, ``Kblock``, ``latestRate``, ``latestError``.

* **Slow start** (3.1): until the first batch has finished, the cap is ``n`` records per
  source partition per second, ``50 < n < 1000`` (``initial_rate_per_partition``).
* **At each batch submission** (3.2.3) one of three cases applies, with
  ``prelx = min(50 ms, 0.05 * t_interval)``:

  1. the previous batch has finished and its processing time is outside
     ``[t_interval - prelx, t_interval]``: PID with ``blockTime = 0``;
  2. the previous batch has finished and its processing time is inside that window:
     keep ``latestRate``; when the last **three** finished batches all lie in the
     window, use their mean processing rate instead (formula 8);
  3. the previous batch has not finished: PID with ``blockTime`` from formula 3.

Formulas 1, 3 and 7 are in the document's text. Formulas 2, 4, 5, 6 and 8 were images
and are lost; they are **reconstructed** here from Spark's DStream ``PIDRateEstimator``
(which the document extends) and the document's description of what each one uses
(its variable lists after each formula), as the seeds README directs::

    (1) newRate          = max(minRate, latestRate - Kp*error - Ki*historicalError - Kd*dError)
    (2) error            = latestRate - elemnumlast / (t_proclast + Kblock*blockTime)      [reconstructed]
    (3) blockTime        = max(t_interval - (submit_time - t_batchst), brelx)
    (4) historicalError  = (t_waitlast + Kblock*blockTime) * processingRate / t_interval  [reconstructed]
    (5) processingRate   = elemnumlast / t_proclast                                        [reconstructed]
    (6) dError           = (error - latestError) / delaySinceUpdate                        [reconstructed]
    (7) delaySinceUpdate = lastProcessingEndTime - latestTime
    (8) newRate          = (r_last + r_2nd-last + r_3rd-last) / 3                           [reconstructed]

with ``Kp = 1``, ``Ki = 0.2``, ``Kd = 0``, ``Kblock = 0.3``, ``brelx = 50 ms`` when
``t_interval > 1000 ms`` and ``0.05 * t_interval`` otherwise. In (3) ``t_batchst`` is the
start of the batch still running at ``submit_time``. In (2) and (4) ``blockTime`` is 0 in
case 1. The ``r`` of (8) are the finished batches' processing rates (5).

Decisions where the document is silent (each has a test):

* ``latestRate`` is, as the document defines it, the cap *the latest finished batch was
  admitted with* (looked up from the submissions this controller answered), not the last
  cap it computed. That makes a submission idempotent: asking twice with nothing new
  finished gives the same answer, so an idle stream (no batches for a while) or a long
  batch spanning several submissions does not compound the PID step.
* ``latestError`` is the case-1 error (``blockTime = 0``) of the finished batch before the
  latest one; ``delaySinceUpdate`` is the time between those two batches' ends (7). With
  ``Kd = 0`` neither changes the answer; they are kept so ``Kd`` can be tried.
* A batch start is reported by the source a little after the trigger's timestamp that
  the finished batch carries, so a finished batch that began up to ``0.1 * t_interval``
  before the reported start is taken as the running batch finishing.
* A finished batch with no elements or no processing time tells nothing about the
  processing rate (Spark skips it too); it neither updates the PID nor breaks the
  three-batch window. It still ends the "previous batch running" state.
* Before any batch has finished, and in case 3 before any batch has finished, the cap
  is the slow-start cap.

Changes to the document's rules (issue 18), each with a fake-clock test; with no fixed
cost per batch, batches that fill their cap, ``headroom = 0`` and ``smooth_batches = 1``,
the controller is the document's:

* **The processing rate that fills an interval.** Formula (5), ``elemnumlast / t_proclast``,
  is the rate that fills an interval only when a batch's time is proportional to its
  size. On Spark a batch also pays a cost of its own, whatever its size (planning, task
  launch, the Python workers: 0.2 to 0.5 s of a 1 s interval on the bench's machine). Then
  a small fast batch understates what an interval holds (slow start climbs in many small
  steps, and the backlog grows meanwhile) and an overrunning batch overstates it (the cut
  after a capacity drop is too shallow, and the next batches overrun too). So the
  controller fits ``t_proc = a + n / c`` by least squares over the (up to) eight finished
  batches before the latest (``fixed_cost``: ``a``, kept to ``[0, t_interval / 2]``, 0
  until two batches differ in size by 1.5x and the slope is positive), and formulas (2)
  and (4) use ``fill_rate``: the latest batch's own marginal rate ``n / (t - a')`` times
  the share of the batch's time left after the fixed cost, ``(target - a') / t_interval``
  (``target`` below; the interval itself in the document), with ``a' = min(a, t / 2)`` so
  one small batch cannot divide by almost nothing. With ``a = 0`` and no headroom this is
  formula (5).
* **Aim under the interval** (``headroom``). Document 001 aims every batch at the whole
  interval (formula 5 is the rate that fills it, and case 2's window ends at it). But a
  batch's processing time varies from batch to batch by far more than ``prelx`` (on the
  bench's machine a standard deviation of 75 ms when it is quiet and 250 ms under others'
  load, for batches of the same size), and in Structured Streaming a batch that ends past
  the next boundary delays the next one by the overrun, which delays the one after unless
  that one is shorter: ``delay[k+1] = max(0, delay[k] + t_proc[k] - t_interval)``. With the
  mean at the interval, every other batch overruns and the delay is a random walk; aiming
  at ``target = (1 - headroom) * t_interval`` gives the walk a drift back to zero. So
  ``fill_rate`` is the rate that fills ``target``, not the interval, and case 2's window is
  ``[target - prelx, target]``; formula (8) averages the three batches' ``fill_rate`` (with
  ``headroom = 0`` and no fixed cost, their processing rates (5), as in the document).
  ``headroom = 0`` is the document's rule.
* **A batch that starts late is cut to end at the next boundary** (``late_start_rate``).
  Case 3 decides at submission, while the previous batch still runs, with the block
  time formula (3) *estimates*. When the trigger fires, the lateness is known: the
  batch starts ``lateness`` seconds after its boundary and has that much less time before
  the next one. So the source's reader, at admission, takes ``marginal * lateness``
  records per second of interval off the cap (``marginal``: the rows per second of
  processing the latest batch paid beyond its fixed cost, ``n / (t - a')``;
  ``marginal_rate``), never more than half the cap (``LATE_FLOOR``: a batch pays its fixed
  cost whatever its size, so a tiny one would lose more than it saves). Without the cut a
  delay decays by only the headroom per batch; with it, in one batch. The cap a batch ran
  with (``latestRate``, the under-filled test below) is the cap after the cut, worked out
  from the batch's own waiting time with the marginal rate published with the decision.
* **No cut where cutting does not help** (``cuts_are_useless``). When a batch's time does
  not depend on its size (a loaded machine: on the bench's, batches of 50 rows took as
  long as batches of 1,000, 0.6 to 1.4 s), formula (5) reads a smaller batch as a
  slower processing rate and cuts again: the cap falls to ``min_rate`` in ten batches
  and throughput with it, while the batches take no less time. So when the last batches
  (at least three, sizes at least 1.5x apart, the latest included) show no positive
  slope of time over size, or a fitted fixed cost at or over ``target``, cases 1 and 3
  never lower the cap below the one the latest batch ran with, and no marginal rate is
  published, so the reader does not cut a late batch either (it would end no sooner).
* **The processing rate is read over the last three batches** (``smooth_batches``, 3). The
  document reads formulas (2), (4) and (5) off the latest batch alone and smooths only in
  case 2, where formula (8) averages the last three batches' rates. On a shared machine
  one batch's time varies by a third or more for reasons that do not last (others' load,
  a GC pause, the batch that straddles a change), and with the fixed cost taken off that
  variation is amplified: one slow batch cut the next cap to about a third of the last,
  the small batches that followed read fast and the cap overshot, a sawtooth that costs
  a fixed cost per batch each time. So formulas (2) and (4) use the mean of formula (8)'s
  window, the fill rates of the last (up to) three finished batches, and so does the
  marginal rate the reader cuts a late batch by. A batch under half the latest one's size
  is left out of the window (mostly fixed cost, it says little of the rate of a batch
  twice its size, and slow start's growing batches would hold the climb back). In case 3
  each batch of the window is read as slowed by the same ``Kblock * blockTime``. One slow batch then moves the
  estimate by a third of its own reading; a lasting change is read whole after three
  batches, and meanwhile the late-start cut keeps the batches on their boundaries.
  ``smooth_batches = 1`` is the document's rule.
* **A batch that took all the source had.** A batch that admitted under 90% of its cap
  and finished within the interval says the source ran dry, not that the cap is too high;
  in case 1 it never lowers the cap (the cap stays where it was for the next burst instead
  of falling to the quiet half's trickle and climbing again). In case 3 the running batch
  is late, so the rule does not apply.

Spark's DStream PID (for comparison)
====================================

``DStreamPIDController`` applies ``PIDRateEstimator``'s rules exactly: on each finished
batch with elements and processing time, ``processingRate = elements / processingDelay``,
``error = latestRate - processingRate``,
``historicalError = schedulingDelay * processingRate / batchInterval``,
``dError = (error - latestError) / delaySinceUpdate`` (time between this and the previous
update) and ``newRate = max(minRate, latestRate - Kp*error - Ki*historicalError - Kd*dError)``
with Spark's defaults ``Kp = 1, Ki = 0.2, Kd = 0, minRate = 100``. The first update only
records ``latestRate = processingRate`` and publishes nothing (Spark's ``firstRun``); later
updates publish ``newRate`` and set ``latestRate`` to it. A submission takes the last
published rate (the initial rate before any).

``FixedRateController`` is Spark's static ``maxRatePerPartition``: the same cap always.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Protocol

KP = 1.0
KI = 0.2
KD = 0.0
K_BLOCK = 0.3
SPARK_MIN_RATE = 100.0
FIT_BATCHES = 8           # finished batches the fixed-cost fit looks back over
FIT_SIZE_SPREAD = 1.5     # the fit needs a batch this many times larger than another
UNDERFILLED = 0.9         # a batch under this share of its cap took all the source had
HEADROOM = 0.05           # doc001 aims each batch at this much under the interval
LATE_FLOOR = 0.5          # a late batch keeps at least this share of its cap
SMOOTH_BATCHES = 3        # formula (8)'s window: batches the processing rate is read over


@dataclass(frozen=True)
class BatchInfo:
    """One finished micro-batch, as the listener saw it (times in seconds)."""

    start: float              # t_batchst: when the batch began processing
    end: float                # t_batched: when it finished
    processing_time: float    # t_proclast
    waiting_time: float       # t_waitlast: scheduling delay (start - submission)
    elements: int             # elemnumlast

    @property
    def processing_rate(self) -> float:
        """Formula (5): elements per second of processing; 0 when undefined."""
        if self.elements <= 0 or self.processing_time <= 0:
            return 0.0
        return self.elements / self.processing_time


class RateController(Protocol):
    """What the engine drives. ``on_submit`` returns the cap (records/s) for the batch
    submitted now; ``None`` means no cap."""

    name: str

    def on_batch_start(self, t_batchst: float) -> None: ...

    def on_batch_end(self, info: BatchInfo) -> None: ...

    def on_submit(self, submit_time: float) -> float | None: ...

    def marginal_rate(self) -> float | None:
        """Rows per second of processing beyond the fixed cost, published with the cap so
        the reader can cut a late batch (``late_start_rate``); ``None``: no cut."""
        ...


def prelx_for(t_interval: float) -> float:
    """``prelx = min(50 ms, 0.05 * t_interval)`` (seconds)."""
    return min(0.050, 0.05 * t_interval)


def brelx_for(t_interval: float) -> float:
    """``brelx``: 50 ms for intervals over 1000 ms, else ``0.05 * t_interval`` (seconds)."""
    return 0.050 if t_interval > 1.0 else 0.05 * t_interval


def per_partition_cap(rate: float | None, t_interval: float, partitions: int) -> int | None:
    """Records one source partition may admit into one batch: ``rate * t_interval / P``.

    Rounded down, but at least 1 so a positive cap always makes progress; ``None`` (no
    cap) stays ``None``. The reader then takes ``min(cap, what remains)``.
    """
    if rate is None:
        return None
    if partitions < 1:
        raise ValueError("partitions must be >= 1")
    return max(1, math.floor(rate * t_interval / partitions))


def late_start_rate(rate: float | None, marginal: float | None, lateness: float,
                    t_interval: float, floor: float = LATE_FLOOR) -> float | None:
    """The cap of a batch that starts ``lateness`` seconds after its boundary: the rows
    ``marginal`` would process in that time (per second of interval) come off, so the
    batch ends by the next boundary as an on-time batch would; at least ``floor`` of the
    cap (``spark.late_floor``; 1 never cuts). No cap, no marginal rate or no lateness: the
    cap unchanged."""
    if rate is None or marginal is None or lateness <= 0:
        return rate
    return max(rate - marginal * lateness / t_interval, floor * rate)


def _check_common(t_interval: float, partitions: int, min_rate: float) -> None:
    if t_interval <= 0:
        raise ValueError("t_interval must be > 0")
    if partitions < 1:
        raise ValueError("partitions must be >= 1")
    if min_rate < 0:
        raise ValueError("min_rate must be >= 0")


class AdaptiveRateController:
    """Document 001's controller (see the module docstring for every formula)."""

    name = "doc001"

    def __init__(self, t_interval: float, partitions: int, *,
                 initial_rate_per_partition: float = 500.0, min_rate: float = SPARK_MIN_RATE,
                 kp: float = KP, ki: float = KI, kd: float = KD, k_block: float = K_BLOCK,
                 headroom: float = HEADROOM, smooth_batches: int = SMOOTH_BATCHES,
                 late_floor: float = LATE_FLOOR) -> None:
        _check_common(t_interval, partitions, min_rate)
        if not 50 < initial_rate_per_partition < 1000:
            raise ValueError("slow start needs 50 < n < 1000 records per partition per second")
        if not 0 <= headroom < 0.5:
            raise ValueError(f"headroom must be in [0, 0.5), got {headroom}")
        if smooth_batches not in (1, 2, 3):
            raise ValueError(f"smooth_batches must be 1, 2 or 3 (formula 8's window), got {smooth_batches}")
        if not 0 < late_floor <= 1:
            raise ValueError(f"late_floor must be in (0, 1] (1: late batches are never cut), got {late_floor}")
        self.smooth_batches = smooth_batches
        self.late_floor = late_floor
        self.t_interval = t_interval
        self.target = (1.0 - headroom) * t_interval
        self.partitions = partitions
        self.initial_rate = initial_rate_per_partition * partitions
        self.min_rate = min_rate
        self.kp, self.ki, self.kd, self.k_block = kp, ki, kd, k_block
        self.prelx = prelx_for(t_interval)
        self.brelx = brelx_for(t_interval)
        # (submit_time, cap, marginal rate) of recent submissions, to find the cap a batch ran with.
        self._submissions: deque[tuple[float, float, float | None]] = deque(maxlen=256)
        # Finished batches that carry a processing rate, newest last, with the cap each
        # was admitted with and its case-1 error.
        self._finished: deque[tuple[BatchInfo, float, float]] = deque(maxlen=3)
        # (elements, processing time) of the finished batches, newest last, for the fit.
        self._sizes: deque[tuple[int, float]] = deque(maxlen=FIT_BATCHES + 1)
        self._running_start: float | None = None
        self.last_case: int = 0   # 0 = slow start, else 1, 2 or 3 (for metrics and tests)
        self.rate: float = self.initial_rate

    # -- observations ---------------------------------------------------------------
    def on_batch_start(self, t_batchst: float) -> None:
        self._running_start = t_batchst

    def on_batch_end(self, info: BatchInfo) -> None:
        # The finished batch is the running one if it began at about the reported start
        # (the report comes from the source, a little after the trigger's own timestamp);
        # an earlier batch began at least one processing time before.
        if self._running_start is not None and info.start >= self._running_start - 0.1 * self.t_interval:
            self._running_start = None
        if info.processing_rate <= 0:
            return
        cap = self._cap_at(info)
        self._sizes.append((info.elements, info.processing_time))
        error = cap - self.fill_rate(info.elements, info.processing_time)
        self._finished.append((info, cap, error))

    def _cap_at(self, info: BatchInfo) -> float:
        """The cap the batch ran with: the latest submission at or before its start (slow
        start before any), cut as the reader cut it for the batch's waiting time."""
        tolerance = 0.05 * self.t_interval
        for when, cap, marginal in reversed(self._submissions):
            if when <= info.start + tolerance:
                late = late_start_rate(cap, marginal, info.waiting_time, self.t_interval, self.late_floor)
                return cap if late is None else late
        return self.initial_rate

    def _window(self) -> list[BatchInfo]:
        """The last ``smooth_batches`` finished batches the processing rate is read over,
        less those under half the latest one's size (mostly fixed cost, they say little of
        the rate of a batch twice theirs, and slow start's growing batches would hold the
        climb back)."""
        window = [b for b, _, _ in list(self._finished)[-self.smooth_batches:]]
        return [b for b in window if 2 * b.elements >= window[-1].elements] if window else window

    def marginal_rate(self) -> float | None:
        """``n / (t - a')``, the mean over the window (the latest finished batch alone with
        ``smooth_batches = 1``); ``None`` before any, and while ``cuts_are_useless``."""
        window = self._window()
        if not window or self.cuts_are_useless():
            return None
        a = self.fixed_cost()
        return sum(b.elements / (b.processing_time - min(a, b.processing_time / 2)) for b in window) / len(window)

    def rate_estimate(self, extra: float = 0.0) -> float:
        """The processing rate formulas (2) and (4) use: the mean ``fill_rate`` of the
        window, each batch's time lengthened by ``extra`` (``Kblock * blockTime`` in case 3)."""
        window = self._window()
        return sum(self.fill_rate(b.elements, b.processing_time + extra) for b in window) / len(window)

    def _fit(self, points: list[tuple[int, float]]) -> tuple[float, float] | None:
        """``(slope, intercept)`` of ``t_proc = a + n / c`` by least squares; ``None`` with
        fewer than two points or sizes within ``FIT_SIZE_SPREAD`` of each other."""
        if len(points) < 2:
            return None
        xs = [float(n) for n, _ in points]
        ys = [t for _, t in points]
        if max(xs) < FIT_SIZE_SPREAD * min(xs):
            return None
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
        return slope, my - slope * mx

    def fixed_cost(self) -> float:
        """``a`` of ``t_proc = a + n / c`` over the finished batches before the latest
        (seconds, in ``[0, t_interval / 2]``; 0 while the fit is not defined)."""
        fit = self._fit(list(self._sizes)[:-1])
        if fit is None or fit[0] <= 0:
            return 0.0
        return min(max(0.0, fit[1]), self.t_interval / 2)

    def cuts_are_useless(self) -> bool:
        """Over the last batches (at least three, sizes 1.5x apart), a batch's time did not
        grow with its size, or its fixed cost alone is over ``target``: no cap makes a
        batch fit, and a smaller one only loses throughput (module docstring)."""
        points = list(self._sizes)
        fit = self._fit(points) if len(points) >= 3 else None
        return fit is not None and (fit[0] <= 0 or fit[1] >= self.target)

    def fill_rate(self, elements: int, processing_time: float) -> float:
        """The cap (records per second of interval) whose batch takes ``target``, from one
        batch (module docstring); formula (5) when there is no fixed cost or headroom."""
        if elements <= 0 or processing_time <= 0:
            return 0.0
        a = min(self.fixed_cost(), processing_time / 2)
        return elements / (processing_time - a) * max(self.target - a, 0.0) / self.t_interval

    def _underfilled(self, info: BatchInfo, cap: float) -> bool:
        """The batch admitted under 90% of its cap and finished within the interval."""
        return info.elements < UNDERFILLED * cap * self.t_interval and info.processing_time <= self.t_interval

    def _in_window(self, info: BatchInfo) -> bool:
        return self.target - self.prelx <= info.processing_time <= self.target

    # -- the decision ---------------------------------------------------------------
    def block_time(self, submit_time: float, t_batchst: float) -> float:
        """Formula (3)."""
        return max(self.t_interval - (submit_time - t_batchst), self.brelx)

    def pid(self, block_time: float) -> float:
        """Formulas (1), (2), (4)-(7) on the latest finished batch, its processing rate
        read over the window (``rate_estimate``)."""
        last, latest_rate, _ = self._finished[-1]
        error = latest_rate - self.rate_estimate(self.k_block * block_time)
        historical_error = ((last.waiting_time + self.k_block * block_time)
                            * self.rate_estimate() / self.t_interval)
        d_error = 0.0
        if len(self._finished) >= 2:
            prev, _, latest_error = self._finished[-2]
            delay_since_update = last.end - prev.end
            if delay_since_update > 0:
                d_error = (error - latest_error) / delay_since_update
        new_rate = latest_rate - self.kp * error - self.ki * historical_error - self.kd * d_error
        return max(self.min_rate, new_rate)

    def on_submit(self, submit_time: float) -> float:
        if not self._finished:
            self.last_case = 0
            rate = self.initial_rate
        elif self._running_start is not None and self._running_start <= submit_time:
            self.last_case = 3
            rate = self.pid(self.block_time(submit_time, self._running_start))
            if self.cuts_are_useless():
                rate = max(rate, self._finished[-1][1])
        else:
            last, latest_rate, _ = self._finished[-1]
            if self._in_window(last):
                self.last_case = 2
                if len(self._finished) == 3 and all(self._in_window(b) for b, _, _ in self._finished):
                    rate = max(self.min_rate, sum(self.fill_rate(b.elements, b.processing_time)
                                                  for b, _, _ in self._finished) / 3)
                else:
                    rate = latest_rate
            else:
                self.last_case = 1
                rate = self.pid(0.0)
                if self._underfilled(last, latest_rate) or self.cuts_are_useless():
                    rate = max(rate, latest_rate)
        self._submissions.append((submit_time, rate, self.marginal_rate()))
        self.rate = rate
        return rate


class DStreamPIDController:
    """Spark Streaming's ``PIDRateEstimator`` rules behind the same interface."""

    name = "pid"

    def __init__(self, t_interval: float, partitions: int, *,
                 initial_rate_per_partition: float | None = 500.0, min_rate: float = SPARK_MIN_RATE,
                 kp: float = KP, ki: float = KI, kd: float = KD) -> None:
        _check_common(t_interval, partitions, min_rate)
        self.t_interval = t_interval
        self.partitions = partitions
        self.min_rate = min_rate
        self.kp, self.ki, self.kd = kp, ki, kd
        self.first_run = True
        self.latest_time = -math.inf
        self.latest_rate = -1.0
        self.latest_error = -1.0
        initial = None if initial_rate_per_partition is None else initial_rate_per_partition * partitions
        self.rate: float | None = initial

    def on_batch_start(self, t_batchst: float) -> None:
        return None

    def on_batch_end(self, info: BatchInfo) -> None:
        time = info.end
        if not (time > self.latest_time and info.elements > 0 and info.processing_time > 0):
            return
        delay_since_update = time - self.latest_time
        processing_rate = info.elements / info.processing_time
        error = self.latest_rate - processing_rate
        historical_error = info.waiting_time * processing_rate / self.t_interval
        d_error = (error - self.latest_error) / delay_since_update
        new_rate = max(self.min_rate, self.latest_rate - self.kp * error - self.ki * historical_error
                       - self.kd * d_error)
        self.latest_time = time
        if self.first_run:
            self.latest_rate = processing_rate
            self.latest_error = 0.0
            self.first_run = False
        else:
            self.latest_rate = new_rate
            self.latest_error = error
            self.rate = new_rate

    def on_submit(self, submit_time: float) -> float | None:
        return self.rate

    def marginal_rate(self) -> None:
        return None


class FixedRateController:
    """A static cap (Spark's ``maxRatePerPartition``): ``rate_per_partition * P`` always."""

    name = "fixed"

    def __init__(self, t_interval: float, partitions: int, *, rate_per_partition: float) -> None:
        _check_common(t_interval, partitions, 0.0)
        if rate_per_partition <= 0:
            raise ValueError("rate_per_partition must be > 0")
        self.rate = rate_per_partition * partitions

    def on_batch_start(self, t_batchst: float) -> None:
        return None

    def on_batch_end(self, info: BatchInfo) -> None:
        return None

    def on_submit(self, submit_time: float) -> float:
        return self.rate

    def marginal_rate(self) -> None:
        return None


class NoRateController:
    """No admission control: every batch takes all that is available."""

    name = "none"
    rate = None

    def on_batch_start(self, t_batchst: float) -> None:
        return None

    def on_batch_end(self, info: BatchInfo) -> None:
        return None

    def on_submit(self, submit_time: float) -> None:
        return None

    def marginal_rate(self) -> None:
        return None


CONTROLLERS = ("doc001", "pid", "fixed", "none")


def make_controller(kind: str, t_interval: float, partitions: int, *,
                    initial_rate_per_partition: float = 500.0, min_rate: float = SPARK_MIN_RATE,
                    fixed_rate_per_partition: float | None = None,
                    smooth_batches: int = SMOOTH_BATCHES, headroom: float = HEADROOM,
                    late_floor: float = LATE_FLOOR) -> RateController:
    """The controller named by ``spark.rate_control`` (``smooth_batches``, ``headroom`` and
    ``late_floor`` are doc001's)."""
    if kind == "doc001":
        return AdaptiveRateController(t_interval, partitions, initial_rate_per_partition=initial_rate_per_partition,
                                      min_rate=min_rate, smooth_batches=smooth_batches, headroom=headroom,
                                      late_floor=late_floor)
    if kind == "pid":
        return DStreamPIDController(t_interval, partitions, initial_rate_per_partition=initial_rate_per_partition,
                                    min_rate=min_rate)
    if kind == "fixed":
        if fixed_rate_per_partition is None:
            raise ValueError("rate control 'fixed' needs a rate per partition (spark.max_rate_per_partition)")
        return FixedRateController(t_interval, partitions, rate_per_partition=fixed_rate_per_partition)
    if kind == "none":
        return NoRateController()
    raise ValueError(f"unknown rate control {kind!r}; expected one of {', '.join(CONTROLLERS)}")
