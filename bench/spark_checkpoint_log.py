"""What ``spark.checkpoint_file_manager`` saves per trigger: Spark's default checkpoint
file manager (``spark``) against the ``FileSystem``-based one (``filesystem``, what
``auto`` picks for a local checkpoint), in the same process.

Every micro-batch writes one file to the offset log (``walCommit``) and one to the
commit log (``commitOffsets``); those two phases are a fixed cost of every trigger,
whatever the batch's size. The bench runs a bare query (Spark's ``rate`` source into a
``foreachBatch`` that counts its rows) on one ``local[2]`` session, once per setting per
round, the settings' order alternating between rounds, each run to ``--batches``
triggers after two warm-up ones, and reports the median of each phase per setting, its
spread over the rounds and the ratio ``filesystem / spark``. Topo's own query goes
through the same two writes (``runtime.spark.checkpoint_log``), so these are the
milliseconds the setting takes off each of its triggers.

    python -m bench.spark_checkpoint_log [--rounds 3] [--batches 12] [--trigger-ms 500]

Results: ``bench/results/spark_checkpoint_log.json``.
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
from typing import Any, Sequence

from runtime.spark.checkpoint_log import use_manager
from runtime.observe.spark_progress import progress_rows
from bench import environment
from bench.environment import stamp

SETTINGS = ("spark", "filesystem")
PHASES = ("walCommit", "commitOffsets", "triggerExecution")
WARMUP_BATCHES = 2
RESULTS = Path(__file__).parent / "results" / "spark_checkpoint_log.json"


def run_query(spark: Any, setting: str, batches: int, trigger_ms: int, timeout_s: float) -> dict[str, list[float]]:
    """One query to ``batches`` triggers past the warm-up under ``setting``; each phase's
    milliseconds per trigger."""
    with tempfile.TemporaryDirectory(prefix="topo-ckpt-bench-") as tmp, contextlib.ExitStack() as stack:
        checkpoint = str(Path(tmp) / "checkpoint")
        use_manager(stack, spark, setting, checkpoint)
        df = spark.readStream.format("rate").option("rowsPerSecond", 1000).load()
        query = (df.writeStream.foreachBatch(lambda batch, _id: batch.count())
                 .trigger(processingTime=f"{trigger_ms} milliseconds")
                 .option("checkpointLocation", checkpoint).start())
        try:
            deadline = time.monotonic() + timeout_s
            while len(_with_rows(query)) < batches + WARMUP_BATCHES:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{setting}: fewer than {batches + WARMUP_BATCHES} triggers in {timeout_s:.0f} s")
                time.sleep(0.2)
            progress = _with_rows(query)[WARMUP_BATCHES:WARMUP_BATCHES + batches]
        finally:
            query.stop()
    return {phase: [float(p["durationMs"].get(phase, 0)) for p in progress] for phase in PHASES}


def _with_rows(query: Any) -> list[dict[str, Any]]:
    """The progress reports of triggers that ran a batch (an idle trigger writes no log)."""
    return [p for p in query.recentProgress if p.get("batchId") is not None and progress_rows(p) > 0]


def summarize(runs: dict[str, list[dict[str, list[float]]]]) -> dict[str, Any]:
    """Per setting and phase: median over every trigger, and the range of the rounds' medians."""
    out: dict[str, Any] = {}
    for setting, rounds in runs.items():
        out[setting] = {}
        for phase in PHASES:
            every = [v for r in rounds for v in r[phase]]
            per_round = [statistics.median(r[phase]) for r in rounds]
            out[setting][phase] = {"median_ms": statistics.median(every),
                                   "round_medians_ms": per_round, "triggers": len(every)}
    out["ratio_filesystem_over_spark"] = {
        phase: out["filesystem"][phase]["median_ms"] / out["spark"][phase]["median_ms"]
        for phase in PHASES if out["spark"][phase]["median_ms"] > 0}
    return out


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.spark_checkpoint_log", description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3, help="runs per setting, interleaved (3)")
    p.add_argument("--batches", type=int, default=12, help="triggers measured per run (12)")
    p.add_argument("--trigger-ms", type=int, default=500, help="the query's trigger interval (500)")
    p.add_argument("--out", type=Path, default=RESULTS)
    a = p.parse_args(list(argv or []))  # None: the defaults (python -m bench passes nothing)
    for name in ("rounds", "batches", "trigger_ms"):
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(a, name)}")
    return a


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    from runtime.spark.session import get_session

    a = parse_args(argv)
    start = environment.RunStart()
    spark = get_session("local[2]", shuffle_partitions=2, app_name="topo-bench-checkpoint-log")
    timeout = 30 + 4 * (a.batches + WARMUP_BATCHES) * a.trigger_ms / 1000
    runs: dict[str, list[dict[str, list[float]]]] = {s: [] for s in SETTINGS}
    try:
        for r in range(a.rounds):
            for setting in (SETTINGS if r % 2 == 0 else SETTINGS[::-1]):
                runs[setting].append(run_query(spark, setting, a.batches, a.trigger_ms, timeout))
    finally:
        spark.stop()
    out = {"machine": start.machine(),
           "setup": {"rounds": a.rounds, "batches": a.batches, "trigger_ms": a.trigger_ms,
                     "warmup_batches": WARMUP_BATCHES, "source": "rate, 1000 rows/s", "master": "local[2]"},
           "summary": summarize(runs), "runs": runs}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    out = stamp(out, "spark_checkpoint_log")
    a.out.write_text(json.dumps(out, indent=1))
    print(table(out))
    return out


def _cell(d: dict[str, Any]) -> str:
    """A phase's median, and the range of the rounds' medians in brackets."""
    rounds = d["round_medians_ms"]
    return f"{d['median_ms']:.0f} ({min(rounds):.0f}-{max(rounds):.0f})"


def table(out: dict[str, Any]) -> str:
    s = out["summary"]
    lines = ["| phase | spark (Spark's default) ms | filesystem ms | ratio |", "|---|---|---|---|"]
    for phase in PHASES:
        ratio = s["ratio_filesystem_over_spark"].get(phase)
        lines.append(f"| {phase} | {_cell(s['spark'][phase])} | {_cell(s['filesystem'][phase])} | "
                     f"{'-' if ratio is None else f'{ratio:.2f}'} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main(sys.argv[1:])
