"""BENCHMARKS.md's generated section is what the stored results give (bench.report)."""
from __future__ import annotations

import json
import statistics
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench import environment, report

REPO = Path(__file__).resolve().parent.parent


def test_the_committed_section_is_what_the_stored_results_render() -> None:
    # A results file replaced without rendering again, or a figure edited by hand in the
    # section, fails here.
    done = subprocess.run([sys.executable, "-m", "bench.report", "--check"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def _copy_results(tmp_path: Path) -> Path:
    results = tmp_path / "results"
    results.mkdir()
    for name in list(report.RENDERERS) + ["environment"]:
        src = report.RESULTS / f"{name}.json"
        if src.exists():
            shutil.copy(src, results / f"{name}.json")
    return results


def test_a_changed_figure_changes_the_section_and_check_fails_until_it_is_rendered(tmp_path: Path) -> None:
    results = _copy_results(tmp_path)
    doc = tmp_path / "BENCHMARKS.md"
    doc.write_text("# Benchmarks\n\nIntro.\n\n## A write-up\n\nKept as it is.\n")
    assert report.main(["--results", str(results), "--file", str(doc)]) == 0
    text = doc.read_text()
    assert text.index("## Latest results (generated)") < text.index("## A write-up")
    assert text.endswith("## A write-up\n\nKept as it is.\n")
    assert report.main(["--check", "--results", str(results), "--file", str(doc)]) == 0

    m = json.loads((results / "metrics_overhead.json").read_text())
    m["median_tuples_per_s_on"] = 123_456.0
    (results / "metrics_overhead.json").write_text(json.dumps(m))
    assert report.main(["--check", "--results", str(results), "--file", str(doc)]) == 1
    assert report.main(["--results", str(results), "--file", str(doc)]) == 0
    again = doc.read_text()
    assert "| on | 123,456 |" in again
    assert again.count(report.BEGIN) == 1 and again.count(report.END) == 1
    assert again.endswith("## A write-up\n\nKept as it is.\n")


def test_a_benchmark_not_run_yet_gets_a_line_saying_so(tmp_path: Path) -> None:
    results = _copy_results(tmp_path)
    (results / "throughput.json").unlink()
    text = report.section(results)
    assert "Not run yet: `python -m bench throughput` writes `bench/results/throughput.json`." in text


def test_a_results_file_that_cannot_be_rendered_is_named_in_one_line(tmp_path: Path, capsys) -> None:
    results = _copy_results(tmp_path)
    (results / "checkpoints.json").write_text('{"throughput": {}}')
    doc = tmp_path / "BENCHMARKS.md"
    doc.write_text("# Benchmarks\n")
    assert report.main(["--results", str(results), "--file", str(doc)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "checkpoints.json" in err and "KeyError" in err
    (results / "checkpoints.json").write_text("{not json")
    assert report.main(["--results", str(results), "--file", str(doc)]) == 2
    assert "checkpoints.json: not readable JSON" in capsys.readouterr().err


def test_a_section_missing_its_end_marker_is_an_error_not_a_truncated_file(tmp_path: Path, capsys) -> None:
    doc = tmp_path / "BENCHMARKS.md"
    doc.write_text(f"# Benchmarks\n\n{report.BEGIN}\nold\n\n## A write-up\n")
    assert report.main(["--file", str(doc)]) == 2
    assert "missing" in capsys.readouterr().err
    assert doc.read_text().endswith("## A write-up\n")


def test_results_record_the_command_that_made_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", [str(REPO / "bench" / "__main__.py"), "throughput"])
    assert environment.command_line("throughput") == "python -m bench throughput"
    monkeypatch.setattr(sys, "argv", [str(REPO / "bench" / "rescale_pause.py"), "--workers", "2"])
    stamped = environment.stamp({"cases": [], "run": {"started": "then"}}, "rescale_pause")
    assert stamped["command"] == "python -m bench.rescale_pause --workers 2"
    assert stamped["run"]["started"] == "then" and stamped["run"]["ended"]
    monkeypatch.setattr(sys, "argv", ["/somewhere/pytest", "-q"])     # a test calling main(): not its argv
    assert environment.command_line("throughput") == "bench.throughput.main() called from Python (its arguments not recorded)"


def test_the_environment_names_the_versions_figures_depend_on() -> None:
    env = environment.record()
    assert env["cores"] and env["versions"]["python"]
    assert {"uvloop", "msgpack", "kazoo", "pyspark", "bytewax"} <= set(env["versions"])


def test_the_machine_line_gives_the_load_recorded_not_a_fixed_phrase(tmp_path: Path) -> None:
    env = environment.record()
    assert isinstance(env["load_average_1min"], float)
    (tmp_path / "environment.json").write_text(json.dumps(env | {"load_average_1min": 1.234}))
    assert "load average (1 min) 1.23 then" in report.environment(tmp_path)
    (tmp_path / "environment.json").write_text(json.dumps({k: v for k, v in env.items() if k != "load_average_1min"}))
    assert "load not recorded" in report.environment(tmp_path)


def test_the_workers_table_gives_the_quiet_runs_figures_when_the_run_recorded_the_machine_readings() -> None:
    d = json.loads((report.RESULTS / "wordcount.json").read_text())
    w = d["workers"]
    w.pop("machine_speed_s", None)
    first = next(iter(w["speedup_2_vs_1"]))
    one, two = f"{first}_workers_1", f"{first}_workers_2"
    _, before = report.wordcount(d)
    # Every run read 0.20 s but the two-worker ones, read slow: no quiet two-worker run.
    w["machine_speed_s"] = {k: [0.9 if k == two else 0.2] * len(v) for k, v in w["seconds"].items()}
    _, after = report.wordcount(d)
    assert "quiet runs alone" not in before
    assert "within 1.20x of the 10th-percentile reading, 0.240 s" in after
    n = len(w["seconds"][one])
    assert f"| {first} | {statistics.median(w['seconds'][one]):.2f} ({n}) | - (0) | - |" in after   # no ratio
