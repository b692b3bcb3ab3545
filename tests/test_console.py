"""The live console of ``topo run``: rendering from snapshot records, and the real
command under a pseudo-terminal (table redrawn in place) and under a pipe (plain lines)."""
from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

from rich.console import Console as RichConsole

from runtime.observe.console import progress, render_table, summary_line, workers_of

REPO = Path(__file__).resolve().parent.parent
TOPO = REPO / ".venv" / "bin" / "topo"
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")

TOPOLOGY = """\
name: endless
spouts:
  - {id: sentences, class: topo.examples.wordcount.SentenceSpout, kwargs: {repeat: 0}}
bolts:
  - {id: split, class: topo.examples.wordcount.SplitBolt, parallelism: 2}
  - {id: count, class: topo.examples.wordcount.CountBolt}
streams:
  - {from: sentences, to: split, grouping: {type: shuffle}}
  - {from: split, to: count, grouping: {type: fields, fields: [word]}}
"""


def _record(component: str, task: int, spout: bool = False, **kw) -> dict:
    base = {"topology": "t", "component": component, "task": task, "spout": spout, "emitted": 0,
            "executed": 0, "acked": 0, "failed": 0, "replayed": 0, "dead_lettered": 0, "queue_bytes": 0,
            "queue_tuples": 0, "high_mark": 50_000_000, "low_mark": 500_000,
            "hard_bound": 0 if spout else 100_000_000, "rate": None, "observed_rate": 0.0,
            "originv": None, "k": 0, "backpressure": False}
    return {**base, **kw}


def _text(renderable, width: int = 140) -> str:
    console = RichConsole(width=width, record=True, file=open(os.devnull, "w"))
    console.print(renderable)
    return console.export_text()


def test_table_rows_per_component_and_task() -> None:
    records = [
        _record("src", 1, spout=True, emitted=12_000, acked=11_500, failed=3, observed_rate=2500.0,
                rate=1250.0, k=1),
        _record("work", 2, queue_bytes=60_000_000, backpressure=True, k=2, acked=900),
        _record("work", 3, queue_bytes=100_000, acked=800),
    ]
    text = _text(render_table(records, "topology 't'"))
    header = next(line for line in text.splitlines() if "component" in line)
    for column in ("task", "rate (limit / emit / processed)", "queue (L low, H high)", "backpressure", "acked",
                   "failed"):
        assert column in header
    src = next(line for line in text.splitlines() if "src" in line)
    assert "1.2k/s / 2.5k/s / -" in src and "ok k=1" in src and "11.5k" in src
    work = next(line for line in text.splitlines() if "work" in line)
    assert "2 tasks" in work and "BP k=2" in work and "1.7k" in work and "60.0MB" in work
    task3 = next(line for line in text.splitlines() if re.search(r"│\s+│ 3\s", line))
    assert "100.0KB" in task3 and "ok k=0" in task3


def test_a_run_in_worker_processes_shows_every_task_with_its_worker() -> None:
    records = [
        _record("src", 1, spout=True, emitted=5_000, worker=0),
        _record("work", 2, queue_bytes=70_000, worker=1),
        _record("work", 3, queue_bytes=30_000, worker=0),
    ]
    assert workers_of(records) == [0, 1] and workers_of([_record("src", 1, spout=True)]) == []
    text = _text(render_table(records, "topology 't'"))
    header = next(line for line in text.splitlines() if "component" in line)
    assert header.rstrip(" ┃").endswith("worker")
    row = {n: next(line for line in text.splitlines() if re.search(rf"│\s+│ {n}\s", line)) for n in (2, 3)}
    assert row[2].rstrip(" │").endswith("1") and row[3].rstrip(" │").endswith("0")
    work = next(line for line in text.splitlines() if "│ work" in line)
    assert work.rstrip(" │").endswith("0,1")                  # the component spans both workers
    assert "worker" not in _text(render_table([_record("src", 1, spout=True)]))   # one process: no column
    assert summary_line(records, 3.0).startswith("[   3.0s] 2 workers, 3 tasks |")


def test_the_bottleneck_is_named_with_whom_it_throttles_and_its_processed_rate() -> None:
    records = [
        _record("src", 1, spout=True, emitted=50_000, observed_rate=1000.0, rate=1000.0, k=2, backpressure=True),
        _record("slow", 2, queue_bytes=60_000_000, processed_rate=980.0, upstream=[1]),
        _record("sink", 3, queue_bytes=0, processed_rate=980.0, upstream=[2]),
    ]
    text = _text(render_table(records, "topology 't'"), width=180)
    slow = next(line for line in text.splitlines() if "slow" in line)
    assert "OVER H -> src:1" in slow and "980/s" in slow        # the slow task, not only the spout
    src = next(line for line in text.splitlines() if "src" in line)
    assert "BP k=2" in src
    sink = next(line for line in text.splitlines() if "sink" in line)
    assert "OVER" not in sink
    line = summary_line(records, 1.0)
    assert line.endswith("| bottleneck slow:2 (980/s processed) throttling src:1")


