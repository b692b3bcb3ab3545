"""Dynamic stepwise backpressure (document 000), as two pure state machines.

No asyncio, no I/O: time comes in as an argument (``now``, seconds on any
monotonic clock) so every rule below is a unit test with a fake clock.

``Downstream`` is one task watching its own input queue (the document's
``task_i``); ``Throttle`` is one task whose emit rate its downstreams hold (the
document's ``u_i``). A task can be both. Signals between them are
``backpressure.signals.Signal`` records; how they travel is not this module's
business.

The document's steps, and how they read here
--------------------------------------------
* Steps 1-3, 9 (which tasks, overloaded or light): a task is *overloaded* when its
  queue is at or over ``high_mark`` and *light* when its queue has been at or under
  ``low_mark`` at every observation for the whole ``sensitivity`` window.
* The check runs at most once per ``sensitivity`` per task (the document calls the
  method "at least sensitivity ms apart" from the bolt's execute path; the runtime
  also calls it from a timer so an idle task still releases). One exception keeps
  the reaction fast: when the last check did not find the task overloaded and an
  observation is at or over the high mark, the check runs at once. A task that
  stays overloaded therefore steps its upstreams down at most once per
  ``sensitivity``; a task that stays light steps them up at most once per
  ``sensitivity`` (each release restarts the light window).
* Steps 4-8 (step down each direct upstream not already mid-step): "mid-step"
  (the document's "正在进行反压", being backpressured right now) is read as *this
  task has signalled that upstream and the upstream has not yet acknowledged it in
  its published state* (``TaskState.applied``). Reading it as "the upstream's
  backpressure flag is set" would allow one step only and contradict steps 13-14,
  which climb back over several steps. So an overloaded task does not re-signal
  an upstream on every check; and if the acknowledgement never comes (a lost
  message, a lost state record), the same signal is sent again after
  ``resend_after``, which is harmless because signals are idempotent.
  A step also stays "in progress" while it visibly works: when the queue is still
  over the high mark but has fallen since the previous check, the backlog is
  draining at the rate already held, and a further step would only overshoot
  (throttle the upstream below what this task can take, then climb back up: the
  load oscillation the document sets out to avoid). So an overloaded task steps an
  upstream it already holds again only when its queue did not fall over the last
  ``sensitivity``.
* Step 7 (rate := v' x current rate, record ``originv`` on the first step): the
  rate is never multiplied in place. A ``Throttle`` holds an integer step count
  ``k`` and its rate is ``originv * step**k``, so ``k`` steps down then ``k`` up
  gives back ``originv`` bit for bit, and at ``k == 0`` the limiter is turned off
  (``clear_rate``): exactly as before the first signal. ``originv`` is the
  upstream's observed emit rate when ``k`` leaves 0; the next episode (after every
  hold is gone) records a fresh one.
* Steps 10-15 (release: step each throttled upstream up by 1/v'; flag clears at
  ``originv``): as above, at ``k == 0``.
* Rate floor: a step never takes the rate under ``rate_floor``. ``k`` stops at
  the largest value with ``originv * step**k >= rate_floor`` and the upstream
  publishes ``at_floor`` so its downstreams stop asking. An upstream whose
  ``originv`` is already under the floor cannot be stepped at all. An upstream
  whose emit rate has not been measured yet (0, a task that just started) keeps
  the hold but does not start the episode until ``refresh`` sees a rate: an
  ``originv`` of 0 would pin it at the floor for nothing.

Several downstream tasks on one upstream (the document leaves it open)
----------------------------------------------------------------------
Each downstream ``d`` *holds* a step count ``h_d`` on each upstream; the upstream
runs at ``k = max_d h_d``. An overloaded ``d`` asks for ``max(h_d, k_seen + 1)``
where ``k_seen`` is the upstream's published ``k``: one step below the upstream's
*current* rate, as the document says (if the upstream has not reached ``h_d`` yet,
the same hold is asked for again rather than a deeper one). Hence:

* two downstreams that overload in the same round both ask for ``k_seen + 1`` and
  the upstream steps once, not twice (the document's "already being
  backpressured, skip it");
* a release from ``d`` lowers only ``h_d``; the upstream speeds up only when ``d``
  was the tightest holder, and its flag clears only when *no* downstream holds any
  step: it never releases while any downstream still holds it;
* a light downstream releases only the steps it holds itself (the document's step
  12 checks just the upstream's flag, which would let a light task undo a step
  that an overloaded sibling needs).

``h_d`` travels both in signals and in ``d``'s published state (``holds``), each
stamped with ``d``'s signal ``seq``; the upstream keeps whichever is newest, so a
lost, duplicated or reordered message is repaired by the next state record.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

from backpressure.signals import BACKPRESSURE, RELEASE, Signal, TaskState

OVERLOADED = "overloaded"
NORMAL = "normal"
LIGHT = "light"


@dataclass(frozen=True)
class StepwiseParams:
    """The document's knobs: v' (``step``), the marks, ``sensitivity`` and a floor."""

    step: float = 0.5
    high_mark: int = 50_000_000
    low_mark: int = 500_000
    sensitivity: float = 2.0            # seconds
    rate_floor: float = 1.0             # tuples/s
    resend_factor: float = 2.0          # an unacknowledged signal is re-sent after this x sensitivity

    def __post_init__(self) -> None:
        if not 0.0 < self.step < 1.0:
            raise ValueError("step (v') must be between 0 and 1")
        if self.low_mark >= self.high_mark:
            raise ValueError("low_mark must be below high_mark")
        if self.sensitivity <= 0 or self.rate_floor <= 0 or self.resend_factor <= 0:
            raise ValueError("sensitivity, rate_floor and resend_factor must be > 0")

    @property
    def resend_after(self) -> float:
        return self.resend_factor * self.sensitivity

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> "StepwiseParams":
        return cls(step=float(config["backpressure.step"]), high_mark=int(config["queue.high_mark"]),
                   low_mark=int(config["queue.low_mark"]),
                   sensitivity=float(config["backpressure.sensitivity_ms"]) / 1000.0,
                   rate_floor=float(config["backpressure.rate_floor"]))


@dataclass(frozen=True)
class UpstreamView:
    """What a downstream knows of an upstream, from the upstream's published state."""

    k: int = 0
    at_floor: bool = False
    applied: Mapping[int, int] = field(default_factory=dict)


