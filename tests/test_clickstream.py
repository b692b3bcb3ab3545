"""configs/clickstream.yaml run by ``topo run``: the table equals counts computed from the file."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from topo.sinks import read_table

ROOT = Path(__file__).resolve().parents[1]
LATENESS = 10

pytestmark = pytest.mark.timeout(300)


def expected_from_the_file(path: Path) -> tuple[Counter[tuple[str, int]], int]:
    """Clicks per (user, minute start) without a topology: a click is late when its minute
    ended at or before the newest click seen before it minus the allowed lateness."""
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


def test_the_shipped_data_file_is_what_its_script_makes(tmp_path: Path) -> None:
    shutil.copy(ROOT / "configs" / "data" / "make_clicks.py", tmp_path)
    subprocess.run([sys.executable, str(tmp_path / "make_clicks.py")], check=True, timeout=60)
    assert (tmp_path / "clicks.jsonl").read_bytes() == (ROOT / "configs" / "data" / "clicks.jsonl").read_bytes()


def test_topo_run_clickstream_writes_one_exact_row_per_user_and_minute(tmp_path: Path) -> None:
    shutil.copytree(ROOT / "configs" / "data", tmp_path / "configs" / "data")
    shutil.copy(ROOT / "configs" / "clickstream.yaml", tmp_path / "configs")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-m", "topo.cli", "run", "configs/clickstream.yaml", "--quiet"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    expected, late = expected_from_the_file(tmp_path / "configs" / "data" / "clicks.jsonl")
    rows = read_table(str(tmp_path / "clickstream.db"), "clicks_per_minute")
    assert {(u, s): n for u, s, n in rows} == dict(expected)
    assert len(rows) == len(expected) > 300
    assert late > 20                    # the file has late clicks, and they are not counted
    last = max(s for _, s in expected)
    assert any(s == last for _, s, _ in rows)       # the last minute too: closed at the end of input
