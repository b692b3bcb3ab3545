"""The Spark engine: a topology as one PySpark Structured Streaming query.

``run(topology, config, master=..., duration=..., max_tuples=...)`` is what
``topo run --engine spark`` and ``topo.run(..., engine="spark")`` call. It

1. checks that the topology maps (``runtime.spark.plan.check``; a clear
   ``TopologyError`` names every component that does not);
2. starts (or reuses, ``spark=``) a session: ``spark.master``, ``local[*]`` by default;
3. creates one streaming source per spout (``runtime.spark.datasource``: pre-sharding
   over ``core_num`` cores, admission capped by that spout's rate controller);
4. chains the bolts (``runtime.spark.bolts``) and writes the terminal streams to the
   database sink with ``foreachBatch`` (``runtime.spark.result_store``, idempotent by batch);
5. runs the rate-control loop: a ``StreamingQueryListener`` and a submission ticker
   feed the controllers (``runtime.spark.listener``), which publish caps to the reader;
6. stops when every source is finite and read (``exhausted``), after ``duration``
   seconds, once ``max_tuples`` source rows have been processed (checked per batch, so
   the last batch may go past it), or on Ctrl-C (``signal``), each with drain (``QueryStop``:
   the batch in flight finishes first); a failed query re-raises its error.

Decisions where the issue is silent, as a Storm or Spark user would expect them:
one query per topology (a spout is a source, not a query); with ``metrics.port`` set
the driver serves the per-source ``topo_spark_*`` Prometheus metrics (batches, rows,
batch duration, scheduling delay, controller cap) on ``metrics.host``; ``max_tuples`` counts
spout tuples as on the local engine; the checkpoint and rate files live in a
temporary directory removed at the end unless ``spark.checkpoint_dir`` /
``spark.state_dir`` are set (a set checkpoint resumes from its offsets and state); a
session the engine started is stopped at the end, one passed in is left running.

On a cluster (any master but ``local``): the user's modules are zipped and shipped to
the executors (``runtime.spark.shipping``); what executors on other machines could not
reach is refused before the session starts (``runtime.spark.placement``); on a
cluster on this machine the executors' Python workers work in the driver's directory.
Spark's own log goes to ``spark-logs/<topology>-<time>.log`` (``spark.log: file``, the
default) or the terminal (``console``). A failed query raises ``ComponentError`` with
one line: the bolt and the exception its Python worker raised (or the first Python
exception of the trace), the full trace as its cause.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import statistics
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import msgpack

from backpressure.policy.rate_control import make_controller
from runtime.observe.spark_progress import progress_rows
from runtime.observe.spark_stats import SparkStats
from runtime.spark.datasource import (SOURCE_NAME, OffsetDataSource, clear_stop, encode_chain, source_options,
                                      write_stop)
from runtime.spark.listener import (BatchRecord, RateFeedback, SourceControl, SubmissionTicker,
                                    make_listener, next_boundary)
from runtime.spark.bolts import FAILURE_PREFIX
from runtime.spark.checkpoint_log import use_manager
from runtime.spark.placement import check as check_placement
from runtime.spark.placement import executor_workdir, is_local, on_this_machine
from runtime.spark.plan import build, chains, needs_tws, stage_plans, terminal_streams
from runtime.spark.result_store import BatchSink, open_sink
from runtime.spark.session import driver_host
from runtime.spark.shipping import build_zip, roots_of, user_modules
from topo.api import ComponentError
from topo.config import resolve
from topo.sources.base import select_columns
from topo.topology import Topology, TopologyError

log = logging.getLogger(__name__)

# How long a stopped query's last progress event may take to reach the listener.
LISTENER_SETTLE_S = 2.0

ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"


@dataclass
class SparkRunResult:
    """What a Spark run returns: why it stopped, per-batch records and per-source stats."""

    reason: str
    batches: list[BatchRecord]
    spark_stats: list[SparkStats]
    input_rows: int
    elapsed: float
    rate_control: str
    query_id: str = ""
    checkpoint: str = ""
    sink: str = ""
    stats: list[Any] = field(default_factory=list)   # local-engine TaskStats: none on Spark
    log_file: str = ""                                 # Spark's log, with spark.log: file
    shipped: list[str] = field(default_factory=list)   # the user's modules zipped for the executors

    def summary(self) -> dict[str, Any]:
        """Mean and p95 scheduling delay, processing time per batch, throughput."""
        return {"rate_control": self.rate_control, **summarize(self.batches, self.elapsed)}


def summarize(batches: Sequence[BatchRecord], elapsed: float) -> dict[str, Any]:
    """Figures over ``batches`` (data batches) run in ``elapsed`` seconds."""
    delays = [b.scheduling_delay for b in batches]
    procs = [b.processing_time for b in batches]
    rows = sum(b.rows for b in batches)
    return {
        "batches": len(batches),
        "input_rows": rows,
        "elapsed_s": elapsed,
        "throughput_rows_per_s": rows / elapsed if elapsed > 0 else 0.0,
        "scheduling_delay_mean_ms": 1000 * statistics.fmean(delays) if delays else 0.0,
        "scheduling_delay_p95_ms": 1000 * percentile(delays, 95) if delays else 0.0,
        "delayed_batches": sum(1 for d in delays if d > 0.01),
        "processing_time_mean_ms": 1000 * statistics.fmean(procs) if procs else 0.0,
        "processing_time_p95_ms": 1000 * percentile(procs, 95) if procs else 0.0,
    }


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))
    return ordered[int(rank) - 1]


def _read_query_id(checkpoint: str) -> str:
    meta = Path(checkpoint) / "metadata"
    with open(meta, "rb") as f:
        return str(json.loads(f.read(64 * 1024))["id"])


def _check_tws_available() -> None:
    try:
        import google.protobuf  # noqa: F401
    except ImportError:
        raise TopologyError("this topology has several stateful bolts; Spark chains them only with "
                            "transformWithStateInPandas, which needs the 'protobuf' package "
                            "(pip install protobuf)") from None


def run(topology: Topology, config: Mapping[str, Any] | None = None, *, master: str | None = None,
        duration: float | None = None, max_tuples: int | None = None, spark: Any = None,
        handle_signals: bool = True) -> SparkRunResult:
    """Run ``topology`` on Spark (see the module docstring).

    Every resource is registered with one ``ExitStack`` the moment it exists, so it is
    released in the reverse order of acquisition: ticker, query, listener, database
    sink, metrics server, session (when the engine started it), temporary directory.
    """
    cfg = resolve(topology.config, dict(config or {}))
    plans = stage_plans(topology, cfg)
    if needs_tws(plans):
        _check_tws_available()
    interval_s = float(cfg["spark.trigger_interval_ms"]) / 1000.0
    master_url = spark.sparkContext.master if spark is not None else (master or cfg["spark.master"])
    stateful, workdir = _place(topology, cfg, plans, master_url)
    with contextlib.ExitStack() as stack:
        temp_dir = _temp_dir(stack)
        spark, own_session = _session(stack, spark, master, cfg, _log_file(topology.name, cfg))
        log_file = _spark_log(spark)
        shipped = _ship_code(spark, topology, temp_dir)
        state_dir = cfg["spark.state_dir"] or str(Path(temp_dir) / "state")
        Path(state_dir).mkdir(parents=True, exist_ok=True)
        checkpoint = cfg["spark.checkpoint_dir"] or _default_checkpoint(stack, cfg, temp_dir, master_url, stateful)
        core_num = _configure(spark, cfg, plans, own_session)
        use_manager(stack, spark, cfg["spark.checkpoint_file_manager"], checkpoint)

        stats, options, feedback = _rate_control(topology, cfg, interval_s, core_num, state_dir)
        for opts in options.values():
            opts["workdir"] = workdir or ""
        chained = chains(topology, plans) if cfg["spark.chain"] else {}
        for spout, chain in chained.items():
            options[spout]["chain"] = encode_chain([plans[b] for b in chain])
        _serve_metrics(stack, cfg, stats)
        feedback.submit(next_boundary(time.time(), interval_s))   # slow start caps before the first trigger
        frames = {cid: spark.readStream.format(SOURCE_NAME).options(**opts).load() for cid, opts in options.items()}
        result_df = build(spark, topology, plans, frames, chained)

        streams = {(c, s): topology.components[c].outputs[s] for c, ss in terminal_streams(topology).items()
                   for s in ss}
        sink = open_sink(cfg["spark.sink"], streams)
        stack.callback(sink.close)
        writer = _BatchWriter(sink, streams, checkpoint)
        clear_stop(state_dir)
        stop = QueryStop(state_dir, float(cfg["drain_timeout_s"]))
        started, query = _start_query(stack, spark, result_df, f"{topology.name}-{uuid.uuid4().hex[:8]}",
                                      feedback, writer, interval_s, checkpoint, stop)
        reason = _wait(query, feedback, started, duration, max_tuples, handle_signals, log_file)
        stop(query)     # with drain: the run's time and rows include the batch it let finish
        elapsed = stop.drained_at - started
        last = _last_data_batch(query)
        if last is not None:
            feedback.wait_for_batch(last, LISTENER_SETTLE_S)
        return SparkRunResult(reason, list(feedback.batches), list(stats.values()), feedback.input_rows, elapsed,
                              cfg["spark.rate_control"], writer.query_id,
                              checkpoint if cfg["spark.checkpoint_dir"] else "", cfg["spark.sink"],
                              log_file=log_file, shipped=shipped)


def _place(topology: Topology, cfg: Mapping[str, Any], plans: dict[str, Any],
           master: str) -> tuple[list[str], str | None]:
    """Before Spark starts: refuse what executors on other machines cannot reach
    (``placement``), and give every bolt the executors' working directory; returns
    (the stateful bolts, that directory)."""
    stateful = [cid for cid, p in plans.items() if p.mode != "partition"]
    if not on_this_machine(master):
        check_placement(topology, cfg, master, {s.id: s.instance().source() for s in topology.spouts},
                        stateful, driver_host())
    workdir = executor_workdir(master)
    for plan in plans.values():
        plan.workdir = workdir
    return stateful, workdir


def _temp_dir(stack: contextlib.ExitStack) -> str:
    """The run's scratch directory (default checkpoint and rate files), removed at the end."""
    temp_dir = tempfile.mkdtemp(prefix="topo-spark-")
    stack.callback(shutil.rmtree, temp_dir, ignore_errors=True)
    return temp_dir


