"""RedisStreamSpout (consumer group, XACK on ack, replay of pending entries) and
RedisStreamSink, against a real redis-server started on a free port."""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable

import pytest
import redis

from redis_server import redis_url  # noqa: F401  (the fixture)
from topo.api import Bolt, Tuple
from topo.sinks import RedisStreamSink, read_table
from topo.sources.redis_streams import RedisStreamSpout
from topo.testing import SpoutHarness
from topo.topology import TopologyBuilder

ROOT = Path(__file__).resolve().parents[1]
WORDS = ["alpha", "beta", "gamma", "delta", "eps"]

pytestmark = pytest.mark.timeout(600)


def client(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, decode_responses=True)


def fill(url: str, stream: str, n: int, seed: int = 1) -> Counter[str]:
    """``n`` entries {"word": ...}; returns how many of each word."""
    rng = random.Random(seed)
    c = client(url)
    words = [rng.choice(WORDS) for _ in range(n)]
    pipe = c.pipeline(transaction=False)
    for w in words:
        pipe.xadd(stream, {"word": w})
    pipe.execute()
    return Counter(words)


def pending(url: str, stream: str, group: str) -> int:
    return client(url).xpending(stream, group)["pending"]


def _pending_or_0(url: str, stream: str, group: str) -> int:
    """``pending``, or 0 before a spout has made the group."""
    try:
        return pending(url, stream, group)
    except redis.ResponseError:
        return 0


class Seen(Bolt):
    """Keeps each entry id; fails every id ending in 7 the first time (the engine replays)."""

    ids: list[str] = []
    failed: set[str] = set()
    auto_ack = False

    def execute(self, tup: Tuple) -> None:
        if tup["id"].endswith("7") and tup["id"] not in Seen.failed:
            Seen.failed.add(tup["id"])
            self.collector.fail(tup)
            return
        Seen.ids.append(tup["id"])
        self.collector.ack(tup)


def test_every_entry_is_processed_and_acknowledged_once_acked(redis_url: str) -> None:
    from runtime.local.engine import run

    fill(redis_url, "s1", 600)
    b = TopologyBuilder("redis-group", {"acking": True})
    b.spout("entries", RedisStreamSpout(redis_url, stream="s1", group="g", fields=["word"], values="text",
                                        id_field="id"), parallelism=2)
    b.bolt("seen", Seen(), parallelism=2).shuffle("entries")
    Seen.ids, Seen.failed = [], set()
    deadline = time.monotonic() + 60
    run(b.build(), duration=2.0)
    while len(set(Seen.ids)) < 600 and time.monotonic() < deadline:     # slow machine: go on
        run(b.build(), duration=2.0)
    ids = [e[0] for e in client(redis_url).xrange("s1")]
    assert sorted(set(Seen.ids)) == sorted(ids)
    assert Seen.failed                                 # some were failed, and replayed
    assert pending(redis_url, "s1", "g") == 0          # every acked entry was XACKed
    consumers = {c["name"] for c in client(redis_url).xinfo_consumers("s1", "g")}
    assert consumers == {"redis-group-entries-0", "redis-group-entries-1"}


def test_pending_entries_of_the_same_consumer_are_replayed_at_start(redis_url: str) -> None:
    fill(redis_url, "s2", 10)
    c = client(redis_url)
    c.xgroup_create("s2", "g", id="0")
    c.xreadgroup("g", "test-spout-0", {"s2": ">"}, count=4)   # read before a crash, never acked
    h = SpoutHarness(RedisStreamSpout(redis_url, stream="s2", group="g", fields=["word"], values="text",
                                      id_field="id"), config={})
    assert pending(redis_url, "s2", "g") == 4
    got = [e.values[1] for e in h.pull(10)]
    assert got == [e[0] for e in c.xrange("s2")]         # the 4 pending first, then the rest, in order
    h.ack_all()
    h.spout.close()
    assert pending(redis_url, "s2", "g") == 0


