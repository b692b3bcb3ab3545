"""``topo run`` / ``status`` / ``bench`` and ``topo.run``: dispatch, summaries, one-line errors."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

import topo
from topo import EngineUnavailable
from topo.cli import main
from topo.spec import load

REPO = Path(__file__).resolve().parent.parent
TOPO = REPO / ".venv" / "bin" / "topo"
WORDCOUNT = REPO / "configs" / "wordcount.yaml"
QUICK = ["--config", "backpressure.policy=none", "--max-tuples", "300"]


def _topo(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    exe = [str(TOPO)] if TOPO.exists() else [sys.executable, "-m", "topo.cli"]
    return subprocess.run([*exe, *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_run_prints_a_summary_per_component(tmp_path: Path) -> None:
    done = _topo("run", str(WORDCOUNT), *QUICK, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("topology 'wordcount' stopped"))
    assert "(max_tuples)" in lines[start]
    assert lines[start + 1].split() == ["component", "tasks", "emitted", "executed", "acked", "failed"]
    rows = {line.split()[0]: line.split()[1:] for line in lines[start + 2:]}
    assert list(rows) == ["sentences", "split", "count", "sink"]
    assert rows["sentences"][0] == "1" and int(rows["sentences"][1]) >= 300
    assert (tmp_path / "wordcount.db").exists()


def test_status_file_written_and_read_back(tmp_path: Path) -> None:
    status = tmp_path / "st.json"
    done = _topo("run", str(WORDCOUNT), *QUICK, "--quiet", "--config", f"status.path={status}", cwd=tmp_path)
    assert (done.returncode, done.stdout) == (0, ""), done.stderr
    shown = _topo("status", "--file", str(status), cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert "topology 'wordcount' (stopped" in shown.stdout and "sentences" in shown.stdout


@pytest.mark.parametrize("args, line", [
    (["--master", "local[2]"], "--master: only the spark engine takes a master URL (engine is 'local')"),
    (["--zk", "http://zk:2181"], "--zk: expected zookeeper://host:port/root (got 'http://zk:2181')"),
    (["--metrics-port", "70000"], "--metrics-port: must be a port number 0..65535 (got 70000)"),
    (["--config", "acking"], "--config: acking: expected key=value (got 'acking')"),
    (["--config", "queue.low_mark=60MB"], "--config: queue.low_mark: must be below queue.high_mark "
                                          "(got 60000000)"),
])
def test_run_usage_errors_are_one_line(args: list[str], line: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", str(WORDCOUNT), *args]) == 2
    out, err = capsys.readouterr()
    assert (out, err) == ("", line + "\n")


def test_run_bad_file_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "t.yaml").write_text("name: t\nspouts:\n  - {id: s, class: nowhere.Spout}\n")
    done = _topo("run", "t.yaml", cwd=tmp_path)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == ("t.yaml:3: spouts[0].class: no module named 'nowhere' (is it installed, or on "
                           "PYTHONPATH?) (got 'nowhere.Spout')\n")


def test_classes_resolve_from_the_working_directory(tmp_path: Path) -> None:
    (tmp_path / "mine.py").write_text(
        "from topo import Spout\nclass S(Spout):\n    outputs = ['x']\n")
    (tmp_path / "t.yaml").write_text("name: t\nspouts:\n  - {id: s, class: mine.S, parallelism: 2}\n")
    done = _topo("validate", "t.yaml", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "t.yaml: topology 't' is valid: 1 components (1 spout, 0 bolts), 2 tasks, 0 streams\n"


def test_status_not_available(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "topo.status", None)  # import fails as if not written
    assert main(["status"]) == 1
    assert capsys.readouterr().err == "topo status: not available\n"


def test_status_gets_its_own_options(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = []
    fake = type(sys)("topo.status")
    fake.status_command = lambda args: seen.append(args.rest) or 0
    monkeypatch.setitem(sys.modules, "topo.status", fake)
    assert main(["status", "--json", "--file", "x.json"]) == 0
    assert seen == [["--json", "--file", "x.json"]]


def test_bench_runs_python_m_bench(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    monkeypatch.setattr("topo.cli.subprocess.call", lambda argv, env: calls.append((argv, env)) or 3)
    assert main(["bench", "--scenario", "x"]) == 3
    argv, env = calls[0]
    assert argv == [sys.executable, "-m", "bench", "--scenario", "x"]
    assert str(REPO) in env["PYTHONPATH"].split(":")


# --- topo.run --------------------------------------------------------------------------

def test_topo_run_local_with_overrides(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    result = topo.run(load(WORDCOUNT), config={"backpressure.policy": "none"}, max_tuples=100)
    assert result.reason == "max_tuples"
    assert result.component_totals()["sentences"]["emitted"] >= 100


def test_topo_run_rejects_bad_combinations(monkeypatch: pytest.MonkeyPatch) -> None:
    t = load(WORDCOUNT)
    with pytest.raises(ValueError, match="unknown engine 'flink'"):
        topo.run(t, "flink")
    with pytest.raises(ValueError, match="takes no master URL"):
        topo.run(t, "local", master="local[2]")
    with pytest.raises(ValueError, match="beside the local engine only"):
        topo.run(t, "spark", services=[object()])
    monkeypatch.setitem(sys.modules, "runtime.spark.engine", None)
    with pytest.raises(EngineUnavailable, match="the spark engine (is not available|cannot be imported)"):
        topo.run(t, "spark")


def test_public_names() -> None:
    from topo.api import Bolt, EndOfStream, Spout, Tuple
    from topo.topology import TopologyBuilder

    assert (topo.Spout, topo.Bolt, topo.Tuple, topo.EndOfStream, topo.TopologyBuilder) == \
        (Spout, Bolt, Tuple, EndOfStream, TopologyBuilder)


# --- the error contract (issue 9, item 6): one line, exit 2 (input) or 1 (environment) ---

def _busy_port() -> tuple[socket.socket, int]:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s, s.getsockname()[1]


def test_a_busy_metrics_port_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    s, port = _busy_port()
    with s:
        assert main(["run", str(WORDCOUNT), *QUICK, "--quiet", "--metrics-port", str(port)]) == 1
    assert capsys.readouterr() == ("", f"--metrics-port: cannot listen on 127.0.0.1:{port}: Address already in "
                                       f"use (got {port})\n")


def test_debug_shows_the_traceback(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    s, port = _busy_port()
    with s, pytest.raises(Exception, match="Address already in use"):
        main(["run", str(WORDCOUNT), *QUICK, "--quiet", "--metrics-port", str(port), "--debug"])


def test_zookeeper_where_nothing_listens_is_one_line_within_the_connect_timeout(tmp_path: Path) -> None:
    s, port = _busy_port()
    s.close()                     # nothing listens there now
    url = f"zookeeper://127.0.0.1:{port}/topo"
    started = time.monotonic()
    done = _topo("run", str(WORDCOUNT), "--max-tuples", "100", "--quiet", "--zk", url,
                 "--config", "zookeeper.connect_timeout_s=1", cwd=tmp_path)
    took = time.monotonic() - started
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr == f"--zk: cannot reach ZooKeeper at 127.0.0.1:{port} within 1s (got {url!r})\n"
    assert took < 1 + 4, took      # the timeout, plus starting Python


@pytest.mark.parametrize("key", ["dead_letter_path", "status.path"])
def test_an_unwritable_path_is_caught_at_start(key: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a-file").write_text("")
    bad = str(tmp_path / "a-file" / "x.jsonl")
    assert main(["run", str(WORDCOUNT), *QUICK, "--quiet", "--config", f"{key}={bad}"]) == 1
    assert capsys.readouterr() == ("", f"--config: {key}: cannot write there: {tmp_path / 'a-file'} is not a "
                                       f"directory (got {bad!r})\n")
    assert not (tmp_path / "wordcount.db").exists()      # nothing ran


def test_an_unwritable_path_in_the_file_names_its_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a-file").write_text("")
    text = WORDCOUNT.read_text()
    (tmp_path / "t.yaml").write_text(text.replace("path: wordcount.db", "path: a-file/wordcount.db"))
    line = next(i for i, s in enumerate(text.splitlines(), 1) if "path: wordcount.db" in s)
    assert main(["run", "t.yaml", *QUICK, "--quiet"]) == 1
    out, err = capsys.readouterr()
    assert err.startswith(f"t.yaml:{line}: bolts[")
    assert err.endswith(f"].kwargs.path: cannot write there: a-file is not a directory (got 'a-file/wordcount.db')\n")


SPARK_ONLY_LOCAL = """\
name: t
config: {engine: spark}
spouts:
  - {id: s, class: mine.Numbers}
