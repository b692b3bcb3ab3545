"""The benchmarks still run against the current seams (a few samples each; no timing asserted)."""
from __future__ import annotations

import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from backpressure.coordinator.embedded import EmbeddedCoordinator  # noqa: E402
import bench.backpressure_latency as latency  # noqa: E402
import bench.wordcount as wordcount  # noqa: E402


def test_signal_latency_bench_measures_on_the_embedded_coordinator() -> None:
    ms = asyncio.run(latency.measure(EmbeddedCoordinator("smoke"), samples=3))
    assert len(ms) == 3 and all(m >= 0 for m in ms)


def test_wordcount_bench_checks_counts_on_every_side() -> None:
    out = wordcount.measure(n=5_000, repeats=1)       # raises if any side counts wrong
    assert {"topo_per_tuple_acking_off", "topo_per_tuple_acking_on", "topo_batch_acking_off",
            "topo_batch_acking_on", "bare_asyncio_chain", "per_tuple_api_floor"} <= set(out["median_words_per_s"])


def test_the_api_floor_runs_the_example_components_and_counts_every_word() -> None:
    elapsed, counts = wordcount.run_api_floor(2_500)      # not a multiple of its 1,000-sentence chunks
    assert elapsed > 0 and counts == wordcount._truth(2_500)
