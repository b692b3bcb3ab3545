"""``topo run`` / ``status`` / ``bench`` and ``topo.run``: dispatch, summaries, one-line errors."""
from __future__ import annotations

import subprocess
import sys
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
    with pytest.raises(EngineUnavailable, match="the spark engine is not available"):
        topo.run(t, "spark")


def test_public_names() -> None:
    from topo.api import Bolt, EndOfStream, Spout, Tuple
    from topo.topology import TopologyBuilder

    assert (topo.Spout, topo.Bolt, topo.Tuple, topo.EndOfStream, topo.TopologyBuilder) == \
        (Spout, Bolt, Tuple, EndOfStream, TopologyBuilder)
