"""Checkpoints across worker processes: the supervisor takes one global drained cut, and a
worker killed with -9 rolls every worker back to the last checkpoint, so a word count with
keyed state (a ``KeyedBolt``) ends with exactly the input's counts."""
from __future__ import annotations

import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from topo.examples.wordcount import expected_counts
from topo.sinks import read_table

sys.path.insert(0, str(Path(__file__).parent))      # test_checkpoints' REPLAYING topology

ROOT = Path(__file__).resolve().parents[1]
TOPO = [sys.executable, "-m", "topo.cli"]

pytestmark = pytest.mark.timeout(300)

REPEAT = 3000
WORDS = f"""
name: keyedwords
config:
  acking: true
  max_spout_pending: 2000
  checkpoint.interval_ms: 200
spouts:
  - {{id: sentences, class: topo.examples.wordcount.SentenceSpout, kwargs: {{repeat: {REPEAT}}}}}
bolts:
  - {{id: split, class: topo.examples.wordcount.SplitBolt, parallelism: 2}}
  - {{id: count, class: worker_slow.KeyedWordCount, parallelism: 2, kwargs: {{pause_s: 0.001, every: 10}}}}
  - id: sink
    class: topo.sinks.SQLiteSink
    kwargs: {{path: words.db, table: word_counts, fields: [word, count], key_fields: [word]}}
streams:
  - {{from: sentences, to: split, grouping: {{type: shuffle}}}}
  - {{from: split, to: count, grouping: {{type: fields, fields: [word]}}}}
  - {{from: count, to: sink, grouping: {{type: fields, fields: [word]}}}}
"""


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "tests" / "data"), env.get("PYTHONPATH", "")])
    return env


def _workers_of(pid: int) -> list[int]:
    """The worker processes a ``topo run`` started (multiprocessing's spawned children)."""
    out = []
    for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
        try:
            cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
        except OSError:
            continue
        if b"spawn_main" in cmdline:
            out.append(int(child))
    return sorted(out)


def _running(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie (a finished worker not yet reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _checkpoints(tmp_path: Path) -> tuple[int, int]:
    """(rows, newest id) in the checkpoint file; (0, 0) before it has any."""
    path = tmp_path / "checkpoints" / "keyedwords.checkpoints.sqlite"
    try:
        with sqlite3.connect(path) as conn:
            rows, newest = conn.execute("SELECT count(*), max(id) FROM checkpoints").fetchone()
    except sqlite3.Error:            # not there yet, or its table not yet made
        return 0, 0
    return rows, newest or 0


def test_a_worker_killed_with_minus_9_rolls_every_worker_back_and_the_counts_are_exact(tmp_path: Path) -> None:
    (tmp_path / "words.yaml").write_text(WORDS)
    proc = subprocess.Popen(TOPO + ["run", "words.yaml", "--workers", "2", "--quiet"], cwd=tmp_path, env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    killed: list[int] = []
    try:
        for _ in range(2):
            # Each kill once both workers of this generation run and took a checkpoint since the last kill.
            last = _checkpoints(tmp_path)[1]
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and proc.poll() is None:
                workers = _workers_of(proc.pid)
                if len(workers) == 2 and not set(workers) & set(killed) and _checkpoints(tmp_path)[1] > last:
                    break
                time.sleep(0.05)
            if proc.poll() is not None:
                break
            assert len(workers) == 2 and not set(workers) & set(killed) and _checkpoints(tmp_path)[1] > last, \
                "no new generation of two workers with a new checkpoint within 60 s"
            time.sleep(0.3)
            victim = workers[len(killed) % 2]
            assert _running(victim), "the worker finished before it could be killed: the run is too short"
            os.kill(victim, signal.SIGKILL)
            killed += workers
    finally:
        out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err[-2000:]
    assert len(killed) == 4, "the run ended before the second kill"
    rolled = re.findall(r"every worker rolls back to checkpoint (\d+)", err)
    assert len(rolled) == 2 and all(int(cid) > 0 for cid in rolled), err[-2000:]   # to a real checkpoint
    assert dict(read_table(str(tmp_path / "words.db"), "word_counts")) == dict(expected_counts(repeat=REPEAT))


def test_tuples_that_time_out_in_workers_roll_every_worker_back_and_the_counts_are_exact(tmp_path: Path) -> None:
    """A failed tuple tree (timeouts: 200 sentences in flight before a 1 ms/word stage, a 1 s
    message timeout) raises Rollback in the worker whose spout owns it; the supervisor rolls
    every worker back to the last checkpoint (the timeout doubling each time)."""
    from test_checkpoints import REPLAYING

    yaml = REPLAYING.replace("max_spout_pending: 2000", "max_spout_pending: 200").replace("repeat: 300", "repeat: 60")
    assert yaml != REPLAYING
    (tmp_path / "replaying.yaml").write_text(yaml)
    proc = subprocess.run(TOPO + ["run", "replaying.yaml", "--workers", "2", "--quiet", "--config",
                                  "checkpoint.interval_ms=100", "--config", "message_timeout_s=1"],
                          cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "timeout: every worker rolls back to checkpoint" in proc.stderr     # timeouts did happen
    assert dict(read_table(str(tmp_path / "wordcount.db"), "word_counts")) == dict(expected_counts(repeat=60))


def test_a_checkpoint_taken_by_workers_resumes_in_one_process(tmp_path: Path) -> None:
    """The supervisor writes the same checkpoint rows one process writes (per component and
    task index), so a run killed with its workers resumes with any number of them."""
    (tmp_path / "words.yaml").write_text(WORDS)
    proc = subprocess.Popen(TOPO + ["run", "words.yaml", "--workers", "2", "--quiet"], cwd=tmp_path, env=_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and _checkpoints(tmp_path)[0] < 3 and proc.poll() is None:
        time.sleep(0.05)
    workers = _workers_of(proc.pid)
    proc.kill()                                  # the supervisor: its workers see their pipe close
    proc.wait(30)
    assert _checkpoints(tmp_path)[0] >= 3 and len(workers) == 2
    for pid in workers:                          # (and stop without committing anything more)
        while _running(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _running(pid), f"worker {pid} still runs after its supervisor was killed (the 60 s deadline passed)"
    partial = dict(read_table(str(tmp_path / "words.db"), "word_counts"))
    expected = dict(expected_counts(repeat=REPEAT))
    assert partial and partial != expected           # killed mid-run, after some checkpoints
    done = subprocess.run(TOPO + ["run", "words.yaml", "--quiet"], cwd=tmp_path, env=_env(), capture_output=True,
                          text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    assert dict(read_table(str(tmp_path / "words.db"), "word_counts")) == expected
