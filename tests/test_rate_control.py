"""Document 001's rate controller, Spark's DStream PID rules and the fixed cap, on a fake clock.

Times are plain floats (seconds); the controllers never read a clock, so each test is
a script of batch starts, ends and submissions. Tests of a rule read off one batch pass
``smooth_batches=1`` (the document's reading), as they pass ``headroom=0.0``, so each
checks its own rule; the three-batch window has its own tests at the end.
"""
from __future__ import annotations

import math

import pytest

from backpressure.policy.rate_control import (AdaptiveRateController, BatchInfo, DStreamPIDController,
                                              FixedRateController, NoRateController, brelx_for,
                                              late_start_rate,
                                              make_controller, per_partition_cap, prelx_for)


def batch(start: float, proc: float, n: int, wait: float = 0.0) -> BatchInfo:
    return BatchInfo(start=start, end=start + proc, processing_time=proc, waiting_time=wait, elements=n)


def run_batch(c, start: float, proc: float, n: int, wait: float = 0.0) -> None:
    c.on_batch_start(start)
    c.on_batch_end(batch(start, proc, n, wait))


# -- relaxation parameters -------------------------------------------------------------

def test_prelx_is_min_of_50ms_and_5_percent():
    assert prelx_for(1.0) == pytest.approx(0.05)
    assert prelx_for(4.0) == pytest.approx(0.05)
    assert prelx_for(0.5) == pytest.approx(0.025)


def test_brelx_is_50ms_over_one_second_else_5_percent():
    assert brelx_for(2.0) == pytest.approx(0.05)
    assert brelx_for(0.5) == pytest.approx(0.025)
    assert brelx_for(1.0) == pytest.approx(0.05)


def test_per_partition_cap_floors_and_never_zero():
    assert per_partition_cap(1000.0, 1.0, 4) == 250
    assert per_partition_cap(999.0, 1.0, 4) == 249
    assert per_partition_cap(1.0, 1.0, 4) == 1
    assert per_partition_cap(None, 1.0, 4) is None
    assert per_partition_cap(300.0, 2.0, 4) == 150


# -- slow start ---------------------------------------------------------------------------

def test_slow_start_is_n_per_partition_per_second():
    c = AdaptiveRateController(1.0, 4, headroom=0.0, initial_rate_per_partition=200)
    assert c.on_submit(0.0) == 800
    assert c.last_case == 0
    # still slow start while the first batch runs
    c.on_batch_start(0.0)
    assert c.on_submit(1.0) == 800


@pytest.mark.parametrize("n", [50, 1000, 10, 5000])
def test_slow_start_bounds(n):
    with pytest.raises(ValueError):
        AdaptiveRateController(1.0, 4, headroom=0.0, initial_rate_per_partition=n)


# -- case 1: finished, off the interval: PID with blockTime 0 --------------------------------

def test_case1_pid_after_fast_batch():
    c = AdaptiveRateController(1.0, 2, headroom=0.0, initial_rate_per_partition=500, min_rate=10)
    assert c.on_submit(0.0) == 1000
    run_batch(c, 0.0, 0.5, 1000)          # processingRate 2000/s, no wait
    # error = 1000 - 2000 = -1000; historicalError = 0 -> newRate = 1000 + 1000
    assert c.on_submit(1.0) == pytest.approx(2000)
    assert c.last_case == 1


def test_case1_pid_with_waiting_time_uses_integral_term():
    c = AdaptiveRateController(1.0, 2, headroom=0.0, initial_rate_per_partition=500, min_rate=10)
    c.on_submit(0.0)
    run_batch(c, 0.1, 1.5, 1200, wait=0.1)  # processingRate 800
    # error = 1000 - 800 = 200; hist = 0.1 * 800 / 1 = 80; new = 1000 - 200 - 0.2*80 = 784
    assert c.on_submit(1.0) == pytest.approx(784)


