"""bench.spark_stage_cost: its fit and summary, exactly; and each of its queries run for real."""
from __future__ import annotations

import pytest

from bench.spark_stage_cost import QUERIES, Point, fit, parse_args, summarize, table


def test_the_fit_recovers_a_known_fixed_cost_and_marginal_rate():
    """Batches of 8,000 and 40,000 rows at exactly 0.15 s + rows / 200,000 rows/s."""
    points = [Point(n, 0.15 + n / 200_000) for n in (8_000, 8_000, 40_000, 40_000)]
    f = fit(points)
    assert f["fixed_cost_ms"] == pytest.approx(150.0)
    assert f["marginal_rows_per_s"] == pytest.approx(200_000.0)
    assert f["small_batch_median_ms"] == pytest.approx(190.0)
    assert f["batches"] == 4


def test_the_summary_is_each_figure_s_median_over_the_rounds_with_its_range():
    rounds = {q: [{"fixed_cost_ms": c, "marginal_rows_per_s": 1000.0 * c, "small_batch_median_ms": None, "batches": 3}
                  for c in (30.0, 10.0, 20.0)] for q in QUERIES}
    s = summarize(rounds)
    assert s["spout"]["fixed_cost_ms"] == {"median": 20.0, "min": 10.0, "max": 30.0}
    assert s["rate"]["marginal_rows_per_s"]["median"] == 20_000.0
    assert s["spout_bolt"]["small_batch_median_ms"]["median"] is None
    assert "| spout | 20 (10-30) | 20,000 (10,000-30,000) | - |" in table({"summary": s})


def test_its_flags_are_checked():
    with pytest.raises(SystemExit):
        parse_args(["--rounds", "0"])
    with pytest.raises(SystemExit):
        parse_args(["--seconds", "2"])
    assert parse_args(None).rounds == 3


@pytest.mark.spark
def test_every_query_runs_on_one_session_and_reports_its_batches():
    """Spark's rate source and topo's three queries each give batches with rows and a time
    (no timing asserted)."""
    from bench.spark_stage_cost import run_rate, run_topo
    from runtime.spark.session import get_session

    spark = get_session("local[2]", shuffle_partitions=2, log_level="ERROR")
    runs = {"rate": run_rate(spark, 2_000, 6.0)}
    runs |= {q: run_topo(spark, q, 2_000, 6.0) for q in QUERIES[1:]}
    for query, points in runs.items():
        assert points, query
        assert all(n > 0 and t > 0 for n, t in points), (query, points)
    assert all(n <= 2_000 for n, _ in runs["spout_bolt"])          # the fixed cap held, counted by what was read
