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
* When the checks run: an overloaded task checks at most once per ``sensitivity``
  (the document calls the method "at least sensitivity ms apart"); the runtime also
  observes from a timer so an idle task still releases. Three exceptions keep the
  reaction on time: a crossing of the high mark after a check that did not find the
  task overloaded is checked at once; the moment the low mark has held for
  ``sensitivity`` (not at the next periodic check) the release goes out, so a light
  spell of ``sensitivity`` is never missed because it began between two checks; and
  an overloaded check that could do nothing (the upstream was mid-release, or a
  sibling's step was still in its window) is retried as soon as that ends instead
  of waiting a whole ``sensitivity``.
* Step 6 (skip an upstream "already being backpressured"): read as *the upstream
  stepped down less than ``sensitivity`` ago*. The upstream publishes when (as an
  age) and for whom it last stepped; a downstream skips it unless that step was its
  own (its own cadence is one check per ``sensitivity``), and the upstream enforces
  the same rule on what it grants, so two tasks that overload in the same instant
  still cost one step. Hence one overload episode of a component (however many of
  its parallel tasks cross the mark, at whatever offsets) costs one step per
  ``sensitivity``. A task also does not re-signal an upstream while its previous
  signal is unacknowledged (``TaskState.applied``); an acknowledgement that never
  comes is answered by sending the same signal again after ``resend_after``
  (harmless: signals are idempotent).
* A step also stays "in progress" while it visibly works: when the queue is still
  over the high mark but fell since the previous check and the upstream is already
  throttled, the backlog drains at the rate in force and a further step would only
  overshoot (the load oscillation the document sets out to avoid).
* Step 7 (rate := v' x current rate, record ``originv`` on the first step): the
  rate is never multiplied in place. A ``Throttle`` holds an integer count ``k``
  and its rate is ``originv * step**(k / fine_steps)``, so ``k`` down then ``k`` up
  gives back ``originv`` bit for bit, and at ``k == 0`` the limiter is turned off
  (``clear_rate``): exactly as before the first signal. ``fine_steps`` is 1 in the
  document (every step is a whole v'); see "Finer steps" below.
* ``originv`` is the rate the upstream had before the episode: its observed rate
  when ``k`` leaves 0, except that within ``originv_memory`` of the end of the
  previous episode the previous ``originv`` is kept when the observed rate is lower
  (the runtime's rate meter is an EWMA that lags a release by seconds; re-measuring
  it then would start the next episode several steps down).
* Steps 10-15 (release: step each throttled upstream up by 1/v'; flag clears at
  ``originv``): as above, at ``k == 0``. With the ``originv_hold`` setting (0 in
  the document) the limit stays at exactly ``originv`` for that long before the
  limiter is turned off: a source that can emit faster than the bottleneck (one
  whose ``originv`` was measured while it waited on the hard bound) then does not
  burst into the queue at every release.
* The marks are read on the raw queue bytes, as in the document. With the
  ``queue_smoothing`` setting they are read on an exponential average of the
  observations with that time constant instead, so a spike of a few milliseconds
  (a bolt that pauses briefly while its source runs free) neither counts as an
  overload nor breaks a light window.
* Rate floor: ``k`` never goes past ``k_max``, the largest with a rate at or over
  ``rate_floor``, and the upstream publishes ``at_floor`` so its downstreams stop
  asking. An upstream whose measured rate is 0 or too low to take even one step
  (a task that has just started: its meter has not caught up) keeps the request
  but does not start the episode until ``refresh`` sees a rate it can step from;
  ``at_floor`` stays false meanwhile, so it is throttled as soon as it runs.

Several downstream tasks on one upstream (the document leaves it open)
----------------------------------------------------------------------
Each downstream ``d`` holds the steps it *caused*, ``h_d``, on each upstream, and
the upstream runs at ``k = min(sum_d h_d, k_max)``. An overloaded ``d`` asks for
``h_d + 1``; a light ``d`` asks for ``h_d - 1``. The upstream is the one place that
sees every request, so it decides what each is granted (``granted``, published
beside the acknowledgement, which ``d`` adopts): a release always, a step only
under the step-6 rule above, at most one step per request, and never past
``k_max``. Hence:

* a light task releases the steps it caused, whoever else holds steps (step 12);
  a sibling's brief overload costs one step, which that sibling gives back when it
  is light, and it never pins the steps another task caused;
* the upstream's flag clears only when no downstream holds any step;
* a light task that holds nothing sends nothing (the document's step 12 checks
  only the flag, which would let it undo a step an overloaded sibling needs).

A downstream's requests travel both in signals and in its published state
(``holds``), stamped with ``(run, seq)``; the upstream applies whichever is newest,
so a lost, duplicated or reordered message is repaired by the next state record. A
restarted process draws a new ``run``: its records are newer than the old run's
whatever its clock says, and the old run's late records are ignored.

Finer steps (a setting; off in the document)
--------------------------------------------
When the capacity lies between two neighbouring steps, whole steps make the rate
cycle between them: the lower one idles the bottleneck while the low mark waits
out ``sensitivity``. With ``fine_steps = n > 1`` a downstream may split a step into
as little as 1/n of it: a reversal (a step down right after a release, or a
release right after a step down) halves its step and so does the move after it,
so the rate closes in on the capacity by bisection; from the third move in the
same direction on, each doubles the step back (up to a whole one), so a sustained
recovery, or a capacity that keeps falling, still moves in whole steps. An overload
that comes back within ``originv_memory`` of the end of an episode continues it
(a reversal: half the last step) instead of starting over with a whole step.
``n = 1`` is the document exactly.

Bracket search (a setting; off in the document)
----------------------------------------------
The reversal rule above forgets where it has been: a release that found the queue
still light (the queue needs time to build at a rate just over the capacity) is
followed by more, and by the third in a row the step doubles back, past the
capacity. With ``bracket_search`` (meant with ``fine_steps`` > 1) a downstream keeps,
per upstream, the bracket the capacity lies in, in the upstream's steps ``k`` (its
published ``k``, so a sibling's steps count too): ``over``, the largest ``k`` at which
its queue reached the high mark (a rate too high), and ``light``, the smallest at
which the low mark held for the light window (a rate the task keeps up with). A step
down goes to the middle of the bracket, or one whole step when ``light`` is unknown;
a release goes to the middle, or one whole step when ``over`` is unknown. Once the
two are neighbours (``fine_steps`` parts of a step apart), the rate moves between
them: just over the capacity the queue fills slowly, just under it drains slowly, and
the bottleneck stays busy. Two rules keep the evidence honest: a queue that rose
under the low mark by more than 1/16 of it since its lowest point in the light
window is not light (the window starts again: at a rate just over the capacity the
queue takes a while to reach the low mark, and a short ``release_window`` would
otherwise release past the capacity); and evidence against the bracket drops that
side and moves by one part of a step, doubling at each further move the same way
(at most a whole step): an overload at or past ``light`` (the capacity fell, or the
queue was still draining a backlog) steps down 1, 2, 4, ... parts, a light window at
or before ``over`` (the capacity rose, or ``over`` was read on a stale backlog) steps
up the same way. The bracket is searched for again from there, and a capacity that
moved far is reached in a few windows. The bracket is on the upstream's whole ``k``,
so of several light tasks of a component only the one holding the most steps (ties:
the lowest id) releases: each moving by the bracket would add their moves up; and a
light window starts again when another task's steps on the upstream changed (the
rate it was read at is gone).

A new episode (the upstream back at ``k == 0``) starts with no bracket, unless it
comes within ``originv_memory`` of the last: then the bracket stands, and the
upstream takes as ``originv`` one whole step over the first episode's (or its
measured rate, if higher), once, however many episodes follow. An upstream that
overloads its downstream again as soon as it is let go entirely ran faster than
that ``originv`` while free (its rate meter lags such a burst): a source catching up
on a backlog after the capacity came back, whose pre-episode rate was under the
new capacity. With the old ``originv`` no step could give it the capacity: it would
alternate between free bursts into the hard bound and a rate the bottleneck idles at.
(Without ``bracket_interpolate`` the downstream does not follow the new ``originv``: the
bracket it kept now reads one whole step faster than it was found, which the rules above
correct within a few windows; being over the capacity only fills the queue.)

Two settings of the bracket search (off in the document)
--------------------------------------------------------
* ``bracket_light_window``: light evidence that holds inside a bracket. While a rate is
  known to overload the task (``over`` is known), a release needs the low mark to hold
  this long, not ``release_window``: a move into the bracket lands near the capacity, and
  a rate just over it needs time to show, longer still under ``queue_smoothing`` (the
  smoothed level is still falling to its lowest point while the queue already rises), so
  a short window reads it as light, the bracket closes on the wrong side and the moves
  that correct it (1, 2, 4... parts) take seconds. Two exceptions and one more rule:
  a window in which the level stayed under 1/32 of the low mark (the task idled: the rate
  is well under its capacity) needs only ``release_window``, so a capacity that came back
  is still found in a few short windows; with ``over`` unknown (a capacity rising past
  everything tried) the short window stands; and a level that rose more than 1/16 of the
  low mark over its lowest point in the window is not light until it is back down there
  (the plain search starts the window again from the new level, so a slow rise, 1/16 of
  the low mark per window, fits windows in between).
* ``bracket_interpolate``: read the bracket in rates and in the queue's slopes.
  - When both ends of the bracket carry a measured slope of the queue (bytes/s it rose at
    ``over``, bytes/s it fell at ``light``), the next move goes where the line between them
    puts the capacity (the rate at which the queue would stand still, ``r_light + (r_over -
    r_light) x fall / (fall + rise)``: false position instead of bisection), kept in the
    middle half of the bracket so that a wrong slope still shrinks it by a quarter. A slope
    is measured from this task's last move on that upstream to the evidence: the rise to the
    level at the overload, the fall until the level was last seen reaching the low mark. It
    is not used when the upstream's ``k`` is no longer the one that move set (a sibling
    moved it, the upstream restarted), when the rise ended nearer the hard bound than the
    high mark (the upstream may be waiting on the queue) or when the queue was already low
    at the move (a fall it cannot show).
  - The trend after a step down is read from when the step can show in the smoothed level
    (``SETTLE`` time constants of ``queue_smoothing`` after it), not from the check before
    it: the smoothed level keeps rising for a few time constants after a step that made the
    queue fall, and "still rising, step again" would read that lag as an overload.
  - The bracket follows the upstream's ``originv`` (published with its state): when it was
    raised (a source that overloads as soon as it is let go), the same rates are other step
    counts, and the bracket is shifted by as many steps (``over`` at 0, the free rate, stays).
    Without this the bracket kept from the first episode reads one whole step too fast, and
    the source creeps down from its free rate 1 part at a time while its queue sits at the
    bound.

