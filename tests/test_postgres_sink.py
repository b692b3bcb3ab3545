"""PostgresSink against a real PostgreSQL server (the ``postgres_url`` fixture): upserts,
acks after the commit, each checkpoint's rows in one transaction with a marker row, an
exact table after kill -9s of real ``topo run`` processes, and a DSN that is never
printed."""
from __future__ import annotations

import subprocess
import uuid
from pathlib import Path

import pytest

from test_checkpoints import TOPO, _env, _kill_and_restart, _never_backwards
from topo.examples.wordcount import expected_counts
from topo.sinks import PostgresSink
from topo.testing import BoltHarness

psycopg = pytest.importorskip("psycopg")

pytestmark = pytest.mark.timeout(600)

WORDCOUNT = """
name: wordcount
config:
  acking: true
  max_spout_pending: 5000
spouts:
  - {{id: sentences, class: topo.examples.wordcount.SentenceSpout, kwargs: {{repeat: {repeat}}}}}
bolts:
  - {{id: split, class: topo.examples.wordcount.SplitBolt, parallelism: 2}}
  - {{id: count, class: topo.examples.wordcount.CountBolt, parallelism: 2}}
  - id: sink
    class: topo.sinks.PostgresSink
    kwargs: {{dsn: "env:TOPO_TEST_PG_DSN", table: word_counts, fields: [word, count], key_fields: [word]}}
    parallelism: {sinks}
streams:
  - {{from: sentences, to: split, grouping: {{type: shuffle}}}}
  - {{from: split, to: count, grouping: {{type: fields, fields: [word]}}}}
  - {{from: count, to: sink, grouping: {{type: fields, fields: [word]}}}}
"""


