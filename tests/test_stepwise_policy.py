"""Document 000's steps 1-15 on the pure policy, with a fake clock."""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable

import pytest

from backpressure.policy.stepwise import (LIGHT, MIN_RECENT_TUPLES, NORMAL, OVERLOADED, Downstream, PeerStates,
                                          Recent, StepwiseParams, Throttle, UpstreamView, max_steps)
from backpressure.signals import BACKPRESSURE, RELEASE, Signal, SignalError, TaskState

P = StepwiseParams(step=0.5, high_mark=50_000_000, low_mark=500_000, sensitivity=2.0, rate_floor=1.0)
HIGH, LOW, MID = 50_000_000, 500_000, 10_000_000


def view_of(th: Throttle) -> UpstreamView:
    """What a downstream on the same clock sees of ``th`` (its published state, delivered at once)."""
    return UpstreamView(th.k, th.at_floor, dict(th.applied), dict(th.holds), th.stepped_at, th.stepped_by)


class World:
    """Downstreams and throttles wired directly: a signal is applied and acknowledged at once."""

    def __init__(self, params: StepwiseParams = P, rates: dict[int, float] | None = None) -> None:
        self.params = params
        self.rates = rates or {}
        self.throttles: dict[int, Throttle] = {}
        self.sent: list[Signal] = []
        self.recent: dict[int, Recent] = {}     # what each upstream emitted just now (step_from_recent_rate)

    def throttle(self, u: int) -> Throttle:
        return self.throttles.setdefault(u, Throttle(u, self.params))

    def view(self, u: int) -> UpstreamView:
        th = self.throttle(u)
        return view_of(th)

    def check(self, d: Downstream, now: float, q: int, deliver: bool = True) -> list[Signal]:
        """Observe and check at once (a check forced at ``now``)."""
        d.observe(now, q)
        return self.check_due(d, now, q, deliver)

    def check_due(self, d: Downstream, now: float, q: int, deliver: bool = True) -> list[Signal]:
        out = d.check(now, q, self.view)
        self.sent += out
        if deliver:
            self.deliver(out, now)
        return out

    def deliver(self, sigs: list[Signal], now: float) -> None:
        for s in sigs:
            self.throttle(s.target).on_signal(s, self.rates.get(s.target, 20_000.0), now, self.recent.get(s.target))


# -- step 3-8: overload steps each direct upstream down by v' -------------------------------------

def test_overload_steps_every_direct_upstream_down_once_and_records_originv() -> None:
    w = World(rates={1: 20_000.0, 2: 8_000.0})
    d = Downstream(10, [1, 2], P, now=0.0)
    sigs = w.check(d, 0.0, HIGH)
    assert [(s.kind, s.target, s.source, s.k) for s in sigs] == [(BACKPRESSURE, 1, 10, 1), (BACKPRESSURE, 2, 10, 1)]
    assert d.level == OVERLOADED
    assert w.throttles[1].rate == 10_000.0 and w.throttles[1].originv == 20_000.0
    assert w.throttles[2].rate == 4_000.0 and w.throttles[2].originv == 8_000.0
    assert w.throttles[1].backpressure and w.throttles[2].backpressure


def test_originv_is_recorded_on_the_first_step_only() -> None:
    w = World(rates={1: 20_000.0})
    d = Downstream(10, [1], P, now=0.0)
    w.check(d, 0.0, HIGH)
    w.rates[1] = 9_999.0              # the observed rate falls once throttled
    w.check(d, 2.0, HIGH)
    assert w.throttles[1].originv == 20_000.0
    assert w.throttles[1].k == 2 and w.throttles[1].rate == 5_000.0


def test_queue_exactly_at_high_mark_is_overloaded_and_just_under_is_not() -> None:
    w = World()
    assert w.check(Downstream(10, [1], P, 0.0), 0.0, HIGH) != []
    assert w.check(Downstream(11, [2], P, 0.0), 0.0, HIGH - 1) == []


def test_only_direct_upstreams_are_signalled() -> None:
    # spout 1 -> bolt 2 -> bolt 3: bolt 3 overloaded steps bolt 2, never the spout.
    w = World()
    sigs = w.check(Downstream(3, [2], P, 0.0), 0.0, HIGH)
    assert {s.target for s in sigs} == {2}
    assert 1 not in w.throttles


# -- step 6: an upstream mid-step is not stepped again -------------------------------------------

def test_upstream_mid_step_is_not_stepped_twice() -> None:
    w = World()
    d = Downstream(10, [1], P, now=0.0)
    first = w.check(d, 0.0, HIGH, deliver=False)      # signalled, not yet applied
    assert len(first) == 1 and d.mid_step(1)
    assert w.check(d, 2.0, HIGH, deliver=False) == []  # still unacknowledged: no second step
    assert w.check(d, 3.9, HIGH, deliver=False) == []
    # now the upstream applies and acknowledges it
    w.throttle(1).on_signal(first[0], 20_000.0, 6.0)
    again = w.check(d, 6.0, HIGH)
    assert [s.k for s in again] == [2]
    assert w.throttles[1].k == 2


def test_no_further_step_while_the_backlog_falls_over_the_high_mark() -> None:
    w = World()
    d = Downstream(10, [1], P, now=0.0)
    assert [s.k for s in w.check(d, 0.0, HIGH + 10_000_000)] == [1]
    # Still over the high mark but lower than at the last check: the step is working.
    assert w.check(d, 2.0, HIGH + 5_000_000) == []
    assert w.check(d, 4.0, HIGH + 1_000_000) == []
    assert w.throttles[1].k == 1
    # It stopped falling: one more step.
    assert [s.k for s in w.check(d, 6.0, HIGH + 1_000_000)] == [2]
    assert w.check(d, 8.0, HIGH + 500_000) == []
    assert [s.k for s in w.check(d, 10.0, HIGH + 900_000)] == [3]


def test_unacknowledged_signal_is_resent_unchanged_after_resend_after() -> None:
    w = World()
    d = Downstream(10, [1], P, now=0.0)
    (first,) = w.check(d, 0.0, HIGH, deliver=False)
    assert w.check(d, 2.0, HIGH, deliver=False) == []
    (resent,) = w.check(d, 4.0, HIGH, deliver=False)        # resend_after = 2 x sensitivity
    assert resent == first
    th = w.throttle(1)
    th.on_signal(first, 100.0, 4.0)
    assert th.on_signal(resent, 100.0, 4.0) is None              # the duplicate changes nothing
    assert th.k == 1


def test_two_downstreams_overloaded_in_the_same_round_step_the_upstream_once() -> None:
    w = World()
    a, b = Downstream(10, [1], P, 0.0), Downstream(11, [1], P, 0.0)
    sa = w.check(a, 0.0, HIGH, deliver=False)
    sb = w.check(b, 0.0, HIGH, deliver=False)
    th = w.throttle(1)
    for s in sa + sb:
        th.on_signal(s, 20_000.0, 0.0)
    assert th.k == 1 and th.rate == 10_000.0


# -- checks at most once per sensitivity ----------------------------------------------------------

def test_checks_are_at_most_once_per_sensitivity_while_overloaded() -> None:
    d = Downstream(10, [1], P, now=0.0)
    assert d.observe(0.0, HIGH)            # crossing after a non-overloaded check: at once
    d.check(0.0, HIGH, lambda u: None)
    assert not d.observe(0.5, HIGH)
    assert not d.observe(1.999, HIGH)
    assert d.observe(2.0, HIGH)


def test_a_fresh_crossing_is_checked_at_once() -> None:
    d = Downstream(10, [1], P, now=0.0)
    d.check(0.0, MID, lambda u: None)
    assert d.level == NORMAL
    assert not d.observe(0.1, MID)
    assert d.observe(0.2, HIGH)


# -- steps 9-15: release after the low mark held for sensitivity ----------------------------------

def test_no_release_before_the_low_mark_has_held_for_the_whole_sensitivity() -> None:
    w = World()
    d = Downstream(10, [1], P, now=0.0)
    w.check(d, 0.0, HIGH)
    assert w.check(d, 2.0, LOW) == []          # low since 2.0
    assert w.check(d, 3.999, LOW) == []
    d.observe(3.0, LOW + 1)                    # one observation over the low mark resets the window
    assert w.check(d, 4.0, LOW) == []          # low since 4.0 again
    assert w.check(d, 5.999, LOW) == []
    (rel,) = w.check(d, 6.0, LOW)
    assert (rel.kind, rel.k) == (RELEASE, 0)
    assert d.level == LIGHT
    assert w.throttles[1].rate is None and not w.throttles[1].backpressure


def test_between_the_marks_nothing_is_sent() -> None:
    w = World()
    d = Downstream(10, [1], P, now=0.0)
    w.check(d, 0.0, HIGH)
    for t in range(1, 20):
        assert w.check(d, 2.0 * t, MID) == []
    assert w.throttles[1].k == 1


def test_release_steps_up_by_one_over_v_prime_each_light_window() -> None:
    w = World(rates={1: 20_000.0})
    d = Downstream(10, [1], P, now=0.0)
    for i in range(3):
        w.check(d, 2.0 * i, HIGH)
    th = w.throttles[1]
    assert th.k == 3 and th.rate == 2_500.0
    rates = []
    t = 10.0
    d.observe(t, LOW)
    while th.backpressure:
        t += 0.5
        w.check(d, t, LOW)
        rates.append(th.rate)
    assert rates == [2_500.0, 2_500.0, 2_500.0, 5_000.0, 5_000.0, 5_000.0, 5_000.0, 10_000.0,
                     10_000.0, 10_000.0, 10_000.0, None]


@pytest.mark.parametrize("step", [0.5, 0.3, 0.7, 0.9, 1 / 3])
@pytest.mark.parametrize("originv", [20_000.0, 12_345.678, 1e6 / 7, 3.0])
def test_n_steps_down_then_n_up_returns_exactly_originv(step: float, originv: float) -> None:
    params = StepwiseParams(step=step, high_mark=HIGH, low_mark=LOW, sensitivity=2.0, rate_floor=1e-9)
    w = World(params, rates={1: originv})
    d = Downstream(10, [1], params, now=0.0)
    seen = []
    t = 0.0
    for _ in range(12):
        w.check(d, t, HIGH)
        seen.append(w.throttles[1].rate)
        t += 2.0
    th = w.throttles[1]
    assert th.k == 12
    up = []
    d.observe(t, LOW)
    while th.k > 0:
        t += 2.0
        w.check(d, t, LOW)
        up.append(th.nominal_rate)
    # On the way back each rate is bit-identical to the one on the way down.
    assert up[:-1] == list(reversed(seen[:-1]))
    assert th.k == 0 and th.rate is None and not th.backpressure
    restored = originv * step ** 0
    assert restored == originv                     # ==, not approx
    assert up[-1] == originv


# -- several downstreams ------------------------------------------------------------------------

def test_upstream_is_not_released_while_any_downstream_still_holds_it() -> None:
    w = World(rates={1: 16_000.0})
    a, b = Downstream(10, [1], P, 0.0), Downstream(11, [1], P, 0.0)
    w.check(a, 0.0, HIGH)                # a: 1
    w.check(b, 2.0, HIGH)                # b: 1 more, a sensitivity later
    th = w.throttles[1]
    assert th.holds == {10: 1, 11: 1} and th.k == 2
    w.check(b, 4.0, LOW)
    w.check(b, 6.0, LOW)                 # b releases the step it caused; a still holds one
    assert th.holds == {10: 1} and th.k == 1 and th.rate == 8_000.0 and th.backpressure
    w.check(b, 8.0, LOW)
    w.check(b, 10.0, LOW)                # b holds nothing: sends nothing
    assert th.k == 1
    w.check(a, 10.0, LOW)
    w.check(a, 12.0, LOW)
    assert th.k == 0 and th.rate is None and not th.backpressure


def test_a_light_downstream_does_not_release_steps_it_does_not_hold() -> None:
    w = World()
    a, b = Downstream(10, [1], P, 0.0), Downstream(11, [1], P, 0.0)
    w.check(a, 0.0, HIGH)
    w.check(b, 0.0, LOW)
    assert w.check(b, 2.0, LOW) == []
    assert w.throttles[1].k == 1


def test_a_step_on_top_of_another_downstreams_hold_goes_one_below_the_current_rate() -> None:
    w = World(rates={1: 16_000.0})
    a, b = Downstream(10, [1], P, 0.0), Downstream(11, [1], P, 0.0)
    for i in range(3):
        w.check(a, 2.0 * i, HIGH)
    assert w.throttles[1].k == 3
    (s,) = w.check(b, 6.0, HIGH)
    assert s.k == 1 and w.throttles[1].k == 4 and w.throttles[1].rate == 1_000.0


def test_gone_downstream_releases_its_hold() -> None:
    w = World()
    a, b = Downstream(10, [1], P, 0.0), Downstream(11, [1], P, 0.0)
    w.check(a, 0.0, HIGH)
    w.check(b, 2.0, HIGH)
    th = w.throttles[1]
    assert th.forget(11, 0.0, 2.0) is not None and th.k == 1
    assert th.forget(10, 0.0, 2.0) is not None and th.k == 0 and th.rate is None


def test_release_all_lets_go_of_every_hold() -> None:
    w = World()
    d = Downstream(10, [1, 2], P, 0.0)
    w.check(d, 0.0, HIGH)
    sigs = d.release_all(1.0)
    assert {(s.target, s.k, s.kind) for s in sigs} == {(1, 0, RELEASE), (2, 0, RELEASE)}
    for s in sigs:
        w.throttle(s.target).on_signal(s, 0.0, 1.0)
    assert all(th.k == 0 and th.rate is None for th in w.throttles.values())


