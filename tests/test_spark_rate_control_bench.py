"""The Spark rate-control bench's summary code: the ci95 over repeats, the stop rule and
the goals (on hand-made batch records; the bench's Spark runs are not repeated here)."""
from __future__ import annotations

import math
import statistics
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bench.spark_rate_control as bench  # noqa: E402
from runtime.spark.listener import BatchRecord  # noqa: E402


def record(start: float, delay: float, rows: int = 1000, proc: float = 0.8) -> BatchRecord:
    return BatchRecord(0, start - delay, start, start + proc, proc, delay, rows, {"source": rows},
                       {"source": 2000.0}, {"source": 1},
                       {"addBatch": 1000 * proc - 100 - start, "walCommit": 50.0 + start, "triggerExecution": 1000 * proc})


def run(delays_ms: list[float], rows: int = 1000, drop_at: float | None = None) -> dict:
    kept = [record(float(i), d / 1000, rows) for i, d in enumerate(delays_ms)]
    out = {"batches": [b.as_dict() for b in kept], "kept": kept, "elapsed_s": float(len(kept)),
           "rows": rows * len(kept), "offered": rows * len(kept), "window_s": float(len(kept)),
           "backlog_rows": 0, "first_submit": 0.0}
    if drop_at is not None:
        out |= {"drop_at_s": drop_at, "after_drop": [b for b in kept if b.start >= drop_at],
                "after_drop_window_s": len(kept) - drop_at}
    return out


def test_ci95_is_the_student_t_half_width_of_the_mean():
    values = [10.0, 12.0, 14.0, 20.0]
    expected = 3.182 * statistics.stdev(values) / math.sqrt(4)      # t(0.975, 3 df)
    assert bench.ci95(values) == pytest.approx(expected)
    assert bench.ci95([5.0]) == math.inf
    assert bench.ci95([5.0] * 40) == 0.0                             # beyond the table: 1.96 x 0


def test_aggregate_takes_the_mean_and_ci95_over_the_repeats_own_means():
    runs = [run([0, 20]), run([40, 60]), run([10, 10, 10, 10])]       # run means 10, 50, 10
    s = bench.aggregate(runs)
    assert s["per_run_scheduling_delay_mean_ms"] == pytest.approx([10, 50, 10])
    assert s["scheduling_delay_mean_ms"] == pytest.approx(70 / 3)
    assert s["scheduling_delay_mean_over_batches_ms"] == pytest.approx(160 / 8)
    assert s["scheduling_delay_ci95_ms"] == pytest.approx(bench.ci95([10, 50, 10]))
    assert s["repeats"] == 3 and s["throughput_rows_per_s"] == pytest.approx(1000)



def test_aggregate_says_where_the_triggers_time_went():
    s = bench.aggregate([run([0, 0]), run([0, 0, 0])])      # batches start at 0, 1 and 0, 1, 2
    starts = [0, 1, 0, 1, 2]
    assert s["trigger_time_mean_ms"] == pytest.approx({
        "addBatch": statistics.fmean(700 - t for t in starts), "triggerExecution": 800,
        "walCommit": statistics.fmean(50 + t for t in starts)})


def test_aggregate_counts_the_batches_that_ended_past_the_next_boundary():
    # proc 0.8 s: a batch delayed by more than 0.2 s ends past the next boundary
    s = bench.aggregate([run([0, 150, 250]), run([300])])
    assert s["batches_past_next_boundary"] == 2
    assert s["processing_time_sd_ms"] == pytest.approx(0.0)


def test_the_stop_rule_names_every_pair_whose_ci95_is_not_under_the_target():
    tight = bench.aggregate([run([100]), run([102]), run([98])])
    loose = bench.aggregate([run([10]), run([100]), run([50])])
    single = bench.aggregate([run([10])])
    got = bench.unsettled({"steady": {"pid": tight, "fixed": loose}, "capacity_drop": {"doc001": single}}, 0.2)
    assert got == ["steady/fixed", "capacity_drop/doc001"]
    assert bench.unsettled({"steady": {"pid": tight}}, 0.2) == []


def test_goals_compare_doc001_with_pid_and_after_the_drop_with_fixed():
    scenarios = bench.summarize_all({
        "steady": {"pid": [run([100, 100])], "doc001": [run([50, 50])], "fixed": [run([0, 0])]},
        "capacity_drop": {"pid": [run([100, 100, 100], drop_at=1)], "doc001": [run([20, 20, 20], 990, drop_at=1)],
                          "fixed": [run([0, 900, 900], drop_at=1)]},
    })
    assert scenarios["capacity_drop"]["after_drop"]["fixed"]["scheduling_delay_mean_ms"] == pytest.approx(900)
    g = bench.goals(scenarios)
    assert g["steady: doc001 / pid mean scheduling delay <= 0.6"] == {"ratio": 0.5, "met": True, "rounds_met": 1,
                                                                      "rounds": 1, "per_round": [0.5],
                                                                      "per_round_mean": 0.5, "per_round_ci95": None}
    assert g["capacity_drop: doc001 / pid mean scheduling delay <= 0.6"]["ratio"] == pytest.approx(0.2)
    assert g["capacity_drop: doc001 / fixed mean scheduling delay after the drop <= 0.3"] == {
        "ratio": pytest.approx(20 / 900), "met": True, "rounds_met": 1, "rounds": 1,
        "per_round": [pytest.approx(20 / 900)], "per_round_mean": pytest.approx(20 / 900), "per_round_ci95": None}
    assert g["capacity_drop: doc001 throughput >= 0.95 x best"]["ratio"] == pytest.approx(0.99)
    text = bench.table({"scenarios": scenarios, "goals": g, "stopped": {"verdict": "converged"}})
    assert "after the drop" in text and "not met" not in text


