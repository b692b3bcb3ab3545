"""Who may scrape the Prometheus exporter (issue 17, item 6): 127.0.0.1 unless
``metrics.host`` says otherwise, one warning line when it says otherwise, HTTPS with
``metrics.tls.cert``/``key`` and client certificates with ``metrics.tls.client_ca``.

Certificates are made per module with ``openssl`` (``zk_server.make_certificates``: a
CA, a server certificate for IP 127.0.0.1, a client certificate, a CA that signed nothing).
"""
from __future__ import annotations

import asyncio
import http.client
import logging
import shutil
import socket
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pytest

from runtime.observe.prometheus import MetricsService, MetricsTls, MetricsTlsError, is_loopback, start_threaded_exporter
from runtime.observe.stats import TaskStats
from topo.config import BY_KEY
from zk_server import make_certificates

REPO = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    if shutil.which("openssl") is None:
        pytest.skip("openssl not found")
    where = tmp_path_factory.mktemp("certs")
    made = make_certificates(where)
    return {**made, "server_cert": where / "server.crt", "server_key": where / "server.key"}


def engine(**config: str) -> SimpleNamespace:
    s = TaskStats(topology="wc", component="count", task_id=1, is_spout=False)
    return SimpleNamespace(stats=[s], topology=SimpleNamespace(name="wc"), config=config)


def scrape(url: str, context: ssl.SSLContext | None = None) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=5, context=context) as r:
        return r.status, r.read().decode()


def client_context(certs: dict[str, Path], ca: str = "ca", with_cert: bool = False) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(certs[ca]))
    if with_cert:
        ctx.load_cert_chain(str(certs["cert"]), str(certs["key"]))
    return ctx


def test_the_exporter_listens_on_loopback_by_default() -> None:
    assert BY_KEY["metrics.host"].default == "127.0.0.1"
    assert BY_KEY["metrics.tls.cert"].default is None and BY_KEY["metrics.tls.client_ca"].default is None
    svc = MetricsService.from_config({"metrics.port": 9464})
    assert svc is not None and (svc.host, svc.tls) == ("127.0.0.1", None)
    assert [is_loopback(h) for h in ("127.0.0.1", "127.0.1.1", "::1", "localhost", "0.0.0.0", "", "::", "10.1.2.3")] \
        == [True, True, True, True, False, False, False, False]


async def test_a_non_loopback_host_is_one_warning_line_at_start(caplog: pytest.LogCaptureFixture) -> None:
    ports = []
    for host in ("127.0.0.1", "localhost", "0.0.0.0"):
        svc = MetricsService(port=0, host=host)
        with caplog.at_level(logging.WARNING, logger="runtime.observe.prometheus"):
            await svc.start(engine())
            ports.append(svc.server.port)  # type: ignore[union-attr]
            await svc.stop()
    assert [r.getMessage() for r in caplog.records] == [
        f"metrics.host is 0.0.0.0, not a loopback address: the Prometheus exporter on port {ports[-1]} answers "
        "anyone who can reach it, over plain HTTP (metric names, topology and component names, rates); "
        "see docs/security.md"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _topo() -> list[str]:
    exe = REPO / ".venv" / "bin" / "topo"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "topo.cli"]


