"""Where a micro-batch's fixed cost lies on the Spark engine: Spark's own ``rate`` source
against topo's query a piece at a time, on one ``local[2]`` session.

Document 001's controller keeps each batch inside the trigger interval, so it pays the
cost every batch has whatever its size (planning, the offset and commit logs, the job's
tasks, the Python workers) once a second, where a cap that lets batches overrun pays it
less often (BENCHMARKS.md, "Spark rate control"). This bench splits that cost. Four
queries, each run with fixed batches of ``SIZES`` rows (8,000 and 40,000) at a 1 s trigger,
``processing_time = a + rows / c`` fitted over their batches (the first of each run left
out, as the rate-control bench's calibration does):

* ``rate``: Spark's ``rate`` source (``rowsPerSecond`` = the batch size) into a
  ``foreachBatch`` that counts the rows, with the checkpoint manager topo's queries take
  for a local checkpoint: Spark's floor on this machine;
* ``spout``: topo's spout alone (its Python data source, ``runtime.spark.datasource``);
* ``spout_bolt``: the spout and a bolt that does nothing, chained into the spout's
  reader (``spark.chain``, the default);
* ``spout_work``: the spout and the rate-control bench's ``LinearWork`` (its query), chained;
* ``spout_bolt_unchained``, ``spout_work_unchained``: the same with ``spark.chain: false``,
  the bolt in a ``mapInArrow`` stage of its own (every query's shape before chaining).

Runs are interleaved in an order rotated each round. Reported per query: the fitted
fixed cost ``a`` (ms) and marginal rate ``c`` (rows/s), and the median processing time of
the 8,000-row batches, each as the median over the rounds with their range. The ``rate``
source's rows cost too little for the fit to place (its slope is mostly noise), so its
8,000-row batch time is the floor to read. topo's queries run with ``spark.sink: none``:
every batch ends in Spark's ``noop`` sink.

    python -m bench.spark_stage_cost [--rounds 3] [--seconds 12]

Results: ``bench/results/spark_stage_cost.json``.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, NamedTuple, Sequence

from bench import environment
from bench.environment import stamp
from bench.spark_rate_control import LinearWork, base_config, fit_overhead
from runtime.spark.checkpoint_log import use_manager
from runtime.observe.spark_progress import progress_rows
from topo.api import Bolt, Tuple
from topo.sources import SyntheticSpout
from topo.topology import Topology, TopologyBuilder

QUERIES = ("rate", "spout", "spout_bolt", "spout_bolt_unchained", "spout_work", "spout_work_unchained")
UNCHAINED = "_unchained"


class Point(NamedTuple):
    """One batch as the fit reads it (``fit_overhead`` takes its two fields by name)."""

    rows: int
    processing_time: float  # seconds

SIZES = (8_000, 40_000)
INTERVAL_MS = 1000
RESULTS = Path(__file__).parent / "results" / "spark_stage_cost.json"


class Nothing(Bolt):
    """A bolt that takes every tuple and does nothing: the cost of a bolt's stage alone."""

    outputs: list[str] = []

    def execute(self, tup: Tuple) -> None:
        return None


def topology(query: str) -> Topology:
    """``spout``, ``spout_bolt`` or ``spout_work`` (``_unchained`` or not): a source that always
    has more than a batch."""
    query = query.removesuffix(UNCHAINED)
    b = TopologyBuilder("spark-stage-cost")
    b.spout("source", SyntheticSpout("constant", rate=1e7, partitions=2))
    if query == "spout_bolt":
        b.bolt("work", Nothing(), 2).shuffle("source")
    elif query == "spout_work":
        b.bolt("work", LinearWork(1), 2).shuffle("source")
    return b.build()


def run_topo(spark: Any, query: str, size: int, seconds: float) -> list[Point]:
    """Each batch of one run of topo's ``query`` at ``size``-row batches, the first left out."""
    from runtime.spark import engine

    cfg = base_config(INTERVAL_MS) | {"spark.rate_control": "fixed",
                                      "spark.max_rate_per_partition": size / (INTERVAL_MS / 1000) / 2,
                                      "spark.chain": not query.endswith(UNCHAINED)}
    return [Point(b.rows, b.processing_time) for b in engine.run(topology(query), cfg, spark=spark,
                                                                 duration=seconds).batches[1:]]


