"""Prometheus exporter: reads the engines' plain counters when Prometheus scrapes.

Why a custom collector and not prometheus_client ``Counter``/``Gauge`` objects: a
labelled ``inc()`` costs about a microsecond, more than a queue hop, so the hot path
only bumps attributes of ``TaskStats`` (and ``SparkStats``) and this collector turns
them into metric families at scrape time. Per-tuple cost of metrics is therefore zero;
per-scrape cost is linear in the number of tasks.

Every metric is named ``topo_*`` and labelled ``topology``, ``component``, ``task``
(signals add ``kind``). Each exporter has its own ``CollectorRegistry``: two engines
in one process (tests, a benchmark) never see each other's series, and nothing
registers into prometheus_client's global default registry.

Busy / idle / backpressured time per second (Flink's ``busyTimeMsPerSecond`` and its
two siblings) is derived from the ns counters between two samples: each delta's share
of the three deltas' sum, times 1000. The engine books all of a task's wall time into
those counters (busy is what is neither idle nor backpressured), but only on its
ticker, so dividing by the scrape-to-scrape wall time would read low or high by up to
a tick depending on where a scrape falls; the sum is the window as the engine measured
it, and the three add up to 1000. Samples closer together than ``min_window_s`` reuse
the last result, so a second scraper (a test, a curl) does not shrink Prometheus's
windows to noise. The raw counters are exported too (``topo_*_seconds_total``), for
``rate()`` over any window.

Scrapes are served from the engine's event loop (``AsyncMetricsServer``): collecting
there reads ``TaskStats`` on the thread that writes them and costs only its CPU time.

Values that are "off" in ``TaskStats`` (``rate_limit`` or ``originv`` is None) are
exported as 0: a real limit is never 0 (``backpressure.rate_floor`` > 0), and a
series that comes and goes would leave dashboard panels empty.

Default port for a local run is 9464 (``--metrics-port 9464``, what
``configs/prometheus.yml`` scrapes); ``metrics.port: 0`` (the default) turns the
exporter off.

Who may scrape: the exporter listens on 127.0.0.1 unless ``metrics.host`` says
otherwise, and an address other machines can reach gets one warning line at start.
``metrics.tls.cert``/``metrics.tls.key`` serve HTTPS with the SSL context
prometheus_client's own ``start_http_server`` builds from ``certfile``/``keyfile``;
``metrics.tls.client_ca`` adds its ``client_cafile`` + ``client_auth_required``: only a
scraper with a certificate that CA signed gets an answer. prometheus_client's server
has no basic auth (its ``basic_auth_handler`` is for pushing), so neither has this one;
client certificates are the way to restrict scrapers (docs/security.md).
"""
from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import socket
import ssl
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer, _get_ssl_ctx, choose_encoder
from prometheus_client.metrics_core import (CounterMetricFamily, GaugeMetricFamily,
                                            HistogramMetricFamily, Metric)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from backpressure.signals import KINDS as SIGNAL_KINDS
from runtime.observe.stats import Histogram, TaskStats
from runtime.observe.spark_stats import SparkStats

log = logging.getLogger(__name__)

DEFAULT_PORT = 9464
LABELS: tuple[str, ...] = ("topology", "component", "task")
# Kinds exported at 0 before the first signal, so signal panels have series from the start.
KNOWN_SIGNAL_KINDS: tuple[str, ...] = SIGNAL_KINDS

_Read = Callable[[Any], float]

# name, help, how to read it from TaskStats
TASK_GAUGES: tuple[tuple[str, str, _Read], ...] = (
    ("topo_queue_bytes", "Bytes (msgpack wire size) in the task's input queue.", lambda s: s.queue_bytes),
    ("topo_queue_tuples", "Tuples in the task's input queue.", lambda s: s.queue_tuples),
    ("topo_queue_high_mark_bytes", "Current high mark: queue bytes at or over which the task is overloaded.",
     lambda s: s.high_mark),
    ("topo_queue_low_mark_bytes", "Current low mark: queue bytes at or under which the task is lightly loaded.",
     lambda s: s.low_mark),
    ("topo_queue_hard_bound_bytes", "Queue bytes at which emit into this task waits.", lambda s: s.hard_bound),
    ("topo_rate_limit_tuples_per_second", "Emit rate limit of the task; 0 when the limiter is off.",
     lambda s: s.rate_limit or 0.0),
    ("topo_observed_emit_rate_tuples_per_second", "Observed emit rate of the task (EWMA).",
     lambda s: s.observed_rate),
    ("topo_originv_tuples_per_second", "originv: the rate before the first backpressure step; 0 before any.",
     lambda s: s.originv or 0.0),
    ("topo_backpressure_step_k", "k: backpressure step count; rate = originv * step**k, k == 0 means off.",
     lambda s: s.k),
    ("topo_backpressure", "Backpressure flag of the task (1 = on).", lambda s: 1.0 if s.backpressure else 0.0),
)