bolts:
  - {id: b, class: mine.Square}
streams:
  - {from: s, to: b, grouping: {type: shuffle}}
"""


def test_a_topology_spark_cannot_run_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("pyspark")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.yaml").write_text(SPARK_ONLY_LOCAL)
    (tmp_path / "mine.py").write_text(
        "from topo import Bolt, Spout\n"
        "class Numbers(Spout):\n    outputs = ['n']\n    def next_tuple(self):\n        self.collector.emit([1])\n"
        "class Square(Bolt):\n    outputs = ['n']\n    def execute(self, tup):\n        pass\n")
    assert main(["run", "t.yaml", "--quiet"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert err.startswith("t.yaml:2: config.engine: topology 't' cannot run on Spark: spout 's' ")
    assert err.endswith(" (got 'spark')\n")


def test_an_unexpected_error_is_one_line_with_a_hint(monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    def boom(*args: object, **kwargs: object) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(topo, "run", boom)
    assert main(["run", str(WORDCOUNT), "--quiet"]) == 1
    assert capsys.readouterr().err == ("topo run: unexpected RuntimeError: boom (run again with --debug for "
                                       "the traceback)\n")
    with pytest.raises(RuntimeError):
        main(["--debug", "run", str(WORDCOUNT), "--quiet"])


# --- first day (issue 9, item 11) ---------------------------------------------------------

def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    from importlib.metadata import version

    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out == f"topo {version('topo')}\n"


def test_status_with_no_argument_shows_the_last_local_run(tmp_path: Path) -> None:
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state")}
    exe = [str(TOPO)] if TOPO.exists() else [sys.executable, "-m", "topo.cli"]
    done = subprocess.run([*exe, "run", str(WORDCOUNT), *QUICK, "--quiet"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "state" / "topo" / "status" / "wordcount.json").exists()
    shown = subprocess.run([*exe, "status"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith("topology 'wordcount' (stopped, embedded coordinator, status file ")
    assert "sentences" in shown.stdout and "sink" in shown.stdout


def test_a_reader_that_goes_away_is_not_an_error(tmp_path: Path) -> None:
    """``topo status ... | head -1``: the rest of the table meets a closed pipe; topo stops quietly."""
    import json as _json

    from runtime.observe.stats import TaskStats

    tasks = [TaskStats("big", f"c{i % 50}", i, False, hard_bound=1000).snapshot() for i in range(1, 3001)]
    status = tmp_path / "big.json"
    status.write_text(_json.dumps({"topology": "big", "running": False, "written": 0, "tasks": tasks}))
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run(["bash", "-c", f"set -o pipefail; {sys.executable} -m topo.cli status --file {status} "
                                         f"| head -1"], capture_output=True, text=True, env=env, timeout=60)
    assert proc.stdout.startswith("topology 'big'")
    assert "Broken pipe" not in proc.stderr and proc.stderr == ""
    assert proc.returncode == 0
