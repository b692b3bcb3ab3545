"""Spark engine pieces that need no Spark session: scheduling-delay derivation, the
feedback loop on fake progress, admission arithmetic, the reader's offsets and
partitions, topology mapping checks, and the idempotent result store."""
from __future__ import annotations

import functools
import json
import time
from pathlib import Path

import msgpack
import pytest

from backpressure.policy.rate_control import AdaptiveRateController, DStreamPIDController
from runtime.spark.datasource import (OffsetStreamReader, admit, clear_stop, read_rate, read_start,
                                      source_options, write_rate, write_start, write_stop)
from runtime.spark.listener import (RateFeedback, SourceControl, next_boundary, parse_timestamp,
                                    scheduling_delay, submission_time)
from runtime.spark.plan import chains, check, stage_plans, terminal_streams
from runtime.spark.result_store import open_sink, read_rows, table_name
from topo.api import Bolt, Spout
from topo.sources import FileLog, MessageLogSpout, SyntheticSource, Constant
from topo.state import KeyedBolt
from topo.topology import TopologyBuilder, TopologyError


# -- scheduling delay from trigger times ----------------------------------------------------------

def test_next_boundary_is_strictly_after():
    assert next_boundary(10.0, 1.0) == 11.0
    assert next_boundary(10.3, 1.0) == 11.0
    assert next_boundary(10.999, 0.5) == 11.0


def test_on_time_trigger_has_only_jitter():
    assert scheduling_delay(12.004, 1.0, prev_start=11.0, prev_end=11.4) == pytest.approx(0.004)


def test_late_trigger_waits_for_the_overrunning_batch():
    # previous started at 11.0, ran until 12.3; the trigger due at 12.0 fires at 12.31
    assert submission_time(12.31, 1.0, prev_start=11.0, prev_end=12.3) == 12.0
    assert scheduling_delay(12.31, 1.0, prev_start=11.0, prev_end=12.3) == pytest.approx(0.31)
    # a batch 2.3 s long: Spark's next trigger was due 1.3 s before it could start
    assert scheduling_delay(13.3, 1.0, prev_start=11.0, prev_end=13.3) == pytest.approx(1.3)


def test_no_data_trigger_in_between_is_not_late():
    # previous overran to 12.3, the trigger at 12.3 found nothing, data at 13.0
    assert scheduling_delay(13.0, 1.0, prev_start=11.0, prev_end=12.3) == pytest.approx(0.0)
    # a long idle gap
    assert scheduling_delay(20.002, 1.0, prev_start=11.0, prev_end=11.5) == pytest.approx(0.002)


def test_first_batch_fires_when_the_query_has_initialised():
    assert scheduling_delay(101.5, 1.0, origin=100.8) == 0.0
    assert scheduling_delay(100.81, 1.0) == pytest.approx(0.81)
    # the first data batch after an empty start fires at a boundary like any other
    assert scheduling_delay(105.003, 1.0, origin=100.8) == pytest.approx(0.003)


def test_parse_timestamp():
    assert parse_timestamp("1970-01-01T00:00:01.250Z") == pytest.approx(1.25)


# -- the feedback loop on fake progress -------------------------------------------------------------

def progress(batch_id: int, start: float, duration_ms: int, rows: int, end_offset: dict | None = None,
             start_offset: dict | None = None) -> dict:
    """A ``StreamingQueryProgress`` as a dict, one source; with offsets, ``rows`` is what
    Spark counted coming out of the source (a chained reader's: its last bolt's rows)."""
    ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(start)) + f".{int(round((start % 1) * 1000)):03d}Z"
    return {"batchId": batch_id, "timestamp": ts, "numInputRows": rows,
            "durationMs": {"triggerExecution": duration_ms},
            "sources": [{"description": "x", "numInputRows": rows,
                         "startOffset": json.dumps(start_offset) if start_offset else None,
                         "endOffset": json.dumps(end_offset) if end_offset else None}]}


def test_feedback_publishes_and_feeds_the_controller(tmp_path):
    c = AdaptiveRateController(1.0, 2, headroom=0.0, initial_rate_per_partition=500, min_rate=10)
    fb = RateFeedback(1.0, {"s": SourceControl("s", c, bound={0: 1500, 1: 1500})}, str(tmp_path))
    assert fb.submit(1000.0) == {"s": 1000}
    assert read_rate(str(tmp_path), "s") == (True, 1000.0)
    write_start(str(tmp_path), "s", 1000.002, 1000, 1000.0)
    rec = fb.on_progress(progress(0, 1000.0, 500, 1000, {"0": 500, "1": 500}))
    assert rec.scheduling_delay == pytest.approx(0.0) and rec.cap_by_source == {"s": 1000}
    assert rec.duration_ms == {"triggerExecution": 500.0}
    assert fb.input_rows == 1000 and not fb.exhausted()
    # case 1 PID: processing rate 2000 -> cap 2000
    assert fb.submit(1001.0)["s"] == pytest.approx(2000)
    # next batch starts at 1001 and is still running at the next submission: case 3
    write_start(str(tmp_path), "s", 1001.003, 2000, 2000.0)
    fb.submit(1002.0)
    assert c.last_case == 3
    fb.on_progress(progress(1, 1001.0, 1500, 2000, {"0": 1500, "1": 1500}, {"0": 500, "1": 500}))
    assert fb.exhausted()
    assert [b.batch_id for b in fb.batches] == [0, 1]


