"""The machine and versions the benchmarks run with, recorded beside their results.

``python -m bench`` writes it to ``bench/results/environment.json`` before it runs the
benchmarks, so BENCHMARKS.md's generated section (``bench.report``) states what the
figures were measured on, not what the machine that renders them has installed.
"""
from __future__ import annotations

import datetime
import os
import platform
import shlex
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

# What a figure of ours depends on: the runtime's own dependencies, the engines and
# services the benchmarks drive, and the comparison the word count runs against.
PACKAGES = ("uvloop", "msgpack", "kazoo", "prometheus-client", "PyYAML", "pyspark", "bytewax", "matplotlib")


def cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def _first_line(cmd: list[str]) -> str | None:
    """The first line a version command prints (``java -version`` prints to stderr)."""
    if shutil.which(cmd[0]) is None:
        return None
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = (done.stdout or done.stderr).strip().splitlines()
    return lines[0].strip() if lines else None


def _deb_version(package: str) -> str | None:
    got = _first_line(["dpkg-query", "-W", "-f=${Version}", package])
    return got or None


def versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    out["java"] = _first_line(["java", "-version"])
    out["zookeeper (Debian package)"] = _deb_version("zookeeper")
    return out


def commit() -> str | None:
    """The checkout the figures were measured on; in a tree exported from git (no
    repository: a clean copy of one commit, others' edits left out), ``TOPO_BENCH_COMMIT``
    names the commit it was exported from; None when neither says."""
    try:
        done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).parent, timeout=10, check=True)
        return done.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return os.environ.get("TOPO_BENCH_COMMIT") or None


def record() -> dict[str, Any]:
    """This machine and the versions installed now, with the time, the commit and the load
    average then (what else the machine was running: the tables' spread depends on it)."""
    return {"recorded_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M"),
            "commit": commit(), "cpu": cpu_model(), "cores": os.cpu_count(),
            "load_average_1min": round(os.getloadavg()[0], 2),
            "os": f"{platform.system()} {platform.release()}", "machine": platform.machine(),
            "versions": versions()}


def command_line(module: str) -> str:
    """How this benchmark was started, as a user would type it: ``python -m bench NAME``
    when ``python -m bench`` ran it, ``python -m bench.NAME`` and its arguments when it ran
    as a module; called from other Python code (a test), its arguments are not known."""
    started = Path(sys.argv[0]) if sys.argv and sys.argv[0] else Path()
    if started.name == "__main__.py" and started.parent.name == "bench":
        return f"python -m bench {module}"
    if started.name == f"{module}.py" and started.parent.name == "bench":
        return " ".join(["python", "-m", f"bench.{module}", *map(shlex.quote, sys.argv[1:])])
    return f"bench.{module}.main() called from Python (its arguments not recorded)"


def stamp(results: dict[str, Any], module: str) -> dict[str, Any]:
    """``results`` with the command that made them and, under ``run``, when they were
    written and the commit (kept where the benchmark recorded its own)."""
    run = dict(results.get("run") or {})
    run.setdefault("ended", datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"))
    run.setdefault("commit", commit())
    return results | {"command": command_line(module), "run": run}


class RunStart:
    """What a benchmark records of the machine around its run: the commit, the load and the
    time when it began (taken at construction), and the load when it ended (``machine()``)."""

    def __init__(self) -> None:
        self.commit = commit()
        self.load = os.getloadavg()
        self.started = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")

    def machine(self) -> dict[str, Any]:
        """The ``machine`` entry of a results file, read when the run ended."""
        return {"cores": os.cpu_count(), "load_average_1_5_15_at_start": list(self.load),
                "load_average_1_5_15_at_end": list(os.getloadavg()), "nice": os.nice(0),
                "started_utc": self.started, "commit": self.commit}
