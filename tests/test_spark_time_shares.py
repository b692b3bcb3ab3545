"""Where a rate-control run's time went after the drop (``bench.spark_time_shares``), on
hand-made batches: the shares, the in-interval ceiling and the analysis of a results file."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bench.spark_rate_control as rate_bench  # noqa: E402
import bench.spark_time_shares as shares  # noqa: E402


def batch(start: float, proc: float, rows: int = 1000, submit: float | None = None) -> dict:
    return {"submit": start if submit is None else submit, "start": start, "end": start + proc,
            "processing_time": proc, "rows": rows}


def test_shares_split_the_window_into_fixed_cost_idle_and_work():
    # Three batches of 0.8 s from 10 s on, a second apart: the window is 10.0-12.8 s.
    bs = [batch(9.0, 0.9), batch(10.0, 0.8), batch(11.0, 0.8), batch(12.0, 0.8), batch(12.5, 0.1, rows=0)]
    s = shares.time_shares(bs, start=10.0, fixed_cost=0.1)
    assert s.batches == 3 and s.window_s == pytest.approx(2.8)
    assert s.fixed_cost == pytest.approx(0.3 / 2.8)
    assert s.idle == pytest.approx(0.4 / 2.8)            # 0.2 s after each of the first two
    assert s.work == pytest.approx(2.1 / 2.8)
    assert s.fixed_cost + s.idle + s.work == pytest.approx(1.0)


def test_a_batch_is_charged_at_most_its_own_time_and_nothing_after_start_gives_none():
    s = shares.time_shares([batch(0.0, 0.05), batch(0.05, 0.95)], start=0.0, fixed_cost=0.1)
    assert s.fixed_cost == pytest.approx(0.15) and s.work == pytest.approx(0.85) and s.idle == 0.0
    assert shares.time_shares([batch(0.0, 1.0)], start=5.0, fixed_cost=0.1) is None


def test_back_to_back_batches_idle_never_and_pay_the_fixed_cost_less_often_than_one_a_second():
    overrunning = [batch(2.0 * k, 2.0) for k in range(5)]          # fixed's batches after the drop
    on_time = [batch(float(k), 0.9) for k in range(10)]             # one per interval, 0.1 s idle each
    a = shares.time_shares(overrunning, 0.0, 0.1)
    b = shares.time_shares(on_time, 0.0, 0.1)
    assert a.idle == 0.0 and a.work == pytest.approx(0.95)
    assert b.idle == pytest.approx(0.9 / 9.9) and b.work == pytest.approx(8.0 / 9.9)
    assert shares.in_interval_ceiling(0.1, 1.0) == pytest.approx(0.9)
    assert shares.in_interval_ceiling(2.0, 1.0) == 0.0


def results_file(with_drop_times: bool) -> dict:
    # Two rounds; fixed's batches run back to back, doc001's one a second with 0.1 s idle.
    fixed_runs = [[batch(100.0 + 2 * k, 2.0, submit=100.0 + 2 * k) for k in range(20)] for _ in range(2)]
    doc_runs = [[batch(100.0 + k, 0.9 - 0.1 * r, submit=100.0 + k) for k in range(40)] for r in range(2)]
    out = {"setup": {"interval_ms": 1000.0, "periods": 4,
                     "rounds": [{"fixed_cost_per_batch_s": 0.1}, {"fixed_cost_per_batch_s": 0.2}]},
           "scenarios": {"capacity_drop": {"batches": {"fixed": fixed_runs, "doc001": doc_runs}}}}
    if with_drop_times:
        out["scenarios"]["capacity_drop"]["runs"] = {
            n: [{"round": r, "drop_at": 120.0} for r in range(2)] for n in ("fixed", "doc001")}
    return out


def test_analyse_compares_each_run_with_its_rounds_best_and_the_ceiling():
    a = shares.analyse(results_file(with_drop_times=True))
    assert not a["drop_time_estimated"]
    fixed, doc = a["controllers"]["fixed"], a["controllers"]["doc001"]
    # After 120 s: fixed 10 batches of 2 s, doc001 20 batches a second apart.
    assert fixed["per_run"][0]["work"] == pytest.approx(0.95) and fixed["per_run"][1]["work"] == pytest.approx(0.9)
    assert doc["per_run"][0]["work"] == pytest.approx(20 * 0.8 / 19.9) and doc["per_run"][0]["batches"] == 20
    assert doc["per_run"][1]["work"] == pytest.approx(20 * 0.6 / 19.8)
    assert doc["work_over_best_per_round"] == pytest.approx([20 * 0.8 / 19.9 / 0.95, 20 * 0.6 / 19.8 / 0.9])
    assert a["in_interval_ceiling_over_best_per_round"] == pytest.approx([0.9 / 0.95, 0.8 / 0.9])
    text = shares.table(a)
    assert "| doc001 |" in text and "estimated" not in text


def test_a_file_without_drop_times_takes_the_first_trigger_plus_half_the_offered_span():
    a = shares.analyse(results_file(with_drop_times=False))
    assert a["drop_time_estimated"]
    # 4 periods: rows offered over 35 s, the drop at 17.5 s after the first trigger (100 s).
    assert a["controllers"]["doc001"]["per_run"][0]["batches"] == 40 - 18
    assert "estimated" in shares.table(a)


def test_a_controller_with_no_batch_after_the_drop_shows_dashes():
    results = results_file(with_drop_times=True)
    results["scenarios"]["capacity_drop"]["runs"]["doc001"] = [{"round": r, "drop_at": 500.0} for r in range(2)]
    a = shares.analyse(results)
    assert a["controllers"]["doc001"]["mean"] == {"fixed_cost": None, "idle": None, "work": None}
    assert a["controllers"]["doc001"]["work_over_best_per_round"] == [None, None]
    assert "| doc001 | - | - | - | - (-, -) |" in shares.table(a)


def test_the_command_reads_a_results_file_and_names_a_bad_one(tmp_path, capsys):
    good = tmp_path / "r.json"
    good.write_text(json.dumps(results_file(with_drop_times=True)))
    assert shares.main([str(good)]) == 0
    assert "| fixed |" in capsys.readouterr().out
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"setup": {}}))
    assert shares.main([str(bad)]) == 1
    assert "bad.json" in capsys.readouterr().err


def test_a_calibration_far_from_the_rounds_median_is_flagged():
    rounds = [{"capacity_rows_per_s": c} for c in (153_793.0, 100_000.0, 110_000.0, 95_000.0, 116_000.0)]
    flagged = rate_bench.calibration_outliers(rounds)
    assert [o["round"] for o in flagged] == [0]
    assert flagged[0]["median_rows_per_s"] == 110_000.0
    assert rate_bench.calibration_outliers(rounds[:2]) == []          # two rounds: no median to speak of