# -- idempotence, ordering, reconciliation ---------------------------------------------------------

def test_duplicate_and_reordered_signals_change_nothing() -> None:
    th = Throttle(1, P)
    s1 = Signal(BACKPRESSURE, 1, 10, 1, 5, 0.0)
    s2 = Signal(BACKPRESSURE, 1, 10, 2, 6, 2.0)
    assert th.on_signal(s2, 100.0, 0.0) is not None
    assert th.on_signal(s1, 100.0, 0.0) is None       # older: ignored
    assert th.on_signal(s2, 100.0, 0.0) is None       # duplicate: ignored
    assert th.k == 1 and th.holds == {10: 1}          # one step per request, whatever it asks


def test_signal_for_another_task_is_not_applied() -> None:
    th = Throttle(1, P)
    assert th.on_signal(Signal(BACKPRESSURE, 2, 10, 1, 1, 0.0), 100.0, 0.0) is None
    assert th.k == 0


def test_lost_release_is_repaired_by_the_downstreams_state() -> None:
    th = Throttle(1, P)
    th.on_signal(Signal(BACKPRESSURE, 1, 10, 1, 1, 0.0), 100.0, 0.0)
    # the RELEASE (seq 2) is lost; the downstream's next state says it holds nothing as of seq 2
    change = th.reconcile(10, 0, 0, 2, 100.0, 1.0)
    assert change is not None and change.rate is None and th.k == 0
    assert th.applied[10] == (0, 2)
    # the lost message shows up late: stale, ignored
    assert th.on_signal(Signal(RELEASE, 1, 10, 0, 2, 1.0), 100.0, 0.0) is None


def test_older_state_does_not_undo_a_newer_signal() -> None:
    th = Throttle(1, P)
    th.on_signal(Signal(BACKPRESSURE, 1, 10, 1, 7, 0.0), 100.0, 0.0)
    assert th.reconcile(10, 0, 0, 6, 100.0, 1.0) is None
    assert th.k == 1


def test_acknowledgement_through_reconcile_ends_mid_step() -> None:
    d = Downstream(10, [1], P, 0.0)
    th = Throttle(1, P)
    (s,) = d.check(0.0, HIGH, lambda u: None)
    th.reconcile(10, d.wants[1], d.run, d.seq, 100.0, 0.0)            # the signal was lost, the state arrived
    assert (d.run, s.seq) == th.applied[10] and th.k == 1
    (s2,) = d.check(2.0, HIGH, lambda u: view_of(th))
    assert s2.k == 2                      # acknowledged, so the next step went out
    th.on_signal(s2, 100.0, 0.0)
    assert th.k == 2


# -- the rate floor -----------------------------------------------------------------------------

def test_rate_floor_stops_the_steps() -> None:
    params = StepwiseParams(step=0.5, high_mark=HIGH, low_mark=LOW, sensitivity=2.0, rate_floor=100.0)
    w = World(params, rates={1: 1_000.0})
    d = Downstream(10, [1], params, 0.0)
    for i in range(10):
        w.check(d, 2.0 * i, HIGH)
    th = w.throttles[1]
    assert th.k == 3 and th.rate == 125.0 and th.at_floor
    assert th.rate >= 100.0
    assert d.holds[1] == 3                      # it stopped asking at the floor
    t = 20.0
    d.observe(t, LOW)
    while th.backpressure:
        t += 2.0
        w.check(d, t, LOW)
    assert t == 26.0 and th.rate is None       # three steps back up


def test_upstream_already_under_the_floor_cannot_be_stepped() -> None:
    params = StepwiseParams(step=0.5, high_mark=HIGH, low_mark=LOW, sensitivity=2.0, rate_floor=100.0)
    th = Throttle(1, params)
    assert th.on_signal(Signal(BACKPRESSURE, 1, 10, 1, 1, 0.0), 50.0, 0.0) is None
    # It waits (holding the request) instead of publishing at_floor: see the step-7 test below.
    assert th.k == 0 and th.rate is None and not th.at_floor and not th.backpressure and th.holds == {10: 1}
    assert th.on_signal(Signal(RELEASE, 1, 10, 0, 2, 1.0), 50.0, 1.0) is None
    assert not th.at_floor and not th.in_episode and th.holds == {}


def test_max_steps() -> None:
    assert max_steps(1000.0, 0.5, 100.0) == 3
    assert max_steps(99.0, 0.5, 100.0) == 0
    assert max_steps(100.0, 0.5, 100.0) == 0
    assert max_steps(200.0, 0.5, 100.0) == 1


def test_params_validation_and_config() -> None:
    with pytest.raises(ValueError):
        StepwiseParams(step=1.0)
    with pytest.raises(ValueError):
        StepwiseParams(high_mark=10, low_mark=10)
    from topo.config import resolve

    p = StepwiseParams.from_config(resolve({"backpressure.step": 0.25, "backpressure.sensitivity_ms": 500}))
    assert p.step == 0.25 and p.sensitivity == 0.5 and p.high_mark == 50_000_000 and p.low_mark == 500_000


# -- the records --------------------------------------------------------------------------------

def test_signal_and_state_round_trip() -> None:
    s = Signal(BACKPRESSURE, 3, 7, 2, 99, 1.5)
    assert Signal.decode(s.encode()) == s
    st = TaskState(task=3, component="spout", spout=True, rate=5000.0, originv=20000.0, k=2,
                   backpressure=True, queue_bytes=12, high_mark=HIGH, low_mark=LOW,
                   holds={1: 2}, seq=4, applied={7: (3, 99)}, granted={7: 2}, step_age=0.25,
                   stepped_by=7, version=(5, 6), ts=1.0, dry=True)
    assert TaskState.decode(st.encode()) == st


@pytest.mark.parametrize("payload", [
    b"", b"\xc1", b"not msgpack at all", b"\x93\x01\x02\x03",
    Signal(BACKPRESSURE, 3, 7, 2, 99, 1.5).encode()[:-3],
    b"\x86\xa6signal\xa4NOPE\xa6target\x01\xa6source\x02\xa1k\x01\xa3seq\x01\xa2ts\x00",
    b"\x86\xa6signal\xacBACKPRESSURE\xa6target\xc3\xa6source\x02\xa1k\x01\xa3seq\x01\xa2ts\x00",
    b"\x86\xa6signal\xacBACKPRESSURE\xa6target\x01\xa6source\x02\xa1k\xff\xa3seq\x01\xa2ts\x00",
    b"\x00" * 70_000,
])
def test_malformed_signal_payloads_raise_signal_error(payload: bytes) -> None:
    with pytest.raises(SignalError):
        Signal.decode(payload)


def test_state_decode_is_bounded() -> None:
    st = TaskState(task=1, holds={i: 1 for i in range(5000)})
    with pytest.raises(SignalError):
        TaskState.decode(st.encode())


def test_an_unmeasured_upstream_waits_for_a_rate_instead_of_pinning_originv_to_zero() -> None:
    th = Throttle(1, P)
    assert th.on_signal(Signal(BACKPRESSURE, 1, 10, 1, 1, 0.0), 0.0, 0.0) is None
    assert th.k == 0 and not th.at_floor and not th.in_episode and th.holds == {10: 1}
    assert th.refresh(0.0, 0.5) is None
    change = th.refresh(6_000.0, 1.0)
    assert change is not None and change.rate == 3_000.0 and th.originv == 6_000.0


def test_overloaded_downstream_re_asks_the_same_hold_while_the_upstream_has_not_reached_it() -> None:
    d = Downstream(10, [1], P, 0.0)
    th = Throttle(1, P)
    (s1,) = d.check(0.0, HIGH, lambda u: None)
    th.on_signal(s1, 0.0, 0.0)                       # acknowledged, but no rate yet: k stays 0
    view = lambda u: UpstreamView(th.k, th.at_floor, th.applied)  # noqa: E731
    (s2,) = d.check(2.0, HIGH, view)
    assert s2.k == 1 and s2.seq > s1.seq


# -- published states: ordering, the repair path, forgetting after grace (PeerStates) -----------

def _peers(grace: float = 4.0) -> tuple[PeerStates, Throttle]:
    spout = Throttle(1, P)
    return PeerStates({1: spout}, grace), spout


def _held(task: int, k: int, seq: int, version: int) -> TaskState:
    return TaskState(task=task, holds={1: k} if k else {}, seq=seq, version=(1, version))


def test_a_published_hold_repairs_a_lost_signal_and_an_older_version_is_ignored() -> None:
    peers, spout = _peers()
    out = peers.update(2, _held(2, 1, seq=5, version=2), 0.0, lambda t: 20_000.0)
    assert [(t, c.rate) for t, c in out.changes] == [(1, 10_000.0)] and spout.k == 1
    # a record published before that one, arriving late (a reconnect), changes nothing
    out = peers.update(2, _held(2, 0, seq=4, version=1), 0.1, lambda t: 20_000.0)
    assert out.changes == [] and out.acknowledged == [] and spout.k == 1
    assert peers.view(2) is not None and peers.alive(2)


def test_a_newer_seq_with_the_same_hold_is_an_acknowledgement_only() -> None:
    peers, spout = _peers()
    peers.update(2, _held(2, 1, seq=5, version=1), 0.0, lambda t: 20_000.0)
    out = peers.update(2, _held(2, 1, seq=6, version=2), 0.5, lambda t: 20_000.0)
    assert out.changes == [] and out.acknowledged == [1] and spout.applied[2] == (1, 6)


def test_a_state_gone_for_grace_releases_what_it_held_and_one_back_in_time_does_not() -> None:
    peers, spout = _peers(grace=4.0)
    peers.update(2, _held(2, 1, seq=5, version=1), 0.0, lambda t: 20_000.0)
    assert spout.k == 1
    peers.update(2, None, 1.0, lambda t: 20_000.0)           # session expiry: the znode vanished
    assert not peers.alive(2)
    assert peers.expire(4.9, lambda t: 20_000.0).changes == []   # 3.9 s gone: within grace
    peers.update(2, _held(2, 1, seq=5, version=2), 4.95, lambda t: 20_000.0)   # re-published
    assert peers.expire(100.0, lambda t: 20_000.0).changes == [] and spout.k == 1
    peers.update(2, None, 200.0, lambda t: 20_000.0)         # gone for good this time
    assert peers.expire(203.9, lambda t: 20_000.0).changes == []
    out = peers.expire(204.0, lambda t: 20_000.0)             # exactly grace: forgotten
    assert [(t, c.rate) for t, c in out.changes] == [(1, None)] and spout.k == 0 and not spout.holds


def test_our_own_tasks_are_never_forgotten_when_their_state_vanishes() -> None:
    peers, spout = _peers(grace=1.0)
    peers.update(1, None, 0.0, lambda t: 20_000.0)
    assert peers.expire(10.0, lambda t: 20_000.0).changes == [] and peers.alive(1)


# -- defects of issue 10, each named after the rule it checks ------------------------------------

def tick(w: World, d: Downstream, now: float, q: int) -> list[Signal]:
    """One observation; the check runs only when ``observe`` says it is due (as the driver does)."""
    if d.observe(now, q):
        return w.check_due(d, now, q)
    return []


def test_step6_siblings_of_one_component_cost_one_step_per_sensitivity_window() -> None:
    w = World(rates={1: 16_000.0})
    sibs = [Downstream(10 + i, [1], P, now=0.0) for i in range(4)]
    t = 0.0
    while t < 3.9:                     # tasks cross the high mark 0.3 s apart and stay over it
        for i, d in enumerate(sibs):
            if t >= 0.3 * i:
                tick(w, d, t, HIGH)
        t = round(t + 0.05, 2)
    # One step at the first crossing, one more a sensitivity later, never one per sibling.
    assert w.throttles[1].k == 2, w.throttles[1].holds


def test_step12_a_light_task_releases_the_steps_it_caused_even_if_a_sibling_added_one() -> None:
    w = World(rates={1: 16_000.0})
    a, b = Downstream(10, [1], P, 0.0), Downstream(11, [1], P, 0.0)
    for i in range(3):
        w.check(a, 2.0 * i, HIGH)                  # a causes three steps
    assert w.throttles[1].k == 3
    w.check(b, 6.0, HIGH)                          # b overloads briefly: one more step
    assert w.throttles[1].k == 4
    t = 6.0
    while t < 14.5:                                # b stays between the marks, a goes idle
        t = round(t + 0.05, 2)
        tick(w, a, t, 0)
        tick(w, b, t, MID)
    assert w.throttles[1].k == 1                   # a released its three, b keeps its one


def test_step9_release_exactly_sensitivity_after_the_low_mark_was_first_held() -> None:
    w = World()
    d = Downstream(10, [1], P, now=0.0)
    w.check(d, 0.0, HIGH)
    released = []
    t = 0.0
    while t < 6.0:                  # a 3 s light spell starting between two checks
        t = round(t + 0.05, 2)
        q = LOW if 0.1 <= t < 3.1 else MID
        released += [(t, s) for s in tick(w, d, t, q) if s.kind == RELEASE]
    assert [t for t, _ in released] == [2.1]
    assert w.throttles[1].k == 0