def test_entries_a_gone_consumer_left_pending_are_claimed(redis_url: str) -> None:
    fill(redis_url, "s3", 6)
    c = client(redis_url)
    c.xgroup_create("s3", "g", id="0")
    c.xreadgroup("g", "gone", {"s3": ">"}, count=6)
    spout = RedisStreamSpout(redis_url, stream="s3", group="g", fields=["word"], values="text", id_field="id",
                             claim_idle_ms=0, claim_interval_s=0.0)
    h = SpoutHarness(spout, config={})
    got = [e.values[1] for e in h.pull(6)]
    assert sorted(got) == sorted(e[0] for e in c.xrange("s3"))
    h.ack_all()
    spout.close()
    assert pending(redis_url, "s3", "g") == 0


def test_a_value_that_is_not_json_is_one_line_naming_stream_entry_and_field(redis_url: str) -> None:
    c = client(redis_url)
    entry = c.xadd("s4", {"word": "not json"})
    h = SpoutHarness(RedisStreamSpout(redis_url, stream="s4", group="g", fields=["word"]), config={})
    with pytest.raises(ValueError) as e:
        h.pull(1)
    msg = str(e.value)
    assert "\n" not in msg and "'s4'" in msg and entry in msg and "'word'" in msg


def test_an_unreachable_server_is_one_line_without_the_password() -> None:
    from redis_server import free_port

    spout = RedisStreamSpout(f"redis://:sekret@127.0.0.1:{free_port()}/0", stream="x", group="g", fields=["a"])
    with pytest.raises(ConnectionError) as e:
        SpoutHarness(spout, config={}).pull(1)
    assert "sekret" not in str(e.value) and "host 127.0.0.1" in str(e.value) and "\n" not in str(e.value)


def test_bad_options_are_refused_naming_them() -> None:
    with pytest.raises(ValueError, match="values"):
        RedisStreamSpout(stream="s", group="g", fields=["a"], values="xml")
    with pytest.raises(ValueError, match="count"):
        RedisStreamSpout(stream="s", group="g", fields=["a"], count=0)
    with pytest.raises(ValueError, match="id_field"):
        RedisStreamSpout(stream="s", group="g", fields=["a"], id_field="a")


# -- the sink, and a round trip ------------------------------------------------------------------

class Rows(Bolt):
    rows: list[list[Any]] = []

    def execute(self, tup: Tuple) -> None:
        Rows.rows.append(list(tup.values))


def test_the_sink_adds_each_tuple_and_the_spout_reads_the_same_values_back(redis_url: str,
                                                                           tmp_path: Path) -> None:
    from runtime.local.engine import run
    from topo.sources.files import JsonLinesSpout

    data = tmp_path / "records.jsonl"
    records = [{"n": i, "name": f"x{i}", "tags": [i, "t"]} for i in range(250)]
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    b = TopologyBuilder("redis-sink")
    b.spout("file", JsonLinesSpout(str(data), fields=["n", "name", "tags"], end_stream=None))
    b.bolt("sink", RedisStreamSink(redis_url, "out", ["n", "name", "tags"], flush_rows=100)).shuffle("file")
    run(b.build())
    entries = client(redis_url).xrange("out")
    assert [json.loads(e[1]["n"]) for e in entries] == list(range(250))     # one entry per tuple, in order
    b = TopologyBuilder("redis-back", {"acking": True})
    b.spout("back", RedisStreamSpout(redis_url, stream="out", group="g", fields=["n", "name", "tags"]))
    b.bolt("rows", Rows()).shuffle("back")
    Rows.rows = []
    run(b.build(), duration=1.5)
    assert Rows.rows == [[r["n"], r["name"], r["tags"]] for r in records]


# -- kill -9 mid-run, then restart: nothing lost (with and without checkpoints) -----------------

TOPOLOGY = """
name: redis-count
config:
  acking: true
  max_spout_pending: 500
spouts:
  - id: words
    class: topo.sources.redis_streams.RedisStreamSpout
    kwargs: {{url: "{url}", stream: words, group: counters, fields: [word], values: text,
             id_field: id, count: 50}}
bolts:
  - id: paced
    class: redis_paced.Paced
  - id: count
    class: topo.examples.wordcount.CountBolt
  - id: sink
    class: topo.sinks.SQLiteSink
    kwargs: {{path: counts.db, table: word_counts, fields: [word, count], key_fields: [word]}}
  - id: ids
    class: topo.sinks.SQLiteSink
    kwargs: {{path: counts.db, table: seen, fields: [id, word], key_fields: [id]}}
streams:
  - {{from: words, to: paced, grouping: {{type: shuffle}}}}
  - {{from: paced, to: count, grouping: {{type: fields, fields: [word]}}}}
  - {{from: count, to: sink, grouping: {{type: fields, fields: [word]}}}}
  - {{from: paced, to: ids, grouping: {{type: shuffle}}}}
"""