Light evidence across two hops (a setting; off in the document)
---------------------------------------------------------------
``hold_starved``: a light task does not release an upstream that is a bolt starved by its own
backpressure: its published state shows its input queue idle (at most 1/32 of the low mark) while it
holds steps on its own upstreams. Such a bolt emits what it receives, not what its limit allows, so a
light queue under it says nothing of that limit: releasing it (and, under ``bracket_search``, reading
"light" at that rate) lets its limit climb past the capacity, and once its own upstream is let go the
queue below fills to the hard bound (scenarios (c) and (f): a relay bolt between the spout and the slow
task). The light window starts again, as after a release; the release goes out at the first light window
in which the bolt's queue is not idle (its limit binds again) or it holds nothing (the episode above it
ended, so a chain unwinds from the top and every limit still comes back to ``originv``). A spout, or an
upstream whose state is not published, is released as before. The state is the one last published (a
heartbeat, a change of rate or acknowledgements, or the bolt's queue running idle while it holds steps:
the runtime publishes that at once), and a bolt seen idle at any time in the light window (``PeerStates``
notes when a state showing it idle arrived) counts as starved for that window: a relay draining the last
of its backlog into an idle spell is not binding for most of the window, and a light window read over it
let the search climb past the capacity (c).

``release_below_overload`` (with ``bracket_search``; off in the document): a light window read at a rate
that overloaded drops that side of the bracket and releases one part, and the plain search doubles the
next releases (2, 4, 8 parts). A rate found overloading may sit at the capacity itself, where a short
light window (``release_window``) misses its slow rise: the doubling then overshoots the capacity. With
this setting each release for ``sensitivity`` after such a window is one part, unless the queue stayed idle
in the window (under 1/32 of the low mark: the rate is well under the capacity, which rose); then doubling
resumes, so a capacity that really rose is still reached.

