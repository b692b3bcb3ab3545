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


# --- A7c / A7d: the max rate is what the system takes ------------------------------------------

def test_a7c_a_flag_added_takes_the_max_rate_from_what_the_flagged_component_executes() -> None:
    """The upstream's own rate (a start-up burst, 20,000/s) is not what the flagged task takes
    (1,500/s): with a meter, the first step sends 0.9 of the latter, so the queue drains."""
    rc = RateCoefficient(P)
    ch = rc.check({1: FlagView("sink", True, 1, 0)}, {"sink": 1}, observed=20_000.0, taken={"sink": 1_500.0})
    assert ch is not None and ch.coefficient == 0.9 and not ch.remeasured
    assert rc.max_rate == 1_500.0 and rc.rate() == pytest.approx(1_350.0)


def test_a7c_the_slowest_flagged_component_sets_the_max_rate() -> None:
    rc = RateCoefficient(P)
    flags = {1: FlagView("fast", True, 1, 0), 2: FlagView("slow", True, 1, 0)}
    rc.check(flags, {"fast": 1, "slow": 1}, taken={"fast": 9_000.0, "slow": 1_000.0})
    assert rc.max_rate == 1_000.0 and rc.coefficient == pytest.approx(0.8)


def test_a7c_measured_again_while_flagged_and_only_while_flagged() -> None:
    rc = RateCoefficient(P)
    rc.check({1: FlagView("sink", True, 1, 0)}, {"sink": 1}, taken={"sink": 5_000.0})
    assert rc.check({1: FlagView("sink", True, 1, 0)}, {"sink": 1}, taken={"sink": 5_050.0}) is None  # noise
    assert rc.max_rate == 5_000.0
    ch = rc.check({1: FlagView("sink", True, 1, 0)}, {"sink": 1}, taken={"sink": 1_250.0})   # capacity drops
    assert ch is not None and ch.remeasured and ch.added == 0 and ch.coefficient == 0.9
    assert rc.rate() == pytest.approx(1_125.0)
    # an unflagged component may idle: what it executes is what it was sent, not its capacity
    two = {1: FlagView("sink", True, 1, 0), 2: FlagView("side", False, 0, 0)}
    assert rc.check(two, {"sink": 1, "side": 1}, taken={"sink": 1_250.0, "side": 300.0}) is None
    assert rc.max_rate == 1_250.0
    ch = rc.check({1: FlagView("sink", False, 1, 1)}, {"sink": 1}, taken={"sink": 600.0})
    assert ch is not None and not ch.remeasured and rc.max_rate == 1_250.0


def test_a7d_back_at_one_a_metered_upstream_sends_at_the_max_rate_until_the_downstream_idles() -> None:
    rc = RateCoefficient(P)
    rc.check({1: FlagView("sink", True, 1, 0)}, {"sink": 1}, taken={"sink": 1_500.0})
    ch = rc.check({1: FlagView("sink", False, 1, 1)}, {"sink": 1}, idle=False)
    assert ch is not None and ch.coefficient == 1.0
    assert rc.rate() == 1_500.0                                  # coefficient 1 = the max rate, not off
    assert rc.check({1: FlagView("sink", False, 1, 1)}, {"sink": 1}, idle=False) is None   # holds
    assert rc.check({1: FlagView("sink", False, 1, 1)}, {"sink": 1}, idle=True) is not None
    assert rc.rate() is None and rc.max_rate is None             # idle: the system takes more: off


def test_a7d_an_idle_downstream_doubles_the_metered_rate_until_the_upstreams_own_rate() -> None:
    rc = RateCoefficient(P)
    rc.check({1: FlagView("sink", True, 1, 0)}, {"sink": 1}, observed=10_000.0, taken={"sink": 1_250.0})
    rc.check({1: FlagView("sink", False, 1, 1)}, {"sink": 1}, idle=False)
    assert rc.coefficient == 1.0 and rc.rate() == 1_250.0
    clear = {1: FlagView("sink", False, 1, 1)}
    seen = []
    while rc.check(clear, {"sink": 1}, idle=True) is not None:
        seen.append(rc.rate())
    assert seen == [2_500.0, 5_000.0, None]                     # 10,000 would reach its own rate: off