_NO_VIEW = UpstreamView()


@dataclass
class _Pending:
    signal: Signal
    sent_at: float


class Downstream:
    """One task watching its own queue and holding steps on its direct upstreams."""

    def __init__(self, task_id: int, upstreams: Iterable[int], params: StepwiseParams,
                 now: float, seq_start: int = 0) -> None:
        self.task_id = task_id
        self.upstreams = tuple(dict.fromkeys(upstreams))
        self.params = params
        self.seq = seq_start
        self.holds: dict[int, int] = {}
        self.pending: dict[int, _Pending] = {}
        self.level = NORMAL
        self.last_check = now
        self.last_bytes: int | None = None    # queue bytes at the previous check
        self.low_since: float | None = None

    def observe(self, now: float, queue_bytes: int) -> bool:
        """Record one observation (cheap, on the hot path); True when ``check`` is due."""
        p = self.params
        if queue_bytes <= p.low_mark:
            if self.low_since is None:
                self.low_since = now
        else:
            self.low_since = None
        if now - self.last_check >= p.sensitivity:
            return True
        return queue_bytes >= p.high_mark and self.level != OVERLOADED

    def check(self, now: float, queue_bytes: int,
              view: Callable[[int], UpstreamView | None]) -> list[Signal]:
        """The document's steps 3-15 for this task; returns the signals to send."""
        p = self.params
        self.last_check = now
        draining = self.last_bytes is not None and queue_bytes < self.last_bytes
        self.last_bytes = queue_bytes
        out: list[Signal] = []
        for u in self.upstreams:
            self._ack_or_resend(u, view(u) or _NO_VIEW, now, out)
        if queue_bytes >= p.high_mark:
            self.level = OVERLOADED
            for u in self.upstreams:
                v = view(u) or _NO_VIEW
                if u in self.pending or v.at_floor:
                    continue
                if draining and self.holds.get(u, 0) > 0:
                    continue  # the step we hold is working: the backlog is falling
                out.append(self._hold(u, max(self.holds.get(u, 0), v.k + 1), BACKPRESSURE, now))
        elif self.low_since is not None and now - self.low_since >= p.sensitivity:
            self.level = LIGHT
            released = False
            for u, h in list(self.holds.items()):
                if h > 0 and u not in self.pending:
                    out.append(self._hold(u, h - 1, RELEASE, now))
                    released = True
            if released:
                self.low_since = now      # each further step up needs a fresh light window
        else:
            self.level = NORMAL
        return out

    def release_all(self, now: float) -> list[Signal]:
        """This task is stopping: let go of every step it holds."""
        self.pending.clear()
        return [self._hold(u, 0, RELEASE, now) for u, h in list(self.holds.items()) if h > 0]

    def mid_step(self, upstream: int) -> bool:
        return upstream in self.pending

    def _hold(self, upstream: int, k: int, kind: str, now: float) -> Signal:
        self.seq += 1
        if k > 0:
            self.holds[upstream] = k
        else:
            self.holds.pop(upstream, None)
        sig = Signal(kind, upstream, self.task_id, k, self.seq, now)
        self.pending[upstream] = _Pending(sig, now)
        return sig

    def _ack_or_resend(self, u: int, v: UpstreamView, now: float, out: list[Signal]) -> None:
        pend = self.pending.get(u)
        if pend is None:
            return
        if v.applied.get(self.task_id, -1) >= pend.signal.seq:
            del self.pending[u]
        elif now - pend.sent_at >= self.params.resend_after:
            pend.sent_at = now
            out.append(pend.signal)


