"""The dashboard's PromQL, run by a real Prometheus against a live exporter.

A dashboard is only as good as its queries: a metric renamed in the exporter but not
in ``configs/grafana-dashboard.json`` leaves a panel silently empty. So this starts
the Debian ``prometheus`` binary on 127.0.0.1 with a temp config that scrapes the
exporter every second, and runs every ``expr`` of the dashboard through
``/api/v1/query``. Each must return series carrying the labels its legend names
(and ``topology``, which the dashboard's variables filter on) and a finite value.

Two sources feed it: synthetic ``TaskStats`` mutated by a thread (every family is
non-trivial, Spark's too), and a really running spout -> bolt -> bolt topology on
the local engine with ``metrics.port`` set (plus a synthetic Spark exporter, as no
Spark engine runs here).
"""
from __future__ import annotations

import asyncio
import json
import math
import random
import re
import shutil
import socket
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Iterator

import pytest
import yaml

from servers import stop_process
from runtime.observe.prometheus import DEFAULT_PORT, MetricsServer, MetricsService, make_registry
from runtime.observe.stats import TaskStats
from runtime.observe.spark_stats import SparkStats

pytestmark = pytest.mark.prometheus

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD = ROOT / "configs" / "grafana-dashboard.json"
PROMETHEUS_YML = ROOT / "configs" / "prometheus.yml"
PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")
# What Grafana would substitute; rate() over 15s needs two of the 1s scrapes and rides out
# a few seconds without acks while flow control holds a spout back.
SUBSTITUTIONS = {"$__rate_interval": "15s", "$topology": ".*", "$component": ".*"}
needs_prometheus = pytest.mark.skipif(PROMETHEUS is None, reason="Debian prometheus package not installed")


# ---------------------------------------------------------------- dashboard

def _walk_panels(panels: list[dict]) -> Iterator[dict]:
    for p in panels:
        yield p
        yield from _walk_panels(p.get("panels", []))


def dashboard_targets() -> list[tuple[str, str, str]]:
    """(panel title, PromQL with variables substituted, legendFormat) for every target."""
    dash = json.loads(DASHBOARD.read_text())
    out = []
    for p in _walk_panels(dash["panels"]):
        for t in p.get("targets", []):
            out.append((p["title"], substitute(t["expr"]), t.get("legendFormat", "")))
    return out


def dashboard_variables() -> list[tuple[str, str]]:
    """(name, query) of the dashboard's Prometheus query variables."""
    dash = json.loads(DASHBOARD.read_text())
    return [(v["name"], v["query"]["query"]) for v in dash["templating"]["list"] if v["type"] == "query"]


def substitute(expr: str) -> str:
    for var, value in SUBSTITUTIONS.items():
        expr = expr.replace(var, value)
    assert "$" not in expr, f"unknown dashboard variable in {expr!r}"
    return expr


def expected_labels(legend: str) -> set[str]:
    return set(re.findall(r"\{\{\s*(\w+)\s*\}\}", legend)) | {"topology"}


# ---------------------------------------------------------------- prometheus

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_json(url: str, timeout: float = 5.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read())