def test_quick_and_bad_names():
    a = bench.parse_args(["--quick"])
    assert (a.periods, a.min_repeats, a.max_repeats) == (2, 2, 2)
    assert a.out_dir == bench.RESULTS
    assert bench.parse_args(["--out-dir", "elsewhere"]).out_dir == Path("elsewhere")
    with pytest.raises(SystemExit):
        bench.parse_args(["--controllers", "fixed,bogus"])


def test_throughput_is_rows_over_the_run_time_and_undrained_runs_are_counted():
    done = run([0, 0, 0, 0])                                  # 4,000 rows in 4 s, all offered rows processed
    stuck = run([0, 0]) | {"elapsed_s": 6.0, "drained": False}  # 2,000 rows, stopped by the drain cap at 6 s
    s = bench.aggregate([done, stuck])
    assert s["throughput_rows_per_s"] == pytest.approx(6000 / 10)
    assert s["runs_not_drained"] == 1
    assert bench.aggregate([done])["runs_not_drained"] == 0


def test_goals_count_the_rounds_in_which_each_ratio_held_on_its_own():
    # Round 0 on a quiet machine, round 1 loaded: every controller slower together.
    runs = {"steady": {"pid": [run([100, 100]), run([1000, 1000])],
                       "doc001": [run([50, 50]), run([700, 700], rows=900)],
                       "fixed": [run([0, 0]), run([0, 0])]}}
    g = bench.goals(bench.summarize_all(runs))
    delay = g["steady: doc001 / pid mean scheduling delay <= 0.6"]
    assert delay["ratio"] == pytest.approx(375 / 550) and not delay["met"]     # the means over both rounds
    assert (delay["rounds_met"], delay["rounds"]) == (1, 2)                     # 0.5 held, 0.7 did not
    tp = g["steady: doc001 throughput >= 0.95 x best"]
    assert (tp["rounds_met"], tp["rounds"]) == (1, 2)                           # 1.0, then 0.9 of the best
    assert "1 of 2" in bench.table({"scenarios": bench.summarize_all(runs), "goals": g,
                                    "stopped": {"verdict": "time cap"}})


def test_the_per_round_ratio_has_a_ci95_once_there_are_two_rounds():
    runs = {"steady": {"pid": [run([100, 100]), run([1000, 1000])],
                       "doc001": [run([40, 40]), run([600, 600])],
                       "fixed": [run([0, 0]), run([0, 0])]}}
    g = bench.goals(bench.summarize_all(runs))["steady: doc001 / pid mean scheduling delay <= 0.6"]
    assert g["per_round"] == [pytest.approx(0.4), pytest.approx(0.6)]
    assert g["per_round_mean"] == pytest.approx(0.5)
    assert g["per_round_ci95"] == pytest.approx(12.706 * statistics.stdev([0.4, 0.6]) / math.sqrt(2))


def test_the_drop_factor_doubles_the_marginal_row_time():
    # 10 us a row, 24 us with 8x the hash rounds: the hash is 2 us of it, so 1 + 10 / 2 rounds
    assert bench.DROP_PROBE == 8
    assert bench.drop_factor_for(10e-6, 24e-6) == pytest.approx(6)
    # the whole row is hash: twice the rounds double it
    assert bench.drop_factor_for(10e-6, 80e-6) == 2
    # no measurable hash, or none measured: the upper bound; a tiny hash: the upper bound too
    assert bench.drop_factor_for(10e-6, 9e-6) == bench.DROP_FACTOR_RANGE[1]
    assert bench.drop_factor_for(10e-6, None) == bench.DROP_FACTOR_RANGE[1]
    assert bench.drop_factor_for(10e-6, 10.1e-6) == bench.DROP_FACTOR_RANGE[1]
    assert bench.drop_factor_for(10e-6, 14e-6, probe=2) == pytest.approx(3.5)
    assert bench.drop_factor_for(10e-6, 28e-6) == pytest.approx(4.9)     # 1 + 10 / (18 / 7), to a tenth


def test_a_fractional_drop_factor_hashes_that_share_of_the_last_pass():
    text = "abcdefghij"
    assert len(bench.LinearWork(rounds=2, factor=1.5, slow_from=0.0).work_bytes(text)) == 30
    assert len(bench.LinearWork(rounds=1, factor=2.5, slow_from=0.0).work_bytes(text)) == 25
    assert bench.LinearWork(rounds=1, factor=2.0, slow_from=0.0).work_bytes(text) == text.encode() * 2
    assert bench.LinearWork(rounds=1, factor=2.5).work_bytes(text) == text.encode()   # before the drop


def test_a_variant_runs_its_base_controller_with_checked_settings_of_its_own(capsys):
    a = bench.parse_args(["--variant", "doc001+s1=doc001,spark.smooth_batches=1"])
    assert a.variants == {"doc001+s1": ("doc001", {"spark.smooth_batches": 1})}
    for text, says in [("doc001+s1=doc001,spark.smooth_batches=zero", "spark.smooth_batches"),
                       ("doc001+x=nope,spark.smooth_batches=1", "unknown base 'nope'"),
                       ("pid+s1=doc001,spark.smooth_batches=1", "the name must be doc001+<word>"),
                       ("doc001+s1=doc001", "no setting"),
                       ("doc001+s1=doc001,spark.no_such_key=1", "spark.no_such_key")]:
        with pytest.raises(SystemExit):
            bench.parse_args(["--variant", text])
        assert says in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.parse_args(["--variant", "doc001+a=doc001,spark.smooth_batches=1",
                          "--variant", "doc001+a=doc001,spark.smooth_batches=2"])
    assert "named twice" in capsys.readouterr().err