@dataclass(frozen=True)
class RateChange:
    """What a ``Throttle`` asks the runtime to do: set this rate, or (None) limiter off."""

    rate: float | None


class Throttle:
    """One task's emit rate as its downstreams hold it: ``originv * step**k``."""

    def __init__(self, task_id: int, params: StepwiseParams) -> None:
        self.task_id = task_id
        self.params = params
        self.holds: dict[int, int] = {}
        self.applied: dict[int, int] = {}
        self.k = 0
        self.k_max = 0
        self.originv: float | None = None     # kept after a release: the last episode's value
        self.in_episode = False               # some downstream holds a step (originv is current)

    @property
    def backpressure(self) -> bool:
        return self.k > 0

    @property
    def at_floor(self) -> bool:
        return self.in_episode and self.k >= self.k_max

    @property
    def rate(self) -> float | None:
        """The limit in force; None when the limiter is off (``k == 0``)."""
        if self.k == 0 or self.originv is None:
            return None
        return self.originv * self.params.step ** self.k

    @property
    def nominal_rate(self) -> float | None:
        """``originv * step**k``, also at ``k == 0`` (where it is ``originv`` exactly)."""
        return None if self.originv is None else self.originv * self.params.step ** self.k

    def on_signal(self, sig: Signal, observed_rate: float) -> RateChange | None:
        """Apply one signal addressed to this task; stale or repeated ones change nothing."""
        if sig.target != self.task_id or sig.seq <= self.applied.get(sig.source, -1):
            return None
        self.applied[sig.source] = sig.seq
        return self._set_hold(sig.source, sig.k, observed_rate)

    def reconcile(self, source: int, held: int, seq: int, observed_rate: float) -> RateChange | None:
        """Apply a downstream's published ``holds`` entry for this task (as of its ``seq``)."""
        if seq < self.applied.get(source, -1):
            return None
        self.applied[source] = seq
        return self._set_hold(source, held, observed_rate)

    def forget(self, source: int, observed_rate: float) -> RateChange | None:
        """A downstream is gone: whatever it held is released."""
        self.applied.pop(source, None)
        if source not in self.holds:
            return None
        return self._set_hold(source, 0, observed_rate)

    def reset(self) -> RateChange | None:
        """Let go of everything (the run is stopping)."""
        self.holds.clear()
        return self._recompute(0.0)

    def _set_hold(self, source: int, k: int, observed_rate: float) -> RateChange | None:
        if k > 0:
            self.holds[source] = k
        else:
            self.holds.pop(source, None)
        return self._recompute(observed_rate)

    def refresh(self, observed_rate: float) -> RateChange | None:
        """Held but not yet stepped because the rate was not measurable: try again."""
        if self.holds and not self.in_episode:
            return self._recompute(observed_rate)
        return None

    def _recompute(self, observed_rate: float) -> RateChange | None:
        want = max(self.holds.values(), default=0)
        if want > 0 and not self.in_episode:        # the first step: record originv
            if not observed_rate > 0:
                return None     # no rate measured yet (a task just started): wait for one
            self.in_episode = True
            self.originv = float(observed_rate)
            self.k_max = max_steps(self.originv, self.params.step, self.params.rate_floor)
        elif want == 0:
            self.in_episode = False
        old = self.k
        self.k = min(want, self.k_max) if self.in_episode else 0
        if self.k == old:
            return None
        return RateChange(self.rate)