def test_a_stopped_querys_last_batch_is_waited_for_until_its_progress_arrives(tmp_path):
    import threading

    fb = RateFeedback(1.0, {"s": SourceControl("s", DStreamPIDController(1.0, 1))}, str(tmp_path))
    assert not fb.wait_for_batch(0, timeout=0.05)                   # nothing yet: gives up at the timeout
    fb.on_progress(progress(0, 5.0, 100, 10))
    assert fb.wait_for_batch(0, timeout=0.0)                        # already here
    late = threading.Timer(0.1, fb.on_progress, (progress(1, 6.0, 100, 10),))   # the listener's thread
    late.start()
    assert fb.wait_for_batch(1, timeout=5.0)
    late.join()
    assert [b.batch_id for b in fb.batches] == [0, 1]


def test_feedback_ignores_empty_progress_and_stale_starts(tmp_path):
    c = DStreamPIDController(1.0, 1)
    fb = RateFeedback(1.0, {"s": SourceControl("s", c)}, str(tmp_path))
    assert fb.on_progress(progress(0, 5.0, 100, 0)) is None
    write_start(str(tmp_path), "s", 4.0, 10, None)
    fb.last_end = 4.5
    fb.submit(6.0)
    assert fb.sources["s"].last_start_report == 0.0
    assert not fb.exhausted()


def test_a_batch_is_counted_by_the_offsets_it_read_not_the_rows_its_source_put_out(tmp_path):
    """A reader running chained bolts puts out their rows (none for a leaf), which Spark
    reports as ``numInputRows``: the feedback counts what the batch read, from offsets."""
    c = DStreamPIDController(1.0, 2)
    fb = RateFeedback(1.0, {"s": SourceControl("s", c, bound={0: 300, 1: 300})}, str(tmp_path))
    rec = fb.on_progress(progress(0, 5.0, 200, 0, {"0": 100, "1": 50}))               # a leaf: nothing out
    assert rec is not None and rec.rows == 150 and rec.rows_by_source == {"s": 150}
    rec = fb.on_progress(progress(1, 6.0, 200, 1200, {"0": 300, "1": 300}, {"0": 100, "1": 50}))   # 8 words each
    assert rec.rows == 450 and fb.input_rows == 600 and fb.exhausted()
    assert fb.on_progress(progress(2, 7.0, 5, 0, {"0": 300, "1": 300}, {"0": 300, "1": 300})) is None


def test_progress_rows_fall_back_to_sparks_count_for_other_sources():
    from runtime.observe.spark_progress import progress_rows, source_rows

    assert source_rows({"numInputRows": 7, "startOffset": "41", "endOffset": "48"}) == 7        # Spark's rate source
    assert source_rows({"numInputRows": 3, "endOffset": json.dumps({"t": {"0": 3}})}) == 3     # Kafka's nesting
    assert source_rows({"numInputRows": 9, "startOffset": None, "endOffset": {"0": 4, "1": 2}}) == 6
    assert progress_rows({"numInputRows": 5, "sources": []}) == 5
    assert progress_rows({"numInputRows": 0, "sources": [
        {"numInputRows": 0, "startOffset": '{"0": 1}', "endOffset": '{"0": 3}'},
        {"numInputRows": 4, "startOffset": "1", "endOffset": "5"}]}) == 6


def test_state_files_roundtrip(tmp_path):
    write_rate(str(tmp_path), "a", None, 1.0)
    assert read_rate(str(tmp_path), "a") == (True, None)
    assert read_rate(str(tmp_path), "missing") == (False, None)
    assert read_start(str(tmp_path), "a") is None
    (tmp_path / "big.rate.json").write_text("x" * 70_000)
    with pytest.raises(ValueError):
        read_rate(str(tmp_path), "big")



def test_a_cap_read_after_its_boundary_is_cut_by_the_published_marginal_rate(tmp_path):
    write_rate(str(tmp_path), "s", 50_000.0, 10.0, marginal=100_000.0)
    assert read_rate(str(tmp_path), "s", now=10.2, interval=1.0) == (True, pytest.approx(30_000))
    assert read_rate(str(tmp_path), "s", now=9.98, interval=1.0) == (True, 50_000.0)    # before its boundary
    assert read_rate(str(tmp_path), "s") == (True, 50_000.0)                            # no time: no cut
    write_rate(str(tmp_path), "s", 50_000.0, 10.0)                                      # no marginal rate
    assert read_rate(str(tmp_path), "s", now=10.2, interval=1.0) == (True, 50_000.0)


def test_the_reader_keeps_the_share_of_the_cap_the_driver_published(tmp_path):
    # 0.4 s late at 100,000 rows/s takes 40,000 off a 50,000 cap: the default floor keeps half
    write_rate(str(tmp_path), "s", 50_000.0, 10.0, marginal=100_000.0)
    assert read_rate(str(tmp_path), "s", now=10.4, interval=1.0) == (True, pytest.approx(25_000))
    write_rate(str(tmp_path), "s", 50_000.0, 10.0, marginal=100_000.0, floor=0.8)
    assert read_rate(str(tmp_path), "s", now=10.4, interval=1.0) == (True, pytest.approx(40_000))
    write_rate(str(tmp_path), "s", 50_000.0, 10.0, marginal=100_000.0, floor=1.0)    # never cut
    assert read_rate(str(tmp_path), "s", now=10.4, interval=1.0) == (True, 50_000.0)