TASK_COUNTERS: tuple[tuple[str, str, _Read], ...] = (
    ("topo_tuples_emitted", "Tuples emitted by the task.", lambda s: s.emitted),
    ("topo_tuples_executed", "Tuples executed by the task.", lambda s: s.executed),
    ("topo_tuples_acked", "Tuples acked (spouts: whole trees; bolts: inputs).", lambda s: s.acked),
    ("topo_tuples_failed", "Tuples failed.", lambda s: s.failed),
    ("topo_tuples_replayed", "Spout tuples replayed after a failure or timeout.", lambda s: s.replayed),
    ("topo_tuples_dead_lettered", "Spout tuples written to the dead-letter file.", lambda s: s.dead_lettered),
    ("topo_busy_seconds", "Wall time the task spent working.", lambda s: s.busy_ns / 1e9),
    ("topo_idle_seconds", "Wall time the task spent waiting for input.", lambda s: s.idle_ns / 1e9),
    ("topo_backpressured_seconds", "Wall time the task spent waiting for queue space or its rate limiter.",
     lambda s: s.backpressured_ns / 1e9),
)

TIME_SPLIT: tuple[tuple[str, str], ...] = (
    ("topo_busy_time_ms_per_second", "Flink's busyTimeMsPerSecond: ms per s of wall time the task worked."),
    ("topo_idle_time_ms_per_second", "Flink's idleTimeMsPerSecond: ms per s the task waited for input."),
    ("topo_backpressured_time_ms_per_second",
     "Flink's backPressuredTimeMsPerSecond: ms per s the task waited for downstream space or its limiter."),
)

SPARK_GAUGES: tuple[tuple[str, str, _Read], ...] = (
    ("topo_spark_last_batch_duration_seconds", "Duration of the last micro-batch.",
     lambda s: s.last_batch_duration_s),
    ("topo_spark_last_batch_input_rows", "Rows read by the last micro-batch.", lambda s: s.last_input_rows),
    ("topo_spark_controller_rate_rows_per_second", "Rows/s admission control allows; 0 when unlimited.",
     lambda s: s.controller_rate or 0.0),
    ("topo_spark_scheduling_delay_seconds", "Last micro-batch: delay from its planned trigger to its start.",
     lambda s: s.scheduling_delay_s),
)

SPARK_COUNTERS: tuple[tuple[str, str, _Read], ...] = (
    ("topo_spark_batches", "Micro-batches completed.", lambda s: s.batches),
    ("topo_spark_input_rows", "Rows read by micro-batches.", lambda s: s.input_rows),
)


def _labels(topology: str, component: str, task: int) -> list[str]:
    return [topology, component, str(task)]


def _histogram_family(name: str, doc: str) -> HistogramMetricFamily:
    return HistogramMetricFamily(name, doc, labels=list(LABELS))


def _add_histogram(family: HistogramMetricFamily, labels: list[str], h: Histogram) -> None:
    """Non-cumulative bucket counts -> Prometheus cumulative buckets ending at +Inf."""
    counts = list(h.counts)  # one C-level copy: the engine may observe meanwhile
    buckets: list[tuple[str, float]] = []
    running = 0
    for bound, c in zip(h.bounds, counts):
        running += c
        buckets.append((floatToGoString(bound), running))
    buckets.append(("+Inf", sum(counts)))
    family.add_metric(labels, buckets, sum_value=h.total)


