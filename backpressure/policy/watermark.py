"""JStorm water-mark backpressure (document 003), as pure state machines.

No asyncio, no I/O: time comes in as ``now``, so every rule is a unit test with a
fake clock. ``TaskWaterMark`` is one bolt task watching its own queue and deciding
what to report to the topology master; ``MasterPolicy`` is what the topology
master decides from those reports. How reports and commands travel is
``backpressure.drivers.topology_master``'s business.

Document 003, and what is reconstructed
---------------------------------------
Document 003 describes two levels. The second (transport send/receive buffers with
a size quota, which block the sender when full) is this engine's byte bound on
every input queue (``queue.hard_bound``: ``emit`` awaits room); it needs no
policy. The first level is this module:

* **Marks as fractions of the queue's capacity.** A task's execution queue has a
  high and a low water mark given as fractions of what it can hold (the hard
  bound): ``high`` (0.8) and ``low`` (0.2). Names map as

  ===========================================  ================================
  document 003 / JStorm                        topo
  ===========================================  ================================
  ``topology.backpressure.enable``             ``backpressure.policy: watermark``
  ``topology.backpressure.water.mark.high``    ``backpressure.water_mark.high``
  ``topology.backpressure.water.mark.low``     ``backpressure.water_mark.low``
  ``topology.backpressure.check.interval``     ``backpressure.water_mark.check_interval_ms``
  ===========================================  ================================

  (The last is not in document 003; JStorm's own documentation names it, and it is
  the period of the rules below that repeat.)
* **Task rule (R1).** A task whose queue is at or over ``high x capacity`` is
  overloaded and sends the topology master an "overloaded" report; it stays
  overloaded until its queue is at or under ``low x capacity``, when it sends a
  "recovered" report. In between nothing changes (hysteresis). The document reads
  "over the high water mark"; a queue exactly at the mark counts, as in the other
  policies. JStorm later added "n of the last m samples" filtering; document 003
  does not have it, so the first observation over the mark counts.
* **Re-report (R2).** While overloaded, the task repeats its report once per
  ``check_interval`` with its current level: the master learns whether its
  slowdown is working, and a lost report is repaired (reports are idempotent).
* **Who is throttled (R3).** Document 003 says only that "the upstream" slows
  down, coordinated by the topology master instead of ZooKeeper. JStorm walks the
  DAG up from the overloaded component to its source spouts and throttles those;
  so does this module (``source_spouts``). Unlike stepwise (document 000), the
  bolts in between are never throttled, and unlike source-stop, spouts that do
  not feed the overloaded component are left alone. A component counts as
  overloaded while any of its tasks is (JStorm's trigger ratio, 0.1 by default,
  amounts to the same for parallelism up to 10).
* **How much (R4).** Document 003 says the upstream "starts to slow down its
  sending rate", not by how much. JStorm's documentation: the blocked task sends
  its per-tuple execution time to the master, and each throttled spout waits that
  long per tuple, so the source runs at the slow stage's pace. Here: the task
  reports its measured ``service_rate`` (tuples/s executed while its queue was
  non-empty, i.e. its capacity); the component's capacity is the slowest
  overloaded task's rate x the component's parallelism, shared evenly among the
  spout tasks feeding it, times ``headroom`` (0.8) so the queue drains instead of
  staying at the mark (at exactly the stage's pace it would never reach the low
  mark). With no service rate measured, the spout's own rate is halved; with
  neither measured (a run's first fraction of a second) the report is recorded but
  nothing is throttled until the task's next report, one ``check_interval`` later
  (a guess would pin the spout at the floor; the hard bound holds meanwhile). A
  rate never goes under ``rate_floor``, and a new throttle never speeds a spout up.
* **Still overloaded (R5).** A re-report whose level is not below the previous
  report's means the slowdown is not draining the queue (fan-out, a mis-measured
  rate): the master multiplies those spouts' rates by ``headroom`` again: the
  document's "starts to slow down" read as "keeps slowing down until it works".
* **Release (R6).** When every component a throttled spout feeds is clear (all
  "recovered"), the master speeds it up in ``ramp_steps`` steps, one per
  ``check_interval``, the first at once: JStorm decrements the spout's per-tuple
  wait ``w`` toward 0, so here ``w = w0 x k / ramp_steps`` with ``k`` counting
  down, and the rate ``1/w`` climbs r, 4r/3, 2r, 4r for four steps. At ``k == 0``
  the limiter is turned off (exactly as before the first throttle); the spout
  counts as released. An overload during the ramp throttles again (R4) from the
  current wait, and the ramp restarts.
* **Topology flag (R7).** The master's ``throttled`` flag (JStorm's topology
  "throttled" state) is set by the first throttle and cleared when every spout
  is released.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

THROTTLE = "throttle"
SPEEDUP = "speedup"
LIFT = "lift"        # limiter off (not a stepwise RELEASE signal, which steps up by one)


@dataclass(frozen=True)
class WaterMarkParams:
    """Document 003's knobs plus the reconstruction's (see the module docstring)."""

    capacity: int                      # bytes a queue can hold: the hard bound
    high: float = 0.8
    low: float = 0.2
    check_interval: float = 1.0        # seconds
    ramp_steps: int = 4
    headroom: float = 0.8
    rate_floor: float = 1.0            # tuples/s

    def __post_init__(self) -> None:
        if self.capacity <= 0:
            raise ValueError("capacity must be > 0")
        if not 0.0 < self.low < self.high <= 1.0:
            raise ValueError("water marks must satisfy 0 < low < high <= 1")
        if self.check_interval <= 0 or self.ramp_steps < 1 or self.rate_floor <= 0:
            raise ValueError("check_interval, ramp_steps and rate_floor must be positive")
        if not 0.0 < self.headroom < 1.0:
            raise ValueError("headroom must be between 0 and 1")

    @property
    def high_bytes(self) -> float:
        return self.high * self.capacity

    @property
    def low_bytes(self) -> float:
        return self.low * self.capacity

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> "WaterMarkParams":
        return cls(capacity=int(config["queue.hard_bound"]), high=float(config["backpressure.water_mark.high"]),
                   low=float(config["backpressure.water_mark.low"]),
                   check_interval=float(config["backpressure.water_mark.check_interval_ms"]) / 1000.0,
                   rate_floor=float(config["backpressure.rate_floor"]))


@dataclass(frozen=True)
class Report:
    """A task's message to the topology master."""

    task: int
    component: str
    overloaded: bool
    level: float                       # queue bytes / capacity when reported
    service_rate: float                # tuples/s executed while busy; 0 = not measured
    ts: float


