"""File spouts (topo.sources.files): formats, directories and globs, follow mode, exact offsets,
and a resume with checkpoints on that gives exact results."""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
import zlib
from collections import Counter
from pathlib import Path
from typing import Any

import msgpack
import pytest

from topo.sinks import read_table
from topo.sources.files import CsvSpout, JsonLinesSpout, TextFileSpout
from topo.testing import SpoutHarness

ROOT = Path(__file__).resolve().parents[1]


def values(h: SpoutHarness, n: int = 10**6) -> list[list[Any]]:
    return [e.values for e in h.pull(n) if e.stream == "default"]


def test_text_lines_of_a_directory_in_name_order_skipping_hidden_files(tmp_path: Path) -> None:
    (tmp_path / "b.log").write_text("b1\r\nb2\n")
    (tmp_path / "a.log").write_text("a1\n\na3")          # an empty line, an unterminated last line
    (tmp_path / ".hidden.log").write_text("no\n")
    (tmp_path / "c.txt").write_text("not matched\n")
    h = SpoutHarness(TextFileSpout(str(tmp_path), pattern="*.log"))
    out = h.pull(100)
    assert [e.values for e in out if e.stream == "default"] == [["a1"], [""], ["a3"], ["b1"], ["b2"]]
    assert h.ended and [e.stream for e in out][-1] == "end" and out[-1].values == [0, 1]
    a = str(tmp_path / "a.log")
    assert [e.msg_id for e in out[:3]] == [(a, 0), (a, 3), (a, 4)]    # byte offsets of the lines


def test_a_recursive_glob(tmp_path: Path) -> None:
    (tmp_path / "x" / "y").mkdir(parents=True)
    (tmp_path / "x" / "1.txt").write_text("one\n")
    (tmp_path / "x" / "y" / "2.txt").write_text("two\n")
    h = SpoutHarness(TextFileSpout(str(tmp_path / "**" / "*.txt"), end_stream=None))
    assert values(h) == [["one"], ["two"]] and "end" not in h.outputs


def test_json_lines_fields_missing_keys_blank_lines_and_bad_lines(tmp_path: Path) -> None:
    p = tmp_path / "e.jsonl"
    p.write_text('{"ts": 1, "user": "a", "x": 0}\n\n{"ts": 2}\n[1, 2]\n{"ts": 3, "user": "c"}\n')
    h = SpoutHarness(JsonLinesSpout(str(p), fields=["ts", "user"], batch=1))
    assert values(h, 2) == [[1, "a"], [2, None]]
    with pytest.raises(ValueError, match=r"e\.jsonl: byte 42: a JSON list, not an object"):
        h.pull(1)
    skip = SpoutHarness(JsonLinesSpout(str(p), fields=["ts"], on_error="skip"))
    assert values(skip) == [[1], [2], [3]] and skip.spout.skipped == 1
    whole = SpoutHarness(JsonLinesSpout(str(p), on_error="skip"))
    assert values(whole)[0] == [{"ts": 1, "user": "a", "x": 0}]


def test_csv_with_header_types_and_without_header(tmp_path: Path) -> None:
    p = tmp_path / "t.csv"
    p.write_text('user,ts,price\nann,1,"2.5"\nbob,2,\n\n"c,d",3,1e3\n')
    h = SpoutHarness(CsvSpout(str(p), ["ts", "user", "price"], types={"ts": "int", "price": "float"}))
    assert values(h) == [[1, "ann", 2.5], [2, "bob", None], [3, "c,d", 1000.0]]
    q = tmp_path / "n.csv"
    q.write_text("1;x\n2;y\n")
    assert values(SpoutHarness(CsvSpout(str(q), ["n", "s"], header=False, delimiter=";"))) == [["1", "x"], ["2", "y"]]
    with pytest.raises(ValueError, match="no column"):
        SpoutHarness(CsvSpout(str(p), ["nope"])).pull(1)
    with pytest.raises(ValueError, match="types"):
        CsvSpout(str(p), ["ts"], types={"ts": "date"})


@pytest.mark.parametrize("cut", [0, 1, 2, 3, 5, 7])
def test_a_restored_spout_resumes_at_the_exact_line_in_any_file(tmp_path: Path, cut: int) -> None:
    for name, rows in (("1.csv", [(1, "a"), (2, "b"), (3, "c")]), ("2.csv", [(4, "d"), (5, "e"), (6, "f"), (7, "g")])):
        (tmp_path / name).write_text("n,s\n" + "".join(f"{n},{s}\n" for n, s in rows))
    make = lambda: CsvSpout(str(tmp_path / "*.csv"), ["n", "s"], types={"n": "int"}, batch=1)  # noqa: E731
    first = SpoutHarness(make())
    before = values(first, cut)
    state = msgpack.unpackb(msgpack.packb(first.spout.snapshot_state()), raw=False)
    second = SpoutHarness(make())
    second.spout.restore_state(state)
    after = values(second)
    assert [v[0] for v in before + after] == [1, 2, 3, 4, 5, 6, 7]      # the header read again, not emitted


def test_parallel_tasks_split_the_files_between_them(tmp_path: Path) -> None:
    for i in range(12):
        (tmp_path / f"{i:02}.txt").write_text(f"{i}\n")
    seen = [values(SpoutHarness(TextFileSpout(str(tmp_path)), task_index=k, parallelism=3)) for k in range(3)]
    assert sorted(int(v[0]) for part in seen for v in part) == list(range(12))
    for k, part in enumerate(seen):      # task k reads the files whose name's CRC-32 is k mod 3
        mine = [i for i in range(12) if zlib.crc32(f"{i:02}.txt".encode()) % 3 == k]
        assert mine and sorted(int(v[0]) for v in part) == mine


