"""The exporter's output, read back with prometheus_client's text-format parser.

Parsing the exposition text (rather than poking the collector's objects) checks what
Prometheus will actually see: names, label sets, cumulative buckets.
"""
from __future__ import annotations

import asyncio
import socket
import time
import urllib.error
import urllib.request
from types import SimpleNamespace

import pytest
from prometheus_client import REGISTRY, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from runtime.observe.prometheus import (KNOWN_SIGNAL_KINDS, LABELS, MetricsService, TimeSplit,
                                   make_registry, start_threaded_exporter)
from runtime.observe.stats import TaskStats
from runtime.observe.spark_stats import SparkStats


class FakeClock:
    """monotonic_ns stand-in the test advances by hand."""

    def __init__(self) -> None:
        self.ns = 1_000_000_000

    def __call__(self) -> int:
        return self.ns

    def advance(self, seconds: float) -> None:
        self.ns += int(seconds * 1e9)


def tasks() -> list[TaskStats]:
    spout = TaskStats("wc", "words", 0, True)
    bolt = TaskStats("wc", "count", 1, False)
    return [spout, bolt]


def scrape(registry) -> dict[str, list]:
    """family name -> samples, from the text format."""
    text = generate_latest(registry).decode()
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def value(samples: list, name: str, **labels: str) -> float:
    hits = [s.value for s in samples if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(hits) == 1, (name, labels, hits)
    return hits[0]


def test_every_sample_is_topo_prefixed_and_labelled() -> None:
    registry, _ = make_registry(lambda: tasks())
    families = scrape(registry)
    assert families
    for name, samples in families.items():
        assert name.startswith("topo_")
        for s in samples:
            assert set(LABELS) <= set(s.labels), (s.name, s.labels)
            extra = set(s.labels) - set(LABELS)
            assert extra <= {"kind", "le"}, (s.name, extra)


def test_values_follow_live_stats_without_hot_path_calls() -> None:
    stats = tasks()
    registry, _ = make_registry(lambda: stats)
    spout, bolt = stats
    bolt.queue_bytes, bolt.queue_tuples = 123_456, 789
    bolt.high_mark, bolt.low_mark, bolt.hard_bound = 50_000_000, 500_000, 100_000_000
    spout.emitted, bolt.executed, bolt.acked, bolt.failed = 10, 9, 8, 1
    spout.replayed, spout.dead_lettered = 2, 1
    spout.rate_limit, spout.originv, spout.k, spout.backpressure = 250.0, 1000.0, 2, True
    spout.observed_rate = 240.5
    f = scrape(registry)
    assert value(f["topo_queue_bytes"], "topo_queue_bytes", component="count", task="1") == 123_456
    assert value(f["topo_queue_tuples"], "topo_queue_tuples", component="count") == 789
    assert value(f["topo_queue_high_mark_bytes"], "topo_queue_high_mark_bytes", component="count") == 50_000_000
    assert value(f["topo_queue_low_mark_bytes"], "topo_queue_low_mark_bytes", component="count") == 500_000
    assert value(f["topo_tuples_emitted"], "topo_tuples_emitted_total", component="words") == 10
    assert value(f["topo_tuples_executed"], "topo_tuples_executed_total", component="count") == 9
    assert value(f["topo_tuples_failed"], "topo_tuples_failed_total", component="count") == 1
    assert value(f["topo_tuples_replayed"], "topo_tuples_replayed_total", component="words") == 2
    assert value(f["topo_tuples_dead_lettered"], "topo_tuples_dead_lettered_total", component="words") == 1
    assert value(f["topo_rate_limit_tuples_per_second"], "topo_rate_limit_tuples_per_second",
                 component="words") == 250.0
    assert value(f["topo_originv_tuples_per_second"], "topo_originv_tuples_per_second", component="words") == 1000
    assert value(f["topo_backpressure_step_k"], "topo_backpressure_step_k", component="words") == 2
    assert value(f["topo_backpressure"], "topo_backpressure", component="words") == 1
    assert value(f["topo_observed_emit_rate_tuples_per_second"], "topo_observed_emit_rate_tuples_per_second",
                 component="words") == 240.5
    # "off" is exported as 0, so the series never disappears
    assert value(f["topo_rate_limit_tuples_per_second"], "topo_rate_limit_tuples_per_second",
                 component="count") == 0
    spout.rate_limit, spout.k, spout.backpressure = None, 0, False
    bolt.executed = 50
    f = scrape(registry)
    assert value(f["topo_rate_limit_tuples_per_second"], "topo_rate_limit_tuples_per_second",
                 component="words") == 0
    assert value(f["topo_backpressure"], "topo_backpressure", component="words") == 0
    assert value(f["topo_tuples_executed"], "topo_tuples_executed_total", component="count") == 50


def test_latency_histograms_are_cumulative() -> None:
    stats = tasks()
    spout, bolt = stats
    for v in (0.0003, 0.0003, 0.002, 0.2, 100.0):
        bolt.execute_latency.observe(v)
    spout.complete_latency.observe(0.04)
    registry, _ = make_registry(lambda: stats)
    f = scrape(registry)
    ex = [s for s in f["topo_execute_latency_seconds"] if s.labels["component"] == "count"]
    buckets = [(float(s.labels["le"]), s.value) for s in ex if s.name.endswith("_bucket")]
    assert [b for b, _ in buckets] == sorted(b for b, _ in buckets)
    counts = [c for _, c in buckets]
    assert counts == sorted(counts), "cumulative counts never decrease"
    le = dict(buckets)
    assert le[0.00025] == 0 and le[0.0005] == 2 and le[0.0025] == 3 and le[0.25] == 4 and le[30.0] == 4
    assert le[float("inf")] == 5
    assert value(ex, "topo_execute_latency_seconds_count") == 5
    assert value(ex, "topo_execute_latency_seconds_sum") == pytest.approx(100.2026)
    # complete latency belongs to spouts, execute latency to bolts
    assert {s.labels["component"] for s in f["topo_complete_latency_seconds"]} == {"words"}
    assert {s.labels["component"] for s in f["topo_execute_latency_seconds"]} == {"count"}
    cl = f["topo_complete_latency_seconds"]
    assert value(cl, "topo_complete_latency_seconds_bucket", le="0.05") == 1
    assert value(cl, "topo_complete_latency_seconds_bucket", le="0.025") == 0


def test_signals_by_kind_start_at_zero() -> None:
    stats = tasks()
    spout, bolt = stats
    bolt.count_signal("sent", "BACKPRESSURE")
    bolt.count_signal("sent", "BACKPRESSURE")
    spout.count_signal("received", "BACKPRESSURE")
    spout.count_signal("received", "STATE")
    registry, _ = make_registry(lambda: stats)
    f = scrape(registry)
    sent = f["topo_signals_sent"]
    assert value(sent, "topo_signals_sent_total", component="count", kind="BACKPRESSURE") == 2
    assert value(sent, "topo_signals_sent_total", component="count", kind="RELEASE") == 0
    recv = f["topo_signals_received"]
    assert value(recv, "topo_signals_received_total", component="words", kind="STATE") == 1
    for kind in KNOWN_SIGNAL_KINDS:
        assert value(recv, "topo_signals_received_total", component="count", kind=kind) == 0


def test_time_split_is_ms_per_second_between_samples() -> None:
    clock = FakeClock()
    stats = tasks()
    bolt = stats[1]
    split = TimeSplit(min_window_s=1.0, clock=clock)
    split.prime(stats)
    registry, _ = make_registry(lambda: stats, time_split=split)
    clock.advance(2.0)
    bolt.busy_ns += 1_200_000_000
    bolt.idle_ns += 600_000_000
    bolt.backpressured_ns += 200_000_000
    f = scrape(registry)
    busy = value(f["topo_busy_time_ms_per_second"], "topo_busy_time_ms_per_second", component="count")
    idle = value(f["topo_idle_time_ms_per_second"], "topo_idle_time_ms_per_second", component="count")
    bp = value(f["topo_backpressured_time_ms_per_second"], "topo_backpressured_time_ms_per_second",
               component="count")
    assert (busy, idle, bp) == pytest.approx((600.0, 300.0, 100.0))
    assert value(f["topo_busy_seconds"], "topo_busy_seconds_total", component="count") == pytest.approx(1.2)
    # a second scraper inside the window sees the same numbers, and does not move the window
    clock.advance(0.1)
    bolt.busy_ns += 100_000_000
    f = scrape(registry)
    assert value(f["topo_busy_time_ms_per_second"], "topo_busy_time_ms_per_second",
                 component="count") == pytest.approx(600.0)
    # the engine books time on its ticker, not at the scrape: shares of what it booked
    # since the last sample still add up to 1000
    clock.advance(0.9)
    bolt.idle_ns += 500_000_000
    bolt.backpressured_ns += 250_000_000
    f = scrape(registry)
    split3 = [value(f[n], n, component="count") for n in (
        "topo_busy_time_ms_per_second", "topo_idle_time_ms_per_second", "topo_backpressured_time_ms_per_second")]
    assert split3 == pytest.approx([1000 * 0.1 / 0.85, 1000 * 0.5 / 0.85, 1000 * 0.25 / 0.85])
    assert sum(split3) == pytest.approx(1000.0)
    # nothing booked since: the last values stand rather than a burst of zeros
    clock.advance(1.5)
    f = scrape(registry)
    assert value(f["topo_idle_time_ms_per_second"], "topo_idle_time_ms_per_second",
                 component="count") == pytest.approx(1000 * 0.5 / 0.85)


def test_spark_stats_families() -> None:
    s = SparkStats("wc", "words", 0)
    s.record_batch(1.5, 1000, scheduling_delay_s=0.2, controller_rate=800.0)
    s.record_progress({"batchDuration": 500, "numInputRows": 250})
    s.record_progress({"durationMs": {"triggerExecution": 700}, "numInputRows": 10})
    registry, _ = make_registry(lambda: (), lambda: [s])
    f = scrape(registry)
    assert value(f["topo_spark_input_rows"], "topo_spark_input_rows_total", component="words") == 1260
    assert value(f["topo_spark_batches"], "topo_spark_batches_total") == 3
    assert value(f["topo_spark_last_batch_duration_seconds"], "topo_spark_last_batch_duration_seconds") == 0.7
    assert value(f["topo_spark_last_batch_input_rows"], "topo_spark_last_batch_input_rows") == 10
    assert value(f["topo_spark_controller_rate_rows_per_second"],
                 "topo_spark_controller_rate_rows_per_second") == 800.0
    assert value(f["topo_spark_scheduling_delay_seconds"], "topo_spark_scheduling_delay_seconds") == 0.0
    h = f["topo_spark_batch_duration_seconds"]
    assert value(h, "topo_spark_batch_duration_seconds_bucket", le="1.0") == 2
    assert value(h, "topo_spark_batch_duration_seconds_bucket", le="+Inf") == 3
    # no Spark stats, no Spark families
    registry, _ = make_registry(lambda: tasks())
    assert not [n for n in scrape(registry) if n.startswith("topo_spark")]


def test_registries_are_private() -> None:
    a, _ = make_registry(lambda: [TaskStats("a", "x", 0, True)])
    b, _ = make_registry(lambda: [TaskStats("b", "y", 0, True)])
    topologies = {s.labels["topology"] for samples in scrape(a).values() for s in samples}
    assert topologies == {"a"}
    assert "b" in generate_latest(b).decode()
    assert "topo_" not in generate_latest(REGISTRY).decode()


def test_from_config_off_and_on() -> None:
    assert MetricsService.from_config({"metrics.port": 0, "metrics.host": "127.0.0.1"}) is None
    svc = MetricsService.from_config({"metrics.port": 9999, "metrics.host": "127.0.0.1"})
    assert svc is not None and svc.port == 9999 and svc.host == "127.0.0.1"


def _port_is_free(port: int) -> bool:
    """Whether a new exporter could bind it (HTTP servers set SO_REUSEADDR: TIME_WAIT is fine)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _get(url: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.headers["Content-Type"], r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers["Content-Type"], e.read().decode()


@pytest.mark.parametrize("threaded", [False, True], ids=["on-loop", "threaded"])
async def test_service_serves_and_stop_closes_the_port(threaded: bool) -> None:
    engine = SimpleNamespace(stats=tasks(), topology=SimpleNamespace(name="wc"), config={})
    svc = MetricsService(port=0, threaded=threaded)
    await svc.start(engine)
    try:
        port = svc.server.port
        assert svc.server.host == "127.0.0.1"
        # the client runs in a thread: the on-loop server answers from this test's loop
        status, ctype, body = await asyncio.to_thread(_get, svc.url)
        assert status == 200 and ctype.startswith("text/plain")
        assert 'topo_queue_bytes{component="count",task="1",topology="wc"}' in body
        if not threaded:  # prometheus_client's WSGI app answers every path with the metrics
            status, _, _ = await asyncio.to_thread(_get, f"http://127.0.0.1:{port}/nothing")
            assert status == 404
        assert not _port_is_free(port)
    finally:
        t0 = time.perf_counter()
        await svc.stop()
        stop_s = time.perf_counter() - t0
    assert stop_s < 0.3, "stop must not hold the topology's shutdown"
    assert _port_is_free(port)
    with pytest.raises(urllib.error.URLError):
        await asyncio.to_thread(urllib.request.urlopen, f"http://127.0.0.1:{port}/metrics", None, 2)
    await svc.stop()  # idempotent


async def test_on_loop_server_survives_bad_clients() -> None:
    engine = SimpleNamespace(stats=tasks(), topology=SimpleNamespace(name="wc"), config={})
    svc = MetricsService(port=0)
    await svc.start(engine)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", svc.server.port)
        writer.write(b"GET /metr")  # half a request, then gone
        writer.close()
        reader, writer = await asyncio.open_connection("127.0.0.1", svc.server.port)
        writer.write(b"POST /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        assert (await reader.readline()).startswith(b"HTTP/1.1 405")
        writer.close()
        status, _, body = await asyncio.to_thread(_get, svc.url)
        assert status == 200 and "topo_tuples_emitted_total" in body
    finally:
        await svc.stop()


def test_threaded_exporter_for_the_spark_driver() -> None:
    assert start_threaded_exporter({"metrics.port": 0}) is None
    stats = SparkStats("wc", "words", 0)
    stats.record_batch(0.5, 100, 0.01, 200.0)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = start_threaded_exporter({"metrics.port": port, "metrics.host": "127.0.0.1"}, spark=lambda: [stats])
    assert server is not None
    try:
        status, _, body = _get(server.url)
        assert status == 200
        assert 'topo_spark_input_rows_total{component="words",task="0",topology="wc"} 100.0' in body
    finally:
        server.stop()
    assert _port_is_free(port)