# -- admission control and the reader ---------------------------------------------------------------

def test_admit_caps_per_partition_and_respects_latest_and_bound():
    start = {0: 10, 1: 0, 2: 5}
    latest = {0: 100, 1: 3, 2: 5}
    assert admit(start, latest, None, 20, None) == {0: 30, 1: 3, 2: 5}
    assert admit(start, latest, None, None, None) == {0: 100, 1: 3, 2: 5}
    assert admit(start, latest, {0: 15, 1: 9, 2: 5}, 20, None) == {0: 15, 1: 3, 2: 5}
    assert admit(start, latest, None, 20, 25) == {0: 30, 1: 3, 2: 5}
    assert admit(start, latest, None, 20, 12) == {0: 22, 1: 10 - 10, 2: 5}


def make_reader(tmp_path, source, rate: float | None, interval=1.0, core_num=4, bound=None):
    state = tmp_path / "state"
    state.mkdir(exist_ok=True)
    write_rate(str(state), "spout", rate, 0.0)
    opts = source_options("spout", source, [0, 1], core_num=core_num, interval_s=interval,
                          state_dir=str(state), bound=bound, max_rows=None)
    return OffsetStreamReader(opts), state


def test_reader_admission_presharding_and_read(tmp_path):
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

    src = SyntheticSource(Constant(1000), partitions=2).started_at(time.time() - 100)   # 100k available
    reader, state = make_reader(tmp_path, src, rate=600.0)
    start = reader.initialOffset()
    assert start == {"0": 0, "1": 0}
    end = reader.latestOffset(start, reader.getDefaultReadLimit())
    assert end == {"0": 300, "1": 300}              # 600/s * 1 s / 2 partitions
    report = read_start(str(state), "spout")
    assert report["rows"] == 600 and report["rate"] == 600.0
    parts = reader.partitions(start, end)            # map_num = lcm(2,4)/2 = 2
    assert [(p.partition, p.start, p.end) for p in parts] == [(0, 0, 150), (0, 150, 300), (1, 0, 150), (1, 150, 300)]
    batches = list(reader.read(parts[1]))
    ids = [msgpack.unpackb(v)[0] for b in batches for v in b.column("v").to_pylist()]
    assert ids == [o * 2 for o in range(150, 300)]
    assert set(batches[0].column("src").to_pylist()) == {"spout"}
    # ReadAllAvailable (Trigger.AvailableNow) ignores the controller
    assert int(reader.latestOffset(end, ReadAllAvailable())["0"]) > 40_000
    assert reader.latestOffset(end, ReadMaxRows(10)) == {"0": 310, "1": 300}


class Tens(Bolt):
    """Emits ten times each input's id, and one row per input it has seen at cleanup."""

    outputs = ["y"]

    def prepare(self, context, collector):
        super().prepare(context, collector)
        self.seen = 0

    def execute(self, t):
        self.seen += 1
        self.collector.emit([t[0] * 10])

    def cleanup(self):
        self.collector.emit([-self.seen])


def test_a_reader_with_a_chain_puts_out_the_chained_bolts_rows(tmp_path):
    from runtime.spark.bolts import StagePlan
    from runtime.spark.datasource import encode_chain

    src = SyntheticSource(Constant(1000), partitions=2).started_at(time.time() - 100)
    reader, state = make_reader(tmp_path, src, rate=600.0)
    plans = [StagePlan(name, Tens, 2, "t", {}, "partition", {(up, "default"): fields}, {"default": ("y",)})
             for name, up, fields in (("tens", "spout", ("id", "x")), ("hundreds", "tens", ("y",)))]
    chained = OffsetStreamReader({**source_options("spout", src, [0, 1], core_num=4, interval_s=1.0,
                                                   state_dir=str(state), bound=None, max_rows=None),
                                  "chain": encode_chain(plans)})
    start = reader.initialOffset()
    part = reader.partitions(start, reader.latestOffset(start, reader.getDefaultReadLimit()))[1]
    plain = [msgpack.unpackb(v)[0] for b in reader.read(part) for v in b.column("v").to_pylist()]
    batches = list(chained.read(part))
    assert {s for b in batches for s in b.column("src").to_pylist()} == {"hundreds"}
    got = [msgpack.unpackb(v)[0] for b in batches for v in b.column("v").to_pylist()]
    assert got == [i * 100 for i in plain] + [-10 * len(plain), -(len(plain) + 1)]   # each cleanup's row too


def test_a_reader_whose_trigger_fires_late_admits_the_cut_cap(tmp_path):
    src = SyntheticSource(Constant(1000), partitions=2).started_at(time.time() - 100)   # 100k available
    reader, state = make_reader(tmp_path, src, rate=1000.0)
    # decided for a boundary 0.3 s ago with 2,000 rows/s of marginal rate: 600 rows come
    # off, past the floor of half the cap, so 500 are admitted (the lateness only grows)
    write_rate(str(state), "spout", 1000.0, time.time() - 0.3, marginal=2000.0)
    end = reader.latestOffset(reader.initialOffset(), reader.getDefaultReadLimit())
    assert end == {"0": 250, "1": 250}
    assert read_start(str(state), "spout")["rate"] == 500.0


