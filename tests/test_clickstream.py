"""configs/clickstream.yaml run by ``topo run``: the table equals counts computed from the file."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from test_events_per_minute import expected_from_the_file  # the same rule: 10 s, newest click
from topo.sinks import read_table

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.timeout(300)


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