def test_a7d_an_unmetered_upstream_turns_its_limiter_off_at_one() -> None:
    rc = RateCoefficient(P)
    rc.check({1: FlagView("sink", True, 1)}, {"sink": 1}, observed=2_000.0)    # no meter: A7
    rc.check({1: FlagView("sink", False, 1)}, {"sink": 1})
    assert rc.coefficient == 1.0 and rc.rate() is None


# --- adversarial cases of 004's rules ----------------------------------------------------------

def test_a6_siblings_flagging_on_either_side_of_a_check_step_once_each() -> None:
    """Two tasks of one component flag: two steps whether one check sees both or each its own
    (one step per check, or per component, would give 0.9)."""
    together = RateCoefficient(P)
    both = {1: FlagView("b", True, 1, 0), 2: FlagView("b", True, 1, 0)}
    assert together.check(both, {"b": 2}).coefficient == 0.8
    apart = RateCoefficient(P)
    apart.check({1: FlagView("b", True, 1, 0), 2: FlagView("b", False, 0, 0)}, {"b": 2})
    assert apart.check(both, {"b": 2}).coefficient == 0.8
    assert apart.check(both, {"b": 2}) is None                    # nothing new: no third step


def test_a3_a_busy_spell_across_the_edge_of_a_period_still_raises() -> None:
    """The window is the last full period on the sample grid, not a tumbling one: 3 samples
    over the mark at the end of one period and 2 at the start of the next are 5 of 10."""
    m = TaskMarks(P)                                   # 10 s, 10 samples
    for t in range(7):
        m.observe(float(t), 0.3)                       # between the marks: nothing moves
    for t in (7, 8, 9):
        assert not m.observe(float(t), 0.75).raised
    assert not m.observe(10.0, 0.75).raised           # 4 of the last 10
    ch = m.observe(11.0, 0.75)
    assert ch.raised and (m.first_threshold, m.second_threshold) == (0.8, 0.3)


def test_a3_an_observation_between_grid_points_adds_no_sample() -> None:
    """Uniform samples: observing ten times within one grid interval counts once."""
    m = TaskMarks(P)
    for i in range(10):
        ch = m.observe(0.05 * i, 0.75)
    assert not ch.raised and m.window.time_ratio == pytest.approx(0.1)


def test_a6_a_flag_removed_and_added_again_between_two_checks_is_one_of_each() -> None:
    m = TaskMarks(P)
    rc = RateCoefficient(P)
    view = lambda: {1: FlagView("b", m.flagged, m.generation, m.removals)}   # noqa: E731
    m.observe(0.0, 0.75)
    assert rc.check(view(), {"b": 1}).coefficient == 0.9
    m.observe(0.1, 0.1)                                # removed ...
    m.observe(0.2, 0.75)                               # ... and added again before the next check
    ch = rc.check(view(), {"b": 1})
    assert ch is not None and (ch.added, ch.removed) == (1, 1) and ch.coefficient == 0.9   # net nothing
    m.observe(0.3, 0.1)
    m.observe(0.4, 0.75)
    m.observe(0.5, 0.1)                                # removed, added, removed: one step back
    assert rc.check(view(), {"b": 1}).coefficient == 1.0


def test_a6_a_flagged_task_restarting_gives_its_step_back_and_its_new_flag_takes_one() -> None:
    rc = RateCoefficient(P)
    for gen in (1, 2, 3):                               # three steps (A5 re-adds)
        rc.check({1: FlagView("b", True, gen, 0)}, {"b": 1})
    assert rc.coefficient == 0.7
    fresh = TaskMarks(P)                                # the same task id, restarted: counters from 0
    assert rc.check({1: FlagView("b", fresh.flagged, fresh.generation, fresh.removals)}, {"b": 1}).coefficient == 0.8
    fresh.observe(0.0, 0.75)                            # its new flag (generation 1 < 3) is still an add
    assert rc.check({1: FlagView("b", fresh.flagged, fresh.generation, fresh.removals)}, {"b": 1}).coefficient == 0.7