class TaskWaterMark:
    """One bolt task's queue against the water marks (R1, R2)."""

    def __init__(self, task_id: int, component: str, params: WaterMarkParams) -> None:
        self.task_id = task_id
        self.component = component
        self.params = params
        self.overloaded = False
        self.last_report = 0.0

    def observe(self, now: float, queue_bytes: int, service_rate: float = 0.0) -> Report | None:
        """One observation (cheap, on the hot path); a report when one is due."""
        p = self.params
        if self.overloaded:
            if queue_bytes <= p.low_bytes:
                self.overloaded = False
                return self._report(now, queue_bytes, service_rate)
            if now - self.last_report >= p.check_interval:
                return self._report(now, queue_bytes, service_rate)
        elif queue_bytes >= p.high_bytes:
            self.overloaded = True
            return self._report(now, queue_bytes, service_rate)
        return None

    def _report(self, now: float, queue_bytes: int, service_rate: float) -> Report:
        self.last_report = now
        return Report(self.task_id, self.component, self.overloaded, queue_bytes / self.params.capacity,
                      service_rate, now)


@dataclass(frozen=True)
class Command:
    """The master's control message to one spout task: this rate, or (None) limiter off."""

    spout: int
    rate: float | None
    k: int                             # ramp steps left before the limiter goes off
    kind: str                          # THROTTLE, SPEEDUP or LIFT


@dataclass
class _Spout:
    wait: float = 0.0                  # seconds per tuple; 0 = limiter off
    w0: float = 0.0                    # the wait the current ramp started from
    k: int = 0
    next_step: float | None = None     # when the ramp takes its next step (None: not ramping)


def source_spouts(inputs: Mapping[str, Iterable[str]], spouts: Iterable[str]) -> dict[str, frozenset[str]]:
    """For each component, the spout components it is fed from, walking the DAG upward (R3)."""
    spout_set = set(spouts)
    out: dict[str, frozenset[str]] = {}

    def walk(c: str, seen: set[str]) -> frozenset[str]:
        if c in out:
            return out[c]
        if c in seen:          # a cycle (not a valid topology, but never loop forever)
            return frozenset()
        seen.add(c)
        found = {c} if c in spout_set else set()
        for up in inputs.get(c, ()):
            found |= walk(up, seen)
        out[c] = frozenset(found)
        return out[c]

    for c in set(inputs) | spout_set:
        walk(c, set())
    return out


