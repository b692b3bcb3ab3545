"""The benchmarks still run against the current seams (a few samples each; no timing asserted)."""
from __future__ import annotations

import asyncio
import os
import sys
from collections import Counter
from pathlib import Path
from types import ModuleType

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from backpressure.coordinator.embedded import EmbeddedCoordinator  # noqa: E402
import bench.backpressure_latency as latency  # noqa: E402
import bench.checkpoints as checkpoints  # noqa: E402
import bench.throughput as throughput  # noqa: E402
import bench.wordcount as wordcount  # noqa: E402


def test_signal_latency_bench_measures_on_the_embedded_coordinator() -> None:
    ms = asyncio.run(latency.measure(EmbeddedCoordinator("smoke"), samples=3))
    assert len(ms) == 3 and all(m >= 0 for m in ms)


def test_wordcount_bench_checks_counts_on_every_side() -> None:
    out = wordcount.measure(n=5_000, repeats=1)       # raises if any side counts wrong
    assert {"topo_per_tuple_acking_off", "topo_per_tuple_acking_on", "topo_batch_acking_off",
            "topo_batch_acking_on", "bare_asyncio_chain", "per_tuple_api_floor", "zipf_topo_per_tuple_acking_off",
            "zipf_per_tuple_api_floor", "zipf_topo_batch_acking_on_batch_granularity"} <= set(out["median_words_per_s"])


def test_the_api_floor_runs_the_example_components_and_counts_every_word() -> None:
    elapsed, counts = wordcount.run_api_floor(2_500)      # not a multiple of its 1,000-sentence chunks
    assert elapsed > 0 and counts == wordcount.truth_of(wordcount.DEFAULT_SENTENCES, 2_500)


def test_the_made_up_inputs_are_seeded_and_the_uniform_one_spreads_its_words_evenly(tmp_path: Path) -> None:
    _, zipf = wordcount.sentences_for("zipf", tmp_path)
    assert zipf == wordcount.sentences_for("zipf", tmp_path)[1]          # the same sentences every run
    assert abs(wordcount.key_shares(wordcount.sentences_for("uniform", tmp_path)[1])[0] - 0.5) < 0.02
    assert wordcount.key_shares(list(wordcount.DEFAULT_SENTENCES)) == [12 / 32, 20 / 32]
    counts = wordcount.truth_of(zipf[:3], 7)       # 2 full passes and the first sentence once more
    assert sum(counts.values()) == 2 * sum(len(s.split()) for s in zipf[:3]) + len(zipf[0].split())


def test_the_workers_bench_checks_bytewax_counts_across_two_processes(tmp_path: Path) -> None:
    pytest.importorskip("bytewax")
    from bench.bytewax_wordcount import read_counts
    path, sentences = wordcount.sentences_for("zipf", tmp_path)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    truth = wordcount.truth_of(sentences, 25_001)      # an odd total: the two partitions differ by one
    for variant in ("per_tuple", "batch"):
        flow = f"bench.bytewax_wordcount:flow({variant!r}, 25001, {path!r}, {str(tmp_path / 'out')!r})"
        wordcount._timed_run([sys.executable, "-m", "bytewax.testing", flow, "-p", "2"], str(tmp_path / "out"), env,
                             truth, read_counts)
    with pytest.raises(AssertionError, match="wrong counts"):
        wordcount._timed_run([sys.executable, "-m", "bytewax.testing", flow, "-w", "2"], str(tmp_path / "out"), env,
                             truth + Counter({"extra": 1}), read_counts)


def test_the_workers_bench_checks_topo_counts_written_by_two_workers(tmp_path: Path) -> None:
    path, sentences = wordcount.sentences_for("zipf", tmp_path)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    truth = wordcount.truth_of(sentences, 20_000)
    for variant in ("per_tuple", "batch"):
        spec = tmp_path / f"{variant}.yaml"
        spec.write_text(wordcount.worker_spec(variant, 20_000, path, len(sentences), str(tmp_path / "out")))
        cmd = [sys.executable, "-m", "topo.cli", "run", str(spec), "--quiet", "--workers", "2"]
        wordcount._timed_run(cmd, str(tmp_path / "out"), env, truth, wordcount.read_topo_counts)
    with pytest.raises(AssertionError, match="wrong counts"):
        wordcount._timed_run(cmd, str(tmp_path / "out"), env, truth + Counter({"extra": 1}), wordcount.read_topo_counts)


def _no_measuring(monkeypatch: pytest.MonkeyPatch, bench: ModuleType) -> None:
    """``bench``'s benchmark fails the test if anything starts it."""
    def measure(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"{bench.__name__} started its benchmark")
    monkeypatch.setattr(bench, "measure", measure)