def test_a3_a5_at_the_top_of_the_range_a_busy_window_still_re_adds_the_flag() -> None:
    """Marks that cannot rise further must not stop the upstream stepping down."""
    m = TaskMarks(P)
    m.first_threshold, m.second_threshold = 0.9, 0.4
    rc = RateCoefficient(P)
    view = lambda: {1: FlagView("b", m.flagged, m.generation, m.removals)}   # noqa: E731
    m.observe(0.0, 0.95)
    assert rc.check(view(), {"b": 1}).coefficient == 0.9
    for t in range(1, 5):
        m.observe(float(t), 0.95)
    assert (m.first_threshold, m.second_threshold) == (0.9, 0.4)
    assert rc.check(view(), {"b": 1}).coefficient == 0.8


def test_a4_raised_marks_unflag_at_their_own_second_threshold() -> None:
    """At 0.9 / 0.4 the flag goes at 0.4 (not the default 0.2) and the marks come down one step."""
    m = TaskMarks(P)
    m.first_threshold, m.second_threshold = 0.9, 0.4
    m.observe(0.0, 0.9)
    assert m.observe(1.0, 0.41).flag is None and m.flagged
    ch = m.observe(2.0, 0.4)
    assert ch.flag == FLAG_REMOVED and ch.lowered and (m.first_threshold, m.second_threshold) == (0.8, 0.3)


def test_a1_the_gap_between_the_marks_never_changes_at_either_end() -> None:
    m = TaskMarks(P)
    for d in (+1, +1, +1, +1, -1, -1, -1, -1, -1, -1, +1):
        m._move(d)
        assert m.first_threshold - m.second_threshold == pytest.approx(0.5)
        assert 0.6 <= m.first_threshold <= 0.9 and 0.1 <= m.second_threshold <= 0.4
    assert (m.first_threshold, m.second_threshold) == (0.7, 0.2)


def test_a4_at_the_bottom_a_low_level_neither_lowers_nor_flaps() -> None:
    m = TaskMarks(P)
    m.first_threshold, m.second_threshold = 0.6, 0.1
    m.observe(0.0, 0.6)
    ch = m.observe(1.0, 0.05)
    assert ch.flag == FLAG_REMOVED and not ch.lowered and (m.first_threshold, m.second_threshold) == (0.6, 0.1)
    assert m.observe(2.0, 0.0) == m.observe(3.0, 0.0) and not m.observe(4.0, 0.0).lowered


def test_a6_a8_several_flags_at_the_floor_step_to_it_then_ask_for_a_task_never_under_it() -> None:
    """At 0.3 two siblings flag in one check: the first steps to 0.2, the second finds the floor
    and (both of 2 tasks flagged) asks for one more task; clamping 0.1 afterwards would not ask."""
    rc = RateCoefficient(P)
    rc.coefficient = 0.3
    ch = rc.check({1: FlagView("b", True, 1, 0), 2: FlagView("b", True, 1, 0)}, {"b": 2})
    assert ch.coefficient == 0.2 and ch.scale_out == ("b",)
    ch = rc.check({1: FlagView("b", True, 2, 0), 2: FlagView("b", True, 2, 0), 3: FlagView("c", True, 1, 0)},
                  {"b": 2, "c": 4})
    assert ch.coefficient == 0.2 and ch.added == 3 and ch.scale_out == ("b",)   # c: 1 of 4 flagged


# --- the driver: meter and acting at once (fake clock, fake tasks) -----------------------------

