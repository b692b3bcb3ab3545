"""The Spark engine end to end, on one shared local[2] session.

* word count (configs/wordcount.yaml, unchanged, through `topo run`) gives exactly the
  same final counts on the local engine and on Spark, with a quiet stderr;
* a bounded synthetic stream through a stateless bolt and a KeyedBolt, admission-
  controlled by document 001's controller, lands in the database sink with the same
  per-key state as on the local engine.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from runtime.local.engine import run as run_local
from runtime.spark import engine as spark_engine
from runtime.spark.result_store import read_rows
from topo.api import Bolt, ComponentError
from topo.examples.wordcount import DEFAULT_SENTENCES, expected_counts
from topo.sinks import read_table
from topo.sources import FileLog, MessageLogSpout, SyntheticSource, SyntheticSpout, Constant
from topo.state import KeyedBolt
from topo.topology import Topology, TopologyBuilder

pytestmark = pytest.mark.spark

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def spark():
    from runtime.spark.session import get_session

    session = get_session("local[2]", shuffle_partitions=2, log_level="ERROR")
    yield session
    session.stop()


def _topo_run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p))
    return subprocess.run([sys.executable, "-m", "topo.cli", "run", *args, "--quiet"], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


def test_wordcount_same_counts_on_local_and_spark(tmp_path):
    """configs/wordcount.yaml, unchanged, through `topo run` on both engines: the same
    exact counts in wordcount.db, several micro-batches on Spark, and a quiet stderr
    (no pandas FutureWarning, no JVM warning about incubator modules, no Java or Python
    stack trace at the normal shutdown, no PySpark worker chatter) and nothing of that on
    stdout either."""
    wordcount = str(REPO / "configs" / "wordcount.yaml")
    counts = {}
    for engine in ("local", "spark"):
        (tmp_path / engine).mkdir()
        proc = _topo_run(["--engine", engine, wordcount], tmp_path / engine)
        assert proc.returncode == 0, proc.stderr[-4000:]
        for noise in ("FutureWarning", "Traceback", "Exception", "\tat ", "ERROR", "incubator",
                      "TransformWithStateInPandas"):
            assert noise not in proc.stderr, proc.stderr[-4000:]
        assert "TransformWithStateInPandas" not in proc.stdout, proc.stdout[-4000:]
        counts[engine] = dict(read_table(str(tmp_path / engine / "wordcount.db"), "word_counts"))
    assert counts["local"] == dict(expected_counts(DEFAULT_SENTENCES, 2000))
    assert counts["spark"] == counts["local"]
    assert not (tmp_path / "spark" / "topo-results.db").exists()   # spark.sink: none


class Bucket(Bolt):
    outputs = ["bucket", "size"]

    def execute(self, tup):
        self.collector.emit([tup["id"] % 5, len(tup["payload"])])


class BucketTotals(KeyedBolt):
    outputs = ["bucket", "n", "size"]
    key_fields = ("bucket",)

    def process(self, tup, state):
        state["n"] = state.get("n", 0) + 1
        state["size"] = state.get("size", 0) + tup["size"]
        self.collector.emit([tup["bucket"], state["n"], state["size"]])


def bucket_topology(total: int) -> Topology:
    b = TopologyBuilder("buckets")
    b.spout("gen", SyntheticSpout("constant", rate=1500, partitions=2, total=total, max_len=64))
    b.bolt("bucket", Bucket(), 2).shuffle("gen")
    b.bolt("totals", BucketTotals(), 2).fields("bucket", "bucket")
    return b.build()


def test_streaming_end_to_end_with_adaptive_rate_control(spark, tmp_path):
    total = 3000
    src = SyntheticSource(Constant(1), partitions=2, total=total, max_len=64).started_at(0.0)
    expected: dict[int, tuple[int, int]] = {}
    for p in range(2):
        for i, payload, _ in src.read(p, 0, total):
            n, size = expected.get(i % 5, (0, 0))
            expected[i % 5] = (n + 1, size + len(payload))

    url = f"sqlite:{tmp_path}/out.db"
    import threading
    import urllib.request

    from test_sources import free_port

    port = free_port()
    scraped: list[str] = []
    done = threading.Event()

    def scrape() -> None:
        while not done.is_set():
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                    scraped.append(r.read(1 << 20).decode())
            except OSError:
                pass
            done.wait(0.5)

    scraper = threading.Thread(target=scrape, daemon=True)
    scraper.start()
    try:
        result = spark_engine.run(bucket_topology(total), {"spark.sink": url, "spark.initial_rate": 200.0,
                                                           "metrics.port": port}, spark=spark, duration=300)
    finally:
        done.set()
        scraper.join(5)
    assert any('topo_spark_batches_total{' in text and 'component="gen"' in text for text in scraped)
    assert result.reason == "exhausted" and result.input_rows == total
    assert len(result.batches) >= 2
    for b in result.batches:                       # admission never exceeded the published cap
        cap = b.cap_by_source["gen"]
        assert cap is not None and b.rows <= max(1, int(cap * 1.0 / 2)) * 2
    assert result.batches[0].rows <= 400           # slow start: 200 per partition per second
    stats = result.spark_stats[0]
    assert stats.batches == len(result.batches) and stats.input_rows == total
    summary = result.summary()
    assert summary["batches"] == len(result.batches) and summary["throughput_rows_per_s"] > 0

    rows = read_rows(url, "totals")
    final: dict[int, tuple[int, int]] = {}
    for _qid, _batch, _seq, bucket, n, size in rows:
        if n > final.get(bucket, (0, 0))[0]:
            final[bucket] = (n, size)
    assert final == expected
    assert len(rows) == total                      # one emit per tuple, no batch written twice

    # the same KeyedBolt on the local engine ends with the same per-key state
    captured: list[BucketTotals] = []

    class Capturing(BucketTotals):
        def cleanup(self):
            captured.append(self)

    b = TopologyBuilder("buckets-local")
    b.spout("gen", SyntheticSpout("constant", rate=200_000, partitions=2, total=total, max_len=64))
    b.bolt("bucket", Bucket(), 2).shuffle("gen")
    b.bolt("totals", Capturing(), 2).fields("bucket", "bucket")
    assert run_local(b.build(), None, duration=60).reason == "exhausted"
    local_state = {k: (v["n"], v["size"]) for bolt in captured for k, v in bolt.keyed_state()}
    assert local_state == expected


from test_keyed_state import Counter as WordCounter  # noqa: E402  (KeyedBolt: word -> running count)
from test_sources import redis_url  # noqa: E402,F401  (the fixture: a redis-server on a free port)


class Exploding(Bolt):
    outputs = ["x"]

    def execute(self, tup):
        raise ValueError("boom in execute")


def test_failing_bolt_fails_the_run_with_its_error(spark, tmp_path):
    b = TopologyBuilder("exploding")
    b.spout("gen", SyntheticSpout("constant", rate=10_000, partitions=1, total=10))
    b.bolt("bad", Exploding()).shuffle("gen")
    with pytest.raises(ComponentError, match=r"^bolt 'bad': execute raised ValueError: boom in execute \(on Spark; "
                                             r"run again with --debug for the full trace\)$"):
        spark_engine.run(b.build(), {"spark.sink": "none"}, spark=spark, duration=120)


def test_redis_streams_source_on_spark(spark, tmp_path, redis_url):
    from topo.examples.wordcount import SplitBolt
    from topo.sources import RedisLog

    log = RedisLog(redis_url, "spark-wc", partitions=2)
    for i in range(40):
        for s in DEFAULT_SENTENCES:
            log.produce(s, key=f"{i}-{s}")
    b = TopologyBuilder("redis-wc")
    b.spout("lines", MessageLogSpout(redis_url, "spark-wc", columns=("value",), fields=("sentence",)))
    b.bolt("split", SplitBolt(), 2).shuffle("lines")
    b.bolt("count", WordCounter(), 2).fields("split", "word")
    url = f"sqlite:{tmp_path}/out.db"
    result = spark_engine.run(b.build(), {"spark.sink": url, "spark.rate_control": "pid"}, spark=spark,
                              duration=300)
    assert result.reason == "exhausted" and result.input_rows == 40 * len(DEFAULT_SENTENCES)
    final: dict[str, int] = {}
    for *_ids, word, n in read_rows(url, "count"):
        final[word] = max(final.get(word, 0), n)
    assert final == dict(expected_counts(DEFAULT_SENTENCES, 40))


def test_restart_replays_a_batch_without_double_counting(spark, tmp_path):
    """Stop after a few batches, forget the last batch's commit (as if the driver died
    after the sink wrote it), restart from the checkpoint: Spark re-runs that batch, the
    sink skips it by its marker, the state store resumes, and the counts come out exact."""
    from topo.examples.wordcount import SplitBolt

    log = FileLog(tmp_path / "log", "lines", partitions=2)
    for _ in range(30):
        for s in DEFAULT_SENTENCES:
            log.produce(s)
    b = TopologyBuilder("restart")
    b.spout("lines", MessageLogSpout(str(tmp_path / "log"), "lines", columns=("value",), fields=("sentence",)))
    b.bolt("split", SplitBolt(), 2).shuffle("lines")
    b.bolt("count", WordCounter(), 2).fields("split", "word")
    topo = b.build()
    url = f"sqlite:{tmp_path}/out.db"
    cfg = {"spark.sink": url, "spark.checkpoint_dir": str(tmp_path / "ckpt"), "spark.rate_control": "fixed",
           "spark.max_rate_per_partition": 10.0}
    first = spark_engine.run(topo, cfg, spark=spark, max_tuples=40, duration=300)
    assert first.reason == "max_tuples" and 0 < first.input_rows < 150
    commits = sorted((p for p in (tmp_path / "ckpt" / "commits").iterdir() if p.name.isdigit()),
                     key=lambda p: int(p.name))
    last = commits[-1]
    for log_dir, keep_below in (("commits", int(last.name)), ("offsets", int(last.name) + 1)):
        for f in (tmp_path / "ckpt" / log_dir).iterdir():   # also a batch in flight at the stop
            name = f.name.strip(".").removesuffix(".crc")
            if name.isdigit() and int(name) >= keep_below:
                f.unlink()
    second = spark_engine.run(topo, cfg, spark=spark, duration=300)
    assert second.reason == "exhausted"
    assert second.query_id == first.query_id
    assert second.batches[0].batch_id == int(last.name)     # the forgotten batch ran again
    rows = read_rows(url, "count")
    final: dict[str, int] = {}
    for *_ids, word, n in rows:
        final[word] = max(final.get(word, 0), n)
    assert final == dict(expected_counts(DEFAULT_SENTENCES, 30))
    assert len(rows) == sum(final.values())          # every word tuple written exactly once


class Slow(Bolt):
    """Takes ``delay`` seconds per tuple: batches that overrun the trigger interval."""

    outputs = ["id"]

    def __init__(self, delay: float) -> None:
        self.delay = delay

    def execute(self, tup):
        time.sleep(self.delay)
        self.collector.emit([tup["id"]])


def _last_batch_id(log_dir: Path) -> int:
    """The last batch id in a checkpoint's ``offsets`` or ``commits`` log (-1: none)."""
    return max((int(p.name) for p in log_dir.iterdir() if p.name.isdigit()), default=-1)


