"""The Python API: builder validation, groupings and the rate limiter seam."""
from __future__ import annotations

import random

import pytest

from topo.api import Bolt, FieldIndex, Spout
from topo.groupings import FieldsGrouping, LoadAwareGrouping, ShuffleGrouping
from topo.topology import TopologyBuilder, TopologyError
from runtime.local.ratelimit import EwmaRate, RateLimiter


class S(Spout):
    outputs = ["word", "n"]

    def next_tuple(self):
        pass


class B(Bolt):
    outputs = ["word"]

    def execute(self, tup):
        pass


def _errors(build) -> str:
    with pytest.raises(TopologyError) as e:
        build()
    return str(e.value)


def test_unknown_input_component():
    b = TopologyBuilder("t")
    b.spout("s", S())
    b.bolt("b", B()).shuffle("nope")
    assert "bolt 'b' reads from unknown component 'nope'" in _errors(b.build)


def test_fields_grouping_on_an_undeclared_field():
    b = TopologyBuilder("t")
    b.spout("s", S())
    b.bolt("b", B()).fields("s", "colour")
    assert "fields grouping on 'colour' but the upstream declares ['word', 'n']" in _errors(b.build)


def test_undeclared_stream():
    b = TopologyBuilder("t")
    b.spout("s", S())
    b.bolt("b", B()).shuffle("s", stream="errors")
    assert "reads stream 'errors' that 's' does not declare" in _errors(b.build)


def test_parallelism_below_one_and_duplicate_ids():
    b = TopologyBuilder("t")
    b.spout("s", S(), parallelism=0)
    b.bolt("s", B()).shuffle("s")
    msg = _errors(b.build)
    assert "duplicate component id 's'" in msg
    assert "parallelism must be an integer >= 1, got 0" in msg


def test_cycle_is_rejected_with_the_reason():
    b = TopologyBuilder("t")
    b.spout("s", S())
    b.bolt("a", B()).shuffle("s").shuffle("c")
    b.bolt("c", B()).shuffle("a")
    msg = _errors(b.build)
    assert "cycle" in msg and "STORM-3637" in msg


def test_a_bolt_where_a_spout_is_expected():
    with pytest.raises(TopologyError, match="is not a Spout"):
        TopologyBuilder("t").spout("s", B())


def test_shuffle_spreads_evenly():
    r = ShuffleGrouping().router([1, 2, 3], FieldIndex.of(["x"]), rng=random.Random(1))
    picks = [r.select([i]) for i in range(300)]
    assert sorted(picks.count(i) for i in range(3)) == [100, 100, 100]


def test_fields_grouping_is_stable_across_router_instances():
    fi = FieldIndex.of(["word", "n"])
    a = FieldsGrouping(["word"]).router([10, 11, 12, 13], fi, rng=random.Random(1))
    b = FieldsGrouping(["word"]).router([10, 11, 12, 13], fi, rng=random.Random(2))
    assert all(a.select([w, 1]) == b.select([w, 2]) for w in ("a", "b", "zeta", "x" * 50))


class Levels:
    def __init__(self, levels: dict[int, float]) -> None:
        self.levels = levels

    def water_level(self, task_id: int) -> float:
        return self.levels[task_id]


def test_load_aware_prefers_the_emptier_queue():
    load = Levels({1: 0.9, 2: 0.1, 3: 0.5})
    r = LoadAwareGrouping().router([1, 2, 3], FieldIndex.of(["x"]), rng=random.Random(7), load=load)
    picks = [r.targets[r.select([0])] for _ in range(3000)]
    # Two random choices: the fullest task never wins a draw, the emptiest always does.
    assert picks.count(1) == 0
    assert picks.count(2) > picks.count(3) > 0


class FakeClock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_rate_limiter_is_off_until_set_and_paces_exactly():
    clock = FakeClock()
    lim = RateLimiter(clock, burst_s=0.0)
    assert lim.reserve(1000) == 0.0  # off: no waiting at all
    lim.set_rate(100.0)
    assert lim.reserve(10) == pytest.approx(0.1)  # 10 tuples at 100/s are due 0.1 s on
    clock.t += 0.1
    assert lim.reserve(10) == pytest.approx(0.1)
    clock.t += 1.0  # idle for a second: no credit beyond the burst allowance
    assert lim.reserve(10) == pytest.approx(0.1)
    lim.clear_rate()
    assert lim.reserve(10**6) == 0.0


def test_rate_limiter_counts_only_the_emits_its_limit_made_wait():
    clock = FakeClock()
    lim = RateLimiter(clock, burst_s=0.01)
    lim.reserve(1000)
    assert lim.waits == 0                 # off: nothing binds
    lim.set_rate(100.0)
    lim.reserve(1)                        # within the 10 ms of credit: no wait
    assert lim.waits == 0
    assert lim.reserve(1) > 0 and lim.waits == 1     # due 10 ms on: the limit binds
    clock.t += 1.0                        # emitting far under the limit: never waits
    for _ in range(5):
        assert lim.reserve(1) == 0.0
        clock.t += 0.05
    assert lim.waits == 1


def test_rate_limiter_rejects_nonsense_rates():
    for bad in (0, -1, float("inf"), float("nan")):
        with pytest.raises(ValueError):
            RateLimiter().set_rate(bad)


def test_ewma_rate_is_unbiased_from_the_first_interval():
    ewma = EwmaRate(tau_s=2.0)
    ewma.sample(0, 10.0)
    assert ewma.sample(5_000, 10.25) == pytest.approx(20_000)  # not 20,000 * (1 - e**-0.125)
    assert ewma.sample(10_000, 10.5) == pytest.approx(20_000)


def test_ewma_rate_converges_to_a_steady_rate():
    ewma = EwmaRate(tau_s=1.0)
    total = 0
    for step in range(40):
        ewma.sample(total, step * 0.25)
        total += 250  # 1000 per second
    assert ewma.value == pytest.approx(1000, rel=0.01)
