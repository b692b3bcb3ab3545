"""Windows (topo.windows): each type with adversarial sequences, checkpoints, and a run."""
from __future__ import annotations

import json
import math
import random
from collections import Counter
from pathlib import Path
from typing import Any

import msgpack
import pytest

from topo.api import Bolt, Tuple
from topo.sources.files import JsonLinesSpout
from topo.testing import BoltHarness
from topo.topology import TopologyBuilder
from topo.windows import CountWindow, SessionWindow, SlidingWindow, TumblingWindow

FIELDS = ["ts", "user", "n"]


def feed(h: BoltHarness, *rows: tuple[Any, ...]) -> list[tuple[str, list[Any]]]:
    out = []
    for row in rows:
        out += [(e.stream, e.values) for e in h.feed(list(row), raise_errors=True)]
    return out


def harness(bolt: Bolt) -> BoltHarness:
    return BoltHarness(bolt, input_fields={"default": FIELDS, "end": ["task", "tasks"]})


class Clock:
    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


# -- tumbling, event time -----------------------------------------------------------------------

def test_tumbling_out_of_order_within_lateness_counts_each_window_once() -> None:
    h = harness(TumblingWindow(60, key_fields=["user"], lateness_s=10))
    out = feed(h, (5, "a", 1), (62, "a", 1), (30, "b", 1), (59, "a", 1), (65, "b", 1))
    assert out == []                                    # watermark 55: nothing closed
    out = feed(h, (70, "a", 1))                         # watermark 60 closes [0, 60)
    assert out == [("default", ["a", 0, 60, 2]), ("default", ["b", 0, 60, 1])]
    assert feed(h, (200, "c", 1)) == [("default", ["a", 60, 120, 2]), ("default", ["b", 60, 120, 1])]
    assert [w[:3] for w in h.bolt.open_windows()] == [("c", 180, 240)]     # closed ones evicted


def test_a_tuple_late_by_exactly_the_lateness_is_on_time_one_more_is_late() -> None:
    h = harness(TumblingWindow(10, key_fields=["user"], lateness_s=10))
    feed(h, (100, "a", 1))                              # watermark 90: [80, 90) is closed
    assert feed(h, (90, "a", 1)) == []                  # exactly 10 behind: [90, 100) still open
    assert feed(h, (89.999, "b", 1)) == [("late", ["b", 89.999])]
    assert h.bolt.late_count == 1
    assert feed(h, (110, "a", 1)) == [("default", ["a", 90, 100, 1])]


def test_late_tuples_are_dropped_without_a_late_stream() -> None:
    bolt = TumblingWindow(10, key_fields=["user"], late_stream=None)
    assert set(bolt.declare_outputs()) == {"default"}
    h = harness(bolt)
    assert feed(h, (50, "a", 1), (5, "a", 1)) == []
    assert h.bolt.late_count == 1


def test_empty_windows_emit_nothing_and_a_jump_closes_each_open_window_in_end_order() -> None:
    h = harness(TumblingWindow(10, key_fields=["user"]))
    feed(h, (5, "b", 1), (3, "a", 1), (25, "a", 1))     # [0, 10) closed at 25; [10, 20) never had a tuple
    assert feed(h, (1000, "a", 1)) == [("default", ["a", 20, 30, 1])]
    assert feed(h, (1000, "a", 1)) == []                # the same timestamp closes nothing new


@pytest.mark.parametrize("agg,value,expected", [
    ("sum", "n", 10), ("min", "n", 1), ("max", "n", 4), ("mean", "n", 2.5),
    (sorted, "n", [1, 2, 3, 4]), ("statistics.median", "n", 2.5)])
def test_aggregates(agg: Any, value: str, expected: Any) -> None:
    h = harness(TumblingWindow(10, key_fields=["user"], agg=agg, value_field=value))
    feed(h, (1, "a", 3), (2, "a", 1), (3, "a", 4), (4, "a", 2))
    assert feed(h, (10, "z", 0))[0][1][-1] == expected