def test_min_rate_floor():
    c = AdaptiveRateController(1.0, 2, headroom=0.0, initial_rate_per_partition=500, min_rate=300)
    c.on_submit(0.0)
    run_batch(c, 0.0, 10.0, 100, wait=5.0)  # processingRate 10/s
    assert c.on_submit(11.0) == 300


# -- case 2: finished within [t_interval - prelx, t_interval] --------------------------------

def test_case2_keeps_latest_rate_of_the_finished_batch():
    c = AdaptiveRateController(1.0, 2, headroom=0.0, initial_rate_per_partition=500)
    c.on_submit(0.0)
    run_batch(c, 0.0, 0.97, 1500)           # in [0.95, 1.0]
    assert c.on_submit(1.0) == 1000         # the cap that batch was admitted with
    assert c.last_case == 2


def test_case2_window_edges_are_inclusive():
    for proc in (0.95, 1.0):
        c = AdaptiveRateController(1.0, 2, headroom=0.0, initial_rate_per_partition=500)
        c.on_submit(0.0)
        run_batch(c, 0.0, proc, 1500)
        assert c.on_submit(1.0) == 1000 and c.last_case == 2
    c = AdaptiveRateController(1.0, 2, headroom=0.0, initial_rate_per_partition=500)
    c.on_submit(0.0)
    run_batch(c, 0.0, 0.94, 1500)
    c.on_submit(1.0)
    assert c.last_case == 1


def test_formula8_three_batches_in_window_average_their_rates():
    c = AdaptiveRateController(1.0, 2, headroom=0.0, initial_rate_per_partition=500)
    c.on_submit(0.0)
    run_batch(c, 0.0, 0.96, 960)     # 1000/s
    c.on_submit(1.0)
    run_batch(c, 1.0, 0.98, 1176)    # 1200/s
    c.on_submit(2.0)
    run_batch(c, 2.0, 1.0, 1400)     # 1400/s
    assert c.on_submit(3.0) == pytest.approx(1200)
    assert c.last_case == 2


def test_formula8_needs_all_three_in_window():
    c = AdaptiveRateController(1.0, 2, headroom=0.0, initial_rate_per_partition=500)
    c.on_submit(0.0)
    run_batch(c, 0.0, 0.5, 500)      # out of window
    r1 = c.on_submit(1.0)
    run_batch(c, 1.0, 0.98, 1176)
    c.on_submit(2.0)
    run_batch(c, 2.0, 1.0, 1400)
    # only two in the window: keep the cap batch 3 ran with (the one submitted at 2.0)
    assert c.on_submit(3.0) == pytest.approx(r1)


# -- case 3: previous batch still running ------------------------------------------------------

def test_case3_block_time_formula3():
    c = AdaptiveRateController(1.0, 2, headroom=0.0, initial_rate_per_partition=500)
    assert c.block_time(submit_time=2.0, t_batchst=1.2) == pytest.approx(0.2)
    assert c.block_time(submit_time=2.0, t_batchst=1.0) == pytest.approx(0.05)   # brelx
    assert c.block_time(submit_time=2.5, t_batchst=1.0) == pytest.approx(0.05)


def test_case3_pid_adds_kblock_blocktime():
    c = AdaptiveRateController(1.0, 2, headroom=0.0, initial_rate_per_partition=500, min_rate=10)
    c.on_submit(0.0)                               # cap 1000
    run_batch(c, 0.0, 1.2, 1200, wait=0.1)         # pr = 1000
    c.on_batch_start(1.2)                          # the next batch starts late, still running at 2.0
    rate = c.on_submit(2.0)
    assert c.last_case == 3
    block = 0.2
    error = 1000 - 1200 / (1.2 + 0.3 * block)
    hist = (0.1 + 0.3 * block) * 1000 / 1.0
    assert rate == pytest.approx(1000 - error - 0.2 * hist)
    # the same batch finishing: the running state clears
    c.on_batch_end(batch(1.2, 1.0, 900))
    c.on_submit(3.0)
    assert c.last_case in (1, 2)


