"""Autoscaling on the local engine (document 004's added parallel task): ``seams.Scaler``.

A task added while the topology runs gets traffic at once; a task removed stops only
after its queue drained; under fields grouping the key groups move with their
``KeyedBolt`` state, so counts stay exact; what autoscaling could not keep exact is
refused in one line. The key-group arithmetic is tested on its own first.
"""
from __future__ import annotations

import asyncio
import random
import urllib.request
from collections import Counter as Tally
from typing import Any

import pytest

from coord_backends import until
from runtime.local.engine import LocalEngine
from runtime.observe.prometheus import MetricsService
from test_backpressure_e2e import Shared, config
from topo.api import Bolt, FieldIndex, Spout, Tuple
from topo.config import ConfigError
from topo.groupings import KEY_GROUPS, FieldsGrouping, ShuffleGrouping, key_group, spread_key_groups
from topo.state import KeyedBolt
from topo.topology import TopologyBuilder

pytestmark = [pytest.mark.timeout(120)]

WORDS = [f"w{i}" for i in range(200)]


# --- key groups (pure) -----------------------------------------------------------------
def test_spread_key_groups_moves_only_the_new_tasks_share_and_back() -> None:
    two = [1 + g % 2 for g in range(KEY_GROUPS)]
    three = spread_key_groups(two, [1, 2, 3])
    moved = [g for g in range(KEY_GROUPS) if two[g] != three[g]]
    assert all(three[g] == 3 for g in moved), "a group moved between two old tasks"
    assert len(moved) == three.count(3) == KEY_GROUPS // 3
    counts = [three.count(t) for t in (1, 2, 3)]
    assert max(counts) - min(counts) <= 1
    back = spread_key_groups(three, [1, 2])
    assert [g for g in range(KEY_GROUPS) if back[g] != three[g]] == moved   # only task 3's groups move
    assert sorted(back.count(t) for t in (1, 2)) == [KEY_GROUPS // 2] * 2
    assert spread_key_groups(two, [1, 2, 3]) == three                      # deterministic


def test_a_scalable_fields_router_moves_only_keys_of_moving_groups() -> None:
    fi = FieldIndex.of(["word"])
    r = FieldsGrouping("word").router([1, 2], fi, rng=random.Random(0), scalable=True)
    before = {w: r.targets[r.select([w])] for w in WORDS}
    assert r.key_owners is not None and r.retarget is not None
    owners = spread_key_groups(r.key_owners, [1, 2, 3])
    r.retarget([1, 2, 3], owners)
    after = {w: r.targets[r.select([w])] for w in WORDS}
    for w in WORDS:
        assert after[w] == owners[key_group(w)]
        assert after[w] in (before[w], 3), f"{w} moved between old tasks"
    assert any(t == 3 for t in after.values())


def test_a_scalable_shuffle_router_grows_from_one_target() -> None:
    r = ShuffleGrouping().router([5], FieldIndex.of(["x"]), rng=random.Random(0), scalable=True)
    assert {r.targets[r.select([0])] for _ in range(4)} == {5}
    assert r.retarget is not None
    r.retarget([5, 6], None)
    assert Tally(r.targets[r.select([0])] for _ in range(100)) == {5: 50, 6: 50}


# --- the engine --------------------------------------------------------------------------
class Words(Spout):
    """Emits ``n`` words (``WORDS`` round robin) with a pad, ``per_call`` per call, then ends."""

    outputs = ["word", "pad"]

    def __init__(self, n: int, per_call: int = 20, pad: int = 100) -> None:
        self.n, self.per_call, self.pad, self.i = n, per_call, "x" * pad, 0

    async def next_tuple(self) -> None:
        if self.i >= self.n:
            raise_end()
        for _ in range(min(self.per_call, self.n - self.i)):
            self.collector.emit([WORDS[self.i % len(WORDS)], self.pad], msg_id=self.i)
            self.i += 1
        await asyncio.sleep(0.001)


def raise_end() -> None:
    from topo.api import EndOfStream
    raise EndOfStream


class Seen(Shared):
    def __init__(self) -> None:
        self.words: Tally[str] = Tally()
        self.by_task: Tally[int] = Tally()


class Relay(Bolt):
    """Stateless: forwards each word and notes which task handled it."""

    outputs = ["word", "pad"]

    def __init__(self, seen: Seen) -> None:
        self.seen = seen

    def execute(self, tup: Tuple) -> None:
        self.seen.by_task[self.context.task_id] += 1
        self.collector.emit([tup[0], tup[1]])


class Sink(Bolt):
    outputs: list[str] = []

    def __init__(self, seen: Seen) -> None:
        self.seen = seen

    def execute(self, tup: Tuple) -> None:
        self.seen.words[tup[0]] += 1


class Count(KeyedBolt):
    """Counts words in keyed state; slow enough that the queue holds a backlog."""

    outputs = ["word", "n"]
    key_fields = ("word",)

    def process(self, tup: Tuple, state: dict[str, Any]) -> None:
        state["n"] = state.get("n", 0) + 1

    async def execute(self, tup: Tuple) -> None:   # type: ignore[override]
        super().execute(tup)
        await asyncio.sleep(0)


def truth(n: int) -> Tally[str]:
    return Tally(WORDS[i % len(WORDS)] for i in range(n))


def adaptive(**over: Any) -> dict[str, Any]:
    # A backpressure window so long that no mark is raised, so an upstream's coefficient
    # never reaches the floor and the driver never asks for a task itself: the test scales.
    return config(**{"backpressure.policy": "adaptive", "backpressure.adaptive.max_parallelism": 4,
                     "backpressure.adaptive.window_ms": 600_000, "queue.high_mark": "100KB",
                     "queue.low_mark": "10KB", "queue.hard_bound": "200KB", **over})


def keyed_totals(engine: LocalEngine, component: str) -> tuple[Tally[str], dict[str, int]]:
    """Each key's count over every task (added and removed ones too), and its holder."""
    totals: Tally[str] = Tally()
    holder: dict[str, int] = {}
    for t in [*engine.bolt_tasks, *engine.retired]:
        if t.component != component:
            continue
        for k, state in t.bolt.keyed_state():   # type: ignore[attr-defined]
            assert k not in holder, f"key {k!r} held by tasks {holder[k]} and {t.task_id}"
            holder[k] = t.task_id
            totals[k] += state["n"]
    return totals, holder


def watch_peak(engine: LocalEngine) -> tuple[asyncio.Task[None], list[int]]:
    """A task recording the fullest any queue got (queues added by scaling included)."""
    peak = [0]

    async def watch() -> None:
        while True:
            peak[0] = max([peak[0], *(q.bytes for q in engine.queues.values())])
            await asyncio.sleep(0.001)

    return asyncio.create_task(watch()), peak


@pytest.mark.parametrize("acking", [False, True])
async def test_a_shuffle_task_added_and_removed_while_running_loses_nothing(acking: bool) -> None:
    n = 30_000
    seen = Seen()
    b = TopologyBuilder(f"scale-shuffle-{acking}")
    b.spout("src", Words(n))
    b.bolt("relay", Relay(seen), parallelism=2).shuffle("src")
    b.bolt("sink", Sink(seen)).global_("relay")
    exporter = MetricsService(port=0)
    engine = LocalEngine(b.build(), adaptive(acking=acking), services=[exporter])
    run = asyncio.create_task(engine.run())
    await until(lambda: sum(seen.words.values()) > 2_000, 20, what="traffic")
    added = await engine.add_task("relay")
    assert added is not None
    new = added.task_id        # after every task the topology started with
    assert engine.task_ids["relay"] == [2, 3, new] and new == 5
    sink = next(t for t in engine.tasks if t.component == "sink")
    assert sink.upstream_task_ids == [2, 3, new]
    await until(lambda: seen.by_task[new] > 500, 20, what="the new task getting traffic")
    scrape = await asyncio.to_thread(lambda: urllib.request.urlopen(exporter.url, timeout=5).read().decode())
    assert f'topo_tuples_executed_total{{component="relay",task="{new}"' in scrape   # its metrics are served
    assert await engine.remove_task("relay") == new
    at_removal = seen.by_task[new]
    assert engine.task_ids["relay"] == [2, 3] and new not in engine.queues
    assert sink.upstream_task_ids == [2, 3]
    result = await asyncio.wait_for(run, 60)
    assert seen.words == truth(n), "a word was lost or doubled"
    assert seen.by_task[new] == at_removal, "the removed task executed after it stopped"
    totals = result.component_totals()
    assert totals["relay"]["executed"] == n          # the removed task's stats stay in the result
    if acking:
        assert totals["src"]["acked"] == n and not totals["src"]["failed"]


async def test_fields_grouping_key_groups_move_with_their_keyed_state() -> None:
    n = 40_000
    b = TopologyBuilder("scale-keyed")
    b.spout("src", Words(n))
    b.bolt("count", Count(), parallelism=2).fields("src", "word")
    engine = LocalEngine(b.build(), adaptive(acking=True))
    watcher, peak = watch_peak(engine)
    run = asyncio.create_task(engine.run())
    count_tasks = lambda: [t for t in engine.bolt_tasks if t.component == "count"]   # noqa: E731
    await until(lambda: sum(t.stats.executed for t in count_tasks()) > 5_000, 20, what="traffic")
    new = await engine.add_task("count")
    assert new is not None
    mid, holder = keyed_totals(engine, "count")
    owners = engine.key_owners["count"]
    assert all(owners[key_group(k)] == t for k, t in holder.items())
    assert any(t == new.task_id for t in holder.values()), "no key moved to the new task"
    await until(lambda: new.stats.executed > 1_000, 20, what="the new task counting")
    assert await engine.remove_task("count") == new.task_id
    _, holder = keyed_totals(engine, "count")
    assert new.task_id not in holder.values()
    result = await asyncio.wait_for(run, 60)
    watcher.cancel()
    totals, holder = keyed_totals(engine, "count")
    assert totals == truth(n), "a count is off: keyed state did not move with its key group"
    assert result.component_totals()["src"]["acked"] == n
    assert peak[0] <= engine.config["queue.hard_bound"]


class Emitting(Count):
    """Count that passes each word on, for a stage downstream of the rescaled component."""

    def process(self, tup: Tuple, state: dict[str, Any]) -> None:
        state["n"] = state.get("n", 0) + 1
        self.collector.emit([tup["word"], state["n"]])


class Slow(Bolt):
    """A stage downstream of the counts, slower than them: its queue stays full."""

    async def execute(self, tup: Tuple) -> None:
        await asyncio.sleep(0.0005)


async def test_a_keyed_rescale_waits_for_its_component_not_for_a_slow_stage_after_it() -> None:
    """The spouts hold only until nothing routed by the old key owners is on its way to the
    rescaled component; the slow sink after it keeps its backlog through the move."""
    n = 15_000
    b = TopologyBuilder("scale-keyed-upstream")
    b.spout("src", Words(n))
    b.bolt("count", Emitting(), parallelism=2).fields("src", "word")
    b.bolt("slow", Slow()).shuffle("count")
    engine = LocalEngine(b.build(), adaptive(acking=True))
    run = asyncio.create_task(engine.run())
    slow = next(t for t in engine.bolt_tasks if t.component == "slow")
    await until(lambda: slow.queue.count > 500, 20, what="a backlog at the slow sink")
    backlog: list[int] = []
    move = engine._move_keys

    def moving(component: str, tasks: Any) -> None:      # what the slow sink holds as the keys move
        backlog.append(slow.queue.count)
        move(component, tasks)

    engine._move_keys = moving  # type: ignore[method-assign]
    assert await engine.add_task("count") is not None
    assert await engine.remove_task("count") is not None
    result = await asyncio.wait_for(run, 90)
    totals, _ = keyed_totals(engine, "count")
    assert totals == truth(n), "a count is off: keyed state did not move with its key group"
    assert result.component_totals()["src"]["acked"] == n
    assert len(backlog) == 2 and min(backlog) > 0, backlog     # the sink was not drained for the moves
    print(f"slow sink held {backlog} tuples as the keys moved; pauses {[r[3] for r in engine.rescales]} ms")


def test_fields_grouping_into_a_bolt_without_keyed_state_is_left_unscaled_or_refused_in_one_line() -> None:
    seen = Seen()
    b = TopologyBuilder("scale-refused")
    b.spout("src", Words(10))
    b.bolt("sink", Sink(seen), parallelism=2).fields("src", "word")
    b.bolt("pass", Sink(Seen()), parallelism=2).shuffle("src")
    # auto (the default): the keyed bolt keeps its tasks, the shuffled one may grow
    assert LocalEngine(b.build(), adaptive()).scalable == frozenset({"pass"})
    with pytest.raises(ConfigError) as e:
        LocalEngine(b.build(), adaptive(**{"backpressure.adaptive.autoscale": "true"}))
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("config 'backpressure.adaptive.autoscale'") and "'sink'" in msg
    assert "KeyedBolt" in msg and "set it to auto" in msg
    assert LocalEngine(b.build(), adaptive(**{"backpressure.adaptive.autoscale": False})).scalable == frozenset()
    assert LocalEngine(b.build(), adaptive(**{"backpressure.adaptive.max_parallelism": 2})).scalable == frozenset()


class OffsetWords(Words):
    """Words that checkpoint how far they got."""

    def snapshot_state(self) -> int:
        return self.i

    def restore_state(self, state: int) -> None:
        self.i = state


class OwnState(Sink):
    """A bolt that checkpoints a state of its own (not keyed)."""

    def snapshot_state(self) -> int:
        return 0

    def restore_state(self, state: int) -> None:
        pass


def test_checkpoints_leave_only_bolts_with_unkeyed_state_unscaled_and_refuse_them_under_true(tmp_path: Any) -> None:
    """A restore gives each task its index's state: a stateless bolt, or keyed state (which
    the restore hands to its keys' owners), may grow; a bolt with a state of its own not."""
    b = TopologyBuilder("scale-checkpointed")
    b.spout("src", OffsetWords(10))
    b.bolt("pass", Sink(Seen()), parallelism=2).shuffle("src")
    b.bolt("tally", OwnState(Seen()), parallelism=2).shuffle("src")
    b.bolt("count", Count(), parallelism=2).fields("src", "word")
    cp = {"checkpoint.interval_ms": 1000, "checkpoint.dir": str(tmp_path)}
    assert LocalEngine(b.build(), adaptive(**cp)).scalable == frozenset({"pass", "count"})
    with pytest.raises(ConfigError, match="^config 'backpressure.adaptive.autoscale': bolt 'tally' checkpoints state "
                                          "of its own .* could not give an added task's state back"):
        LocalEngine(b.build(), adaptive(**cp, **{"backpressure.adaptive.autoscale": "true"}))
    assert LocalEngine(b.build(), adaptive()).scalable == frozenset({"pass", "tally", "count"})   # no checkpoints


def test_key_fields_other_than_the_grouping_fields_are_refused() -> None:
    b = TopologyBuilder("scale-mismatch")
    b.spout("src", Words(10))
    b.bolt("count", Count(), parallelism=2).fields("src", "pad")
    with pytest.raises(ConfigError, match=r"grouped on \['pad'\] but its key_fields are \['word'\]"):
        LocalEngine(b.build(), adaptive(**{"backpressure.adaptive.autoscale": "true"}))
    assert LocalEngine(b.build(), adaptive()).scalable == frozenset()


# --- document 004's rule carried out by the adaptive driver, real clock ------------------
class Load(Shared):
    def __init__(self, offered: float, per_task: float | None) -> None:
        self.offered = offered          # words/s the spout offers
        self.per_task = per_task        # words/s each counting task manages (None: no limit)
        self.emitted: Tally[str] = Tally()
        self.n = 0


class OfferedWords(Spout):
    """Offers ``load.offered`` words/s on a schedule (a source, not a backlog)."""

    outputs = ["word", "pad"]

    def __init__(self, load: Load) -> None:
        self.load, self.pad = load, "x" * 100
        self.t0: float | None = None
        self.base = 0

    async def next_tuple(self) -> None:
        load = self.load
        now = asyncio.get_running_loop().time()
        if self.t0 is None:
            self.t0 = now
        due = int((now - self.t0) * load.offered) - (load.n - self.base)
        if due <= 0:
            await asyncio.sleep(0.001)
            return
        if due > 256:                   # throttled: never build up more than one call's catch-up
            self.t0, self.base, due = now, load.n, 256
        for _ in range(due):
            w = WORDS[load.n % len(WORDS)]
            self.collector.emit([w, self.pad])
            load.emitted[w] += 1
            load.n += 1

    def set_offered(self, rate: float) -> None:
        self.t0, self.base = None, self.load.n
        self.load.offered = rate


class PacedCount(Count):
    """Counts like ``Count`` at no more than ``load.per_task`` words/s per task."""

    def __init__(self, load: Load) -> None:
        self.load, self.k = load, 0

    async def execute(self, tup: Tuple) -> None:   # type: ignore[override]
        KeyedBolt.execute(self, tup)
        self.k += 1
        rate = self.load.per_task
        if rate and self.k % 20 == 0:
            await asyncio.sleep(20 / rate)


@pytest.mark.slow
async def test_adaptive_scales_a_keyed_count_from_2_to_3_under_load_and_back_with_exact_counts() -> None:
    load = Load(offered=20_000.0, per_task=400.0)
    b = TopologyBuilder("autoscale-e2e")
    b.spout("src", OfferedWords(load))
    b.bolt("count", PacedCount(load), parallelism=2).fields("src", "word")
    cfg = config(**{"backpressure.policy": "adaptive", "queue.high_mark": "50KB", "queue.low_mark": "5KB",
                    "queue.hard_bound": "100KB", "backpressure.adaptive.window_ms": 1000,
                    "backpressure.adaptive.samples": 10, "backpressure.adaptive.check_interval_ms": 100,
                    "backpressure.adaptive.max_parallelism": 3, "backpressure.adaptive.cooldown_ms": 2000})
    engine = LocalEngine(b.build(), cfg)
    fc = engine.flow
    watcher, peak = watch_peak(engine)
    run = asyncio.create_task(engine.run())
    t0 = asyncio.get_running_loop().time()
    try:
        await until(lambda: len(engine.task_ids["count"]) == 3, 40, what="a third counting task")
        t_out = asyncio.get_running_loop().time() - t0
        assert fc.counters["scale_out"] >= 1 and fc.counters["scale_applied"] >= 1  # type: ignore[attr-defined]
        out = fc.decisions[0]                                                      # type: ignore[attr-defined]
        assert (out.kind, out.component, out.parallelism) == ("scale_out", "count", 3)
        added = engine.bolt_tasks[-1]
        assert added.task_id == engine.task_ids["count"][-1], fc.decisions  # type: ignore[attr-defined]
        await until(lambda: added.stats.executed > 200, 20, what="the new task counting")
        # The load goes away: the spout offers little, the tasks are fast.
        load.per_task = None
        next(t for t in engine.spout_tasks).spout.set_offered(1_000.0)   # type: ignore[attr-defined]
        t1 = asyncio.get_running_loop().time()
        await until(lambda: len(engine.task_ids["count"]) == 2, 40, what="scale in back to 2 tasks")
        t_in = asyncio.get_running_loop().time() - t1
        assert fc.decisions[-1].kind == "scale_in"                                  # type: ignore[attr-defined]
        await until(lambda: all(rc.coefficient == 1.0 for rc in fc.coefficients.values()), 20,  # type: ignore
                    what="every upstream back at coefficient 1.0")
        src = engine.spout_tasks[0]
        await until(lambda: src.limiter.rate is None, 20, what="the spout's limiter off")
    finally:
        engine.request_stop()
        await asyncio.wait_for(run, 60)
        watcher.cancel()
    totals, holder = keyed_totals(engine, "count")
    out_ms = [ms for what, _, n, ms in engine.rescales if what == "add"]
    print(f"autoscaling: 2 -> 3 tasks {t_out:.1f} s into the overload (drained in {out_ms[0]:.0f} ms), "
          f"back to 2 {t_in:.1f} s after the load went (cool-down 2 s); {sum(totals.values())} words, "
          f"{len(holder)} keys, counts exact: {totals == load.emitted}")
    assert sum(load.emitted.values()) > 2_000
    assert totals == load.emitted, "a word was lost or counted twice across the rescales"
    assert peak[0] <= cfg["queue.hard_bound"]