def test_a_stopping_reader_admits_nothing_and_a_new_run_clears_the_marker(tmp_path):
    src = SyntheticSource(Constant(1000), partitions=2).started_at(time.time() - 100)   # 100k available
    reader, state = make_reader(tmp_path, src, rate=600.0)
    end = reader.latestOffset(reader.initialOffset(), reader.getDefaultReadLimit())
    assert end == {"0": 300, "1": 300}
    write_stop(str(state))
    assert reader.latestOffset(end, reader.getDefaultReadLimit()) == end     # no new data: no batch
    clear_stop(str(state))
    clear_stop(str(state))                                                   # (no marker: nothing to do)
    assert reader.latestOffset(end, reader.getDefaultReadLimit()) == {"0": 600, "1": 600}


class _Query:
    """A streaming query as ``QueryStop`` sees it: a trigger active for ``busy`` polls."""

    def __init__(self, busy: int) -> None:
        self.busy = busy
        self.polls = 0
        self.stopped_after = None
        self.isActive = True

    @property
    def status(self):
        self.polls += 1
        return {"isTriggerActive": self.polls <= self.busy}

    def stop(self):
        self.stopped_after = self.polls
        self.isActive = False


def test_a_query_stops_after_the_batch_in_flight_within_the_drain_timeout(tmp_path, caplog):
    from runtime.spark.engine import QueryStop

    state = tmp_path / "state"
    state.mkdir()
    seen = []
    q = _Query(busy=3)
    q.stop = lambda: (seen.append((q.polls, (state / "stopping").exists())), setattr(q, "isActive", False))
    QueryStop(str(state), drain_timeout_s=5.0, poll_s=0.0)(q)
    # stopped once a poll found no trigger active, with the readers told to admit nothing; marker gone after
    assert seen == [(4, True)]
    assert not (state / "stopping").exists()
    # a batch longer than the drain timeout: stopped in the middle of it, with a warning
    q = _Query(busy=10 ** 9)
    QueryStop(str(state), drain_timeout_s=0.05, poll_s=0.01)(q)
    assert not q.isActive and q.polls < 100
    assert "did not finish within drain_timeout_s" in caplog.text