def wait_until(check: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
            if last:
                return last
        except OSError as e:  # not listening yet
            last = e
        time.sleep(0.25)
    raise AssertionError(f"timed out waiting for {what} (last: {last!r})")


class Prometheus:
    """A real Prometheus on 127.0.0.1 scraping ``targets`` every second, temp storage."""

    def __init__(self, workdir: Path, targets: list[str]) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        config = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                  "scrape_configs": [{"job_name": "topo", "static_configs": [{"targets": targets}]}]}
        self.config_path = workdir / "prometheus.yml"
        self.config_path.write_text(yaml.safe_dump(config))
        self.log_path = workdir / "prometheus.log"
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            [str(PROMETHEUS), f"--config.file={self.config_path}", f"--storage.tsdb.path={workdir / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
            stdout=self._log, stderr=subprocess.STDOUT)
        try:
            wait_until(self._ready, 30, "prometheus /-/ready")
        except BaseException:
            self.stop()
            raise

    def _ready(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"prometheus exited: {self.log_path.read_text()[-2000:]}")
        with urllib.request.urlopen(self.base + "/-/ready", timeout=2) as r:
            return r.status == 200

    def query(self, expr: str) -> list[dict]:
        body = http_json(f"{self.base}/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
        assert body["status"] == "success", (expr, body)
        return body["data"]["result"]

    def label_values(self, label: str, match: str) -> list[str]:
        q = urllib.parse.urlencode({"match[]": match})
        return http_json(f"{self.base}/api/v1/label/{label}/values?{q}")["data"]

    def stop(self) -> None:
        stop_process(self.proc)
        self._log.close()


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[Callable[[list[str]], Prometheus]]:
    started: list[Prometheus] = []

    def start(targets: list[str]) -> Prometheus:
        p = Prometheus(tmp_path, targets)
        started.append(p)
        return p

    yield start
    for p in started:
        p.stop()


def check_dashboard(prom: Prometheus, topology: str, timeout: float = 30.0) -> None:
    """Every dashboard expression returns finite data with its legend's labels."""
    # enough scrapes for rate() and histogram_quantile() over the substituted window
    wait_until(lambda: [r for r in prom.query("count_over_time(topo_tuples_emitted_total[5s])")
                        if float(r["value"][1]) >= 4], timeout, "four scrapes in Prometheus")
    failures: list[str] = []
    for title, expr, legend in dashboard_targets():
        want = expected_labels(legend)

        def good() -> list[dict]:
            result = prom.query(expr)
            ok = [r for r in result if want <= set(r["metric"]) and r["metric"]["topology"] == topology]
            return ok if ok and any(math.isfinite(float(r["value"][1])) for r in ok) else []

        try:
            wait_until(good, 10, expr)
        except AssertionError:
            failures.append(f"{title}: {expr} -> {prom.query(expr)[:3]} (want labels {sorted(want)})")
    for name, query in dashboard_variables():
        m = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", query)
        assert m, f"variable {name}: unsupported query {query!r}"
        values = prom.label_values(m.group(2), substitute(m.group(1)))
        if topology not in values and name == "topology":
            failures.append(f"variable {name}: {query} -> {values}")
        elif not values:
            failures.append(f"variable {name}: {query} -> nothing")
    assert not failures, "dashboard queries without data:\n" + "\n".join(failures)


def assert_time_split_sums_to_1000(prom: Prometheus, topology: str, tasks: int) -> None:
    """Flink's three-way split: busy + idle + backpressured is 1000 ms per second per task."""
    total = prom.query(f'topo_busy_time_ms_per_second{{topology="{topology}"}} + '
                       f'topo_idle_time_ms_per_second + topo_backpressured_time_ms_per_second')
    assert len(total) == tasks, total
    for r in total:
        assert float(r["value"][1]) == pytest.approx(1000.0, abs=0.01), r


# ---------------------------------------------------------------- sources

class SyntheticLoad:
    """Mutates stats like a busy engine would, from a thread, until stopped."""

    def __init__(self, tasks: list[TaskStats], spark: list[SparkStats]) -> None:
        self.tasks = tasks
        self.spark = spark
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "SyntheticLoad":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        rnd = random.Random(7)
        step = 0
        while not self._stop.wait(0.05):
            step += 1
            for s in self.tasks:
                n = rnd.randint(50, 150)
                s.emitted += n
                s.busy_ns += 30_000_000
                s.idle_ns += 15_000_000
                s.backpressured_ns += 5_000_000
                if s.is_spout:
                    s.acked += n - 1
                    s.failed += 1
                    s.replayed += 1
                    s.dead_lettered += step % 2
                    s.complete_latency.observe(rnd.uniform(0.001, 0.05))
                    s.rate_limit, s.originv, s.k = 500.0, 1000.0, 1
                    s.count_signal("received", "BACKPRESSURE" if step % 2 else "RELEASE")
                else:
                    s.executed += n
                    s.acked += n
                    s.queue_bytes = rnd.randint(400_000, 60_000_000)
                    s.queue_tuples = s.queue_bytes // 100
                    s.backpressure = s.queue_bytes > s.high_mark
                    s.execute_latency.observe(rnd.uniform(0.0001, 0.01))
                    s.count_signal("sent", "BACKPRESSURE" if step % 2 else "RELEASE")
                s.observed_rate = n * 20.0
            if step % 4 == 0:
                for sp in self.spark:
                    sp.record_batch(rnd.uniform(0.1, 2.0), rnd.randint(100, 1000), rnd.uniform(0, 0.5), 900.0)


def synthetic_stats(topology: str) -> tuple[list[TaskStats], list[SparkStats]]:
    tasks = [TaskStats(topology, "words", 1, True), TaskStats(topology, "split", 2, False),
             TaskStats(topology, "split", 3, False), TaskStats(topology, "count", 4, False)]
    for s in tasks:
        if not s.is_spout:
            s.high_mark, s.low_mark, s.hard_bound = 50_000_000, 500_000, 100_000_000
    return tasks, [SparkStats(topology, "words", 0)]


class EngineThread:
    """A topology on the local engine in a background thread with its own event loop."""

    def __init__(self, topology: Any, config: dict[str, Any], services: list[Any]) -> None:
        self.topology, self.config, self.services = topology, config, services
        self.engine: Any = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.result: Any = None
        self.error: BaseException | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, daemon=True)

    def _main(self) -> None:
        from runtime.local.engine import LocalEngine

        async def go() -> None:
            self.loop = asyncio.get_running_loop()
            self.engine = LocalEngine(self.topology, self.config, services=self.services)
            self._ready.set()
            self.result = await self.engine.run()

        try:
            asyncio.run(go())
        except BaseException as e:  # surfaced by stop()
            self.error = e
        finally:
            self._ready.set()

    def start(self) -> None:
        self._thread.start()
        self._ready.wait(30)

    def stop(self) -> None:
        if self.loop is not None and self.engine is not None and not self.loop.is_closed():
            try:
                self.loop.call_soon_threadsafe(self.engine.request_stop)
            except RuntimeError:
                pass  # loop already finished
        self._thread.join(60)
        assert not self._thread.is_alive(), "engine did not stop"
        if self.error is not None:
            raise self.error