def max_steps(originv: float, step: float, floor: float) -> int:
    """Largest ``k`` with ``originv * step**k >= floor`` (0 when originv is under the floor)."""
    k = 0
    while originv * step ** (k + 1) >= floor:
        k += 1
        if k >= 1000:     # a floor far under originv; 0.5**1000 is already denormal
            break
    return k


@dataclass
class StateOutcome:
    """What a change in the published states means for this process's throttles.

    ``changes``: our task -> the rate change its limiter must make; ``acknowledged``:
    our tasks whose ``applied`` record moved without a rate change (their state must
    still be re-published, since that is the acknowledgement a downstream waits for).
    """

    changes: list[tuple[int, RateChange]] = field(default_factory=list)
    acknowledged: list[int] = field(default_factory=list)


class PeerStates:
    """Every task's newest published state, and what each change does to our throttles.

    * A state older (by ``version``) than the one held is ignored: records can arrive
      out of order after a reconnect.
    * A state's ``holds`` entry for one of our tasks is reconciled into its throttle
      (the repair path for a lost signal); so is a hold that vanished from it.
    * A task whose state disappears (its process stopped, or its session expired) is
      *gone* from then on; if it stays gone for ``grace`` its holds are forgotten
      (``expire``); if its state comes back first, nothing changes, so a session
      expiry does not make rates blink. Our own tasks are never forgotten this way.
    """

    def __init__(self, throttles: Mapping[int, Throttle], grace: float) -> None:
        self.throttles = throttles
        self.grace = grace
        self.states: dict[int, TaskState] = {}
        self.views: dict[int, UpstreamView] = {}
        self.gone_since: dict[int, float] = {}

    def alive(self, task: int) -> bool:
        """Whether ``task`` is one of ours or has a published state (signals from others are dropped)."""
        return task in self.throttles or task in self.states

    def view(self, task: int) -> UpstreamView | None:
        return self.views.get(task)

    def update(self, task: int, state: TaskState | None, now: float,
               rate_of: Callable[[int], float]) -> StateOutcome:
        """Apply one state change of ``task`` (None: its state znode disappeared)."""
        out = StateOutcome()
        if state is None:
            self.states.pop(task, None)
            self.views.pop(task, None)
            if task not in self.throttles:
                self.gone_since.setdefault(task, now)
            return out
        self.gone_since.pop(task, None)
        old = self.states.get(task)
        if old is not None and old.version > state.version:
            return out
        self.states[task] = state
        self.views[task] = UpstreamView(state.k, state.at_floor, state.applied)
        for tid, th in self.throttles.items():
            held = state.holds.get(tid, 0)
            if held or task in th.holds:
                before = th.applied.get(task)
                change = th.reconcile(task, held, state.seq, rate_of(tid))
                self._record(out, tid, change, th.applied.get(task) != before)
        return out

    def expire(self, now: float, rate_of: Callable[[int], float]) -> StateOutcome:
        """Forget every task whose state stayed gone for ``grace``: release what it held."""
        out = StateOutcome()
        for task in [t for t, since in self.gone_since.items() if now - since >= self.grace]:
            del self.gone_since[task]
            for tid, th in self.throttles.items():
                self._record(out, tid, th.forget(task, rate_of(tid)), False)
        return out

    @staticmethod
    def _record(out: StateOutcome, tid: int, change: RateChange | None, acked: bool) -> None:
        if change is not None:
            out.changes.append((tid, change))
        elif acked:
            out.acknowledged.append(tid)