def test_a_duration_stop_lets_the_batch_in_flight_finish(spark, tmp_path):
    """Batches run back to back (each overruns the 0.5 s trigger), so one is always in
    flight when the duration ends: the stop lets it finish. Its offsets have a commit
    (stopped in the middle, Spark logs its offsets and never commits them), and its
    tuples reach the sink: every row the listener counted was written."""
    b = TopologyBuilder("drain")
    b.spout("gen", SyntheticSpout("constant", rate=1000.0, partitions=2))
    b.bolt("slow", Slow(0.02), 2).shuffle("gen")
    url = f"sqlite:{tmp_path}/out.db"
    cfg = {"spark.sink": url, "spark.checkpoint_dir": str(tmp_path / "ckpt"), "spark.rate_control": "fixed",
           "spark.max_rate_per_partition": 40.0, "spark.trigger_interval_ms": 500}
    result = spark_engine.run(b.build(), cfg, spark=spark, duration=8)
    assert result.reason == "duration"
    ckpt = tmp_path / "ckpt"
    assert _last_batch_id(ckpt / "offsets") == _last_batch_id(ckpt / "commits") == result.batches[-1].batch_id
    assert len(read_rows(url, "slow")) == result.input_rows
    assert len(result.batches) >= 2
    assert all(r.processing_time > 0.5 for r in result.batches[1:])       # back to back: always one in flight