def small_topology(name: str) -> Any:
    """spout -> split (x2) -> count, where count manages ~3,000 tuples/s of ~10,000 offered.

    Enough for every per-task family to move, flow control's too: count's queue
    crosses the high mark and the stepwise policy steps its upstream down.
    """
    from topo.api import Bolt, Spout
    from topo.topology import TopologyBuilder

    class Numbers(Spout):
        outputs = ["n", "pad"]

        def open(self, context: Any, collector: Any) -> None:
            super().open(context, collector)
            self.i = 0

        async def next_tuple(self) -> None:
            for _ in range(20):
                self.i += 1
                self.collector.emit([self.i, "x" * 100], msg_id=self.i)
            await asyncio.sleep(0.002)  # keep the shared CPUs for Prometheus

    class Split(Bolt):
        outputs = ["n", "even", "pad"]

        def execute(self, tup: Any) -> None:
            self.collector.emit([tup["n"], tup["n"] % 2 == 0, tup["pad"]], anchors=tup)

    class Count(Bolt):
        def prepare(self, context: Any, collector: Any) -> None:
            super().prepare(context, collector)
            self.counts = {True: 0, False: 0}

        async def execute(self, tup: Any) -> None:
            self.counts[tup["even"]] += 1
            if sum(self.counts.values()) % 30 == 0:
                await asyncio.sleep(0.01)

    b = TopologyBuilder(name)
    b.spout("numbers", Numbers())
    b.bolt("split", Split(), parallelism=2).shuffle("numbers")
    b.bolt("count", Count()).fields("split", "even")
    return b.build()


# ---------------------------------------------------------------- tests

def test_shipped_prometheus_config_is_valid_and_scrapes_the_default_port() -> None:
    if PROMTOOL is not None:
        out = subprocess.run([PROMTOOL, "check", "config", str(PROMETHEUS_YML)], capture_output=True, text=True)
        assert out.returncode == 0, out.stdout + out.stderr
    config = yaml.safe_load(PROMETHEUS_YML.read_text())
    targets = [t for job in config["scrape_configs"] for sc in job["static_configs"] for t in sc["targets"]]
    assert targets == [f"127.0.0.1:{DEFAULT_PORT}"]


def test_dashboard_covers_the_issue_panels() -> None:
    exprs = " ".join(e for _, e, _ in dashboard_targets())
    for metric in ("topo_tuples_emitted_total", "topo_tuples_executed_total", "topo_queue_bytes",
                   "topo_queue_high_mark_bytes", "topo_queue_low_mark_bytes", "topo_rate_limit_tuples_per_second",
                   "topo_backpressure_step_k", "topo_backpressured_time_ms_per_second",
                   "topo_execute_latency_seconds_bucket", "topo_complete_latency_seconds_bucket",
                   "topo_signals_sent_total", "topo_signals_received_total"):
        assert metric in exprs, metric
    assert "histogram_quantile(0.5," in exprs and "histogram_quantile(0.99," in exprs
    for metric in ("topo_spark_batch_duration_seconds_bucket", "topo_spark_input_rows_total",
                   "topo_spark_controller_rate_rows_per_second", "topo_spark_scheduling_delay_seconds"):
        assert metric in exprs, metric


