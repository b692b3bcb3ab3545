"""A real ZooKeeper for the tests: Debian's ``zookeeper`` package, one JVM per session.

``ZooKeeperServer`` runs ``org.apache.zookeeper.server.ZooKeeperServerMain`` on
127.0.0.1 and a free port with its own data directory, and can be stopped and
started again on the same port and data (sessions and persistent znodes survive a
short outage, as with a real restart). ``expire_session`` forces a client's
session to expire the way ZooKeeper's own tests do: a second client attaches to
the same session id and password and closes it.

Every server knows a digest super user whose password is made up per server
(``super_auth``, for kazoo's ``auth_data``): ACL tests clean up and check what
ZooKeeper's super user may do with it. ``ZooKeeperServer(tls=True)`` also serves a
``secureClientPort`` (Netty, PEM key and certificates made with ``openssl`` by
``make_certificates``: a CA, a server certificate for 127.0.0.1, a client
certificate; the server asks clients for one); ``zookeeper_tls`` is that server.

Use the ``zookeeper`` fixture (session scope) by importing it into a test module:
``from zk_server import zookeeper  # noqa: F401``. Tests that need it are skipped
when Java or the ZooKeeper jars are missing.
"""
from __future__ import annotations

import base64
import hashlib
import os
import secrets
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Iterator

import pytest

from servers import stop_process

JARS = ("/usr/share/java/zookeeper.jar", "/usr/share/java/zookeeper-jute.jar")
TLS_JARS = ("/usr/share/java/netty-codec.jar", "/usr/share/java/netty-resolver.jar")   # not in its manifest
LOGGER_JARS = ("/usr/share/java/slf4j-simple.jar", "/usr/share/java/slf4j-nop.jar")


def classpath() -> str | None:
    """zookeeper.jar's manifest names the rest of its classpath under /usr/share/java."""
    if not all(os.path.exists(j) for j in JARS):
        return None
    cp = list(JARS)
    for j in LOGGER_JARS:
        if os.path.exists(j):
            cp.append(j)
            break
    return ":".join(cp)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def four_letter(port: int, word: str, timeout: float = 1.0) -> str:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(word.encode())
        chunks = []
        while True:
            data = s.recv(4096)
            if not data:
                break
            chunks.append(data)
    return b"".join(chunks).decode(errors="replace")


def make_certificates(where: Path) -> dict[str, Path]:
    """A CA, a server certificate for IP 127.0.0.1 and a client certificate, all PEM,
    made with ``openssl`` in ``where``; also a second CA that signed nothing (``other_ca``)."""
    openssl = shutil.which("openssl")
    if openssl is None:
        raise RuntimeError("openssl not found")

    def run(*args: str) -> None:
        subprocess.run([openssl, *args], cwd=where, check=True, capture_output=True)

    for ca in ("ca", "other_ca"):
        run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{ca}.key", "-out", f"{ca}.pem",
            "-days", "2", "-subj", f"/CN=topo test {ca}")
    (where / "ext.cnf").write_text("subjectAltName=IP:127.0.0.1\n")
    for who in ("server", "client"):
        run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{who}.key", "-out", f"{who}.csr",
            "-subj", f"/CN=topo test {who}")
        run("x509", "-req", "-in", f"{who}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", f"{who}.crt", "-days", "2", "-extfile", "ext.cnf")
    (where / "server.pem").write_bytes((where / "server.key").read_bytes() + (where / "server.crt").read_bytes())
    for name in ("ca.key", "other_ca.key", "server.key", "client.key"):
        os.chmod(where / name, 0o600)
    return {"ca": where / "ca.pem", "other_ca": where / "other_ca.pem", "server": where / "server.pem",
            "cert": where / "client.crt", "key": where / "client.key"}