class _Task:
    """A task as the driver sees it: a queue, an executed count, a limiter."""

    def __init__(self, task_id: int, component: str, upstream: tuple[int, ...] = (), spout: bool = False) -> None:
        self.task_id, self.component, self.upstream_task_ids, self.is_spout = task_id, component, upstream, spout
        self.bytes, self.executed, self.rates = 0, 0, []

    def queue_bytes(self) -> int:
        return self.bytes

    def observed_rate(self) -> float:
        return 20_000.0                    # the spout's own (start-up) rate: not what the sink takes

    def executed_count(self) -> int:
        return self.executed

    def set_rate(self, r: float | None) -> None:
        self.rates.append(r)

    def show(self, display: object) -> None:
        pass

    def count_signal(self, direction: str, kind: str) -> None:
        pass


async def test_driver_a_flag_limits_the_upstream_at_once_to_0_9_of_what_the_sink_executed() -> None:
    from backpressure.drivers.adaptive import AdaptiveFlowControl
    now = [0.0]
    params = AdaptiveParams(capacity=1000, check_interval=0.2, backpressure_window=2.0, samples=20)
    flow = AdaptiveFlowControl(params, clock=lambda: now[0], period=3600.0)   # the timer never fires
    spout, sink = _Task(1, "spout", spout=True), _Task(2, "sink", upstream=(1,))
    await flow.start([spout, sink])
    try:
        now[0], sink.executed, sink.bytes = 0.2, 300, 700      # 1,500/s executed; over the first threshold
        flow.poll(sink)                                         # the sink's own poll: no check ran
        assert spout.rates == [pytest.approx(1_350.0)]
        now[0], sink.bytes = 0.3, 150                           # under the second threshold
        flow.poll(sink)
        assert spout.rates[-1] == pytest.approx(1_500.0)       # back at 1.0: the max rate, not off (A7d)
    finally:
        await flow.stop()
    assert spout.rates[-1] is None                              # stop releases every limit


def test_a8_with_a_metered_max_rate_the_floor_is_read_against_the_upstreams_own_rate() -> None:
    """Offered 20,000/s, taken 800/s: each step drains the queue, so the coefficient never nears
    0.2, yet the upstream sends 4% of its own rate: the add asks for a task and still steps."""
    rc = RateCoefficient(P)
    flags = {1: FlagView("b", True, 1, 0), 2: FlagView("b", False, 0, 0)}
    ch = rc.check(flags, {"b": 2}, observed=20_000.0, taken={"b": 800.0})
    assert ch.scale_out == ("b",) and ch.coefficient == 0.9 and rc.own_rate == 20_000.0
    easy = RateCoefficient(P)                      # taken 5,000 of 20,000: 0.225 > 0.2, no task
    assert easy.check(flags, {"b": 2}, observed=20_000.0, taken={"b": 5_000.0}).scale_out == ()
    one_of_three = RateCoefficient(P)              # and still only with half the tasks flagged
    three = {**flags, 3: FlagView("b", False, 0, 0)}
    assert one_of_three.check(three, {"b": 3}, observed=20_000.0, taken={"b": 800.0}).scale_out == ()


def test_a6c_an_idle_downstream_gives_every_step_back_at_once_to_the_metered_rate() -> None:
    rc = RateCoefficient(P)
    for gen in (1, 2, 3, 4):
        rc.check({1: FlagView("b", True, gen, 0)}, {"b": 1}, taken={"b": 1_000.0})
    assert rc.coefficient == 0.6
    clear = {1: FlagView("b", False, 4, 1)}
    assert rc.check(clear, {"b": 1}, idle=False).coefficient == 0.7       # the removal: one step
    assert rc.check(clear, {"b": 1}, idle=False).coefficient == 0.8       # A6b: one per check
    assert rc.check(clear, {"b": 1}, starved=True).coefficient == 1.0     # a queue empty: all of them
    assert rc.rate() == 1_000.0                                            # still limited (A7d)
    unmetered = RateCoefficient(P)
    unmetered.max_rate, unmetered.coefficient = 1_000.0, 0.6
    assert unmetered.check({}, {}, idle=True).coefficient == 0.7           # no meter: one step (A6b)
