"""Checkpoints: a restart resumes, and the sink's table is exact after kill -9 and replays.

Runs are real ``topo run`` processes killed with SIGKILL at random points; the
final table is compared with the counts computed without a topology.
"""
from __future__ import annotations

import asyncio
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import msgpack
import pytest
import yaml

from topo.api import Bolt, CheckpointError, EndOfStream, Spout, Tuple
from topo.examples.wordcount import expected_counts
from topo.sinks import read_table
from topo.topology import TopologyBuilder
from runtime.local.checkpoint_store import CheckpointStore
from runtime.local.engine import LocalEngine

ROOT = Path(__file__).resolve().parents[1]
TOPO = [sys.executable, "-m", "topo.cli"]
WORDCOUNT = str(ROOT / "configs" / "wordcount.yaml")

pytestmark = pytest.mark.timeout(600)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "tests" / "data"), env.get("PYTHONPATH", "")])
    return env


def _counts(db: Path) -> dict[str, int]:
    """The sink's table; empty before the run has created it (the file may come first)."""
    try:
        return dict(read_table(str(db), "word_counts")) if db.exists() else {}
    except sqlite3.OperationalError as e:
        if "no such table" in str(e):
            return {}
        raise


def _kill_and_restart(tmp_path: Path, args: list[str], kills: int, seed: int,
                      window: tuple[float, float],
                      read: Callable[[Path], dict[str, int]] | None = None) -> list[dict[str, int]]:
    """``kills`` runs killed with SIGKILL at random points, then one run to the end.
    Returns the table after each killed run (``read(tmp_path)``; by default the
    SQLite sink's word_counts), for the monotonicity check.

    The first run is killed a random time *after* its first rows are in the table
    (a checkpoint completed), however slow the machine is to start it, so at least
    one kill lands after a checkpoint; the others at a random time from their start. The
    first run must write rows within 120 s and each run must still be running when it is
    killed (the topology must outlast all the killed runs together), or a kill tested nothing."""
    read = read or (lambda d: _counts(d / "wordcount.db"))
    rng = random.Random(seed)
    seen = []
    for i in range(kills):
        proc = subprocess.Popen(TOPO + ["run", *args, "--quiet"], cwd=tmp_path, env=_env(),
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        if i == 0:
            deadline = time.monotonic() + 120
            while not read(tmp_path) and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.02)
            assert read(tmp_path), "the first run wrote no rows within 120 s"
            time.sleep(rng.uniform(0, window[1] - window[0]))
        else:
            time.sleep(rng.uniform(*window))
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        assert proc.returncode == -signal.SIGKILL, \
            f"killed run {i + 1} had ended before its kill (exit {proc.returncode}): the topology is too short"
        seen.append(read(tmp_path))
    done = subprocess.run(TOPO + ["run", *args, "--quiet"], cwd=tmp_path, env=_env(),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return seen


def _never_backwards(tables: list[dict[str, int]]) -> None:
    for before, after in zip(tables, tables[1:]):
        assert all(after.get(w, 0) >= n for w, n in before.items()), "a count went backwards between runs"


def _paced_wordcount(tmp_path: Path) -> str:
    """configs/wordcount.yaml with a pacing stage ahead of its sink (5 ms every 16 words:
    about 20 s for its 64,000 words instead of about 1 s), so ten runs killed at most
    1.6 s after their start all die mid-run; 1,000 sentences in flight (not 5,000) keep
    the paced backlog well under the 30 s message timeout."""
    spec = yaml.safe_load(Path(WORDCOUNT).read_text())
    spec["config"]["max_spout_pending"] = 1000
    spec["bolts"].insert(-1, {"id": "paced", "class": "checkpoint_components.SlowPass",
                              "kwargs": {"delay_s": 0.005, "every": 16}})
    for stream in spec["streams"]:
        if stream["to"] == "sink":
            stream["to"] = "paced"
    spec["streams"].append({"from": "paced", "to": "sink", "grouping": {"type": "fields", "fields": ["word"]}})
    (tmp_path / "wordcount.yaml").write_text(yaml.safe_dump(spec))
    return "wordcount.yaml"


def test_ten_kill9s_in_a_row_then_the_table_is_exact(tmp_path: Path) -> None:
    args = [_paced_wordcount(tmp_path), "--config", "checkpoint.interval_ms=100"]
    tables = _kill_and_restart(tmp_path, args, kills=10, seed=11, window=(0.4, 1.6))
    _never_backwards(tables)
    assert _counts(tmp_path / "wordcount.db") == dict(expected_counts(repeat=2000))
    assert any(tables), "no kill landed after a checkpoint: the test did not exercise a restart"


REPLAYING = """
name: wordcount
config:
  acking: true
  max_spout_pending: 2000
spouts:
  - {id: sentences, class: topo.examples.wordcount.SentenceSpout, kwargs: {repeat: 300}}
bolts:
  - {id: split, class: topo.examples.wordcount.SplitBolt, parallelism: 2}
  - {id: count, class: topo.examples.wordcount.CountBolt, parallelism: 2}
  - {id: slow, class: checkpoint_components.SlowPass, kwargs: {delay_s: 0.001}}
  - id: sink
    class: topo.sinks.SQLiteSink
    kwargs: {path: wordcount.db, table: word_counts, fields: [word, count], key_fields: [word]}
streams:
  - {from: sentences, to: split, grouping: {type: shuffle}}
  - {from: split, to: count, grouping: {type: fields, fields: [word]}}
  - {from: count, to: slow, grouping: {type: fields, fields: [word]}}
  - {from: slow, to: sink, grouping: {type: fields, fields: [word]}}
"""


def test_timeouts_small_enough_to_replay_roll_back_and_the_table_is_exact(tmp_path: Path) -> None:
    (tmp_path / "replaying.yaml").write_text(REPLAYING)
    args = ["replaying.yaml", "--config", "checkpoint.interval_ms=100", "--config", "message_timeout_s=0.3"]
    proc = subprocess.run(TOPO + ["run", *args, "--quiet"], cwd=tmp_path, env=_env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "rolling back to the last checkpoint" in proc.stderr    # replays did happen
    assert _counts(tmp_path / "wordcount.db") == dict(expected_counts(repeat=300))


def test_kill9_with_replays_then_the_table_is_exact(tmp_path: Path) -> None:
    (tmp_path / "replaying.yaml").write_text(REPLAYING)
    args = ["replaying.yaml", "--config", "checkpoint.interval_ms=100", "--config", "message_timeout_s=0.3"]
    tables = _kill_and_restart(tmp_path, args, kills=5, seed=5, window=(0.5, 2.0))
    _never_backwards(tables)
    assert _counts(tmp_path / "wordcount.db") == dict(expected_counts(repeat=300))


# -- in process -----------------------------------------------------------------------------

class Offsets(Spout):
    """0..total-1 with its position as checkpointed state."""

    outputs = ["n"]

    def __init__(self, total: int) -> None:
        self.total, self.i = total, 0

    def next_tuple(self) -> None:
        if self.i >= self.total:
            raise EndOfStream
        self.collector.emit([self.i], msg_id=self.i)
        self.i += 1

    def snapshot_state(self) -> Any:
        return self.i

    def restore_state(self, state: Any) -> None:
        self.i = state


class Summer(Bolt):
    def __init__(self, delay_s: float = 0.0) -> None:
        self.total = 0
        self.delay_s = delay_s

    async def execute(self, tup: Tuple) -> None:
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        self.total += tup["n"]

    def snapshot_state(self) -> Any:
        return self.total

    def restore_state(self, state: Any) -> None:
        self.total = state


def _engine(tmp_path: Path, spout: Spout, bolt: Bolt, **config: Any) -> LocalEngine:
    b = TopologyBuilder("ck", {"checkpoint.interval_ms": 50, "checkpoint.dir": str(tmp_path), **config})
    b.spout("src", spout)
    b.bolt("sum", bolt).shuffle("src")
    return LocalEngine(b.build())


async def test_a_restart_resumes_from_the_last_checkpoint(tmp_path: Path) -> None:
    first = _engine(tmp_path, Offsets(2000), Summer(), **{"backpressure.policy": "none"})
    await first.run()
    assert first.checkpointer is not None and first.checkpointer.stats.completed >= 1
    again = _engine(tmp_path, Offsets(2000), Summer())
    await again.run()
    summer = again.bolt_tasks[0].bolt
    assert summer.total == sum(range(2000))      # restored, not recomputed from 0 and not doubled
    assert again.spout_tasks[0].stats.emitted == 0


async def test_a_checkpoint_completes_while_stepwise_holds_the_spout_down(tmp_path: Path) -> None:
    engine = _engine(tmp_path, Offsets(10**9), Summer(delay_s=0.0005), **{
        "backpressure.policy": "stepwise", "queue.high_mark": "8KB", "queue.low_mark": "2KB",
        "backpressure.sensitivity_ms": 100, "checkpoint.interval_ms": 300})
    spout = engine.spout_tasks[0]
    checkpointer = engine.checkpointer
    assert checkpointer is not None
    held_through: list[int] = []

    async def watch() -> None:
        while spout.stats.k < 1:                       # wait for stepwise to hold the spout
            await asyncio.sleep(0.01)
        before = checkpointer.stats.completed
        ks = []
        while checkpointer.stats.completed == before:  # a checkpoint taken while it is held
            ks.append(spout.stats.k)
            await asyncio.sleep(0.01)
        held_through.extend(ks)
        engine.request_stop("stopped")

    watcher = asyncio.create_task(watch())
    await asyncio.wait_for(engine.run(), 60)
    await watcher
    assert held_through and min(held_through) >= 1      # the spout was held the whole time
    assert checkpointer.stats.abandoned == 0


async def test_a_damaged_checkpoint_is_skipped_for_the_one_before_it(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, "ck")
    fp = {"src": {"kind": "spout", "class": "x", "parallelism": 1, "stateful": True}}
    store.save(1, fp, {"src": {0: msgpack.packb(10)}})
    store.save(2, fp, {"src": {0: msgpack.packb(20)}})
    with sqlite3.connect(store.path) as db:      # half-written / damaged payload of the newest
        db.execute("UPDATE checkpoints SET payload = substr(payload, 1, 5) WHERE id = 2")
    cp = store.latest()
    assert cp is not None and cp.id == 1 and msgpack.unpackb(cp.states["src"][0]) == 10


def test_a_file_that_is_not_a_database_is_one_clear_error(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, "ck")
    store.path.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(CheckpointError, match=r"ck\.checkpoints\.sqlite: file is not a database.*--from-scratch"):
        store.latest()


async def test_a_changed_topology_is_refused_naming_what_changed(tmp_path: Path) -> None:
    await _engine(tmp_path, Offsets(100), Summer()).run()
    b = TopologyBuilder("ck", {"checkpoint.interval_ms": 50, "checkpoint.dir": str(tmp_path)})
    b.spout("src", Offsets(100))
    b.bolt("sum", Summer(), parallelism=2).shuffle("src")
    with pytest.raises(CheckpointError, match=r"component 'sum' parallelism 1 -> 2.*--from-scratch"):
        await LocalEngine(b.build()).run()


def test_a_spout_without_offsets_cannot_be_checkpointed(tmp_path: Path) -> None:
    class NoOffsets(Spout):
        outputs = ["n"]

        def next_tuple(self) -> None:
            raise EndOfStream

    with pytest.raises(CheckpointError, match=r"spout 'src' \(NoOffsets\) keeps no offsets"):
        _engine(tmp_path, NoOffsets(), Summer())


def _emitted_by_spout(stdout: str) -> int:
    """The spout's emitted count from ``topo run``'s closing summary table."""
    row = next(line for line in stdout.splitlines() if line.startswith("sentences"))
    return int(row.split()[2].replace(",", ""))


def test_a_finished_run_resumes_at_its_end_and_from_scratch_starts_over(tmp_path: Path) -> None:
    def run(*extra: str) -> subprocess.CompletedProcess:
        proc = subprocess.run(TOPO + ["run", WORDCOUNT, "--config", "checkpoint.interval_ms=200", *extra],
                              cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        return proc

    assert _emitted_by_spout(run().stdout) == 10_000
    assert _emitted_by_spout(run().stdout) == 0                     # resumed at the end: nothing left
    assert _emitted_by_spout(run("--from-scratch").stdout) == 10_000
    assert _counts(tmp_path / "wordcount.db") == dict(expected_counts(repeat=2000))
