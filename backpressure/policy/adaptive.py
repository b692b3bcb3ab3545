"""Adaptive thresholds, rate coefficients, autoscaling and load balancing (document 004).

Pure: no asyncio, no I/O; time comes in as ``now``. The document is patent
CN108073445B; its terms keep their names here:

==================================  =========================================
document 004                        this module
==================================  =========================================
stream data pool, data proportion   a task's input queue, ``level`` (bytes / hard bound)
first threshold (high water level)  ``TaskMarks.first_threshold`` (0.7 in [0.6, 0.9])
second threshold (low water level)  ``TaskMarks.second_threshold`` (0.2 in [0.1, 0.4])
adjustment step                     ``AdaptiveParams.threshold_step`` (0.1)
backpressure window                 ``BackpressureWindow`` (fixed period, uniform samples)
time proportion, preset proportion  ``BackpressureWindow.time_ratio``, ``preset_ratio`` (0.5)
backpressure flag                   ``TaskMarks.flagged`` (+ ``generation``)
rate coefficient, preset value      ``RateCoefficient.coefficient``, ``preset_coefficient`` (0.2)
concurrency, management node        ``Autoscaler`` (decisions), ``seams.Scaler`` (the engine)
load balancing by water levels      ``Balancer``
==================================  =========================================

Rules (each is a test in ``tests/test_adaptive_policy.py`` named after it)
--------------------------------------------------------------------------
* **A1 marks move together** (claims 2-3): both thresholds move by ``threshold_step``
  in the same direction, each kept inside its range; the ranges are as wide as
  each other, so the gap (0.5) never changes.
* **A2 flag at the first threshold** (S406/S414): ``level >= first_threshold``
  adds the backpressure flag (kept if already there).
* **A3 raise after a busy window** (S408-S412): when, besides, the share of the
  backpressure window's samples at or over the first threshold is at least
  ``preset_ratio``, both marks rise and the window is cleared. The window is a
  fixed period sampled on a uniform grid (``samples`` points); the share divides
  by the full window's sample count, so after a clear it takes at least
  ``preset_ratio`` of a whole period over the mark to rise again. Gaps between
  observations are filled with the last observed state (sample and hold). At the
  top of the range the marks stay but the window is still cleared.
* **A4 unflag at the second threshold** (S416-S426): ``level <= second_threshold``
  removes the flag; if the first threshold is above the bottom of its range
  ("adjusted higher", S420: relative to the range's lowest value, which is why
  the document's example lowers 0.7 to 0.6) both marks fall and the window is
  cleared. Between the marks nothing changes (hysteresis).
* **A5 re-flag on a raise** (reconstruction): the claim says a raise "executes the
  operation of increasing the backpressure flag"; a flag already set is kept
  (S306), so the upstream could not tell. Here each raise bumps the flag's
  ``generation`` and upstreams count it as one more flag added. Without it a
  task that stays flagged under a sustained overload would hold its upstream one
  step below full speed forever; with it the upstream keeps stepping down once
  per half window while the overload lasts.
* **A6 rate coefficient** (S702-S710): an upstream counts the flags of its direct
  downstream tasks; each flag added lowers its coefficient by
  ``coefficient_step``, each removed raises it by one ``coefficient_step`` (S706),
  up to 1.0 (limiter off). The
  floor is ``preset_coefficient``: S708 read literally ("coefficient >= 0.2:
  lower it") would go to 0.1; the claim calls it a lower limit, so here the
  coefficient never goes under it, and an add that cannot lower it is "at the
  floor".
* **A6b the way back is one step per check** (the description's reading of the
  periodic check: the upstream "periodically checks whether its downstream tasks have
  removed the flag, and if so" raises its rate by one step): every check that finds
  none of its downstream tasks flagged raises the coefficient by one step until 1.0,
  so the steps an episode took (more than one after A5 re-adds) come back one per
  check. Giving them all back with the removal (as before) turned the limiter off at
  once, and an endless spout refilled its downstream queue to the hard bound before
  the next flag: the queue swung between the low mark and the bound.
* **A6c idle downstream: every step back at once** (ours, with A7c's metered max rate):
  a check that finds no downstream task flagged and a downstream queue it sees empty
  (``starved``) sets the coefficient back to 1.0, which with a metered max rate still
  limits the upstream to what the system took while it was busy (A7d), so it cannot refill
  the queues in a burst. One step per check left the bottleneck idle for as many checks as
  the steps the overload took (scenario b: its four tasks idle about 0.8 s after the
  start-up backlog drained, goodput 0.93).
* **A7 send interval** (S-claims 5-6 and the worked example): the document says
  the interval is "coefficient x average time per tuple" but also that
  coefficient 1 is the maximum rate, and read literally a lower coefficient would
  shorten the interval and speed the sender up. Reconstructed: the interval per
  tuple is ``average time / coefficient``, so the rate is ``coefficient x max
  rate``; the max rate is the upstream's rate measured before its first step.
* **A7b a step cuts the rate the upstream sends** (reconstruction: the document's
  average time per tuple is a long-run figure, "one or more days", and a coefficient
  is "a multiple of the employed rate and the maximum rate"): when a flag is added
  while the upstream sends under its limit (something else holds it: a full queue's
  hard bound, its own source), the max rate is measured again as
  ``observed / coefficient``, so the step lowers what it actually sends. Without it
  the max rate an endless spout showed in its first fraction of a second (filling
  empty queues, 5x what the bottleneck takes in scenario b) made every step, down to
  the floor, a limit above the bottleneck's rate: the queues stayed at their bound.
* **A7c the max rate is what the system takes** (ours, within the document: its average
  time per tuple "may be the average time consumption of a single piece of flow data in
  the entire distributed flow computing system"): when the driver can meter the flagged
  downstream component (``taken``: tuples/s its tasks fed by this upstream executed lately,
  this upstream's share), a flag added measures the max rate as that figure, so coefficient
  1.0 is one tuple per the system's time per tuple and each step sends ``coefficient`` of
  what the bottleneck takes: the flagged queue drains at once instead of after several
  steps from the upstream's own (burst) rate. Measured again at every check while a
  metered downstream task is flagged (its queue is then at least at its second
  threshold, so the task never idled and the meter reads its service rate, not what it
  was sent): a limit set from a rate still rising or falling (a relay's start-up burst,
  capacity dropping) follows it within one check instead of waiting for the next add;
  the change is reported with ``remeasured`` and counts as no signal. Where no meter
  exists (a downstream task in another worker), A7 / A7b apply.
* **A7d coefficient 1.0 is the max rate** (ours: the document's "when the rate coefficient
  is 1, the stream data is transmitted at the maximum rate", with A7c's max rate): back at
  1.0 an upstream whose max rate is metered keeps sending at it instead of turning its
  limiter off. A check that finds no downstream task flagged and every downstream queue it
  sees empty (``idle``: the system takes more than it is sent, as after a capacity drop
  recovers) doubles the max rate, and turns the limiter off once the doubled rate would
  reach the upstream's own rate (``own_rate``; at once when unknown). Turning it off at 1.0
  let an endless spout fill the queue it had just drained to the hard bound within a few
  milliseconds, before any poll could flag it; turning it off at the first idle check did
  the same whenever a limit held at the bottleneck's rate emptied the queues for a moment
  (scenario b with acking: 14,600/s into four queues of 1,250/s, all at their bound).
* **A8 scale out** (S712-S714, claim 1): a flag added while the upstream is at the
  floor, with at least ``scale_ratio`` of the flagged task's component's parallel
  tasks flagged, asks for one more task of that component; ``Autoscaler`` grants
  it below ``max_parallelism`` and outside the ``cooldown`` after its last action
  on that component. With a metered max rate (A7c, ours) the coefficient is a share of
  what the system takes and seldom reaches its floor (each step drains the queue), so
  the floor is also read against the upstream's own rate (``own_rate``: the most it
  sent with its limiter off, read at every check): a step that would send under
  ``preset_coefficient`` of it asks for the task too, and the step is still taken.
* **A9 scale in** (reconstruction: the document only adds): a component above its
  initial parallelism that has been quiet (no task flagged, every upstream back at
  coefficient 1.0) without a break for a whole ``cooldown``, and at least a
  ``cooldown`` after its last action, gives one task back. The cool-down runs from
  when an action was *carried out* (``completed``): adding a task to a fields-grouped
  component drains the topology first, and a drained queue must not read as quiet.
* **A10 load balancing** (S802-S806, fig. 9): an upstream takes ``balance_shift``
  of its share away from the downstream task with the largest level and splits
  it among those with the smallest (levels 0.5, 0.2, 0.2: the first loses, the
  others gain equally). Equal levels change nothing; shares never go under
  ``min_share``. Unlike the ``load_aware`` grouping (per tuple, two random
  choices on live levels, no memory), these are per-upstream weights moved a
  little each period, so one stale reading cannot herd the traffic.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

FLAG_ADDED = "flag_added"
FLAG_REMOVED = "flag_removed"
SCALE_OUT = "scale_out"
SCALE_IN = "scale_in"
_EPS = 1e-9


def _r(x: float) -> float:
    return round(x, 9)


@dataclass(frozen=True)
class AdaptiveParams:
    capacity: int                                    # bytes: the queue's hard bound
    first_threshold: float = 0.7
    first_range: tuple[float, float] = (0.6, 0.9)
    second_threshold: float = 0.2
    second_range: tuple[float, float] = (0.1, 0.4)
    threshold_step: float = 0.1
    backpressure_window: float = 10.0                # seconds (the document's example: 10 min)
    samples: int = 20
    preset_ratio: float = 0.5
    coefficient_step: float = 0.1
    preset_coefficient: float = 0.2
    scale_ratio: float = 0.5
    max_parallelism: int = 4
    cooldown: float = 30.0                           # seconds between scale actions on a component
    check_interval: float = 0.25                     # seconds: the upstream's periodic check
    balance_shift: float = 0.1
    min_share: float = 0.05
    rate_floor: float = 1.0

    def __post_init__(self) -> None:
        lo1, hi1 = self.first_range
        lo2, hi2 = self.second_range
        if self.capacity <= 0:
            raise ValueError("capacity must be > 0")
        if not (0 < lo2 <= self.second_threshold <= hi2 < 1 and 0 < lo1 <= self.first_threshold <= hi1 <= 1):
            raise ValueError("each threshold must lie inside its range, inside (0, 1]")
        if not (lo2 < lo1 and hi2 < hi1 and self.second_threshold < self.first_threshold):
            raise ValueError("the second threshold and its range must lie below the first")
        if self.threshold_step <= 0 or self.coefficient_step <= 0 or self.samples < 1:
            raise ValueError("steps and samples must be positive")
        if not (0 < self.preset_coefficient <= 1 and 0 < self.preset_ratio <= 1 and 0 < self.scale_ratio <= 1):
            raise ValueError("preset coefficient and ratios must be in (0, 1]")
        if self.backpressure_window <= 0 or self.check_interval <= 0 or self.cooldown < 0:
            raise ValueError("backpressure_window and check_interval must be > 0")
        if self.max_parallelism < 1 or not 0 < self.balance_shift < 1 or not 0 <= self.min_share < 0.5:
            raise ValueError("max_parallelism >= 1, 0 < balance_shift < 1, 0 <= min_share < 0.5")

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> "AdaptiveParams":
        a = "backpressure.adaptive."
        return cls(capacity=int(config["queue.hard_bound"]),
                   first_threshold=float(config[a + "high"]),
                   first_range=(float(config[a + "high_min"]), float(config[a + "high_max"])),
                   second_threshold=float(config[a + "low"]),
                   second_range=(float(config[a + "low_min"]), float(config[a + "low_max"])),
                   threshold_step=float(config[a + "threshold_step"]),
                   backpressure_window=float(config[a + "window_ms"]) / 1000.0,
                   samples=int(config[a + "samples"]), preset_ratio=float(config[a + "preset_ratio"]),
                   coefficient_step=float(config[a + "coefficient_step"]),
                   preset_coefficient=float(config[a + "preset_coefficient"]),
                   scale_ratio=float(config[a + "scale_ratio"]),
                   max_parallelism=int(config[a + "max_parallelism"]),
                   cooldown=float(config[a + "cooldown_ms"]) / 1000.0,
                   check_interval=float(config[a + "check_interval_ms"]) / 1000.0,
                   balance_shift=float(config[a + "balance_shift"]),
                   rate_floor=float(config["backpressure.rate_floor"]))


class BackpressureWindow:
    """A fixed period sampled on a uniform grid: the share of samples at or over the mark (A3)."""

    def __init__(self, period: float, samples: int) -> None:
        self.samples = samples
        self.interval = period / samples
        self._over: deque[bool] = deque(maxlen=samples)
        self._next: float | None = None
        self._last = False

    def sample(self, now: float, over: bool) -> None:
        if self._next is None:
            self._next = now
        while self._next < now - _EPS:              # grid points passed unobserved: hold the last state
            self._over.append(self._last)
            self._next += self.interval
        if now >= self._next - _EPS:
            self._over.append(over)
            self._next += self.interval
        self._last = over

    @property
    def time_ratio(self) -> float:
        return sum(self._over) / self.samples

    def reset(self) -> None:
        self._over.clear()


@dataclass(frozen=True)
class MarkChange:
    flag: str | None = None          # FLAG_ADDED / FLAG_REMOVED
    raised: bool = False
    lowered: bool = False


_NO_CHANGE = MarkChange()


class TaskMarks:
    """One downstream task's thresholds, backpressure window and flag (A1-A5)."""

    def __init__(self, params: AdaptiveParams) -> None:
        self.params = params
        self.first_threshold = params.first_threshold
        self.second_threshold = params.second_threshold
        self.window = BackpressureWindow(params.backpressure_window, params.samples)
        self.flagged = False
        self.generation = 0               # bumped by every add and every raise (A5)
        self.removals = 0                 # bumped by every removal (A6: counted, not sampled)

    def observe(self, now: float, level: float) -> MarkChange:
        p = self.params
        self.window.sample(now, level >= self.first_threshold - _EPS)
        if level >= self.first_threshold - _EPS:
            raised = self.window.time_ratio >= p.preset_ratio - _EPS
            if raised:
                self._move(+1)
                self.window.reset()
            if not self.flagged or raised:
                self.flagged = True
                self.generation += 1
                return MarkChange(FLAG_ADDED, raised=raised)
            return _NO_CHANGE
        if level <= self.second_threshold + _EPS:
            lowered = self.first_threshold > p.first_range[0] + _EPS
            if lowered:
                self._move(-1)
                self.window.reset()
            if self.flagged:
                self.flagged = False
                self.removals += 1
                return MarkChange(FLAG_REMOVED, lowered=lowered)
            return MarkChange(None, lowered=lowered) if lowered else _NO_CHANGE
        return _NO_CHANGE

    def _move(self, direction: int) -> None:
        """A1: both marks by one step, the same way, each clamped to its range."""
        p = self.params
        d = direction * p.threshold_step
        hi = min(max(self.first_threshold + d, p.first_range[0]), p.first_range[1])
        lo = min(max(self.second_threshold + d, p.second_range[0]), p.second_range[1])
        self.first_threshold, self.second_threshold = _r(hi), _r(lo)