@pytest.mark.parametrize("argv,message", [
    (["--worker-variants", "tuples"], "--worker-variants: unknown ['tuples'] (known: per_tuple, batch)"),
    (["--worker-modes", "off,sometimes"],
     "--worker-modes: unknown ['sometimes'] (known: off, on, on_batch_granularity)"),
    (["--worker-inputs", "example,"], "--worker-inputs: unknown [''] (known: example, zipf, uniform)"),
    (["--worker-inputs"], "argument --worker-inputs: expected one argument"),
    (["--worker-rounds", "0"], "--worker-rounds: a whole number >= 1, got '0'"),
    (["--worker-rounds", "2.5"], "--worker-rounds: a whole number >= 1, got '2.5'"),
])
def test_the_wordcount_bench_refuses_a_bad_option_in_one_line(monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str],
                                                              argv: list[str], message: str) -> None:
    _no_measuring(monkeypatch, wordcount)
    with pytest.raises(SystemExit) as exc:
        wordcount.main(argv)
    assert exc.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == f"python -m bench.wordcount: error: {message}"


@pytest.mark.parametrize("bench", [wordcount, checkpoints, throughput], ids=lambda m: m.__name__)
def test_a_bench_prints_its_usage_or_refuses_an_unknown_flag_without_running(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], bench: ModuleType) -> None:
    _no_measuring(monkeypatch, bench)
    with pytest.raises(SystemExit) as exc:
        bench.main(["--help"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: python -m {bench.__name__} [-h]")
    with pytest.raises(SystemExit) as exc:
        bench.main(["--qiuck"])      # misspelt
    assert exc.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"python -m {bench.__name__}: error: unrecognized arguments: --qiuck")


@pytest.mark.parametrize("bench", [wordcount, checkpoints, throughput], ids=lambda m: m.__name__)
def test_a_bench_called_with_no_arguments_runs_with_no_flags_whatever_sys_argv_holds(
        monkeypatch: pytest.MonkeyPatch, bench: ModuleType) -> None:
    # python -m bench NAME calls NAME's main() with sys.argv holding its own arguments.
    monkeypatch.setattr(sys, "argv", ["bench/__main__.py", "--help", bench.__name__.split(".")[1]])
    _no_measuring(monkeypatch, bench)
    with pytest.raises(AssertionError, match="started its benchmark"):
        bench.main()


def test_the_workers_bench_runs_only_the_variants_asked_for(tmp_path: Path) -> None:
    got = wordcount.measure_workers(2_000, 1, ["off"], ["example"], ["per_tuple"])
    assert set(got["sentences"]) == {"per_tuple"}
    assert {k for k in got["seconds"] if not k.startswith("bytewax")} == {
        "per_tuple_acking_off_workers_1", "per_tuple_acking_off_workers_2"}
    assert not any("batch" in k for k in got["seconds"])


def test_the_quiet_figures_leave_out_runs_the_machine_ran_slow_for_on_every_side_alike() -> None:
    times = {"v_workers_1": [8.0, 8.2, 12.0, 8.1], "v_workers_2": [5.0, 9.0, 5.2, 5.1],
             "bytewax_v_p1": [3.0, 3.1, 3.2, 6.0]}
    speeds = {"v_workers_1": [0.20, 0.21, 0.40, 0.19], "v_workers_2": [0.20, 0.45, 0.21, 0.20],
              "bytewax_v_p1": [0.20, 0.20, 0.21, 0.50]}
    got = wordcount.quiet_runs(times, speeds)
    assert got["threshold_s"] == pytest.approx(1.2 * 0.20)          # the 10th percentile of the 12 readings
    assert got["runs"] == {"v_workers_1": 3, "v_workers_2": 3, "bytewax_v_p1": 3}
    assert got["median_seconds"] == {"v_workers_1": 8.1, "v_workers_2": 5.1, "bytewax_v_p1": 3.1}
    assert got["speedup_2_vs_1"] == {"v": pytest.approx(8.1 / 5.1)}
    # A side with no quiet run has no median and gives no ratio.
    none_quiet = wordcount.quiet_runs({"v_workers_1": [8.0], "v_workers_2": [5.0]},
                                      {"v_workers_1": [0.2], "v_workers_2": [0.9]})
    assert none_quiet["median_seconds"] == {"v_workers_1": 8.0} and none_quiet["speedup_2_vs_1"] == {}
    assert wordcount.quiet_runs({}, {}) == {}
