"""Shared by the fixtures that start real servers (ZooKeeper, Prometheus, ...)."""
from __future__ import annotations

import subprocess


def stop_process(proc: subprocess.Popen, timeout: float = 10) -> None:
    """Terminate a server process, killing it if it does not exit within ``timeout``."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout)