@dataclass(frozen=True)
class FlagView:
    """What an upstream reads of one downstream task (through the flag store)."""

    component: str
    flagged: bool
    generation: int
    removals: int | None = None      # removals so far; None where only the state is published


@dataclass(frozen=True)
class CoefficientChange:
    coefficient: float
    added: int
    removed: int
    scale_out: tuple[str, ...] = ()       # components asking for one more task (A8)
    remeasured: bool = False              # only the max rate moved (A7c): no signal


class RateCoefficient:
    """One upstream task's rate coefficient over its direct downstream tasks' flags (A6-A8)."""

    def __init__(self, params: AdaptiveParams) -> None:
        self.params = params
        self.coefficient = 1.0
        self.max_rate: float | None = None    # measured before the first step (A7)
        self.metered = False                  # max_rate is the system's take rate (A7c, A7d)
        self.own_rate: float | None = None    # what it sent with its limiter off (A8 with A7c)
        self._seen: dict[int, tuple[bool, int, int | None]] = {}

    @property
    def at_floor(self) -> bool:
        return self.coefficient - self.params.coefficient_step < self.params.preset_coefficient - _EPS

    def check(self, flags: Mapping[int, FlagView], parallel: Mapping[str, int],
              observed: float | None = None,
              taken: Mapping[str, float] | None = None,
              idle: bool = False, starved: bool = False) -> CoefficientChange | None:
        """The periodic check (S702-S716): flags added or removed since the last one.

        A removed flag gives back one step (A6); a check that finds no downstream task
        flagged gives back one more (A6b), until 1.0. ``observed``: the upstream's rate
        now, measured for A7 / A7b when a flag is added; ``taken``: per downstream
        component, what it executed of this upstream's tuples per second (A7c); ``idle``:
        every downstream queue it can see is empty (A7d); ``starved``: at least one (A6c).
        """
        p = self.params
        if observed and self.rate() is None:             # sent with no limiter: its own max rate
            self.own_rate = max(self.own_rate or 0.0, observed)
        added: list[tuple[int, str]] = []
        removed = 0
        for task, v in flags.items():
            was, gen, rem = self._seen.get(task, (False, -1, None))
            if rem is not None and v.removals is not None and gen <= v.generation and rem <= v.removals:
                # counted (A6): a flag removed and added again between two checks is one of each
                removed += v.removals - rem
                added += [(task, v.component)] * (v.generation - gen)
            elif v.flagged and (not was or v.generation > gen):   # first sight, a restart, or only
                added.append((task, v.component))                 # the state published: sampled
            elif was and not v.flagged:
                removed += 1
            self._seen[task] = (v.flagged, v.generation, v.removals)
        for task in [t for t in self._seen if t not in flags]:     # a task gone: its flag with it
            if self._seen.pop(task)[0]:
                removed += 1
        busy = [taken[v.component] for v in flags.values()
                if v.flagged and taken and taken.get(v.component, 0.0) > 0]
        if not added and not removed:
            if busy and self.max_rate and (self.metered or self.coefficient < 1.0 - _EPS):   # A7c
                old, self.max_rate = self.max_rate, min(busy)
                if abs(self.max_rate - old) > 0.02 * old or not self.metered:
                    self.metered = True
                    return CoefficientChange(self.coefficient, 0, 0, remeasured=True)
                self.max_rate = old
                return None
            if any(v.flagged for v in flags.values()):
                return None
            if self.coefficient < 1.0 - _EPS:
                if self.metered and (starved or idle):   # A6c: every step back at once
                    self.coefficient = 1.0
                else:
                    self.coefficient = _r(min(1.0, self.coefficient + p.coefficient_step))     # A6b
                return CoefficientChange(self.coefficient, 0, 0)
            if self.metered and idle and self.max_rate:  # A7d: the system takes more than that
                if self.own_rate and 2 * self.max_rate < self.own_rate:
                    self.max_rate *= 2                   # probe up, a doubling per idle check
                else:
                    self.metered, self.max_rate = False, None     # past its own rate: off
                return CoefficientChange(self.coefficient, 0, 0)
            return None
        if added and busy:
            self.max_rate = min(busy)                    # A7c: the slowest flagged component's
            self.metered = True
        elif added and observed is not None:
            if self.metered:                             # unmetered now: A7 from its own rate
                self.metered, self.max_rate = False, self.own_rate
            self._measure(observed)
        scale: list[str] = []
        for task, comp in added:
            floor = self.at_floor
            if floor or self._under_own_floor():
                n = max(1, parallel.get(comp, 1))
                k = sum(1 for v in flags.values() if v.component == comp and v.flagged)
                if k / n >= p.scale_ratio - _EPS and comp not in scale:
                    scale.append(comp)
            if not floor:
                self.coefficient = _r(self.coefficient - p.coefficient_step)
        self.coefficient = _r(min(1.0, self.coefficient + removed * p.coefficient_step))
        return CoefficientChange(self.coefficient, len(added), removed, tuple(scale))

    def _under_own_floor(self) -> bool:
        """A8 with A7c: a metered coefficient is a share of what the system takes, so "at the
        floor" is read against the upstream's own rate: the step would send under
        ``preset_coefficient`` of what it sent with no limiter."""
        if not (self.metered and self.max_rate and self.own_rate):
            return False
        nxt = max(self.coefficient - self.params.coefficient_step, self.params.preset_coefficient)
        return nxt * self.max_rate < self.params.preset_coefficient * self.own_rate - _EPS

    def _measure(self, observed: float) -> None:
        """A7: the max rate is the rate before the first step. A7b: at a later step, an
        upstream sending under its limit has its max rate measured again."""
        if self.coefficient >= 1.0 - _EPS or not self.max_rate:
            self.max_rate = observed
        elif 0 < observed < self.coefficient * self.max_rate - _EPS:
            self.max_rate = observed / self.coefficient

    def rate(self) -> float | None:
        """A7: coefficient x max rate; None (limiter off) at 1.0 or with no max rate measured,
        except a metered max rate (A7d), held at 1.0 until the downstream idles."""
        if not self.max_rate or (self.coefficient >= 1.0 - _EPS and not self.metered):
            return None
        return max(self.params.rate_floor, self.coefficient * self.max_rate)

    def send_interval(self, average_time: float) -> float:
        """Seconds per tuple at this coefficient, ``average_time`` being one tuple at full speed."""
        return average_time / self.coefficient


