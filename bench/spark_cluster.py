"""The bursty experiment on a Spark standalone cluster with 1 and 2 executor cores,
beside ``local[2]`` (issue 15's scaling figure).

Setup: ``configs/bursty_spark.yaml`` as it is (document 001's bursty source, 600,000
records in the first half of every 10 s, ``LinearWork`` bolt, doc001 controller, 1 s
trigger). A standalone Master and one Worker (2 cores, 2 GiB) are started on 127.0.0.1
from the installed pyspark, as the tests start them (``tests/spark_cluster.py``). Three
setups, each a fresh driver process (a Spark application's cores are fixed when it starts):

* ``local[2]``: the engine's default kind of session, two task threads in the driver;
* ``cluster_1core``: the cluster, ``spark.cores.max=1`` (one executor with one core);
* ``cluster_2cores``: the cluster, ``spark.cores.max=2`` (one executor with two cores).

The cores limit is passed the way a user passes any Spark setting to ``topo run``:
``PYSPARK_SUBMIT_ARGS="--conf spark.cores.max=1 pyspark-shell"``. The bolt reaches the
executors only through the engine's code shipping (the Worker has no ``PYTHONPATH``).

Each run lasts ``--duration`` seconds of query time (session start not counted); its
figures are over the batches that started ``--warmup`` seconds or more after its first
batch (Python workers starting, the controller's slow start);
rounds run every setup in an order rotated each round (the machine's load drifts), and
each round's figures are also taken as ratios to that round's ``local[2]`` run.
Reported per setup: throughput (source rows processed / query time) and mean
scheduling delay, median and range over the rounds. ``main()`` writes
``bench/results/spark_cluster.json``.

    python -m bench spark_cluster                            (make bench runs it so)
    python -m bench.spark_cluster [--rounds 3] [--duration 60] [--warmup 15]
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

from bench.environment import stamp
from runtime.spark.engine import summarize
from runtime.spark.listener import BatchRecord

REPO = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).parent / "results"
TOPOLOGY = REPO / "configs" / "bursty_spark.yaml"
SETUPS = {"local[2]": None, "cluster_1core": 1, "cluster_2cores": 2}

CHILD = """
import json, sys
from runtime.spark import engine
from topo.spec import load_spec
spec = load_spec(sys.argv[1])
r = engine.run(spec.topology, spec.resolve_config(), master=sys.argv[2], duration=float(sys.argv[3]))
print(json.dumps({"batches": [b.as_dict() for b in r.batches], "shipped": r.shipped}))
"""


def run_once(master: str, cores: int | None, duration: float, warmup: float, workdir: Path) -> dict[str, Any]:
    """One driver process running the bursty topology for ``duration`` s; the figures over
    the batches that started ``warmup`` s or more after the first one."""
    env = dict(os.environ, PYTHONPATH=str(REPO), PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1")
    if cores is not None:
        env["PYSPARK_SUBMIT_ARGS"] = f"--conf spark.cores.max={cores} pyspark-shell"
    proc = subprocess.run([sys.executable, "-c", CHILD, str(TOPOLOGY), master, str(duration)], cwd=workdir,
                          env=env, capture_output=True, text=True, timeout=duration + 600)
    if proc.returncode != 0:
        raise RuntimeError(f"{master} (cores {cores}) failed: {proc.stderr[-2000:]}")
    batches = json.loads(proc.stdout.strip().splitlines()[-1])["batches"]
    if not batches:
        raise RuntimeError(f"{master} (cores {cores}): no batch finished in {duration:.0f} s")
    cut = batches[0]["start"] + warmup
    kept = [BatchRecord(**b) for b in batches if b["start"] >= cut]
    if not kept:
        raise RuntimeError(f"{master} (cores {cores}): no batch started after the {warmup:.0f} s warm-up")
    return summarize(kept, max(b.end for b in kept) - cut)


def spread(values: Sequence[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench spark_cluster", description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=3, help="rounds of every setup (default 3)")
    p.add_argument("--duration", type=float, default=60.0, help="query seconds per run (default 60)")
    p.add_argument("--warmup", type=float, default=15.0,
                   help="seconds after the first batch's start left out: Python workers starting, slow start (15)")
    return p.parse_args(list(argv or []))   # `python -m bench` calls main() with no arguments


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    a = parse_args(argv)
    sys.path.insert(0, str(REPO / "tests"))
    from spark_cluster import StandaloneCluster

    began = time.time()
    load_start = os.getloadavg()
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in SETUPS}
    ratios: dict[str, dict[str, list[float]]] = {name: {"throughput": [], "scheduling_delay_mean": []}
                                                 for name in SETUPS if name != "local[2]"}
    work = Path(tempfile.mkdtemp(prefix="topo-bench-spark-cluster-"))   # the runs' spark-logs/
    cluster = StandaloneCluster(workers=1, cores=2, memory="2g").start()
    try:
        names = list(SETUPS)
        for r in range(a.rounds):
            order = names[r % len(names):] + names[:r % len(names)]
            got: dict[str, dict[str, Any]] = {}
            for name in order:
                cores = SETUPS[name]
                master = "local[2]" if cores is None else cluster.url
                got[name] = run_once(master, cores, a.duration, a.warmup, work)
                runs[name].append(got[name])
                print(f"round {r}: {name}: {got[name]['throughput_rows_per_s']:.0f} rows/s, mean scheduling "
                      f"delay {got[name]['scheduling_delay_mean_ms']:.0f} ms", flush=True)
            base = got["local[2]"]
            for name in ratios:
                ratios[name]["throughput"].append(got[name]["throughput_rows_per_s"] / base["throughput_rows_per_s"])
                ratios[name]["scheduling_delay_mean"].append(
                    got[name]["scheduling_delay_mean_ms"] / max(base["scheduling_delay_mean_ms"], 1e-9))
    finally:
        cluster.stop()
        shutil.rmtree(work, ignore_errors=True)
    summary = {name: {"throughput_rows_per_s": spread([x["throughput_rows_per_s"] for x in rs]),
                      "scheduling_delay_mean_ms": spread([x["scheduling_delay_mean_ms"] for x in rs]),
                      "batches": spread([x["batches"] for x in rs])}
               for name, rs in runs.items()}
    out: dict[str, Any] = {
        "machine": {"cores": os.cpu_count(), "load_average_1_5_15_at_start": list(load_start),
                    "load_average_1_5_15_at_end": list(os.getloadavg()),
                    "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M"),
                    "wall_time_s": time.time() - began},
        "setup": {"topology": "configs/bursty_spark.yaml", "rounds": a.rounds, "duration_s": a.duration,
                  "warmup_s": a.warmup,
                  "worker": {"cores": 2, "memory": "2g"}, "cores_max": {k: v for k, v in SETUPS.items()}},
        "summary": summary,
        "ratio_to_local2": {name: {k: spread(v) for k, v in d.items()} for name, d in ratios.items()},
        "runs": runs,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = stamp(out, "spark_cluster")
    (RESULTS / "spark_cluster.json").write_text(json.dumps(out, indent=1))
    print(table(out), flush=True)
    return out


def table(out: dict[str, Any]) -> str:
    """The BENCHMARKS.md table: medians with their range over the rounds."""
    lines = ["| setup | throughput rows/s (range) | mean scheduling delay ms (range) | throughput / local[2] |",
             "|---|---|---|---|"]
    for name, s in out["summary"].items():
        t, d = s["throughput_rows_per_s"], s["scheduling_delay_mean_ms"]
        ratio = out["ratio_to_local2"].get(name, {}).get("throughput")
        r = f"{ratio['median']:.2f}x ({ratio['min']:.2f}-{ratio['max']:.2f})" if ratio else "1"
        lines.append(f"| {name} | {t['median']:.0f} ({t['min']:.0f}-{t['max']:.0f}) | "
                     f"{d['median']:.0f} ({d['min']:.0f}-{d['max']:.0f}) | {r} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main(sys.argv[1:])