class _Recording:
    """A sink that keeps what it is handed (``discards`` as ``NullSink`` has it, or not)."""

    def __init__(self, discards: bool) -> None:
        self.discards = discards
        self.batches: list[tuple[int, dict]] = []

    def write_batch(self, query_id, batch_id, rows):
        self.batches.append((batch_id, rows))
        return True


def test_spark_sink_none_runs_a_batch_without_collecting_its_tuples(spark, tmp_path):
    """Under ``spark.sink: none`` a batch runs into Spark's noop sink: the sink is handed no
    rows (nothing was brought to the driver); a sink that keeps them gets every row."""
    import msgpack

    from runtime.spark.engine import _BatchWriter
    from runtime.spark.result_store import NullSink

    assert NullSink.discards
    df = spark.createDataFrame([("gen", "default", msgpack.packb([i])) for i in range(7)],
                               "src string, stream string, v binary")
    checkpoint = tmp_path / "ck"
    checkpoint.mkdir()
    (checkpoint / "metadata").write_text('{"id":"q1"}')
    dropping, keeping = _Recording(discards=True), _Recording(discards=False)
    _BatchWriter(dropping, {("gen", "default"): ["n"]}, str(checkpoint)).write_batch(df, 0)
    _BatchWriter(keeping, {("gen", "default"): ["n"]}, str(checkpoint)).write_batch(df, 0)
    assert dropping.batches == []
    assert keeping.batches == [(0, {("gen", "default"): [[i] for i in range(7)]})]


