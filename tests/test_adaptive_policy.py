"""Every rule of the adaptive policy (document 004, A1-A10 of its docstring), pure, fake clock."""
from __future__ import annotations

import pytest

from backpressure.policy.adaptive import (FLAG_ADDED, FLAG_REMOVED, SCALE_IN, SCALE_OUT, AdaptiveParams,
                                          Autoscaler, BackpressureWindow, Balancer, FlagView, RateCoefficient,
                                          TaskMarks)
from topo.config import resolve

P = AdaptiveParams(capacity=1000, backpressure_window=10.0, samples=10, cooldown=30.0)


def test_document_004_defaults_and_config() -> None:
    p = AdaptiveParams.from_config(resolve())
    assert (p.first_threshold, p.first_range, p.second_threshold, p.second_range) == (0.7, (0.6, 0.9), 0.2, (0.1, 0.4))
    assert (p.threshold_step, p.preset_ratio, p.coefficient_step, p.preset_coefficient, p.scale_ratio) == (
        0.1, 0.5, 0.1, 0.2, 0.5)
    with pytest.raises(ValueError):
        AdaptiveParams(capacity=1000, first_threshold=0.95)
    from backpressure.drivers.adaptive import AdaptiveFlowControl
    from backpressure.drivers.factory import make_flow_control
    assert isinstance(make_flow_control(resolve({"backpressure.policy": "adaptive"}), "t"), AdaptiveFlowControl)


def test_a1_marks_move_together_within_their_ranges() -> None:
    m = TaskMarks(P)
    for expected in ((0.8, 0.3), (0.9, 0.4), (0.9, 0.4)):
        m._move(+1)
        assert (m.first_threshold, m.second_threshold) == expected
    for expected in ((0.8, 0.3), (0.7, 0.2), (0.6, 0.1), (0.6, 0.1)):
        m._move(-1)
        assert (m.first_threshold, m.second_threshold) == expected


def test_a2_flag_at_the_first_threshold_kept_while_set() -> None:
    m = TaskMarks(P)
    assert m.observe(0.0, 0.69).flag is None
    assert m.observe(1.0, 0.7).flag == FLAG_ADDED          # "greater than or equal"
    assert m.observe(2.0, 0.75).flag is None and m.flagged  # kept, not added twice
    for level in (0.6, 0.3, 0.21):                          # A4 hysteresis: between the marks
        assert m.observe(3.0, level).flag is None and m.flagged


def test_a3_raise_after_half_a_window_over_the_mark_then_reset() -> None:
    m = TaskMarks(P)                      # 10 s window, 10 samples: one per second
    for t in range(4):
        m.observe(float(t), 0.75)
    assert m.first_threshold == 0.7      # 4 of 10 samples: under the preset ratio
    ch = m.observe(4.0, 0.75)             # the 5th: 0.5 of the window
    assert ch.raised and ch.flag == FLAG_ADDED and (m.first_threshold, m.second_threshold) == (0.8, 0.3)
    assert m.window.time_ratio == 0.0    # cleared
    assert m.observe(5.0, 0.75).flag is None     # under the new first threshold: nothing


def test_a3_the_window_holds_the_last_state_over_gaps_and_counts_a_full_period() -> None:
    w = BackpressureWindow(10.0, 10)
    w.sample(0.0, True)
    w.sample(4.0, False)                  # 1, 2, 3 held as over; 4 observed not over
    assert w.time_ratio == pytest.approx(0.4)
    w.sample(30.0, False)                 # a long gap: the window only holds the last period
    assert w.time_ratio == 0.0


def test_a3_at_the_top_of_the_range_the_marks_stay_but_the_window_clears() -> None:
    m = TaskMarks(P)
    m.first_threshold, m.second_threshold = 0.9, 0.4
    for t in range(5):
        ch = m.observe(float(t), 0.95)
    assert ch.raised and m.first_threshold == 0.9 and m.window.time_ratio == 0.0


def test_a4_unflag_at_the_second_threshold_lowering_raised_marks() -> None:
    m = TaskMarks(P)
    m.observe(0.0, 0.7)
    ch = m.observe(1.0, 0.2)
    assert ch.flag == FLAG_REMOVED and ch.lowered                 # the document's example: 0.7 -> 0.6
    assert (m.first_threshold, m.second_threshold) == (0.6, 0.1)
    ch = m.observe(2.0, 0.1)
    assert ch.flag is None and not ch.lowered and m.first_threshold == 0.6   # at the bottom: kept


def test_a5_a_raise_re_adds_the_flag_for_the_upstream() -> None:
    m = TaskMarks(P)
    rc = RateCoefficient(P)
    view = lambda: {1: FlagView("b", m.flagged, m.generation)}   # noqa: E731
    m.observe(0.0, 0.75)
    assert rc.check(view(), {"b": 1}).coefficient == 0.9
    for t in range(1, 5):
        m.observe(float(t), 0.85)          # still over 0.7, then raised at the 5th sample
    assert rc.check(view(), {"b": 1}).coefficient == 0.8
    assert rc.check(view(), {"b": 1}) is None      # nothing new since


