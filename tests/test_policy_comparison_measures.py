"""The overload matrix's own measures (bench/policy_comparison.py): what its rate CoV bins can
resolve, and the diagnosis that reads the CoV and fast-branch goals from a run's JSON.

Pure functions over made-up samples: no engine, no clock."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.policy_comparison import (EARLIER_BIN_S, SAMPLE_S, SCENARIOS, _cov, count_rate, diagnose, goals,  # noqa: E402
                                     paced_cov, report_windows, spout_rate, table)


def test_a_perfectly_paced_spout_scores_under_0_02_in_the_cov_bins() -> None:
    # the slowest and fastest rates of the matrix: the 100 ms bins resolve a steady rate to under 0.02
    for rate in (1_250.0, 19_230.0):
        cov = paced_cov(rate, 12.0, 6.0)
        assert cov is not None and cov < 0.02
        earlier = paced_cov(rate, 5.0, 1.5, EARLIER_BIN_S)
        assert earlier is not None and earlier < 0.01


def _alternating(period: float, slow: float, fast: float) -> list[tuple[float, int, int, int, None]]:
    samples, emitted = [], 0.0
    for i in range(int(5.0 / SAMPLE_S) + 1):
        t = i * SAMPLE_S
        samples.append((t, int(round(emitted)), 0, 0, None))
        emitted += (slow if int(round(t / period, 6)) % 2 == 0 else fast) * SAMPLE_S
    return samples


def test_the_cov_bins_see_a_rate_that_alternates_every_bin() -> None:
    # 1,000 and 1,500 tuples/s in turn: a standard deviation of 250 around a mean of 1,250
    assert _cov(_alternating(0.1, 1_000.0, 1_500.0), 1.5, 5.0) == pytest.approx(0.2, abs=0.002)
    assert _cov(_alternating(0.25, 1_000.0, 1_500.0), 1.5, 5.0, EARLIER_BIN_S) == 0.2


def test_the_cov_bins_see_an_on_off_cycle_of_a_fifth_of_a_second_that_250_ms_bins_average_away() -> None:
    # source_stop's cycle in (a) with acking: 200 and 13,000 tuples/s, 100 ms each (a CoV of 0.97)
    samples = _alternating(0.1, 200.0, 13_000.0)
    cov = _cov(samples, 1.5, 5.0)
    assert cov is not None and cov > 0.9
    cov250 = _cov(samples, 1.5, 5.0, EARLIER_BIN_S)
    assert cov250 is not None and cov250 < 0.25


def test_spout_rate_reads_the_stored_series_between_two_times() -> None:
    series = [[t / 10, 600 * t, 0, None] for t in range(0, 61)]     # 6,000 tuples/s
    assert spout_rate(series, 1.5, 5.0) == 6_000.0
    assert spout_rate(series, 7.0, 8.0) is None


def test_fast_branch_after_the_warmup_reads_the_executed_count_between_the_warmup_and_the_stop() -> None:
    # a fast bolt that executed a burst of 8,000 by 0.1 s, then 6,000/s to the stop at 5.0 s
    samples = [(t / 20, 8_000 + int(300 * max(0, t - 2))) for t in range(0, 101)]
    assert count_rate(samples, 1.5, 5.0) == 6_000.0      # the burst before the warmup is not in it
    assert count_rate(samples, 5.5, 6.0) is None


def test_table_and_goals_report_the_fast_branch_after_the_warmup_beside_the_whole_run_figure() -> None:
    def cell(policy: str, whole: float, steady: float) -> dict:
        return {"scenario": "c", "acking": False, "policy": policy, "runs": [{}], "lost": 0, "goodput": 1.0,
                "peak_queue": 0.9, "fast_tps": 6_000.0 * whole, "fast_ratio": whole,
                "fast_steady_tps": 6_000.0 * steady, "fast_steady_ratio": steady}
    report = {"cells": [cell("none", 1.0, 1.0), cell("stepwise+hops", 0.88, 0.99)]}
    row = next(line for line in table(report).splitlines() if "stepwise+hops" in line)
    assert row.endswith("| 0.88 | 0.99 |")
    rows = goals(report).splitlines()
    assert "| (c) fast branch >= 0.95 | 0/1 (not: c) |" in rows
    assert "| (c) fast branch after the warmup >= 0.95 | 1/1 |" in rows


def _run(rate: float, queue_at_stop: int) -> dict:
    # samples every 100 ms to 5.0 s (the stop of scenario c), then the drain's, queue empty
    series = [[round(t / 10, 1), int(rate * t / 10), queue_at_stop if t == 50 else 1_000, None]
              for t in range(0, 51)]
    series += [[5.5, int(rate * 5.0), 0, None], [6.0, int(rate * 5.0), 0, None]]
    return {"series": series, "rate_cov": 0.1, "fast_tps": rate}


def test_diagnose_reads_the_fast_branch_after_the_warmup_and_the_slow_queue_before_the_drain() -> None:
    def cell(policy: str, rate: float, queue: int, fast_ratio: float) -> dict:
        return {"scenario": "c", "acking": False, "policy": policy, "runs": [_run(rate, queue)],
                "rate_cov": 0.3, "fast_tps": rate, "fast_ratio": fast_ratio}
    report = {"warmup_s": 1.5, "cells": [cell("none", 6_000.0, 122_880, 1.0),
                                         cell("source_stop", 6_000.0, 0, 1.0),
                                         cell("stepwise+hops", 5_400.0, 30_720, 0.9)]}
    out = diagnose(report)
    hops = next(line for line in out.splitlines() if line.startswith("| c | stepwise+hops |"))
    # after-warmup ratio 5,400 / 6,000; 1.5 s x 5,400 emitted by the warmup; 30 KB at the stop, not the drain's 0
    assert hops == "| c | stepwise+hops | 0.900 (0.900) | 0.900 | 8100 | 30.0 |"
    cov = next(line for line in out.splitlines() if line.startswith("| c |") and "0.100" in line)
    # a third of source_stop's 0.3; none's; the lowest stepwise run; the named one's; a paced spout's
    assert cov.startswith("| c | 0.100 | 0.300 | 0.100 | 0.300 | ")


def test_every_scenario_but_e_reads_its_rate_cov_over_the_second_half_of_its_run() -> None:
    # once steady: a search needs seconds to close in on the capacity, so the CoV is not read from the warmup
    for key, sc in SCENARIOS.items():
        if key == "e":
            assert sc.steady == ((2.0, 3.0), (4.0, 8.0))
            continue
        assert sc.steady == ((sc.duration / 2, sc.duration),) and sc.duration >= 10.0


def test_report_windows_are_the_ones_the_report_was_run_with_or_the_earlier_5_s_runs() -> None:
    now = {"warmup_s": 1.5, "durations": {"a": 12.0, "e": 8.0},
           "cov_windows": {"a": [[6.0, 12.0]], "e": [[2.0, 3.0], [4.0, 8.0]]}}
    assert report_windows(now) == ({"a": 12.0, "e": 8.0}, {"a": [(6.0, 12.0)], "e": [(2.0, 3.0), (4.0, 8.0)]})
    duration, windows = report_windows({"warmup_s": 1.5})      # a JSON file of an earlier matrix
    assert duration["c"] == 5.0 and windows["c"] == [(1.5, 5.0)]
    assert duration["e"] == 8.0 and windows["e"] == [(2.0, 3.0), (4.0, 8.0)]


def test_diagnose_reads_a_paced_spout_over_the_reports_cov_window() -> None:
    # a spout at 6,000/s to 4 s, then 300/s: the named policy's mean rate is read in the CoV window (4-5 s),
    # where a paced spout scores 0.023 (0.002 at the mean rate from the warmup on)
    series = [[round(t / 10, 1), int(6_000 * t / 10) if t <= 40 else 24_000 + int(300 * (t - 40) / 10), 0, None]
              for t in range(0, 51)]
    run = {"series": series, "rate_cov": 0.1}
    cells = [{"scenario": "a", "acking": False, "policy": p, "runs": [run], "rate_cov": 0.3} for p in
             ("none", "source_stop", "stepwise+hops")]
    report = {"warmup_s": 1.5, "durations": {"a": 5.0}, "cov_windows": {"a": [[4.0, 5.0]]}, "cells": cells}
    row = next(line for line in diagnose(report).splitlines() if line.startswith("| a |"))
    assert row.endswith("| 0.023 |")          # a report without cov_bin_s: the earlier 250 ms bins
    assert paced_cov(300.0, 5.0, 4.0, EARLIER_BIN_S) == 0.023
    row = next(line for line in diagnose({**report, "cov_bin_s": 0.1}).splitlines() if line.startswith("| a |"))
    assert row.endswith("| 0.067 |") and paced_cov(300.0, 5.0, 4.0, 0.1) == 0.067


def test_report_of_the_stored_matrix_prints_the_diagnosis(capsys) -> None:
    from bench.policy_comparison import RESULTS, main
    main(["--report", str(RESULTS / "policy_comparison.json")])
    out = capsys.readouterr().out
    assert "| cell | 1/3 source_stop | none |" in out
    assert "| c | stepwise+hops |" in out and "| c+ack | none | 1.000" in out


def test_a_variant_from_the_command_line_is_its_base_plus_checked_settings() -> None:
    from bench.policy_comparison import VARIANTS, parse_variant
    name, settings = parse_variant("stepwise+blw=stepwise+recent, backpressure.bracket_light_window_ms=200",
                                   dict(VARIANTS))
    assert name == "stepwise+blw"
    assert settings == {**VARIANTS["stepwise+recent"], "backpressure.bracket_light_window_ms": 200.0}
    name, settings = parse_variant("stepwise+fine4=stepwise,backpressure.fine_steps=4", dict(VARIANTS))
    assert (name, settings) == ("stepwise+fine4", {"backpressure.fine_steps": 4})


def test_a_wrong_variant_is_one_line_naming_what_is_wrong() -> None:
    import pytest
    from bench.policy_comparison import VARIANTS, parse_variant
    cases = {
        "stepwise+x": "expected NAME=BASE",
        "stepwise+x=nosuch": "unknown base 'nosuch'",
        "watermark+x=stepwise": "the name must be stepwise+<word>",
        "stepwise+=stepwise": "the name must be stepwise+<word>",
        "stepwise+hops=stepwise": "already a policy or variant",
        "stepwise+x=stepwise,backpressure.fine_steps": "expected KEY=VALUE",
        "stepwise+x=stepwise,backpressure.nosuch=1": "backpressure.nosuch",
        "stepwise+x=stepwise,backpressure.fine_steps=lots": "'lots'",
    }
    for text, needle in cases.items():
        with pytest.raises(ValueError) as info:
            parse_variant(text, dict(VARIANTS))
        message = str(info.value)
        assert needle in message and "\n" not in message, (text, message)