def _log_file(name: str, cfg: Mapping[str, Any]) -> str:
    """Where Spark's log goes with ``spark.log: file``: ``spark-logs/<name>-<UTC time>.log``
    under the working directory ("" for ``console``)."""
    if cfg["spark.log"] != "file":
        return ""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    return os.path.join("spark-logs", f"{name}-{stamp}-{uuid.uuid4().hex[:4]}.log")


def _spark_log(spark: Any) -> str:
    """The file Spark's driver log goes to ("" for the terminal): set when the driver JVM
    started, so a later session in the same process writes to the first one's file."""
    try:
        path = spark.sparkContext._jvm.java.lang.System.getProperty("topo.spark.log")
    except Exception:   # pragma: no cover - a session without a py4j JVM (Spark Connect)
        return ""
    if not path:
        return ""
    relative = os.path.relpath(path)
    return path if relative.startswith("..") else relative


def _session(stack: contextlib.ExitStack, spark: Any, master: str | None,
             cfg: Mapping[str, Any], log_file: str) -> tuple[Any, bool]:
    """The session passed in (left running), or one the engine starts (stopped at the end)."""
    if spark is not None:
        return spark, False
    from runtime.spark.session import get_session

    spark = get_session(master or cfg["spark.master"], shuffle_partitions=cfg["spark.shuffle_partitions"],
                        log_file=os.path.abspath(log_file) if log_file else None)
    stack.callback(spark.stop)
    return spark, True


