"""A real Spark standalone cluster for the tests and the bench: a Master and Workers.

``StandaloneCluster`` starts ``org.apache.spark.deploy.master.Master`` and
``org.apache.spark.deploy.worker.Worker`` with the installed pyspark's ``bin/spark-class``,
all on 127.0.0.1 and free ports (the web UIs too: the Master's serves the JSON that tells
when a worker has registered), each with its own log file and work directory under one
temporary directory, removed at ``stop``. Executors run this interpreter
(``PYSPARK_PYTHON``), so they have the ``topo`` package, and nothing else of the
tests: whatever else a topology needs must be shipped by the engine.

The ``spark_cluster`` fixture (module scope) is one Master and one Worker with 2 cores
and 1 GiB; tests that need it are skipped when Java or pyspark is missing.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Iterator

import pytest

from servers import stop_process

START_TIMEOUT_S = 90.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spark_home() -> Path | None:
    try:
        import pyspark
    except ImportError:
        return None
    home = Path(pyspark.__file__).parent
    return home if (home / "bin" / "spark-class").exists() and shutil.which("java") else None


def _clean_env() -> dict[str, str]:
    """The daemons' environment: this interpreter for Python workers, loopback only, and
    no PYTHONPATH (executors must not find the tests' modules by accident)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SPARK_HOME")}
    env.update(SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable, SPARK_NO_DAEMONIZE="1")
    return env


class StandaloneCluster:
    """One Master and ``workers`` Workers of ``cores`` cores and ``memory`` each."""

    def __init__(self, *, workers: int = 1, cores: int = 2, memory: str = "1g") -> None:
        home = spark_home()
        if home is None:
            raise RuntimeError("pyspark with bin/spark-class and java are needed for a standalone cluster")
        self.home = home
        self.workers = workers
        self.cores = cores
        self.memory = memory
        self.dir = Path(tempfile.mkdtemp(prefix="topo-spark-cluster-"))
        self.port = free_port()
        self.ui_port = free_port()
        self.procs: list[subprocess.Popen] = []
        self.url = f"spark://127.0.0.1:{self.port}"

    def _spawn(self, name: str, args: list[str]) -> None:
        log = open(self.dir / f"{name}.log", "wb")
        try:
            proc = subprocess.Popen([str(self.home / "bin" / "spark-class"), *args], cwd=self.dir,
                                    env=_clean_env(), stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        finally:
            log.close()
        self.procs.append(proc)

    def start(self) -> "StandaloneCluster":
        try:
            self._spawn("master", ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                                   "--port", str(self.port), "--webui-port", str(self.ui_port)])
            for i in range(self.workers):
                work = self.dir / f"work-{i}"
                work.mkdir()
                self._spawn(f"worker-{i}", ["org.apache.spark.deploy.worker.Worker", self.url,
                                            "--host", "127.0.0.1", "--port", str(free_port()),
                                            "--webui-port", str(free_port()), "--cores", str(self.cores),
                                            "--memory", self.memory, "--work-dir", str(work)])
            self._wait_registered()
        except BaseException:
            self.stop()
            raise
        return self

    def state(self) -> dict:
        """The Master's JSON status (workers, applications)."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/", timeout=2) as r:
            return json.loads(r.read(1 << 20))

    def _wait_registered(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            dead = [p for p in self.procs if p.poll() is not None]
            if dead:
                raise RuntimeError(f"a Spark daemon exited with {dead[0].returncode}: {self.logs()[-2000:]}")
            try:
                alive = [w for w in self.state().get("workers", []) if w.get("state") == "ALIVE"]
                if len(alive) >= self.workers:
                    return
            except OSError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"the standalone cluster did not come up in {START_TIMEOUT_S:.0f}s: {self.logs()[-2000:]}")

    def logs(self) -> str:
        return "".join(p.read_text(errors="replace") for p in sorted(self.dir.glob("*.log")))

    def stop(self) -> None:
        for proc in reversed(self.procs):   # workers first, then the master
            try:
                os.killpg(proc.pid, 15)
            except ProcessLookupError:
                pass
            stop_process(proc, 20)
        self.procs.clear()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="module")
def spark_cluster() -> Iterator[StandaloneCluster]:
    if spark_home() is None:
        pytest.skip("pyspark's spark-class or java not found")
    cluster = StandaloneCluster(workers=1, cores=2, memory="1g").start()
    try:
        yield cluster
    finally:
        cluster.stop()


if __name__ == "__main__":   # a cluster for trying things by hand: prints its URL, Ctrl-C stops it
    c = StandaloneCluster().start()
    print(c.url, "ui", c.ui_port, "dir", c.dir, flush=True)
    try:
        while True:
            time.sleep(1)
    except KeyboardInterrupt:
        pass
    finally:
        c.stop()
