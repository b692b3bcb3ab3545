"""The overload matrix: every flow-control policy through seven kinds of overload.

Each scenario is a small topology on the local engine, run for 12 s (e: 8 s) under
``none``, ``source_stop``, ``watermark``, ``stepwise``, ``window`` and ``adaptive``
(plus ``stepwise`` with the settings of ``MATRIX_VARIANTS``; the other ``VARIANTS`` when named with
``--policies``, and any made with ``--variant NAME=BASE,KEY=VALUE...``), with acking off and on
(``window`` needs acking: its acking-off cells are shown as not run). Marks are small so every
policy acts many times per run: high 64 KB, low 16 KB, hard bound 128 KB,
``sensitivity`` 200 ms; the water-mark policy gets the same marks as fractions of
the hard bound and checks every 200 ms, so the policies differ in their rules, not
in their thresholds; ``adaptive`` likewise starts at those fractions and checks every
200 ms, with a 2 s backpressure window; its autoscaling is decided but not carried
out (``autoscale: false``: a task added to a sink would add to the scenario's capacity).
Tuples carry about 120 bytes on the wire (a 100-byte pad).

Scenarios (``C``: what the slow stage manages, tuples/s):

a. one slow task: an endless spout into one task of ``C`` = 5,000/s;
b. a slow component of 4 parallel tasks of 1,250/s each (shuffle);
c. fan-out: the spout feeds a fast counting bolt directly and, through a relay
   that forwards every 4th tuple, a slow task of 1,500/s;
d. an on/off source: 10,000/s for 0.5 s, nothing for 0.5 s (on average C) into
   one task of 5,000/s;
e. capacity that drops then recovers: a source offering 4,000/s into a task of
   5,000/s that manages only 1,250/s from 1.5 s to 3.0 s (8 s in all, so the backlog
   of the drop is worked off before the end);
f. a slow task whose direct upstream is a (fast) relay bolt: the signal must
   travel hop by hop;
g. a bolt that is fast except for a 2 ms pause every 1,000 tuples, fed by an
   endless spout: 20,000 tuples/s of service between the pauses (``C`` = 1,000 tuples
   per 52 ms, about 19,230/s), well under what the process manages on one core, so
   ``none`` saturates the bolt and measures its capacity.

The scheduled sources of (d) and (e) owe what flow control held them back from and
emit it later (a source reading a log or a broker's backlog): a source that forgot it
would lose those tuples uncounted, and the policy that buffers the most of a burst
(``none``, up to the hard bound) would score best on goodput.

Per cell, measured between ``warmup`` and the stop (tuples lost over the whole run,
after the drain):

* ``lost``: tuples the spout emitted that never reached the sink (any branch);
* ``goodput``: tuples/s the sink executed, over the same figure under ``none``
  in the same scenario and acking mode (``none`` only waits on the hard bound, so
  the bottleneck never idles: that is the capacity; ``none`` runs as often as the
  default ``stepwise``, and its mean is the reference);
* ``p50_ms`` / ``p99_ms``: spout-to-sink latency (every 8th tuple arriving after the warmup);
* ``peak_queue``: the most any bolt queue held, over the hard bound;
* ``rate_cov``: coefficient of variation of the spout's emit rate in 100 ms bins, once
  steady: over the second half of the run (6-12 s; a search needs a few seconds to
  close in on the capacity), except in (e), where it is the larger of the CoVs during
  the drop (2.0-3.0 s) and after the recovery (4.0-8.0 s), so the change of rate that
  any policy must make at the drop and the recovery is not counted (``rate_cov_all``
  in the JSON: from the warmup to the end; ``cov_windows``: the windows of each
  scenario; ``rate_cov_250ms``: the same windows in 250 ms bins). Earlier matrices (JSON
  files without ``durations``) ran 5 s and read it from the warmup on in 250 ms bins,
  which alias ``source_stop``'s on/off cycles of a few tenths of a second;
* ``back_to_originv_s`` (e only): from the recovery until the spout's limit is off
  (or at the offered rate: ``originv``, under ``backpressure.originv_hold_ms``);
* ``cpu`` (JSON only): the process's CPU seconds per second of the run, including the drain
  (near 1.0 the process was bound by the CPU, and ``none`` no longer measures a capacity);
* ``fast_tps`` (c only): tuples/s of the fast branch; ``fast_ratio`` against
  ``none`` in the same scenario (with an endless source and nothing dropped, no
  policy can let the fast branch run further ahead of the slow one than its
  queues allow, so ``none``'s figure is the unloaded one here). Over a 12 s run that figure
  includes the slow branch's queues filled to the hard bound, so a policy that holds them
  between the marks scores under 1.0 by what they do not hold at the stop (``--report``
  prints each run's ratio beside its slow queue at the stop);
* ``fast_steady_tps`` (c only): tuples/s the fast bolt executed from the warmup to the stop, and
  ``fast_steady_ratio`` against ``none``'s, reported beside the whole-run figure: over that span
  the fast branch runs at the rate the policy lets the spout keep, so it measures the throughput
  the fast branch keeps, not how full the slow branch's queues are at the stop (about 0.001 of
  the whole-run ratio per KB there; a policy holding them low scores 0.88 on it at goodput 1.0).

``python -m bench policy_comparison [--quick] [--repeat N] [--scenarios aceg]
[--policies stepwise,stepwise+search]`` writes ``bench/results/policy_comparison.json``
(``_quick`` or ``_partial`` for a subset) and one PNG per scenario (acking off) of the
spout's rate and the sink queue over time, ``policy_comparison_<s>.png``.
Two cores are shared with other work while it runs: read the figures as a
comparison between policies measured the same way, and see the spread of repeats.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import uvloop

from bench.environment import stamp
from bench.variant_text import split_variant
from runtime.local.engine import LocalEngine
from topo.api import Bolt, Spout, Tuple
from topo.config import ConfigError, resolve
from topo.topology import TopologyBuilder

RESULTS = Path(__file__).parent / "results"
POLICIES = ("none", "source_stop", "watermark", "stepwise", "window", "adaptive")
# Named settings measured beside the document's default (see BENCHMARKS.md).
VARIANTS: dict[str, dict[str, Any]] = {
    "stepwise+fine": {"backpressure.fine_steps": 8},
    "stepwise+flat": {"backpressure.flat_queue_holds": True, "backpressure.release_window_ms": 50},
    "stepwise+tuned": {"backpressure.fine_steps": 8, "backpressure.originv_hold_ms": 10_000,
                       "backpressure.queue_smoothing_ms": 50},
    "stepwise+all": {"backpressure.fine_steps": 8, "backpressure.originv_hold_ms": 10_000,
                     "backpressure.queue_smoothing_ms": 50, "backpressure.flat_queue_holds": True,
                     "backpressure.release_window_ms": 50},
    # The combination docs/flow-control.md names for the goals of the matrix.
    "stepwise+search": {"backpressure.fine_steps": 16, "backpressure.bracket_search": True,
                        "backpressure.release_window_ms": 50, "backpressure.queue_smoothing_ms": 50},
}
# stepwise+search reading its bracket in rates and slopes (bracket_light_window_ms is not in it: in a
# locked run it cost e its goodput, 0.93-0.94, the longer windows slowing the way back up).
VARIANTS["stepwise+slopes"] = {**VARIANTS["stepwise+search"], "backpressure.bracket_interpolate": True}
# stepwise+slopes that does not release a relay bolt starved by its own backpressure (c and f: light
# evidence read under a relay that emits what it receives let its limit climb past the capacity).
VARIANTS["stepwise+hops"] = {**VARIANTS["stepwise+slopes"], "backpressure.hold_starved_upstream": True}
# stepwise+hops that, once per episode, steps an upstream emitting far under its limit (waiting on a full
# queue) one step under what it emitted over the last sensitivity, not one step under its limit (c: steps
# from the limits the start burst left kept the slow task's queue near the hard bound for seconds).
VARIANTS["stepwise+recent"] = {**VARIANTS["stepwise+hops"], "backpressure.step_from_recent_rate": True}
# stepwise+recent that releases a spout whose source ran dry in the light window (its limit was not in use:
# an on/off source between bursts) only after 1 s of light (d: light read between bursts let the limit
# climb over the capacity, so the spout worked off what it owed in bursts and idled between them).
VARIANTS["stepwise+dry"] = {**VARIANTS["stepwise+recent"], "backpressure.dry_release_window_ms": 1000}
# stepwise+dry whose steps down inside a bracket go at least half a step (8 of 16 parts) under the rate found
# light (c with acking: one-part moves around the capacity kept the slow task's queue over the high mark for a
# second or more per cycle and the relay's at the hard bound, p99 over source_stop's).
VARIANTS["stepwise+drain"] = {**VARIANTS["stepwise+dry"], "backpressure.drain_margin_parts": 8}
# stepwise+dry whose bolts release an upstream no further than their own limit lets them take in, and step it
# down at least that far (c with acking: the relay, limited by the slow task, let the spout's limit double past
# what it could forward in 50 ms light windows, then crept it down one part at a time with its queue at the bound).
VARIANTS["stepwise+intake"] = {**VARIANTS["stepwise+dry"], "backpressure.release_within_intake": True}
# stepwise+intake whose queues at work read a light window only once a release shows in the smoothed level
# (c: a light window read 60 ms after the slow task released the relay, before the release showed, let it
# release again far past the capacity; the bracket then crept back a part at a time with the queues at the bound).
VARIANTS["stepwise+settle"] = {**VARIANTS["stepwise+intake"], "backpressure.settle_after_release": True}
# stepwise+intake whose light tasks release an upstream bolt (its own input held) only on a light window begun once
# that bolt's limit had bound its emits for a settle time (c: three traced slow runs each began with the slow task
# releasing the relay past its capacity on a light window read before the relay's limit in force showed in it).
VARIANTS["stepwise+inuse"] = {**VARIANTS["stepwise+intake"], "backpressure.release_after_limit_in_use": True}
# The variants a whole run measures (the others run when named with --policies; their last figures are
# in BENCHMARKS.md): the combinations named for the goals (stepwise+slopes is stepwise+hops without
# hold_starved_upstream, the same rules wherever no relay bolt feeds the slow task), and the newest setting.
MATRIX_VARIANTS = ("stepwise+hops", "stepwise+recent", "stepwise+dry", "stepwise+intake", "stepwise+inuse")
# Run --repeat times (the others once): the reference, the baseline the goals are read against, the
# document's default and the named combination.
REPEATED = ("none", "source_stop", "stepwise", "stepwise+search", "stepwise+slopes", "stepwise+hops",
            "stepwise+recent", "stepwise+dry", "stepwise+drain", "stepwise+intake", "stepwise+settle",
            "stepwise+inuse")
# (g)'s fast bolt: tuples/s of service between its pauses. Low enough that the process has CPU to
# spare (without a service rate the bolt was bound by the CPU both cores share, so `none` measured
# no capacity: the load moved it, and policies that did less work per tuple scored over 1.0).
G_SERVICE = 20_000.0
SAMPLE_S = 0.05
# The rate CoV's bins: short enough to see the on/off cycles of source_stop (a few tenths of a second:
# in 250 ms bins, the bins of matrices before, its 200 <-> 13,000/s alternation every 100 ms in (a) with
# acking scored 0.07, under none's 0.09) and long enough that a paced spout scores under 0.02 (paced_cov).
BIN_S = 0.1
EARLIER_BIN_S = 0.25     # kept beside it in the JSON (rate_cov_250ms), as earlier matrices read it
PAD = "x" * 100
BASE = {"queue.high_mark": "64KB", "queue.low_mark": "16KB", "queue.hard_bound": "128KB",
        "backpressure.sensitivity_ms": 200, "backpressure.step": 0.5, "drain_timeout_s": 30,
        "backpressure.water_mark.high": 0.5, "backpressure.water_mark.low": 0.125,
        "backpressure.water_mark.check_interval_ms": 200,
        "backpressure.adaptive.high": 0.5, "backpressure.adaptive.high_min": 0.5,
        "backpressure.adaptive.low": 0.125, "backpressure.adaptive.check_interval_ms": 200,
        "backpressure.adaptive.window_ms": 2000, "backpressure.adaptive.autoscale": "false"}


class Box:
    """What every copy of a component shares (the engine deep-copies components)."""

    def __init__(self) -> None:
        self.emitted = 0
        self.owed = 0.0             # tuples a scheduled source was held back from and has not emitted yet
        self.seen: dict[str, set[int]] = {}
        self.latency: list[float] = []
        self.t0 = 0.0
        self.warmup = 0.0

    def __deepcopy__(self, memo: dict) -> "Box":
        return self


class Source(Spout):
    """``rate(t)`` tuples/s on a schedule, or as fast as it may (``rate`` None): ``(n, t, pad)``.

    What flow control holds a scheduled source back from is owed and emitted later, up to
    ``owe`` tuples (None: all of it, as a source reading a log or a broker's backlog does);
    past that, offered tuples are never emitted (a sensor that drops readings).
    """

    outputs = ["n", "t", "pad"]

    def __init__(self, box: Box, rate: Callable[[float], float] | None, tracked: bool = False,
                 owe: float | None = 256.0) -> None:
        self.box, self.rate, self.tracked = box, rate, tracked
        self.owe = owe
        self.due = 0.0
        self.last: float | None = None

    def next_tuple(self) -> None:
        now = time.monotonic()
        n = 1           # one tuple per call, as Storm's nextTuple: the limiter paces calls
        if self.rate is not None:
            if self.last is not None:
                self.due += (now - self.last) * self.rate(now - self.box.t0)
                if self.owe is not None:
                    self.due = min(self.due, self.owe)
            self.last = now
            self.box.owed = self.due
            n = min(4, int(self.due))
            if n <= 0:
                return          # nothing due: the engine waits a little before calling again
            self.due -= n
        box, emit = self.box, self.collector.emit
        for _ in range(n):
            i = box.emitted
            if self.tracked:
                emit([i, now, PAD], msg_id=i)
            else:
                emit([i, now, PAD])
            box.emitted = i + 1


class Sink(Bolt):
    """Manages ``capacity(t)`` tuples/s (None: as fast as it can); ``pause`` s more every 1,000 tuples.

    The capacity is a virtual service clock: each tuple costs ``1/capacity`` s of service and the
    bolt sleeps while it is ahead of real time, so what it manages is fixed by the scenario, not
    by the CPU the process gets (as long as the process has CPU to spare). A pause is service time
    too: the clock moves on by ``pause`` and the bolt sleeps it off.
    """

    def __init__(self, box: Box, name: str, capacity: Callable[[float], float | None] | None = None,
                 pause: float = 0.0) -> None:
        self.box, self.name, self.capacity, self.pause = box, name, capacity, pause
        self.vt: float | None = None
        self.n = 0

    async def execute(self, tup: Tuple) -> None:
        box = self.box
        box.seen.setdefault(self.name, set()).add(tup[0])
        self.n += 1
        now = time.monotonic()
        if self.n % 8 == 0 and self.name != "fast" and tup[1] - box.t0 >= box.warmup:
            box.latency.append(now - tup[1])
        extra = self.pause if self.pause and self.n % 1000 == 0 else 0.0
        cap = self.capacity(now - box.t0) if self.capacity is not None else None
        if cap:
            vt = now if self.vt is None or self.vt < now - 0.05 else self.vt
            self.vt = vt + 1.0 / cap + extra
            if self.vt - now > 0.002:
                await asyncio.sleep(self.vt - now)
        elif extra:
            await asyncio.sleep(extra)


class Relay(Bolt):
    """Forwards every ``every``-th tuple unchanged."""

    outputs = ["n", "t", "pad"]

    def __init__(self, box: Box, every: int = 1) -> None:
        self.box, self.every = box, every

    def execute(self, tup: Tuple) -> None:
        self.box.seen.setdefault("relay", set()).add(tup[0])
        if tup[0] % self.every == 0:
            self.collector.emit([tup[0], tup[1], tup[2]])


@dataclass(frozen=True)
class Scenario:
    key: str
    title: str
    build: Callable[[Box, bool], Any]      # -> Topology
    duration: float
    expect: Callable[[int], bool] = lambda n: True   # which n the sink should see
    recovery_at: float | None = None
    offered: float | None = None          # (e) the source's rate: what "back to originv" means
    steady: tuple[tuple[float, float], ...] = ()   # where the rate CoV is read (empty: warmup to the end)

    def cov_windows(self, warmup: float) -> tuple[tuple[float, float], ...]:
        """The windows the rate CoV is read over: ``steady``, or from the warmup to the end."""
        return self.steady or ((warmup, self.duration),)


def _const(c: float) -> Callable[[float], float]:
    return lambda t: c


def _a(box: Box, tracked: bool) -> Any:
    b = TopologyBuilder("matrix-a")
    b.spout("spout", Source(box, None, tracked))
    b.bolt("sink", Sink(box, "sink", _const(5_000.0))).shuffle("spout")
    return b.build()


def _b(box: Box, tracked: bool) -> Any:
    b = TopologyBuilder("matrix-b")
    b.spout("spout", Source(box, None, tracked))
    b.bolt("sink", Sink(box, "sink", _const(1_250.0)), parallelism=4).shuffle("spout")
    return b.build()


def _c(box: Box, tracked: bool) -> Any:
    b = TopologyBuilder("matrix-c")
    b.spout("spout", Source(box, None, tracked))
    b.bolt("fast", Sink(box, "fast")).shuffle("spout")
    b.bolt("relay", Relay(box, every=4)).shuffle("spout")
    b.bolt("sink", Sink(box, "sink", _const(1_500.0))).shuffle("relay")
    return b.build()


def _d(box: Box, tracked: bool) -> Any:
    b = TopologyBuilder("matrix-d")
    b.spout("spout", Source(box, lambda t: 10_000.0 if t % 1.0 < 0.5 else 0.0, tracked, owe=None))
    b.bolt("sink", Sink(box, "sink", _const(5_000.0))).shuffle("spout")
    return b.build()


def _e(box: Box, tracked: bool) -> Any:
    b = TopologyBuilder("matrix-e")
    b.spout("spout", Source(box, _const(4_000.0), tracked, owe=None))
    b.bolt("sink", Sink(box, "sink", lambda t: 1_250.0 if 1.5 <= t < 3.0 else 5_000.0)).shuffle("spout")
    return b.build()


def _f(box: Box, tracked: bool) -> Any:
    b = TopologyBuilder("matrix-f")
    b.spout("spout", Source(box, None, tracked))
    b.bolt("relay", Relay(box)).shuffle("spout")
    b.bolt("sink", Sink(box, "sink", _const(5_000.0))).shuffle("relay")
    return b.build()


def _g(box: Box, tracked: bool) -> Any:
    b = TopologyBuilder("matrix-g")
    b.spout("spout", Source(box, None, tracked))
    b.bolt("sink", Sink(box, "sink", _const(G_SERVICE), pause=0.002)).shuffle("spout")
    return b.build()


# Scenarios other than (e) run RUN_S seconds and read the rate CoV over STEADY, their second half: a
# search takes a few seconds to close in on the capacity (in the 5 s runs of earlier matrices the CoV
# from the warmup to the stop read that convergence, not a steady rate). Goodput, latency and the fast
# branch are still read from the warmup on, so the transient counts against them.
RUN_S = 12.0
STEADY = ((6.0, RUN_S),)
# What runs were before (a report without ``durations``: the JSON files of earlier matrices).
EARLIER_DURATIONS = {"a": 5.0, "b": 5.0, "c": 5.0, "d": 5.0, "e": 8.0, "f": 5.0, "g": 5.0}
SCENARIOS = {s.key: s for s in (
    Scenario("a", "one slow task", _a, RUN_S, steady=STEADY),
    Scenario("b", "slow component of 4 tasks", _b, RUN_S, steady=STEADY),
    Scenario("c", "fan-out, fast branch beside a slow one", _c, RUN_S, expect=lambda n: n % 4 == 0,
             steady=STEADY),
    Scenario("d", "on/off source", _d, RUN_S, steady=STEADY),
    Scenario("e", "capacity drops then recovers", _e, 8.0, recovery_at=3.0, offered=4_000.0,
             steady=((2.0, 3.0), (4.0, 8.0))),
    Scenario("f", "slow bolt behind a relay bolt", _f, RUN_S, steady=STEADY),
    Scenario("g", "2 ms pause every 1,000 tuples", _g, RUN_S, steady=STEADY),
)}


def _pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def parse_variant(text: str, variants: dict[str, dict[str, Any]]) -> tuple[str, dict[str, Any]]:
    """``--variant NAME=BASE[,KEY=VALUE...]``: a named variant made of a policy or variant and settings.

    ``NAME`` is ``<policy>+<word>`` (the policy is ``BASE``'s), new; every setting is checked by the
    config's own parser, so a mistake is one line naming the key and the value."""
    name, base, written = split_variant(text)
    if base not in POLICIES and base not in variants:
        raise ValueError(f"--variant {text!r}: unknown base {base!r} (known: {', '.join(POLICIES + tuple(variants))})")
    policy = base.split("+")[0]
    if not name.startswith(policy + "+") or len(name) == len(policy) + 1:
        raise ValueError(f"--variant {text!r}: the name must be {policy}+<word>, as its base runs {policy}")
    if name in variants or name in POLICIES:
        raise ValueError(f"--variant {text!r}: {name!r} is already a policy or variant")
    settings = dict(variants.get(base, {})) | written
    try:
        checked = resolve({**BASE, "backpressure.policy": policy, **settings})
    except ConfigError as e:
        raise ValueError(f"--variant {text!r}: {e}") from None
    return name, {k: checked[k] for k in settings}


async def run_cell(sc: Scenario, policy: str, acking: bool, warmup: float,
                   variants: dict[str, dict[str, Any]] = VARIANTS) -> dict[str, Any]:
    """One run of ``sc`` under ``policy``: the figures listed in the module docstring."""
    box = Box()
    box.warmup = warmup
    name = policy.split("+")[0]
    cfg = resolve({**BASE, "backpressure.policy": name, "acking": acking, **variants.get(policy, {})})
    engine = LocalEngine(sc.build(box, acking), cfg)
    tasks = {t.component: t for t in engine.tasks}
    spout, sink = tasks["spout"], [t for t in engine.tasks if t.component == "sink"]
    samples: list[tuple[float, int, int, int, float | None]] = []
    fast_samples: list[tuple[float, int]] = []       # (c) the fast bolt's executed count
    fast_task = tasks.get("fast")
    box.t0 = t0 = time.monotonic()
    cpu0 = time.process_time()

    async def sampler() -> None:
        while True:
            samples.append((time.monotonic() - t0, spout.stats.emitted, sum(s.executed_count() for s in sink),
                            sum(s.queue_bytes() for s in sink), spout.stats.rate_limit))
            if fast_task is not None:
                fast_samples.append((samples[-1][0], fast_task.executed_count()))
            await asyncio.sleep(SAMPLE_S)

    probe = asyncio.create_task(sampler())
    result = await engine.run(duration=sc.duration)
    cpu = (time.process_time() - cpu0) / max(1e-9, time.monotonic() - t0)
    probe.cancel()
    steady = [s for s in samples if warmup <= s[0] <= sc.duration]
    (ta, _, sa, _, _), (tb, _, sb, _, _) = steady[0], steady[-1]
    covs = [_cov(samples, lo, hi) for lo, hi in sc.cov_windows(warmup)]
    covs250 = [_cov(samples, lo, hi, EARLIER_BIN_S) for lo, hi in sc.cov_windows(warmup)]
    expected = {n for n in range(box.emitted) if sc.expect(n)}
    lost = len(expected - box.seen.get("sink", set()))
    if "fast" in tasks:
        lost += box.emitted - len(box.seen.get("fast", set()))
    hard = cfg["queue.hard_bound"]
    out: dict[str, Any] = {
        "policy": policy, "acking": acking, "sink_tps": round((sb - sa) / (tb - ta), 1), "lost": lost,
        "p50_ms": _ms(_pct(box.latency, 0.5)), "p99_ms": _ms(_pct(box.latency, 0.99)),
        "peak_queue": round(max(t.queue.peak_bytes for t in engine.tasks if t.queue is not None) / hard, 3),
        "rate_cov": None if None in covs else round(max(covs), 3),
        "rate_cov_all": _cov(samples, warmup, sc.duration),
        "rate_cov_250ms": None if None in covs250 else round(max(covs250), 3),
        "emitted": box.emitted, "owed": round(box.owed), "stop_reason": result.reason,
        "cpu": round(cpu, 2),     # the process's CPU seconds per second of the run (1.0: a whole core)
        "series": [(round(s[0], 3), s[1], s[3], s[4]) for s in samples],
    }
    if "fast" in tasks:
        f = tasks["fast"]
        out["fast_tps"] = round(len(box.seen.get("fast", ())) / max(1e-9, sc.duration), 1)
        out["fast_executed"] = f.executed_count()
        steady_fast = count_rate(fast_samples, warmup, sc.duration)
        out["fast_steady_tps"] = None if steady_fast is None else round(steady_fast, 1)
    if sc.recovery_at is not None:
        after = [s for s in samples if s[0] >= sc.recovery_at]
        off = next((s[0] for s in after if s[4] is None or s[4] >= 0.99 * (sc.offered or 0.0)), None)
        out["back_to_originv_s"] = None if off is None else round(off - sc.recovery_at, 2)
    return out


def _cov(samples: list[tuple[float, int, int, int, float | None]], lo: float, hi: float,
         bin_s: float | None = None) -> float | None:
    """CoV of the spout's emit rate in ``bin_s`` (default ``BIN_S``) bins between ``lo`` and ``hi`` seconds."""
    every = round((bin_s or BIN_S) / SAMPLE_S)
    bins = [s for s in samples if lo <= s[0] <= hi and round(s[0] / SAMPLE_S) % every == 0]
    rates = [(b[1] - a[1]) / (b[0] - a[0]) for a, b in zip(bins, bins[1:]) if b[0] > a[0]]
    mean = statistics.fmean(rates) if rates else 0.0
    return round(statistics.pstdev(rates) / mean, 3) if mean > 0 else None


def _ms(x: float | None) -> float | None:
    return None if x is None else round(1000.0 * x, 1)


def measure(keys: str, warmup: float, repeat: int, policies: tuple[str, ...],
            variants: dict[str, dict[str, Any]] = VARIANTS, repeated: tuple[str, ...] = REPEATED) -> dict[str, Any]:
    cells: list[dict[str, Any]] = []
    for key in keys:
        sc = SCENARIOS[key]
        for acking in (False, True):
            base: float | None = None
            for policy in policies:
                n = repeat if policy in repeated else 1
                runs = []
                try:
                    for _ in range(n):
                        print(f"  {key} {policy:<14} acking={'on' if acking else 'off'} ...", flush=True)
                        runs.append(uvloop.run(run_cell(sc, policy, acking, warmup, variants)))
                except ConfigError as e:        # window without acking: a row that cannot run
                    cells.append({"scenario": key, "title": sc.title, "policy": policy, "acking": acking,
                                  "runs": [], "not_run": str(e)})
                    continue
                if policy == "none":
                    base = statistics.fmean(r["sink_tps"] for r in runs)
                for r in runs:
                    r["goodput"] = round(r["sink_tps"] / base, 3) if base else None
                cells.append({"scenario": key, "title": sc.title, "policy": policy, "acking": acking,
                              "runs": runs, **_summary(runs)})
    for c in cells:                                    # fast branch against none's
        if c.get("fast_tps") is not None:
            ref = next(x for x in cells if x["scenario"] == c["scenario"] and x["acking"] == c["acking"]
                       and x["policy"] == "none")
            c["fast_ratio"] = round(c["fast_tps"] / ref["fast_tps"], 3) if ref["fast_tps"] else None
            steady = ref.get("fast_steady_tps")
            if c.get("fast_steady_tps") is not None and steady:
                c["fast_steady_ratio"] = round(c["fast_steady_tps"] / steady, 3)
    return {"marks": {k: BASE[k] for k in ("queue.high_mark", "queue.low_mark", "queue.hard_bound")},
            "sensitivity_ms": BASE["backpressure.sensitivity_ms"], "warmup_s": warmup, "repeat": repeat,
            "durations": {k: SCENARIOS[k].duration for k in keys}, "cov_bin_s": BIN_S,
            "cov_windows": {k: [list(w) for w in SCENARIOS[k].cov_windows(warmup)] for k in keys},
            "variants": variants, "python": platform.python_version(), "load": os.getloadavg(), "cells": cells}


_KEYS = ("goodput", "lost", "p50_ms", "p99_ms", "peak_queue", "rate_cov", "rate_cov_250ms", "back_to_originv_s",
         "fast_tps", "fast_steady_tps")


def _summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Median of the repeats per figure, and its spread (min, max) when repeated."""
    out: dict[str, Any] = {}
    for k in _KEYS:
        vals = [r[k] for r in runs if r.get(k) is not None]
        if k not in runs[0]:
            continue
        if not vals:
            out[k] = None
            continue
        out[k] = max(vals) if k in ("lost", "peak_queue") else statistics.median(vals)
        if len(vals) > 1:
            out[k + "_spread"] = [min(vals), max(vals)]
    return out


def table(report: dict[str, Any]) -> str:
    head = ("| s | acking | policy | lost | goodput | p50 ms | p99 ms | peak/bound | rate CoV | back s | fast "
            "| fast steady |")
    rows = [head, "|---" * (head.count("|") - 1) + "|"]
    for c in report["cells"]:
        if "not_run" in c:
            rows.append(f"| {c['scenario']} | {'on' if c['acking'] else 'off'} | {c['policy']} | "
                        f"cannot run: {c['not_run']} |" + " |" * 8)
            continue

        def f(k: str, fmt: str = "{:.2f}") -> str:
            v = c.get(k)
            if v is None:
                return "-"
            s = fmt.format(v)
            sp = c.get(k + "_spread")
            return s + (f" ({fmt.format(sp[0])}-{fmt.format(sp[1])})" if sp else "")
        fast = f("fast_ratio") if "fast_ratio" in c else "-"
        steady = f("fast_steady_ratio") if "fast_steady_ratio" in c else "-"
        rows.append(f"| {c['scenario']} | {'on' if c['acking'] else 'off'} | {c['policy']} | {c['lost']} | "
                    f"{f('goodput')} | {f('p50_ms', '{:.0f}')} | {f('p99_ms', '{:.0f}')} | "
                    f"{f('peak_queue')} | {f('rate_cov')} | {f('back_to_originv_s', '{:.1f}')} | {fast} | {steady} |")
    return "\n".join(rows)


def goals(report: dict[str, Any]) -> str:
    """Issue 10's goals per policy and named setting (``none`` is the capacity; ``source_stop``
    the reference of the p99 and CoV goals): in how many cells each holds, and where it does not."""
    cells = report["cells"]

    def ref(c: dict[str, Any], policy: str) -> dict[str, Any] | None:
        return next((x for x in cells if x["scenario"] == c["scenario"] and x["acking"] == c["acking"]
                     and x["policy"] == policy), None)

    checks: dict[str, Callable[[dict[str, Any]], bool | None]] = {
        "loses nothing": lambda c: c["lost"] == 0,
        "goodput >= 0.95": lambda c: c.get("goodput") is not None and c["goodput"] >= 0.95,
        "p99 <= source_stop's": lambda c: (None if (r := ref(c, "source_stop")) is None or r.get("p99_ms") is None
                                           or c.get("p99_ms") is None else c["p99_ms"] <= r["p99_ms"]),
        "rate CoV <= 1/3 source_stop's": lambda c: (None if (r := ref(c, "source_stop")) is None
                                                    or r.get("rate_cov") is None or c.get("rate_cov") is None
                                                    else c["rate_cov"] <= r["rate_cov"] / 3),
        "(c) fast branch >= 0.95": lambda c: None if "fast_ratio" not in c else c["fast_ratio"] >= 0.95,
        "(c) fast branch after the warmup >= 0.95": lambda c: (None if "fast_steady_ratio" not in c
                                                               else c["fast_steady_ratio"] >= 0.95),
        "peak queue <= bound": lambda c: c["peak_queue"] <= 1.0,
    }
    policies = [p for p in dict.fromkeys(c["policy"] for c in cells) if p != "none"]
    against_source_stop = ("p99 <= source_stop's", "rate CoV <= 1/3 source_stop's")
    rows = ["| goal | " + " | ".join(policies) + " |", "|---" * (len(policies) + 1) + "|"]
    for name, check in checks.items():
        row = [name]
        for p in policies:
            if p == "source_stop" and name in against_source_stop:
                row.append("reference")
                continue
            mine = [c for c in cells if c["policy"] == p and "not_run" not in c]
            verdicts = [(c, check(c)) for c in mine]
            judged = [(c, v) for c, v in verdicts if v is not None]
            missed = [f"{c['scenario']}{'+ack' if c['acking'] else ''}" for c, v in judged if not v]
            row.append(f"{len(judged) - len(missed)}/{len(judged)}" + (f" (not: {', '.join(missed)})" if missed else ""))
        rows.append("| " + " | ".join(row) + " |")
    return "\n".join(rows)


def paced_cov(rate: float, duration: float, warmup: float, bin_s: float | None = None) -> float | None:
    """The rate CoV a perfectly paced spout would score: ``rate`` tuples/s emitted up to 4 per call
    (as ``Source`` does), sampled every ``SAMPLE_S`` and binned as ``run_cell`` bins. What the
    binning alone adds to a rate that does not change (the resolution of the CoV goal)."""
    samples, i = [], 0
    while i * SAMPLE_S <= duration:
        t = i * SAMPLE_S
        samples.append((t, 4 * int(rate * t / 4), 0, 0, None))
        i += 1
    return _cov(samples, warmup, duration, bin_s)


def spout_rate(series: list[list[Any]], lo: float, hi: float) -> float | None:
    """Spout tuples/s between ``lo`` and ``hi`` seconds, from a run's stored ``series``."""
    return count_rate(series, lo, hi)


def count_rate(series: list[Any], lo: float, hi: float) -> float | None:
    """Per second, how far the count in column 1 of ``(t, count, ...)`` samples moved between ``lo`` and
    ``hi`` seconds (None: fewer than two samples there)."""
    s = [x for x in series if lo <= x[0] <= hi]
    return (s[-1][1] - s[0][1]) / (s[-1][0] - s[0][0]) if len(s) > 1 and s[-1][0] > s[0][0] else None


def _at(series: list[list[Any]], t: float) -> list[Any]:
    """The last stored sample at or before ``t`` seconds (the samples after the stop are the drain's)."""
    return [x for x in series if x[0] <= t][-1]


def report_windows(report: dict[str, Any]) -> tuple[dict[str, float], dict[str, list[tuple[float, float]]]]:
    """Each scenario's run length and the windows its rate CoV was read over, as the report's run had
    them (a report of an earlier matrix, without them: its 5 s runs, the CoV from the warmup on)."""
    warmup = report["warmup_s"]
    duration = dict(report.get("durations") or EARLIER_DURATIONS)
    earlier = {"e": [(2.0, 3.0), (4.0, 8.0)]}
    windows = {k: [tuple(w) for w in ws] for k, ws in (report.get("cov_windows") or {}).items()}
    for k, d in duration.items():
        windows.setdefault(k, earlier.get(k) or [(warmup, d)])
    return duration, windows    # type: ignore[return-value]


def diagnose(report: dict[str, Any], named: str = "stepwise+hops") -> str:
    """Whether the CoV and fast-branch goals measure what they name, read from a run's JSON.

    CoV: per cell the goal's threshold (a third of ``source_stop``'s), ``none``'s CoV (its spout
    waits only on the hard bound, so its rate is what the bottleneck served), the lowest CoV any
    stepwise run scored (a held limit), ``named``'s, and what a perfectly paced spout at ``named``'s
    mean rate scores in these bins. Fast branch: the goal's whole-run ratio against ``none``'s (and each run's),
    beside the spout's rate after the warmup against ``none``'s (the part of the whole-run figure
    that is not the queues filled before the warmup or still held at the stop), the tuples the spout
    had emitted by the warmup and the slow sink's queue at the stop (the last sample before it)."""
    cells, warmup = report["cells"], report["warmup_s"]
    duration, windows = report_windows(report)
    bin_s = report.get("cov_bin_s", EARLIER_BIN_S)

    def cell(c: dict[str, Any], policy: str) -> dict[str, Any] | None:
        return next((x for x in cells if x["scenario"] == c["scenario"] and x["acking"] == c["acking"]
                     and x["policy"] == policy and x.get("runs")), None)

    def fmt(v: float | None, f: str = "{:.3f}") -> str:
        return "-" if v is None else f.format(v)

    rows = ["| cell | 1/3 source_stop | none | lowest stepwise run | " + named + " | perfectly paced |",
            "|---|---|---|---|---|---|"]
    fast = ["| cell | policy | whole-run ratio (runs) | after-warmup ratio | emitted by warmup | slow queue at the stop KB |",
            "|---|---|---|---|---|---|"]
    for c in cells:
        if c["policy"] != "none" or not c.get("runs"):
            continue
        name = c["scenario"] + ("+ack" if c["acking"] else "")
        ss, me = cell(c, "source_stop"), cell(c, named)
        low = [r["rate_cov"] for p in ("stepwise", "stepwise+search", "stepwise+slopes", named)
               if (x := cell(c, p)) for r in x["runs"] if r.get("rate_cov") is not None]
        end = duration.get(c["scenario"], 0.0)
        lo, hi = windows[c["scenario"]][-1]
        rates = [v for r in (me or {}).get("runs", []) if (v := spout_rate(r["series"], lo, hi))]
        rows.append(f"| {name} | {fmt(ss and ss.get('rate_cov') and ss['rate_cov'] / 3)} | {fmt(c.get('rate_cov'))} | "
                    f"{fmt(min(low) if low else None)} | {fmt(me and me.get('rate_cov'))} | "
                    f"{fmt(paced_cov(statistics.fmean(rates), hi, lo, bin_s) if rates else None)} |")
        if c.get("fast_tps") is None:
            continue
        base = statistics.fmean(v for r in c["runs"] if (v := spout_rate(r["series"], warmup, end)))
        for x in cells:
            if x["scenario"] != c["scenario"] or x["acking"] != c["acking"] or not x.get("runs"):
                continue
            after = [v / base for r in x["runs"] if (v := spout_rate(r["series"], warmup, end))]
            by_warmup = [next((s[1] for s in r["series"] if s[0] >= warmup), None) for r in x["runs"]]
            whole = [r["fast_tps"] / c["fast_tps"] for r in x["runs"] if r.get("fast_tps") is not None]
            fast.append(f"| {name} | {x['policy']} | {fmt(x.get('fast_ratio'))} ({', '.join(fmt(w) for w in whole)}) | "
                        f"{', '.join(fmt(a) for a in after)} | {', '.join(str(b) for b in by_warmup)} | "
                        f"{', '.join(fmt(_at(r['series'], end)[2] / 1024, '{:.1f}') for r in x['runs'])} |")
    return "\n".join(rows) + ("\n\n" + "\n".join(fast) if len(fast) > 2 else "")


def plot(report: dict[str, Any], out_dir: Path) -> list[Path]:
    """One PNG per scenario (acking off): the spout's emit rate and the sink queue over time."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for key in sorted({c["scenario"] for c in report["cells"]}):
        fig, (ax_r, ax_q) = plt.subplots(2, 1, figsize=(8, 5), sharex=True)
        for c in report["cells"]:
            if c["scenario"] != key or c["acking"] or not c["runs"]:
                continue
            s = c["runs"][0]["series"]
            t = [x[0] for x in s]
            rate = [0.0] + [(b[1] - a[1]) / (b[0] - a[0]) if b[0] > a[0] else 0.0 for a, b in zip(s, s[1:])]
            k = 4     # smooth over 4 samples (200 ms)
            rate = [statistics.fmean(rate[max(0, i - k + 1):i + 1]) for i in range(len(rate))]
            ax_r.plot(t, rate, label=c["policy"], lw=1)
            ax_q.plot(t, [x[2] / 1024 for x in s], label=c["policy"], lw=1)
        ax_r.set_ylabel("spout tuples/s")
        ax_q.set_ylabel("sink queue KB")
        ax_q.axhline(128, color="k", lw=0.5, ls=":")
        ax_q.axhline(64, color="r", lw=0.5, ls=":")
        ax_q.set_xlabel("s")
        ax_r.legend(fontsize=7, ncol=5)
        ax_r.set_title(f"({key}) {SCENARIOS[key].title}, acking off")
        fig.tight_layout()
        p = out_dir / f"policy_comparison_{key}.png"
        fig.savefig(p, dpi=80)
        plt.close(fig)
        paths.append(p)
    return paths


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench policy_comparison")
    ap.add_argument("--scenarios", default="abcdefg", help="which scenarios (letters; commas allowed: c,e,f)")
    ap.add_argument("--warmup", type=float, default=1.5, help="seconds left out of the rates and latencies")
    ap.add_argument("--repeat", type=int, default=2,
                    help="runs of each none, source_stop, stepwise and named-combination cell (spread reported)")
    ap.add_argument("--policies", help="comma-separated policies and variants to run (default: all); "
                    "none and source_stop are added when missing, as goodput and the goals are read against them")
    ap.add_argument("--quick", action="store_true", help="scenarios a, c, e; stepwise once; no variants")
    ap.add_argument("--out", default=str(RESULTS), help="directory for the JSON and PNGs")
    ap.add_argument("--report", metavar="JSON", help="print the tables of an earlier run; run nothing")
    ap.add_argument("--variant", action="append", default=[], metavar="NAME=BASE[,KEY=VALUE...]",
                    help="also run a variant made of a policy or variant and settings, repeated as the named "
                    "ones (e.g. stepwise+blw=stepwise+recent,backpressure.bracket_light_window_ms=200); "
                    "may be given more than once")
    args = ap.parse_args(argv if argv is not None else [])
    if args.report:
        done = json.loads(Path(args.report).read_text())
        print(table(done))
        print()
        print(goals(done))
        print()
        print(diagnose(done))
        return
    policies = POLICIES + MATRIX_VARIANTS
    keys, repeat = args.scenarios.replace(",", "").strip(), args.repeat
    unknown_keys = [k for k in keys if k not in SCENARIOS]
    if unknown_keys or not keys:
        ap.error(f"--scenarios: unknown scenario {unknown_keys[0] if unknown_keys else keys!r} (known: {''.join(SCENARIOS)})")
    if args.quick:
        keys, repeat, policies = "ace", 1, POLICIES
    variants, extra = dict(VARIANTS), []
    for text in args.variant:
        try:
            name, settings = parse_variant(text, variants)
        except ValueError as e:
            ap.error(str(e))
        variants[name] = settings
        extra.append(name)
    if args.policies:
        chosen = tuple(dict.fromkeys(p.strip() for p in args.policies.split(",") if p.strip()))
        unknown = [p for p in chosen if p not in POLICIES + tuple(variants)]
        if unknown:
            ap.error(f"--policies: unknown policy or variant {unknown[0]!r} (known: {', '.join(POLICIES + tuple(variants))})")
        policies = ("none", "source_stop") + tuple(p for p in chosen if p not in ("none", "source_stop"))
    policies += tuple(n for n in extra if n not in policies)
    report = measure(keys, args.warmup, repeat, policies, variants, REPEATED + tuple(extra))
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    plot(report, out_dir)
    for c in report["cells"]:
        for r in c.get("runs", []):
            r["series"] = r["series"][::2]        # keep the JSON small: 100 ms resolution
    partial = args.policies or args.variant or set(keys) != set(SCENARIOS)
    name = ("policy_comparison_quick.json" if args.quick
            else "policy_comparison_partial.json" if partial else "policy_comparison.json")
    report = stamp(report, "policy_comparison")
    (out_dir / name).write_text(json.dumps(report, indent=1) + "\n")
    print(table(report))
    print()
    print(goals(report))
    print(f"wrote {out_dir / name}")


if __name__ == "__main__":
    main(sys.argv[1:])