@dataclass(frozen=True)
class ScaleDecision:
    kind: str              # SCALE_OUT or SCALE_IN
    component: str
    parallelism: int       # what it should become
    at: float


@dataclass
class Autoscaler:
    """Grants scale requests per component: max_parallelism, cooldown, and scale in (A8, A9)."""

    params: AdaptiveParams
    initial: Mapping[str, int]
    parallelism: dict[str, int] = field(default_factory=dict)
    last_action: dict[str, float] = field(default_factory=dict)
    decisions: list[ScaleDecision] = field(default_factory=list)
    quiet_since: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for c, n in self.initial.items():
            self.parallelism.setdefault(c, n)

    def _cool(self, component: str, now: float) -> bool:
        last = self.last_action.get(component)
        return last is None or now - last >= self.params.cooldown - _EPS

    def request_out(self, component: str, now: float) -> ScaleDecision | None:
        n = self.parallelism.get(component, 1)
        if n >= self.params.max_parallelism or not self._cool(component, now):
            return None
        return self._decide(SCALE_OUT, component, n + 1, now)

    def consider_in(self, component: str, quiet: bool, now: float) -> ScaleDecision | None:
        """``quiet``: no task of it flagged and all its upstreams at coefficient 1.0 (now)."""
        if not quiet:
            self.quiet_since.pop(component, None)
            return None
        since = self.quiet_since.setdefault(component, now)
        n = self.parallelism.get(component, 1)
        if (n <= self.initial.get(component, 1) or not self._cool(component, now)
                or now - since < self.params.cooldown - _EPS):
            return None
        return self._decide(SCALE_IN, component, n - 1, now)

    def completed(self, component: str, now: float) -> None:
        """An action was carried out (it may take a drain): the cool-down starts again."""
        self.last_action[component] = now
        self.quiet_since.pop(component, None)

    def _decide(self, kind: str, component: str, n: int, now: float) -> ScaleDecision:
        self.parallelism[component] = n
        self.last_action[component] = now
        self.quiet_since.pop(component, None)
        d = ScaleDecision(kind, component, n, now)
        self.decisions.append(d)
        return d


