"""A real redis-server on 127.0.0.1 and a free port, for the tests that need one."""
from __future__ import annotations

import shutil
import socket
import subprocess
import time
from typing import Iterator

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    exe = shutil.which("redis-server")
    if exe is None:
        pytest.skip("redis-server not installed")
    port = free_port()
    d = tmp_path_factory.mktemp("redis")
    proc = subprocess.Popen([exe, "--bind", "127.0.0.1", "--port", str(port), "--dir", str(d),
                             "--save", "", "--appendonly", "no"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        import redis
        client = redis.Redis(host="127.0.0.1", port=port)
        for _ in range(100):
            try:
                client.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.05)
        else:
            raise RuntimeError("redis-server did not start")
        client.close()
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        proc.wait(10)
