"""TCP-like send windows per downstream task, sized from ack round trips (document 002).

Pure: no asyncio, no I/O; time comes in as ``now``. Names from the document:
``SendWindow`` (the spout's window towards one bolt: the document's
AdaptiveFlowConsumer), the states ``NORMAL``/``SLOW``/``BUSY``, ``rt`` (the round
trip of one ack), ``CumulativeAck`` (the ack point recorded for restarts).

Rules (each is a test in ``tests/test_window_policy.py`` named after it)
------------------------------------------------------------------------
* **W1 one window per downstream task**: a tracked tuple (a batch, W6) may go to a
  task only while that task's in-flight count is under its window; the send time
  is recorded per tuple.
* **W2 NORMAL grows linearly**: an ack whose round trip is in the normal range (W3b)
  grows the window by ``step / window``, so a whole window of NORMAL acks (one round
  trip) grows it by ``step`` (1 tuple), up to ``max``. The document takes its rules
  from RFC 2001 and keeps only its *linear* increase, leaving out slow start and
  ssthresh because exponential growth "easily causes SLOW": in RFC 2001 linear is
  congestion avoidance's one segment per round trip; one step per *ack* doubles the
  window every round trip, which is slow start. (Read as one step per ack, the
  windows overshot by a round trip's worth of acks and swung between 50 and 1,600
  tuples in scenario g, with the queue between 3% and 94% of its bound.)
* **W2b growth only while the window is used** (reconstruction, TCP's congestion window
  validation, RFC 7661: the document's spout always has tuples to send): a NORMAL ack
  grows the window only when the last send filled it. A spout that sends less than its
  windows admit (its source is slower than the bolts) leaves them where they are, so a
  window cannot grow to ``max`` while nothing limits it and then let a whole ``max`` of
  tuples pile up in front of a task whose capacity dropped.
* **W3 SLOW shrinks linearly**: an ack over the normal range shrinks it by ``step``,
  never under ``min``.
* **W3b the normal range starts at the base round trip** (reconstruction: the document
  says "within the normal range" and "over the threshold" without a number): an ack is
  NORMAL when its round trip is at most ``rtt_threshold`` over the smallest round trip
  this window has seen (its base, as TCP Vegas' BaseRTT: the path with no queue). So
  ``rtt_threshold`` is the queueing delay a window lets build up in front of its task,
  the same on a path whose bare round trip is 2 ms or 300 ms; an absolute threshold
  shrank every window of a path slower than it to ``min`` with no queue at all.
* **W4 BUSY on fail or timeout**: the window shrinks by one at once, the tuple
  leaves the window and is handed back for re-sending to *another* task of the
  same component that has room (round robin after the busy one); under fields
  grouping a key must stay on its task, so it waits for that task (``resend_target``
  returns the same task). With no other task with room it waits too (None).
* **W5 cumulative ack**: tuples are numbered in send order; the ack point is the
  highest number with every tuple up to it acked (acks of 1, 3, 4 keep it at 1;
  the ack of 2 moves it to 4), and its ``rt`` is the one recorded; a failed and
  re-sent tuple keeps its number, so the point waits for it. For a restart the same
  rule runs over the order the spout *emitted* (tuples overtake each other between
  windows, so a point in send order could pass one still waiting): the engine's
  ``runtime/local/ack_points.py`` numbers emission chunks and keeps the spout's state
  at the point, which ``drivers/resume_points.py`` makes durable.
* **W6 batching**: records are sent ``batch`` at a time as one tracked tuple (one
  ack per batch); a partial batch goes when flushed.
* **W7 round robin among tasks with room**: the document's spout asks its
  consumers in turn; a task with a full window is skipped.
* **W8 acking required**: without acks there are no round trips; the config is
  refused (``topo.config.resolve``).
* **W9 fan-out** (reconstruction: the document's spout feeds one component): a tuple
  sent to several components is in flight in one window of each, and its ack (the
  whole tree's) frees and classifies every one of them; a fail makes each BUSY.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Generic, Hashable, Mapping, Sequence, TypeVar

NORMAL = "NORMAL"
SLOW = "SLOW"
BUSY = "BUSY"

R = TypeVar("R", bound=Hashable)


@dataclass(frozen=True)
class WindowParams:
    initial: int = 16
    min: int = 1
    max: int = 4096
    rtt_threshold: float = 0.05        # seconds of round trip over the base (W3b)
    step: float = 1.0                  # tuples per ack (W2, W3)
    batch: int = 256
    check_interval: float = 0.05       # seconds (the driver's period without per-tuple acks)
    rate_floor: float = 1.0

    def __post_init__(self) -> None:
        if not 1 <= self.min <= self.initial <= self.max:
            raise ValueError("window sizes must satisfy 1 <= min <= initial <= max")
        if self.rtt_threshold <= 0 or self.step <= 0 or self.batch < 1 or self.check_interval <= 0:
            raise ValueError("rtt_threshold, step, batch and check_interval must be positive")

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> "WindowParams":
        if not config.get("acking", False):
            raise ValueError("backpressure.policy window needs acking: true (it sizes windows from ack round trips)")
        w = "backpressure.window."
        return cls(initial=int(config[w + "initial"]), min=int(config[w + "min"]), max=int(config[w + "max"]),
                   rtt_threshold=float(config[w + "rtt_threshold_ms"]) / 1000.0, batch=int(config[w + "batch"]),
                   check_interval=float(config[w + "check_interval_ms"]) / 1000.0,
                   rate_floor=float(config["backpressure.rate_floor"]))


class SendWindow(Generic[R]):
    """The window towards one downstream task (W1-W4)."""

    def __init__(self, params: WindowParams) -> None:
        self.params = params
        self.window = float(params.initial)
        self.state = NORMAL
        self.in_flight: dict[R, float] = {}
        self.used = False                  # W2b: the last send filled the window
        self.base: float | None = None     # W3b: the smallest round trip seen

    def has_room(self) -> bool:
        return len(self.in_flight) < int(self.window)

    def on_sent(self, root: R, now: float) -> None:
        self.in_flight[root] = now
        self.used = len(self.in_flight) >= int(self.window)

    def on_ack(self, root: R, now: float) -> float | None:
        """The round trip; None for a root this window does not hold (a late ack after a fail)."""
        sent = self.in_flight.pop(root, None)
        if sent is None:
            return None
        rt = now - sent
        base = self.base
        if base is None or rt < base:
            self.base = base = rt
        self.classify(rt <= base + self.params.rtt_threshold, used=self.used)
        return rt

    def classify(self, normal: bool, acks: float = 1, used: bool = True) -> None:
        """W2/W3 for ``acks`` acks of one kind (the driver's fallback counts them per period);
        ``used``: whether the window was filled (W2b; the fallback cannot tell, so it grows).
        NORMAL grows by ``step`` per window's worth of acks (one round trip), SLOW shrinks by
        ``step`` per ack."""
        p = self.params
        if normal:
            self.state = NORMAL
            if used:
                self.window = min(float(p.max), self.window + p.step * acks / self.window)
        else:
            self.state = SLOW
            self.window = max(float(p.min), self.window - p.step * acks)

    def on_fail(self, root: R) -> bool:
        """W4: BUSY, one smaller. True when the root was in this window."""
        held = self.in_flight.pop(root, None) is not None
        self.busy()
        return held

    def busy(self) -> None:
        self.state = BUSY
        self.window = max(float(self.params.min), self.window - 1)


@dataclass
class CumulativeAck:
    """W5: the ack point over tuples numbered in send order, and its round trip."""

    point: int = 0                     # every tuple numbered <= point is acked (numbers start at 1)
    point_rt: float | None = None
    _acked: dict[int, float] = field(default_factory=dict)

    def on_ack(self, number: int, rt: float) -> bool:
        """Record one ack; True when the point moved."""
        if number <= self.point:
            return False
        self._acked[number] = rt
        moved = False
        while self.point + 1 in self._acked:
            self.point += 1
            self.point_rt = self._acked.pop(self.point)
            moved = True
        return moved

    @property
    def resume_position(self) -> int:
        """The first tuple number a restart must send again."""
        return self.point + 1


class WindowSender(Generic[R]):
    """One spout task's windows over the tasks of each downstream component (W1, W4, W7)."""

    def __init__(self, params: WindowParams, components: Mapping[str, Sequence[int]],
                 keyed: frozenset[str] = frozenset()) -> None:
        self.params = params
        self.components = {c: list(ts) for c, ts in components.items()}
        self.keyed = keyed                 # components fed by fields grouping (W4: no resend elsewhere)
        self.windows: dict[int, SendWindow[R]] = {t: SendWindow(params) for ts in components.values() for t in ts}
        self.target_of: dict[R, list[int]] = {}   # one task per downstream component it went to
        self._next: dict[str, int] = {c: 0 for c in components}

    def pick(self, component: str, after: int | None = None) -> int | None:
        """W7: the next task of ``component`` (after ``after``) whose window has room; None if all full."""
        ts = self.components[component]
        start = (ts.index(after) + 1) if after in ts else self._next[component]
        for i in range(len(ts)):
            t = ts[(start + i) % len(ts)]
            if t != after and self.windows[t].has_room():
                self._next[component] = (ts.index(t) + 1) % len(ts)
                return t
        return None

    def on_sent(self, root: R, target: int, now: float) -> None:
        """A tuple fanned out to several components is in one window of each (W1, W9)."""
        self.windows[target].on_sent(root, now)
        targets = self.target_of.setdefault(root, [])
        if target not in targets:
            targets.append(target)

    def on_ack(self, root: R, now: float) -> float | None:
        """The round trip (the whole tree's: every window it was in classifies it); None if unknown."""
        rt = None
        for target in self.target_of.pop(root, ()):
            rt = self.windows[target].on_ack(root, now)
        return rt

    def on_fail(self, root: R) -> int | None:
        """W4: the (first) busy task, every window the tuple was in one smaller; None if unknown."""
        targets = self.target_of.pop(root, [])
        for target in targets:
            self.windows[target].on_fail(root)
        return targets[0] if targets else None

    def resend_target(self, component: str, busy: int) -> int | None:
        """W4: where a failed tuple goes again: another task with room, or the same one when keyed."""
        if component in self.keyed:
            return busy
        return self.pick(component, after=busy)


class Batcher:
    """W6: records grouped ``batch`` at a time."""

    def __init__(self, batch: int) -> None:
        self.batch = batch
        self.records: list[Any] = []

    def add(self, record: Any) -> list[Any] | None:
        self.records.append(record)
        if len(self.records) >= self.batch:
            return self.flush()
        return None

    def flush(self) -> list[Any] | None:
        out, self.records = self.records, []
        return out or None