def test_case3_rate_is_lower_than_case1_for_the_same_history():
    a = AdaptiveRateController(1.0, 2, headroom=0.0, initial_rate_per_partition=500, min_rate=10)
    b = AdaptiveRateController(1.0, 2, headroom=0.0, initial_rate_per_partition=500, min_rate=10)
    for c in (a, b):
        c.on_submit(0.0)
        run_batch(c, 0.0, 1.2, 1200, wait=0.1)
    b.on_batch_start(1.2)
    assert b.on_submit(2.0) < a.on_submit(2.0)


def test_submission_is_idempotent_without_news():
    c = AdaptiveRateController(1.0, 2, headroom=0.0, initial_rate_per_partition=500, min_rate=10)
    c.on_submit(0.0)
    run_batch(c, 0.0, 0.5, 1000)
    r1 = c.on_submit(1.0)
    assert c.on_submit(2.0) == r1
    assert c.on_submit(3.0) == r1


def test_latest_rate_is_the_cap_the_batch_ran_with():
    c = AdaptiveRateController(1.0, 2, smooth_batches=1, headroom=0.0, initial_rate_per_partition=500, min_rate=10)
    c.on_submit(0.0)
    run_batch(c, 0.0, 0.5, 1000)
    r1 = c.on_submit(1.0)        # 2000
    run_batch(c, 1.0, 0.5, 2000)  # ran with cap r1, pr = 4000
    # error = 2000 - 4000 -> new = 2000 + 2000
    assert c.on_submit(2.0) == pytest.approx(r1 + 2000)


def test_empty_batches_do_not_feed_the_pid_but_end_the_running_state():
    c = AdaptiveRateController(1.0, 2, headroom=0.0, initial_rate_per_partition=500, min_rate=10)
    c.on_submit(0.0)
    run_batch(c, 0.0, 0.5, 1000)
    r1 = c.on_submit(1.0)
    c.on_batch_start(1.0)
    c.on_batch_end(batch(1.0, 0.1, 0))
    assert c.on_submit(2.0) == r1 and c.last_case == 1


def test_derivative_term_when_kd_set():
    c = AdaptiveRateController(1.0, 2, smooth_batches=1, headroom=0.0, initial_rate_per_partition=500, min_rate=10)
    c.kd = 0.5
    c.on_submit(0.0)
    run_batch(c, 0.0, 0.5, 1000)       # cap 1000, error_1 = -1000
    r1 = c.on_submit(1.0)              # first PID: no previous error -> no dError
    assert r1 == pytest.approx(2000)
    run_batch(c, 1.0, 0.5, 1500)       # cap 2000, pr 3000, error = -1000
    # dError = (-1000 - -1000) / (1.5 - 0.5) = 0
    assert c.on_submit(2.0) == pytest.approx(3000)
    run_batch(c, 2.0, 1.5, 3000)       # cap 3000, pr 2000, error = 1000 (a full batch)
    # dError = (1000 - (-1000)) / (3.5 - 1.5) = 1000 -> new = 3000 - 1000 - 0.5 * 1000
    assert c.on_submit(4.0) == pytest.approx(1500)


# -- DStream PID (Spark's PIDRateEstimator) -------------------------------------------------------

def test_dstream_pid_first_run_only_records():
    c = DStreamPIDController(1.0, 2, initial_rate_per_partition=500, min_rate=100)
    assert c.on_submit(0.0) == 1000
    c.on_batch_end(batch(0.0, 0.5, 1000))       # processingRate 2000: recorded, not published
    assert c.on_submit(1.0) == 1000
    assert c.latest_rate == 2000
    c.on_batch_end(batch(1.0, 0.8, 1000, wait=0.2))   # pr 1250
    # error = 2000 - 1250 = 750; hist = 0.2*1250/1 = 250; dError irrelevant (Kd=0)
    assert c.on_submit(2.0) == pytest.approx(2000 - 750 - 0.2 * 250)