def test_reader_uneven_presharding_and_bound(tmp_path):
    log = FileLog(tmp_path / "log", "t", partitions=3)
    for i in range(20):
        log.produce_to(i % 3, f"v{i}")
    reader, _ = make_reader(tmp_path, log, rate=None, core_num=2, bound={0: 7, 1: 5, 2: 6})
    reader.pick = [3]
    end = reader.latestOffset(reader.initialOffset(), reader.getDefaultReadLimit())
    assert end == {"0": 7, "1": 5, "2": 6}
    parts = reader.partitions(reader.initialOffset(), end)   # map_num = lcm(3,2)/3 = 2
    assert [(p.partition, p.end - p.start) for p in parts] == [(0, 4), (0, 3), (1, 3), (1, 2), (2, 3), (2, 3)]
    values = [msgpack.unpackb(v)[0] for p in parts for b in reader.read(p) for v in b.column("v").to_pylist()]
    bound = {0: 7, 1: 5, 2: 6}
    assert sorted(values) == sorted(f"v{i}" for i in range(20) if i // 3 < bound[i % 3])


# -- which topologies map ------------------------------------------------------------------------------

class Words(Bolt):
    outputs = ["word"]

    def execute(self, t):
        self.collector.emit([t[0]])


class Keyed(KeyedBolt):
    outputs = ["word", "n"]
    key_fields = ("word",)

    def process(self, t, state):
        state["n"] = state.get("n", 0) + 1


class PlainSpout(Spout):
    outputs = ["x"]

    def next_tuple(self):
        pass


def test_check_names_unmappable_components(tmp_path):
    b = TopologyBuilder("bad")
    b.spout("plain", PlainSpout())
    b.bolt("w", Words()).shuffle("plain")
    b.bolt("k", Keyed()).shuffle("w")
    problems = check(b.build())
    assert any("spout 'plain'" in p and "offset-addressable" in p for p in problems)
    assert any("bolt 'k'" in p and "KeyedBolt" in p for p in problems)
    with pytest.raises(TopologyError, match="cannot run on Spark"):
        stage_plans(b.build(), {})


def test_modes_and_terminal_streams(tmp_path):
    FileLog(tmp_path, "t", partitions=1)
    b = TopologyBuilder("ok")
    b.spout("s", MessageLogSpout(str(tmp_path), "t", columns=("value",)))
    b.bolt("w", Words()).shuffle("s")
    b.bolt("k", Keyed(), 2).fields("w", "word")
    b.bolt("g", Words()).global_("w")
    b.bolt("a", Words()).all("w")
    topo = b.build()
    assert check(topo) == []
    plans = stage_plans(topo, {})
    assert {c: p.mode for c, p in plans.items()} == {"w": "partition", "k": "keyed", "g": "task", "a": "task"}
    assert plans["k"].routes[("w", "default")].positions == (0,)
    assert terminal_streams(topo) == {"k": ["default"], "g": ["default"], "a": ["default"]}


def _chain_topology(tmp_path, *wire) -> object:
    FileLog(tmp_path, "t", partitions=1)
    b = TopologyBuilder("chain")
    b.spout("s", MessageLogSpout(str(tmp_path), "t", columns=("value",)))
    for step in wire:
        step(b)
    return b.build()


class TwoStreams(Bolt):
    outputs = {"default": ["word"], "errors": ["msg"]}

    def execute(self, t):
        self.collector.emit([t[0]])


@pytest.mark.parametrize("wire,expected", [
    # spout -> shuffle -> shuffle -> fields: the two shuffle-fed bolts run inside the reader
    ((lambda b: b.bolt("w", Words()).shuffle("s"), lambda b: b.bolt("w2", Words(), 3).local_or_shuffle("w"),
      lambda b: b.bolt("k", Keyed(), 2).fields("w2", "word")), {"s": ["w", "w2"]}),
    # a spout read by two bolts: each would need the source's rows
    ((lambda b: b.bolt("w", Words()).shuffle("s"), lambda b: b.bolt("w2", Words()).shuffle("s")), {}),
    # a fields grouping needs Spark's shuffle
    ((lambda b: b.bolt("f", Words(), 2).fields("s", "value"),), {}),
    ((lambda b: b.bolt("g", Words()).global_("s"),), {}),
    # a stream nobody reads must leave the reader: the chain stops before its reader
    ((lambda b: b.bolt("two", TwoStreams()).shuffle("s"), lambda b: b.bolt("w", Words()).shuffle("two")),
     {"s": ["two"]}),
    # a bolt that reads another component too
    ((lambda b: b.bolt("w", Words()).shuffle("s"), lambda b: b.bolt("m", Words()).shuffle("w").shuffle("s")),
     {}),
    # a leaf that emits nothing runs in the reader too
    ((lambda b: b.bolt("w", Words()).shuffle("s"), lambda b: b.bolt("leaf", Sink()).shuffle("w")),
     {"s": ["w", "leaf"]}),
])
def test_chains_take_a_spouts_only_reader_while_it_needs_no_shuffle(tmp_path, wire, expected):
    topo = _chain_topology(tmp_path, *wire)
    assert chains(topo, stage_plans(topo, {})) == expected


class Sink(Bolt):
    outputs: list[str] = []

    def execute(self, t):
        pass


# -- database sinks, idempotent by batch --------------------------------------------------------------------

STREAMS = {("count", "default"): ("word", "count"), ("count", "errors"): ("msg",)}


def exercise_sink(url: str) -> None:
    sink = open_sink(url, STREAMS)
    rows = {("count", "default"): [["a", 1], ["b", 2]], ("count", "errors"): [[{"x": 1}]]}
    assert sink.write_batch("q1", 0, rows) is True
    assert sink.write_batch("q1", 0, rows) is False          # a replayed batch: skipped
    assert sink.write_batch("q1", 1, {("count", "default"): [["a", 3]]}) is True
    assert sink.write_batch("q2", 0, {("count", "default"): [["z", 9]]}) is True   # another query
    sink.close()
    got = [(r[0], r[1], r[2], r[3], r[4]) for r in read_rows(url, "count")]
    assert got == [("q1", 0, 0, "a", 1), ("q1", 0, 1, "b", 2), ("q1", 1, 0, "a", 3), ("q2", 0, 0, "z", 9)]
    errs = read_rows(url, "count", "errors")
    assert len(errs) == 1


def test_sqlite_sink_idempotent_by_batch(tmp_path):
    exercise_sink(f"sqlite:{tmp_path}/out.db")
    assert table_name("my-bolt", "default") == "my_bolt" and table_name("b", "err") == "b_err"
    with pytest.raises(ValueError):
        open_sink("mysql://x", STREAMS)


def test_postgres_sink_idempotent_by_batch(postgres_url):
    sink = open_sink(postgres_url, STREAMS)
    rows = {("count", "default"): [["a", 1], ["b", 2]], ("count", "errors"): [[{"x": 1}]]}
    assert sink.write_batch("q1", 0, rows) is True
    assert sink.write_batch("q1", 0, rows) is False
    assert sink.write_batch("q1", 1, {("count", "default"): [["a", 3]]}) is True
    sink.close()
    got = [(r[1], r[2], r[3], r[4]) for r in read_rows(postgres_url, "count")]
    assert got == [(0, 0, "a", 1), (0, 1, "b", 2), (1, 0, "a", 3)]
    assert read_rows(postgres_url, "count", "errors")[0][3] == {"x": 1}


def test_engine_rejects_unmappable_topology_before_starting_spark():
    from runtime.spark import engine

    b = TopologyBuilder("bad")
    b.spout("plain", PlainSpout())
    b.bolt("w", Words()).shuffle("plain")
    with pytest.raises(TopologyError, match="spout 'plain'"):
        engine.run(b.build(), {})


@pytest.mark.parametrize("name", ["wordcount_log.yaml", "bursty_spark.yaml"])
def test_example_specs_map_onto_spark(name, tmp_path, monkeypatch):
    from topo.spec import load

    root = Path(__file__).resolve().parent.parent
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(root))   # bursty_spark.yaml names bench.*, run from the repository root
    FileLog(tmp_path / "wordcount-log", "sentences", partitions=2)
    topo = load(root / "configs" / name)
    assert check(topo) == []
    assert {p.mode for p in stage_plans(topo, {}).values()} <= {"partition", "task"}