class Balancer:
    """One upstream's shares of its downstream tasks of one component, moved by levels (A10)."""

    def __init__(self, params: AdaptiveParams, tasks: Iterable[int]) -> None:
        self.params = params
        ts = list(tasks)
        self.shares: dict[int, float] = {t: 1.0 / len(ts) for t in ts} if ts else {}

    def rebalance(self, levels: Mapping[int, float]) -> dict[int, float] | None:
        """New shares when the levels differ; None when nothing changed."""
        live = {t: levels[t] for t in self.shares if t in levels}
        if len(live) < 2:
            return None
        top = max(live.values())
        bottom = min(live.values())
        if top - bottom <= _EPS:
            return None
        heavy = max((t for t in live if live[t] == top), key=lambda t: self.shares[t])
        light = [t for t in live if live[t] == bottom]
        take = min(self.params.balance_shift * self.shares[heavy],
                   max(0.0, self.shares[heavy] - self.params.min_share))
        if take <= _EPS:
            return None
        self.shares[heavy] -= take
        for t in light:
            self.shares[t] += take / len(light)
        return dict(self.shares)

    def resize(self, tasks: Iterable[int]) -> None:
        """Tasks added or removed (scaling, restarts): a new task starts at an even share."""
        ts = list(tasks)
        if not ts:
            self.shares = {}
            return
        kept = {t: self.shares.get(t, 1.0 / len(ts)) for t in ts}
        total = sum(kept.values())
        self.shares = {t: s / total for t, s in kept.items()}
