"""JSON lines, CSV and stdout sinks: batching, field checks at validation, YAML, and
(file sinks) exact output after kill -9 with checkpoints."""
from __future__ import annotations

import csv
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from topo.api import Bolt, Spout, Tuple
from topo.sinks import CsvSink, JsonLinesSink, StdoutSink
from topo.sources.files import JsonLinesSpout
from topo.spec import loads
from topo.testing import BoltHarness
from topo.topology import TopologyBuilder, TopologyError

ROOT = Path(__file__).resolve().parents[1]
FIELDS = ["user", "n", "note"]

pytestmark = pytest.mark.timeout(600)


def rows(n: int) -> list[list[Any]]:
    return [[f"u{i % 7}", i, 'say "hi", ok' if i % 5 == 0 else None] for i in range(n)]


def test_a_file_sink_writes_in_batches_and_acks_after_the_write(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    h = BoltHarness(JsonLinesSink(str(out), FIELDS, flush_rows=10), input_fields=FIELDS)
    for r in rows(9):
        h.feed(r)
    assert out.read_text() == "" and h.acked == []           # nothing written, nothing acked yet
    h.feed(rows(10)[9])
    assert len(out.read_text().splitlines()) == 10 and len(h.acked) == 10
    for r in rows(13)[10:]:
        h.feed(r)
    h.close()                                                 # the end flushes the rest
    assert [json.loads(x) for x in out.read_text().splitlines()] == [dict(zip(FIELDS, r)) for r in rows(13)]
    assert len(h.acked) == 13


def test_the_csv_sink_writes_a_header_once_and_quotes(tmp_path: Path) -> None:
    out = tmp_path / "out.csv"
    h = BoltHarness(CsvSink(str(out), FIELDS, flush_rows=4), input_fields=FIELDS)
    for r in rows(10):
        h.feed(r)
    h.close()
    h = BoltHarness(CsvSink(str(out), FIELDS), input_fields=FIELDS)     # appends, no second header
    h.feed(["z", 99, None])
    h.close()
    with out.open(newline="") as f:
        got = list(csv.reader(f))
    assert got[0] == FIELDS and len(got) == 12
    assert got[1:] == [[r[0], str(r[1]), r[2] or ""] for r in rows(10)] + [["z", "99", ""]]


def test_the_stdout_sink_prints_one_json_object_per_tuple(capsys: pytest.CaptureFixture[str]) -> None:
    h = BoltHarness(StdoutSink(["user", "n"], flush_rows=3), input_fields=["user", "n"])
    for r in rows(2):
        h.feed(r[:2])
    assert capsys.readouterr().out == ""
    h.feed(["u9", 9])
    assert capsys.readouterr().out == '{"user": "u0", "n": 0}\n{"user": "u1", "n": 1}\n{"user": "u9", "n": 9}\n'
    h.feed(["u5", 5])
    assert capsys.readouterr().out == "" and len(h.acked) == 3
    h.bolt.checkpoint_complete(1)                         # a durable checkpoint flushes the rest
    assert capsys.readouterr().out == '{"user": "u5", "n": 5}\n' and len(h.acked) == 4


class Source(Spout):
    outputs = ["user", "n"]

    def next_tuple(self) -> None:
        pass


@pytest.mark.parametrize("sink", [
    lambda p: JsonLinesSink(p, ["user", "missing"]),
    lambda p: CsvSink(p, ["user", "missing"]),
    lambda p: StdoutSink(["user", "missing"]),
], ids=["jsonl", "csv", "stdout"])
def test_a_field_the_input_does_not_declare_is_refused_at_validation(tmp_path: Path, sink: Any) -> None:
    b = TopologyBuilder("bad-sink")
    b.spout("src", Source())
    b.bolt("out", sink(str(tmp_path / "x"))).shuffle("src")
    with pytest.raises(TopologyError) as e:
        b.build()
    assert "bolt 'out'" in str(e.value) and "['missing']" in str(e.value) and "\n" not in str(e.value)


def test_bad_options_are_one_line_naming_the_option(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="flush_rows"):
        JsonLinesSink(str(tmp_path / "x"), ["a"], flush_rows=0)
    with pytest.raises(ValueError, match="fields"):
        CsvSink(str(tmp_path / "x"), "a")
    with pytest.raises(ValueError, match="delimiter"):
        CsvSink(str(tmp_path / "x"), ["a"], delimiter=";;")
    with pytest.raises(ValueError, match="stream"):
        StdoutSink(["a"], stream="file")


def test_two_tasks_need_a_task_placeholder_in_the_path(tmp_path: Path) -> None:
    from runtime.local.engine import run

    data = tmp_path / "in.jsonl"
    data.write_text("".join(json.dumps({"user": f"u{i}", "n": i}) + "\n" for i in range(100)))
    b = TopologyBuilder("two-files")
    b.spout("file", JsonLinesSpout(str(data), fields=["user", "n"], end_stream=None))
    b.bolt("out", JsonLinesSink(str(tmp_path / "out-{task}.jsonl"), ["user", "n"]), parallelism=2).shuffle("file")
    run(b.build())
    lines = [json.loads(x) for p in sorted(tmp_path.glob("out-*.jsonl")) for x in p.read_text().splitlines()]
    assert sorted(r["n"] for r in lines) == list(range(100)) and len(list(tmp_path.glob("out-*.jsonl"))) == 2
    b = TopologyBuilder("one-file")
    b.spout("file", JsonLinesSpout(str(data), fields=["user", "n"], end_stream=None))
    b.bolt("out", JsonLinesSink(str(tmp_path / "one.jsonl"), ["user", "n"]), parallelism=2).shuffle("file")
    with pytest.raises(Exception, match=r"\{task\}"):
        run(b.build())


YAML = """
name: sinks-yaml
spouts:
  - id: file
    class: topo.sources.files.JsonLinesSpout
    kwargs: {path: in.jsonl, fields: [user, n], end_stream: null}
bolts:
  - id: jsonl
    class: topo.sinks.JsonLinesSink
    kwargs: {path: out.jsonl, fields: [user, n]}
  - id: csv
    class: topo.sinks.CsvSink
    kwargs: {path: out.csv, fields: [n, user]}
streams:
  - {from: file, to: jsonl, grouping: {type: shuffle}}
  - {from: file, to: csv, grouping: {type: shuffle}}
"""


def test_the_sinks_from_yaml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import topo

    monkeypatch.chdir(tmp_path)
    (tmp_path / "in.jsonl").write_text("".join(json.dumps({"user": f"u{i}", "n": i}) + "\n" for i in range(50)))
    topo.run(loads(YAML).topology, handle_signals=False)
    assert [json.loads(x)["n"] for x in (tmp_path / "out.jsonl").read_text().splitlines()] == list(range(50))
    assert (tmp_path / "out.csv").read_text().splitlines()[:2] == ["n,user", "0,u0"]
    bad = YAML.replace("fields: [n, user]", "fields: [n, nope]")
    with pytest.raises(Exception) as e:
        loads(bad)
    assert "csv" in str(e.value) and "nope" in str(e.value)


# -- with checkpoints: kill -9 at random points, then the file is exactly the input -------------

KILL_YAML = """
name: file-sinks-kill
config:
  acking: true
  checkpoint.interval_ms: 200
spouts:
  - id: file
    class: topo.sources.files.JsonLinesSpout
    kwargs: {path: in.jsonl, fields: [user, n], end_stream: null, batch: 64}
bolts:
  - id: slow
    class: checkpoint_sinks.Paced
  - id: jsonl
    class: topo.sinks.JsonLinesSink
    kwargs: {path: out.jsonl, fields: [user, n], flush_rows: 50}
  - id: csv
    class: topo.sinks.CsvSink
    kwargs: {path: out.csv, fields: [user, n], flush_rows: 50}
streams:
  - {from: file, to: slow, grouping: {type: shuffle}}
  - {from: slow, to: jsonl, grouping: {type: shuffle}}
  - {from: slow, to: csv, grouping: {type: shuffle}}
"""

PACED = '''
import time
from topo.api import Bolt


class Paced(Bolt):
    """Passes tuples on at about 4 000 a second (a whole run: about 15 s), so a run lasts
    longer than the three killed runs together."""
    outputs = ["user", "n"]

    def execute(self, tup):
        time.sleep(0.0002)
        self.collector.emit([tup["user"], tup["n"]])
'''


def test_file_sinks_with_checkpoints_hold_exactly_the_input_after_kill9s(tmp_path: Path) -> None:
    n = 60_000
    (tmp_path / "in.jsonl").write_text("".join(json.dumps({"user": f"u{i % 9}", "n": i}) + "\n" for i in range(n)))
    (tmp_path / "topology.yaml").write_text(KILL_YAML)
    (tmp_path / "checkpoint_sinks.py").write_text(PACED)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(tmp_path)]))
    cmd = [sys.executable, "-m", "topo.cli", "run", "topology.yaml", "--quiet"]
    rng = random.Random(4)
    sizes = []
    out = tmp_path / "out.jsonl"
    for i in range(3):
        proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if i == 0:              # the first kill after some output, however slow the machine is to start
            deadline = time.monotonic() + 120
            while not (out.exists() and out.stat().st_size) and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.02)
            assert out.exists() and out.stat().st_size, "the first run wrote nothing within 120 s"
            time.sleep(rng.uniform(0, 1.5))
        else:
            time.sleep(rng.uniform(1.5, 3.0))
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        assert proc.returncode == -signal.SIGKILL, \
            f"killed run {i + 1} had ended before its kill (exit {proc.returncode}): the run is too short"
        sizes.append(out.stat().st_size if out.exists() else 0)
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    final = (tmp_path / "out.jsonl").stat().st_size
    assert any(0 < size < final for size in sizes), sizes              # a kill landed mid-run
    got = [json.loads(x)["n"] for x in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert sorted(got) == list(range(n))                  # each line exactly once: none lost, none twice
    with (tmp_path / "out.csv").open(newline="") as f:
        table = list(csv.reader(f))
    assert table[0] == ["user", "n"] and sorted(int(r[1]) for r in table[1:]) == list(range(n))
