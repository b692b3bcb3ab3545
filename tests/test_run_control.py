"""`topo run` and `topo.run()` as a user runs them: exact word counts, and a clean stop on a signal."""
from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from topo.examples.wordcount import expected_counts
from topo.sinks import read_table

ROOT = Path(__file__).resolve().parents[1]
TOPO = [sys.executable, "-m", "topo.cli"]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def test_wordcount_example_gives_the_exact_counts(tmp_path):
    proc = subprocess.run(TOPO + ["run", str(ROOT / "configs" / "wordcount.yaml"), "--quiet"],
                          cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    counts = dict(read_table(str(tmp_path / "wordcount.db"), "word_counts"))
    assert counts == dict(expected_counts(repeat=2000))


ENDLESS = """
name: endless
config:
  acking: true
  max_spout_pending: 2000
spouts:
  - id: sentences
    class: topo.examples.wordcount.SentenceSpout
    kwargs: {repeat: 0}
bolts:
  - {id: split, class: topo.examples.wordcount.SplitBolt, parallelism: 2}
  - {id: count, class: topo.examples.wordcount.CountBolt, parallelism: 2}
  - id: sink
    class: topo.sinks.SQLiteSink
    kwargs: {path: counts.db, table: word_counts, fields: [word, count], key_fields: [word]}
streams:
  - {from: sentences, to: split, grouping: {type: shuffle}}
  - {from: split, to: count, grouping: {type: fields, fields: [word]}}
  - {from: count, to: sink, grouping: {type: fields, fields: [word]}}
"""


def _signal_once_running(cmd: list[str], cwd: Path, sig: int) -> tuple[int, str, str, float]:
    """Start ``cmd`` (a run of ENDLESS, writing counts.db in ``cwd``), send ``sig`` once
    rows are written; returns (exit status, stdout, stderr, seconds from signal to exit)."""
    proc = subprocess.Popen(cmd, cwd=cwd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    db = cwd / "counts.db"

    def rows_written() -> bool:
        try:
            return bool(db.exists() and read_table(str(db), "word_counts"))
        except sqlite3.OperationalError:  # the file exists before the sink has made its table
            return False

    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not rows_written() and proc.poll() is None:
            time.sleep(0.2)
        assert proc.poll() is None, proc.communicate()
        assert rows_written(), "no rows written within 60 s: the run never got under way"
        sent = time.monotonic()
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=30)
        return proc.returncode, out, err, time.monotonic() - sent
    finally:
        if proc.poll() is None:  # never leave a topology running after a failed test
            proc.kill()
            proc.communicate()


def test_sigterm_drains_and_exits_zero(tmp_path):
    (tmp_path / "endless.yaml").write_text(ENDLESS)
    code, out, err, took = _signal_once_running(TOPO + ["run", "endless.yaml"], tmp_path, signal.SIGTERM)
    db = tmp_path / "counts.db"
    assert code == 0, err
    assert took < 15  # drain_timeout_s is 10
    assert "Traceback" not in err
    # The summary reports the spout: every tuple tree ended acked or failed back, none pending.
    assert "stopped (signal)" in out
    row = next(line.split() for line in out.splitlines() if line.startswith("sentences "))
    emitted, acked, failed = int(row[2]), int(row[4]), int(row[5])
    assert emitted > 0 and acked + failed == emitted
    rows = dict(read_table(str(db), "word_counts"))
    assert rows and all(n > 0 for n in rows.values())


def test_an_unencodable_value_stops_the_run_with_one_line_naming_component_and_field(tmp_path):
    (tmp_path / "badmod.py").write_text(
        "from topo.api import Spout\n"
        "class BadSpout(Spout):\n"
        "    outputs = ['id', 'payload']\n"
        "    def next_tuple(self):\n"
        "        self.collector.emit([1, {1, 2}])\n")
    (tmp_path / "bad.yaml").write_text(
        "name: badval\n"
        "spouts: [{id: s, class: badmod.BadSpout}]\n"
        "bolts: [{id: b, class: topo.examples.slow_stage.CountBolt}]\n"
        "streams: [{from: s, to: b, grouping: {type: shuffle}}]\n")
    proc = subprocess.run(TOPO + ["run", "bad.yaml", "--quiet"], cwd=tmp_path, env=_env(),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert "component 's'" in proc.stderr and "field 'payload'" in proc.stderr and "set" in proc.stderr


# What the README's Python example does: topo.run() from a script's main thread.
RUN_FROM_PYTHON = """
import sys
from topo import run
from topo.spec import load

result = run(load(sys.argv[1]))
print("reason:", result.reason)
print(result)
"""


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_run_from_python_drains_on_a_signal(tmp_path, sig):
    """topo.run() called from the main thread handles Ctrl-C and SIGTERM itself: the run
    drains and returns (reason "signal") instead of raising KeyboardInterrupt or dying."""
    (tmp_path / "endless.yaml").write_text(ENDLESS)
    (tmp_path / "main.py").write_text(RUN_FROM_PYTHON)
    code, out, err, took = _signal_once_running([sys.executable, "main.py", "endless.yaml"], tmp_path, sig)
    assert code == 0, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    assert "reason: signal" in out
    assert "sentences: emitted=" in out          # the result's per-component summary
    assert took < 15  # drain_timeout_s is 10


def test_spark_engine_without_the_extra_says_how_to_install_it(tmp_path):
    """Without pyspark (a `make run` venv) `--engine spark` is one line naming the extra, exit 1."""
    hide_pyspark = ("import sys; sys.modules['pyspark'] = None; from topo.cli import main; "
                    f"sys.exit(main(['run', '--engine', 'spark', {str(ROOT / 'configs' / 'wordcount.yaml')!r}]))")
    proc = subprocess.run([sys.executable, "-c", hide_pyspark], cwd=tmp_path, env=_env(),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert "pyspark" in proc.stderr and "pip install 'topo[spark]'" in proc.stderr