def test_a6_each_flag_added_or_removed_moves_the_coefficient_with_a_floor() -> None:
    rc = RateCoefficient(P)
    flags = {1: FlagView("b", True, 1), 2: FlagView("b", True, 1)}
    assert rc.check(flags, {"b": 2}).coefficient == 0.8         # siblings: two steps
    assert rc.check({1: FlagView("b", False, 1), 2: FlagView("b", True, 1)}, {"b": 2}).coefficient == 0.9
    assert rc.check({2: FlagView("b", True, 1)}, {"b": 2}) is None           # task 1 gone, but unflagged
    assert rc.check({}, {"b": 2}).coefficient == 1.0              # task 2 gone (restart): its flag with it
    for gen in range(2, 12):
        rc.check({3: FlagView("b", True, gen)}, {"b": 1})
    assert rc.coefficient == 0.2 and rc.at_floor                 # never under the preset value


def test_a7_rate_is_coefficient_times_max_rate_and_lower_never_faster() -> None:
    rc = RateCoefficient(P)
    rc.max_rate = 1000.0                       # 1 ms per tuple at full speed
    assert rc.rate() is None
    rc.coefficient = 0.5
    assert rc.rate() == 500.0 and rc.send_interval(0.001) == pytest.approx(0.002)
    rc.coefficient = 0.2
    assert rc.rate() == 200.0 and rc.send_interval(0.001) > 0.002


def test_a7_the_max_rate_is_measured_at_the_first_step() -> None:
    rc = RateCoefficient(P)
    assert rc.check({1: FlagView("b", True, 1)}, {"b": 1}, observed=5000.0).coefficient == 0.9
    assert rc.max_rate == 5000.0 and rc.rate() == 4500.0
    rc.check({1: FlagView("b", True, 2)}, {"b": 1}, observed=4500.0)    # held by its limit: kept
    assert rc.max_rate == 5000.0 and rc.rate() == pytest.approx(4000.0)


def test_a7b_a_step_cuts_the_rate_the_upstream_sends_when_something_else_holds_it() -> None:
    """The max rate an endless spout shows while it fills empty queues is far over what the
    bottleneck takes; once the hard bound holds it at 1,000/s, a step must cut that rate."""
    rc = RateCoefficient(P)
    rc.check({1: FlagView("b", True, 1)}, {"b": 1}, observed=25_000.0)  # the start-up burst
    assert rc.rate() == pytest.approx(22_500.0)
    ch = rc.check({1: FlagView("b", True, 2)}, {"b": 1}, observed=1_000.0)   # held at 1,000/s by the bound
    assert ch is not None and ch.coefficient == 0.8
    assert rc.max_rate == pytest.approx(1_000.0 / 0.9) and rc.rate() == pytest.approx(800.0 / 0.9)
    assert rc.rate() < 1_000.0                                       # the step bites
    rc.check({1: FlagView("b", False, 2)}, {"b": 1}, observed=0.0)
    assert rc.max_rate == pytest.approx(1_000.0 / 0.9)               # no flag added: not measured
    rc.check({1: FlagView("b", True, 3)}, {"b": 1}, observed=0.0)    # a stalled upstream: kept (never 0)
    assert rc.max_rate == pytest.approx(1_000.0 / 0.9)


def test_a8_scale_out_at_the_floor_with_half_the_tasks_flagged() -> None:
    rc = RateCoefficient(P)
    rc.coefficient = 0.2
    ch = rc.check({1: FlagView("b", True, 1), 2: FlagView("b", False, 0)}, {"b": 2})
    assert ch.scale_out == ("b",) and rc.coefficient == 0.2
    rc2 = RateCoefficient(P)
    rc2.coefficient = 0.2
    ch = rc2.check({1: FlagView("b", True, 1), 2: FlagView("b", False, 0), 3: FlagView("b", False, 0)}, {"b": 3})
    assert ch.scale_out == ()                          # 1/3 < 0.5
    rc3 = RateCoefficient(P)
    rc3.coefficient = 0.3
    assert rc3.check({1: FlagView("b", True, 1)}, {"b": 1}).scale_out == ()     # not at the floor: a step


def test_a8_autoscaler_respects_max_parallelism_and_cooldown() -> None:
    a = Autoscaler(AdaptiveParams(capacity=1, max_parallelism=3, cooldown=30.0), {"b": 2})
    d = a.request_out("b", 0.0)
    assert d is not None and (d.kind, d.parallelism) == (SCALE_OUT, 3)
    assert a.request_out("b", 100.0) is None           # at max_parallelism
    a2 = Autoscaler(AdaptiveParams(capacity=1, max_parallelism=8, cooldown=30.0), {"b": 2})
    a2.request_out("b", 0.0)
    assert a2.request_out("b", 29.9) is None            # cool-down
    assert a2.request_out("b", 30.0).parallelism == 4


