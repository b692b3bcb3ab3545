"""Windows on the Spark engine (runtime.spark.windows): tumbling and sliding event-time
windows run as Spark's own windowed aggregations and give the local engine's rows for
every window the watermark closed; what does not map is refused at start in one line."""
from __future__ import annotations

import pytest

from runtime.local.engine import run as run_local
from runtime.spark import engine as spark_engine
from runtime.spark.plan import check
from runtime.spark.result_store import read_rows
from topo.api import Bolt, Tuple
from topo.join import JoinBolt
from topo.sources import SyntheticSpout
from topo.topology import Topology, TopologyBuilder
from topo.windows import CountWindow, SessionWindow, SlidingWindow, TumblingWindow

pytestmark = pytest.mark.spark

TOTAL = 600
LATENESS = 5


@pytest.fixture(scope="module")
def spark():
    from runtime.spark.session import get_session

    session = get_session("local[2]", shuffle_partitions=2, log_level="ERROR")
    yield session


class Stamp(Bolt):
    """Synthetic ids -> events: ``ts`` two per second, three users, a small number."""

    outputs = ["ts", "user", "n"]

    def execute(self, tup: Tuple) -> None:
        i = tup["id"]
        self.collector.emit([i // 2, f"u{i % 3}", (i % 5) + (0.5 if i % 50 == 0 else 0)])


class Rows(Bolt):
    rows: list[tuple[str, list]] = []

    def execute(self, tup: Tuple) -> None:
        Rows.rows.append((tup.source_component, list(tup.values)))


def topology(name: str, rate: float, collect: bool) -> Topology:
    b = TopologyBuilder(name)
    b.spout("gen", SyntheticSpout("constant", rate=rate, partitions=1, total=TOTAL, max_len=16))
    b.bolt("stamp", Stamp()).shuffle("gen")
    b.bolt("tumbling", TumblingWindow(60, key_fields=["user"], lateness_s=LATENESS, as_field="events")) \
        .fields("stamp", "user")
    b.bolt("sliding", SlidingWindow(60, 30, key_fields=["user"], lateness_s=LATENESS, agg="sum",
                                    value_field="n", late_stream=None)).fields("stamp", "user")
    b.bolt("peak", TumblingWindow(100, lateness_s=LATENESS, agg="max", value_field="n")).global_("stamp")
    if collect:
        b.bolt("rows", Rows()).global_("tumbling").global_("sliding").global_("peak")
    return b.build()


def test_tumbling_and_sliding_windows_on_spark_give_the_local_rows_the_watermark_closed(spark, tmp_path):
    Rows.rows = []
    assert run_local(topology("win-local", 200_000, True), None, duration=60).reason == "exhausted"
    local = {c: sorted(v for cc, v in Rows.rows if cc == c) for c in ("tumbling", "sliding", "peak")}
    url = f"sqlite:{tmp_path}/out.db"
    result = spark_engine.run(topology("win-spark", 1000, False), {"spark.sink": url, "spark.initial_rate": 250.0},
                              spark=spark, duration=300)
    assert result.reason == "exhausted"
    assert len(result.batches) >= 2                    # windows closed across micro-batches
    for c in ("tumbling", "sliding", "peak"):
        got = sorted(list(r[3:]) for r in read_rows(url, c))
        # Spark emits a window once its watermark passed the end; the query stops when the input
        # is exhausted, so the last windows are missing: exactly the local rows up to a frontier
        frontier = max(v[-2] for v in got)
        assert frontier >= 200, c
        assert got == [v for v in local[c] if v[-2] <= frontier], c   # each once, same key, bounds, value
        assert len(got) < len(local[c])                 # (the local engine closes the rest at the end)


def test_what_does_not_map_is_refused_in_one_line_naming_the_bolt() -> None:
    b = TopologyBuilder("spark-refused")
    b.spout("src", SyntheticSpout(total=10, columns=("id", "payload"), fields=("ts", "user")))
    b.bolt("ok", TumblingWindow(60, key_fields=["user"])).fields("src", "user")
    b.bolt("session", SessionWindow(30, key_fields=["user"])).fields("src", "user")
    b.bolt("count", CountWindow(5)).shuffle("src")
    b.bolt("proc", TumblingWindow(60, time="processing")).shuffle("src")
    b.bolt("idle", TumblingWindow(60, idle_s=5)).shuffle("src")
    b.bolt("fn", TumblingWindow(60, agg=sorted, value_field="ts")).shuffle("src")
    b.bolt("late_reader", TumblingWindow(60, key_fields=["user"])).fields("src", "user")
    b.bolt("reads_late", Rows()).shuffle("late_reader", stream="late")
    b.bolt("join", JoinBolt("src", "ok", ["user"], ["ts"], ["events"], size_s=5)) \
        .fields("src", "user").fields("ok", "user")
    problems = check(b.build())
    assert all("\n" not in p for p in problems)
    named = [p.split("'")[1] for p in problems]
    assert named == ["session", "count", "proc", "idle", "fn", "late_reader", "join"]
    assert "session window" in problems[0] and "late_stream: null" in problems[5] and "join" in problems[6]
    with pytest.raises(Exception) as e:
        spark_engine.run(b.build(), {"spark.sink": "none"}, spark=None, duration=1)
    assert "cannot run on Spark" in str(e.value) and "'session'" in str(e.value)
