"""Session-wide test settings.

``topo run`` writes its status file to the user's state directory when
``status.path`` is null; the tests' runs write to a temporary one instead
(subprocesses inherit it).

``postgres_url`` is a real PostgreSQL server for the session (skipped when its
binaries are not installed), started with initdb on a free port.
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

os.environ["XDG_STATE_HOME"] = tempfile.mkdtemp(prefix="topo-test-state-")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def postgres_url():
    bindir = next((p for p in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True)), None)
    if bindir is None or not (bindir / "initdb").exists():
        pytest.skip("PostgreSQL server binaries not installed")
    runas: list[str] = []
    if os.geteuid() == 0:        # postgres refuses to run as root
        runas = ["runuser", "-u", "postgres", "--"]
    d = Path(tempfile.mkdtemp(prefix="topo-pg-"))
    if runas:
        shutil.chown(d, "postgres")
    data = d / "data"
    port = free_port()
    subprocess.run(runas + [str(bindir / "initdb"), "-D", str(data), "-U", "topo", "--auth=trust"],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    proc = subprocess.Popen(runas + [str(bindir / "postgres"), "-D", str(data), "-h", "127.0.0.1",
                                     "-p", str(port), "-k", str(d)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        import psycopg
        url = f"postgresql://topo@127.0.0.1:{port}/postgres"
        for _ in range(200):
            try:
                psycopg.connect(url, connect_timeout=2).close()
                break
            except psycopg.OperationalError:
                time.sleep(0.05)
        else:
            raise RuntimeError("postgres did not start")
        yield url
    finally:
        proc.terminate()
        proc.wait(20)
        shutil.rmtree(d, ignore_errors=True)
