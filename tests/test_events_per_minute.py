"""configs/events_per_minute.yaml, the first-day example: exact counts, one row per (user, minute)."""
from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import pytest

import topo
from topo.sinks import read_table
from topo.spec import load

ROOT = Path(__file__).resolve().parents[1]
LATENESS = 10


def expected_from_the_file(path: Path) -> tuple[Counter[tuple[str, int]], int]:
    """Counts per (user, minute) of the clicks, computed without a topology; a click is late
    when its minute ended at or before the newest click seen so far minus the lateness."""
    counts: Counter[tuple[str, int]] = Counter()
    newest, late = float("-inf"), 0
    for line in path.read_text().splitlines():
        e = json.loads(line)
        if e["type"] != "click":
            continue
        start = e["ts"] // 60 * 60
        if start + 60 <= newest - LATENESS:
            late += 1
        else:
            counts[(e["user"], start)] += 1
        newest = max(newest, e["ts"])
    return counts, late


def test_events_per_minute_writes_each_user_and_minute_once_exactly(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    shutil.copytree(ROOT / "configs" / "data", tmp_path / "configs" / "data")
    shutil.copy(ROOT / "configs" / "events_per_minute.yaml", tmp_path / "configs")
    monkeypatch.chdir(tmp_path)
    result = topo.run(load("configs/events_per_minute.yaml"), handle_signals=False)
    assert result.reason == "exhausted"
    expected, late = expected_from_the_file(tmp_path / "configs" / "data" / "events.jsonl")
    rows = read_table("events_per_minute.db", "events_per_minute")
    assert {(u, s): n for u, s, n in rows} == dict(expected)
    assert len(rows) == len(expected) > 40 and late > 0          # the sample has late clicks
    totals = result.component_totals()
    assert totals["sink"]["executed"] == len(rows)               # one write per row, not per click
    assert totals["per_minute"]["emitted"] == len(rows) + late   # each window once, plus the late clicks