def test_log_producer_cli(tmp_path, monkeypatch, capsys):
    import io
    from topo.sources.log import main

    monkeypatch.setattr("sys.stdin", io.StringIO("a\tone\nb\ttwo\nthree\n"))
    assert main([str(tmp_path), "t", "--partitions", "2", "--tab-key"]) == 0
    log = FileLog(tmp_path, "t")
    values = sorted(r[3] for p in range(2) for r in log.read(p, 0, log.latest()[p]))
    assert values == ["one", "three", "two"]
    assert "3 records" in capsys.readouterr().out


# -- on a cluster: shipping the user's code, what executors can reach, one-line failures ----------

def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_user_modules_follow_local_imports_and_leave_installed_code(tmp_path, monkeypatch):
    """A component's module, the module it imports inside a function, and a package it
    imports (whole, with its relative imports) are shipped; topo, the standard library and
    installed distributions are not."""
    import zipfile

    from runtime.spark.shipping import build_zip, imported_names, user_modules

    _write(tmp_path / "ship_bolts.py", "import json\nimport topo.api\nimport ship_pkg.inner\n"
                                       "def f():\n    from ship_helper import x\n    import yaml\n")
    _write(tmp_path / "ship_helper.py", "x = 1\n")
    _write(tmp_path / "ship_pkg" / "__init__.py", "")
    _write(tmp_path / "ship_pkg" / "inner.py", "from . import deeper\n")
    _write(tmp_path / "ship_pkg" / "deeper.py", "y = 2\n")
    _write(tmp_path / "ship_pkg" / "__pycache__" / "junk.py", "")
    _write(tmp_path / "unrelated.py", "z = 3\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert imported_names((tmp_path / "ship_bolts.py").read_text()) == {"json", "topo", "ship_pkg", "ship_helper",
                                                                       "yaml"}
    modules = user_modules(["ship_bolts.SomeBolt"])
    assert [m.name for m in modules] == ["ship_bolts", "ship_helper", "ship_pkg"]
    with zipfile.ZipFile(build_zip(modules, tmp_path / "code.zip")) as z:
        assert sorted(z.namelist()) == ["ship_bolts.py", "ship_helper.py", "ship_pkg/__init__.py",
                                        "ship_pkg/deeper.py", "ship_pkg/inner.py"]


def test_roots_are_the_classes_of_components_and_of_their_attributes():
    from runtime.spark.shipping import roots_of
    from topo.examples.wordcount import SplitBolt

    bolt = SplitBolt()
    bolt.helper = json.JSONDecoder()
    assert {"topo.examples.wordcount", "topo.api", "json.decoder", "builtins"} <= roots_of([bolt])


@pytest.mark.parametrize("master,here", [
    ("local[2]", True), ("local", True), ("spark://127.0.0.1:7077", True), ("spark://localhost:7077", True),
    ("spark://127.0.0.1:7077,127.0.0.1:7078", True), ("spark://10.0.0.5:7077", False),
    ("spark://127.0.0.1:7077,10.0.0.5:7077", False), ("yarn", False), ("k8s://https://10.0.0.1:6443", False)])
def test_a_cluster_is_on_this_machine_only_behind_a_loopback_master(master, here):
    from runtime.spark.placement import on_this_machine

    assert on_this_machine(master) is here


def _log_topology(root: str) -> "Any":
    from topo.examples.wordcount import SplitBolt

    b = TopologyBuilder("placed")
    b.spout("lines", MessageLogSpout(root, "lines", columns=("value",), fields=("sentence",)))
    b.bolt("split", SplitBolt(), 2).shuffle("lines")
    return b.build()


def test_placement_refuses_what_executors_elsewhere_cannot_reach(tmp_path):
    from runtime.spark.placement import PlacementError, check
    from topo.sinks import SQLiteSink

    FileLog(tmp_path / "log", "lines", partitions=1)
    remote = "spark://10.0.0.5:7077"
    topo = _log_topology(str(tmp_path / "log"))
    sources = {"lines": topo.components["lines"].instance().source()}
    check(topo, {}, "spark://127.0.0.1:7077", sources, [])            # on this machine: all shared
    with pytest.raises(PlacementError, match=r"the driver listens on 127.0.0.1 \(SPARK_LOCAL_IP\)") as e:
        check(topo, {"spark.shared_dir": str(tmp_path)}, remote, sources, [])     # executors cannot call back
    assert e.value.key == "spark.master"
    check = functools.partial(check, driver_host="10.0.0.9")
    with pytest.raises(PlacementError, match=r"spout 'lines' reads the file log .* spark.shared_dir") as e:
        check(topo, {}, remote, sources, [])
    assert (e.value.component, e.value.key) == ("lines", "kwargs.log")
    check(topo, {"spark.shared_dir": str(tmp_path)}, remote, sources, [])   # under the shared mount
    with pytest.raises(PlacementError, match="absolute path"):
        check(topo, {"spark.shared_dir": "shared"}, remote, sources, [])

    b = TopologyBuilder("sinking")
    b.spout("gen", PlainSpout())
    b.bolt("store", SQLiteSink(str(tmp_path / "x.db"), "t", ["x"], ["x"])).shuffle("gen")
    with pytest.raises(PlacementError, match="bolt 'store' writes the file .*x.db from Spark's executors") as e:
        check(b.build(), {"spark.shared_dir": str(tmp_path)}, remote, {}, [])
    assert (e.value.component, e.value.key) == ("store", "kwargs.path")

    empty = TopologyBuilder("stateful")
    empty.spout("gen", PlainSpout())
    with pytest.raises(PlacementError, match="bolts count keep state") as e:
        check(empty.build(), {}, remote, {}, ["count"])
    assert e.value.key == "spark.checkpoint_dir"
    with pytest.raises(PlacementError, match="spark.checkpoint_dir /data/ckpt is a local path"):
        check(empty.build(), {"spark.checkpoint_dir": "/data/ckpt"}, remote, {}, ["count"])
    check(empty.build(), {"spark.checkpoint_dir": "hdfs://nn:8020/ckpt"}, remote, {}, ["count"])
    check(empty.build(), {"spark.shared_dir": str(tmp_path)}, remote, {}, ["count"])
    check(empty.build(), {"spark.checkpoint_dir": "/data/ckpt"}, remote, {}, [])   # stateless: driver only