def test_dashboard_layout_is_importable() -> None:
    """Unique ids, no overlapping panels, every query on the dashboard's data source variable."""
    dash = json.loads(DASHBOARD.read_text())
    panels = list(_walk_panels(dash["panels"]))
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    cells: set[tuple[int, int]] = set()
    for p in panels:
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24, p["title"]
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not cells & mine, f"{p['title']} overlaps another panel"
        cells |= mine
        for t in p.get("targets", []):
            assert t["datasource"]["uid"] == "${datasource}", p["title"]
        if p["type"] != "row":
            assert p["datasource"]["uid"] == "${datasource}", p["title"]
            assert p["targets"] and len({t["refId"] for t in p["targets"]}) == len(p["targets"]), p["title"]


@needs_prometheus
async def test_dashboard_queries_against_synthetic_stats(prometheus: Callable[[list[str]], Prometheus]) -> None:
    tasks, spark = synthetic_stats("synthetic")
    engine = SimpleNamespace(stats=tasks, spark_stats=spark, topology=SimpleNamespace(name="synthetic"))
    service = MetricsService(port=0)
    await service.start(engine)
    try:
        with SyntheticLoad(tasks, spark):
            prom = prometheus([f"127.0.0.1:{service.server.port}"])
            await asyncio.to_thread(check_dashboard, prom, "synthetic")
            assert_time_split_sums_to_1000(prom, "synthetic", len(tasks))
    finally:
        await service.stop()


@needs_prometheus
def test_dashboard_queries_against_running_topology(prometheus: Callable[[list[str]], Prometheus],
                                                    tmp_path: Path) -> None:
    pytest.importorskip("runtime.local.engine")
    from topo.config import resolve

    name = "prom-e2e"
    topology = small_topology(name)
    config = resolve(topology.config, {
        "metrics.port": free_port(), "acking": True, "dead_letter_path": str(tmp_path / "dead.jsonl"),
        "backpressure.policy": "stepwise", "coordinator": "embedded", "backpressure.sensitivity_ms": 250,
        "queue.high_mark": "200KB", "queue.low_mark": "20KB", "queue.hard_bound": "400KB"})
    service = MetricsService.from_config(config)
    assert service is not None and service.port == config["metrics.port"]
    # no Spark engine runs here: its panels read a synthetic Spark exporter for the same topology
    spark = [SparkStats(name, "numbers", 0)]
    spark_registry, _ = make_registry(lambda: (), lambda: spark)
    spark_server = MetricsServer(spark_registry, port=0)
    spark_server.start()
    runner = EngineThread(topology, config, [service])
    runner.start()
    stop_batches = threading.Event()

    def batches() -> None:
        while not stop_batches.wait(0.2):
            spark[0].record_batch(0.3, 500, 0.05, 1000.0)

    feeder = threading.Thread(target=batches, daemon=True)
    feeder.start()
    try:
        prom = prometheus([f"127.0.0.1:{config['metrics.port']}", f"127.0.0.1:{spark_server.port}"])
        check_dashboard(prom, name)
        executed = prom.query(f'sum(topo_tuples_executed_total{{topology="{name}", component="count"}})')
        assert executed and float(executed[0]["value"][1]) > 0
        tasks = prom.query(f'count by (component) (topo_queue_bytes{{topology="{name}"}})')
        assert {r["metric"]["component"]: int(r["value"][1]) for r in tasks} == {"numbers": 1, "split": 2, "count": 1}
        assert_time_split_sums_to_1000(prom, name, 4)
        # flow control's numbers went through the exporter: an overload, a step, a signal
        sel = f'topology="{name}"'
        wait_until(lambda: prom.query(f'max(max_over_time(topo_backpressure_step_k{{{sel}}}[1m])) >= 1'),
                   20, "a task stepped down (k >= 1)")
        assert prom.query(f'max(max_over_time(topo_rate_limit_tuples_per_second{{{sel}}}[1m])) > 0')
        assert prom.query(f'max(max_over_time(topo_originv_tuples_per_second{{{sel}}}[1m])) > 0')
        assert prom.query(f'max(max_over_time(topo_backpressure{{{sel}}}[1m])) == 1')
        assert prom.query(f'sum(topo_signals_sent_total{{{sel}, kind="BACKPRESSURE"}}) > 0')
        assert prom.query(f'sum(topo_signals_received_total{{{sel}, kind="BACKPRESSURE"}}) > 0')
        # the queue is sampled once a second, so its peaks may fall between scrapes
        wait_until(lambda: prom.query(f'max_over_time(topo_queue_bytes{{{sel}, component="count"}}[1m]) '
                                      f'> on(topology, component, task) topo_queue_low_mark_bytes'),
                   10, "a backlog over count's low mark")
    finally:
        stop_batches.set()
        feeder.join(5)
        runner.stop()
        spark_server.stop()
    # the engine stopped its services: the exporter's port is closed
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", config["metrics.port"]), timeout=1).close()