def _ship_code(spark: Any, topology: Topology, temp_dir: str) -> list[str]:
    """On a cluster, zip the user's modules the components need and add the zip to the
    session (``addPyFile``: every executor puts it on its ``sys.path``); returns their names."""
    if is_local(spark.sparkContext.master):
        return []
    modules = user_modules(roots_of(spec.instance() for spec in topology.components.values()))
    if not modules:
        return []
    path = build_zip(modules, Path(temp_dir) / f"topo-code-{uuid.uuid4().hex[:8]}.zip")
    spark.sparkContext.addPyFile(str(path))
    return [m.name for m in modules]


def _default_checkpoint(stack: contextlib.ExitStack, cfg: Mapping[str, Any], temp_dir: str, master: str,
                        stateful: list[str]) -> str:
    """Without ``spark.checkpoint_dir``: a temporary checkpoint, in ``spark.shared_dir`` when
    executors on other machines write state there (``placement``), removed at the end."""
    if stateful and not on_this_machine(master):
        shared = tempfile.mkdtemp(prefix="topo-checkpoint-", dir=cfg["spark.shared_dir"])
        stack.callback(shutil.rmtree, shared, ignore_errors=True)
        return shared
    return str(Path(temp_dir) / "checkpoint")


def _configure(spark: Any, cfg: Mapping[str, Any], plans: dict[str, Any], own_session: bool) -> int:
    """Shuffle partitions, the state store, the data source; returns ``core_num``."""
    core_num = int(cfg["spark.core_num"] or spark.sparkContext.defaultParallelism)
    shuffle = cfg["spark.shuffle_partitions"] or (core_num if own_session else None)
    if shuffle is not None:   # a session passed in keeps its own unless the config says
        spark.conf.set("spark.sql.shuffle.partitions", str(shuffle))
    if needs_tws(plans):
        spark.conf.set("spark.sql.streaming.stateStore.providerClass", ROCKSDB)
    spark.dataSource.register(OffsetDataSource)
    return core_num