def test_dstream_pid_ignores_empty_and_stale_batches():
    c = DStreamPIDController(1.0, 2, initial_rate_per_partition=500)
    c.on_batch_end(batch(0.0, 0.5, 0))
    assert c.first_run
    c.on_batch_end(batch(0.0, 0.5, 1000))
    c.on_batch_end(batch(0.0, 0.5, 1000))       # same end time: stale
    assert c.on_submit(1.0) == 1000


def test_dstream_pid_min_rate_and_no_initial():
    c = DStreamPIDController(1.0, 2, initial_rate_per_partition=None, min_rate=100)
    assert c.on_submit(0.0) is None
    c.on_batch_end(batch(0.0, 1.0, 1000))
    c.on_batch_end(batch(1.0, 100.0, 10, wait=50.0))
    assert c.on_submit(2.0) == 100


def test_fixed_and_none():
    f = FixedRateController(1.0, 4, rate_per_partition=250)
    f.on_batch_end(batch(0, 5, 10))
    assert f.on_submit(0.0) == 1000 and f.on_submit(9.0) == 1000
    assert NoRateController().on_submit(0.0) is None


def test_make_controller():
    assert make_controller("doc001", 1.0, 2).name == "doc001"
    assert make_controller("pid", 1.0, 2).name == "pid"
    assert make_controller("fixed", 1.0, 2, fixed_rate_per_partition=5).on_submit(0) == 10
    assert make_controller("none", 1.0, 2).on_submit(0) is None
    with pytest.raises(ValueError):
        make_controller("fixed", 1.0, 2)
    with pytest.raises(ValueError):
        make_controller("bogus", 1.0, 2)


# -- the estimate of processing rate with a fixed cost per batch ------------------------------

def fixed_cost_batches(c, sizes, a=0.4, marginal=100_000.0, t0=0.0):
    """Batches that take ``a + n / marginal`` seconds, one per interval from ``t0``."""
    t = t0
    for n in sizes:
        c.on_submit(t)
        run_batch(c, t, a + n / marginal, n)
        t += 1.0
    return t


def test_a_fast_batch_with_a_fixed_cost_raises_the_cap_to_the_rate_that_fills_the_interval():
    # 0.4 s per batch whatever its size, then 100,000 rows/s: an interval holds 60,000 rows.
    c = AdaptiveRateController(1.0, 2, smooth_batches=1, headroom=0.0, initial_rate_per_partition=500, min_rate=10)
    t = fixed_cost_batches(c, [10_000, 20_000, 40_000])
    # elements / t_proc would say 40,000 / 0.8 = 50,000 and leave each batch 0.2 s short.
    assert c.on_submit(t) == pytest.approx(60_000)
    assert c.fixed_cost() == pytest.approx(0.4)


def test_after_a_capacity_drop_the_cut_accounts_for_the_fixed_cost():
    c = AdaptiveRateController(1.0, 2, smooth_batches=1, headroom=0.0, initial_rate_per_partition=500, min_rate=10)
    t = fixed_cost_batches(c, [20_000, 40_000, 60_000])
    c.on_submit(t)
    run_batch(c, t, 0.4 + 60_000 / 50_000, 60_000)      # the per-row work doubles: 1.6 s
    # 60,000 / 1.6 = 37,500 would take 1.15 s; the rate that fills an interval is 30,000
    # (hist: no wait). blockTime 0: case 1.
    assert c.on_submit(t + 2.0) == pytest.approx(60_000 / 1.2 * 0.6)


def test_without_batches_of_different_sizes_there_is_no_fixed_cost():
    c = AdaptiveRateController(1.0, 2, headroom=0.0, initial_rate_per_partition=500, min_rate=10)
    fixed_cost_batches(c, [10_000, 10_000, 10_000])
    assert c.fixed_cost() == 0.0
    c = AdaptiveRateController(1.0, 2, headroom=0.0, initial_rate_per_partition=500, min_rate=10)
    fixed_cost_batches(c, [10_000, 20_000, 40_000], a=0.0)  # proportional: no fixed cost
    assert c.fixed_cost() == pytest.approx(0.0, abs=1e-9)


