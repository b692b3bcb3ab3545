"""The Spark engine on a real standalone cluster (issue 15): a Master and one Worker (2
cores, 1 GiB) started from the installed pyspark on 127.0.0.1 (``spark_cluster.py``).

The Worker runs its executors with this interpreter but without the tests' or the
repository's directories on ``PYTHONPATH``: they import only what is installed (``topo``),
so every test here also checks that the engine ships the user's code. Each run is a
``topo run`` subprocess, as a user runs it (one Spark application at a time: the
Worker's cores go to one application).

* the word count (configs/wordcount.yaml, unchanged) leaves the same counts in
  ``wordcount.db`` as on the local engine: the sink bolt runs on the executors, which
  write relative paths in the directory ``topo run`` was started from;
* a bolt in a module of its own next to the YAML (not installed, not on any path of the
  executors), reading a file log by a relative path and a Redis Streams log, gives the
  exact rows;
* a bolt that raises: one line naming the bolt and the exception, exit status 1, Spark's
  log in ``spark-logs/`` and not on the terminal;
* document 001's controller (``spark.rate_control: doc001``) admits by the caps it
  computes from the cluster's batches.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from redis_server import redis_url  # noqa: F401  (the fixture: a redis-server on a free port)
from spark_cluster import spark_cluster  # noqa: F401  (the fixture)
from topo.examples.wordcount import DEFAULT_SENTENCES, expected_counts
from topo.sinks import read_table

pytestmark = pytest.mark.spark

REPO = Path(__file__).resolve().parent.parent
# Printed outside any logging: by the JVM at its start, and by PySpark's transformWithState
# driver-side worker (print(), unconditionally) for topologies with several stateful stages.
NOT_LOGGED = ("WARNING: Using incubator modules", "Streaming TransformWithStateInPandas Python worker",
              "Starting Streaming TransformWithStateInPandas Python worker")


def _env() -> dict[str, str]:
    """The driver's environment: the repository on PYTHONPATH (as in the other tests;
    the executors do not get it), this interpreter for the Python workers."""
    return dict(os.environ, PYTHONPATH=str(REPO), PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1")


def topo_run(args: list[str], cwd: Path, timeout: float = 400) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "topo.cli", "run", *args], cwd=cwd, env=_env(),
                          capture_output=True, text=True, timeout=timeout)


def terminal_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.strip() and not line.startswith(NOT_LOGGED)]


def test_wordcount_on_the_cluster_gives_the_local_engines_counts(spark_cluster, tmp_path):
    wordcount = str(REPO / "configs" / "wordcount.yaml")
    counts = {}
    for engine, extra in (("local", []), ("cluster", ["--engine", "spark", "--master", spark_cluster.url])):
        (tmp_path / engine).mkdir()
        proc = topo_run([*extra, wordcount, "--quiet"], tmp_path / engine)
        assert proc.returncode == 0, proc.stderr[-4000:]
        assert terminal_lines(proc.stderr) == [], proc.stderr[-4000:]   # Spark's log went to its file
        counts[engine] = dict(read_table(str(tmp_path / engine / "wordcount.db"), "word_counts"))
    assert counts["local"] == dict(expected_counts(DEFAULT_SENTENCES, 2000))
    assert counts["cluster"] == counts["local"]
    assert list((tmp_path / "cluster" / "spark-logs").glob("wordcount-*.log"))


def test_a_bolt_in_a_module_next_to_the_yaml_runs_on_the_cluster(spark_cluster, tmp_path, redis_url):
    """``shout.py`` and the YAML in one directory, nothing installed: the driver imports
    the module from the working directory; the executors get it only by shipping. Its
    inputs: a file log by a relative path (executors work in the driver's directory on a
    cluster on this machine) and a Redis Streams log (read from the executors)."""
    (tmp_path / "shout.py").write_text(textwrap.dedent("""
        from topo.api import Bolt
        from shout_words import loud   # a local import of the bolt's module: shipped too

        class Shout(Bolt):
            outputs = ["word", "loud"]

            def execute(self, tup):
                self.collector.emit([tup["sentence"], loud(tup["sentence"])])
        """))
    (tmp_path / "shout_words.py").write_text("def loud(s):\n    return s.upper() + '!'\n")
    from topo.sources import FileLog, RedisLog

    log = FileLog(tmp_path / "log", "lines", partitions=2)
    sentences = [f"sentence {i}" for i in range(300)]
    for s in sentences:
        log.produce(s)
    remote = RedisLog(redis_url, "lines", partitions=2)
    for i in range(200):
        remote.produce(f"redis line {i}")
    remote.close()
    (tmp_path / "shout.yaml").write_text(textwrap.dedent("""
        name: shout
        config:
          spark.sink: sqlite:out.db
          spark.rate_control: fixed
          spark.max_rate_per_partition: 100
        spouts:
          - id: lines
            class: topo.sources.MessageLogSpout
            kwargs: {log: log, topic: lines, columns: [value], fields: [sentence]}
          - id: streamed
            class: topo.sources.MessageLogSpout
            kwargs: {log: "REDIS", topic: lines, columns: [value], fields: [sentence]}
        bolts:
          - id: shout
            class: shout.Shout
            parallelism: 2
        streams:
          - {from: lines, to: shout, grouping: {type: shuffle}}
          - {from: streamed, to: shout, grouping: {type: shuffle}}
        """).replace("REDIS", redis_url))
    proc = topo_run(["--engine", "spark", "--master", spark_cluster.url, "shout.yaml", "--quiet"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    from runtime.spark.result_store import read_rows

    rows = sorted((word, loud) for *_ids, word, loud in read_rows(f"sqlite:{tmp_path}/out.db", "shout"))
    every = sentences + [f"redis line {i}" for i in range(200)]
    assert rows == sorted((s, s.upper() + "!") for s in every)


def test_a_raising_bolt_is_one_line_and_exit_status_1(spark_cluster, tmp_path):
    (tmp_path / "boom.py").write_text(textwrap.dedent("""
        from topo.api import Bolt

        class Boom(Bolt):
            outputs = ["x"]

            def execute(self, tup):
                raise ValueError(f"no room for record {tup['id']}")
        """))
    (tmp_path / "boom.yaml").write_text(textwrap.dedent("""
        name: boom
        config: {spark.sink: none}
        spouts:
          - id: gen
            class: topo.sources.SyntheticSpout
            kwargs: {profile: constant, rate: 1000, partitions: 1, total: 20}
        bolts:
          - {id: explode, class: boom.Boom}
        streams:
          - {from: gen, to: explode, grouping: {type: shuffle}}
        """))
    proc = topo_run(["--engine", "spark", "--master", spark_cluster.url, "boom.yaml", "--duration", "120"], tmp_path)
    assert proc.returncode == 1, proc.stderr[-4000:]
    lines = terminal_lines(proc.stderr)
    assert len(lines) == 1, proc.stderr[-4000:]
    assert lines[0].startswith("topo run: bolt 'explode': execute raised ValueError: no room for record "), lines
    logs = list((tmp_path / "spark-logs").glob("boom-*.log"))
    assert len(logs) == 1 and f"Spark's log: spark-logs/{logs[0].name}" in lines[0]
    assert "Traceback" in logs[0].read_text()      # the full trace is in Spark's log, not the terminal


CONTROLLER_RUN = """
import json, sys
from topo.spec import load_spec
import topo
spec = load_spec(sys.argv[1])
r = topo.run(spec.topology, "spark", config=spec.resolve_config(), master=sys.argv[2], duration=float(sys.argv[3]))
print(json.dumps({"summary": r.summary(), "caps": [b.cap_by_source.get("source") for b in r.batches],
                  "shipped": r.shipped}))
"""


def test_the_doc001_controller_caps_the_bursty_source_on_the_cluster(spark_cluster, tmp_path):
    """configs/bursty_spark.yaml (its bolt in bench/, which the executors get only
    shipped): the controller's caps reach the reader and change with the batches."""
    proc = subprocess.run([sys.executable, "-c", CONTROLLER_RUN, str(REPO / "configs" / "bursty_spark.yaml"),
                           spark_cluster.url, "40"], cwd=tmp_path, env=_env(), capture_output=True, text=True,
                          timeout=400)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "bench" in out["shipped"]
    assert out["summary"]["rate_control"] == "doc001"
    caps = [c for c in out["caps"] if c is not None]
    assert out["summary"]["batches"] >= 3 and len(caps) == len(out["caps"])
    assert len(set(caps)) > 1                           # the controller moved the cap
    assert out["summary"]["input_rows"] > 0
