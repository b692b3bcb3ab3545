"""A real ZooKeeper for the tests: Debian's ``zookeeper`` package, one JVM per session.

``ZooKeeperServer`` runs ``org.apache.zookeeper.server.ZooKeeperServerMain`` on
127.0.0.1 and a free port with its own data directory, and can be stopped and
started again on the same port and data (sessions and persistent znodes survive a
short outage, as with a real restart). ``expire_session`` forces a client's
session to expire the way ZooKeeper's own tests do: a second client attaches to
the same session id and password and closes it.

Use the ``zookeeper`` fixture (session scope) by importing it into a test module:
``from zk_server import zookeeper  # noqa: F401``. Tests that need it are skipped
when Java or the ZooKeeper jars are missing.
"""
from __future__ import annotations

import os
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


class ZooKeeperServer:
    """One standalone ZooKeeper on 127.0.0.1; ``stop``/``start`` keep port and data."""

    def __init__(self, tick_ms: int = 200, min_session_timeout_ms: int = 400) -> None:
        cp = classpath()
        java = shutil.which("java")
        if cp is None or java is None:
            raise RuntimeError("ZooKeeper jars or java not found")
        self.java = java
        self.cp = cp
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="topo-zk-"))
        (self.dir / "data").mkdir()
        self.cfg = self.dir / "zoo.cfg"
        self.cfg.write_text(
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

    def start(self, timeout: float = 30.0) -> None:
        if self.proc is not None and self.proc.poll() is None:
            return
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [self.java, "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
             "-Dzookeeper.admin.enableServer=false", "-cp", self.cp,
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


@pytest.fixture
def zk(zookeeper: ZooKeeperServer) -> Iterator[ZooKeeperServer]:
    """The session's ZooKeeper, guaranteed running when the test starts and ends."""
    zookeeper.start()
    yield zookeeper
    zookeeper.start()