def test_the_fixed_cost_is_bounded_so_one_noisy_fit_cannot_collapse_the_cap():
    c = AdaptiveRateController(1.0, 2, smooth_batches=1, headroom=0.0, initial_rate_per_partition=500, min_rate=10)
    t = fixed_cost_batches(c, [10_000, 20_000, 30_000], a=0.9, marginal=1_000_000)
    assert c.fixed_cost() == pytest.approx(0.5)              # at most half the interval
    c.on_submit(t)
    run_batch(c, t, 1.2, 40_000)                             # overran: 40,000 / 0.7 * 0.5
    assert c.on_submit(t + 2.0) == pytest.approx(40_000 / 0.7 * 0.5)
    # and never more than half the batch's own processing time (0.3 s here), so a fast
    # batch cannot divide by almost nothing
    c = AdaptiveRateController(1.0, 2, smooth_batches=1, headroom=0.0, initial_rate_per_partition=500, min_rate=10)
    t = fixed_cost_batches(c, [10_000, 20_000, 30_000], a=0.9, marginal=1_000_000)
    c.on_submit(t)
    run_batch(c, t, 0.3, 100_000)
    assert c.on_submit(t + 1.0) == pytest.approx(100_000 / 0.15 * 0.85)


# -- a batch that took all the source had ----------------------------------------------------------

def test_an_underfilled_batch_that_finished_in_time_never_lowers_the_cap():
    c = AdaptiveRateController(1.0, 2, smooth_batches=1, headroom=0.0, initial_rate_per_partition=500, min_rate=10)
    t = fixed_cost_batches(c, [20_000, 40_000, 60_000])
    cap = c.on_submit(t)                       # 50,000 rows/s (case 2: the cap batch 3 ran with)
    run_batch(c, t, 0.45, 5_000)               # the quiet half: 5,000 rows were all there was
    assert c.on_submit(t + 1.0) == pytest.approx(cap)
    # a full batch still moves it
    run_batch(c, t + 1.0, 0.4 + 60_000 / 50_000, 60_000)
    assert c.on_submit(t + 3.0) < cap


# -- headroom: aim each batch under the interval ------------------------------------------------

def test_with_headroom_the_cap_fills_the_target_not_the_interval():
    # 0.4 s per batch plus 100,000 rows/s; the target is 0.9 s: 50,000 rows, not 60,000.
    c = AdaptiveRateController(1.0, 2, smooth_batches=1, headroom=0.1, initial_rate_per_partition=500, min_rate=10)
    t = fixed_cost_batches(c, [10_000, 20_000, 40_000])
    assert c.target == pytest.approx(0.9)
    assert c.on_submit(t) == pytest.approx(50_000)
    # without a fixed cost: 0.9 of the processing rate (formula 5)
    c = AdaptiveRateController(1.0, 2, smooth_batches=1, headroom=0.1, initial_rate_per_partition=500, min_rate=10)
    c.on_submit(0.0)
    run_batch(c, 0.0, 0.5, 1000)
    assert c.on_submit(1.0) == pytest.approx(2000 * 0.9)


def test_with_headroom_case2_window_ends_at_the_target():
    for proc, case in ((0.85, 2), (0.9, 2), (0.84, 1), (0.97, 1)):
        c = AdaptiveRateController(1.0, 2, headroom=0.1, initial_rate_per_partition=500, min_rate=10)
        c.on_submit(0.0)
        run_batch(c, 0.0, proc, 1000)
        rate = c.on_submit(1.0)
        assert c.last_case == case, proc
        if case == 2:
            assert rate == 1000
    # a batch that took the whole interval is now too long: the cap comes down
    assert rate < 1000