@dataclass
class MasterPolicy:
    """The topology master's decisions (R3-R7) over reports from every bolt task."""

    params: WaterMarkParams
    sources: Mapping[str, Sequence[int]]       # component -> spout tasks feeding it
    parallelism: Mapping[str, int]             # component -> its number of tasks
    overloaded: dict[str, dict[int, Report]] = field(default_factory=dict)
    spouts: dict[int, _Spout] = field(default_factory=dict)
    throttled: bool = False

    def rate(self, spout: int) -> float | None:
        st = self.spouts.get(spout)
        return 1.0 / st.wait if st is not None and st.wait > 0 else None

    def on_report(self, r: Report, now: float, spout_rate: Callable[[int], float]) -> list[Command]:
        out: list[Command] = []
        tasks = self.overloaded.setdefault(r.component, {})
        if r.overloaded:
            prev = tasks.get(r.task)
            tasks[r.task] = r
            derived = self._derived(r.component, spout_rate)
            for s in self.sources.get(r.component, ()):
                target = derived(s)
                current = self.rate(s)
                if prev is not None and current is not None and r.level >= prev.level:
                    target = min(target or current, current * self.params.headroom)     # R5
                if target is not None:
                    self._throttle(s, max(self.params.rate_floor, target), out)
        else:
            tasks.pop(r.task, None)
            if not tasks:
                del self.overloaded[r.component]
                self._start_ramps(r.component, now)
        out.extend(self.advance(now))
        return out

    def forget(self, task: int, now: float) -> list[Command]:
        """A task is gone: whatever it reported no longer holds anything."""
        for comp, tasks in list(self.overloaded.items()):
            if task in tasks:
                return self.on_report(Report(task, comp, False, 0.0, 0.0, now), now, lambda s: 0.0)
        return []

    def advance(self, now: float) -> list[Command]:
        """Take every ramp step that is due (R6) and settle the topology flag (R7)."""
        out: list[Command] = []
        p = self.params
        for s, st in self.spouts.items():
            if st.next_step is None or now < st.next_step or st.wait == 0:
                continue
            st.k -= 1
            if st.k <= 0:
                st.k, st.wait, st.next_step = 0, 0.0, None
                out.append(Command(s, None, 0, LIFT))
            else:
                st.wait = st.w0 * st.k / p.ramp_steps
                st.next_step = now + p.check_interval
                out.append(Command(s, 1.0 / st.wait, st.k, SPEEDUP))
        if self.throttled and all(st.wait == 0 for st in self.spouts.values()):
            self.throttled = False
        return out

    def release_all(self) -> list[Command]:
        """The run is stopping: every spout back to full speed."""
        out = [Command(s, None, 0, LIFT) for s, st in self.spouts.items() if st.wait > 0]
        self.spouts.clear()
        self.overloaded.clear()
        self.throttled = False
        return out

    def _derived(self, component: str, spout_rate: Callable[[int], float]) -> Callable[[int], float | None]:
        """R4: the rate a spout feeding ``component`` should run at (None: nothing measured yet)."""
        p = self.params
        rates = [r.service_rate for r in self.overloaded.get(component, {}).values() if r.service_rate > 0]
        feeders = max(1, len(self.sources.get(component, ())))
        if rates:
            share = min(rates) * self.parallelism.get(component, 1) / feeders
            return lambda s: p.headroom * share

        def halve(s: int) -> float | None:
            known = self.rate(s) or spout_rate(s)
            return 0.5 * known if known > 0 else None
        return halve

    def _throttle(self, s: int, rate: float, out: list[Command]) -> None:
        st = self.spouts.setdefault(s, _Spout())
        wait = 1.0 / rate
        changed = wait > st.wait or st.k != self.params.ramp_steps
        if wait > st.wait:
            st.wait = wait
        st.w0, st.k, st.next_step = st.wait, self.params.ramp_steps, None
        self.throttled = True
        if changed:
            out.append(Command(s, 1.0 / st.wait, st.k, THROTTLE))

    def _start_ramps(self, component: str, now: float) -> None:
        busy = {s for comp in self.overloaded for s in self.sources.get(comp, ())}
        for s in self.sources.get(component, ()):
            st = self.spouts.get(s)
            if st is not None and st.wait > 0 and s not in busy and st.next_step is None:
                st.next_step = now