Steps from the rate emitted just now (a setting; off in the document)
--------------------------------------------------------------------
``step_from_recent_rate``: the document steps to v' x "the current rate"; the policy reads that as the
limit in force (``originv``, the rate meter's figure, at the first step). An upstream that waits on a full
queue downstream emits far less than its limit: an endless spout whose meter (an average over seconds)
still carries its start burst, or a relay bolt forwarding what the slow task's full queue admits (the
overload matrix's (c)). A whole step from its limit leaves it over the capacity, and at one step per
``sensitivity`` the bottleneck's queue stands near the hard bound for seconds. With this setting, the
first step down of a new episode that finds the upstream's emits over the last ``recent_window`` (one
``sensitivity``) under v' x its limit in force goes one whole step under those emits instead. Once per
episode: later steps are the document's (emits read while the queue below drains are no capacity). Not
in an episode that continues one within ``originv_memory``: there ``originv`` is the last episode's (or,
under ``bracket_search``, one step over it), and a source that emits all it has, under that limit, is not
waiting on a queue (the matrix's (e), where it raised the rate CoV). ``k`` still counts steps of
``originv``, granted to the task that asked (its release gives them back one at a time, to ``originv``
exactly), and the step-6 rule is unchanged, so siblings still cost one step per ``sensitivity``. The
emits do not count from a window
that is not full (a task just started), that holds under ``MIN_RECENT_TUPLES`` (a stall), or from a bolt
whose queue is at or under the low mark (it emits what it receives, not what it could).

Under ``bracket_search`` a bolt whose own limit rises (its downstream released it) forgets where its
upstreams overloaded it (``over``, with its slope and creep): it saw those overloads on its queue while its own
limit bound (the relay of (c), cut under its emits, fills its own queue and steps the spout down to what it
admits then), so they are no evidence against those rates once it admits more. Without this the relay's
releases of the spout crept through that stale bracket, one part at a time, while the slow task ran out of
backlog: it idled for about half a second after its first episode (goodput 0.92-0.94 in (c) with acking).

Light read while a spout's source ran dry (a setting; off in the document)
-------------------------------------------------------------------------
``dry_release_window``: a throttled spout whose source had less to emit than its limit allowed (an on/off
source between bursts, or one that has caught up) does not use that limit, so a light queue under it says
nothing of the limit: releasing on it lets the limit climb past the capacity, and at the next burst the spout
works off what it owes at that limit, over the capacity, then idles again (the overload matrix's (d), where
the search settled about 15 % over the capacity and the spout's rate swung with the source). With this
setting a light window in which the spout ran dry (its latest published state says it is dry, or a dry spell
ended after the window began: a peer counts it dry until the first state that is not) releases it only once
the low mark has held ``dry_release_window``; the light spell is not restarted meanwhile. Light read while the
limit bound releases as before, so a spout that owes a
backlog (it never runs dry) still finds the capacity at the light window; and a source that has caught up is
still let go, one step per ``dry_release_window``, back to ``originv``. The same reading as TCP's congestion
window validation (RFC 7661), which ``hold_starved`` applies to a relay bolt. The runtime counts a spout's
rounds in which its source had less than a chunk (``TaskHandle.dry_count``); the driver samples it on its
timer and publishes at once when a throttled spout turns dry or binding again.

A step down that drains the backlog (a setting; off in the document)
-------------------------------------------------------------------
``drain_margin`` (with ``bracket_search``): a step down while a rate found light is known goes at least
``drain_margin`` parts of a step under that rate, not only to the middle of the bracket. Inside a narrow
bracket the search moves one part at a time, and a rate one part over or under the capacity leaves the queue
standing over the high mark for seconds: it rises until the rate is under the capacity and then drains at a
few percent of it. Under the rate that once let the queue fall to the low mark, the backlog over the high mark
drains within about a second, and the next light window releases back into the bracket, so the queue
cycles between the marks (as the document's whole steps do) instead of sitting over the high mark (the
overload matrix's (c) with acking: the slow task's queue stood at 64-95 KB, over the 64 KB mark, for a
second or more per cycle). Measured, it lowers p99 latency where the queue cycled over the high mark and
raises the rate CoV (a swing of ``drain_margin`` parts at each overload); BENCHMARKS.md has the cells. An
overload read at or past ``light`` (which drops it: the capacity fell) creeps as before. ``k`` is still
granted at most one whole step per signal, and releases are unchanged, so the rate still comes back to
``originv`` exactly.

No release past what a limited bolt takes in (a setting; off in the document)
-------------------------------------------------------------------------------
``within_intake`` (with ``bracket_search``): a bolt whose own emit rate is limited (its downstream holds it)
can execute at most that limit times the tuples it takes in per tuple it emits (the runtime tells it, at each
change of its limit, through ``Downstream.own_limit``). Its own queue is light while its upstream stays under
that rate, and says nothing of faster rates: they only fill the queue. So it releases an upstream no further
than the first step at or over that input rate (within one part over it), withholds the release while the
upstream is already there (and says so: ``at_intake``, published, so a ``hold_starved`` task below it does not
read its idle queue as starvation; its own limit is what holds the flow, and the two would wait on each other),
and a step down goes at least that far (granted one whole step per signal, as every step). When its own
limit is lifted the bound goes, and the search goes on to ``originv``. The overload matrix's (c) with acking
shows why (a trace of every queue and signal, outside the bench): the slow task let the relay go; the relay,
its queue light in each 50 ms light window, released the spout seven times in 0.8 s (1, 2, 4, 8, 16, 16, 16
parts), to 52,890/s against a capacity of about 6,000/s, before the slow task's queue showed the overload; the
bracket read in those windows then held each step down to a part or two while the relay's queue stood at the
hard bound for seconds (p99 latency near 965 ms in two runs of ten). Fan-in: the bound applies to each upstream
alone, so several upstreams together may still exceed it (their overload then shows on the queue as before).

Light read once a release shows (a setting; off in the document)
-----------------------------------------------------------------
``settle_after_release`` (with ``bracket_search`` and ``queue_smoothing``): after a release, a queue that was
not idle in the window that released (over 1/32 of the low mark) starts its next light window only ``SETTLE``
time constants later, when the release shows in the smoothed level; before that it reads light at the rate
it had. A trace of (c) showed the slow task releasing the relay twice 60 ms apart, to three times the
capacity, before the first release showed; the bracket kept that light and crept back a part at a time with
the queues at the bound. An idle queue shows nothing of the rate either way and releases at every light
window as before. Measured, that slow mode came in 1 of 16 runs of (c) under it against 4 of 16 without it,
but it slowed the climb back in (e) (goodput 0.94); BENCHMARKS.md has the cells.

Light read once an upstream bolt's limit is in use (a setting; off in the document)
------------------------------------------------------------------------------------
``release_in_use`` (``backpressure.release_after_limit_in_use``; with ``queue_smoothing``): a light task releases
an upstream bolt whose own input is held (it holds steps on its upstreams, or keeps one at its intake bound) only
on a light window begun once that bolt's limit had bound its emits for ``SETTLE`` time constants of the smoothed
level. The runtime counts the emits its limiter made wait (``TaskHandle.wait_count``); the driver samples that on
its timer (``LimitInUse``: a spell starts at the first wait and ends after two samples without one, or when the
limit changes) and publishes since when (``in_use_age``). A window read while the bolt emitted what it received,
under its limit, or before a change of that limit could show in the level, says nothing of the limit: three
traced slow runs of the overload matrix's (c) each began with the slow task releasing the relay past its capacity
on such a window (54 ms after the last release; with the relay at its intake bound, under its limit for most of
the window; 50 ms after the relay's limit came into use). The wait for that evidence lasts at most
``in_use_patience`` (4 x ``sensitivity``); then the release goes out as before, so a relay whose input stays
under its limit for good (a source that ran dry) is still let go, to ``originv`` exactly. A spout, or a bolt
whose input is free, is released as before.

Two more settings (off in the document)
---------------------------------------
* ``release_window``: the low mark must hold this long (instead of ``sensitivity``)
  before each release, so the rate comes back sooner once an overload ends (scenario
  (e) of the overload matrix: a capacity that drops and recovers). An unacknowledged
  release is looked for at that cadence too, so the next step up is not left to the
  next ``sensitivity`` check.
* ``flat_queue_holds``: a queue over the high mark that has not risen since this
  task's last step (by more than 1/32 of the high mark: a batch or two) and is under
  halfway from the high mark to the hard bound is not stepped again, as if it were
  falling: the rate in force matches the capacity, and the document's further step
  would take it under (scenario (d): a burst held at the high mark). Nearer the
  bound an upstream may be waiting on the queue, so a flat queue there proves nothing.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

from backpressure.signals import BACKPRESSURE, RELEASE, Signal, TaskState

SETTLE = 3.0    # bracket_interpolate: time constants of the smoothed level after which a step shows in it
MIN_RECENT_TUPLES = 8   # step_from_recent_rate: the fewest tuples in the window that make a rate (fewer: a stall)
OVERLOADED = "overloaded"
NORMAL = "normal"
LIGHT = "light"


@dataclass(frozen=True)
class StepwiseParams:
    """The document's knobs (v' as ``step``, the marks, ``sensitivity``, a floor) and the settings beyond it."""

    step: float = 0.5
    high_mark: int = 50_000_000
    low_mark: int = 500_000
    sensitivity: float = 2.0            # seconds
    rate_floor: float = 1.0             # tuples/s
    resend_factor: float = 2.0          # an unacknowledged signal is re-sent after this x sensitivity
    fine_steps: int = 1                 # a step may be split into up to this many parts (1: the document)
    originv_memory: float = 6.0         # seconds after an episode in which its originv still stands
    originv_hold: float = 0.0           # seconds the limit stays at exactly originv after the last release
    queue_smoothing: float = 0.0        # time constant (s) of the queue level the marks are read on (0: raw)
    release_window: float = 0.0         # seconds the low mark must hold for a release (0: sensitivity)
    flat_queue_holds: bool = False      # a queue over the high mark that stopped growing is not stepped again
    bracket_search: bool = False        # with fine_steps: each move halves the bracket of rates seen (below)
    bracket_light_window: float = 0.0   # bracket_search: the light window (s) while a rate is known to overload
    bracket_interpolate: bool = False   # bracket_search: move to where the queue's slopes put the capacity
    hold_starved: bool = False          # no release of an upstream bolt starved by its own backpressure
    release_below_overload: bool = False  # bracket_search: one part per release just after light read where it overloaded
    step_from_recent_rate: bool = False  # once an episode: a step under what the upstream emitted just now
    dry_release_window: float = 0.0     # seconds of light before releasing a spout that ran dry in them (0: off)
    drain_margin: int = 0               # bracket_search: a step down goes at least this many parts under `light`
    within_intake: bool = False         # bracket_search: no upstream released past what this task's own limit takes in
    settle_after_release: bool = False  # queue_smoothing: after a release, light counts once the level shows it
    release_in_use: bool = False        # an upstream bolt is released on light read once its limit was in use
    hard_bound: int | None = None       # queue bytes at which emit waits (None: 2 x high_mark)

    def __post_init__(self) -> None:
        if not 0.0 < self.step < 1.0:
            raise ValueError("step (v') must be between 0 and 1")
        if self.low_mark >= self.high_mark:
            raise ValueError("low_mark must be below high_mark")
        if self.sensitivity <= 0 or self.rate_floor <= 0 or self.resend_factor <= 0:
            raise ValueError("sensitivity, rate_floor and resend_factor must be > 0")
        if self.fine_steps < 1 or self.drain_margin < 0 or min(self.originv_memory, self.originv_hold, self.queue_smoothing,
                                      self.release_window, self.bracket_light_window,
                                      self.dry_release_window) < 0:
            raise ValueError("fine_steps must be >= 1; drain_margin, originv_memory, originv_hold, queue_smoothing, "
                             "release_window, bracket_light_window, dry_release_window >= 0")

    @property
    def light_window(self) -> float:
        """How long the low mark must hold before a release: ``sensitivity`` unless ``release_window`` is set."""
        return self.release_window or self.sensitivity

    def stopped_growing(self, before: float, now_bytes: float) -> bool:
        """``flat_queue_holds``: the queue is less than 1/32 of the high mark (a batch or two) over
        ``before`` (its level at the last step or check), and in the lower half between the high mark and
        the hard bound (nearer the bound an upstream may be waiting on it: a queue that cannot grow proves
        nothing)."""
        bound = self.hard_bound if self.hard_bound is not None else 2 * self.high_mark
        return now_bytes <= before + self.high_mark / 32 and now_bytes < (self.high_mark + bound) / 2

    @property
    def pinned_level(self) -> float:
        """Halfway from the high mark to the hard bound: over it an upstream may be waiting on the queue."""
        bound = self.hard_bound if self.hard_bound is not None else 2 * self.high_mark
        return (self.high_mark + bound) / 2

    @property
    def recent_window(self) -> float:
        """``step_from_recent_rate``: the span an upstream's recent emit rate is read over."""
        return self.sensitivity

    @property
    def in_use_settle(self) -> float:
        """``release_in_use``: how long an upstream bolt's limit must have bound its emits before a light
        window that counts for it begins (the time a change of its rate takes to show in our level)."""
        return SETTLE * self.queue_smoothing

    @property
    def in_use_patience(self) -> float:
        """``release_in_use``: the longest a light task withholds a release for want of that evidence
        (a relay whose own input runs under its limit for good, e.g. a source that ran dry, is let go)."""
        return 4.0 * self.sensitivity

    @property
    def resend_after(self) -> float:
        return self.resend_factor * self.sensitivity

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> "StepwiseParams":
        return cls(step=float(config["backpressure.step"]), high_mark=int(config["queue.high_mark"]),
                   low_mark=int(config["queue.low_mark"]),
                   sensitivity=float(config["backpressure.sensitivity_ms"]) / 1000.0,
                   rate_floor=float(config["backpressure.rate_floor"]),
                   fine_steps=int(config.get("backpressure.fine_steps", 1)),
                   originv_memory=float(config.get("backpressure.originv_memory_ms", 6000.0)) / 1000.0,
                   originv_hold=float(config.get("backpressure.originv_hold_ms", 0.0)) / 1000.0,
                   queue_smoothing=float(config.get("backpressure.queue_smoothing_ms", 0.0)) / 1000.0,
                   release_window=float(config.get("backpressure.release_window_ms", 0.0)) / 1000.0,
                   flat_queue_holds=bool(config.get("backpressure.flat_queue_holds", False)),
                   bracket_search=bool(config.get("backpressure.bracket_search", False)),
                   bracket_light_window=float(config.get("backpressure.bracket_light_window_ms", 0.0)) / 1000.0,
                   bracket_interpolate=bool(config.get("backpressure.bracket_interpolate", False)),
                   hold_starved=bool(config.get("backpressure.hold_starved_upstream", False)),
                   release_below_overload=bool(config.get("backpressure.release_below_overload", False)),
                   step_from_recent_rate=bool(config.get("backpressure.step_from_recent_rate", False)),
                   dry_release_window=float(config.get("backpressure.dry_release_window_ms", 0.0)) / 1000.0,
                   drain_margin=int(config.get("backpressure.drain_margin_parts", 0)),
                   within_intake=bool(config.get("backpressure.release_within_intake", False)),
                   settle_after_release=bool(config.get("backpressure.settle_after_release", False)),
                   release_in_use=bool(config.get("backpressure.release_after_limit_in_use", False)),
                   hard_bound=None if config.get("queue.hard_bound") is None else int(config["queue.hard_bound"]))


def scaled_rate(originv: float, step: float, k: int, fine_steps: int) -> float:
    """``originv * step**(k / fine_steps)``; the same expression both ways, so it is exact."""
    return originv * step ** k if fine_steps == 1 else originv * step ** (k / fine_steps)


@dataclass(frozen=True)
class Recent:
    """What a task emitted over its last ``recent_window`` (``step_from_recent_rate``), and its input
    queue then (None: a spout): a bolt with no backlog emits what it receives, not what it could."""

    tuples: int
    span: float
    queue_bytes: int | None = None


@dataclass(frozen=True)
class UpstreamView:
    """What a downstream knows of an upstream, from the upstream's published state.

    ``stepped_at`` is on the downstream's own clock (the publisher sends an age).
    """

    k: int = 0
    at_floor: bool = False
    applied: Mapping[int, tuple[int, int]] = field(default_factory=dict)
    granted: Mapping[int, int] = field(default_factory=dict)
    stepped_at: float | None = None
    stepped_by: int = -1
    originv: float | None = None        # the rate its k counts steps from (None: not published)
    queue_bytes: int | None = None      # its input queue (None: a spout, or not published)
    holding: bool = False               # it holds steps on its own upstreams
    idle_at: float | None = None        # the last state that showed its queue idle arrived then
    dry: bool = False                   # a spout: its source ran dry under its limit (last state)
    dry_at: float | None = None         # the last state that showed it dry, or the first after it, arrived then
    at_intake: bool = False             # within_intake: it withholds a release at its intake bound (last state)
    in_use_at: float | None = None      # release_in_use: since when its limit binds its emits (None: it does not)

    def starved(self, low_mark: int, since: float | None = None) -> bool:
        """``hold_starved``: a bolt whose queue is idle (at most 1/32 of the low mark) while it holds its
        own upstreams back emits what it receives, not what its limit allows. With ``since`` (the start
        of a light window): idle at any time since then, as its published states showed it. A bolt that
        holds an upstream at its intake bound (``within_intake``) is not starved: it keeps that upstream at
        what its own limit lets it execute, so its limit is in use even with its queue idle."""
        if not self.holding or self.queue_bytes is None or self.at_intake:
            return False
        return self.queue_bytes <= low_mark / 32 or (
            since is not None and self.idle_at is not None and self.idle_at >= since)

    def limit_unproven(self, window_start: float, settle: float) -> bool:
        """``release_in_use``: a bolt whose own input is held (it holds its upstreams, or keeps one at its
        intake bound) and whose limit had not bound its emits for ``settle`` when the light window began:
        that window says nothing of its limit, which it did not use. A bolt whose input is free is not
        judged (what it receives is not held back, so the chain above it has nothing to unwind)."""
        if self.queue_bytes is None or not (self.holding or self.at_intake):
            return False
        return self.in_use_at is None or self.in_use_at + settle > window_start

    def ran_dry(self, since: float) -> bool:
        """``dry_release_window``: a spout whose source ran dry under its limit at any time since ``since``
        (as its published states showed it) did not use that limit then."""
        return self.dry or (self.dry_at is not None and self.dry_at >= since)


_NO_VIEW = UpstreamView()


@dataclass
class _Pending:
    signal: Signal
    sent_at: float


class Downstream:
    """One task watching its own queue and holding the steps it caused on its direct upstreams."""

    def __init__(self, task_id: int, upstreams: Iterable[int], params: StepwiseParams,
                 now: float, run: int = 0) -> None:
        self.task_id = task_id
        self.upstreams = tuple(dict.fromkeys(upstreams))
        self.params = params
        self.run = run
        self.seq = 0
        self.holds: dict[int, int] = {}       # steps granted to this task, as last acknowledged
        self.wants: dict[int, int] = {}       # steps last asked for (published: the repair path)
        self.pending: dict[int, _Pending] = {}
        self.size: dict[int, int] = {}        # current step size per upstream, in 1/fine_steps
        self.last_dir: dict[int, str] = {}
        self.streak: dict[int, int] = {}      # moves in a row in last_dir
        self.ended_at: dict[int, float] = {}  # light holding nothing on u since (the episode ended)
        self.over: dict[int, int] = {}        # bracket_search: largest upstream k seen overloading
        self.light: dict[int, int] = {}       # bracket_search: smallest upstream k seen light
        self.creep: dict[int, int] = {}       # bracket_search: the last step down after a contradiction
        self.rise: dict[int, int] = {}        # bracket_search: the last step up after a contradiction
        self.overloaded: dict[int, float] = {}   # release_below_overload: when light was read where it overloaded
        self.others_seen: dict[int, int] = {} # bracket_search: steps the other downstreams held, last seen
        self.over_slope: dict[int, float] = {}   # bracket_interpolate: bytes/s the queue rose at k = over
        self.light_slope: dict[int, float] = {}  # bracket_interpolate: bytes/s the queue fell at k = light
        self.moved: dict[int, tuple[float, float, int]] = {}   # bracket_interpolate: (when, level, k) of our last move
        self.low_at: float | None = None      # bracket_interpolate: since when the level is at the low mark
        self.window = params.light_window     # the light window in force (bracket_light_window inside a bracket)
        self.settle_at: float | None = None   # bracket_interpolate: when the level shows our last step down
        self.basis: dict[int, float] = {}     # bracket_interpolate: the upstream's originv the bracket is read in
        self.level = NORMAL
        self.last_check = now
        self.last_bytes: float | None = None  # queue level at the previous periodic check
        self.step_level: float | None = None  # queue level at this task's last step down (flat_queue_holds)
        self.low_since: float | None = None
        self.low_min = 0.0                    # bracket_search: the lowest level since low_since
        self.low_max = 0.0                    # bracket_light_window: the highest level since low_since
        self.retry_at: float | None = None    # an overloaded check that could not act: retry from then
        self.blocked: set[int] = set()
        self.smoothed: float | None = None    # the queue level under queue_smoothing
        self.last_obs = now
        self.intake: float | None = None      # within_intake: upstream tuples/s our own emit limit lets us take in
        self.at_intake = False                # within_intake: the last light check withheld a release at intake
        self.unproven: dict[int, float] = {}  # release_in_use: upstream -> since when its release waits for evidence

    def _level(self, now: float, queue_bytes: float) -> float:
        """The queue level the marks are read on: raw bytes, or their EWMA (``queue_smoothing``)."""
        tau = self.params.queue_smoothing
        if tau <= 0:
            return queue_bytes
        if self.smoothed is None:
            self.smoothed = float(queue_bytes)
        elif now > self.last_obs:
            self.smoothed += (1.0 - math.exp((self.last_obs - now) / tau)) * (queue_bytes - self.smoothed)
        self.last_obs = max(now, self.last_obs)
        return self.smoothed

    def _window(self) -> float:
        """The light window in force: ``self.window``, or the release window while the queue stayed empty."""
        if self.low_max <= self.params.low_mark / 32:
            return self.params.light_window
        return self.window

    def observe(self, now: float, queue_bytes: float) -> bool:
        """Record one observation (cheap, on the hot path); True when ``check`` is due."""
        p = self.params
        queue_bytes = self._level(now, queue_bytes)
        if self.settle_at is not None and now >= self.settle_at:
            self.settle_at = None
            self.last_bytes = queue_bytes     # the trend since our step is read from here
        if queue_bytes <= p.low_mark:
            if self.low_at is None:
                self.low_at = now
            if self.low_since is None:
                self.low_since, self.low_min, self.low_max = now, queue_bytes, queue_bytes
            elif p.bracket_search and queue_bytes > self.low_min + p.low_mark / 16:
                # Rising under the low mark: not light. Under bracket_light_window the lowest level
                # stands until the queue comes back down to it (a slow rise cannot fit a window in).
                self.low_since, self.low_max = max(now, self.low_since), queue_bytes
                if not p.bracket_light_window:
                    self.low_min = queue_bytes
            else:
                self.low_min = min(self.low_min, queue_bytes)
                self.low_max = max(self.low_max, queue_bytes)
                window = self._window()
                if now - self.low_since >= window and self.holds:
                    if any(u not in self.pending for u in self.holds):
                        return True   # the low mark held for the light window: release now
                    if now - self.last_check >= window:
                        return True   # a release is unacknowledged: look for its acknowledgement
        else:
            self.low_since = self.low_at = None
            if queue_bytes >= p.high_mark:
                if self.level != OVERLOADED:
                    return True
                if self.retry_at is not None and now >= self.retry_at:
                    return True
        return now - self.last_check >= p.sensitivity

    def check(self, now: float, queue_bytes: float,
              view: Callable[[int], UpstreamView | None]) -> list[Signal]:
        """The document's steps 3-15 for this task; returns the signals to send.

        ``queue_bytes`` is the one ``observe`` just saw (under ``queue_smoothing`` the
        smoothed level is used, as ``observe`` left it).
        """
        p = self.params
        if self.smoothed is not None:
            queue_bytes = self.smoothed
        out: list[Signal] = []
        for u in self.upstreams:
            v = view(u) or _NO_VIEW
            self._ack_or_resend(u, v, now, out)
            if p.bracket_search:
                others = sum(v.granted.values()) - v.granted.get(self.task_id, 0)
                if self.others_seen.get(u, others) != others and self.low_since is not None:
                    self.low_since = max(now, self.low_since)   # a sibling moved the rate: a fresh window
                    self.low_min = self.low_max = queue_bytes
                self.others_seen[u] = others
        over = queue_bytes >= p.high_mark
        retry = over and self.level == OVERLOADED and now - self.last_check < p.sensitivity
        # The rate in force is working: the backlog fell (or, under flat_queue_holds, stopped growing).
        draining = self.last_bytes is not None and queue_bytes < self.last_bytes
        if p.flat_queue_holds and self.step_level is not None:
            # Since our last step the queue rose no further: the rate in force matches the capacity.
            draining = draining or p.stopped_growing(max(self.step_level, self.last_bytes or 0.0), queue_bytes)
        if not retry:
            self.last_check = now
            self.last_bytes = queue_bytes
        if over:
            self.level = OVERLOADED
            self.at_intake = False
            self.unproven.clear()
            candidates = [u for u in self.upstreams if u in self.blocked] if retry else self.upstreams
            self.blocked, self.retry_at = set(), None
            for u in candidates:
                v = view(u) or _NO_VIEW
                pend = self.pending.get(u)
                if v.at_floor or (pend is not None and pend.signal.kind == BACKPRESSURE):
                    continue        # nothing to take, or our own step is mid-way
                if pend is not None:
                    self._block(u, now)   # mid-release: step as soon as it is acknowledged
                    continue
                if (v.stepped_at is not None and v.stepped_by != self.task_id
                        and now - v.stepped_at < p.sensitivity):
                    self._block(u, v.stepped_at + p.sensitivity)     # step 6: being backpressured
                    continue
                if draining and (v.k > 0 or self.holds.get(u, 0) > 0):
                    continue  # the rate in force is working: the backlog is falling
                out.append(self._move(u, BACKPRESSURE, now, v.k if view(u) is not None else None, queue_bytes,
                                      v.originv))
                self.step_level = queue_bytes
        elif self.low_since is not None and now - self.low_since >= self._window():
            self.level = LIGHT
            self.blocked, self.retry_at = set(), None
            released = False
            starved = at_intake = False
            for u, h in list(self.holds.items()):
                if h > 0 and u not in self.pending:
                    v = view(u)
                    if p.bracket_search and v is not None and not self._leads(v, h):
                        continue      # the sibling holding the most steps releases for the component
                    if p.hold_starved and v is not None and v.starved(p.low_mark, self.low_since):
                        starved = True    # its limit is not in use: this light queue says nothing of it
                        continue
                    if (p.dry_release_window and v is not None and v.ran_dry(self.low_since)
                            and now - self.low_since < p.dry_release_window):
                        continue          # its source ran dry in the window: light must hold longer
                    cap = None if v is None else self._intake_k(v.originv)
                    if cap is not None and v is not None and v.k < cap:
                        starved = at_intake = True   # it already emits what our own limit lets us take in
                        continue
                    if p.release_in_use and v is not None and v.limit_unproven(self.low_since, p.in_use_settle):
                        if now - self.unproven.setdefault(u, now) < p.in_use_patience:
                            starved = True    # its limit was not shown in use: this window says nothing of it
                            continue
                    self.unproven.pop(u, None)
                    out.append(self._move(u, RELEASE, now, None if v is None else v.k, queue_bytes,
                                          None if v is None else v.originv))
                    released = True
            for u in self.upstreams:          # light and holding nothing: the episode is over for u
                if u not in self.holds and u not in self.pending and self._searched(u):
                    self.ended_at.setdefault(u, now)
            if released or starved:
                busy = self.low_max > p.low_mark / 32
                self.low_since = now      # each further step up needs a fresh light window
                if released and busy and p.settle_after_release:
                    # ... read once the release shows in the smoothed level: before that, a queue
                    # at work reads light at the rate it had (an idle queue shows nothing either way).
                    self.low_since = now + SETTLE * p.queue_smoothing
                self.low_min = self.low_max = queue_bytes
                self.step_level = None
            self.at_intake = at_intake
        else:
            self.level = NORMAL
            self.at_intake = False
            if self.low_since is None:
                self.unproven.clear()     # over the low mark: the wait for evidence starts again
            self.blocked, self.retry_at = set(), None
        if p.bracket_light_window > 0:
            inside = any(u in self.over for u in self.upstreams if self.holds.get(u) or u in self.pending)
            self.window = p.bracket_light_window if inside else p.light_window
        return out

    def release_all(self, now: float) -> list[Signal]:
        """This task is stopping: let go of every step it holds or asked for."""
        self.pending.clear()
        held = {u for u, h in self.holds.items() if h > 0} | {u for u, h in self.wants.items() if h > 0}
        return [self._send(u, 0, RELEASE, now) for u in self.upstreams if u in held]

    def mid_step(self, upstream: int) -> bool:
        return upstream in self.pending

    def own_limit_rose(self) -> None:
        """``step_from_recent_rate`` with ``bracket_search``: this task's own emit limit rose (its downstream
        released it). The overloads it saw on its queue were read while that limit bound (a relay cut under
        its emits fills its own queue); the upstream rates they mark as too high may not be any more."""
        if self.params.step_from_recent_rate and self.params.bracket_search:
            for side in (self.over, self.over_slope, self.creep):
                side.clear()

    def own_limit(self, intake: float | None) -> None:
        """``within_intake``: the input tuples/s this task's own emit limit lets it execute (its limit times
        the tuples it takes in per tuple it emits); None while its limiter is off or that is not known."""
        self.intake = intake

    def _intake_k(self, originv: float | None) -> int | None:
        """``within_intake``: the fewest steps (of ``originv``) that hold an upstream to at most ``intake``;
        None when no such bound is in force."""
        p = self.params
        if not (p.within_intake and p.bracket_search) or self.intake is None or not originv or originv <= 0:
            return None
        if self.intake >= originv:
            return 0
        return max(0, math.ceil(p.fine_steps * math.log(self.intake / originv) / math.log(p.step) - 1e-9))

    def _block(self, u: int, until: float) -> None:
        self.blocked.add(u)
        self.retry_at = until if self.retry_at is None else min(self.retry_at, until)

    def _move(self, u: int, kind: str, now: float, k: int | None = None, level: float = 0.0,
              originv: float | None = None) -> Signal:
        """One step down (BACKPRESSURE) or up (RELEASE) of the size this upstream is at.

        ``k`` is the upstream's published step count (None: not seen; our own hold stands in);
        ``level`` the queue level the move was decided on.
        """
        whole = self.params.fine_steps
        h = self.holds.get(u, 0)
        if self.params.bracket_search:
            seen = h if k is None else k
            mine = self._bracket(u, kind, seen, h, now, level, originv)
            self.moved[u] = (now, level, seen + mine - h)
            if kind == BACKPRESSURE and self.params.bracket_interpolate:
                self.settle_at = now + SETTLE * self.params.queue_smoothing
            return self._send(u, mine, kind, now)
        ended = self.ended_at.pop(u, None)
        if ended is not None and now - ended >= self.params.originv_memory:
            self.last_dir.pop(u, None)            # a new episode, not the last one coming back
            self.size.pop(u, None)
            self.streak.pop(u, None)
        last = self.last_dir.get(u)
        size = self.size.get(u, whole)
        streak = self.streak.get(u, 0) + 1 if last == kind else 1
        if last is not None and last != kind:
            size = max(1, size // 2)              # a reversal: the capacity is in between
        elif streak >= 3:
            size = min(whole, size * 2)           # three the same way: the capacity moved, widen
        elif streak == 2 and size < whole:
            size = max(1, size // 2)              # closing in on it (bisection)
        self.size[u], self.last_dir[u], self.streak[u] = size, kind, streak
        return self._send(u, h + size if kind == BACKPRESSURE else max(0, h - size), kind, now)

    def _leads(self, v: UpstreamView, h: int) -> bool:
        """Whether this task holds the most steps on ``v`` of all its downstreams (ties: the lowest id)."""
        return all(g < h or (g == h and d > self.task_id) for d, g in v.granted.items() if d != self.task_id)

    def _searched(self, u: int) -> bool:
        """Whether a step size or a bracket is kept for ``u`` (what ``originv_memory`` may carry over)."""
        return u in self.last_dir or u in self.over or u in self.light

    def _slope(self, u: int, kind: str, k: int, now: float, level: float) -> float | None:
        """``bracket_interpolate``: bytes/s the queue rose (BACKPRESSURE) or fell (RELEASE) while the
        upstream was at ``k`` since our last move on it; None when that was not measured cleanly.

        Rising: from the level at the move to ``level`` now, if the upstream's ``k`` is still the one
        that move set (no sibling moved it) and the queue is nearer the high mark than the hard bound
        (at the bound the upstream waits on the queue: its rate is not the one in force). Falling: from
        the level at the move (over the low mark) until the level first reached the low mark; a queue
        that was already low shows nothing.
        """
        p = self.params
        mv = self.moved.get(u)
        if mv is None or mv[2] != k or now <= mv[0]:
            return None
        t0, q0, _ = mv
        if kind == BACKPRESSURE:
            return (level - q0) / (now - t0) if q0 < level < p.pinned_level else None
        if self.low_at is None or self.low_at <= t0 or q0 <= p.low_mark:
            return None
        return (q0 - p.low_mark) / (self.low_at - t0)

    def _interpolated(self, over: int, light: int, rise: float, fall: float) -> int:
        """``bracket_interpolate``: the ``k`` whose rate is where the queue would stand still, on the
        line between ``over`` (the queue rose ``rise`` bytes/s) and ``light`` (it fell ``fall``), kept
        in the middle half of the bracket so that a wrong slope still shrinks it by a quarter."""
        p = self.params
        ratio = 1.0 + (p.step ** ((over - light) / p.fine_steps) - 1.0) * fall / (fall + rise)
        k = light + p.fine_steps * math.log(ratio) / math.log(p.step)
        margin = max(1, (light - over) // 4)
        return min(light - margin, max(over + margin, round(k)))

    def _rebase(self, u: int, originv: float) -> None:
        """``bracket_interpolate``: the upstream's ``originv`` changed since the bracket was read (it
        was raised for a source that overloads as soon as it is let go): the same rates are other
        step counts now. ``over`` at 0 stays (the free rate is not a step of any originv)."""
        old = self.basis.get(u)
        self.basis[u] = originv
        if old is None or old == originv or old <= 0:
            return
        shift = round(self.params.fine_steps * math.log(originv / old) / math.log(1.0 / self.params.step))
        if u in self.light:
            self.light[u] = max(0, self.light[u] + shift)
        if self.over.get(u):
            self.over[u] = max(0, self.over[u] + shift)

    def _bracket(self, u: int, kind: str, k: int, h: int, now: float, level: float = 0.0,
                 originv: float | None = None) -> int:
        """``bracket_search``: the hold to ask for, halfway across the bracket the capacity lies in
        (with ``bracket_interpolate``: where the slopes put the capacity, when both are known)."""
        p = self.params
        whole = p.fine_steps
        ended = self.ended_at.pop(u, None) if kind == BACKPRESSURE else None
        if kind == BACKPRESSURE and k == 0 and (ended is None or now - ended >= p.originv_memory):
            for side in (self.over, self.light, self.creep, self.rise, self.over_slope, self.light_slope, self.overloaded):
                side.pop(u, None)                 # a new episode: nothing known yet
        slope = self._slope(u, kind, k, now, level) if p.bracket_interpolate else None
        if p.bracket_interpolate and originv is not None:
            self._rebase(u, originv)
        over, light = self.over.get(u), self.light.get(u)
        creep = self.creep.pop(u, None)
        if kind == BACKPRESSURE:
            self.rise.pop(u, None)
            if light is not None and light <= k:
                # Overloaded where it was light: that light window was too short to show a rate just
                # over the capacity, or the capacity fell a little: one part of a step, doubling while
                # the overload goes on (a capacity that fell far is reached in a few checks).
                creep, light = 1, None
            elif creep is not None and light is None:
                creep = min(whole, 2 * creep)
            if creep is not None:
                target = k + creep
                self.creep[u] = creep
            elif light is not None and slope is not None and (fall := self.light_slope.get(u)) and light - k > 2:
                target = self._interpolated(k, light, slope, fall)
            else:
                target = max(k + 1, k + whole if light is None else (k + light + 1) // 2)
            if p.drain_margin and light is not None:
                target = max(target, light + p.drain_margin)     # under the rate found light: the backlog drains
            cap = self._intake_k(originv)
            if cap is not None:
                target = max(target, cap)         # at least down to what our own limit takes in
            over = k
            self._keep(self.over_slope, u, slope)
        else:
            rise = self.rise.pop(u, None)
            if over is not None and over >= k:
                rise, over = 1, None              # light where it overloaded: the same, upwards
                self.overloaded[u] = now
            elif rise is not None and over is None:
                rise = min(whole, 2 * rise)
            if rise is not None:
                seen = self.overloaded.get(u)
                if (p.release_below_overload and seen is not None and now - seen < p.sensitivity
                        and self.low_max > p.low_mark / 32):
                    rise = 1    # light just read at a rate that overloaded, queue not idle: near the capacity
                target = k - rise
                self.rise[u] = rise
            elif over is not None and slope is not None and (up := self.over_slope.get(u)) and k - over > 2:
                target = self._interpolated(over, k, up, slope)
            else:
                target = min(k - 1, k - whole if over is None else (over + k) // 2)
            cap = self._intake_k(originv)
            if cap is not None:
                # No further than the first step at or over what our own limit takes in (within one part
                # over it); held there, ``at_intake`` says so, so a starved-upstream rule below us still
                # lets us go although our queue may run idle.
                target = max(target, cap - 1)
            light = k
            self._keep(self.light_slope, u, slope)
        for side, val in ((self.over, over), (self.light, light)):
            self._keep(side, u, val)
        if over is None:
            self.over_slope.pop(u, None)
        if light is None:
            self.light_slope.pop(u, None)
        mine = h + (target - k)                   # in our own hold (siblings' steps stay theirs)
        return max(h + 1, mine) if kind == BACKPRESSURE else max(0, min(h - 1, mine))

    @staticmethod
    def _keep(side: dict[int, Any], u: int, val: Any) -> None:
        if val is None:
            side.pop(u, None)
        else:
            side[u] = val

    def _send(self, u: int, k: int, kind: str, now: float) -> Signal:
        self.seq += 1
        if k > 0:
            self.wants[u] = k
        else:
            self.wants.pop(u, None)
        sig = Signal(kind, u, self.task_id, k, self.seq, now, self.run)
        self.pending[u] = _Pending(sig, now)
        return sig

    def _ack_or_resend(self, u: int, v: UpstreamView, now: float, out: list[Signal]) -> None:
        pend = self.pending.get(u)
        if pend is None:
            return
        run, seq = v.applied.get(self.task_id, (None, -1))
        if run == self.run and seq >= pend.signal.seq:
            del self.pending[u]
            granted = v.granted.get(self.task_id, 0)
            if granted > 0:
                mv = self.moved.get(u)
                if mv is not None and granted > pend.signal.k and self.params.step_from_recent_rate:
                    self.moved[u] = (mv[0], mv[1], mv[2] + granted - pend.signal.k)   # stepped under its recent rate
                self.holds[u] = self.wants[u] = granted
            else:
                self.holds.pop(u, None)
                self.wants.pop(u, None)
                if self._searched(u):
                    self.ended_at.setdefault(u, pend.sent_at)    # holding nothing: the episode ended
        elif now - pend.sent_at >= self.params.resend_after:
            pend.sent_at = now
            out.append(pend.signal)


@dataclass(frozen=True)
class RateChange:
    """What a ``Throttle`` asks the runtime to do: set this rate, or (None) limiter off; ``up``: the limit
    rose (a release), so what the task saw over its own queue under the old limit is stale."""

    rate: float | None
    up: bool = False


class Throttle:
    """One task's emit rate as its downstreams hold it: ``originv * step**(k / fine_steps)``."""

    def __init__(self, task_id: int, params: StepwiseParams) -> None:
        self.task_id = task_id
        self.params = params
        self.holds: dict[int, int] = {}                   # downstream -> steps granted to it
        self.applied: dict[int, tuple[int, int]] = {}     # downstream -> newest (run, seq) applied
        self._retired: dict[int, set[int]] = {}           # downstream -> runs it has since replaced
        self.k = 0
        self.k_max = 0
        self.originv: float | None = None     # kept after a release: the last episode's value
        self.first_originv = 0.0              # originv of the first of episodes within originv_memory
        self.in_episode = False               # some downstream holds a step (originv is current)
        self.stepped_at: float | None = None  # the last step down, and for whom
        self.stepped_by = -1
        self.released_at: float | None = None
        self.holding = False                  # k == 0 but the limit stays at originv (originv_hold)
        self.recent_stepped = False           # step_from_recent_rate: no step from it (left) in this episode

    @property
    def backpressure(self) -> bool:
        return self.k > 0

    @property
    def at_floor(self) -> bool:
        return self.in_episode and self.k >= self.k_max

    @property
    def rate(self) -> float | None:
        """The limit in force; None when the limiter is off (``k == 0``, after any hold)."""
        if self.originv is None or (self.k == 0 and not self.holding):
            return None
        return scaled_rate(self.originv, self.params.step, self.k, self.params.fine_steps)

    @property
    def nominal_rate(self) -> float | None:
        """``originv * step**k``, also at ``k == 0`` (where it is ``originv`` exactly)."""
        if self.originv is None:
            return None
        return scaled_rate(self.originv, self.params.step, self.k, self.params.fine_steps)

    def stepping(self, now: float) -> bool:
        """Step 6's "being backpressured right now": stepped down less than ``sensitivity`` ago."""
        return self.stepped_at is not None and now - self.stepped_at < self.params.sensitivity

    def step_age(self, now: float) -> float | None:
        return None if self.stepped_at is None else now - self.stepped_at

    def on_signal(self, sig: Signal, observed_rate: float, now: float,
                  recent: Recent | None = None) -> RateChange | None:
        """Apply one signal addressed to this task; stale or repeated ones change nothing.

        ``recent``: what this task emitted over the last ``recent_window`` (read only by
        ``step_from_recent_rate``)."""
        if sig.target != self.task_id or not self._newer(sig.source, sig.run, sig.seq):
            return None
        k = min(sig.k, self.holds.get(sig.source, 0)) if sig.kind == RELEASE else sig.k
        return self._request(sig.source, k, observed_rate, now, recent)

    def reconcile(self, source: int, held: int, run: int, seq: int, observed_rate: float,
                  now: float, recent: Recent | None = None) -> RateChange | None:
        """Apply a downstream's published request for this task (as of its ``(run, seq)``)."""
        if not self._newer(source, run, seq):
            return None
        return self._request(source, held, observed_rate, now, recent)

    def forget(self, source: int, observed_rate: float, now: float) -> RateChange | None:
        """A downstream is gone: whatever it held is released."""
        self.applied.pop(source, None)
        if source not in self.holds:
            return None
        self.holds.pop(source)
        return self._recompute(observed_rate, now, source)

    def reset(self, now: float = 0.0) -> RateChange | None:
        """Let go of everything (the run is stopping)."""
        self.holds.clear()
        return self._recompute(0.0, now, -1)

    def refresh(self, observed_rate: float, now: float, recent: Recent | None = None) -> RateChange | None:
        """Held but not yet stepped because the rate was not measurable: try again."""
        if self.holds and not self.in_episode:
            return self._recompute(observed_rate, now, max(self.holds, key=self.holds.__getitem__), recent, True)
        return None

    def tick(self, now: float) -> RateChange | None:
        """The timer: a hold at ``originv`` that has lasted ``originv_hold`` ends (limiter off)."""
        if self.holding and self.released_at is not None and now - self.released_at >= self.params.originv_hold:
            self.holding = False
            return RateChange(None, True)
        return None

    def _newer(self, source: int, run: int, seq: int) -> bool:
        """Whether ``(run, seq)`` is newer than what was applied from ``source`` (and record it)."""
        cur = self.applied.get(source)
        retired = self._retired.get(source, ())
        if run in retired:
            return False
        if cur is not None and cur[0] == run and seq <= cur[1]:
            return False
        if cur is not None and cur[0] != run:
            self._retired.setdefault(source, set()).add(cur[0])    # a restarted downstream
        self.applied[source] = (run, seq)
        return True

    def _request(self, source: int, k: int, observed_rate: float, now: float,
                 recent: Recent | None = None) -> RateChange | None:
        h = self.holds.get(source, 0)
        if k > h:
            k = self._grant(source, h, k, now)
        down = k > h
        if k > 0:
            self.holds[source] = k
        else:
            self.holds.pop(source, None)
        return self._recompute(observed_rate, now, source, recent, down)

    def _grant(self, source: int, h: int, k: int, now: float) -> int:
        """How far a request to go from ``h`` to ``k`` steps is granted (step 6 and the floor)."""
        if self.stepping(now) and self.stepped_by != source:
            return h
        others = sum(self.holds.values()) - h
        cap = self.k_max if self.in_episode else self.params.fine_steps
        return max(h, min(k, h + self.params.fine_steps, cap - others))

    def _recompute(self, observed_rate: float, now: float, source: int,
                   recent: Recent | None = None, down: bool = False) -> RateChange | None:
        """The step count the holds add up to, and the limit it means; ``down``: ``source`` was just
        granted a step down."""
        p = self.params
        want = sum(self.holds.values())
        if want > 0 and not self.in_episode:        # the first step: record originv
            originv = float(observed_rate)
            continued = (self.originv is not None and self.released_at is not None
                         and now - self.released_at < p.originv_memory)
            if continued:
                # Under bracket_search a source overloading again soon after it was let go entirely
                # ran faster than that originv (its meter lags the burst): one whole step over the
                # first episode's, however many follow.
                originv = max(originv, self.first_originv / p.step if p.bracket_search else self.originv)
            else:
                self.first_originv = originv
            k_max = max_steps(originv, p.step, p.rate_floor, p.fine_steps) if originv > 0 else 0
            if k_max == 0:
                return None     # no steppable rate measured yet (a task just started): wait for one
            self.in_episode, self.originv, self.k_max = True, originv, k_max
            self.recent_stepped = continued     # step_from_recent_rate: in a new episode only
        elif want == 0:
            self.in_episode = False
        if (down and p.step_from_recent_rate and self.in_episode and not self.recent_stepped
                and source in self.holds):
            deeper = self._under_recent(recent) - want
            if deeper > 0:
                self.recent_stepped = True
                self.holds[source] += deeper      # granted to the task that asked: its release gives it back
                want += deeper
        old = self.k
        self.k = min(want, self.k_max) if self.in_episode else 0
        if self.k == old:
            return None
        if self.k > old:
            self.stepped_at, self.stepped_by = now, source
            self.holding = False
        elif self.k == 0:
            self.released_at = now
            self.stepped_at, self.stepped_by = None, -1
            self.holding = p.originv_hold > 0 and want == 0 and source != -1
        return RateChange(self.rate, self.k < old)

    def _under_recent(self, recent: Recent | None) -> int:
        """``step_from_recent_rate``: the step count one whole step under what this task emitted over
        the last ``recent_window``, when that is under v' x the limit in force (``originv`` when free):
        the task is not emitting at its limit but at what a full queue downstream admits, so a step from
        the limit would still leave it over the capacity. 0 (no such step) when the window is not full,
        holds under ``MIN_RECENT_TUPLES`` (a stall), or the task is a bolt with its queue at or under the
        low mark (it emits what it receives: its rate says nothing of what it could emit).
        """
        p = self.params
        if (recent is None or self.originv is None or recent.span < p.recent_window
                or recent.tuples < MIN_RECENT_TUPLES
                or (recent.queue_bytes is not None and recent.queue_bytes <= p.low_mark)):
            return 0
        rate = recent.tuples / recent.span
        if rate >= p.step * scaled_rate(self.originv, p.step, self.k, p.fine_steps):
            return 0
        k = math.ceil(p.fine_steps * (1.0 + math.log(rate / self.originv) / math.log(p.step)) - 1e-9)
        return min(k, self.k_max)


def max_steps(originv: float, step: float, floor: float, fine_steps: int = 1) -> int:
    """Largest ``k`` with ``scaled_rate(originv, step, k, fine_steps) >= floor`` (0 when none)."""
    k = 0
    while scaled_rate(originv, step, k + 1, fine_steps) >= floor:
        k += 1
        if k >= 1000 * fine_steps:     # a floor far under originv; 0.5**1000 is already denormal
            break
    return k


class LimitInUse:
    """``release_in_use``: since when a task's emit limit has bound its emits, read from how often its
    limiter made it wait (sampled on the driver's timer). A spell starts at the first sample that saw a
    wait; it ends after two samples in a row without one, or when the limit changes (a new limit is in use
    only once it binds in turn)."""

    QUIET_SAMPLES = 2

    def __init__(self) -> None:
        self.since: float | None = None
        self._rate: float | None = None
        self._waits: int | None = None
        self._quiet = 0

    def sample(self, now: float, waits: int, rate: float | None) -> bool:
        """One sample of the limiter's wait count under limit ``rate``; True when ``since`` changed."""
        before = self.since
        if rate != self._rate:
            self._rate, self.since, self._quiet = rate, None, 0
        elif rate is not None and self._waits is not None and waits > self._waits:
            self._quiet = 0
            if self.since is None:
                self.since = now
        elif self.since is not None:
            self._quiet += 1
            if self._quiet >= self.QUIET_SAMPLES:
                self.since = None
        self._waits = waits
        return self.since != before


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

    * A state older (by ``version``, ``(run, counter)``) than the one held is ignored:
      records can arrive out of order after a reconnect. A state from a new run (the
      task's process restarted) replaces the old run's, whatever the clocks say, and
      the old run's records are ignored from then on.
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
        self.retired: dict[int, set[int]] = {}      # task -> runs a newer run replaced
        self.idle_at: dict[int, float] = {}         # bolt task -> when a state showing its queue idle came
        self.dry_at: dict[int, float] = {}          # spout task -> when a dry state, or the first after it, came

    def alive(self, task: int) -> bool:
        """Whether ``task`` is one of ours or has a published state (signals from others are dropped)."""
        return task in self.throttles or task in self.states

    def view(self, task: int) -> UpstreamView | None:
        return self.views.get(task)

    def update(self, task: int, state: TaskState | None, now: float, rate_of: Callable[[int], float],
               recent_of: Callable[[int], Recent | None] | None = None) -> StateOutcome:
        """Apply one state change of ``task`` (None: its state znode disappeared).

        ``recent_of``: what our task emitted over the last ``recent_window`` (None: not read)."""
        out = StateOutcome()
        if state is None:
            self.states.pop(task, None)
            self.views.pop(task, None)
            if task not in self.throttles:
                self.gone_since.setdefault(task, now)
            return out
        run = state.version[0]
        if run in self.retired.get(task, ()):
            return out
        old = self.states.get(task)
        if old is not None and old.version[0] == run and old.version[1] > state.version[1]:
            return out
        self.gone_since.pop(task, None)
        if old is not None and old.version[0] != run:
            self.retired.setdefault(task, set()).add(old.version[0])
        self.states[task] = state
        if not state.spout and state.queue_bytes <= state.low_mark / 32:
            self.idle_at[task] = now
        if state.dry or (old is not None and old.dry):
            self.dry_at[task] = now     # dry, or dry until this state (the first since that is not)
        self.views[task] = UpstreamView(
            state.k, state.at_floor, state.applied, state.granted,
            None if state.step_age is None else now - state.step_age, state.stepped_by, state.originv,
            None if state.spout else state.queue_bytes, any(h > 0 for h in state.holds.values()),
            self.idle_at.get(task), state.dry, self.dry_at.get(task), state.at_intake,
            None if state.in_use_age is None else now - state.in_use_age)
        for tid, th in self.throttles.items():
            held = state.holds.get(tid, 0)
            if held or task in th.holds:
                before = th.applied.get(task)
                change = th.reconcile(task, held, run, state.seq, rate_of(tid), now,
                                      recent_of(tid) if recent_of is not None else None)
                self._record(out, tid, change, th.applied.get(task) != before)
        return out

    def expire(self, now: float, rate_of: Callable[[int], float]) -> StateOutcome:
        """Forget every task whose state stayed gone for ``grace``: release what it held."""
        out = StateOutcome()
        for task in [t for t, since in self.gone_since.items() if now - since >= self.grace]:
            del self.gone_since[task]
            for tid, th in self.throttles.items():
                self._record(out, tid, th.forget(task, rate_of(tid), now), False)
        return out

    @staticmethod
    def _record(out: StateOutcome, tid: int, change: RateChange | None, acked: bool) -> None:
        if change is not None:
            out.changes.append((tid, change))
        elif acked:
            out.acknowledged.append(tid)