def test_with_headroom_formula8_averages_the_rates_that_fill_the_target():
    c = AdaptiveRateController(1.0, 2, headroom=0.1, initial_rate_per_partition=500, min_rate=10)
    c.on_submit(0.0)
    for k, (proc, n) in enumerate(((0.86, 860), (0.88, 1056), (0.9, 1260))):   # 1000, 1200, 1400 /s
        run_batch(c, float(k), proc, n)
        rate = c.on_submit(k + 1.0)
    assert c.last_case == 2
    # each batch's processing rate times the target: the cap whose batch takes 0.9 s
    assert rate == pytest.approx((1000 + 1200 + 1400) / 3 * 0.9)


@pytest.mark.parametrize("headroom", [-0.1, 0.5])
def test_headroom_out_of_range_is_refused_naming_the_value(headroom):
    with pytest.raises(ValueError, match=f"headroom must be in \\[0, 0.5\\), got {headroom}"):
        AdaptiveRateController(1.0, 2, headroom=headroom)


# -- a batch that starts late is cut to end at the next boundary ---------------------------------

def test_late_start_rate_takes_the_rows_of_the_lost_time_off_the_cap():
    # 100,000 rows per second of processing, 0.2 s late: 20,000 rows fewer
    assert late_start_rate(50_000.0, 100_000.0, 0.2, 1.0) == pytest.approx(30_000)
    # per second of interval: on a 2 s interval the same 0.2 s is 20,000 rows of 2 s
    assert late_start_rate(50_000.0, 100_000.0, 0.2, 2.0) == pytest.approx(40_000)
    # never under half the cap
    assert late_start_rate(50_000.0, 100_000.0, 0.4, 1.0) == pytest.approx(25_000)
    # on time, no marginal rate, or no cap: unchanged
    assert late_start_rate(50_000.0, 100_000.0, 0.0, 1.0) == 50_000
    assert late_start_rate(50_000.0, 100_000.0, -0.02, 1.0) == 50_000
    assert late_start_rate(50_000.0, None, 0.2, 1.0) == 50_000
    assert late_start_rate(None, 100_000.0, 0.2, 1.0) is None
    # spark.late_floor sets the share a cut keeps: 1 never cuts
    assert late_start_rate(50_000.0, 100_000.0, 0.4, 1.0, 0.2) == pytest.approx(10_000)
    assert late_start_rate(50_000.0, 100_000.0, 0.2, 1.0, 1.0) == 50_000


@pytest.mark.parametrize("floor", [0.0, -0.5, 1.01])
def test_a_late_floor_outside_zero_to_one_is_refused(floor):
    with pytest.raises(ValueError, match="late_floor"):
        AdaptiveRateController(1.0, 2, late_floor=floor)


def test_a_late_batch_ran_with_the_cap_cut_at_the_controllers_own_floor():
    # the same late batch (0.2 s late, 30,000 rows in 0.9 s) read by two controllers: with
    # the default floor the reader cut the 50,000 cap to 30,000, which the batch filled
    # (formula 5 sets the cap); with floor 1 the reader never cuts, so the batch ran under
    # the whole 50,000 cap, took less than 90% of it, and the cap holds
    caps = {}
    for floor in (0.5, 1.0):
        c = AdaptiveRateController(1.0, 2, smooth_batches=1, headroom=0.0, initial_rate_per_partition=500,
                                   min_rate=10, late_floor=floor)
        t = fixed_cost_batches(c, [20_000, 40_000, 60_000])
        cap = c.on_submit(t)                               # 50,000; marginal 100,000
        assert late_start_rate(cap, c.marginal_rate(), 0.2, 1.0, c.late_floor) == pytest.approx(50_000 if floor == 1.0 else 30_000)
        run_batch(c, t + 0.2, 0.9, 30_000, wait=0.2)
        caps[floor] = c.on_submit(t + 2.0)
    fill = 30_000 / 0.5 * 0.6
    assert caps[0.5] == pytest.approx(fill - 0.2 * 0.2 * fill)
    assert caps[1.0] == pytest.approx(50_000)