class ZooKeeperServer:
    """One standalone ZooKeeper on 127.0.0.1; ``stop``/``start`` keep port and data."""

    def __init__(self, tick_ms: int = 200, min_session_timeout_ms: int = 400, tls: bool = False) -> None:
        cp = classpath()
        java = shutil.which("java")
        if cp is None or java is None:
            raise RuntimeError("ZooKeeper jars or java not found")
        if tls and not all(os.path.exists(j) for j in TLS_JARS):
            raise RuntimeError("netty jars for ZooKeeper's TLS port not found")
        self.java = java
        self.cp = cp + (":" + ":".join(TLS_JARS) if tls else "")
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="topo-zk-"))
        (self.dir / "data").mkdir()
        password = secrets.token_urlsafe(12)
        self.super_auth = ("digest", f"super:{password}")
        digest = base64.b64encode(hashlib.sha1(f"super:{password}".encode()).digest()).decode()
        self.jvm_props = [f"-Dzookeeper.DigestAuthenticationProvider.superDigest=super:{digest}"]
        self.tls_port: int | None = None
        self.certs: dict[str, Path] = {}
        secure = ""
        if tls:
            self.certs = make_certificates(self.dir)
            self.tls_port = free_port()
            secure = f"secureClientPort={self.tls_port}\nsecureClientPortAddress=127.0.0.1\n"
            self.jvm_props += [
                "-Dzookeeper.serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory",
                f"-Dzookeeper.ssl.keyStore.location={self.certs['server']}", "-Dzookeeper.ssl.keyStore.type=PEM",
                f"-Dzookeeper.ssl.trustStore.location={self.certs['ca']}", "-Dzookeeper.ssl.trustStore.type=PEM",
                "-Dzookeeper.ssl.clientAuth=need"]
        self.cfg = self.dir / "zoo.cfg"
        self.cfg.write_text(secure + 
            f"tickTime={tick_ms}\n"
            f"dataDir={self.dir / 'data'}\n"
            f"clientPort={self.port}\n"
            "clientPortAddress=127.0.0.1\n"
            f"minSessionTimeout={min_session_timeout_ms}\n"
            "maxSessionTimeout=60000\n"
            "maxClientCnxns=200\n"
            "admin.enableServer=false\n"
            "4lw.commands.whitelist=ruok,srvr,mntr,stat,envi\n"
            "autopurge.purgeInterval=0\n")
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = self.dir / "zookeeper.log"

    @property
    def hosts(self) -> str:
        return f"127.0.0.1:{self.port}"

    def url(self, root: str = "/topo") -> str:
        return f"zookeeper://{self.hosts}{root}"

    def tls_url(self, root: str = "/topo") -> str:
        return f"zookeeper://127.0.0.1:{self.tls_port}{root}"

    def client(self, auth: tuple[str, str] | None = None, timeout: float = 10.0):  # type: ignore[no-untyped-def]
        """A started blocking kazoo client on the plain port (``auth``: one (scheme, credential))."""
        from kazoo.client import KazooClient

        c = KazooClient(hosts=self.hosts, timeout=5.0, auth_data=[auth] if auth else None)
        c.start(timeout)
        return c

    def start(self, timeout: float = 30.0) -> None:
        if self.proc is not None and self.proc.poll() is None:
            return
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [self.java, "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
             "-Dzookeeper.admin.enableServer=false", *self.jvm_props, "-cp", self.cp,
             "org.apache.zookeeper.server.ZooKeeperServerMain", str(self.cfg)],
            stdout=log, stderr=subprocess.STDOUT, cwd=self.dir, start_new_session=True)
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"ZooKeeper exited with {self.proc.returncode}; see {self.log_path}")
            try:
                if four_letter(self.port, "ruok", 0.5) == "imok" and "Mode:" in four_letter(self.port, "srvr", 0.5):
                    return
            except OSError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"ZooKeeper did not answer on {self.port} within {timeout}s; see {self.log_path}")

    def stop(self) -> None:
        if self.proc is None:
            return
        stop_process(self.proc)
        self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def expire_session(self, client_id: tuple[int, bytes], timeout: float = 10.0) -> None:
        """Expire the session ``client_id`` (kazoo's ``client.client_id``) now."""
        from kazoo.client import KazooClient

        other = KazooClient(hosts=self.hosts, client_id=client_id, timeout=1.0)
        other.start(timeout)
        other.stop()
        other.close()

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="session")
def zookeeper() -> Iterator[ZooKeeperServer]:
    """A real ZooKeeper for the whole test session; restarted if a test left it stopped."""
    try:
        server = ZooKeeperServer()
    except RuntimeError as e:
        pytest.skip(str(e))
    server.start()
    try:
        yield server
    finally:
        server.cleanup()


@pytest.fixture(scope="session")
def zookeeper_tls() -> Iterator[ZooKeeperServer]:
    """A second real ZooKeeper that also serves TLS (``tls_port``, ``certs``)."""
    try:
        server = ZooKeeperServer(tls=True)
    except (RuntimeError, subprocess.CalledProcessError) as e:
        pytest.skip(str(e))
    try:
        server.start()
        yield server
    finally:
        server.cleanup()


@pytest.fixture
def zk(zookeeper: ZooKeeperServer) -> Iterator[ZooKeeperServer]:
    """The session's ZooKeeper, guaranteed running when the test starts and ends."""
    zookeeper.start()
    yield zookeeper
    zookeeper.start()
