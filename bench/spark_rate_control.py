"""Document 001's experiment on the Spark engine: fixed cap vs DStream PID vs doc 001,
on a steady bursty source and on one whose capacity drops halfway through each run.

Setup, as in the document (figures 9 and 10), scaled to the machine:

* a bursty synthetic source: ``per_period`` records in the first half of every 10 s
  period and none in the second (the document's 600,000 records; ``--per-period``),
  ``--periods`` bursts per run (4), the same seeded rows and burst times for every
  controller; each run lasts until all of them are processed (or ``--drain-cap`` s
  after the last arrives), so every controller does the same work;
* a 1 s trigger; one stateless bolt whose work is linear in the record (a Python hash
  over the payload, 16..256 characters, ``--work`` rounds per character);
* the controllers, each run on the same topology and source: ``fixed`` (a static cap,
  Spark's ``maxRatePerPartition`` / ``maxOffsetsPerTrigger``, set as a user sets it:
  at the capacity measured before the run), ``pid`` (Spark's DStream
  ``PIDRateEstimator`` rules) and ``doc001`` (document 001's controller), on one
  shared ``local[2]`` session after a warm-up run.

Two scenarios, run in the same process with every controller interleaved:

* ``steady``: the bursty source above;
* ``capacity_drop``: the same source, but the per-row time doubles halfway through
  the source's bursts, so the capacity halves under a running query and the ``fixed``
  cap, set from the capacity measured before, is twice too high. Doubling the hash
  rounds does not double a row's time (the hash is part of it; Spark's conversions and
  the Python workers' the rest: full batches were 1-47% slower), so each round measures
  the marginal per-row time with eight times the rounds too (twice the rounds changed it
  by less than the noise between two runs) and multiplies the rounds by the factor that
  doubles it (``drop_factor_for``; ``--drop-factor`` fixes it instead).
  Every run of the round gets the same factor at the same point of its source, and each
  run's ``capacity_ratio`` (marginal per-row time before the drop over after, with the
  round's fixed cost taken off every batch; 0.5 = halved) checks it per controller.

The document's source is sized against its cluster (the burst exceeds the average
processing rate, the average does not); here ``calibrate`` measures the rate this
machine sustains with one-interval batches (from two runs of fixed batch sizes), before
every round of runs (others' load moves it by an order of magnitude within minutes) and,
unless ``--per-period`` is given,
sizes the burst at ``burst_factor`` (1.6) times it, so the backlog a burst builds
drains in the quiet half (the average is 0.8 times capacity).

**Repeats until the figures hold.** Rounds of runs (every scenario x controller, in
an order rotated each round, since the machine's load drifts) are added until every
controller's 95% confidence half-width of its mean scheduling delay over the repeats
is under ``--target-ci`` (20%) of that mean, or until another round would end past
``--time-cap`` seconds (40 min) from the start (then the output and the JSON say which
did not get there).

Reported per scenario and controller (``scenarios.<s>.summary.<controller>``): mean,
ci95 and p95 scheduling delay (derived from trigger times, ``runtime.spark.listener``)
and processing time, over the batches after the warm-up (the first burst's ramp from
slow start); throughput (source rows processed / run time, whole runs: with the same
rows offered to every controller and each run lasting until they are processed, a
backlog costs its controller time, not rows dropped uncounted at a fixed end), the
fraction of the offered rows processed, rows still waiting at the end and the runs the
drain cap stopped (``runs_not_drained``). ``capacity_drop`` also
has ``after_drop``: the same figures over the batches that started after the drop.
``main()`` writes ``bench/results/spark_rate_control.json`` and one PNG per scenario
(``spark_rate_control_<scenario>.png``: every controller's scheduling delay and batch
size over time on shared axes). The document: 106.18 ms -> 62.89 ms mean scheduling
delay (0.59x); the goals here: doc001 <= 0.6x pid's mean in both scenarios, <= 0.3x
fixed's after the drop, throughput within 5% of the best controller; each goal's ratio is
of the means over all repeats, and ``rounds_met`` says in how many rounds it held alone.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from bench import environment
from bench import spark_time_shares as time_shares
from bench.environment import stamp
from bench.variant_text import split_variant
from topo.api import Bolt, Tuple
from topo.config import ConfigError, resolve
from topo.sources import Bursty, SyntheticSpout
from topo.topology import Topology, TopologyBuilder

RESULTS = Path(__file__).parent / "results"
PERIOD_S = 10.0   # the bursty source's period (a burst in its first half)


def offered_span(periods: int) -> float:
    """Seconds from a run's start until its source's last row arrives (the last burst ends
    half a period before the last period does); the capacity drop comes at half of it."""
    return PERIOD_S * periods - PERIOD_S / 2
CONTROLLERS = ("fixed", "pid", "doc001")
SCENARIOS = ("steady", "capacity_drop")
# Two-sided 95% Student t quantiles by degrees of freedom (1..30); 1.96 beyond.
T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
        2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
        2.045, 2.042)


class LinearWork(Bolt):
    """Work linear in the record: ``rounds`` passes of a multiplicative hash per character,
    ``rounds * factor`` (a fraction of a pass counts) from the wall-clock time ``slow_from`` on (the capacity drop;
    Spark runs the bolt in its Python workers, so the switch is a time, not a call)."""

    outputs: list[str] = []

    def __init__(self, rounds: int = 1, factor: float = 1.0, slow_from: float = math.inf) -> None:
        self.rounds = rounds
        self.factor = factor
        self.slow_from = slow_from

    def work_bytes(self, text: str) -> bytes:
        """The bytes one record's hash passes over: ``rounds`` copies of it (``rounds *
        factor`` after the drop), a fractional factor taking that share of the last copy."""
        rounds = self.rounds * self.factor if time.time() >= self.slow_from else self.rounds
        data = text.encode() * math.ceil(rounds)
        if rounds != int(rounds):
            data = data[:round(len(text.encode()) * rounds)]
        return data

    def execute(self, tup: Tuple) -> None:
        h = 0
        for b in self.work_bytes(tup[1]):
            h = (h * 31 + b) & 0xFFFFFFFF
        self.last = h


def topology(per_period: int, rounds: int, partitions: int, total: int | None = None,
             profile: str = "bursty", rate: float = 0.0, factor: float = 1.0,
             slow_from: float = math.inf) -> Topology:
    b = TopologyBuilder("spark-rate-control")
    if profile == "bursty":
        spout = SyntheticSpout("bursty", per_period=per_period, period=PERIOD_S, burst_fraction=0.5,
                               partitions=partitions, total=total)
    else:
        spout = SyntheticSpout("constant", rate=rate, partitions=partitions, total=total)
    b.spout("source", spout)
    b.bolt("work", LinearWork(rounds, factor, slow_from), 2).shuffle("source")
    return b.build()


def base_config(interval_ms: float) -> dict[str, Any]:
    return {"spark.trigger_interval_ms": interval_ms, "spark.sink": "none"}


def parse_variant(text: str, known: Sequence[str] = ()) -> tuple[str, str, dict[str, Any]]:
    """``--variant NAME=BASE,KEY=VALUE...``: a controller run with settings of its own, beside
    the others (for example ``doc001+s1=doc001,spark.smooth_batches=1``). ``NAME`` is
    ``<base>+<word>``; every setting is checked by the config's own parser, so a mistake is
    one line naming the key and the value. Returns (name, base, the checked settings)."""
    name, base, settings = split_variant(text)
    if base not in CONTROLLERS:
        raise ValueError(f"--variant {text!r}: unknown base {base!r} (known: {', '.join(CONTROLLERS)})")
    if not name.startswith(base + "+") or len(name) == len(base) + 1:
        raise ValueError(f"--variant {text!r}: the name must be {base}+<word>, as it runs {base}")
    if name in known:
        raise ValueError(f"--variant {text!r}: {name!r} is named twice")
    if not settings:
        raise ValueError(f"--variant {text!r}: no setting (it would run {base} again)")
    try:
        checked = resolve({**base_config(1000.0), "spark.rate_control": base, **settings})
    except ConfigError as e:
        raise ValueError(f"--variant {text!r}: {e}") from None
    return name, base, {k: checked[k] for k in settings}


def fit_overhead(batches: Sequence[Any]) -> tuple[float, float]:
    """Least squares ``processing_time = a + rows / c``: ``(a, c)`` (fixed cost s, rows/s)."""
    xs = [float(b.rows) for b in batches]
    ys = [b.processing_time for b in batches]
    if len(xs) < 3 or max(xs) == min(xs):
        return 0.0, (sum(xs) / sum(ys)) if sum(ys) > 0 else 0.0
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    if slope <= 0:
        return 0.0, mx / my
    return max(0.0, my - slope * mx), 1.0 / slope


CALIBRATION_SIZES = (8_000, 40_000)   # rows per batch of the two calibration runs
DROP_PROBE = 8                        # the drop calibration runs this many times the hash rounds
DROP_FACTOR_RANGE = (2.0, 12.0)       # the factor it may choose


def marginal_row_time(batches: Sequence[Any], fixed_cost: float, min_share: float = 0.25) -> float | None:
    """Seconds of processing per row beyond the fixed cost, rows-weighted over the batches
    of at least ``min_share`` of the largest one's rows (in a small batch an error in the
    fixed cost outweighs the rows); ``None`` without any."""
    largest = max((b.rows for b in batches), default=0)
    full = [b for b in batches if b.rows > 0 and b.rows >= min_share * largest]
    rows = sum(b.rows for b in full)
    return sum(b.processing_time - fixed_cost for b in full) / rows if rows else None


def drop_factor_for(base: float, probed: float | None, probe: int = DROP_PROBE,
                    bounds: tuple[float, float] = DROP_FACTOR_RANGE) -> float:
    """The hash-round factor that doubles the marginal per-row time ``base`` (s/row), from
    ``probed``, the time with ``probe`` times the rounds: a row costs ``o + f * h`` (``h``
    the hash at one round), so ``f = 1 + base / h`` with ``h = (probed - base) / (probe - 1)``.
    No measurable hash (``h <= 0``, noise) gives the upper bound; rounded to a tenth."""
    h = (probed - base) / (probe - 1) if probed is not None else 0.0
    if h <= 0:
        return float(bounds[1])
    return round(min(max(1 + base / h, bounds[0]), bounds[1]), 1)


def calibrate(spark: Any, rounds: int, partitions: int, interval_ms: float, seconds: float = 20.0,
              sizes: Sequence[int] = CALIBRATION_SIZES, min_batches: int = 3,
              attempts: int = 3) -> tuple[float, float, float]:
    """The rate (rows/s) this machine sustains with batches of one interval, with the
    fit it came from: ``(rate, a, c)``.

    Runs ``fixed`` caps of ``sizes`` rows per batch, ``seconds`` each, on a source that
    always has more than enough data, fits ``processing_time = a + rows / c`` over the
    batches after each run's first, and returns ``c * (t_interval - a) / t_interval``:
    the rows per second that fill an interval once the fixed per-batch cost is paid.
    (A rate controller would choose the sizes itself: under load the DStream PID shrank
    its batches to a few hundred rows, all fixed cost, and the fit said 630 rows/s.)
    A round whose fit has fewer than ``min_batches`` batches of a size, or no positive
    slope, is run again, up to ``attempts`` times.
    """
    from runtime.spark import engine

    interval_s = interval_ms / 1000.0
    topo = topology(0, rounds, partitions, profile="constant", rate=1e7)
    for _ in range(attempts):
        batches: list[Any] = []
        enough = True
        for size in sizes:
            cfg = base_config(interval_ms) | {"spark.rate_control": "fixed",
                                              "spark.max_rate_per_partition": size / interval_s / partitions}
            got = engine.run(topo, cfg, spark=spark, duration=seconds).batches[1:]   # the first: the query's start
            enough = enough and len(got) >= min_batches
            batches += got
        a, c = fit_overhead(batches)
        print(f"calibration: {len(batches)} batches of {' and '.join(f'{n:,}' for n in sizes)} rows, fixed cost "
              f"{a * 1000:.0f} ms, {c:.0f} rows/s marginal", flush=True)
        if enough and c * (interval_s - a) > 0:
            return c * (interval_s - a) / interval_s, a, c
        print("calibration: not enough batches of each size, or no fit; again", flush=True)
    raise RuntimeError(f"calibration: no fit in {attempts} rounds of {len(sizes)} runs of {seconds:.0f} s; the "
                       "machine is too loaded for this bench (see the load average)")


def calibrate_drop(spark: Any, rounds: int, partitions: int, interval_ms: float, fixed_cost: float,
                   marginal: float, seconds: float = 12.0, size: int = CALIBRATION_SIZES[-1]) -> tuple[float, float | None]:
    """The drop factor for this round (``drop_factor_for``) from one run of ``size``-row
    batches at ``DROP_PROBE`` times the rounds: ``(factor, probed s/row)``."""
    from runtime.spark import engine

    interval_s = interval_ms / 1000.0
    topo = topology(0, rounds * DROP_PROBE, partitions, profile="constant", rate=1e7)
    cfg = base_config(interval_ms) | {"spark.rate_control": "fixed",
                                      "spark.max_rate_per_partition": size / interval_s / partitions}
    probed = marginal_row_time(engine.run(topo, cfg, spark=spark, duration=seconds).batches[1:], fixed_cost)
    factor = drop_factor_for(1.0 / marginal, probed)
    print(f"drop calibration: {1e6 / marginal:.1f} us/row, {'-' if probed is None else f'{1e6 * probed:.1f}'} "
          f"us/row at {DROP_PROBE}x the rounds: the drop multiplies them by {factor}", flush=True)
    return factor, probed


def warm_up(spark: Any, rounds: int, partitions: int, interval_ms: float, seconds: float = 15.0) -> None:
    """One throw-away run: Spark's Python workers and the source runner start here."""
    from runtime.spark import engine

    topo = topology(0, rounds, partitions, profile="constant", rate=1e5)
    engine.run(topo, base_config(interval_ms) | {"spark.rate_control": "pid"}, spark=spark, duration=seconds)