def test_marginal_rate_is_the_latest_batch_beyond_its_fixed_cost():
    c = AdaptiveRateController(1.0, 2, smooth_batches=1, headroom=0.0, initial_rate_per_partition=500, min_rate=10)
    assert c.marginal_rate() is None
    fixed_cost_batches(c, [10_000, 20_000, 40_000])     # 0.4 s + n / 100,000
    assert c.marginal_rate() == pytest.approx(100_000)
    # the baselines publish none: the reader never cuts their caps
    assert DStreamPIDController(1.0, 2).marginal_rate() is None
    assert FixedRateController(1.0, 2, rate_per_partition=5).marginal_rate() is None
    assert NoRateController().marginal_rate() is None


def test_a_batch_cut_for_starting_late_ran_with_the_cut_cap():
    c = AdaptiveRateController(1.0, 2, smooth_batches=1, headroom=0.0, initial_rate_per_partition=500, min_rate=10)
    t = fixed_cost_batches(c, [20_000, 40_000, 60_000])
    cap = c.on_submit(t)                                   # 50,000; marginal 100,000
    cut = late_start_rate(cap, c.marginal_rate(), 0.2, 1.0)
    assert cut == pytest.approx(30_000)
    # it starts 0.2 s late, the reader cuts it to 30,000, and it takes 0.9 s (the per-row
    # work went up by two thirds): the rate that fills the interval is 30,000 / 0.5 * 0.6
    run_batch(c, t + 0.2, 0.9, round(cut), wait=0.2)
    fill = 30_000 / 0.5 * 0.6
    # latestRate is 30,000: new = fill - 0.2 * hist, under the 50,000 cap. Taken as the
    # 50,000 cap, the batch would look like one that took all the source had (30,000 under
    # 90% of it, done within the interval) and keep the cap at 50,000.
    assert c.on_submit(t + 2.0) == pytest.approx(fill - 0.2 * 0.2 * fill)
    assert c.last_case == 1


# -- no cut where cutting does not help -------------------------------------------------------------

def test_when_a_batch_takes_as_long_whatever_its_size_the_cap_stops_falling():
    # a loaded machine: every batch takes 1.3 s, 1,000 rows or 300
    c = AdaptiveRateController(1.0, 2, smooth_batches=1, headroom=0.0, initial_rate_per_partition=500, min_rate=10)
    caps = [c.on_submit(0.0)]
    t = 0.0
    for _ in range(6):
        run_batch(c, t, 1.3, int(caps[-1]))
        t += 2.0
        caps.append(c.on_submit(t))
    # formula 5 alone cuts by 1 / 1.3 a batch while the sizes are within 1.5x of each other
    assert caps[1] == pytest.approx(1000 / 1.3) and caps[2] == pytest.approx(int(caps[1]) / 1.3)
    # the third batch (591 rows) is 1.7x smaller than the first and took as long: the cap holds
    assert c.cuts_are_useless()
    assert caps[3:] == [caps[2]] * 4
    # and the reader is given no marginal rate, so it does not cut a late batch either
    assert c.marginal_rate() is None
    assert late_start_rate(caps[-1], c.marginal_rate(), 0.3, 1.0) == caps[-1]


def test_a_fixed_cost_over_the_target_stops_the_cuts_and_a_real_slope_does_not():
    c = AdaptiveRateController(1.0, 2, headroom=0.05, initial_rate_per_partition=500, min_rate=10)
    fixed_cost_batches(c, [10_000, 20_000, 30_000], a=0.96, marginal=1_000_000)   # a >= 0.95
    assert c.cuts_are_useless()
    c = AdaptiveRateController(1.0, 2, headroom=0.05, initial_rate_per_partition=500, min_rate=10)
    fixed_cost_batches(c, [10_000, 20_000, 30_000], a=0.4, marginal=30_000)       # rows cost time
    assert not c.cuts_are_useless()
    assert c.on_submit(10.0) < 30_000 / 1.0                                       # 1.4 s batches: cut


