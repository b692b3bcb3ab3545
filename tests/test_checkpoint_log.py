"""The checkpoint file manager the Spark engine picks for a query's offset and commit logs."""
from __future__ import annotations

import contextlib

import pytest

from runtime.spark.checkpoint_log import (FILESYSTEM_MANAGERS, MANAGER_KEY, is_local_path, use_manager,
                                          wants_filesystem_manager)
from topo.config import ConfigError, resolve


@pytest.mark.parametrize("location, local", [
    ("/var/lib/topo/ckpt", True), ("ckpt", True), ("file:///srv/ckpt", True), ("C:\\topo\\ckpt", True),
    ("hdfs://nn:8020/ckpt", False), ("s3a://bucket/ckpt", False), ("abfss://c@a.dfs.core.windows.net/x", False),
])
def test_a_local_path_is_told_from_a_remote_file_system(location, local):
    assert is_local_path(location) is local


def test_auto_takes_the_filesystem_manager_only_for_a_local_checkpoint():
    assert wants_filesystem_manager("auto", "/srv/ckpt")
    assert not wants_filesystem_manager("auto", "hdfs://nn/ckpt")
    assert wants_filesystem_manager("filesystem", "hdfs://nn/ckpt")
    assert not wants_filesystem_manager("spark", "/srv/ckpt")


def test_an_unknown_manager_setting_names_key_and_value():
    with pytest.raises(ConfigError, match="spark.checkpoint_file_manager.*rename"):
        resolve({}, {"spark.checkpoint_file_manager": "rename"})


@pytest.mark.spark
def test_the_session_gets_the_manager_for_the_query_and_its_own_value_back():
    from runtime.spark.session import get_session

    spark = get_session("local[1]", shuffle_partitions=1, log_level="ERROR")
    try:
        spark.conf.unset(MANAGER_KEY)
        with contextlib.ExitStack() as stack:
            assert use_manager(stack, spark, "auto", "/srv/ckpt") == FILESYSTEM_MANAGERS[0]   # pinned pyspark 4
            assert spark.conf.get(MANAGER_KEY, None) == FILESYSTEM_MANAGERS[0]
        assert spark.conf.get(MANAGER_KEY, None) is None
        with contextlib.ExitStack() as stack:
            assert use_manager(stack, spark, "spark", "/srv/ckpt") is None
            assert use_manager(stack, spark, "auto", "hdfs://nn/ckpt") is None
            assert spark.conf.get(MANAGER_KEY, None) is None
        spark.conf.set(MANAGER_KEY, "com.example.OwnManager")     # a session passed in keeps its own
        with contextlib.ExitStack() as stack:
            use_manager(stack, spark, "filesystem", "/srv/ckpt")
            assert spark.conf.get(MANAGER_KEY, None) == FILESYSTEM_MANAGERS[0]
        assert spark.conf.get(MANAGER_KEY, None) == "com.example.OwnManager"
    finally:
        spark.conf.unset(MANAGER_KEY)


def test_the_checkpoint_log_bench_measures_both_managers_on_one_session():
    """bench.spark_checkpoint_log runs a real query per setting on the same session and
    leaves the session's manager as it found it (no timing asserted)."""
    from bench.spark_checkpoint_log import PHASES, SETTINGS, run_query, summarize
    from runtime.spark.session import get_session

    spark = get_session("local[1]", shuffle_partitions=1, log_level="ERROR")
    spark.conf.unset(MANAGER_KEY)
    runs = {s: [run_query(spark, s, batches=2, trigger_ms=200, timeout_s=60)] for s in SETTINGS}
    assert spark.conf.get(MANAGER_KEY, None) is None
    summary = summarize(runs)
    for setting in SETTINGS:
        for phase in PHASES:
            assert summary[setting][phase]["triggers"] == 2
            assert summary[setting][phase]["median_ms"] >= 0
    assert summary["filesystem"]["walCommit"]["median_ms"] > 0       # the offset log was written


def test_the_bench_ratio_is_the_filesystem_median_over_spark_s():
    from bench.spark_checkpoint_log import summarize

    def run(w: float) -> dict[str, list[float]]:
        return {"walCommit": [w, w + 2, w + 4], "commitOffsets": [w, w, w], "triggerExecution": [10 * w] * 3}

    s = summarize({"spark": [run(40), run(50)], "filesystem": [run(10), run(12)]})
    assert s["spark"]["walCommit"]["round_medians_ms"] == [42, 52]
    assert s["ratio_filesystem_over_spark"]["walCommit"] == pytest.approx(13 / 47)    # medians of all six: 13 and 47