def test_a_placement_refusal_is_one_line_naming_the_yaml_key_before_spark_starts(tmp_path):
    import os
    import subprocess
    import sys

    repo = Path(__file__).resolve().parent.parent
    FileLog(tmp_path / "log", "lines", partitions=1)
    (tmp_path / "t.yaml").write_text(
        "name: placed\nspouts:\n  - id: lines\n    class: topo.sources.MessageLogSpout\n"
        "    kwargs: {log: log, topic: lines, columns: [value], fields: [sentence]}\n"
        "bolts:\n  - {id: split, class: topo.examples.wordcount.SplitBolt}\n"
        "streams:\n  - {from: lines, to: split, grouping: {type: shuffle}}\n")
    env = dict(os.environ, PYTHONPATH=str(repo), SPARK_LOCAL_IP="10.0.0.9")   # checked before anything binds
    proc = subprocess.run([sys.executable, "-m", "topo.cli", "run", "--engine", "spark", "--master",
                           "spark://10.0.0.5:7077", "t.yaml"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        "t.yaml:5: spouts[0].kwargs.log: spout 'lines' reads the file log 'log', and on spark://10.0.0.5:7077 "
        "executors may run on other machines: put the log on storage every machine mounts at the same path "
        "and name that directory in spark.shared_dir, or use a redis:// log"]


def test_a_bolt_failure_names_the_bolt_and_the_users_exception():
    from runtime.spark.bolts import FAILURE_PREFIX, BoltFailure, Runner, StagePlan

    class Raising(Bolt):
        outputs = ["x"]

        def execute(self, tup):
            raise ValueError("no\nsuch key")

    plan = StagePlan("explode", Raising, 1, "t", {}, "partition", {("gen", "default"): ("id",)}, {"default": ("x",)})
    runner = Runner(plan, plan.instance())
    with pytest.raises(BoltFailure) as e:
        runner.run(runner.tuple_of("gen", "default", msgpack.packb([1])))
    assert str(e.value) == "bolt 'explode': execute raised ValueError: no such key"
    assert FAILURE_PREFIX == "runtime.spark.bolts.BoltFailure: "


TRACE = """An exception was raised by the Python Proxy. Return Message: Traceback (most recent call last):
  File "/x/pyspark/sql/utils.py", line 120, in call
    self.func(DataFrame(jdf, wrapped_session_jdf), batch_id)
pyspark.errors.exceptions.captured.PythonException: An exception was thrown from the Python worker:
Traceback (most recent call last):
  File "/x/worker.py", line 4207, in invoke_udf
    raise BoltFailure(self.component, self.call.__name__, e) from e
runtime.spark.bolts.BoltFailure: bolt 'explode': execute raised ValueError: no room
 SQLSTATE: 38000
\tat org.apache.spark.api.python.BasePythonRunner$ReaderIterator.handlePythonException(PythonRunner.scala:1097)
"""


def test_failure_line_finds_the_bolt_then_the_first_python_exception():
    from runtime.spark.engine import failure_line

    assert failure_line(TRACE) == "bolt 'explode': execute raised ValueError: no room"
    missing = ("[PYTHON_EXCEPTION] An exception was thrown from the Python worker: Traceback (most recent call last):\n"
               "  File \"/x/serializers.py\", line 483, in loads\n    return cloudpickle.loads(obj)\n"
               "           ^^^^^\nModuleNotFoundError: No module named 'bench'\n SQLSTATE: 38000\n\tat x.y(Z.scala:1)\n")
    assert failure_line("Query failed.\n" + missing) == "ModuleNotFoundError: No module named 'bench'"
    assert failure_line("java.lang.OutOfMemoryError: Java heap space\n\tat a.b") == \
        "java.lang.OutOfMemoryError: Java heap space"


def test_a_failed_query_asks_for_debug_only_when_it_is_not_on():
    import logging

    from runtime.spark.engine import _query_failed

    plain = str(_query_failed(RuntimeError(TRACE), "spark.log", debugging=False))
    assert plain == ("bolt 'explode': execute raised ValueError: no room (on Spark; run again with --debug "
                     "for the full trace; Spark's log: spark.log)")
    debug = str(_query_failed(RuntimeError(TRACE), "", debugging=True))
    assert debug == "bolt 'explode': execute raised ValueError: no room (on Spark; Spark's trace is above)"
    # the CLI's --debug turns on DEBUG logging: that is what the engine goes by
    root = logging.getLogger()
    before = root.level
    try:
        root.setLevel(logging.DEBUG)
        assert "--debug" not in str(_query_failed(RuntimeError(TRACE), ""))
        root.setLevel(logging.WARNING)
        assert "run again with --debug" in str(_query_failed(RuntimeError(TRACE), ""))
    finally:
        root.setLevel(before)


def test_enter_workdir_keeps_relative_import_paths_working(tmp_path, monkeypatch):
    import os
    import sys

    from runtime.spark.bolts import enter_workdir

    here, there = tmp_path / "executor", tmp_path / "driver"
    here.mkdir()
    there.mkdir()
    _write(here / "shipped_mod_x.py", "VALUE = 42\n")
    monkeypatch.chdir(here)
    monkeypatch.setattr(sys, "path", [".", *sys.path])
    enter_workdir(str(there))
    assert Path.cwd() == there and os.path.normpath(sys.path[0]) == str(here)
    import shipped_mod_x

    assert shipped_mod_x.VALUE == 42
    sys.modules.pop("shipped_mod_x", None)


def test_a_batch_bolt_runs_on_spark_its_emit_many_one_bus_row_per_values():
    from runtime.spark.bolts import BusCollector, Runner, StagePlan, context_for
    from topo.api import EmitError

    class Words(Bolt):
        outputs = ["word"]

        def execute_batch(self, tuples):
            self.collector.emit_many([(w,) for t in tuples for w in t["line"].split()],
                                     anchor_each=[t for t in tuples for _ in t["line"].split()])

    plan = StagePlan("split", Words, 1, "t", {}, "partition", {("gen", "default"): ("line",)},
                     {"default": ("word",)})
    bolt, collector = plan.instance(), BusCollector(plan)
    bolt.prepare(context_for(plan, 0), collector)
    runner = Runner(plan, bolt)
    runner.run(runner.tuple_of("gen", "default", msgpack.packb(["a b c"])))   # execute -> a batch of one
    assert [msgpack.unpackb(v) for v in collector.values] == [["a"], ["b"], ["c"]]
    assert collector.streams == ["default"] * 3
    with pytest.raises(EmitError, match="2 values and 1 anchor_each"):
        collector.emit_many([("x",), ("y",)], anchor_each=[None])


def test_spark_smooth_batches_reaches_doc001_and_defaults_to_three(tmp_path):
    from runtime.spark import engine
    from topo.config import resolve
    from topo.sources import SyntheticSpout

    class Sink(Bolt):
        outputs: list[str] = []

        def execute(self, tup) -> None:
            return None

    b = TopologyBuilder("smooth")
    b.spout("s", SyntheticSpout("constant", rate=10.0, partitions=2, total=10))
    b.bolt("b", Sink(), 1).shuffle("s")
    topo = b.build()
    for layer, want in (({}, 3), ({"spark.smooth_batches": 1}, 1)):
        _, _, feedback = engine._rate_control(topo, resolve(layer), 1.0, 2, str(tmp_path))
        assert feedback.sources["s"].controller.smooth_batches == want
    # spark.headroom and spark.late_floor reach it too (defaults 0.05 and 0.5)
    for layer, target, floor in (({}, 0.95, 0.5), ({"spark.headroom": 0.0, "spark.late_floor": 1.0}, 1.0, 1.0)):
        _, _, feedback = engine._rate_control(topo, resolve(layer), 1.0, 2, str(tmp_path))
        controller = feedback.sources["s"].controller
        assert (controller.target, controller.late_floor) == (pytest.approx(target), floor)


@pytest.mark.parametrize("key,value", [("spark.headroom", 0.5), ("spark.headroom", -0.01),
                                       ("spark.late_floor", 0.0), ("spark.late_floor", 1.5)])
def test_doc001_settings_out_of_range_are_one_line_errors(key, value):
    from topo.config import ConfigError, resolve
    with pytest.raises(ConfigError) as err:
        resolve({key: value})
    assert key in str(err.value) and "\n" not in str(err.value)


def test_the_jvms_output_reaches_ours_without_the_lines_every_run_printed():
    """Every line the JVM writes is copied in order, the noise lines and the empty line after
    each left out (other empty lines kept), and ``join`` returns once the JVM's end of the
    pipe is closed."""
    import os

    from runtime.spark.session import JVM_BOOT_NOISE, TWS_WORKER_NOISE, JvmOutput

    def copy(data: bytes, noise: tuple[bytes, ...]) -> list[bytes]:
        read_end, write_end = os.pipe()
        got: list[bytes] = []
        copier = JvmOutput(os.fdopen(read_end, "rb"), noise, write=got.append).start()
        os.write(write_end, data)
        os.close(write_end)
        copier.join(5.0)
        assert not copier.thread.is_alive()
        return got

    assert copy(b"first\nWARNING: Using incubator modules: jdk.incubator.vector\n"
                b"Error: Could not find or load main class\nWARNING: something else\nlast", JVM_BOOT_NOISE) == [
        b"first\n", b"Error: Could not find or load main class\n", b"WARNING: something else\n", b"last"]
    assert copy(b"Starting Streaming TransformWithStateInPandas Python worker.\n\n"
                b"Streaming TransformWithStateInPandas Python worker Starting execution of UDF: f.\n\n"
                b"Streaming TransformWithStateInPandas Python worker Completed execution of UDF: f.\n\n"
                b"\nbatches: 3\n\nrows: 7\n", TWS_WORKER_NOISE) == [b"\n", b"batches: 3\n", b"\n", b"rows: 7\n"]