def _table_families(gauges: Sequence[tuple[str, str, _Read]], counters: Sequence[tuple[str, str, _Read]],
                    objs: Sequence[Any], labels: list[list[str]]) -> Iterator[Metric]:
    """One gauge or counter family per table row, one sample per stats object."""
    for rows, kind in ((gauges, GaugeMetricFamily), (counters, CounterMetricFamily)):
        for name, doc, read in rows:
            family = kind(name, doc, labels=list(LABELS))
            for obj, lv in zip(objs, labels):
                family.add_metric(lv, float(read(obj)))
            yield family


@dataclass
class _Sample:
    at_ns: int
    busy: int
    idle: int
    bp: int


class TimeSplit:
    """Busy / idle / backpressured ms per second, from ns counters between samples.

    The clock only decides when a window is long enough; the shares come from the
    counters themselves (see the module docstring).
    """

    def __init__(self, min_window_s: float = 1.0, clock: Callable[[], int] = time.monotonic_ns) -> None:
        self.min_window_ns = int(min_window_s * 1e9)
        self.clock = clock
        self._anchor: dict[tuple[str, str, int], _Sample] = {}
        self._last: dict[tuple[str, str, int], tuple[float, float, float]] = {}
        self._lock = threading.Lock()  # the threaded server may scrape from two threads at once

    def prime(self, tasks: Iterable[TaskStats]) -> None:
        """Take the first sample (at service start) so the first scrape has a window."""
        now = self.clock()
        with self._lock:
            for s in tasks:
                self._anchor[(s.topology, s.component, s.task_id)] = _Sample(
                    now, s.busy_ns, s.idle_ns, s.backpressured_ns)

    def split(self, s: TaskStats) -> tuple[float, float, float]:
        """(busy, idle, backpressured) in ms per second over the last window."""
        key = (s.topology, s.component, s.task_id)
        now = self.clock()
        cur = _Sample(now, s.busy_ns, s.idle_ns, s.backpressured_ns)
        with self._lock:
            prev = self._anchor.get(key)
            if prev is None:
                self._anchor[key] = cur
                return self._last.get(key, (0.0, 0.0, 0.0))
            if key in self._last and now - prev.at_ns < self.min_window_ns:
                return self._last[key]
            d_busy, d_idle, d_bp = cur.busy - prev.busy, cur.idle - prev.idle, cur.bp - prev.bp
            denom = d_busy + d_idle + d_bp
            if denom <= 0:  # no tick booked time since the last sample
                return self._last.get(key, (0.0, 0.0, 0.0))
            out = (1000.0 * d_busy / denom, 1000.0 * d_idle / denom, 1000.0 * d_bp / denom)
            self._anchor[key] = cur
            self._last[key] = out
            return out


def _no_spark() -> Sequence[SparkStats]:
    return ()


class TopoCollector(Collector):
    """Turns ``TaskStats`` (and ``SparkStats``) into ``topo_*`` families at scrape time."""

    def __init__(self, tasks: Callable[[], Sequence[TaskStats]],
                 spark: Callable[[], Sequence[SparkStats]] = _no_spark,
                 time_split: TimeSplit | None = None) -> None:
        self.tasks = tasks
        self.spark = spark
        self.time_split = time_split or TimeSplit()

    def describe(self) -> list[Metric]:
        """Nothing: the families depend on live stats, so the registry must not collect early."""
        return []

    def collect(self) -> Iterator[Metric]:
        tasks = list(self.tasks())
        yield from self._task_families(tasks)
        spark = list(self.spark())
        if spark:
            yield from self._spark_families(spark)

    def _task_families(self, tasks: list[TaskStats]) -> Iterator[Metric]:
        labels = [_labels(s.topology, s.component, s.task_id) for s in tasks]
        yield from _table_families(TASK_GAUGES, TASK_COUNTERS, tasks, labels)
        splits = [self.time_split.split(s) for s in tasks]
        for i, (name, doc) in enumerate(TIME_SPLIT):
            g = GaugeMetricFamily(name, doc, labels=list(LABELS))
            for split, lv in zip(splits, labels):
                g.add_metric(lv, split[i])
            yield g
        yield from self._signal_families(tasks, labels)
        execute = _histogram_family("topo_execute_latency_seconds",
                                    "Time one execute call took (bolts; spouts if the engine observes it).")
        complete = _histogram_family("topo_complete_latency_seconds",
                                     "Spout emit to the ack of the whole tuple tree.")
        for s, lv in zip(tasks, labels):
            if not s.is_spout or s.execute_latency.n:
                _add_histogram(execute, lv, s.execute_latency)
            if s.is_spout or s.complete_latency.n:
                _add_histogram(complete, lv, s.complete_latency)
        yield execute
        yield complete

    @staticmethod
    def _signal_families(tasks: list[TaskStats], labels: list[list[str]]) -> Iterator[Metric]:
        for direction in ("sent", "received"):
            c = CounterMetricFamily(f"topo_signals_{direction}", f"Flow-control signals {direction}, by kind.",
                                    labels=[*LABELS, "kind"])
            for s, lv in zip(tasks, labels):
                book: Mapping[str, int] = (s.signals_sent if direction == "sent" else s.signals_received).copy()
                for kind in KNOWN_SIGNAL_KINDS:
                    if kind not in book:
                        c.add_metric([*lv, kind], 0.0)
                for kind, n in book.items():
                    c.add_metric([*lv, kind], float(n))
            yield c

    @staticmethod
    def _spark_families(spark: list[SparkStats]) -> Iterator[Metric]:
        labels = [_labels(s.topology, s.component, s.task) for s in spark]
        yield from _table_families(SPARK_GAUGES, SPARK_COUNTERS, spark, labels)
        h = _histogram_family("topo_spark_batch_duration_seconds", "Duration of micro-batches.")
        for s, lv in zip(spark, labels):
            _add_histogram(h, lv, s.batch_duration)
        yield h