def test_with_acking_the_end_is_sent_only_after_every_tuple_is_acked(tmp_path: Path) -> None:
    p = tmp_path / "x.txt"
    p.write_text("a\nb\nc\n")
    h = SpoutHarness(TextFileSpout(str(p)), config={"acking": True, "max_retries": 1})
    out = h.pull(3)
    assert len(out) == 3 and h.pull(1, max_calls=5) == [] and not h.ended
    h.ack(out[0].msg_id)
    h.fail(out[1].msg_id)                               # replayed by the engine: still pending
    h.pending[out[1].msg_id] = out[1]
    h.fail(out[1].msg_id)                               # over max_retries: dead-lettered, done
    assert h.pull(1, max_calls=5) == []
    h.ack(out[2].msg_id)
    end = h.pull(1)
    assert [(e.stream, e.values) for e in end] == [("end", [0, 1])] and h.ended


def test_follow_mode_waits_for_whole_lines_new_files_and_truncation(tmp_path: Path) -> None:
    d = tmp_path / "logs"
    spout = TextFileSpout(str(d / "*.log"), follow=True, poll_s=0.0)
    assert "end" not in spout.declare_outputs()
    h = SpoutHarness(spout)
    assert h.pull(1, max_calls=3) == [] and not h.ended                 # nothing there yet
    d.mkdir()
    f = d / "a.log"
    f.write_text("one\ntw")
    assert values(h, 5) == [["one"]] and not h.ended                   # "tw" is not a whole line yet
    with f.open("a") as w:
        w.write("o\n")
    (d / "b.log").write_text("bee\n")
    assert sorted(values(h, 2)) == [["bee"], ["two"]]
    h.ack_all()
    f.write_text("new\n")                                               # truncated and rewritten
    assert values(h, 1) == [["new"]]


def test_a_missing_file_is_refused_at_open_unless_following(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no such file"):
        SpoutHarness(TextFileSpout(str(tmp_path / "none.txt")))
    h = SpoutHarness(TextFileSpout(str(tmp_path / "later.txt"), follow=True, poll_s=0.0))
    assert h.pull(1, max_calls=2) == []
    (tmp_path / "later.txt").write_text("here\n")
    assert values(h, 1) == [["here"]]


# -- a resume with checkpoints on, killed with SIGKILL at random points --------------------------

SLOW = '''
import time
from topo.api import Bolt


class Slow(Bolt):
    """4 ms an event: a whole run lasts about 15 s, longer than the four killed runs together."""
    outputs = ["ts", "user"]

    def execute(self, tup):
        time.sleep(0.004)
        self.collector.emit([tup["ts"], tup["user"]])
'''

TOPOLOGY = '''
name: files_resume
config: {acking: true}
spouts:
  - {id: events, class: topo.sources.files.JsonLinesSpout, kwargs: {path: data, fields: [ts, user]}}
bolts:
  - {id: slow, class: slow.Slow}
  - id: per_window
    class: topo.windows.TumblingWindow
    kwargs: {size_s: 30, key_fields: [user], lateness_s: 10}
    parallelism: 2
  - id: sink
    class: topo.sinks.SQLiteSink
    kwargs: {path: out.db, table: counts, fields: [user, window_start, count], key_fields: [user, window_start]}
streams:
  - {from: events, to: slow, grouping: {type: shuffle}}
  - {from: slow, to: per_window, grouping: {type: fields, fields: [user]}}
  - {from: events, to: per_window, grouping: {type: all, stream: end}}
  - {from: per_window, to: sink, grouping: {type: fields, fields: [user]}}
'''


def _checkpoints_taken(tmp_path: Path) -> int:
    """Checkpoints in the run's checkpoint file (0 before the file or its table exists)."""
    import sqlite3

    try:
        with sqlite3.connect(tmp_path / "checkpoints" / "files_resume.checkpoints.sqlite") as conn:
            return conn.execute("SELECT count(*) FROM checkpoints").fetchone()[0]
    except sqlite3.Error:
        return 0


def test_killed_runs_resume_from_checkpoints_and_the_table_is_exact(tmp_path: Path) -> None:
    rng = random.Random(5)
    (tmp_path / "data").mkdir()
    expected: Counter[tuple[str, int]] = Counter()
    i = 0
    for part in range(3):                               # three files, read one after the other
        lines = []
        for _ in range(1200):
            ts, user = i // 2 + rng.randint(-5, 0), rng.choice("abcde")
            expected[(user, ts // 30 * 30)] += 1
            lines.append(json.dumps({"ts": ts, "user": user}))
            i += 1
        (tmp_path / "data" / f"part-{part}.jsonl").write_text("\n".join(lines) + "\n")
    (tmp_path / "slow.py").write_text(SLOW)
    (tmp_path / "t.yaml").write_text(TOPOLOGY)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-m", "topo.cli", "run", "t.yaml", "--quiet", "--config", "checkpoint.interval_ms=100"]
    for i in range(4):
        proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if i == 0:              # the first kill after a checkpoint, however slow the machine is to start
            deadline = time.monotonic() + 120
            while not _checkpoints_taken(tmp_path) and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.02)
            assert _checkpoints_taken(tmp_path), "the first run took no checkpoint within 120 s"
            time.sleep(rng.uniform(0, 1.7))
        else:
            time.sleep(rng.uniform(0.8, 2.5))
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        assert proc.returncode == -signal.SIGKILL, \
            f"killed run {i + 1} had ended before its kill (exit {proc.returncode}): the run is too short"
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = read_table(str(tmp_path / "out.db"), "counts")
    assert {(u, s): n for u, s, n in rows} == dict(expected)          # every window once, exact
    assert len(rows) == len(expected)