def test_step7_an_upstream_slow_at_the_first_signal_is_still_throttled_once_it_runs() -> None:
    params = StepwiseParams(step=0.5, high_mark=HIGH, low_mark=LOW, sensitivity=2.0, rate_floor=100.0)
    w = World(params, rates={1: 150.0})          # still starting: under floor / v'
    d = Downstream(10, [1], params, 0.0)
    w.check(d, 0.0, HIGH)
    assert not w.throttles[1].at_floor
    w.rates[1] = 20_000.0                         # now it runs at full speed
    for i in range(1, 3):
        w.check(d, 2.0 * i, HIGH)
    th = w.throttles[1]
    assert th.k >= 1 and th.originv == 20_000.0 and th.rate is not None and th.rate <= 10_000.0


def test_fast_reaction_is_not_spent_by_a_check_blocked_on_an_unacknowledged_release() -> None:
    w = World()
    d = Downstream(10, [1], P, now=0.0)
    w.check(d, 0.0, HIGH)
    t, rel = 0.0, []
    while not rel:                                # light until the release goes out
        t = round(t + 0.05, 2)
        rel = [s for s in (w.check_due(d, t, 0, deliver=False) if d.observe(t, 0) else [])]
    t_rel = t
    t = round(t + 0.05, 2)
    assert tick(w, d, t, HIGH) == []             # overloaded, but the release is not acknowledged yet
    w.deliver(rel, t)                             # the acknowledgement arrives
    t = round(t + 0.05, 2)
    out = tick(w, d, t, HIGH)
    assert [s.kind for s in out] == [BACKPRESSURE], (t_rel, t)


def test_originv_of_a_new_episode_is_the_rate_before_it_not_a_lagging_ewma() -> None:
    w = World(rates={1: 20_000.0})
    d = Downstream(10, [1], P, 0.0)
    w.check(d, 0.0, HIGH)
    w.check(d, 2.0, HIGH)
    assert w.throttles[1].rate == 5_000.0
    t = 2.0
    while w.throttles[1].k:
        t = round(t + 0.05, 2)
        tick(w, d, t, 0)
    assert w.throttles[1].rate is None and w.throttles[1].nominal_rate == 20_000.0
    w.rates[1] = 7_000.0                        # the EWMA has not caught up with the release yet
    w.check(d, t + 0.5, HIGH)
    assert w.throttles[1].originv == 20_000.0 and w.throttles[1].rate == 10_000.0


def test_restart_a_downstream_whose_clock_stepped_back_is_heard_and_its_old_run_is_not() -> None:
    # The old run sent many signals; the restarted one (new run id) counts from 1 again.
    peers, spout = _peers()
    peers.update(2, TaskState(task=2, holds={1: 1}, seq=10**12, version=(111, 5)), 0.0, lambda t: 20_000.0)
    assert spout.k == 1
    restarted = TaskState(task=2, holds={}, seq=1, version=(222, 1))
    out = peers.update(2, restarted, 5.0, lambda t: 20_000.0)
    assert [(t, c.rate) for t, c in out.changes] == [(1, None)] and spout.k == 0
    # a late record or signal of the old run changes nothing any more
    assert peers.update(2, TaskState(task=2, holds={1: 1}, seq=10**12, version=(111, 9)), 5.1,
                        lambda t: 20_000.0).changes == []
    assert spout.on_signal(Signal(BACKPRESSURE, 1, 2, 1, 10**12 + 1, 0.0, run=111), 20_000.0, 5.2) is None
    assert spout.k == 0 and peers.states[2].version == (222, 1)
    # the new run's own signals count from where it is
    assert spout.on_signal(Signal(BACKPRESSURE, 1, 2, 1, 2, 6.0, run=222), 20_000.0, 6.0) is not None


def test_restart_the_new_run_of_a_downstream_is_acknowledged_by_run_and_seq() -> None:
    w = World()
    first = Downstream(10, [1], P, 0.0, run=7)
    for i in range(5):
        w.check(first, 2.0 * i, HIGH)
    assert w.throttles[1].k == 5
    again = Downstream(10, [1], P, 10.0, run=8)          # restarted: seq 1 again, its hold is gone
    w.throttles[1].reconcile(10, 0, again.run, again.seq, 20_000.0, 10.0)   # its first state record
    assert w.throttles[1].k == 0
    (s2,) = w.check(again, 12.0, HIGH)
    assert s2.seq <= 2 and w.throttles[1].k == 1
    w.check(again, 12.5, MID)
    assert not again.mid_step(1) and again.holds == {1: 1}


def test_step6_a_sibling_refused_in_the_window_retries_as_it_ends() -> None:
    w = World(rates={1: 16_000.0})
    a, b = Downstream(10, [1], P, 0.0), Downstream(11, [1], P, 0.0)
    w.check(a, 0.0, HIGH)
    assert w.check(b, 0.001, HIGH) == []           # the view shows a's step in its window: skipped
    t, steps = 0.001, []
    while t < 2.2:
        t = round(t + 0.01, 3)
        steps += [(t, s.source) for s in tick(w, b, t, HIGH) + tick(w, a, t, HIGH - 1)]
    assert steps == [(2.001, 11)] and w.throttles[1].k == 2   # the first observation after 2.0


def test_step6_same_instant_requests_from_two_tasks_are_granted_once() -> None:
    w = World()
    a, b = Downstream(10, [1], P, 0.0), Downstream(11, [1], P, 0.0)
    sa, sb = w.check(a, 0.0, HIGH, deliver=False), w.check(b, 0.0, HIGH, deliver=False)
    w.deliver(sa + sb, 0.01)
    th = w.throttles[1]
    assert th.k == 1 and th.holds == {10: 1}
    w.check(a, 0.5, MID)
    w.check(b, 0.5, MID)
    assert b.holds == {} and a.holds == {1: 1}     # each adopts what it was granted


def test_step6_window_edge_a_step_exactly_sensitivity_later_is_granted() -> None:
    w = World()
    a, b = Downstream(10, [1], P, 0.0), Downstream(11, [1], P, 0.0)
    w.check(a, 0.0, HIGH)
    w.check(b, 1.999, MID)
    assert w.check(b, 1.999, HIGH) == []
    assert [s.source for s in w.check(b, 2.0, HIGH)] == [11] and w.throttles[1].k == 2


def test_step12_a_light_task_holding_nothing_sends_nothing_while_its_sibling_is_overloaded() -> None:
    w = World()
    a, b = Downstream(10, [1], P, 0.0), Downstream(11, [1], P, 0.0)
    w.check(a, 0.0, HIGH)
    for t in (0.0, 1.0, 2.0, 3.0, 4.0):
        assert tick(w, b, t, 0) == []
    assert w.throttles[1].k >= 1


def test_originv_memory_ends_a_new_episode_long_after_measures_afresh() -> None:
    w = World(rates={1: 20_000.0})
    d = Downstream(10, [1], P, 0.0)
    w.check(d, 0.0, HIGH)
    w.check(d, 2.0, LOW)
    w.check(d, 4.0, LOW)
    assert w.throttles[1].k == 0
    w.rates[1] = 7_000.0                      # the source really slowed down since
    w.check(d, 4.0 + P.originv_memory, HIGH)
    assert w.throttles[1].originv == 7_000.0


@pytest.mark.parametrize("originv", [20_000.0, 12_345.678, 1e6 / 7])
def test_fine_steps_bisect_between_neighbouring_steps_and_still_restore_originv_exactly(originv: float) -> None:
    params = StepwiseParams(step=0.5, high_mark=HIGH, low_mark=LOW, sensitivity=2.0, rate_floor=1.0,
                            fine_steps=8)
    w = World(params, rates={1: originv})
    d = Downstream(10, [1], params, 0.0)
    th = w.throttle(1)
    w.check(d, 0.0, HIGH)
    assert th.k == 8 and th.rate == originv * 0.5       # the first step is a whole one
    cap = 0.7 * originv                                 # between the two whole steps
    t, rates = 0.0, []
    for _ in range(40):         # over capacity: the queue stays over the high mark; under: it empties
        t += 2.0
        w.check(d, t, HIGH if th.rate is None or th.rate > cap else 0)
        rates.append(th.rate)
    tail = [r for r in rates[-16:] if r is not None]
    assert len(tail) == 16 and all(0.9 * cap <= r <= 1.1 * cap for r in tail), rates
    while th.k:
        t += 2.0
        w.check(d, t, LOW)
    assert th.rate is None and th.nominal_rate == originv and not th.backpressure


def test_originv_hold_keeps_the_limit_at_exactly_originv_then_turns_it_off() -> None:
    params = StepwiseParams(step=0.5, high_mark=HIGH, low_mark=LOW, sensitivity=2.0, rate_floor=1.0,
                            originv_hold=3.0)
    w = World(params, rates={1: 20_000.0})
    d = Downstream(10, [1], params, 0.0)
    w.check(d, 0.0, HIGH)
    w.check(d, 2.0, LOW)
    w.check(d, 4.0, LOW)
    th = w.throttles[1]
    assert th.k == 0 and not th.backpressure and th.rate == 20_000.0 == th.originv   # == originv, flag clear
    assert th.tick(6.9) is None and th.rate == 20_000.0
    change = th.tick(7.0)
    assert change is not None and change.rate is None and th.rate is None
    assert th.tick(8.0) is None


def test_an_overload_coming_back_soon_continues_the_episode_with_half_the_last_step() -> None:
    params = StepwiseParams(step=0.5, high_mark=HIGH, low_mark=LOW, sensitivity=2.0, rate_floor=1.0,
                            fine_steps=8)
    w = World(params, rates={1: 20_000.0})
    d = Downstream(10, [1], params, 0.0)
    th = w.throttle(1)
    w.check(d, 0.0, HIGH)                    # 8
    w.check(d, 2.0, LOW)
    w.check(d, 4.0, LOW)                     # release, reversal: 4
    w.check(d, 6.0, LOW)                     # release again, closing in: 2 -> k 2
    w.check(d, 8.0, LOW)                     # third in a row: 4 -> k 0
    assert th.k == 0
    w.check(d, 10.0, LOW)                    # light and holding nothing: the episode ended here
    w.check(d, 10.5, HIGH)                   # back within originv_memory: a reversal, half of 4
    assert th.k == 2
    w.check(d, 12.5, LOW)
    w.check(d, 14.5, LOW)
    w.check(d, 16.5, LOW)
    assert th.k == 0
    w.check(d, 16.5 + params.originv_memory + 1.0, HIGH)   # long after: a new episode, a whole step
    assert th.k == 8


def test_queue_smoothing_ignores_a_millisecond_spike_but_not_a_sustained_overload() -> None:
    params = StepwiseParams(step=0.5, high_mark=HIGH, low_mark=LOW, sensitivity=2.0, rate_floor=1.0,
                            queue_smoothing=0.05)
    w = World(params)
    d = Downstream(10, [1], params, 0.0)
    spiky = [(round(i * 0.001, 3), 2 * HIGH if i % 100 == 0 else 0) for i in range(1, 3000)]
    for t, q in spiky:                       # 2x the high mark for 1 ms in every 100 ms
        tick(w, d, t, q)
    assert 1 not in w.throttles or w.throttles[1].k == 0
    raw = Downstream(11, [2], P, 0.0)        # the document's reading: the first spike is an overload
    assert [s.target for t, q in spiky[:200] for s in tick(w, raw, t, q)] == [2]
    t = 3.0
    while not (1 in w.throttles and w.throttles[1].k):     # now it stays over the mark
        t = round(t + 0.001, 3)
        tick(w, d, t, 2 * HIGH)
    assert t - 3.0 < 0.1                     # within about one time constant


def test_restart_of_the_upstream_a_new_throttle_takes_the_published_hold_one_step_at_a_time() -> None:
    w = World(rates={1: 16_000.0})
    d = Downstream(10, [1], P, 0.0, run=5)
    for i in range(3):
        w.check(d, 2.0 * i, HIGH)
    assert d.wants == {1: 3}
    fresh = Throttle(1, P)                   # the upstream's process restarted: it knows no hold
    w.throttles[1] = fresh
    fresh.reconcile(10, d.wants[1], d.run, d.seq, 16_000.0, 7.0)    # the downstream's state record
    assert fresh.k == 1 and fresh.holds == {10: 1}
    t = 7.0
    while fresh.k or d.holds:                # the downstream goes light: both sides end at 0
        t += 2.0
        w.check(d, t, LOW)
        assert t < 30.0
    assert fresh.rate is None and fresh.nominal_rate == fresh.originv


# -- release_window and flat_queue_holds (settings beyond the document; off by default) -----------

def _two_steps_under_release_window() -> tuple[World, Downstream]:
    """Upstream 1 stepped twice by task 10, with ``release_window`` 0.5 s (``sensitivity`` 2 s)."""
    params = StepwiseParams(step=0.5, high_mark=HIGH, low_mark=LOW, sensitivity=2.0, rate_floor=1.0,
                            release_window=0.5)
    w = World(params, rates={1: 20_000.0})
    d = Downstream(10, [1], params, 0.0)
    w.check(d, 0.0, HIGH)
    w.check(d, 2.0, HIGH + 1)
    return w, d


def test_release_window_gives_back_each_step_after_the_shorter_window_and_restores_originv() -> None:
    w, d = _two_steps_under_release_window()
    th = w.throttles[1]
    assert th.k == 2
    assert tick(w, d, 10.0, LOW) == [] and tick(w, d, 10.499, LOW) == []
    assert [s.k for s in tick(w, d, 10.5, LOW)] == [1]           # not at 12.0: the window is 0.5 s
    assert tick(w, d, 10.999, LOW) == []                          # a fresh window for the next step
    assert [s.k for s in tick(w, d, 11.0, LOW)] == [0]
    assert th.rate is None and th.nominal_rate == th.originv == 20_000.0 and not th.backpressure