def make_registry(tasks: Callable[[], Sequence[TaskStats]],
                  spark: Callable[[], Sequence[SparkStats]] = _no_spark,
                  time_split: TimeSplit | None = None) -> tuple[CollectorRegistry, TopoCollector]:
    """A fresh registry holding only a ``TopoCollector`` (never the global default one)."""
    registry = CollectorRegistry(auto_describe=False)
    collector = TopoCollector(tasks, spark, time_split)
    registry.register(collector)
    return registry, collector


class MetricsTlsError(OSError):
    """``metrics.tls.*`` cannot be used (a missing half, an unreadable file): one line,
    reported by ``topo run`` like any file it cannot open."""


@dataclass(frozen=True)
class MetricsTls:
    """``metrics.tls.*``: the exporter's certificate and key (PEM), and optionally the CA
    whose client certificates alone may scrape. Paths only; contents are never shown."""

    cert: str
    key: str
    client_ca: str | None = None

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> "MetricsTls | None":
        cert, key, client_ca = (config.get(f"metrics.tls.{k}") for k in ("cert", "key", "client_ca"))
        if not (cert or key or client_ca):
            return None
        if not (cert and key):
            raise MetricsTlsError("metrics.tls.cert and metrics.tls.key go together (and metrics.tls.client_ca "
                                   "needs both): set both or none")
        for k, path in (("cert", cert), ("key", key), ("client_ca", client_ca)):
            if path and not os.access(path, os.R_OK):
                raise MetricsTlsError(f"metrics.tls.{k}: cannot read {path}")
        return cls(str(cert), str(key), str(client_ca) if client_ca else None)

    def context(self) -> ssl.SSLContext:
        """The server context ``start_http_server(certfile=, keyfile=, client_cafile=,
        client_auth_required=)`` would use."""
        return _get_ssl_ctx(self.cert, self.key, ssl.PROTOCOL_TLS_SERVER, cafile=self.client_ca,
                            client_auth_required=self.client_ca is not None,
                            tls_min_version=ssl.TLSVersion.TLSv1_2)


def is_loopback(host: str) -> bool:
    """True when ``host`` names only this machine (127.0.0.0/8, ::1, localhost)."""
    if host in ("", "0.0.0.0", "::"):
        return False
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(str(i[4][0]).split("%")[0]).is_loopback for i in infos)


def warn_if_exposed(host: str, port: int, tls: "MetricsTls | None") -> None:
    """One warning line, as an exporter starts, when other machines may scrape it."""
    if is_loopback(host):
        return
    who = ("anyone with a certificate metrics.tls.client_ca signed" if tls and tls.client_ca else
           "anyone who can reach it")
    log.warning("metrics.host is %s, not a loopback address: the Prometheus exporter on port %d answers %s%s "
                "(metric names, topology and component names, rates); see docs/security.md",
                host or "every address", port, who, "" if tls else ", over plain HTTP")


