"""``topo status``: rows from the run's status file (embedded) and from taskstate znodes (ZooKeeper)."""
from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path

import pytest

from backpressure.policy.stepwise import StepwiseParams
from backpressure.drivers.stepwise import StepwiseFlowControl
from runtime.local.engine import LocalEngine
from test_stepwise_flow import HIGH, PARAMS, FakeTask
from topo.api import Bolt, EndOfStream, Spout, Tuple
from topo.status import StatusWriter, render, status_command
from topo.topology import TopologyBuilder
from coord_backends import until
from zk_server import ZooKeeperServer, zookeeper  # noqa: F401

pytestmark = pytest.mark.timeout(120)


def ns(*words: str) -> argparse.Namespace:
    return argparse.Namespace(rest=list(words))


class Count(Spout):
    outputs = ["n"]

    def __init__(self) -> None:
        self.i = 0

    async def next_tuple(self) -> None:
        if self.i >= 3000:
            raise EndOfStream
        self.collector.emit([self.i])
        self.i += 1
        if self.i % 100 == 0:
            await asyncio.sleep(0.01)


class Sink(Bolt):
    def execute(self, tup: Tuple) -> None:
        pass


async def test_status_file_of_an_embedded_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "run.status.json"
    b = TopologyBuilder("statusdemo")
    b.spout("numbers", Count())
    b.bolt("sink", Sink(), 2).shuffle("numbers")
    writer = StatusWriter(path, interval=0.05)
    engine = LocalEngine(b.build(), {"backpressure.sensitivity_ms": 100}, services=[writer])
    run = asyncio.create_task(engine.run())
    await until(path.exists, what="status file written")
    await asyncio.sleep(0.1)
    assert status_command(ns("--file", str(path))) == 0
    out = capsys.readouterr().out
    assert "topology 'statusdemo' (running, embedded coordinator" in out
    lines = out.strip().splitlines()
    assert lines[1].split()[:5] == ["component", "task", "rate", "originv", "k"]
    assert [ln.split()[0] for ln in lines[2:]] == ["numbers", "sink", "sink"]
    assert "500.0 KB / 50.0 MB" in out
    await run
    doc = json.loads(path.read_text())
    assert doc["running"] is False and len(doc["tasks"]) == 3
    assert {r["component"] for r in doc["tasks"]} == {"numbers", "sink"}
    assert status_command(ns("--file", str(path), "--json")) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["task"] for r in rows] == [1, 2, 3]


def test_status_from_topology_yaml_uses_status_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status = tmp_path / "s.json"
    status.write_text(json.dumps({"topology": "t", "written": 0, "running": True, "tasks": [
        {"component": "spout", "task": 1, "rate": 2500.0, "originv": 10000.0, "k": 2, "backpressure": True,
         "queue_bytes": 0, "high_mark": 400_000, "low_mark": 40_000}]}))
    yaml = tmp_path / "t.yaml"
    yaml.write_text(f"name: t\nconfig:\n  status.path: {status}\nspouts:\n  - id: s\n    class: topo.api.Spout\n")
    assert status_command(ns(str(yaml))) == 0
    out = capsys.readouterr().out
    assert "WARNING: not updated" in out
    row = out.strip().splitlines()[-1].split()
    assert row[:7] == ["spout", "1", "2,500.0/s", "10,000.0/s", "2", "BP", "0"]


def test_status_errors_exit_1(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    assert status_command(ns("--file", str(tmp_path / "missing.json"))) == 1
    assert "no status file" in capsys.readouterr().err
    (tmp_path / "bad.json").write_text("{not json")
    assert status_command(ns("--file", str(tmp_path / "bad.json"))) == 1
    capsys.readouterr()
    assert status_command(ns()) == 1
    assert capsys.readouterr().err == (f"topo status: no local run has written its status under "
                                       f"{tmp_path / 'state' / 'topo' / 'status'}; give a topology.yaml, "
                                       "--file PATH or --zk URL --name NAME\n")
    yaml = tmp_path / "t.yaml"
    yaml.write_text("name: t\nspouts:\n  - id: s\n    class: topo.api.Spout\n")
    assert status_command(ns(str(yaml))) == 1      # its default status file: no run yet
    assert "t.json: no status file" in capsys.readouterr().err


def test_render_columns() -> None:
    text = render([{"component": "bolt", "task": 2, "rate": None, "originv": None, "k": 0,
                    "backpressure": False, "queue_bytes": 1234567, "high_mark": 50_000_000, "low_mark": 500_000}])
    header, row = text.splitlines()
    assert header.split() == ["component", "task", "rate", "originv", "k", "flag", "queue", "low/high", "mark"]
    assert row.split() == ["bolt", "2", "off", "-", "0", "-", "1.2", "MB", "500.0", "KB", "/", "50.0", "MB"]


def test_render_shows_the_worker_of_each_task_of_a_run_in_workers() -> None:
    rows = [{"component": c, "task": t, "rate": None, "originv": None, "k": 0, "backpressure": False,
             "queue_bytes": 0, "high_mark": 2000, "low_mark": 200, "worker": w}
            for c, t, w in (("numbers", 1, 0), ("slow", 3, 0), ("slow", 2, 1))]
    header, *lines = render(rows).splitlines()
    assert header.split()[-1] == "worker"
    assert [(line.split()[1], line.split()[-1]) for line in lines] == [("1", "0"), ("2", "1"), ("3", "0")]


@pytest.mark.zookeeper
async def test_status_from_zookeeper_taskstate(zookeeper: ZooKeeperServer, capsys: pytest.CaptureFixture[str]) -> None:
    from backpressure.coordinator.zookeeper import ZooKeeperCoordinator

    zookeeper.start()
    url = zookeeper.url("/topo-status")
    spout, bolt = FakeTask(1, "spout", rate=8_000.0), FakeTask(2, "bolt", [1])
    params = StepwiseParams(high_mark=PARAMS.high_mark, low_mark=PARAMS.low_mark, sensitivity=30.0)
    fc = StepwiseFlowControl(params, ZooKeeperCoordinator(url, "zkdemo"), period=0.02, heartbeat=0.1)
    await fc.start([spout, bolt])
    try:
        bolt.q = HIGH
        fc.poll(bolt)
        await until(lambda: spout.limit == 4_000.0)
        await asyncio.sleep(0.3)
        loop = asyncio.get_running_loop()
        code = await loop.run_in_executor(None, status_command, ns("--zk", url, "--name", "zkdemo"))
        assert code == 0
        out = capsys.readouterr().out
        lines = out.strip().splitlines()
        assert "topology 'zkdemo' (ZooKeeper" in lines[0]
        spout_row, bolt_row = lines[2].split(), lines[3].split()
        assert spout_row[:6] == ["spout", "1", "4,000.0/s", "8,000.0/s", "1", "BP"]
        assert bolt_row[:6] == ["bolt", "2", "off", "-", "0", "-"]
        assert "1.0 MB" in lines[3]
        code = await loop.run_in_executor(None, status_command, ns("--zk", url, "--name", "nosuch"))
        assert code == 1 and "no topology 'nosuch'" in capsys.readouterr().err
    finally:
        await fc.stop()


def test_status_where_no_zookeeper_listens_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]          # nothing listens once closed
    assert status_command(ns("--zk", f"zookeeper://127.0.0.1:{port}/topo", "--name", "x", "--timeout", "1")) == 1
    assert capsys.readouterr().err == f"topo status: cannot reach ZooKeeper at 127.0.0.1:{port} within 1s\n"