def test_release_window_an_acknowledgement_that_comes_later_is_looked_for_within_the_window() -> None:
    w, d = _two_steps_under_release_window()
    d.observe(10.0, LOW)
    assert d.observe(10.5, LOW)
    (rel,) = w.check_due(d, 10.5, LOW, deliver=False)            # the release is on its way
    assert not d.observe(10.6, LOW)
    w.deliver([rel], 10.6)                                        # applied and acknowledged
    # The next release is due 0.5 s after the last one, not at the next sensitivity check (12.5).
    assert d.observe(11.0, LOW)
    assert [s.k for s in w.check_due(d, 11.0, LOW)] == [0]


def test_flat_queue_holds_a_queue_that_stopped_growing_is_not_stepped_again_but_a_growing_one_is() -> None:
    params = StepwiseParams(step=0.5, high_mark=HIGH, low_mark=LOW, sensitivity=2.0, rate_floor=1.0,
                            flat_queue_holds=True)
    w = World(params)
    d = Downstream(10, [1], params, 0.0)
    th = w.throttle(1)
    w.check(d, 0.0, HIGH + 1_000_000)
    assert th.k == 1
    noise = HIGH // 64                                           # under 1/32 of the high mark: a batch or two
    assert w.check(d, 2.0, HIGH + 1_000_000 + noise) == []      # flat: the rate in force matches capacity
    w.check(d, 4.0, MID)                                         # dips under the mark ...
    assert w.check(d, 4.1, HIGH + 1_000_000 + noise) == []      # ... and back to the level of the step
    assert th.k == 1
    assert [s.k for s in w.check(d, 6.1, HIGH + 1_000_000 + HIGH // 16)] == [2]   # grew: one more step
    # The document's reading (the default) steps the same flat queue.
    w2 = World()
    d2 = Downstream(10, [1], P, 0.0)
    w2.check(d2, 0.0, HIGH + 1_000_000)
    assert [s.k for s in w2.check(d2, 2.0, HIGH + 1_000_000 + noise)] == [2]


def test_flat_queue_holds_a_flat_queue_near_the_hard_bound_is_stepped() -> None:
    params = StepwiseParams(step=0.5, high_mark=HIGH, low_mark=LOW, sensitivity=2.0, rate_floor=1.0,
                            flat_queue_holds=True, hard_bound=2 * HIGH)
    w = World(params)
    d = Downstream(10, [1], params, 0.0)
    w.check(d, 0.0, 2 * HIGH - 1)                # at the bound: the upstream may be waiting on it
    assert [s.k for s in w.check(d, 2.0, 2 * HIGH - 1)] == [2]


def test_release_window_and_flat_queue_holds_come_from_the_config() -> None:
    from topo.config import resolve
    default = StepwiseParams.from_config(resolve({}))
    assert default.light_window == default.sensitivity and not default.flat_queue_holds
    p = StepwiseParams.from_config(resolve({"backpressure.release_window_ms": 50,
                                            "backpressure.flat_queue_holds": True, "queue.high_mark": "64KB",
                                            "queue.low_mark": "16KB", "queue.hard_bound": "96KB"}))
    assert p.light_window == 0.05 and p.flat_queue_holds and p.hard_bound == 96_000
    with pytest.raises(ValueError, match="release_window"):
        StepwiseParams(release_window=-1.0)


# -- bracket_search (a setting; off in the document) -----------------------------------------------

def _searching(originv: float = 20_000.0) -> tuple[World, Downstream, Throttle, StepwiseParams]:
    params = StepwiseParams(step=0.5, high_mark=HIGH, low_mark=LOW, sensitivity=2.0, rate_floor=1.0,
                            fine_steps=8, bracket_search=True)
    w = World(params, rates={1: originv})
    return w, Downstream(10, [1], params, 0.0), w.throttle(1), params


def _run(w: World, d: Downstream, th: Throttle, t: float, cap: float, n: int) -> tuple[float, list[float | None]]:
    """``n`` checks ``sensitivity`` apart: the queue over the high mark while the rate is over ``cap``,
    empty under it. The rates in force (``originv`` when the limiter is off)."""
    rates = []
    for _ in range(n):
        t += 2.0
        w.check(d, t, HIGH if th.rate is None or th.rate > cap else 0)
        rates.append(th.rate if th.rate is not None else th.originv)
    return t, rates


# 0.93: the neighbours are 18,340 and the free rate, so the upstream is let go entirely and overloads
# again at once: its originv becomes one whole step over the first (40,000), once.
@pytest.mark.parametrize("cap_share, originv", [(0.55, 20_000.0), (0.7, 20_000.0), (0.93, 40_000.0)])
def test_bracket_search_settles_on_the_two_fine_steps_around_the_capacity_and_restores_originv(
        cap_share: float, originv: float) -> None:
    w, d, th, params = _searching()
    w.check(d, 0.0, HIGH)
    assert th.k == 8 and th.rate == 10_000.0              # no bracket yet: a whole step
    cap = cap_share * 20_000.0
    t, rates = _run(w, d, th, 0.0, cap, 30)
    above = min(r for k in range(9) if (r := 20_000.0 * 0.5 ** (k / 8)) > cap)
    below = max(r for k in range(9) if (r := 20_000.0 * 0.5 ** (k / 8)) <= cap)
    assert set(rates[-12:]) == {above, below}, rates     # only the neighbours of the capacity, both
    while th.k:
        t += 2.0
        w.check(d, t, LOW)
    assert th.rate is None and th.nominal_rate == originv == th.originv and not th.backpressure


def test_bracket_search_an_overload_where_it_was_light_costs_one_part_then_doubling() -> None:
    w, d, th, _ = _searching()
    w.check(d, 0.0, HIGH)                 # k 8
    w.check(d, 2.0, 0)
    w.check(d, 4.0, 0)                    # light at 8, nothing overloaded yet known... (over 0): k 4
    assert th.k == 4
    w.check(d, 6.0, HIGH)                 # over at 4, light at 8: the middle
    assert th.k == 6
    w.check(d, 8.0, 0)
    w.check(d, 10.0, 0)                   # light at 6: between 4 and 6
    assert th.k == 5
    w.check(d, 12.0, HIGH)                # over at 5: next to light 6
    assert th.k == 6
    ks = []
    for i in range(4):                    # overloaded at 6, where it was light: the capacity fell
        w.check(d, 14.0 + 2.0 * i, HIGH)
        ks.append(th.k)
    assert ks == [7, 9, 13, 21]           # one part, then 2, 4, and a whole step (8) at most


@pytest.mark.parametrize("margin, expect", [(0, 6), (1, 9), (3, 11)])
def test_drain_margin_a_step_down_inside_the_bracket_goes_that_many_parts_under_light(margin: int, expect: int) -> None:
    w, d, th, params = _searching()
    d.params = params = replace(params, drain_margin=margin)
    w.check(d, 0.0, HIGH)                 # no light known: a whole step (the margin needs one)
    assert th.k == 8
    w.check(d, 2.0, 0)
    w.check(d, 4.0, 0)                    # light at 8: the middle of (0, 8)
    assert th.k == 4
    w.check(d, 6.0, HIGH)                 # over at 4, light at 8: the middle (6), or margin parts under 8
    assert th.k == expect
    w.check(d, 8.0, 0)
    w.check(d, 10.0, 0)                   # releases are unchanged: the middle of (over, the rate read light)
    assert th.k == (4 + expect) // 2
    t = 10.0
    while th.k:
        t += 2.0
        w.check(d, t, 0)
    assert th.rate is None and th.nominal_rate == 20_000.0 == th.originv


def test_drain_margin_an_overload_where_it_was_light_still_creeps_one_part() -> None:
    w, d, th, params = _searching()
    d.params = replace(params, drain_margin=3)
    w.check(d, 0.0, HIGH)                 # 8
    w.check(d, 2.0, 0)
    w.check(d, 4.0, 0)                    # light at 8: 4
    w.check(d, 6.0, HIGH)                 # over at 4: three parts under light, 11
    assert th.k == 11
    w.check(d, 8.0, HIGH)                 # overloaded at 11, past light (8): the capacity fell, one part
    assert th.k == 12
    w.check(d, 10.0, HIGH)                # light dropped: 2 parts, no margin
    assert th.k == 14


def test_drain_margin_comes_from_the_config_in_parts_and_is_off_by_default() -> None:
    from topo.config import ConfigError, resolve
    assert StepwiseParams.from_config(resolve({})).drain_margin == 0
    assert StepwiseParams.from_config(resolve({"backpressure.drain_margin_parts": 8})).drain_margin == 8
    with pytest.raises(ConfigError, match="drain_margin_parts"):
        resolve({"backpressure.drain_margin_parts": -1})
    with pytest.raises(ValueError, match="drain_margin"):
        StepwiseParams(drain_margin=-1)


def test_bracket_search_a_light_window_where_it_overloaded_releases_one_part_then_doubling() -> None:
    w, d, th, _ = _searching()
    w.check(d, 0.0, HIGH)                 # 8
    w.check(d, 2.0, HIGH)                 # over at 8, no light known: 16
    w.check(d, 4.0, 0)
    w.check(d, 6.0, 0)                    # light at 16: the middle, 12
    w.check(d, 8.0, HIGH)                 # over at 12: 14
    assert th.k == 14
    ks = []
    for i in range(8):                    # the capacity rose: the queue stays empty
        w.check(d, 10.0 + 2.0 * i, 0)
        ks.append(th.k)
    # light at 14: the middle of (12, 14); light at 13: 12; light at 12, where it overloaded: that side
    # is dropped and the releases grow 1, 2, 4, 8 parts (a whole step at most).
    assert ks == [14, 13, 12, 11, 9, 5, 0, 0]
    assert th.rate is None and th.nominal_rate == 20_000.0


def test_bracket_search_a_queue_rising_under_the_low_mark_is_not_light() -> None:
    w, d, th, params = _searching()
    w.check(d, 0.0, HIGH)                 # 8
    t, q = 0.0, 0.0
    while t < 6.0:                        # under the low mark all along, but rising: not light
        t = round(t + 0.05, 2)
        q += params.low_mark / 200        # 1/16 of the low mark in 0.65 s, 60 % of it in 6 s
        tick(w, d, t, int(q))
    assert th.k == 8
    while th.k == 8:                      # flat from 6.0 s: light after the window
        t = round(t + 0.05, 2)
        tick(w, d, t, int(q))
    # The window runs from the last rise of 1/16 of the low mark over the lowest level seen (13 ticks
    # of 1/200: observed at 0.05 s, then every 0.65 s, the last at 5.9 s), not from the first low reading.
    assert th.k == 4 and t == 7.9


def test_bracket_search_an_overload_soon_after_the_episode_keeps_the_bracket_and_long_after_does_not() -> None:
    w, d, th, params = _searching()
    w.check(d, 0.0, HIGH)                 # 8
    t = 0.0
    for _ in range(2):
        t += 2.0
        w.check(d, t, 0)
    assert th.k == 4                      # light at 8, over at 0: the middle
    while th.k:
        t += 2.0
        w.check(d, t, 0)
    t += 2.0
    w.check(d, t, 0)                      # light and holding nothing: the episode ended
    w.check(d, t + 0.5, HIGH)             # a source catching up overloads at once at k 0: light was at 1
    assert th.k == 1 and th.originv == 40_000.0        # and its originv is one whole step over the first
    while th.k:
        t += 2.0
        w.check(d, t, 0)
    t += 2.0
    w.check(d, t, 0)
    while th.k:
        t += 2.0
        w.check(d, t, 0)
    t += 2.0
    w.check(d, t, 0)
    w.check(d, t + 0.5, HIGH)             # once more, soon after: not another step over it
    assert th.k > 0 and th.originv == 40_000.0
    while th.k:
        t += 2.0
        w.check(d, t, 0)
    t += 2.0
    w.check(d, t, 0)
    w.check(d, t + params.originv_memory + 1.0, HIGH)    # long after: a new episode, a whole step
    assert th.k == 8 and th.originv == 20_000.0          # from the measured rate


def test_bracket_search_comes_from_the_config_and_is_off_by_default() -> None:
    from topo.config import resolve
    assert not StepwiseParams.from_config(resolve({})).bracket_search
    assert StepwiseParams.from_config(resolve({"backpressure.bracket_search": True,
                                               "backpressure.fine_steps": 16})).bracket_search


def test_bracket_search_of_light_siblings_only_the_one_holding_most_releases() -> None:
    w, a, th, params = _searching()
    b = Downstream(11, [1], params, 0.0)
    w.check(a, 0.0, HIGH)                 # a: 8
    w.check(b, 2.0, HIGH)                 # b, a sensitivity later: 8 more
    assert th.k == 16 and th.holds == {10: 8, 11: 8}
    for t in (4.0, 6.0):                  # both light
        w.check(a, t, 0)
        w.check(b, t, 0)
    # Only a (tie, the lower id) released: halfway between its over (0) and the light k (16), all it held.
    assert th.k == 8 and th.holds == {11: 8}
    w.check(b, 6.5, 0)                   # b leads now, but the rate changed under it: a fresh window
    assert th.k == 8
    w.check(b, 8.5, 0)                   # light at 8, where b overloaded: one part up
    assert th.k == 7 and th.holds == {11: 7}


# -- bracket_light_window, bracket_interpolate (settings of bracket_search; off in the document) ----------

def _sloped(**kw: object) -> tuple[World, Downstream, Throttle, StepwiseParams]:
    params = StepwiseParams(**{"step": 0.5, "high_mark": HIGH, "low_mark": LOW, "sensitivity": 0.2,
                               "rate_floor": 1.0, "fine_steps": 16, "bracket_search": True,
                               "release_window": 0.05, "hard_bound": 2 * HIGH, **kw})   # type: ignore[arg-type]
    w = World(params, rates={1: 20_000.0})
    return w, Downstream(10, [1], params, 0.0), w.throttle(1), params


def _flow(w: World, d: Downstream, th: Throttle, t: float, q: float, cap: float, size: float,
          until: float, stop: Callable[[], bool] = lambda: False, dt: float = 0.005) -> tuple[float, float]:
    """A queue fed at the upstream's rate (20,000/s when free) and served at ``cap`` tuples/s of
    ``size`` bytes, up to the hard bound, observed every ``dt`` as the driver does."""
    bound = w.params.hard_bound or 2 * w.params.high_mark
    while t < until - 1e-9 and not stop():
        t = round(t + dt, 6)
        rate = th.rate if th.rate is not None else 20_000.0
        q = min(bound, max(0.0, q + (rate - cap) * size * dt))
        tick(w, d, t, int(q))
    return t, q


def _until_released(w: World, d: Downstream, th: Throttle, t: float, level: int, limit: float = 5.0) -> float:
    k = th.k
    while th.k == k and t < limit:
        t = round(t + 0.01, 2)
        tick(w, d, t, level)
    return t


def test_bracket_light_window_holds_a_release_inside_the_bracket_longer_unless_the_queue_is_empty() -> None:
    w, d, th, params = _sloped(bracket_light_window=0.3)
    w.check(d, 0.0, HIGH)                     # overloaded at k 0 (over is known from now on): k 16
    assert th.k == 16 and d.window == 0.3
    some = LOW // 4                           # under the low mark, over 1/32 of it: the task is not idle
    t = _until_released(w, d, th, 0.0, some)
    assert t == 0.31 and th.k == 8            # from the first observation (0.01 s), the bracket's window
    start = t
    t = _until_released(w, d, th, t, some)
    assert t - start == pytest.approx(0.3, abs=0.011)     # every release inside the bracket
    t = _until_released(w, d, th, t, 0)       # the level 0 from here: this window started at the level
    start = t                                 # of the release, but the next one is idle throughout
    t = _until_released(w, d, th, t, 0)
    assert t - start == pytest.approx(params.release_window, abs=0.011)
    w2, d2, th2, _ = _sloped()                # 0 (the default): the release window; released at the first
    w2.check(d2, 0.0, HIGH)                   # periodic check, which reads the step's acknowledgement
    assert _until_released(w2, d2, th2, 0.0, some) == 0.2
    assert _until_released(w2, d2, th2, 0.2, some) - 0.2 == pytest.approx(0.05, abs=0.011)


@pytest.mark.parametrize("window, released_at", [(0.3, 2.31), (0.0, 0.23)])
def test_bracket_light_window_a_level_that_rose_under_the_low_mark_is_not_light_until_back_down(
        window: float, released_at: float) -> None:
    w, d, th, _ = _sloped(bracket_light_window=window)
    w.check(d, 0.0, HIGH)                     # k 16
    t = 0.0
    while th.k == 16 and t < 2.0:             # from 0 to a quarter of the low mark in 0.2 s, then flat
        t = round(t + 0.01, 2)
        tick(w, d, t, int(min(1.0, t / 0.2) * LOW / 4))
    if window:
        assert th.k == 16                     # flat, but over where it was lowest: not light
        t = _until_released(w, d, th, t, 0)   # back down to it from 2.01 s: the bracket's window from there
    assert th.k < 16 and t == released_at     # (the plain search: the release window after the last rise
                                              # of 1/16 of the low mark, at 0.18 s)


@pytest.mark.parametrize("interpolate, expect", [(True, 26), (False, 24)])
def test_bracket_interpolate_moves_to_where_the_queue_would_stand_still(interpolate: bool, expect: int) -> None:
    # The capacity is 6,500/s: k 16 (10,000/s) fills the queue at 3,500 tuples/s, k 32 (5,000/s) drains
    # it at 1,500/s; on the line between the two the queue stands still at 5,000 + 5,000 x 1,500 / 5,000
    # = 6,500/s, k 25.9: the interpolation goes to k 26 (6,482/s), the middle of the bracket to 24 (7,071/s).
    w, d, th, _ = _sloped(bracket_light_window=0.2, bracket_interpolate=interpolate)
    cap, size = 6_500.0, 10_000.0
    t, q = _flow(w, d, th, 0.0, 0.9 * HIGH, cap, size, until=10.0, stop=lambda: th.k == 16)
    t, q = _flow(w, d, th, t, q, cap, size, until=10.0, stop=lambda: th.k == 32)
    assert q < 1.5 * HIGH                    # the rise at k 16 was measured under the hard bound
    t, q = _flow(w, d, th, t, q, cap, size, until=20.0, stop=lambda: th.k < 32)
    assert th.k == expect
    if interpolate:
        rates = {k: 20_000.0 * 0.5 ** (k / 16) for k in range(17, 32)}
        assert th.k == min(rates, key=lambda k: abs(rates[k] - cap))     # the nearest step to it
        assert d.over_slope[1] == pytest.approx(3_500 * size, rel=0.05)
        assert d.light_slope[1] == pytest.approx(1_500 * size, rel=0.05)


def test_bracket_interpolate_a_rise_read_at_the_hard_bound_is_not_a_slope() -> None:
    # As above, but the queue reaches the hard bound at k 16 (the upstream would wait on it: the rise seen
    # is not its rate's): no slope on that side, so the release goes to the middle of the bracket.
    w, d, th, _ = _sloped(bracket_light_window=0.2, bracket_interpolate=True)
    cap, size = 6_500.0, 80_000.0
    t, q = _flow(w, d, th, 0.0, 0.9 * HIGH, cap, size, until=10.0, stop=lambda: th.k == 32)
    assert 1 not in d.over_slope
    _flow(w, d, th, t, q, cap, size, until=30.0, stop=lambda: th.k < 32)
    assert th.k == 24


def test_bracket_interpolate_stays_in_the_middle_half_of_the_bracket() -> None:
    _, d, _, _ = _sloped(bracket_interpolate=True)
    assert d._interpolated(16, 32, rise=1.0, fall=1e9) == 20      # the capacity next to over: a quarter in
    assert d._interpolated(16, 32, rise=1e9, fall=1.0) == 28      # next to light: a quarter in
    assert d._interpolated(16, 32, rise=1.0, fall=1.0) == 24 - 1  # equal slopes: the middle of the rates


def test_bracket_interpolate_a_slope_under_a_rate_a_sibling_changed_is_not_used() -> None:
    w, a, th, params = _sloped(bracket_interpolate=True)
    b = Downstream(11, [1], params, 0.0)
    w.check(a, 0.0, HIGH)                     # a steps 0 -> 16 at its level HIGH
    w.check(b, 0.3, HIGH)                     # b, a sensitivity later: 16 more (k 32)
    assert th.k == 32 and a.moved[1][2] == 16
    assert a._slope(1, BACKPRESSURE, th.k, 0.5, 1.2 * HIGH) is None    # a's move set 16, not 32
    assert a._slope(1, BACKPRESSURE, 16, 0.5, 1.2 * HIGH) == pytest.approx(0.2 * HIGH / 0.5)


@pytest.mark.parametrize("interpolate, expect", [(True, 16), (False, 32)])
def test_bracket_interpolate_reads_the_trend_after_a_step_from_when_the_step_shows(
        interpolate: bool, expect: int) -> None:
    # The smoothed level lags the queue: when it crosses the high mark the queue is already well over it,
    # so after the step (to 10,000/s, just over 9,000/s... under: the capacity is 10,500/s) the smoothed
    # level keeps rising for a few time constants while the queue itself falls. Read from the step, the
    # level rose and the document's rule steps again; read from when the step shows, it is falling.
    w, d, th, _ = _sloped(queue_smoothing=0.05, bracket_interpolate=interpolate)
    t, q = _flow(w, d, th, 0.0, 0.5 * HIGH, 10_500.0, 1_000.0, until=10.0, stop=lambda: th.k == 16)
    stepped_at = t
    _flow(w, d, th, t, q, 10_500.0, 1_000.0, until=stepped_at + 0.25)
    assert th.k == expect


def test_bracket_interpolate_no_slope_across_a_clock_stepped_back_or_from_a_queue_already_low() -> None:
    w, d, th, params = _sloped(bracket_interpolate=True)
    w.check(d, 1.0, HIGH)                     # moved at 1.0 s, at the high mark, to k 16
    assert d._slope(1, BACKPRESSURE, 16, 0.5, 1.2 * HIGH) is None      # "now" before the move
    assert d._slope(1, BACKPRESSURE, 16, 1.0, 1.2 * HIGH) is None      # no time elapsed
    d.low_at = 0.9                            # reached the low mark before the move: not this fall
    assert d._slope(1, RELEASE, 16, 2.0, 0) is None
    d.low_at = 1.5                            # after it: fell from the high mark to the low mark in 0.5 s
    assert d._slope(1, RELEASE, 16, 2.0, 0) == pytest.approx((HIGH - LOW) / 0.5)
    d.moved[1] = (1.0, LOW / 2, 16)           # the queue was already under the low mark at the move
    assert d._slope(1, RELEASE, 16, 2.0, 0) is None


def test_bracket_interpolate_follows_a_raised_originv_instead_of_creeping_from_the_free_rate() -> None:
    # As in the test of the raised originv above: light was seen at k 1 of originv 20,000 (17,800/s). The
    # upstream, overloading again at once when let go, now counts from 40,000: the same rate is k 9.
    # Still overloaded at k 1 of 40,000 (35,600/s): the middle of (1, 9), not one more part (the plain
    # search, which reads its bracket in the old counts: light at 1 <= k, an overload where it was light).
    for interpolate, expect in ((True, 5), (False, 2)):
        params = StepwiseParams(step=0.5, high_mark=HIGH, low_mark=LOW, sensitivity=2.0, rate_floor=1.0,
                                fine_steps=8, bracket_search=True, bracket_interpolate=interpolate)
        w = World(params, rates={1: 20_000.0})
        th = w.throttle(1)
        w.view = lambda u: replace(view_of(th), originv=th.originv)   # type: ignore[method-assign]
        d = Downstream(10, [1], params, 0.0)
        w.check(d, 0.0, HIGH)                 # 8
        t = 0.0
        while th.k:
            t += 2.0
            w.check(d, t, 0)
        t += 2.0
        w.check(d, t, 0)                      # the episode ended
        w.check(d, t + 0.5, HIGH)
        assert th.k == 1 and th.originv == 40_000.0
        w.check(d, t + 2.5, HIGH)
        assert th.k == expect, interpolate


def test_bracket_interpolate_rebase_keeps_rates_either_way_and_leaves_the_free_rate() -> None:
    _, d, _, _ = _sloped(bracket_interpolate=True)      # fine_steps 16, v' 0.5
    d.over[1], d.light[1] = 8, 24
    d._rebase(1, 20_000.0)                   # the first originv seen: nothing to shift
    assert (d.over[1], d.light[1]) == (8, 24)
    d._rebase(1, 40_000.0)                   # raised a whole step: the same rates are 16 parts further
    assert (d.over[1], d.light[1]) == (24, 40)
    d._rebase(1, 10_000.0)                   # an upstream restarted and measured lower: two steps back
    assert (d.over[1], d.light[1]) == (0, 8)
    d._rebase(1, 20_000.0)                   # over at 0 is the free rate, not a step of any originv
    assert (d.over[1], d.light[1]) == (0, 24)


def test_bracket_light_window_and_interpolate_come_from_the_config_and_are_off_by_default() -> None:
    from topo.config import resolve
    default = StepwiseParams.from_config(resolve({}))
    assert default.bracket_light_window == 0.0 and not default.bracket_interpolate
    p = StepwiseParams.from_config(resolve({"backpressure.bracket_light_window_ms": 200,
                                            "backpressure.bracket_interpolate": True}))
    assert p.bracket_light_window == 0.2 and p.bracket_interpolate
    with pytest.raises(ValueError, match="bracket_light_window"):
        StepwiseParams(bracket_light_window=-1.0)


# -- hold_starved_upstream (a setting; off in the document) --------------------------------------------

IDLE = LOW // 32          # the most a starved relay's queue holds


class Relay:
    """What a downstream sees of an upstream bolt: its throttle and, as published, its queue and holds."""

    def __init__(self, w: World, u: int) -> None:
        self.th = w.throttle(u)
        self.queue: int | None = 0          # None: a spout
        self.holding = True
        w.view = self.view                  # type: ignore[method-assign]

    def view(self, u: int) -> UpstreamView:
        return replace(view_of(self.th), queue_bytes=self.queue, holding=self.holding)


def _held_once(params: StepwiseParams = replace(P, hold_starved=True),
               upstream: Callable[[World, int], Any] = Relay) -> tuple[World, Downstream, Any]:
    """Task 10 overloaded once: its upstream 1 (8,000/s, seen through ``upstream``) holds one step."""
    w = World(params, rates={1: 8_000.0})
    up = upstream(w, 1)
    d = Downstream(10, [1], params, now=0.0)
    w.check(d, 0.0, HIGH)
    assert up.th.k == 1
    return w, d, up


def test_hold_starved_no_release_of_a_relay_bolt_starved_by_its_own_backpressure() -> None:
    w, d, relay = _held_once()
    t = 0.0
    while t < 10.0:                           # light for five windows, the relay idle and holding its spout
        t = round(t + 0.1, 1)
        tick(w, d, t, 0)
    assert relay.th.k == 1 and not [s for s in w.sent if s.kind == RELEASE]
    relay.queue = IDLE + 1                    # its limit binds again: its queue builds
    while relay.th.k and t < 20.0:
        t = round(t + 0.1, 1)
        tick(w, d, t, 0)
    assert relay.th.k == 0 and relay.th.rate is None and relay.th.nominal_rate == 8_000.0 == relay.th.originv


def test_hold_starved_a_relay_holding_nothing_is_released_so_the_chain_unwinds_from_the_top() -> None:
    w, d, relay = _held_once()
    for t in (0.5, 1.0, 1.5, 2.0, 2.5):
        tick(w, d, t, 0)
    assert relay.th.k == 1
    relay.holding = False                     # its own upstream let go: its idle queue is the offered load
    t = _until_released(w, d, relay.th, 2.5, 0, limit=10.0)
    assert relay.th.k == 0 and relay.th.rate is None and relay.th.originv == 8_000.0


def test_hold_starved_window_edge_the_release_needs_a_whole_light_window_after_the_withheld_one() -> None:
    w, d, relay = _held_once()
    for t in (0.5, 1.0, 1.5, 2.0):            # the low mark held from 0.5 s
        tick(w, d, t, 0)
    tick(w, d, 2.5, 0)                        # a whole sensitivity: withheld, the window starts again
    assert relay.th.k == 1 and d.low_since == 2.5
    relay.queue = LOW                         # busy again at once
    tick(w, d, 4.25, 0)                       # 1.75 s of the new window: not yet
    assert relay.th.k == 1
    tick(w, d, 4.5, 0)                        # exactly a sensitivity after the withheld check
    assert relay.th.k == 0


def test_hold_starved_a_relay_seen_idle_at_any_time_in_the_light_window_is_starved_for_it() -> None:
    w, d, relay = _held_once()
    relay.queue = LOW                         # fed at every check, as the latest state shows it
    relay.idle_at = 0.7                       # but a state showing it idle came 0.2 s into the window
    real = relay.view
    w.view = lambda u: replace(real(u), idle_at=relay.idle_at)   # type: ignore[method-assign]
    for t in (0.5, 1.0, 1.5, 2.0, 2.5):       # the low mark held from 0.5 s: withheld at 2.5 s
        tick(w, d, t, 0)
    assert relay.th.k == 1 and d.low_since == 2.5
    tick(w, d, 4.5, 0)                        # a whole window in which it was never seen idle
    assert relay.th.k == 0


def test_hold_starved_a_spout_and_the_default_release_as_before() -> None:
    for params, queue in ((replace(P, hold_starved=True), None),      # a spout: no queue published
                          (P, 0)):                                     # the setting off
        w, d, relay = _held_once(params)
        relay.queue = queue
        for t in (0.5, 1.0, 1.5, 2.0, 2.5):
            tick(w, d, t, 0)
        released = [s for s in w.sent if s.kind == RELEASE]
        assert released and released[0].k == 0 and relay.th.k == 0, (params.hold_starved, queue)


def test_hold_starved_a_clock_stepped_back_does_not_shorten_the_window_after_a_withheld_check() -> None:
    w, d, relay = _held_once()
    for t in (0.5, 1.0, 1.5, 2.0, 2.5):
        tick(w, d, t, 0)
    assert d.low_since == 2.5                 # withheld at 2.5 s
    relay.queue = LOW
    for t in (1.0, 2.0, 3.0, 4.0, 4.4):       # the clock went back 1.5 s: no window has elapsed yet
        tick(w, d, t, 0)
        assert relay.th.k == 1, t
    tick(w, d, 4.5, 0)
    assert relay.th.k == 0


def test_hold_starved_of_light_siblings_the_leader_releases_once_the_relay_binds_again() -> None:
    w, a, th, params = _sloped(hold_starved=True)
    relay = Relay(w, 1)
    b = Downstream(11, [1], params, 0.0)
    w.check(a, 0.0, HIGH)                     # a: 16
    w.check(b, 0.2, HIGH)                     # b, a sensitivity later: 16 more
    assert th.k == 32 and th.holds == {10: 16, 11: 16}
    t = 0.2
    while t < 2.0:                            # both light, the relay starved: nobody releases
        t = round(t + 0.01, 2)
        tick(w, a, t, 0)
        tick(w, b, t, 0)
    assert th.k == 32
    relay.queue = LOW
    while th.k == 32 and t < 4.0:
        t = round(t + 0.01, 2)
        tick(w, a, t, 0)
        tick(w, b, t, 0)
    assert th.holds == {11: 16}               # a (tie, the lower id) released all it held, b nothing yet


def test_hold_starved_peer_states_carry_a_bolts_queue_and_holds_and_not_a_spouts() -> None:
    peers, _ = _peers()
    bolt = TaskState(task=5, spout=False, queue_bytes=300, holds={1: 2}, version=(7, 1))
    spout = TaskState(task=6, spout=True, queue_bytes=0, version=(8, 1))
    peers.update(5, bolt, 1.0, lambda t: 0.0)
    peers.update(6, spout, 1.0, lambda t: 0.0)
    v5, v6 = peers.view(5), peers.view(6)
    assert v5 is not None and v6 is not None
    assert (v5.queue_bytes, v5.holding) == (300, True) and v5.starved(LOW) == (300 <= LOW / 32)
    assert v6.queue_bytes is None and not v6.starved(LOW)
    restarted = TaskState(task=5, spout=False, queue_bytes=0, holds={}, version=(9, 1))   # a new run
    peers.update(5, restarted, 2.0, lambda t: 0.0)
    v5 = peers.view(5)
    assert v5 is not None and not v5.holding and not v5.starved(LOW)   # it holds nothing: released


def test_hold_starved_peer_states_record_when_a_bolts_queue_was_last_seen_idle() -> None:
    peers, _ = _peers()
    idle = TaskState(task=5, spout=False, queue_bytes=LOW // 32, low_mark=LOW, holds={1: 2}, version=(7, 1))
    fed = replace(idle, queue_bytes=LOW // 32 + 1, version=(7, 2))
    peers.update(5, idle, 1.0, lambda t: 0.0)
    peers.update(5, fed, 1.5, lambda t: 0.0)
    v = peers.view(5)
    assert v is not None and v.idle_at == 1.0
    assert v.starved(LOW, since=0.9) and not v.starved(LOW, since=1.1) and not v.starved(LOW)
    spout = TaskState(task=6, spout=True, queue_bytes=0, low_mark=LOW, version=(8, 1))
    peers.update(6, spout, 2.0, lambda t: 0.0)
    v6 = peers.view(6)
    assert v6 is not None and v6.idle_at is None


def test_hold_starved_upstream_comes_from_the_config_and_is_off_by_default() -> None:
    from topo.config import resolve
    assert not StepwiseParams.from_config(resolve({})).hold_starved
    assert StepwiseParams.from_config(resolve({"backpressure.hold_starved_upstream": True})).hold_starved


# -- dry_release_window_ms (a setting; off in the document) ----------------------------------------------

class DrySpout:
    """What a downstream sees of a spout upstream: its throttle and, as published, whether its source ran dry
    under its limit (``dry``: the latest state says so; ``dry_at``: when a state saying so last arrived)."""

    def __init__(self, w: World, u: int) -> None:
        self.th = w.throttle(u)
        self.dry = False
        self.dry_at: float | None = None
        w.view = self.view                  # type: ignore[method-assign]

    def view(self, u: int) -> UpstreamView:
        return replace(view_of(self.th), dry=self.dry, dry_at=self.dry_at)


def _dry_held_once(window: float = 5.0) -> tuple[World, Downstream, DrySpout]:
    return _held_once(replace(P, dry_release_window=window), DrySpout)


def test_dry_release_window_light_read_while_the_spout_ran_dry_releases_it_only_after_the_longer_window() -> None:
    w, d, spout = _dry_held_once()
    spout.dry, spout.dry_at = True, 0.4       # an on/off source between bursts: its limit is not in use
    t = 0.49
    while t < 5.49:                           # the low mark holds from 0.5 s: the light window (2 s) passes at 2.5
        t = round(t + 0.01, 2)
        tick(w, d, t, 0)
        assert spout.th.k == 1, t
    assert d.low_since == 0.5                 # the light spell goes on: a withheld release does not restart it
    tick(w, d, 5.5, 0)                        # 5 s of light: released
    assert spout.th.k == 0 and spout.th.rate is None and spout.th.originv == 8_000.0


def test_dry_release_window_a_spout_dry_only_before_the_light_window_is_released_at_the_light_window() -> None:
    for dry_at, released_at in ((0.49, 2.5), (0.5, 5.5)):    # the window starts at 0.5 s: the edge counts in it
        w, d, spout = _dry_held_once()
        spout.dry_at = dry_at                 # no longer dry (its latest state), dry last seen then
        t = _until_released(w, d, spout.th, 0.49, 0, limit=10.0)
        assert t == released_at, dry_at


def test_dry_release_window_a_spout_that_ran_dry_in_the_window_then_bound_again_waits_the_longer_window() -> None:
    w, d, spout = _dry_held_once()
    spout.dry_at = 1.0                        # dry a while inside the light spell, binding again since
    assert _until_released(w, d, spout.th, 0.49, 0, limit=10.0) == 5.5


def test_dry_release_window_off_releases_a_dry_spout_at_the_light_window_as_document_000() -> None:
    w, d, spout = _dry_held_once(window=0.0)
    spout.dry, spout.dry_at = True, 0.4
    assert _until_released(w, d, spout.th, 0.49, 0, limit=10.0) == 2.5


def test_dry_release_window_a_window_shorter_than_the_light_window_changes_nothing() -> None:
    w, d, spout = _dry_held_once(window=1.0)
    spout.dry, spout.dry_at = True, 0.4
    assert _until_released(w, d, spout.th, 0.49, 0, limit=10.0) == 2.5


def test_dry_release_window_peer_states_carry_a_spouts_dry_flag_and_when_it_was_last_seen_dry() -> None:
    peers, _ = _peers()
    dry = TaskState(task=6, spout=True, dry=True, version=(8, 1))
    bound = replace(dry, dry=False, version=(8, 2))
    peers.update(6, dry, 1.0, lambda t: 0.0)
    v = peers.view(6)
    assert v is not None and v.dry and v.dry_at == 1.0 and v.ran_dry(since=5.0)   # still dry: any window
    peers.update(6, bound, 1.5, lambda t: 0.0)    # dry until this state came: dry when the light began at 1.2
    v = peers.view(6)
    assert v is not None and not v.dry and v.dry_at == 1.5
    assert v.ran_dry(since=1.2) and v.ran_dry(since=1.5) and not v.ran_dry(since=1.6)
    peers.update(6, replace(bound, version=(8, 3)), 2.0, lambda t: 0.0)   # binding on: the end stays where it was
    v = peers.view(6)
    assert v is not None and v.dry_at == 1.5 and not v.ran_dry(since=1.6)
    never = TaskState(task=7, spout=True, version=(9, 1))
    peers.update(7, never, 2.0, lambda t: 0.0)
    v7 = peers.view(7)
    assert v7 is not None and not v7.ran_dry(since=0.0)


def test_dry_release_window_comes_from_the_config_in_milliseconds_and_is_off_by_default() -> None:
    from topo.config import ConfigError, resolve
    assert StepwiseParams.from_config(resolve({})).dry_release_window == 0.0
    assert StepwiseParams.from_config(resolve({"backpressure.dry_release_window_ms": 1000})).dry_release_window == 1.0
    with pytest.raises(ConfigError, match="dry_release_window_ms"):
        resolve({"backpressure.dry_release_window_ms": -1})


def test_a_state_without_the_dry_flag_decodes_as_not_dry() -> None:
    import msgpack
    st = TaskState(task=3, spout=True, dry=True, version=(5, 6))
    assert TaskState.decode(st.encode()).dry
    older = msgpack.unpackb(st.encode())
    del older["dry"]                          # a publisher from before the setting
    assert not TaskState.decode(msgpack.packb(older)).dry


def test_release_below_overload_releases_one_part_at_a_time_for_sensitivity_after_light_where_it_overloaded() -> None:
    def ks(flag: bool, light_level: int) -> list[int]:
        params = StepwiseParams(step=0.5, high_mark=HIGH, low_mark=LOW, sensitivity=2.0, rate_floor=1.0,
                                fine_steps=8, bracket_search=True, release_window=0.25,
                                release_below_overload=flag)
        w = World(params, rates={1: 20_000.0})
        d, th = Downstream(10, [1], params, 0.0), w.throttle(1)
        w.check(d, 0.0, HIGH)             # 8
        w.check(d, 2.0, HIGH)             # over at 8: 16
        w.check(d, 2.75, light_level)
        w.check(d, 3.0, light_level)      # light at 16: 12
        w.check(d, 3.5, HIGH)             # over at 12: 14
        out = []
        for i in range(12):               # light windows of 0.25 s from 3.75 on
            w.check(d, 3.75 + 0.25 * i, light_level)
            out.append(th.k)
        return out
    doubling = [14, 13, 12, 11, 9, 5, 0, 0, 0, 0, 0, 0]
    # light at 14 -> 13 -> 12; at 12, where it overloaded (t 4.5), the plain search doubles 1, 2, 4, 8 parts
    assert ks(False, LOW // 4) == doubling
    # the setting moves one part per window until sensitivity (2 s) has passed since then, then doubles
    assert ks(True, LOW // 4) == [14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 2]
    # a queue that stayed idle in the windows (the capacity rose well past the rate) still doubles
    assert ks(True, 0) == doubling


# -- step_from_recent_rate (a setting; off in the document) -------------------------------------

RP = replace(P, step_from_recent_rate=True)        # recent_window: sensitivity (2 s)


def _recent(rate: float, queue_bytes: int | None = None, span: float = 2.0) -> Recent:
    return Recent(round(rate * span), span, queue_bytes)


def test_step_from_recent_rate_steps_one_step_under_what_the_upstream_emitted_when_far_under_its_limit() -> None:
    w = World(RP, rates={1: 20_000.0})
    w.recent[1] = _recent(2_500.0)      # its meter still says 20,000/s; it emitted 2,500/s just now
    d = Downstream(10, [1], RP, now=0.0)
    w.check(d, 0.0, HIGH)
    th = w.throttles[1]
    # One whole step under 2,500/s, on the steps of originv: 20,000 x 0.5**4; originv is the meter's figure.
    assert th.k == 4 and th.rate == 1_250.0 and th.originv == 20_000.0
    assert th.holds == {10: 4}                     # granted to the task that asked
    w.check(d, 0.5, MID)                           # the acknowledgement: it adopts the grant
    assert d.holds == {1: 4}


def test_step_from_recent_rate_is_the_document_step_when_the_upstream_emits_near_its_limit() -> None:
    for recent in (_recent(12_000.0), _recent(10_000.0)):     # at or over v' x 20,000: the limit binds
        w = World(RP, rates={1: 20_000.0})
        w.recent[1] = recent
        w.check(Downstream(10, [1], RP, now=0.0), 0.0, HIGH)
        assert w.throttles[1].k == 1 and w.throttles[1].rate == 10_000.0
    w = World(P, rates={1: 20_000.0})              # the setting off: the document's step whatever it emitted
    w.recent[1] = _recent(2_500.0)
    w.check(Downstream(10, [1], P, now=0.0), 0.0, HIGH)
    assert w.throttles[1].k == 1


@pytest.mark.parametrize("recent", [
    None,                                          # not measured
    _recent(2_500.0, span=1.9),                    # the window is not full yet (a task just started)
    Recent(MIN_RECENT_TUPLES - 1, 2.0),            # a stall: too few tuples to be a rate
    _recent(2_500.0, queue_bytes=LOW),             # a bolt with no backlog emits what it receives
])
def test_step_from_recent_rate_ignores_a_short_or_stalled_window_and_a_bolt_without_backlog(
        recent: Recent | None) -> None:
    w = World(RP, rates={1: 20_000.0})
    if recent is not None:
        w.recent[1] = recent
    w.check(Downstream(10, [1], RP, now=0.0), 0.0, HIGH)
    assert w.throttles[1].k == 1


def test_step_from_recent_rate_a_bolt_with_a_backlog_is_stepped_from_what_it_emitted() -> None:
    w = World(RP, rates={1: 20_000.0})
    w.recent[1] = _recent(2_500.0, queue_bytes=LOW + 1)     # waiting on a full queue downstream
    w.check(Downstream(10, [1], RP, now=0.0), 0.0, HIGH)
    assert w.throttles[1].k == 4


def test_step_from_recent_rate_once_per_episode_then_the_document_steps() -> None:
    w = World(RP, rates={1: 20_000.0})
    w.recent[1] = _recent(2_500.0)
    d = Downstream(10, [1], RP, now=0.0)
    w.check(d, 0.0, HIGH)
    assert w.throttles[1].k == 4
    w.recent[1] = _recent(100.0)                   # far under the limit again: still one step
    w.check(d, 2.0, HIGH)
    w.check(d, 4.0, HIGH)
    assert w.throttles[1].k == 6
    d.observe(6.0, 0)
    t = 6.0
    while w.throttles[1].k:                        # released entirely
        t += 2.0
        w.check(d, t, 0)
    w.rates[1], w.recent[1] = 16_000.0, _recent(1_000.0)
    w.check(d, t + RP.originv_memory + 2.0, HIGH)  # a new episode: from the recent rate again
    assert w.throttles[1].k == 5 and w.throttles[1].rate == 500.0 and w.throttles[1].originv == 16_000.0


def test_step_from_recent_rate_not_in_an_episode_continuing_one_within_originv_memory() -> None:
    w = World(RP, rates={1: 20_000.0})
    d = Downstream(10, [1], RP, now=0.0)
    w.check(d, 0.0, HIGH)                          # emits not measured: the document's step
    d.observe(1.0, 0)
    w.check(d, 3.0, 0)                             # released at 3.0
    assert w.throttles[1].k == 0
    w.recent[1] = _recent(2_500.0)                 # a source emitting all it has, under originv
    w.check(d, 3.0 + RP.originv_memory - 0.5, HIGH)
    assert w.throttles[1].k == 1 and w.throttles[1].rate == 10_000.0


def test_step_from_recent_rate_originv_is_restored_exactly_after_an_episode_that_started_with_it() -> None:
    originv = 12_345.678
    w = World(RP, rates={1: originv})
    w.recent[1] = _recent(1_000.0)
    d = Downstream(10, [1], RP, now=0.0)
    w.check(d, 0.0, HIGH)
    th = w.throttles[1]
    k = th.k
    assert k == 5 and th.rate == originv * 0.5 ** 5
    up = []
    d.observe(2.0, LOW)
    t = 2.0
    while th.k > 0:
        t += 2.0
        w.check(d, t, LOW)
        up.append(th.nominal_rate)
    assert up == [originv * 0.5 ** i for i in range(k - 1, -1, -1)]
    assert th.k == 0 and th.rate is None and not th.backpressure
    assert th.nominal_rate == originv and th.originv == originv       # ==, not approx


def test_step_from_recent_rate_siblings_of_one_component_still_cost_one_step_per_sensitivity_window() -> None:
    w = World(RP, rates={1: 16_000.0})
    w.recent[1] = _recent(2_000.0)
    sibs = [Downstream(10 + i, [1], RP, now=0.0) for i in range(4)]
    t = 0.0
    ks = []
    while t < 3.9:                     # tasks cross the high mark 0.3 s apart and stay over it
        for i, d in enumerate(sibs):
            if t >= 0.3 * i:
                tick(w, d, t, HIGH)
        ks.append(w.throttles[1].k)
        t = round(t + 0.05, 2)
    # The first step goes under 2,000/s (k 4), one more a sensitivity later, never one per sibling.
    assert ks[0] == 4 and set(ks[:40]) == {4} and ks[-1] == 5, ks
    assert sum(w.throttles[1].holds.values()) == 5


def test_step_from_recent_rate_comes_from_the_config_and_is_off_by_default() -> None:
    from topo.config import resolve
    assert not StepwiseParams.from_config(resolve({})).step_from_recent_rate
    assert StepwiseParams.from_config(resolve({"backpressure.step_from_recent_rate": True})).step_from_recent_rate


@pytest.mark.parametrize("recent_rate, releases", [(True, [8, 0]), (False, [12, 10])])
def test_step_from_recent_rate_a_bolt_whose_own_limit_rose_forgets_where_its_upstream_overloaded_it(
        recent_rate: bool, releases: list[int]) -> None:
    w, d, th, params = _searching()
    if recent_rate:
        d.params = replace(params, step_from_recent_rate=True)
    w.check(d, 0.0, HIGH)                 # k 8
    w.check(d, 2.0, HIGH)                 # over at 8: 16
    assert th.k == 16 and d.over == {1: 8}
    d.own_limit_rose()                    # its downstream released it: it admits more than it did at k 8
    ks = []
    for t in (4.0, 6.0, 8.0):
        w.check(d, t, 0)
        ks.append(th.k)
    # With the setting no rate is known to overload it: whole steps up (the document's release); without
    # it the bracket (8, 16) stands: its middle, 12, then 10.
    assert ks[1:] == releases


def test_step_from_recent_rate_a_release_is_marked_as_the_limit_rising() -> None:
    th = Throttle(1, RP)
    th.on_signal(Signal(BACKPRESSURE, 1, 10, 1, 1, 0.0), 20_000.0, 0.0)
    down = th.on_signal(Signal(BACKPRESSURE, 1, 10, 2, 2, 2.0), 20_000.0, 2.0)
    up = th.on_signal(Signal(RELEASE, 1, 10, 1, 3, 4.0), 20_000.0, 4.0)
    off = th.on_signal(Signal(RELEASE, 1, 10, 0, 4, 6.0), 20_000.0, 6.0)
    assert down is not None and not down.up and down.rate == 5_000.0
    assert up is not None and up.up and up.rate == 10_000.0
    assert off is not None and off.up and off.rate is None


# -- release_within_intake (a setting; off in the document) ---------------------------------------

IP = StepwiseParams(step=0.5, high_mark=HIGH, low_mark=LOW, sensitivity=2.0, rate_floor=1.0, fine_steps=8,
                    bracket_search=True, within_intake=True)


def _intake_world(params: StepwiseParams = IP) -> tuple[World, Downstream, Throttle]:
    """A bolt (10) holding a spout (1) whose originv is published, as the runtime's states carry it."""
    w = World(params, rates={1: 20_000.0})
    w.view = lambda u: replace(view_of(w.throttle(u)), originv=w.throttle(u).originv)   # type: ignore[method-assign]
    return w, Downstream(10, [1], params, 0.0), w.throttle(1)


def _released(w: World, d: Downstream, th: Throttle, t: float, n: int) -> list[int]:
    """``n`` light windows of ``sensitivity``: the upstream's ``k`` after each."""
    ks = []
    for _ in range(n):
        t += 2.0
        w.check(d, t, 0)
        ks.append(th.k)
    return ks


def test_release_within_intake_a_limited_bolt_releases_no_further_than_one_part_over_what_it_takes_in() -> None:
    w, d, th = _intake_world()
    w.check(d, 0.0, HIGH)
    w.check(d, 2.0, HIGH)
    w.check(d, 4.0, HIGH)                 # three whole steps: 2,500/s
    assert th.k == 24
    d.own_limit(3_000.0)                  # our own limit lets us execute 3,000 input tuples/s
    w.check(d, 6.0, 0)
    # The middle of the bracket (16, 24) is 20, over 3,000/s: one part over it (k = 21, 3,242/s, where our own
    # limit binds) and no further; 3,000/s itself is between k = 21 and 22 (2,973/s).
    assert _released(w, d, th, 6.0, 5) == [21, 21, 21, 21, 21]
    assert th.rate == pytest.approx(20_000.0 * 0.5 ** (21 / 8))
    d.own_limit(None)                     # our downstream let us go: the search goes on to originv
    ks = _released(w, d, th, 16.0, 10)
    assert ks[:3] == [18, 17, 16] and ks[-1] == 0
    assert th.rate is None and th.nominal_rate == 20_000.0 == th.originv


def test_release_within_intake_a_bolt_says_it_holds_an_upstream_at_its_intake_bound_while_it_does() -> None:
    w, d, th = _intake_world()
    for t in (0.0, 2.0, 4.0):
        w.check(d, t, HIGH)
    d.own_limit(3_000.0)
    w.check(d, 6.0, 0)
    assert not d.at_intake
    assert _released(w, d, th, 6.0, 2) == [21, 21] and d.at_intake     # withheld at one part over 3,000/s
    w.check(d, 12.0, HIGH)                # overloaded: stepped down, not held at the bound
    assert not d.at_intake and th.k > 21
    d.own_limit(None)                     # the bound went: releases go on, and it says so
    _released(w, d, th, 12.0, 3)
    assert not d.at_intake


def test_hold_starved_a_relay_held_at_its_intake_bound_is_not_starved_so_the_chain_unwinds() -> None:
    w, d, relay = _held_once()
    bound = False
    w.view = lambda u: replace(relay.view(u), at_intake=bound)   # type: ignore[method-assign]
    t = 0.0
    while t < 5.0:                            # light, the relay idle and holding its spout: withheld
        t = round(t + 0.1, 1)
        tick(w, d, t, 0)
    assert relay.th.k == 1
    bound = True                              # its idle queue is its own bound on the spout: its limit is in use
    t = _until_released(w, d, relay.th, t, 0, limit=15.0)
    assert relay.th.k == 0 and relay.th.rate is None and relay.th.nominal_rate == 8_000.0 == relay.th.originv


def test_release_within_intake_peer_states_carry_the_bound_and_a_state_from_before_it_has_none() -> None:
    peers, _ = _peers()
    state = TaskState(task=5, spout=False, queue_bytes=0, low_mark=LOW, holds={1: 2}, version=(7, 1),
                      at_intake=True)
    assert TaskState.decode(state.encode()).at_intake
    peers.update(5, TaskState.decode(state.encode()), 1.0, lambda t: 0.0)
    v = peers.view(5)
    assert v is not None and v.at_intake and v.holding and not v.starved(LOW, since=0.5)
    import msgpack
    old = msgpack.unpackb(state.encode(), strict_map_key=False)
    del old["at_intake"]
    assert not TaskState.decode(msgpack.packb(old)).at_intake
    peers.update(5, replace(state, at_intake=False, version=(7, 2)), 2.0, lambda t: 0.0)
    v = peers.view(5)
    assert v is not None and not v.at_intake and v.starved(LOW)


def test_release_within_intake_a_step_down_goes_at_least_to_what_the_bolt_takes_in() -> None:
    def steps(intake: float | None) -> int:
        w, d, th = _intake_world()
        w.check(d, 0.0, HIGH)             # over at 0: 8
        w.check(d, 2.0, 0)
        w.check(d, 4.0, 0)                # light at 8: 4
        d.own_limit(intake)
        w.check(d, 6.0, HIGH)             # over at 4, light at 8: the middle (6) ...
        return th.k
    assert steps(None) == 6
    # ... or down to 1,250/s (k = 32), granted one whole step per signal: 4 + 8.
    assert steps(1_250.0) == 12
    assert steps(20_000.0) == 6           # a limit over originv bounds nothing


def test_release_within_intake_is_off_by_default_and_comes_from_the_config() -> None:
    from topo.config import resolve
    assert StepwiseParams.from_config(resolve({})).within_intake is False
    assert StepwiseParams.from_config(resolve({"backpressure.release_within_intake": True})).within_intake
    w, d, th = _intake_world(replace(IP, within_intake=False))
    for t in (0.0, 2.0, 4.0):
        w.check(d, t, HIGH)
    d.own_limit(3_000.0)                  # the setting off: the limit is not read
    w.check(d, 6.0, 0)
    assert _released(w, d, th, 6.0, 5) == [20, 18, 17, 16, 15]



# -- settle_after_release (a setting; off in the document) ----------------------------------------------

def _release_times(level: int, settle: bool, n: int = 6) -> tuple[list[float], Throttle]:
    """Stepped three whole steps down, then the queue held at ``level``: when each of ``n`` releases came."""
    w, d, th, _ = _sloped(queue_smoothing=0.05, settle_after_release=settle)
    for t in (0.0, 0.2, 0.4):
        w.check(d, t, HIGH)
    times: list[float] = []
    t = 0.4
    while len(times) < n and t < 10.0:
        t = round(t + 0.005, 3)
        k = th.k
        tick(w, d, t, level)
        if th.k < k:
            times.append(t)
    return times, th


def _gaps(times: list[float]) -> list[float]:
    return [round(b - a, 3) for a, b in zip(times, times[1:])]


def test_settle_after_release_a_queue_at_work_reads_its_next_light_window_once_the_release_shows() -> None:
    # queue_smoothing 50 ms: a release shows in the smoothed level after 3 time constants (150 ms), and a
    # light window is 50 ms. A queue at work (a quarter of the low mark) releases every light window
    # without the setting, and every 150 + 50 ms with it.
    assert all(g <= 0.06 for g in _gaps(_release_times(LOW // 4, False)[0]))
    assert all(0.2 <= g <= 0.21 for g in _gaps(_release_times(LOW // 4, True)[0]))


def test_settle_after_release_an_idle_queue_releases_at_every_light_window_as_before() -> None:
    # Idle (0 bytes), a queue shows nothing of the rate either way: once the smoothed level is down from the
    # overload, the releases come every 50 ms window with the setting as without it.
    on, off = _gaps(_release_times(0, True)[0]), _gaps(_release_times(0, False)[0])
    assert all(g <= 0.06 for g in on[2:]) and all(g <= 0.06 for g in off)


def test_settle_after_release_a_rise_in_the_settle_time_starts_the_window_no_sooner() -> None:
    w, d, th, _ = _sloped(queue_smoothing=0.05, settle_after_release=True)
    for t in (0.0, 0.2, 0.4):
        w.check(d, t, HIGH)
    t, level = 0.4, LOW // 4
    while th.k == 48 and t < 5.0:
        t = round(t + 0.005, 3)
        tick(w, d, t, level)
    released_at, k = t, th.k
    assert k < 48 and d.low_since == pytest.approx(released_at + 0.15)
    for _ in range(10):                   # the release shows: the level rises under the low mark
        t = round(t + 0.005, 3)
        level += LOW // 8
        tick(w, d, t, level)
    assert d.low_since is not None and d.low_since >= released_at + 0.15 and th.k == k
    while level < LOW + LOW // 4:         # ... and over it: not light, no release
        t = round(t + 0.005, 3)
        level += LOW // 8
        tick(w, d, t, level)
    assert th.k == k


def test_settle_after_release_the_rate_still_comes_back_to_originv_exactly() -> None:
    times, th = _release_times(LOW // 4, True, n=100)
    assert th.k == 0 and th.rate is None and th.nominal_rate == 20_000.0 == th.originv


def test_settle_after_release_is_off_by_default_and_comes_from_the_config() -> None:
    from topo.config import ConfigError, resolve
    assert StepwiseParams.from_config(resolve({})).settle_after_release is False
    assert StepwiseParams.from_config(resolve({"backpressure.settle_after_release": True})).settle_after_release
    with pytest.raises(ConfigError, match="backpressure.settle_after_release"):
        resolve({"backpressure.settle_after_release": "sometimes"})


# -- release_after_limit_in_use (a setting; off in the document) -------------------------------------------

# Light windows and sensitivity of 0.5 s, a settle time of 0.3 s (3 x queue_smoothing), a patience of 2 s
# (4 x sensitivity). The smoothed level falls under the low mark at 0.47 s: the first light window ends at 0.97 s.
INUSE = replace(P, hold_starved=True, release_in_use=True, queue_smoothing=0.1, sensitivity=0.5)


def near(t: float) -> Any:
    """A check runs at a 10 ms tick: a window's end is read within a tick of it."""
    return pytest.approx(t, abs=0.011)


class InUseRelay(Relay):
    """An upstream bolt that also publishes since when its limit has bound its emits (None: it does not)."""

    def __init__(self, w: World, u: int) -> None:
        super().__init__(w, u)
        self.queue = LOW                    # not idle: hold_starved has nothing to say
        self.in_use_at: float | None = None
        self.at_intake = False

    def view(self, u: int) -> UpstreamView:
        return replace(super().view(u), in_use_at=self.in_use_at, at_intake=self.at_intake)


def _light_until(w: World, d: Downstream, t: float, until: float, q: int = 0) -> float:
    while t < until - 1e-9:
        t = round(t + 0.01, 2)
        tick(w, d, t, q)
    return t


def test_release_in_use_a_light_window_counts_only_if_it_began_a_settle_time_after_the_limit_bound() -> None:
    w, d, relay = _held_once(INUSE, InUseRelay)
    relay.in_use_at = 0.0                     # in use from the step on: the window began 0.47 s later
    assert _until_released(w, d, relay.th, 0.0, 0) == near(0.97)
    w, d, relay = _held_once(INUSE, InUseRelay)
    relay.in_use_at = 0.2                     # in use for only 0.27 s when the window began: withheld
    t = _light_until(w, d, 0.0, 1.2)
    assert relay.th.k == 1 and d.unproven == {1: near(0.97)}
    t = _until_released(w, d, relay.th, t, 0)
    assert t == near(1.47) and relay.th.k == 0 and d.unproven == {}   # the window begun at 0.97 s counted


def test_release_in_use_no_release_while_the_relay_s_limit_does_not_bind_until_the_patience_runs_out() -> None:
    w, d, relay = _held_once(INUSE, InUseRelay)
    t = _light_until(w, d, 0.0, 2.9)                  # light from 0.47 s, the relay emitting under its limit
    assert relay.th.k == 1 and not [s for s in w.sent if s.kind == RELEASE]
    assert d.unproven == {1: near(0.97)}      # waiting for evidence since the first window ended
    t = _until_released(w, d, relay.th, t, 0)
    assert t >= d.unproven.get(1, 0.97) + d.params.in_use_patience - 0.011
    assert t == near(2.97) and relay.th.k == 0


def test_release_in_use_a_spell_of_its_limit_in_use_that_ended_is_no_evidence() -> None:
    w, d, relay = _held_once(INUSE, InUseRelay)
    relay.in_use_at = 0.0
    t = _light_until(w, d, 0.0, 0.9)
    relay.in_use_at = None                    # its emits fell under its limit before the window ended
    t = _light_until(w, d, t, 1.5)
    assert relay.th.k == 1
    relay.in_use_at = 1.5                     # bound again: only a window begun 0.3 s later counts
    t = _light_until(w, d, t, 2.2)
    assert relay.th.k == 1                    # the window that ended near 1.97 s began before 1.8 s
    t = _until_released(w, d, relay.th, t, 0)
    assert relay.th.k == 0 and t == near(2.47)


def test_release_in_use_an_overload_starts_the_patience_again() -> None:
    w, d, relay = _held_once(INUSE, InUseRelay)
    t = _light_until(w, d, 0.0, 1.5)
    assert d.unproven == {1: near(0.97)}
    while relay.th.k == 1 and t < 5.0:        # an overload: stepped again, the wait forgotten
        t = round(t + 0.01, 2)
        tick(w, d, t, 2 * HIGH)
    assert relay.th.k == 2 and d.unproven == {}


def test_release_in_use_a_relay_whose_input_is_free_or_a_spout_is_released_as_before() -> None:
    w, d, relay = _held_once(INUSE, InUseRelay)
    relay.holding = False                     # it holds nothing above it: what it receives is not held back
    assert _until_released(w, d, relay.th, 0.0, 0) == near(0.97)
    w, d, spout = _held_once(INUSE, InUseRelay)
    spout.queue = None                        # a spout
    assert _until_released(w, d, spout.th, 0.0, 0) == near(0.97)


def test_release_in_use_a_relay_at_its_intake_bound_is_judged_too() -> None:
    w, d, relay = _held_once(INUSE, InUseRelay)
    relay.holding, relay.at_intake, relay.queue = False, True, 0
    t = _light_until(w, d, 0.0, 1.5)
    assert relay.th.k == 1 and d.unproven == {1: near(0.97)}
    relay.in_use_at = 1.5
    t = _until_released(w, d, relay.th, t, 0)
    assert relay.th.k == 0 and t == near(2.47)


def test_release_in_use_off_releases_at_the_first_light_window() -> None:
    w, d, relay = _held_once(replace(INUSE, release_in_use=False), InUseRelay)
    assert _until_released(w, d, relay.th, 0.0, 0) == near(0.97)


def test_release_in_use_the_chain_still_comes_back_to_originv_exactly() -> None:
    w, d, relay = _held_once(INUSE, InUseRelay)
    t = 0.0
    while relay.th.k < 4 and t < 10.0:
        t = round(t + 0.01, 2)
        tick(w, d, t, 2 * HIGH)
    assert relay.th.k == 4
    relay.in_use_at = t
    while relay.th.k and t < 60.0:
        t = _until_released(w, d, relay.th, t, 0, limit=60.0)
    assert relay.th.k == 0 and relay.th.rate is None and relay.th.nominal_rate == 8_000.0 == relay.th.originv


def test_limit_in_use_a_spell_starts_at_the_first_wait_and_ends_after_two_samples_without_one() -> None:
    from backpressure.policy.stepwise import LimitInUse
    spell = LimitInUse()
    assert not spell.sample(0.0, 0, None) and spell.since is None
    assert not spell.sample(0.1, 5, None) and spell.since is None        # no limit: never in use
    assert not spell.sample(0.2, 5, 1_000.0) and spell.since is None     # a new limit: from its first wait
    assert not spell.sample(0.3, 5, 1_000.0)
    assert spell.sample(0.4, 9, 1_000.0) and spell.since == 0.4
    assert not spell.sample(0.5, 9, 1_000.0) and spell.since == 0.4      # one sample without a wait
    assert not spell.sample(0.6, 12, 1_000.0) and spell.since == 0.4
    assert not spell.sample(0.7, 12, 1_000.0)
    assert spell.sample(0.8, 12, 1_000.0) and spell.since is None        # two in a row: it ended
    assert spell.sample(0.9, 13, 1_000.0) and spell.since == 0.9
    assert spell.sample(1.0, 20, 2_000.0) and spell.since is None        # the limit changed: not yet in use
    assert spell.sample(1.1, 21, 2_000.0) and spell.since == 1.1


def test_release_in_use_peer_states_carry_the_spell_on_the_reader_s_clock_and_a_state_from_before_has_none() -> None:
    peers, _ = _peers()
    state = TaskState(task=5, spout=False, queue_bytes=LOW, low_mark=LOW, holds={1: 2}, version=(7, 1),
                      in_use_age=0.25)
    assert TaskState.decode(state.encode()).in_use_age == 0.25
    peers.update(5, TaskState.decode(state.encode()), 10.0, lambda t: 0.0)
    v = peers.view(5)
    assert v is not None and v.in_use_at == 9.75
    assert not v.limit_unproven(10.05, 0.3) and v.limit_unproven(10.04, 0.3)
    import msgpack
    old = msgpack.unpackb(state.encode(), strict_map_key=False)
    del old["in_use_age"]
    assert TaskState.decode(msgpack.packb(old)).in_use_age is None
    peers.update(5, replace(state, in_use_age=None, version=(7, 2)), 11.0, lambda t: 0.0)
    v = peers.view(5)
    assert v is not None and v.in_use_at is None and v.limit_unproven(20.0, 0.3)


def test_release_in_use_is_off_by_default_and_comes_from_the_config() -> None:
    from topo.config import ConfigError, resolve
    assert StepwiseParams.from_config(resolve({})).release_in_use is False
    assert StepwiseParams.from_config(resolve({"backpressure.release_after_limit_in_use": True})).release_in_use
    with pytest.raises(ConfigError, match="backpressure.release_after_limit_in_use"):
        resolve({"backpressure.release_after_limit_in_use": "sometimes"})