class _QuietHandler(WSGIRequestHandler):
    """No access log: a scrape every second would flood the run's stderr."""

    def log_message(self, format: str, *args: Any) -> None:
        return None


class _Endpoint:
    """What both servers share: where they listen and what they serve."""

    def __init__(self, registry: CollectorRegistry, port: int = DEFAULT_PORT, host: str = "127.0.0.1",
                 tls: MetricsTls | None = None) -> None:
        self.registry = registry
        self.host = host
        self.requested_port = port
        self.tls = tls
        self.port: int | None = None

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.host}:{self.port}/metrics"


class MetricsServer(_Endpoint):
    """The HTTP endpoint (``/metrics``) for one registry, in a daemon thread.

    For code without an event loop of its own (the Spark driver, scripts); the local
    engine uses ``AsyncMetricsServer``. Built from prometheus_client's WSGI app rather than ``start_http_server`` so the
    serving loop polls every 50 ms: ``stop`` then returns at once instead of holding
    a topology's shutdown for up to the default half second.

    ``port=0`` here means "any free port" (tests); the config's ``metrics.port: 0``
    means "off" and is handled by ``MetricsService.from_config``.
    """

    POLL_S = 0.05

    def __init__(self, registry: CollectorRegistry, port: int = DEFAULT_PORT, host: str = "127.0.0.1",
                 tls: MetricsTls | None = None) -> None:
        super().__init__(registry, port, host, tls)
        self._server: ThreadingWSGIServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> int:
        """Bind and serve; returns the bound port."""
        if self._server is not None:
            raise RuntimeError("metrics server already started")
        context = self.tls.context() if self.tls else None
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        server_cls = type("_MetricsHTTPServer", (ThreadingWSGIServer,), {"address_family": family})
        self._server = make_server(self.host, self.requested_port, make_wsgi_app(self.registry),
                                   server_cls, handler_class=_QuietHandler)
        if context is not None:     # as start_http_server does with certfile/keyfile
            self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
        self.port = self._server.server_address[1]
        warn_if_exposed(self.host, self.port, self.tls)
        self._thread = threading.Thread(target=self._server.serve_forever, args=(self.POLL_S,),
                                        name=f"metrics:{self.port}", daemon=True)
        self._thread.start()
        return self.port

    def stop(self) -> None:
        """Stop serving and close the listening socket, so the port is free on return."""
        server, thread = self._server, self._thread
        self._server = self._thread = None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        if thread is not None:
            thread.join(timeout=5.0)


def start_threaded_exporter(config: Mapping[str, Any],
                            tasks: Callable[[], Sequence[TaskStats]] = lambda: (),
                            spark: Callable[[], Sequence[SparkStats]] = _no_spark) -> MetricsServer | None:
    """Exporter for a caller without a running event loop (the Spark driver).

    ``metrics.port`` / ``metrics.host`` / ``metrics.tls.*`` as for ``MetricsService``;
    None when the port is 0 (off). The caller stops the returned server when its run ends.
    """
    port = int(config.get("metrics.port", 0) or 0)
    if port == 0:
        return None
    tls = MetricsTls.from_config(config)
    registry, _ = make_registry(tasks, spark)
    server = MetricsServer(registry, port, str(config.get("metrics.host") or "127.0.0.1"), tls)
    server.start()
    return server