def _rate_control(topology: Topology, cfg: Mapping[str, Any], interval_s: float, core_num: int,
                  state_dir: str) -> tuple[dict[str, SparkStats], dict[str, dict[str, str]], RateFeedback]:
    """One rate controller, stats record and set of source options per spout, and the
    feedback loop over them: (stats, source options, feedback), keyed by spout id."""
    controls: dict[str, SourceControl] = {}
    stats: dict[str, SparkStats] = {}
    options: dict[str, dict[str, str]] = {}
    for spec in topology.spouts:
        spout = spec.instance()
        source = spout.started_source()
        partitions = source.num_partitions()
        bound = spout.bound(source)
        controller = make_controller(cfg["spark.rate_control"], interval_s, partitions,
                                     initial_rate_per_partition=cfg["spark.initial_rate"],
                                     min_rate=cfg["spark.min_rate"],
                                     fixed_rate_per_partition=cfg["spark.max_rate_per_partition"],
                                     smooth_batches=cfg["spark.smooth_batches"],
                                     headroom=cfg["spark.headroom"], late_floor=cfg["spark.late_floor"])
        sc = SourceControl(spec.id, controller, bound)
        sc.done = bound is not None and sum(bound.values()) == 0
        controls[spec.id] = sc
        stats[spec.id] = SparkStats(topology.name, spec.id)
        options[spec.id] = source_options(
            spec.id, source, select_columns(source.columns, spout.columns), core_num=core_num,
            interval_s=interval_s, state_dir=state_dir, bound=bound, max_rows=cfg["spark.max_rows_per_batch"])
    return stats, options, RateFeedback(interval_s, controls, state_dir, stats)


def _serve_metrics(stack: contextlib.ExitStack, cfg: Mapping[str, Any], stats: Mapping[str, SparkStats]) -> None:
    """With ``metrics.port`` set, serve the per-source ``topo_spark_*`` metrics until the end."""
    if not cfg["metrics.port"]:
        return
    from runtime.observe.prometheus import MetricsServer, MetricsTls, make_registry

    registry, _ = make_registry(lambda: [], lambda: list(stats.values()))
    exporter = MetricsServer(registry, cfg["metrics.port"], cfg["metrics.host"], MetricsTls.from_config(cfg))
    exporter.start()
    stack.callback(exporter.stop)


class _BatchWriter:
    """The ``foreachBatch`` function: a micro-batch's terminal tuples to the database sink,
    under the query's id (read from the checkpoint on the first batch)."""

    def __init__(self, sink: BatchSink, streams: Mapping[tuple[str, str], Sequence[str]], checkpoint: str) -> None:
        self.sink = sink
        self.streams = streams
        self.checkpoint = checkpoint
        self.query_id = ""

    def write_batch(self, batch_df: Any, batch_id: int) -> None:
        if self.sink.discards:
            # Run the batch (its bolts must run) without bringing its tuples to the driver.
            batch_df.write.format("noop").mode("overwrite").save()
            return
        table = batch_df.toArrow()
        rows: dict[tuple[str, str], list[list[Any]]] = {k: [] for k in self.streams}
        if table.num_rows:
            cols = table.to_pydict()
            for src, stream, v in zip(cols["src"], cols["stream"], cols["v"]):
                rows[(src, stream)].append(msgpack.unpackb(v, raw=False))
        if not self.query_id:
            self.query_id = _read_query_id(self.checkpoint)
        self.sink.write_batch(self.query_id, batch_id, rows)


def _start_query(stack: contextlib.ExitStack, spark: Any, result_df: Any, name: str, feedback: RateFeedback,
                 writer: _BatchWriter, interval_s: float, checkpoint: str, stop: QueryStop) -> tuple[float, Any]:
    """Listener, streaming query and submission ticker, each stopped at the end (the
    query by ``stop``); returns (start time, query)."""
    listener = make_listener(feedback, name)
    stack.callback(spark.streams.removeListener, listener)
    spark.streams.addListener(listener)
    started = feedback.origin = time.time()
    query = (result_df.writeStream.queryName(name).foreachBatch(writer.write_batch)
             .trigger(processingTime=f"{int(round(interval_s * 1000))} milliseconds")
             .option("checkpointLocation", checkpoint).start())
    stack.callback(stop, query)
    ticker = SubmissionTicker(feedback, interval_s)
    stack.callback(ticker.stop)
    ticker.start()
    return started, query