@pytest.fixture
def pg_dsn(postgres_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh database on the session's server; its DSN is also in TOPO_TEST_PG_DSN."""
    name = "t_" + uuid.uuid4().hex[:12]
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    dsn = postgres_url.rsplit("/", 1)[0] + "/" + name
    monkeypatch.setenv("TOPO_TEST_PG_DSN", dsn)
    return dsn


def _query(dsn: str, sql: str) -> list[tuple]:
    with psycopg.connect(dsn, connect_timeout=10) as conn:
        return list(conn.execute(sql))


def _counts(dsn: str) -> dict[str, int]:
    exists = _query(dsn, "SELECT to_regclass('word_counts')")[0][0] is not None
    return dict(_query(dsn, "SELECT word, count FROM word_counts")) if exists else {}


def _markers(dsn: str) -> list[tuple[str, int]]:
    return _query(dsn, "SELECT sink, checkpoint FROM _topo_commits ORDER BY checkpoint")


def _run(tmp_path: Path, *args: str) -> None:
    proc = subprocess.run(TOPO + ["run", *args, "--quiet"], cwd=tmp_path, env=_env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_a_run_with_checkpoints_writes_the_exact_table(tmp_path: Path, pg_dsn: str) -> None:
    (tmp_path / "wc.yaml").write_text(WORDCOUNT.format(repeat=500, sinks=2))
    _run(tmp_path, "wc.yaml", "--config", "checkpoint.interval_ms=100")
    assert _counts(pg_dsn) == dict(expected_counts(repeat=500))
    types = dict(_query(pg_dsn, "SELECT column_name, data_type FROM information_schema.columns "
                                "WHERE table_name = 'word_counts'"))
    assert types == {"word": "text", "count": "bigint"}       # typed from the first row
    sinks = {s for s, _ in _markers(pg_dsn)}    # two sink tasks on one table: each its own markers
    assert sinks == {"wordcount/sink/0/word_counts", "wordcount/sink/1/word_counts"}


def _paced(spec: str) -> str:
    """``spec`` with a pacing stage ahead of the sink (5 ms every 16 words: ~20 s for
    repeat=2000 instead of ~1 s, so every killed run dies mid-run) and 1,000 sentences in
    flight (the paced backlog stays well under the message timeout)."""
    paced = (spec.replace("max_spout_pending: 5000", "max_spout_pending: 1000")
             .replace("  - id: sink\n", "  - {id: paced, class: checkpoint_components.SlowPass, "
                      "kwargs: {delay_s: 0.005, every: 16}}\n  - id: sink\n")
             .replace("{from: count, to: sink,", "{from: count, to: paced,"))
    paced += "  - {from: paced, to: sink, grouping: {type: fields, fields: [word]}}\n"
    assert paced.count("paced") == 3 and "max_spout_pending: 1000" in paced
    return paced


def test_four_kill9s_in_a_row_then_the_table_is_exact(tmp_path: Path, pg_dsn: str) -> None:
    (tmp_path / "wc.yaml").write_text(_paced(WORDCOUNT.format(repeat=2000, sinks=1)))
    args = ["wc.yaml", "--config", "checkpoint.interval_ms=100"]
    tables = _kill_and_restart(tmp_path, args, kills=4, seed=7, window=(0.8, 1.8),
                               read=lambda _: _counts(pg_dsn))
    _never_backwards(tables)
    assert _counts(pg_dsn) == dict(expected_counts(repeat=2000))
    assert any(tables), "no kill landed after a checkpoint: the test did not exercise a restart"


def _sink(dsn: str, checkpoints: bool = True) -> BoltHarness:
    config = {"checkpoint.interval_ms": 100} if checkpoints else {}
    return BoltHarness(PostgresSink(dsn, "totals", ["k", "n"], ["k"]), ["k", "n"], config=config,
                       component="sink")


def test_a_replayed_checkpoint_is_not_written_twice(pg_dsn: str) -> None:
    first = _sink(pg_dsn)
    first.feed(["a", 1])
    first.feed(["b", 1])
    state1 = first.bolt.snapshot_state()          # checkpoint 1 seals a=1, b=1
    state1 = {"sealed": [list(map(list, rows)) for rows in state1["sealed"]]}
    first.bolt.checkpoint_complete(1)
    first.feed(["a", 2])
    first.bolt.snapshot_state()
    first.bolt.checkpoint_complete(2)             # checkpoint 2: a=2
    first.feed(["b", 9])                               # after the last checkpoint: never written
    first.close()
    assert dict(_query(pg_dsn, "SELECT k, n FROM totals")) == {"a": 2, "b": 1}

    # A crash after checkpoint 1's commit but before the checkpoint store knew it was
    # complete: the restart restores checkpoint 1's state and completes it again.
    again = _sink(pg_dsn)
    again.bolt.restore_state(state1)
    again.bolt.checkpoint_complete(1)             # its marker is there: nothing written
    again.close()
    assert dict(_query(pg_dsn, "SELECT k, n FROM totals")) == {"a": 2, "b": 1}   # a not set back to 1
    assert [c for _, c in _markers(pg_dsn)] == [1, 2]


def test_without_checkpoints_rows_are_acked_after_their_commit(pg_dsn: str) -> None:
    h = _sink(pg_dsn, checkpoints=False)
    h.bolt.flush_rows = 2
    h.feed(["a", 1])
    assert not h.acked                                  # buffered, not committed
    h.feed(["a", 3])                                    # flush: one transaction, then both acked
    assert len(h.acked) == 2
    assert dict(_query(pg_dsn, "SELECT k, n FROM totals")) == {"a": 3}
    h.feed(["b", 1])
    h.close()                                           # cleanup flushes the rest
    assert dict(_query(pg_dsn, "SELECT k, n FROM totals")) == {"a": 3, "b": 1}


def test_a_failed_connection_is_one_line_without_the_password(monkeypatch: pytest.MonkeyPatch) -> None:
    dsn = "postgresql://alice:s3cr3t-pw@127.0.0.1:1/orders"
    with pytest.raises(ConnectionError) as err:
        _sink(dsn)
    msg = str(err.value)
    assert "\n" not in msg and "s3cr3t-pw" not in msg
    assert "host 127.0.0.1 port 1 database orders user alice" in msg
    assert "s3cr3t-pw" not in repr(PostgresSink(dsn, "t", ["k"], ["k"]))

    monkeypatch.setenv("ORDERS_DSN", "host=127.0.0.1 port=1 dbname=orders user=bob password=hunter2")
    with pytest.raises(ConnectionError, match="database orders user bob") as err:
        _sink("env:ORDERS_DSN")
    assert "hunter2" not in str(err.value)
    with pytest.raises(ValueError, match="environment variable NOT_SET_DSN is not set"):
        _sink("env:NOT_SET_DSN")
    with pytest.raises(ConnectionError) as err:                 # a DSN that does not parse
        _sink("host=x password='hunter2")
    assert "hunter2" not in str(err.value)


def test_a_failed_connection_in_topo_run_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOPO_TEST_PG_DSN", "postgresql://alice:s3cr3t-pw@127.0.0.1:1/orders")
    (tmp_path / "wc.yaml").write_text(WORDCOUNT.format(repeat=1, sinks=1))
    proc = subprocess.run(TOPO + ["run", "wc.yaml", "--quiet"], cwd=tmp_path, env=_env(),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert "s3cr3t-pw" not in proc.stderr + proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot connect to host 127.0.0.1 port 1 database orders" in lines[0], proc.stderr