def test_a_function_without_value_field_gets_the_tuples_as_dicts() -> None:
    h = harness(TumblingWindow(10, agg=lambda rows: sorted(r["user"] for r in rows), as_field="users"))
    assert h.bolt.declare_outputs()["default"] == ("window_start", "window_end", "users")
    feed(h, (1, "b", 0), (2, "a", 0))
    assert feed(h, (10, "z", 0)) == [("default", [0, 10, ["a", "b"]])]


def test_bad_options_and_bad_timestamps_are_refused() -> None:
    with pytest.raises(ValueError, match="value_field"):
        TumblingWindow(10, agg="sum")
    with pytest.raises(ValueError, match="unknown agg"):
        TumblingWindow(10, agg="median")
    with pytest.raises(ValueError, match="slide_s"):
        SlidingWindow(10, 20)
    h = harness(TumblingWindow(10))
    with pytest.raises(ValueError, match="not a number"):
        feed(h, ("noon", "a", 1))


def test_with_lateness_over_the_disorder_every_tuple_counts_exactly_once() -> None:
    rng = random.Random(7)
    rows = [(t + rng.uniform(-20, 0), rng.choice("abcd"), 1) for t in range(0, 3000)]
    rng.shuffle(rows[:50])                              # a disordered start as well
    h = harness(TumblingWindow(60, key_fields=["user"], lateness_s=25))
    out = feed(h, *rows, (10**6, "z", 1))
    got = {(v[0], v[1]): v[3] for s, v in out}
    expected = Counter((u, (t // 60) * 60) for t, u, _ in rows)
    assert got == dict(expected) and len(out) == len(expected)   # once per (key, window), none late
    assert h.bolt.late_count == 0


# -- sliding -------------------------------------------------------------------------------------

def test_sliding_windows_each_tuple_in_size_over_slide_windows() -> None:
    h = harness(SlidingWindow(30, 10, key_fields=["user"]))
    assert feed(h, (12, "a", 1)) == []
    assert feed(h, (25, "a", 1)) == [("default", ["a", -10, 20, 1])]   # the watermark is 25
    out = feed(h, (60, "a", 1))                         # closes every window ending <= 60
    assert out == [("default", ["a", 0, 30, 2]),
                   ("default", ["a", 10, 40, 2]), ("default", ["a", 20, 50, 1])]


def test_sliding_a_tuple_whose_first_windows_closed_joins_the_open_ones_only() -> None:
    h = harness(SlidingWindow(30, 10, key_fields=["user"]))
    feed(h, (40, "a", 1))                               # watermark 40: windows ending <= 40 closed
    assert feed(h, (25, "a", 1)) == []                  # [0, 30) and [10, 40) closed, [20, 50) open
    assert [(s, e, n) for _, s, e, n in h.bolt.open_windows()] == [(20, 50, 2), (30, 60, 1), (40, 70, 1)]
    feed(h, (5, "b", 1))                                # windows [-20,10) [-10,20) [0,30): all closed
    assert h.bolt.late_count == 1


# -- sessions ------------------------------------------------------------------------------------

def test_session_gap_edges_just_under_the_gap_joins_exactly_the_gap_splits() -> None:
    h = harness(SessionWindow(5, key_fields=["user"]))
    feed(h, (0, "a", 1), (4.75, "a", 1))                # under the gap: one session [0, 9.75)
    assert [w[1:3] for w in h.bolt.open_windows()] == [(0, 9.75)]
    out = feed(h, (9.75, "a", 1))                       # exactly the gap after 4.75: a new session
    assert out == [("default", ["a", 0, 9.75, 2])]
    assert [w[1:3] for w in h.bolt.open_windows()] == [(9.75, 14.75)]


def test_session_an_out_of_order_tuple_bridges_two_sessions() -> None:
    h = harness(SessionWindow(10, key_fields=["user"], lateness_s=100))
    feed(h, (0, "a", 1), (15, "a", 1), (2, "b", 1), (40, "a", 1))
    feed(h, (29, "a", 1))                               # [29, 39) touches neither [15, 25) nor [40, 50)
    assert [w[1:4] for w in h.bolt.open_windows() if w[0] == "a"] == [(0, 10, 1), (15, 25, 1), (29, 39, 1),
                                                                      (40, 50, 1)]
    feed(h, (7, "a", 1))                                # [7, 17) overlaps [0, 10) and [15, 25): one session
    assert [w[1:4] for w in h.bolt.open_windows() if w[0] == "a"] == [(0, 25, 3), (29, 39, 1), (40, 50, 1)]
    out = feed(h, (200, "c", 1))
    assert out == [("default", ["b", 2, 12, 1]), ("default", ["a", 0, 25, 3]),
                   ("default", ["a", 29, 39, 1]), ("default", ["a", 40, 50, 1])]


def test_session_late_tuple_inside_an_open_session_is_taken_outside_any_is_late() -> None:
    h = harness(SessionWindow(10, key_fields=["user"], lateness_s=5, agg="sum", value_field="n"))
    feed(h, (0, "a", 1), (8, "a", 2), (16, "a", 3), (24, "a", 4))   # session [0, 34), watermark 19
    assert feed(h, (6, "a", 5)) == []                   # [6, 16) closed by itself, but merges: on time
    assert feed(h, (1, "b", 5)) == [("late", ["b", 1, 5])]
    assert feed(h, (60, "a", 0))[0] == ("default", ["a", 0, 34, 15])


# -- processing time, idle, end of input --------------------------------------------------------

def test_processing_time_windows_close_on_the_tick_with_an_injected_clock() -> None:
    clock = Clock(100.0)
    bolt = TumblingWindow(10, key_fields=["user"], time="processing", clock=clock, tick_s=0.5)
    assert bolt.tick_interval_s == 0.5 and "late" not in bolt.declare_outputs()
    h = harness(bolt)
    feed(h, (0, "a", 1), (999, "a", 1))                 # the ts field is ignored
    clock.now = 109.9
    feed(h, (0, "b", 1))
    assert h.tick() == []
    clock.now = 110.0
    assert [e.values for e in h.tick()] == [["a", 100.0, 110.0, 2], ["b", 100.0, 110.0, 1]]
    assert h.tick() == [] and h.bolt.open_windows() == []


def test_processing_time_sessions() -> None:
    clock = Clock(0.0)
    h = harness(SessionWindow(3, key_fields=["user"], time="processing", clock=clock))
    for now in (0.0, 2.0, 4.5):
        clock.now = now
        feed(h, (0, "a", 1))
    clock.now = 7.4
    assert h.tick() == []
    clock.now = 7.5
    assert [e.values for e in h.tick()] == [["a", 0.0, 7.5, 3]]


def test_idle_input_lets_the_watermark_follow_the_clock_on_the_tick() -> None:
    clock = Clock(1000.0)
    bolt = TumblingWindow(60, key_fields=["user"], lateness_s=10, idle_s=5, clock=clock)
    assert bolt.tick_interval_s == 1.0
    h = harness(bolt)
    feed(h, (30, "a", 1), (50, "a", 1))                 # watermark 40
    clock.now = 1004.0
    assert h.tick() == []                               # not idle long enough
    clock.now = 1019.0                                  # idle 19 s: watermark 50 - 10 + 19 = 59
    assert h.tick() == []
    clock.now = 1020.0                                  # 60: [0, 60) closes
    assert [e.values for e in h.tick()] == [["a", 0, 60, 2]]
    feed(h, (61, "a", 1))                               # on time: the clock moved the watermark, not past it
    assert h.bolt.late_count == 0


def test_end_of_input_closes_every_window_once_every_task_of_the_source_ended() -> None:
    h = harness(TumblingWindow(60, key_fields=["user"], lateness_s=100))
    assert feed(h, (5, "a", 1), (70, "b", 1)) == []
    end = h.tuple([0, 2], "end", source="events")
    assert h.feed(end) == []                            # one of two tasks ended
    h.feed(h.tuple([0, 2], "end", source="events"))    # the same task again: still one
    out = [e.values for e in h.feed(h.tuple([1, 2], "end", source="events"))]
    assert out == [["a", 0, 60, 1], ["b", 60, 120, 1]]
    assert h.bolt.open_windows() == []


# -- count windows -------------------------------------------------------------------------------

def test_count_windows_tumbling_and_sliding_per_key() -> None:
    h = harness(CountWindow(3, key_fields=["user"], agg="sum", value_field="n"))
    out = feed(h, *[(0, u, n) for u, n in zip("aabaaab", range(1, 8))])
    assert out == [("default", ["a", 0, 3, 1 + 2 + 4])]       # b has 2 tuples, a's second window 2
    assert feed(h, (0, "a", 8)) == [("default", ["a", 3, 6, 5 + 6 + 8])]
    s = harness(CountWindow(3, 1, agg="max", value_field="n"))
    out = feed(s, *[(0, "x", n) for n in (5, 1, 2, 9, 0, 0, 0)])
    assert [v for _, v in out] == [[0, 3, 5], [1, 4, 9], [2, 5, 9], [3, 6, 9], [4, 7, 0]]


# -- checkpoints: a restored bolt goes on exactly as one that never stopped ----------------------

@pytest.mark.parametrize("make", [
    lambda: TumblingWindow(10, key_fields=["user"], lateness_s=5, agg="mean", value_field="n"),
    lambda: SlidingWindow(20, 5, key_fields=["user"], lateness_s=3),
    lambda: SessionWindow(4, key_fields=["user", "n"], lateness_s=6, agg=sorted, value_field="ts"),
    lambda: CountWindow(4, 2, key_fields=["user"], agg="sum", value_field="n"),
], ids=["tumbling", "sliding", "session", "count"])
def test_a_restored_window_bolt_continues_exactly(make: Any) -> None:
    rng = random.Random(3)
    rows = [(round(i + rng.uniform(-8, 0), 1), rng.choice("ab"), rng.randint(0, 2)) for i in range(400)]
    whole = harness(make())
    expected = feed(whole, *rows, (10**6, "z", 0))
    first = harness(make())
    got = feed(first, *rows[:173])
    state = msgpack.unpackb(msgpack.packb(first.bolt.snapshot_state()), raw=False)
    second = harness(make())
    second.bolt.restore_state(state)
    got += feed(second, *rows[173:], (10**6, "z", 0))
    assert got == expected and len(expected) > 20


# -- on the local engine -------------------------------------------------------------------------

class Collect(Bolt):
    rows: list[list[Any]] = []

    def execute(self, tup: Tuple) -> None:
        Collect.rows.append([tup.stream, *tup.values])


def test_end_to_end_on_the_local_engine_with_the_end_stream(tmp_path: Path) -> None:
    from runtime.local.engine import run

    rng = random.Random(1)
    records = [{"ts": t + rng.randint(-9, 0), "user": rng.choice(["ann", "bob"])} for t in range(0, 600, 3)]
    records.insert(150, {"ts": 100, "user": "late"})   # far behind the watermark
    data = tmp_path / "events.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    b = TopologyBuilder("windows-e2e", {"acking": True})
    b.spout("events", JsonLinesSpout(str(data), fields=["ts", "user"]))
    b.bolt("per_minute", TumblingWindow(60, key_fields=["user"], lateness_s=10), parallelism=2) \
        .fields("events", "user").all("events", stream="end")
    b.bolt("collect", Collect()).global_("per_minute").global_("per_minute", stream="late")
    Collect.rows = []
    run(b.build())
    on_time = [r for i, r in enumerate(records) if i != 150]
    expected = Counter((r["user"], (r["ts"] // 60) * 60) for r in on_time)
    got = {(u, s): n for stream, u, s, e, n in (r for r in Collect.rows if r[0] == "default")}
    assert got == dict(expected)
    assert len([r for r in Collect.rows if r[0] == "default"]) == len(expected)    # once each
    assert [r for r in Collect.rows if r[0] == "late"] == [["late", "late", 100]]


# -- the watermark over upstream tasks (Flink's per-channel minimum) ------------------------------

def from_task(h: BoltHarness, task: int, row: tuple[Any, ...]) -> list[list[Any]]:
    from topo.api import FieldIndex

    tup = Tuple(list(row), FieldIndex.of(FIELDS), source_component="parse", source_task=task)
    return [e.values for e in h.feed(tup, raise_errors=True)]


def channel_harness(bolt: Bolt, tasks: tuple[int, ...] = (1, 2)) -> BoltHarness:
    h = harness(bolt)
    # what the engine says: the upstream tasks of each input (the end stream carries no time)
    object.__setattr__(h.context, "inputs", {"parse:default": tasks, "events:end": (9,)})
    bolt.prepare(h.context, h.bolt.collector)
    return h


def test_the_watermark_is_the_least_over_upstream_tasks_and_waits_for_a_silent_one() -> None:
    clock = Clock(0.0)
    h = channel_harness(TumblingWindow(60, key_fields=["user"], clock=clock))
    assert from_task(h, 1, (500, "a", 1)) == []          # task 2 has sent nothing: no watermark yet
    assert h.bolt.watermark == -math.inf
    assert from_task(h, 2, (30, "b", 1)) == []           # min(500, 30) = 30
    assert from_task(h, 2, (40, "b", 1)) == []
    assert h.bolt.late_count == 0
    assert from_task(h, 2, (61, "b", 1)) == [["b", 0, 60, 2]]    # task 2 passed 60; task 1 long ago
    assert from_task(h, 1, (501, "a", 1)) == []          # task 1 moving on closes nothing: 61 is the least
    assert h.bolt.watermark == 61


def test_a_silent_upstream_task_holds_the_watermark_for_channel_idle_s_then_not() -> None:
    clock = Clock(0.0)
    h = channel_harness(TumblingWindow(60, key_fields=["user"], clock=clock))    # channel_idle_s: 60
    assert h.bolt.tick_interval_s == 1.0
    from_task(h, 1, (500, "a", 1))
    clock.now = 59.0
    assert from_task(h, 1, (501, "a", 1)) == []           # task 2 never sent: still waited for
    assert h.tick() == [] and h.bolt.watermark == -math.inf
    clock.now = 60.0
    assert h.tick() == []                                 # task 2 left out now: task 1's 501 is the least
    assert h.bolt.watermark == 501
    never = channel_harness(TumblingWindow(60, key_fields=["user"], clock=clock, channel_idle_s=None))
    from_task(never, 1, (500, "a", 1))
    clock.now = 10**6
    never.tick()
    assert never.bolt.watermark == -math.inf             # None: waits for ever (Flink's default)


def test_one_max_over_all_tasks_would_make_the_slow_task_late_the_minimum_does_not() -> None:
    rows = [(t, "a", 1) for t in range(0, 300, 7)]
    h = channel_harness(TumblingWindow(60, key_fields=["user"]))
    for row in rows:                                      # task 1 runs 120 s ahead of task 2
        from_task(h, 1, (row[0] + 120, *row[1:]))
        from_task(h, 2, row)
    assert h.bolt.late_count == 0
    h.bolt.end_of_input()
    counts = Counter((r[0] // 60) * 60 for r in rows) + Counter(((r[0] + 120) // 60) * 60 for r in rows)
    assert {e.values[1]: e.values[3] for e in h.emitted} == dict(counts)
    assert len(h.emitted) == len(counts)


def test_an_idle_upstream_task_stops_holding_the_watermark_after_channel_idle_s() -> None:
    clock = Clock(1000.0)
    h = channel_harness(TumblingWindow(60, key_fields=["user"], channel_idle_s=5, clock=clock))
    from_task(h, 1, (10, "a", 1))
    from_task(h, 2, (20, "b", 1))
    clock.now = 1003.0
    assert from_task(h, 1, (70, "a", 1)) == []            # task 2 (at 20) holds the watermark
    clock.now = 1004.0
    assert h.tick() == []                                 # task 2 quiet for 4 s: still waited for
    clock.now = 1005.5
    assert [e.values for e in h.tick()] == [["a", 0, 60, 1], ["b", 0, 60, 1]]   # task 2 idle: left out
    assert from_task(h, 2, (30, "b", 1)) == [["b", 30]]   # back behind the watermark: on the late stream
    assert h.bolt.late_count == 1
    clock.now = 1006.0
    assert from_task(h, 2, (90, "b", 1)) == []            # back in the minimum: min(70, 90) = 70
    assert h.bolt.watermark == 70


def test_end_of_input_closes_every_open_window_once() -> None:
    h = harness(SessionWindow(10, key_fields=["user"], lateness_s=1000))
    feed(h, (5, "a", 1), (7, "a", 1), (500, "b", 1))
    before = len(h.emitted)
    h.bolt.end_of_input()
    assert [e.values for e in h.emitted[before:]] == [["a", 5, 17, 2], ["b", 500, 510, 1]]
    assert h.bolt.open_windows() == []


def test_restored_watermark_keeps_each_upstream_task() -> None:
    h = channel_harness(TumblingWindow(60, key_fields=["user"]))
    from_task(h, 1, (500, "a", 1))
    from_task(h, 2, (30, "b", 1))
    state = msgpack.unpackb(msgpack.packb(h.bolt.snapshot_state()), raw=False)
    again = channel_harness(TumblingWindow(60, key_fields=["user"]))
    again.bolt.restore_state(state)
    assert from_task(again, 2, (70, "b", 1)) == [["b", 0, 60, 1]]    # min(500, 70): [0, 60) closes


def test_a_bounded_file_gives_complete_windows_without_an_end_stream(tmp_path: Path) -> None:
    """The engine's end-of-input hook closes what is open; two spout tasks in time order
    each, lateness 0: with one maximum over both, the slower file's tuples would be late."""
    import zlib
    from runtime.local.engine import run

    names = [n for n in (f"part{i}.jsonl" for i in range(20))]
    a = next(n for n in names if zlib.crc32(n.encode()) % 2 == 0)
    b_ = next(n for n in names if zlib.crc32(n.encode()) % 2 == 1)
    rows = {a: [{"ts": t, "user": "ann"} for t in range(0, 6000, 2)],
            b_: [{"ts": t, "user": "bob" if t % 4 else "ann"} for t in range(0, 3000, 1)]}
    for name, recs in rows.items():
        (tmp_path / name).write_text("".join(json.dumps(r) + "\n" for r in recs))
    b = TopologyBuilder("end-of-input", {"batch.size": 16})
    b.spout("events", JsonLinesSpout(str(tmp_path / "*.jsonl"), fields=["ts", "user"], end_stream=None),
            parallelism=2)
    b.bolt("per_minute", TumblingWindow(60, key_fields=["user"], lateness_s=0), parallelism=2) \
        .fields("events", "user")
    b.bolt("collect", Collect()).global_("per_minute").global_("per_minute", stream="late")
    Collect.rows = []
    run(b.build())
    expected = Counter((r["user"], (r["ts"] // 60) * 60) for recs in rows.values() for r in recs)
    got = [(u, s, n) for stream, u, s, e, n in (r for r in Collect.rows if r[0] == "default")]
    assert {(u, s): n for u, s, n in got} == dict(expected) and len(got) == len(expected)
    assert [r for r in Collect.rows if r[0] == "late"] == []