@dataclass
class QueryStop:
    """Stops a query with drain, as the local engine stops a topology: the readers admit
    no more rows (``datasource.write_stop``), the micro-batch in flight finishes (its
    rows reach the sink, its offsets are committed) for up to ``drain_timeout_s``, and
    only then is the query stopped. Stopped in the middle of a batch, Spark aborts the
    batch's write and its Python workers die on a closed socket, each printing a trace
    to the terminal. A second Ctrl-C while waiting stops at once."""

    state_dir: str
    drain_timeout_s: float
    poll_s: float = 0.02
    done: bool = False
    drained_at: float = 0.0     # when the drain ended (time.time()), before the query stopped

    def __call__(self, query: Any) -> None:
        if self.done:
            return
        self.done = True
        try:
            write_stop(self.state_dir)
            self.drain(query)
        except KeyboardInterrupt:
            pass
        finally:
            self.drained_at = time.time()
            _stop_query(query)
            clear_stop(self.state_dir)

    def drain(self, query: Any) -> bool:
        """Wait until no trigger is running (a trigger that read offsets before the stop
        marker was written is active until its batch ends); False if the time ran out."""
        deadline = time.monotonic() + self.drain_timeout_s
        while query.isActive and query.status.get("isTriggerActive"):
            if time.monotonic() >= deadline:
                log.warning("spark: the batch in flight did not finish within drain_timeout_s "
                            "(%.1f s); the query is stopped in the middle of it", self.drain_timeout_s)
                return False
            time.sleep(self.poll_s)
        return True


def _last_data_batch(query: Any) -> int | None:
    """The id of the query's last batch that read rows (None if none did)."""
    for progress in reversed(query.recentProgress):
        if progress_rows(progress):
            return int(progress["batchId"])
    return None


def _stop_query(query: Any) -> None:
    try:
        query.stop()
    except Exception:  # pragma: no cover - stopping a failed query
        pass


def failure_line(text: str) -> str:
    """The one line a failed query's trace comes down to: the ``BoltFailure`` a bolt raised
    (``bolt 'work': execute raised ValueError: boom``), else the first Python exception of
    the trace (``ModuleNotFoundError: No module named 'x'``), else the trace's first line."""
    at = text.rfind(FAILURE_PREFIX)
    if at >= 0:
        return text[at + len(FAILURE_PREFIX):].splitlines()[0].strip()
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.rstrip().endswith("Traceback (most recent call last):"):
            for after in lines[i + 1:]:
                if after and not after[0].isspace():
                    return " ".join(after.split())
    first = " ".join(text.strip().splitlines()[0].split()) if text.strip() else "no message"
    return first if len(first) <= 300 else first[:297] + "..."


def _query_failed(err: Any, log_file: str, debugging: bool | None = None) -> ComponentError:
    """The one-line error of a failed query. Spark's error is its cause, so a traceback
    shows Spark's trace above this line; the CLI prints one with ``--debug``, which turns
    on DEBUG logging, and then the line says so instead of asking for ``--debug``."""
    text = str(getattr(err, "desc", None) or err)
    line = failure_line(text)
    where = f"; Spark's log: {log_file}" if log_file else ""
    prefix = "" if FAILURE_PREFIX in text else "the streaming query failed: "
    if debugging is None:
        debugging = logging.getLogger().isEnabledFor(logging.DEBUG)
    hint = "Spark's trace is above" if debugging else "run again with --debug for the full trace"
    return ComponentError(f"{prefix}{line} (on Spark; {hint}{where})")


def _wait(query: Any, feedback: RateFeedback, started: float, duration: float | None,
          max_tuples: int | None, handle_signals: bool, log_file: str = "") -> str:
    try:
        while True:
            if feedback.error is not None:
                raise feedback.error
            if not query.isActive:
                err = query.exception()
                if err is not None:
                    raise _query_failed(err, log_file) from err
                return "stopped"
            if feedback.exhausted():
                return "exhausted"
            if max_tuples is not None and feedback.input_rows >= max_tuples:
                return "max_tuples"
            if duration is not None and time.time() - started >= duration:
                return "duration"
            feedback.updated.wait(0.1)
            feedback.updated.clear()
    except KeyboardInterrupt:
        if not handle_signals:
            raise
        return "signal"
