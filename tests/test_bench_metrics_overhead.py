"""The metrics overhead benchmark runs end to end on a tiny load and writes its report."""
from __future__ import annotations

import json
import sys
from pathlib import Path

# bench/ is not an installed package; plain ``pytest`` (unlike ``python -m pytest``)
# does not put the checkout on sys.path.
ROOT = str(Path(__file__).resolve().parents[1])
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from bench import metrics_overhead  # noqa: E402


def test_tiny_run_writes_a_report(tmp_path: Path) -> None:
    out = tmp_path / "metrics_overhead.json"
    report = metrics_overhead.main(["--tuples", "20000", "--repeats", "1", "--scrape-interval", "0.2",
                                    "--out", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(report))
    assert [r["metrics"] for r in report["runs"]] == [False, True]
    assert report["ratio_on_over_off"] > 0 and report["scrape_cpu_ms"]["4_tasks"] > 0
