"""Document 001's experiment on the Spark engine: fixed cap vs DStream PID vs doc 001.

Setup, as in the document (figure 9 and 10), scaled to the machine:

* a bursty synthetic source: ``per_period`` records in the first half of every 10 s
  period and none in the second (the document's 600,000 records; ``--per-period``);
* a 1 s trigger; one stateless bolt whose work is linear in the record (a Python hash
  over the payload, 16..256 characters, ``--work`` rounds per character);
* the same topology and source run once per controller: ``fixed`` (a static cap at
  the measured capacity, Spark's ``maxRatePerPartition``), ``pid`` (Spark's DStream
  ``PIDRateEstimator`` rules) and ``doc001`` (document 001's controller), on one
  shared ``local[2]`` session after a warm-up run.

The document's source is sized against its cluster (the burst exceeds Spark's
average processing rate, the average does not); here ``calibrate`` measures the
rate this machine sustains with one-interval batches first (``calibrate``) and,
unless ``--per-period`` is given, sizes the burst at ``burst_factor`` (1.6) times it,
so the backlog a burst builds drains in the quiet half (the average is 0.8 times
capacity).

Reported per controller, over every repeat: mean and p95 scheduling delay (derived
from trigger times, ``runtime.spark.listener``) and mean and p95 processing time per
batch, both over the batches after the warm-up (the first burst's ramp from slow
start); throughput (source rows processed / run time, whole runs), the fraction of
the offered rows processed, and rows still waiting at the end of each run.
``main()`` writes ``bench/results/spark_rate_control.json`` and one PNG per
controller (``spark_rate_control_<name>.png``: scheduling delay, processing time,
rows and cap per batch against the source's rate). The document: 106.18 ms ->
62.89 ms mean scheduling delay (0.59x); the goal here is doc001 <= 0.6x of pid's
mean with no loss of throughput.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any, Sequence

from topo.api import Bolt, Tuple
from topo.sources import Bursty, SyntheticSpout
from topo.topology import Topology, TopologyBuilder

RESULTS = Path(__file__).parent / "results"
CONTROLLERS = ("fixed", "pid", "doc001")


class LinearWork(Bolt):
    """Work linear in the record: ``rounds`` passes of a multiplicative hash per character."""

    outputs: list[str] = []

    def __init__(self, rounds: int = 1) -> None:
        self.rounds = rounds

    def execute(self, tup: Tuple) -> None:
        h = 0
        data = tup[1].encode() * self.rounds
        for b in data:
            h = (h * 31 + b) & 0xFFFFFFFF
        self.last = h


def topology(per_period: int, rounds: int, partitions: int, total: int | None = None,
             profile: str = "bursty", rate: float = 0.0) -> Topology:
    b = TopologyBuilder("spark-rate-control")
    if profile == "bursty":
        spout = SyntheticSpout("bursty", per_period=per_period, period=10.0, burst_fraction=0.5,
                               partitions=partitions, total=total)
    else:
        spout = SyntheticSpout("constant", rate=rate, partitions=partitions, total=total)
    b.spout("source", spout)
    b.bolt("work", LinearWork(rounds), 2).shuffle("source")
    return b.build()


def base_config(interval_ms: float) -> dict[str, Any]:
    return {"spark.trigger_interval_ms": interval_ms, "spark.sink": "none"}


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


def calibrate(spark: Any, rounds: int, partitions: int, interval_ms: float, seconds: float = 20.0) -> float:
    """The rate (rows/s) this machine sustains with batches of one interval.

    Runs Spark's DStream PID on a source that always has more than enough data (its
    ramp gives batches of many sizes), fits ``processing_time = a + rows / c`` over the
    batches after the first two, and returns ``c * (t_interval - a) / t_interval``:
    the rows per second that fill an interval once the fixed per-batch cost is paid.
    """
    from runtime.spark import engine

    interval_s = interval_ms / 1000.0
    topo = topology(0, rounds, partitions, profile="constant", rate=1e7)
    cfg = base_config(interval_ms) | {"spark.rate_control": "pid"}
    result = engine.run(topo, cfg, spark=spark, duration=seconds)
    a, c = fit_overhead(result.batches[2:])
    print(f"calibration: {len(result.batches)} batches, fixed cost {a * 1000:.0f} ms, {c:.0f} rows/s marginal",
          flush=True)
    return max(c * (interval_s - a) / interval_s, 1000.0)


def run_controller(spark: Any, name: str, per_period: int, rounds: int, partitions: int, duration: float,
                   capacity: float, interval_ms: float, warmup: float) -> dict[str, Any]:
    """One run; figures over the batches after ``warmup`` seconds (the first burst's ramp)."""
    from runtime.spark import engine

    cfg = base_config(interval_ms) | {"spark.rate_control": name}
    if name == "fixed":
        cfg["spark.max_rate_per_partition"] = capacity / partitions
    result = engine.run(topology(per_period, rounds, partitions), cfg, spark=spark, duration=duration)
    first = min((b.submit for b in result.batches), default=0.0)
    kept = [b for b in result.batches if b.start >= first + warmup]
    offered = Bursty(per_period).count_at(result.elapsed)
    return {"batches": [b.as_dict() for b in result.batches], "kept": kept, "elapsed_s": result.elapsed,
            "rows": result.input_rows, "offered": offered, "window_s": max(result.elapsed - warmup, 1e-9),
            "backlog_rows": max(0, offered - result.input_rows)}


def aggregate(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Figures over the kept batches of every repeat of one controller."""
    from runtime.spark.engine import summarize

    kept = [b for r in runs for b in r["kept"]]
    out = summarize(kept, sum(r["window_s"] for r in runs))
    # Throughput over whole runs: rows processed / run time (a window would count the
    # backlog the warm-up left behind as throughput of the window).
    out["throughput_rows_per_s"] = sum(r["rows"] for r in runs) / sum(r["elapsed_s"] for r in runs)
    out["processed_fraction_of_offered"] = sum(r["rows"] for r in runs) / max(1, sum(r["offered"] for r in runs))
    del out["input_rows"], out["elapsed_s"]
    out["backlog_rows_at_end"] = [r["backlog_rows"] for r in runs]
    cases: dict[str, int] = {}
    for b in kept:
        case = b.case_by_source.get("source")
        if case is not None:
            cases[str(case)] = cases.get(str(case), 0) + 1
    if cases:
        out["doc001_cases"] = dict(sorted(cases.items()))
    out["per_run_scheduling_delay_mean_ms"] = [summarize(r["kept"], r["window_s"])["scheduling_delay_mean_ms"]
                                               for r in runs]
    return out


def plot(name: str, run: dict[str, Any], summary: dict[str, Any], per_period: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    batches = run["batches"]
    if not batches:
        return
    t0 = min(b["submit"] for b in batches)
    t = [b["start"] - t0 for b in batches]
    fig, axes = plt.subplots(3, 1, figsize=(10, 8), sharex=True)
    axes[0].bar(t, [1000 * b["scheduling_delay"] for b in batches], width=0.8, color="tab:red")
    axes[0].set_ylabel("scheduling delay (ms)")
    axes[1].plot(t, [1000 * b["processing_time"] for b in batches], marker=".", color="tab:blue")
    axes[1].axhline(1000, color="grey", linestyle="--", linewidth=0.8)
    axes[1].set_ylabel("processing time (ms)")
    axes[2].plot(t, [b["rows"] for b in batches], marker=".", label="rows in batch")
    caps = [b["cap_by_source"].get("source") for b in batches]
    axes[2].plot(t, [c if c is not None else float("nan") for c in caps], linestyle="--", label="cap (rows/s)")
    axes[2].set_ylabel("rows")
    axes[2].set_xlabel("seconds since first submission")
    axes[2].legend(loc="upper right")
    s = summary
    fig.suptitle(f"{name}: mean sdelay {s['scheduling_delay_mean_ms']:.1f} ms, p95 {s['scheduling_delay_p95_ms']:.0f} ms, "
                 f"{s['throughput_rows_per_s']:.0f} rows/s (burst {per_period} per 10 s)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--duration", type=float, default=40.0, help="seconds per controller run")
    p.add_argument("--per-period", type=int, default=0, help="records per 10 s period; 0 = calibrate")
    p.add_argument("--burst-factor", type=float, default=1.6, help="burst rate / measured capacity")
    p.add_argument("--work", type=int, default=1, help="hash rounds per payload character")
    p.add_argument("--partitions", type=int, default=2)
    p.add_argument("--interval-ms", type=float, default=1000.0)
    p.add_argument("--warmup", type=float, default=10.0, help="seconds of each run left out of the figures")
    p.add_argument("--repeats", type=int, default=4, help="runs per controller, interleaved")
    p.add_argument("--controllers", default=",".join(CONTROLLERS))
    p.add_argument("--master", default="local[2]")
    a = p.parse_args(list(argv or []))

    from runtime.spark.session import get_session

    spark = get_session(a.master, shuffle_partitions=2, log_level="ERROR")
    try:
        calibrate(spark, a.work, a.partitions, a.interval_ms, seconds=8.0)     # warm-up: Python workers
        capacity = calibrate(spark, a.work, a.partitions, a.interval_ms)
        per_period = a.per_period or int(capacity * a.burst_factor * 5.0)
        print(f"capacity ~{capacity:.0f} rows/s; bursty source: {per_period} records in the first 5 s of every 10 s",
              flush=True)
        names = a.controllers.split(",")
        runs: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
        for r in range(a.repeats):
            order = names[r % len(names):] + names[:r % len(names)]   # rotate: the machine's load drifts
            for name in order:
                run = run_controller(spark, name, per_period, a.work, a.partitions, a.duration, capacity,
                                     a.interval_ms, a.warmup)
                runs[name].append(run)
                print(name, r, json.dumps(aggregate([run])), flush=True)
    finally:
        spark.stop()
    RESULTS.mkdir(parents=True, exist_ok=True)
    summaries = {n: aggregate(rs) for n, rs in runs.items()}
    out: dict[str, Any] = {
        "setup": {"duration_s": a.duration, "warmup_s": a.warmup, "repeats": a.repeats, "per_period": per_period,
                  "period_s": 10.0, "burst_fraction": 0.5, "interval_ms": a.interval_ms, "work_rounds": a.work,
                  "partitions": a.partitions, "master": a.master, "measured_capacity_rows_per_s": capacity},
        "summary": summaries,
        "batches": {n: [r["batches"] for r in rs] for n, rs in runs.items()},
    }
    if "pid" in summaries and "doc001" in summaries:
        pid, doc = summaries["pid"], summaries["doc001"]
        out["doc001_vs_pid"] = {
            "mean_scheduling_delay_ratio": (doc["scheduling_delay_mean_ms"] / pid["scheduling_delay_mean_ms"]
                                            if pid["scheduling_delay_mean_ms"] else None),
            "throughput_ratio": (doc["throughput_rows_per_s"] / pid["throughput_rows_per_s"]
                                 if pid["throughput_rows_per_s"] else None),
            "document": {"pid_ms": 106.18, "doc001_ms": 62.89, "ratio": 62.89 / 106.18},
        }
    (RESULTS / "spark_rate_control.json").write_text(json.dumps(out, indent=2))
    for name, rs in runs.items():
        plot(name, rs[0], summaries[name], per_period, RESULTS / f"spark_rate_control_{name}.png")
    print(json.dumps(out.get("doc001_vs_pid"), indent=2))
    return out


if __name__ == "__main__":
    main(sys.argv[1:])