def test_topo_run_on_every_address_prints_one_warning_line(tmp_path: Path) -> None:
    port = _free_port()
    r = subprocess.run([*_topo(), "run", str(REPO / "configs" / "wordcount.yaml"), "--quiet", "--max-tuples", "200",
                        "--metrics-port", str(port), "--config", "metrics.host=0.0.0.0",
                        "--config", f"status.path={tmp_path / 'status.json'}"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    warnings = [ln for ln in r.stderr.splitlines() if "metrics.host" in ln]
    assert warnings == [f"metrics.host is 0.0.0.0, not a loopback address: the Prometheus exporter on port {port} "
                        "answers anyone who can reach it, over plain HTTP (metric names, topology and component "
                        "names, rates); see docs/security.md"], r.stderr


@pytest.mark.parametrize("threaded", [False, True], ids=["on-loop", "threaded"])
async def test_tls_scrape_with_the_ca_works_and_plain_http_or_another_ca_fails(
        certs: dict[str, Path], threaded: bool, caplog: pytest.LogCaptureFixture) -> None:
    tls = MetricsTls.from_config({"metrics.tls.cert": str(certs["server_cert"]),
                                  "metrics.tls.key": str(certs["server_key"])})
    svc = MetricsService(port=0, threaded=threaded, tls=tls)
    await svc.start(engine())
    try:
        assert svc.url is not None and svc.url.startswith("https://127.0.0.1:")
        port = svc.server.port  # type: ignore[union-attr]
        status, body = await asyncio.to_thread(scrape, svc.url, client_context(certs))
        assert status == 200 and 'topo_queue_bytes{component="count",task="1",topology="wc"}' in body
        with pytest.raises((http.client.HTTPException, OSError)):     # plain HTTP gets no metrics
            await asyncio.to_thread(scrape, f"http://127.0.0.1:{port}/metrics")
        with pytest.raises(urllib.error.URLError) as info:              # a scraper that trusts another CA
            await asyncio.to_thread(scrape, svc.url, client_context(certs, "other_ca"))
        assert isinstance(info.value.reason, ssl.SSLCertVerificationError)
        status, _ = await asyncio.to_thread(scrape, svc.url, client_context(certs))   # and it still serves
        assert status == 200
    finally:
        await svc.stop()


async def test_client_ca_lets_only_scrapers_with_its_certificates_in(certs: dict[str, Path]) -> None:
    svc = MetricsService.from_config({"metrics.port": 1, "metrics.tls.cert": str(certs["server_cert"]),
                                      "metrics.tls.key": str(certs["server_key"]),
                                      "metrics.tls.client_ca": str(certs["ca"])})
    assert svc is not None
    svc.port = 0
    await svc.start(engine())
    try:
        assert svc.url is not None
        with pytest.raises((http.client.HTTPException, OSError)):     # no client certificate
            await asyncio.to_thread(scrape, svc.url, client_context(certs))
        status, body = await asyncio.to_thread(scrape, svc.url, client_context(certs, with_cert=True))
        assert status == 200 and "topo_tuples_emitted_total" in body
    finally:
        await svc.stop()


async def test_a_service_made_without_the_config_takes_tls_from_the_engines(certs: dict[str, Path]) -> None:
    """A worker process's exporter is made from port and host only; its engine's config
    still decides HTTPS, so no worker serves plain HTTP when metrics.tls is set."""
    svc = MetricsService(port=0)
    await svc.start(engine(**{"metrics.tls.cert": str(certs["server_cert"]), "metrics.tls.key": str(certs["server_key"])}))
    try:
        assert svc.url is not None and svc.url.startswith("https://")
        status, _ = await asyncio.to_thread(scrape, svc.url, client_context(certs))
        assert status == 200
    finally:
        await svc.stop()


def test_tls_settings_go_together_and_unreadable_files_are_one_line(certs: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(MetricsTlsError) as info:
        MetricsTls.from_config({"metrics.tls.cert": str(certs["server_cert"])})
    assert str(info.value) == ("metrics.tls.cert and metrics.tls.key go together (and metrics.tls.client_ca needs "
                               "both): set both or none")
    with pytest.raises(MetricsTlsError) as info:
        start_threaded_exporter({"metrics.port": _free_port(), "metrics.tls.cert": str(tmp_path / "none.crt"),
                                 "metrics.tls.key": str(certs["server_key"])})
    assert str(info.value) == f"metrics.tls.cert: cannot read {tmp_path / 'none.crt'}"


def test_topo_run_with_a_missing_certificate_is_one_line(tmp_path: Path) -> None:
    r = subprocess.run([*_topo(), "run", str(REPO / "configs" / "wordcount.yaml"), "--quiet", "--max-tuples", "100",
                        "--metrics-port", str(_free_port()), "--config", f"metrics.tls.cert={tmp_path / 'x.crt'}",
                        "--config", f"metrics.tls.key={tmp_path / 'x.key'}"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert (r.returncode, r.stdout) != (0, "") and r.stderr == f"topo run: metrics.tls.cert: cannot read {tmp_path / 'x.crt'}\n"


def test_the_spark_engines_exporter_takes_the_tls_settings_too(certs: dict[str, Path]) -> None:
    import contextlib

    pytest.importorskip("pyspark")
    from runtime.observe.spark_stats import SparkStats
    from runtime.spark.engine import _serve_metrics

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = {"metrics.port": port, "metrics.host": "127.0.0.1", "metrics.tls.cert": str(certs["server_cert"]),
           "metrics.tls.key": str(certs["server_key"]), "metrics.tls.client_ca": None}
    with contextlib.ExitStack() as stack:
        _serve_metrics(stack, cfg, {"words": SparkStats("wc", "words", 0)})
        status, body = scrape(f"https://127.0.0.1:{port}/metrics", client_context(certs))
        assert status == 200 and "topo_spark" in body
        with pytest.raises((urllib.error.URLError, http.client.HTTPException, ConnectionError)):
            scrape(f"http://127.0.0.1:{port}/metrics")       # plain HTTP gets no answer