def test_a9_scale_in_when_quiet_for_a_cooldown_never_under_the_initial() -> None:
    a = Autoscaler(AdaptiveParams(capacity=1, cooldown=30.0), {"b": 2})
    a.request_out("b", 0.0)
    assert a.consider_in("b", True, 10.0) is None       # too soon after the scale out
    assert a.consider_in("b", False, 35.0) is None      # not quiet: the quiet spell starts over
    assert a.consider_in("b", True, 40.0) is None       # quiet since 40 only
    assert a.consider_in("b", True, 69.9) is None
    d = a.consider_in("b", True, 70.0)
    assert d is not None and (d.kind, d.parallelism) == (SCALE_IN, 2)
    assert a.consider_in("b", True, 200.0) is None      # back at the initial parallelism


def test_a9_the_cooldown_runs_from_when_an_action_was_carried_out() -> None:
    a = Autoscaler(AdaptiveParams(capacity=1, max_parallelism=8, cooldown=30.0), {"b": 2})
    a.request_out("b", 0.0)
    assert a.consider_in("b", True, 1.0) is None        # quiet while the rescale drains...
    a.completed("b", 5.0)                               # ...the task runs from 5 s on
    assert a.request_out("b", 34.9) is None             # cool-down from 5 s
    assert a.consider_in("b", True, 6.0) is None        # quiet from 6 s: the spell before 5 s is gone
    assert a.consider_in("b", True, 35.9) is None
    assert a.consider_in("b", True, 36.0) is not None


def test_a10_balancer_moves_share_from_the_fullest_to_the_emptiest() -> None:
    b = Balancer(P, [11, 12, 13])
    shares = b.rebalance({11: 0.5, 12: 0.2, 13: 0.2})        # the document's fig. 9
    assert shares is not None
    assert shares[11] == pytest.approx(0.3)
    assert shares[12] == shares[13] == pytest.approx(1 / 3 + 0.1 / 6)
    assert sum(shares.values()) == pytest.approx(1.0)
    assert b.rebalance({11: 0.3, 12: 0.3, 13: 0.3}) is None   # equal levels: nothing
    for _ in range(200):
        b.rebalance({11: 0.9, 12: 0.0, 13: 0.0})
    assert b.shares[11] >= P.min_share - 1e-9
    b.resize([11, 12, 13, 14])                                  # scaled out: the new task gets a share
    assert sum(b.shares.values()) == pytest.approx(1.0) and b.shares[14] > 0


def test_a6_a_removed_flag_gives_back_one_step() -> None:
    rc = RateCoefficient(P)
    for gen in (1, 2, 3):                                   # A5 re-adds while the overload lasts
        rc.check({1: FlagView("b", True, gen), 2: FlagView("b", True, 1)}, {"b": 2})
    assert rc.coefficient == 0.6                             # 3 steps for task 1, 1 for task 2
    assert rc.check({1: FlagView("b", False, 3), 2: FlagView("b", True, 1)}, {"b": 2}).coefficient == 0.7
    assert rc.check({1: FlagView("b", False, 3), 2: FlagView("b", True, 1)}, {"b": 2}) is None   # 2 still flagged
    assert rc.check({1: FlagView("b", False, 3), 2: FlagView("b", False, 1)}, {"b": 2}).coefficient == 0.8


def test_a6b_each_check_with_no_downstream_flag_gives_back_one_more_step_until_full_speed() -> None:
    rc = RateCoefficient(P)
    rc.max_rate = 1000.0
    for gen in (1, 2, 3, 4):
        rc.check({1: FlagView("b", True, gen)}, {"b": 1})
    assert rc.coefficient == 0.6 and rc.rate() == 600.0
    clear = {1: FlagView("b", False, 4)}
    seen = [rc.check(clear, {"b": 1}).coefficient]           # the removal: one step
    while (ch := rc.check(clear, {"b": 1})) is not None:      # then one per check, not all at once
        seen.append(ch.coefficient)
    assert seen == [0.7, 0.8, 0.9, 1.0] and rc.rate() is None  # the limiter off only at the end
    assert rc.check(clear, {"b": 1}) is None                  # at 1.0: nothing more
    rc.check({1: FlagView("b", True, 5)}, {"b": 1})
    assert rc.coefficient == 0.9
    unrelated = {1: FlagView("b", True, 5), 2: FlagView("c", False, 0)}
    assert rc.check(unrelated, {"b": 1, "c": 1}) is None      # one downstream still flagged: no step