class AsyncMetricsServer(_Endpoint):
    """``/metrics`` served by the running event loop: the local engine's own loop.

    Why not a thread: with a busy engine every blocking call of a server thread
    (select, accept, recv, send) hands the GIL back and forth, and on a loaded machine
    each forced switch can stall the engine for a scheduler tick; scrapes measured
    30-80 ms of wall time for ~1 ms of work. On the loop, a scrape costs its CPU time
    only, and the collector reads ``TaskStats`` from the thread that writes them.
    """

    READ_TIMEOUT_S = 5.0

    def __init__(self, registry: CollectorRegistry, port: int = DEFAULT_PORT, host: str = "127.0.0.1",
                 tls: MetricsTls | None = None) -> None:
        super().__init__(registry, port, host, tls)
        self._server: asyncio.base_events.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    async def start(self) -> int:
        """Bind and serve on the running loop; returns the bound port."""
        if self._server is not None:
            raise RuntimeError("metrics server already started")
        context = self.tls.context() if self.tls else None
        tls_args: dict[str, Any] = {"ssl": context, "ssl_handshake_timeout": self.READ_TIMEOUT_S} if context else {}
        self._server = await asyncio.start_server(self._handle, self.host, self.requested_port,
                                                  reuse_address=True, **tls_args)
        self.port = self._server.sockets[0].getsockname()[1]
        warn_if_exposed(self.host, self.port, self.tls)
        return self.port

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One request per connection (``Connection: close``), as Prometheus scrapes."""
        self._writers.add(writer)
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), self.READ_TIMEOUT_S)
            lines = head.decode("latin-1").split("\r\n")
            method, target = (lines[0].split(" ") + ["", ""])[:2]
            headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
            path = target.split("?", 1)[0]
            if method not in ("GET", "HEAD"):
                status, ctype, body = "405 Method Not Allowed", "text/plain", b"only GET\n"
            elif path not in ("/metrics", "/"):
                status, ctype, body = "404 Not Found", "text/plain", b"see /metrics\n"
            else:
                encoder, ctype = choose_encoder(headers.get("accept", ""))
                status, body = "200 OK", encoder(self.registry)
            writer.write(f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
                         f"Connection: close\r\n\r\n".encode("latin-1") + (b"" if method == "HEAD" else body))
            await writer.drain()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, asyncio.TimeoutError, ConnectionError):
            pass  # a client that went away or never sent a request: nothing to answer
        finally:
            self._writers.discard(writer)
            writer.close()

    async def stop(self) -> None:
        """Close the listening socket and any open scrape connection."""
        server, self._server = self._server, None
        if server is None:
            return
        server.close()
        for w in list(self._writers):
            w.close()
        await server.wait_closed()


class MetricsService:
    """The ``Service`` an engine starts and stops: exporter for ``engine.stats``.

    Reads ``engine.stats`` (TaskStats) and, when present, ``engine.spark_stats``
    (SparkStats), so the Spark engine can pass itself the same way. Serves from the
    loop ``start`` runs on; ``threaded=True`` serves from a thread instead, for an
    engine whose loop does not keep running.
    """

    def __init__(self, port: int = DEFAULT_PORT, host: str = "127.0.0.1", min_window_s: float = 1.0,
                 threaded: bool = False, tls: MetricsTls | None = None) -> None:
        self.port = port
        self.host = host
        self.tls = tls
        self.min_window_s = min_window_s
        self.threaded = threaded
        self.server: AsyncMetricsServer | MetricsServer | None = None
        self.collector: TopoCollector | None = None

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> "MetricsService | None":
        """The service for ``metrics.port`` / ``metrics.host`` / ``metrics.tls.*``; None when
        the port is 0 (off). Unreadable TLS files: ``MetricsTlsError``, one line."""
        port = int(config.get("metrics.port", 0) or 0)
        if port == 0:
            return None
        return cls(port=port, host=str(config.get("metrics.host") or "127.0.0.1"), tls=MetricsTls.from_config(config))

    async def start(self, engine: Any) -> None:
        if self.tls is None:    # a service made without the config (a worker's) still serves HTTPS when asked
            self.tls = MetricsTls.from_config(getattr(engine, "config", None) or {})
        stats: Sequence[TaskStats] = engine.stats
        time_split = TimeSplit(self.min_window_s)
        time_split.prime(stats)
        registry, self.collector = make_registry(lambda: engine.stats,
                                                 lambda: getattr(engine, "spark_stats", ()) or (), time_split)
        if self.threaded:
            self.server = MetricsServer(registry, self.port, self.host, self.tls)
            self.server.start()
        else:
            self.server = AsyncMetricsServer(registry, self.port, self.host, self.tls)
            await self.server.start()

    async def stop(self) -> None:
        server, self.server = self.server, None
        if isinstance(server, AsyncMetricsServer):
            await server.stop()
        elif server is not None:
            server.stop()

    @property
    def url(self) -> str | None:
        return self.server.url if self.server else None
