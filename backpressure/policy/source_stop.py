"""Source-stop backpressure (Heron's baseline), as a pure state machine.

Heron's stream managers, when any instance's buffer passes a high water mark, tell
every stream manager of the topology to stop reading from its local spouts, and
let them read again once every buffer that triggered it is back under a low water
mark. It is the blunt instrument the other policies are measured against: it
cannot overflow, but it stops *every* branch of the topology for the sake of one
slow task, and it throttles in bursts (full speed, stop, full speed...).

The rules, as this module implements them
-----------------------------------------
* A bolt task is *overloaded* from the observation at which its queue is at or
  over ``high_mark`` bytes until the observation at which it is at or under
  ``low_mark`` bytes (hysteresis: in between, it keeps whichever state it had).
* The spouts are *stopped* while at least one task is overloaded and *running*
  otherwise. The transition is the only output: ``STOP`` when the first task
  overloads, ``RESUME`` when the last overloaded task recovers. Nothing here is
  per spout: every spout of the topology obeys the same decision.
* A task that goes away (``forget``) stops counting as overloaded, so a dead task
  never keeps the topology stopped.

"Stop" means a rate limit of ``stop_rate`` tuples/s, not a pause: the engine's
seam offers a rate limiter and no pause, and a limiter never drops a tuple (it
only makes the spout wait). The limiter sleeps after each ``next_tuple`` call for
as long as that call's tuples take at ``stop_rate``, and a resume does not cut a
sleep short, so ``stop_rate`` trades the trickle while stopped against the lag
of a resume: ``n / stop_rate`` seconds for a spout that emits ``n`` tuples per
call. Storm's convention is one tuple per call (5 ms at the default 200/s); a
spout that catches up a whole batch per call (the examples' ``OfferedSpout``, up
to 256) waits up to 1.3 s. At 20/s that spout slept 12.8 s per stop and the
baseline measured nothing but its own artifact; at 200/s the trickle is 1 % of a
20,000/s source and 4 % of a 5,000/s stage, which still drains. A true pause
would need ``pause``/``resume`` on the engine's ``TaskHandle``. Resume turns the
limiter off: the spouts are back at exactly the speed they had before the first
stop.

Time comes in as ``now`` (any monotonic clock) and is used only for accounting
(how long and how often the spouts were stopped).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

STOP = "stop"
RESUME = "resume"
BECAME_OVERLOADED = "became_overloaded"   # a task transition, not a level (cf. stepwise levels)
BECAME_LIGHT = "became_light"


@dataclass(frozen=True)
class SourceStopParams:
    """Marks in queue bytes (shared with stepwise: ``queue.high_mark``/``low_mark``)."""

    high_mark: int = 50_000_000
    low_mark: int = 500_000
    stop_rate: float = 200.0         # tuples/s a "stopped" spout may still emit

    def __post_init__(self) -> None:
        if self.low_mark >= self.high_mark:
            raise ValueError("low_mark must be below high_mark")
        if not self.stop_rate > 0:
            raise ValueError("stop_rate must be > 0")

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> "SourceStopParams":
        return cls(high_mark=int(config["queue.high_mark"]), low_mark=int(config["queue.low_mark"]),
                   stop_rate=float(config["backpressure.source_stop.stop_rate"]))


@dataclass(frozen=True)
class Outcome:
    """What one observation changed: the task's own state, and the spouts' (None: unchanged)."""

    task: str | None = None          # BECAME_OVERLOADED or BECAME_LIGHT
    spouts: str | None = None        # STOP or RESUME


_NOTHING = Outcome()


class SourceStop:
    """The whole topology's decision: are the spouts stopped?"""

    def __init__(self, params: SourceStopParams, now: float) -> None:
        self.params = params
        self.overloaded: set[int] = set()
        self.stopped = False
        self.stops = 0                    # episodes so far
        self.stopped_since: float | None = None
        self._stopped_total = 0.0
        self.started = now

    def observe(self, task_id: int, queue_bytes: int, now: float) -> Outcome:
        """One observation of one bolt task's queue (cheap: called after each batch)."""
        p = self.params
        if queue_bytes >= p.high_mark:
            if task_id in self.overloaded:
                return _NOTHING
            self.overloaded.add(task_id)
            return Outcome(BECAME_OVERLOADED, self._settle(now))
        if queue_bytes <= p.low_mark and task_id in self.overloaded:
            self.overloaded.discard(task_id)
            return Outcome(BECAME_LIGHT, self._settle(now))
        return _NOTHING

    def forget(self, task_id: int, now: float) -> Outcome:
        """A task is gone: it no longer holds the spouts."""
        if task_id not in self.overloaded:
            return _NOTHING
        self.overloaded.discard(task_id)
        return Outcome(BECAME_LIGHT, self._settle(now))

    def stopped_for(self, now: float) -> float:
        """Seconds the spouts have been stopped in total, up to ``now``."""
        extra = now - self.stopped_since if self.stopped_since is not None else 0.0
        return self._stopped_total + extra

    def _settle(self, now: float) -> str | None:
        if self.overloaded and not self.stopped:
            self.stopped = True
            self.stops += 1
            self.stopped_since = now
            return STOP
        if not self.overloaded and self.stopped:
            self.stopped = False
            if self.stopped_since is not None:
                self._stopped_total += now - self.stopped_since
            self.stopped_since = None
            return RESUME
        return None