class Upper(Bolt):
    outputs = ["word"]

    def execute(self, tup):
        self.collector.emit([tup["word"].upper()])


def _chain_topology(log_dir: Path) -> Topology:
    """lines -> split (shuffle) -> upper (local_or_shuffle) -> count (fields): the first two
    bolts chain into the spout's reader."""
    from topo.examples.wordcount import SplitBolt

    b = TopologyBuilder("chained")
    b.spout("lines", MessageLogSpout(str(log_dir), "lines", columns=("value",), fields=("sentence",)))
    b.bolt("split", SplitBolt(), 2).shuffle("lines")
    b.bolt("upper", Upper(), 2).local_or_shuffle("split")
    b.bolt("count", WordCounter(), 2).fields("upper", "word")
    return b.build()


def test_a_chained_run_writes_what_a_run_with_a_stage_per_bolt_writes(spark, tmp_path):
    """spark.chain on and off over the same log: the same exact final counts, every word tuple
    written once, and the rows counted by what the source read (25 sentences a batch under
    the fixed cap), not by the 8-odd words a sentence the chained split puts out."""
    log = FileLog(tmp_path / "log", "lines", partitions=1)
    for _ in range(20):
        for s in DEFAULT_SENTENCES:
            log.produce(s)
    topo = _chain_topology(tmp_path / "log")
    finals = {}
    for chain in (True, False):
        url = f"sqlite:{tmp_path}/out-{chain}.db"
        result = spark_engine.run(topo, {"spark.sink": url, "spark.chain": chain, "spark.rate_control": "fixed",
                                         "spark.max_rate_per_partition": 25.0}, spark=spark, duration=300)
        assert result.reason == "exhausted" and result.input_rows == 20 * len(DEFAULT_SENTENCES)
        assert len(result.batches) >= 3 and all(b.rows <= 25 for b in result.batches)
        rows = read_rows(url, "count")
        final: dict[str, int] = {}
        for *_ids, word, n in rows:
            final[word] = max(final.get(word, 0), n)
        assert len(rows) == sum(final.values())
        finals[chain] = final
    assert finals[True] == finals[False] == {w.upper(): n for w, n in expected_counts(DEFAULT_SENTENCES, 20).items()}


def test_a_chained_bolt_has_no_stage_of_its_own(spark, tmp_path):
    """The plan of a chained topology reads the source's frame where the chained bolts'
    ``mapInArrow`` stages were: only the keyer in front of the stateful count is left."""
    from runtime.spark.plan import build, chains, stage_plans

    FileLog(tmp_path / "log", "lines", partitions=1)
    topo = _chain_topology(tmp_path / "log")
    plans = stage_plans(topo, {})
    bus = spark.createDataFrame([("lines", "default", b"\x91\xa1a")], "src string, stream string, v binary")
    plan_text = [build(spark, topo, plans, {"lines": bus}, chained)._jdf.queryExecution().analyzed().toString()
                 for chained in ({}, chains(topo, plans))]
    assert chains(topo, plans) == {"lines": ["split", "upper"]}
    assert [text.count("MapInArrow") for text in plan_text] == [3, 1]