def test_queue_bar_draws_the_marks() -> None:
    text = _text(render_table([_record("b", 1, queue_bytes=30_000_000, hard_bound=100_000_000,
                                       low_mark=10_000_000, high_mark=50_000_000)]))
    row = next(line for line in text.splitlines() if "│ b " in line)
    bar = re.search(r"([█·LH]{16}) 30.0MB", row)
    assert bar and bar.group(1) == "█████" + "···H" + "·" * 7, row


def test_progress_of_bounded_runs() -> None:
    records = [_record("s", 1, spout=True, emitted=250)]
    assert progress(records, 1.0, None, None) is None
    assert progress(records, 1.0, 4.0, None) == (0.25, "1s/4s")
    assert progress(records, 1.0, None, 1000) == (0.25, "250/1,000 tuples, 1s")


def test_summary_line() -> None:
    records = [_record("s", 1, spout=True, emitted=5000, acked=4990, observed_rate=1000.0),
               _record("b", 2, queue_bytes=2_000_000, backpressure=True, k=3, failed=2)]
    line = summary_line(records, 2.0, duration=4.0)
    assert line == ("[   2.0s] | spout tuples 5,000 (1.0k/s) | acked 4,990 | failed 2 | fullest queue b:2 "
                    "2.0MB/50.0MB | backpressure 1 task(s), max k=3 | 50% done")


def _topo_cmd(tmp_path: Path, *extra: str) -> list[str]:
    (tmp_path / "endless.yaml").write_text(TOPOLOGY)
    exe = [str(TOPO)] if TOPO.exists() else [sys.executable, "-m", "topo.cli"]
    return [*exe, "run", "endless.yaml", "--config", "backpressure.policy=none",
            "--config", "queue.high_mark=2MB", "--config", "queue.low_mark=200KB", *extra]


def _run_in_pty(argv: list[str], cwd: Path, timeout: float = 60.0) -> tuple[int, str]:
    """Run ``argv`` with a 140x40 pseudo-terminal as its stdio; return status and screen text."""
    pid, fd = pty.fork()
    if pid == 0:  # child
        try:
            fcntl.ioctl(1, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 140, 0, 0))
            os.chdir(cwd)
            os.environ.update(TERM="xterm-256color", COLUMNS="140", LINES="40")
            os.environ.pop("NO_COLOR", None)
            os.execv(argv[0], argv)
        finally:
            os._exit(127)
    out = bytearray()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.2)
        if not ready:
            continue
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        out += chunk
    else:
        os.kill(pid, signal.SIGKILL)  # hung: do not leave it behind
    _, status = os.waitpid(pid, 0)
    os.close(fd)
    return os.waitstatus_to_exitcode(status), ANSI.sub("", out.decode("utf-8", "replace"))


def test_live_table_under_a_terminal(tmp_path: Path) -> None:
    code, screen = _run_in_pty(_topo_cmd(tmp_path, "--duration", "2.5"), tmp_path)
    assert code == 0, screen[-3000:]
    assert re.search(r"┃ component\s+┃ task\s+┃ rate \(limit / emit / processed\)\s+┃ queue", screen), screen[-3000:]
    assert re.search(r"│ sentences\s+│ 1\s+│ - / [\d.]+k?/s", screen)
    assert re.search(r"│ split\s+│ 2 tasks\s+│", screen)
    assert screen.count("┃ component") >= 2  # redrawn, not printed once
    assert re.search(r"━+.* [12]s/2s", screen)  # the progress bar of a bounded run
    assert "topology 'endless' stopped (duration)" in screen


def test_plain_lines_when_not_a_terminal(tmp_path: Path) -> None:
    done = subprocess.run(_topo_cmd(tmp_path, "--duration", "2.5"), cwd=tmp_path, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "\x1b[" not in done.stdout
    lines = done.stdout.splitlines()
    ticks = [line for line in lines if line.startswith("[")]
    assert len(ticks) >= 2 and all(re.match(r"\[ +\d+\.\ds\] \| spout tuples [\d,]+ ", t) for t in ticks)
    assert "% done" in ticks[0]
    assert lines[len(ticks)].startswith("topology 'endless' stopped (duration)")


def test_quiet_prints_nothing(tmp_path: Path) -> None:
    done = subprocess.run(_topo_cmd(tmp_path, "--max-tuples", "200", "--quiet"), cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout) == (0, ""), done.stderr