PACED = '''
import time
from topo.api import Bolt


class Paced(Bolt):
    """Passes tuples on at about 2 000 a second (all 20,000: about 11 s), so a run lasts
    longer than the three killed runs together."""
    outputs = ["word", "id"]

    def execute(self, tup):
        time.sleep(0.0005)
        self.collector.emit([tup["word"], tup["id"]])
'''


def _run(tmp_path: Path, args: list[str], kill_after: float | None,
         started: Callable[[], bool] | None = None) -> None:
    """A run to its end (``kill_after`` None), or killed with SIGKILL ``kill_after`` seconds
    after its start, or after ``started()`` is true when given; a killed run must still be
    running when it is killed."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(tmp_path)]))
    cmd = [sys.executable, "-m", "topo.cli", "run", "topology.yaml", "--quiet", *args]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    if kill_after is None:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err.decode()[-2000:]
        return
    if started is not None:
        deadline = time.monotonic() + 120
        while not started() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert started(), "the run did not get under way within 120 s"
    time.sleep(kill_after)
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    assert proc.returncode == -signal.SIGKILL, \
        f"the run ended before its kill (exit {proc.returncode}): it is too short; {proc.stderr.read().decode()[-2000:]}"
    proc.stderr.close()


@pytest.mark.parametrize("checkpoints", [False, True], ids=["acks", "checkpoints"])
def test_killed_mid_run_then_restarted_every_entry_is_processed(redis_url: str, tmp_path: Path,
                                                                checkpoints: bool) -> None:
    c = client(redis_url)
    c.delete("words")
    expected = fill(redis_url, "words", 20_000, seed=5)
    (tmp_path / "topology.yaml").write_text(TOPOLOGY.format(url=redis_url))
    (tmp_path / "redis_paced.py").write_text(PACED)
    args = ["--config", "checkpoint.interval_ms=300"] if checkpoints else []
    rng = random.Random(2)
    was_pending = []
    for i in range(3):                      # the first once it has read entries, however slow to start
        started = (lambda: _pending_or_0(redis_url, "words", "counters") > 0) if i == 0 else None
        _run(tmp_path, args, kill_after=rng.uniform(0.0, 1.0) if i == 0 else rng.uniform(1.0, 2.0),
             started=started)
        was_pending.append(pending(redis_url, "words", "counters"))
    for _ in range(20):                     # then runs that stop by themselves, until all is read
        _run(tmp_path, [*args, "--duration", "2"], kill_after=None)
        info = c.xinfo_groups("words")[0]
        if info["lag"] == 0 and info["pending"] == 0:
            break
    ids = {e[0] for e in c.xrange("words")}
    seen = {i for i, _ in read_table(str(tmp_path / "counts.db"), "seen")}
    assert seen == ids                                     # every entry processed, none lost
    assert pending(redis_url, "words", "counters") == 0    # and acknowledged
    assert any(was_pending)                                # a kill left entries pending: they were replayed
    if checkpoints:                                        # counts exact: no entry counted twice
        assert dict(read_table(str(tmp_path / "counts.db"), "word_counts")) == dict(expected)


def test_with_acking_off_an_entry_is_acknowledged_once_emitted(redis_url: str) -> None:
    from runtime.local.engine import run

    fill(redis_url, "s5", 300)
    b = TopologyBuilder("redis-no-acking", {"acking": False})
    b.spout("entries", RedisStreamSpout(redis_url, stream="s5", group="g", fields=["word"], values="text"))
    b.bolt("rows", Rows()).shuffle("entries")
    Rows.rows = []
    run(b.build(), duration=1.0)
    assert len(Rows.rows) == 300 and pending(redis_url, "s5", "g") == 0