def run_rate(spark: Any, size: int, seconds: float) -> list[Point]:
    """Each batch of Spark's ``rate`` source into a counting ``foreachBatch``, ``size`` rows a
    second at a 1 s trigger, the first two left out (the source ramps up)."""
    with tempfile.TemporaryDirectory(prefix="topo-stage-bench-") as tmp, contextlib.ExitStack() as stack:
        checkpoint = str(Path(tmp) / "checkpoint")
        use_manager(stack, spark, "filesystem", checkpoint)     # the checkpoint manager topo's queries use here
        df = spark.readStream.format("rate").option("rowsPerSecond", size).option("numPartitions", 2).load()
        query = (df.writeStream.foreachBatch(lambda batch, _id: batch.count())
                 .trigger(processingTime=f"{INTERVAL_MS} milliseconds")
                 .option("checkpointLocation", checkpoint).start())
        try:
            time.sleep(seconds)
        finally:
            query.stop()
        progress = [p for p in query.recentProgress if progress_rows(p) > 0][2:]
    return [Point(progress_rows(p), float(p["durationMs"]["triggerExecution"]) / 1000.0) for p in progress]


def fit(points: Sequence[Point]) -> dict[str, Any]:
    """The fit over one round of a query, and the median time of its smallest batches."""
    a, c = fit_overhead(points)
    small = [t for n, t in points if n <= SIZES[0] * 1.1]
    return {"fixed_cost_ms": a * 1000.0, "marginal_rows_per_s": c, "batches": len(points),
            "small_batch_median_ms": statistics.median(small) * 1000.0 if small else None}


def summarize(rounds: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Per query: each figure's median over the rounds and its range."""
    out: dict[str, Any] = {}
    for query, fits in rounds.items():
        out[query] = {}
        for key in ("fixed_cost_ms", "marginal_rows_per_s", "small_batch_median_ms"):
            values = [f[key] for f in fits if f[key] is not None]
            out[query][key] = {"median": statistics.median(values) if values else None,
                               "min": min(values, default=None), "max": max(values, default=None)}
    return out


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.spark_stage_cost", description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3, help="runs of each query at each size, interleaved (3)")
    p.add_argument("--seconds", type=float, default=12.0, help="length of each run (12)")
    p.add_argument("--out", type=Path, default=RESULTS)
    a = p.parse_args(list(argv or []))  # None: the defaults (python -m bench passes nothing)
    if a.rounds < 1:
        p.error(f"--rounds must be at least 1, got {a.rounds}")
    if a.seconds < 5:
        p.error(f"--seconds must be at least 5 (a run's first batches are left out), got {a.seconds}")
    return a


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    from runtime.spark.session import get_session

    a = parse_args(argv)
    start = environment.RunStart()
    spark = get_session("local[2]", shuffle_partitions=2, log_level="ERROR")
    rounds: dict[str, list[dict[str, Any]]] = {q: [] for q in QUERIES}
    try:
        run_topo(spark, "spout_work", SIZES[0], 8.0)       # warm-up: the Python workers and the source runner
        for r in range(a.rounds):
            order = QUERIES[r % len(QUERIES):] + QUERIES[:r % len(QUERIES)]
            for query in order:
                points: list[Point] = []
                for size in SIZES:
                    points += (run_rate(spark, size, a.seconds) if query == "rate"
                               else run_topo(spark, query, size, a.seconds))
                rounds[query].append(fit(points))
                f = rounds[query][-1]
                print(f"round {r + 1} {query}: fixed cost {f['fixed_cost_ms']:.0f} ms, "
                      f"{f['marginal_rows_per_s']:,.0f} rows/s marginal", flush=True)
    finally:
        spark.stop()
    out = {"machine": start.machine(),
           "setup": {"rounds": a.rounds, "seconds": a.seconds, "sizes": list(SIZES), "interval_ms": INTERVAL_MS,
                     "master": "local[2]"},
           "summary": summarize(rounds), "rounds": rounds}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    out = stamp(out, "spark_stage_cost")
    a.out.write_text(json.dumps(out, indent=1))
    print(table(out))
    return out


def _cell(d: dict[str, Any], fmt: str) -> str:
    if d["median"] is None:
        return "-"
    return f"{d['median']:{fmt}} ({d['min']:{fmt}}-{d['max']:{fmt}})"


def table(out: dict[str, Any]) -> str:
    s = out["summary"]
    lines = ["| query | fixed cost per batch, ms | marginal rows/s | 8,000-row batch, ms |", "|---|---|---|---|"]
    for query in (q for q in QUERIES if q in s):     # a run before chaining has no _unchained queries
        q = s[query]
        lines.append(f"| {query} | {_cell(q['fixed_cost_ms'], '.0f')} | {_cell(q['marginal_rows_per_s'], ',.0f')} | "
                     f"{_cell(q['small_batch_median_ms'], '.0f')} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main(sys.argv[1:])