def run_controller(spark: Any, name: str, scenario: str, per_period: int, rounds: int, partitions: int,
                   periods: int, drain_cap: float, capacity: float, interval_ms: float, warmup: float,
                   drop_factor: float, fixed_cost: float = 0.0,
                   variant: tuple[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """One run over the same work for every controller: the source offers ``periods``
    bursts (``periods * per_period`` rows, the last burst ending at ``10 * periods - 5`` s)
    and the run lasts until every row is processed, or ``drain_cap`` seconds after the
    source's end. Throughput is the rows processed over the run's time, so a controller
    that leaves a backlog pays for it in time instead of the backlog being dropped
    uncounted at a fixed end. Delay figures are over the batches after ``warmup`` s.
    ``capacity_drop`` runs also get ``capacity_ratio``: the marginal per-row time (less
    ``fixed_cost``) of the batches after the warm-up that ended before the drop over that
    of the batches that started after it (0.5: the capacity halved)."""
    from runtime.spark import engine

    base, settings = variant or (name, {})
    cfg = base_config(interval_ms) | {"spark.rate_control": base} | settings
    if base == "fixed":
        cfg["spark.max_rate_per_partition"] = capacity / partitions
    span = offered_span(periods)
    drop_at = time.time() + span / 2 if scenario == "capacity_drop" else math.inf
    total = per_period * periods
    topo = topology(per_period, rounds, partitions, total=total, factor=drop_factor, slow_from=drop_at)
    result = engine.run(topo, cfg, spark=spark, duration=span + drain_cap)
    first = min((b.submit for b in result.batches), default=0.0)
    kept = [b for b in result.batches if b.start >= first + warmup]
    offered = min(total, Bursty(per_period).count_at(result.elapsed))
    run = {"batches": [b.as_dict() for b in result.batches], "kept": kept, "elapsed_s": result.elapsed,
           "rows": result.input_rows, "offered": offered, "total_rows": total,
           "drained": result.input_rows >= total, "window_s": max(result.elapsed - warmup, 1e-9),
           "backlog_rows": max(0, offered - result.input_rows), "first_submit": first,
           "interval_s": interval_ms / 1000.0}
    if scenario == "capacity_drop":
        after = [b for b in kept if b.start >= drop_at]
        last_end = max((b.end for b in result.batches), default=drop_at)
        before = marginal_row_time([b for b in kept if b.end < drop_at], fixed_cost)
        later = marginal_row_time(after, fixed_cost)
        run |= {"drop_at_s": drop_at - first, "drop_at": drop_at, "after_drop": after,
                "after_drop_window_s": max(last_end - drop_at, 1e-9), "drop_factor": drop_factor,
                "capacity_ratio": before / later if before and later and before > 0 and later > 0 else None}
    return run


RUN_FIELDS = ("round", "first_submit", "drop_at", "elapsed_s", "rows", "drained", "capacity_ratio")
CALIBRATION_SPREAD = 0.25   # a round's capacity this far from the rounds' median is flagged


def calibration_outliers(rounds: Sequence[dict[str, Any]], spread: float = CALIBRATION_SPREAD) -> list[dict[str, Any]]:
    """Rounds whose calibrated capacity lies more than ``spread`` from the median of every
    round's: a round sized from a stale or disturbed calibration tests another regime (its
    source too large or too small for the machine), which the goals per round should show."""
    if len(rounds) < 3:
        return []
    median = statistics.median(r["capacity_rows_per_s"] for r in rounds)
    return [{"round": i, "capacity_rows_per_s": r["capacity_rows_per_s"], "median_rows_per_s": median}
            for i, r in enumerate(rounds) if abs(r["capacity_rows_per_s"] / median - 1.0) > spread]


def ci95(values: Sequence[float]) -> float:
    """Half-width of the 95% confidence interval of the mean of ``values`` (Student t)."""
    n = len(values)
    if n < 2:
        return math.inf
    t = T975[n - 2] if n - 1 <= len(T975) else 1.96
    return t * statistics.stdev(values) / math.sqrt(n)


def aggregate(runs: list[dict[str, Any]], part: str = "kept", window: str = "window_s") -> dict[str, Any]:
    """Figures over the ``part`` batches of every repeat of one controller; the ci95 is
    over the repeats' own means."""
    from runtime.spark.engine import summarize

    kept = [b for r in runs for b in r[part]]
    out = summarize(kept, sum(r[window] for r in runs))
    if part == "kept":
        # Throughput over whole runs: rows processed / run time, every run offered the same
        # rows and lasting until they are processed (``run_controller``), so a backlog costs
        # time; a window would count the backlog the warm-up left behind as its throughput.
        out["throughput_rows_per_s"] = sum(r["rows"] for r in runs) / sum(r["elapsed_s"] for r in runs)
        out["runs_not_drained"] = sum(1 for r in runs if not r.get("drained", True))
        out["per_run_throughput_rows_per_s"] = [r["rows"] / r["elapsed_s"] for r in runs]
        out["processed_fraction_of_offered"] = sum(r["rows"] for r in runs) / max(1, sum(r["offered"] for r in runs))
        out["backlog_rows_at_end"] = [r["backlog_rows"] for r in runs]
    del out["input_rows"], out["elapsed_s"]
    cases: dict[str, int] = {}
    for b in kept:
        case = b.case_by_source.get("source")
        if case is not None:
            cases[str(case)] = cases.get(str(case), 0) + 1
    if cases:
        out["doc001_cases"] = dict(sorted(cases.items()))
    # Where a trigger's time goes (Spark's durationMs): the per-batch cost no cap changes
    # (the offset and commit logs, planning) beside the batch's own work (addBatch).
    parts: dict[str, list[float]] = {}
    for b in kept:
        for key, ms in b.duration_ms.items():
            parts.setdefault(key, []).append(ms)
    out["trigger_time_mean_ms"] = {k: statistics.fmean(v) for k, v in sorted(parts.items())}
    # Why batches wait: a batch that ends past the next boundary delays the next one.
    procs = [b.processing_time for b in kept]
    out["processing_time_sd_ms"] = 1000 * statistics.pstdev(procs) if procs else 0.0
    out["batches_past_next_boundary"] = sum(
        1 for r in runs for b in r[part] if b.scheduling_delay + b.processing_time > r.get("interval_s", 1.0))
    per_run = [summarize(r[part], r[window])["scheduling_delay_mean_ms"] for r in runs]
    out["per_run_scheduling_delay_mean_ms"] = per_run
    # Where a run's mean comes from: the share of its delay in its three most delayed batches.
    out["per_run_top3_delay_share"] = [top_share(r[part]) for r in runs]
    ratios = [r["capacity_ratio"] for r in runs if r.get("capacity_ratio") is not None]
    if part == "kept" and ratios:
        out["capacity_ratio_per_run"] = ratios
        out["capacity_ratio_mean"] = statistics.fmean(ratios)
    out["repeats"] = len(runs)
    # The mean of the run means (each run weighs the same), and its 95% half-width.
    out["scheduling_delay_mean_over_batches_ms"] = out["scheduling_delay_mean_ms"]
    out["scheduling_delay_mean_ms"] = statistics.fmean(per_run) if per_run else 0.0
    out["scheduling_delay_ci95_ms"] = ci95(per_run) if len(per_run) >= 2 else None
    return out


def top_share(batches: Sequence[Any], k: int = 3) -> float | None:
    """The share of the batches' summed scheduling delay in their ``k`` largest; ``None``
    with no delay at all."""
    delays = sorted((b.scheduling_delay for b in batches), reverse=True)
    total = sum(delays)
    return sum(delays[:k]) / total if total > 0 else None


def unsettled(summaries: dict[str, dict[str, dict[str, Any]]], target: float) -> list[str]:
    """``scenario/controller`` pairs whose ci95 is not yet under ``target`` x their mean."""
    out = []
    for scenario, by_controller in summaries.items():
        for name, s in by_controller.items():
            half = s.get("scheduling_delay_ci95_ms")
            if half is None or not half < target * s["scheduling_delay_mean_ms"]:
                out.append(f"{scenario}/{name}")
    return out


def goals(scenarios: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The issue's goals, each with its measured ratio (of the means over all repeats) and
    whether it holds; ``rounds_met`` / ``rounds``: in how many rounds the same ratio, from
    that round's runs alone, held (others' load moves every controller's figures between
    rounds together, so a ratio per round says more about a goal than the ci95 of each
    controller's mean)."""
    out: dict[str, Any] = {}

    def ratio(a: float, b: float) -> float | None:
        return a / b if b else None

    def goal(a: Sequence[float], b: Sequence[float], met: Callable[[float], bool], ra: float, rb: float) -> dict[str, Any]:
        r = ratio(ra, rb)
        per_round = [x for x in (ratio(u, v) for u, v in zip(a, b)) if x is not None]
        # Paired by round, the load the rounds share drops out of the spread.
        half = ci95(per_round) if len(per_round) >= 2 else None
        return {"ratio": r, "met": r is not None and met(r), "rounds_met": sum(1 for x in per_round if met(x)),
                "rounds": len(per_round), "per_round": per_round,
                "per_round_mean": statistics.fmean(per_round) if per_round else None,
                "per_round_ci95": None if half is None or math.isinf(half) else half}

    def delay(x: dict[str, Any]) -> list[float]:
        return x["per_run_scheduling_delay_mean_ms"]

    for scenario, data in scenarios.items():
        s = data["summary"]
        if not {"doc001", "pid"} <= set(s):
            continue
        out[f"{scenario}: doc001 / pid mean scheduling delay <= 0.6"] = goal(
            delay(s["doc001"]), delay(s["pid"]), lambda r: r <= 0.6,
            s["doc001"]["scheduling_delay_mean_ms"], s["pid"]["scheduling_delay_mean_ms"])
        best = max(x["throughput_rows_per_s"] for x in s.values())
        best_per_round = [max(t) for t in zip(*(x["per_run_throughput_rows_per_s"] for x in s.values()))]
        out[f"{scenario}: doc001 throughput >= 0.95 x best"] = goal(
            s["doc001"]["per_run_throughput_rows_per_s"], best_per_round, lambda r: r >= 0.95,
            s["doc001"]["throughput_rows_per_s"], best)
        after = data.get("after_drop")
        if after and {"doc001", "fixed"} <= set(after):
            out[f"{scenario}: doc001 / fixed mean scheduling delay after the drop <= 0.3"] = goal(
                delay(after["doc001"]), delay(after["fixed"]), lambda r: r <= 0.3,
                after["doc001"]["scheduling_delay_mean_ms"], after["fixed"]["scheduling_delay_mean_ms"])
    return out


def plot(scenario: str, runs: dict[str, dict[str, Any]], summaries: dict[str, Any], path: Path) -> None:
    """Every controller's scheduling delay and batch size over time, on shared axes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 1, figsize=(11, 7), sharex=True)
    colours = {"fixed": "tab:grey", "pid": "tab:blue", "doc001": "tab:red"}
    for name, run in runs.items():
        batches = run["batches"]
        if not batches:
            continue
        t0 = run["first_submit"]
        t = [b["start"] - t0 for b in batches]
        s = summaries[name]
        label = f"{name} (mean {s['scheduling_delay_mean_ms']:.0f} ms over all repeats)"
        c = colours.get(name)
        axes[0].plot(t, [1000 * b["scheduling_delay"] for b in batches], marker=".", color=c, label=label)
        axes[1].plot(t, [b["rows"] for b in batches], marker=".", color=c, label=name)
        if "drop_at_s" in run:
            for ax in axes:
                ax.axvline(run["drop_at_s"], color=c, linestyle=":", linewidth=0.8)
    axes[0].set_ylabel("scheduling delay (ms)")
    axes[0].legend(loc="upper left")
    axes[1].set_ylabel("rows in batch")
    axes[1].set_xlabel("seconds since first submission (first repeat of each controller)")
    title = f"{scenario}: scheduling delay and batch size per batch"
    if scenario == "capacity_drop":
        title += " (dotted: per-row work doubles)"
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true",
                   help="CI-sized: 2 periods per run, 5 s warm-up, 2 repeats, 4 min cap (figures will not hold)")
    p.add_argument("--periods", type=int, default=4,
                   help="bursts (10 s periods) the source offers per run; the run lasts until they are processed")
    p.add_argument("--drain-cap", type=float, default=20.0,
                   help="seconds a run may go on after the source's last row to process its backlog")
    p.add_argument("--calibration-s", type=float, default=12.0, help="seconds per calibration run (two per round)")
    p.add_argument("--per-period", type=int, default=0, help="records per 10 s period; 0 = calibrate")
    p.add_argument("--burst-factor", type=float, default=1.6, help="burst rate / measured capacity")
    p.add_argument("--work", type=int, default=1, help="hash rounds per payload character")
    p.add_argument("--drop-factor", type=float, default=0.0,
                   help="capacity_drop: the hash rounds are multiplied by this; 0 = measured each round to double "
                        "the per-row time")
    p.add_argument("--partitions", type=int, default=2)
    p.add_argument("--interval-ms", type=float, default=1000.0)
    p.add_argument("--warmup", type=float, default=10.0, help="seconds of each run left out of the figures")
    p.add_argument("--min-repeats", type=int, default=3, help="runs per scenario x controller before stopping")
    p.add_argument("--max-repeats", type=int, default=50)
    p.add_argument("--target-ci", type=float, default=0.2, help="stop when every ci95 < this x its mean")
    p.add_argument("--time-cap", type=float, default=2400.0,
                   help="seconds from the start: no round starts that would end after this (by the last round's length)")
    p.add_argument("--controllers", default=",".join(CONTROLLERS))
    p.add_argument("--variant", action="append", default=[], metavar="NAME=BASE,KEY=VALUE...",
                   help="also run a controller with settings of its own, e.g. doc001+s1=doc001,spark.smooth_batches=1")
    p.add_argument("--scenarios", default=",".join(SCENARIOS))
    p.add_argument("--master", default="local[2]")
    p.add_argument("--out-dir", type=Path, default=RESULTS,
                   help="where the JSON and the PNGs go (tuning runs: elsewhere than the reported results)")
    a = p.parse_args(list(argv or []))
    if a.quick:
        a.periods, a.warmup, a.min_repeats, a.max_repeats, a.time_cap = 2, 5.0, 2, 2, 240.0
    if a.periods < 1:
        p.error(f"--periods: must be >= 1, got {a.periods}")
    if a.drop_factor < 0:
        p.error(f"--drop-factor: must be >= 0 (0 = measured), got {a.drop_factor}")
    for name in a.controllers.split(","):
        if name not in CONTROLLERS:
            p.error(f"--controllers: unknown controller {name!r}; expected some of {', '.join(CONTROLLERS)}")
    for name in a.scenarios.split(","):
        if name not in SCENARIOS:
            p.error(f"--scenarios: unknown scenario {name!r}; expected some of {', '.join(SCENARIOS)}")
    a.variants = {}
    for text in a.variant:
        try:
            name, base, settings = parse_variant(text, [*a.controllers.split(","), *a.variants])
        except ValueError as e:
            p.error(str(e))
        a.variants[name] = (base, settings)
    return a


def summarize_all(runs: dict[str, dict[str, list[dict[str, Any]]]]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for scenario, by_controller in runs.items():
        out[scenario] = {"summary": {n: aggregate(rs) for n, rs in by_controller.items()}}
        if scenario == "capacity_drop":
            out[scenario]["after_drop"] = {n: aggregate(rs, "after_drop", "after_drop_window_s")
                                           for n, rs in by_controller.items()}
    return out


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    a = parse_args(argv)
    from runtime.spark.session import get_session

    began = time.time()
    load_start = os.getloadavg()
    commit = environment.commit()   # the code measured: read now, others may commit while it runs
    names, scenarios = a.controllers.split(",") + list(a.variants), a.scenarios.split(",")
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {s: {n: [] for n in names} for s in scenarios}
    pairs = [(s, n) for s in scenarios for n in names]
    stop_reason = "max_repeats"
    rounds_setup: list[dict[str, float]] = []
    spark = get_session(a.master, shuffle_partitions=2, log_level="ERROR")
    try:
        warm_up(spark, a.work, a.partitions, a.interval_ms)
        round_started = time.time()
        for r in range(a.max_repeats):
            # The capacity is measured again before every round: others' load on the
            # machine moves it by an order of magnitude within minutes, and a cap or a
            # source sized from a stale figure would test a different regime. ``fixed``
            # gets it as a user sets a static cap: from a measurement just before.
            capacity, fixed_cost, marginal = calibrate(spark, a.work, a.partitions, a.interval_ms, a.calibration_s)
            per_period = a.per_period or int(capacity * a.burst_factor * 5.0)
            drop_factor, probed = a.drop_factor, None
            if a.drop_factor == 0 and "capacity_drop" in scenarios:
                drop_factor, probed = calibrate_drop(spark, a.work, a.partitions, a.interval_ms, fixed_cost, marginal,
                                                     a.calibration_s)
            rounds_setup.append({"capacity_rows_per_s": capacity, "per_period": per_period,
                                 "fixed_cost_per_batch_s": fixed_cost, "marginal_rows_per_s": marginal,
                                 "drop_factor": drop_factor, "probed_row_time_s": probed,
                                 "load_average_1min": os.getloadavg()[0]})
            print(f"round {r + 1}: capacity ~{capacity:.0f} rows/s; bursty source: {per_period} records in the "
                  "first 5 s of every 10 s", flush=True)
            k = r % len(pairs)
            for scenario, name in pairs[k:] + pairs[:k]:   # rotate: the machine's load drifts
                run = run_controller(spark, name, scenario, per_period, a.work, a.partitions, a.periods,
                                     a.drain_cap, capacity, a.interval_ms, a.warmup, max(drop_factor, 1.0), fixed_cost,
                                     a.variants.get(name))
                run["round"] = r
                runs[scenario][name].append(run)
                ratio = run.get("capacity_ratio")
                print(f"{scenario} {name} #{r}: mean sdelay {aggregate([run])['scheduling_delay_mean_ms']:.1f} ms, "
                      f"{run['rows']:,} rows in {run['elapsed_s']:.1f} s"
                      f"{'' if ratio is None else f', capacity after the drop {ratio:.2f}x before'}"
                      f"{'' if run['drained'] else ' (stopped by the drain cap)'}", flush=True)
            now = time.time()
            round_s, round_started = now - round_started, now
            if r + 1 < a.min_repeats:
                continue
            left = unsettled({s: d["summary"] for s, d in summarize_all(runs).items()}, a.target_ci)
            if not left:
                stop_reason = "converged"
                break
            if now - began + round_s > a.time_cap:
                stop_reason = "time_cap"
                break
            print(f"round {r + 1}: ci95 not yet under {a.target_ci:.0%} of the mean for {', '.join(left)}",
                  flush=True)
    finally:
        spark.stop()
    out_scenarios = summarize_all(runs)
    left = unsettled({s: d["summary"] for s, d in out_scenarios.items()}, a.target_ci)
    if stop_reason == "converged":
        verdict = f"every ci95 under {a.target_ci:.0%} of its mean"
    else:
        verdict = (f"stopped by the {'time cap' if stop_reason == 'time_cap' else 'repeat cap'} "
                   f"({a.time_cap:.0f} s / {a.max_repeats} repeats): ci95 not under {a.target_ci:.0%} "
                   f"of the mean for {', '.join(left)}")
    print(verdict, flush=True)
    for scenario, data in out_scenarios.items():
        data["batches"] = {n: [r["batches"] for r in rs] for n, rs in runs[scenario].items()}
        data["runs"] = {n: [{k: r[k] for k in RUN_FIELDS if k in r} for r in rs] for n, rs in runs[scenario].items()}
    out: dict[str, Any] = {
        "machine": {"cores": os.cpu_count(), "load_average_1_5_15_at_start": list(load_start),
                    "load_average_1_5_15_at_end": list(os.getloadavg()), "nice": os.nice(0),
                    "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M"),
                    "wall_time_s": time.time() - began, "commit": commit},
        "setup": {"quick": a.quick, "periods": a.periods, "drain_cap_s": a.drain_cap, "warmup_s": a.warmup,
                  "calibration_s": a.calibration_s, "rounds": rounds_setup,
                  "period_s": 10.0, "burst_fraction": 0.5, "interval_ms": a.interval_ms, "work_rounds": a.work,
                  "drop_factor": a.drop_factor, "partitions": a.partitions, "master": a.master,
                  "target_ci95_fraction": a.target_ci,
                  "time_cap_s": a.time_cap, "min_repeats": a.min_repeats, "max_repeats": a.max_repeats,
                  "variants": {n: {"base": b, "settings": st} for n, (b, st) in a.variants.items()}},
        "stopped": {"reason": stop_reason, "repeats": min(len(rs) for d in runs.values() for rs in d.values()),
                    "ci95_not_under_target": left, "verdict": verdict},
        "goals": goals(out_scenarios),
        "calibration_outliers": calibration_outliers(rounds_setup),
        "document": {"pid_ms": 106.18, "doc001_ms": 62.89, "ratio": 62.89 / 106.18},
        "scenarios": out_scenarios,
    }
    if "capacity_drop" in scenarios:
        out["time_shares_after_drop"] = time_shares.analyse(out)
    a.out_dir.mkdir(parents=True, exist_ok=True)
    out = stamp(out, "spark_rate_control")
    (a.out_dir / "spark_rate_control.json").write_text(json.dumps(out, indent=1))
    for scenario in scenarios:
        plot(scenario, {n: rs[0] for n, rs in runs[scenario].items() if rs}, out_scenarios[scenario]["summary"],
             a.out_dir / f"spark_rate_control_{scenario}.png")
    print(table(out), flush=True)
    return out


def table(out: dict[str, Any]) -> str:
    """The figures as the Markdown tables BENCHMARKS.md shows."""
    lines = []
    for scenario, data in out["scenarios"].items():
        parts = [("summary", "after the warm-up")] + ([("after_drop", "after the drop")] if "after_drop" in data else [])
        for part, what in parts:
            lines += ["", f"`{scenario}`, batches {what}:", "",
                      "| controller | mean scheduling delay (ms) | ci95 (ms) | p95 (ms) | throughput (rows/s) | "
                      "batches / past the next boundary | processing time mean / sd (ms) | repeats (not drained) |",
                      "|---|---|---|---|---|---|---|---|"]
            for name, s in data[part].items():
                half = s["scheduling_delay_ci95_ms"]
                stuck = f" ({s['runs_not_drained']})" if s.get("runs_not_drained") else ""
                lines.append(f"| {name} | {s['scheduling_delay_mean_ms']:.1f} | "
                             f"{'-' if half is None else f'{half:.1f}'} | {s['scheduling_delay_p95_ms']:.0f} | "
                             f"{s['throughput_rows_per_s']:,.0f} | {s['batches']} / {s['batches_past_next_boundary']} | "
                             f"{s['processing_time_mean_ms']:.0f} / {s['processing_time_sd_ms']:.0f} | {s['repeats']}{stuck} |")
        ratios = {n: s["capacity_ratio_mean"] for n, s in data["summary"].items() if "capacity_ratio_mean" in s}
        if ratios:
            lines += ["", "Capacity after the drop / before (marginal per-row time, fixed cost off; mean of the "
                      "runs): " + ", ".join(f"{n} {r:.2f}" for n, r in ratios.items())]
    lines += ["", "| goal | measured (means over all repeats) | | rounds in which it held | per-round ratio, mean +- ci95 |",
              "|---|---|---|---|---|"]
    for goal, g in out["goals"].items():
        r, m, h = g["ratio"], g.get("per_round_mean"), g.get("per_round_ci95")
        paired = "-" if m is None else f"{m:.2f}" + ("" if h is None else f" +- {h:.2f}")
        lines.append(f"| {goal} | {'-' if r is None else f'{r:.2f}'} | {'met' if g['met'] else 'not met'} | "
                     f"{g.get('rounds_met', 0)} of {g.get('rounds', 0)} | {paired} |")
    if out.get("time_shares_after_drop"):
        lines += ["", "`capacity_drop`, shares of the wall time after the drop (`bench.spark_time_shares`: the fixed "
                  "cost at the round's calibration; rows/s = work share x the machine's marginal rate):", "",
                  time_shares.table(out["time_shares_after_drop"])]
    outliers = out.get("calibration_outliers")
    if outliers:
        lines += ["", f"Calibrations more than {CALIBRATION_SPREAD:.0%} from the median of the rounds' (capacity, "
                  "rows/s): " + ", ".join(
            f"round {o['round'] + 1} {o['capacity_rows_per_s']:,.0f} against {o['median_rows_per_s']:,.0f}"
            for o in outliers)]
    lines += ["", out["stopped"]["verdict"]]
    return "\n".join(lines)


if __name__ == "__main__":
    main(sys.argv[1:])