# -- the processing rate read over the last three batches (formula 8's window) ----------------------

def steady_then(c, slow_procs, n=1000):
    """Two full batches at 1,000 rows/s (case 2 keeps the cap), then batches of ``n`` rows
    that take ``slow_procs`` seconds; each submitted at its start, none running at the end."""
    t = 0.0
    for proc in (1.0, 1.0, *slow_procs):
        c.on_submit(t)
        run_batch(c, t, proc, n)
        t += math.ceil(proc)
    return t


def test_one_slow_batch_moves_the_estimate_by_a_third_of_its_reading():
    smoothed = AdaptiveRateController(1.0, 2, headroom=0.0, initial_rate_per_partition=500, min_rate=10)
    single = AdaptiveRateController(1.0, 2, smooth_batches=1, headroom=0.0, initial_rate_per_partition=500,
                                    min_rate=10)
    for c in (smoothed, single):
        t = steady_then(c, [3.0])            # the third batch reads 333 rows/s
    # the document's reading: the cap falls to a third in one batch
    assert single.on_submit(t) == pytest.approx(1000 / 3)
    # over the window: (1000 + 1000 + 333) / 3 (no wait, so no integral term)
    assert smoothed.on_submit(t) == pytest.approx((1000 + 1000 + 1000 / 3) / 3)
    assert smoothed.last_case == 1


def test_a_lasting_drop_is_read_whole_after_three_batches():
    c = AdaptiveRateController(1.0, 2, headroom=0.0, initial_rate_per_partition=500, min_rate=10)
    t = steady_then(c, [3.0, 3.0])
    assert c.on_submit(t) == pytest.approx((1000 + 1000 / 3 + 1000 / 3) / 3)
    c = AdaptiveRateController(1.0, 2, headroom=0.0, initial_rate_per_partition=500, min_rate=10)
    t = steady_then(c, [3.0, 3.0, 3.0])
    assert c.on_submit(t) == pytest.approx(1000 / 3)


def test_batches_under_half_the_latest_size_are_left_out_so_slow_start_climbs_as_fast():
    caps = []
    for smooth in (3, 1):
        c = AdaptiveRateController(1.0, 2, smooth_batches=smooth, headroom=0.0, initial_rate_per_partition=500,
                                   min_rate=10)
        c.on_submit(0.0)
        run_batch(c, 0.0, 0.5, 1000)         # 2,000 rows/s while the workers start
        c.on_submit(1.0)
        run_batch(c, 1.0, 0.4, 4000)         # 10,000 rows/s; the first batch is under half its size
        caps.append(c.on_submit(2.0))
    assert caps[0] == pytest.approx(caps[1]) == pytest.approx(10_000)


def test_the_late_start_cut_uses_the_marginal_rate_of_the_window():
    c = AdaptiveRateController(1.0, 2, headroom=0.0, initial_rate_per_partition=500, min_rate=10)
    steady_then(c, [2.0])                    # 1,000, 1,000 and 500 rows/s, no fixed cost
    assert c.marginal_rate() == pytest.approx(2500 / 3)
    single = AdaptiveRateController(1.0, 2, smooth_batches=1, headroom=0.0, initial_rate_per_partition=500)
    steady_then(single, [2.0])
    assert single.marginal_rate() == pytest.approx(500)


@pytest.mark.parametrize("smooth", [0, 4])
def test_smooth_batches_out_of_range_is_refused_naming_the_value(smooth):
    with pytest.raises(ValueError, match=f"smooth_batches must be 1, 2 or 3 .*got {smooth}"):
        AdaptiveRateController(1.0, 2, smooth_batches=smooth)
