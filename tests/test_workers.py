"""A topology in several worker processes: exact results, a killed worker, a drained stop,
stepwise backpressure across workers on both coordinators, every worker's metrics, and what
cannot be shipped."""
from __future__ import annotations

import os
import pickle
import re
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from topo.config import ConfigError, resolve
from topo.examples.wordcount import expected_counts
from topo.sinks import read_table
from topo.topology import TopologyBuilder, TopologyError
from runtime.local.placement import place
from runtime.local.workers import Supervisor, check_shippable, run_workers

sys.path.insert(0, str(Path(__file__).parent / "data"))
from worker_components import Numbers, Pass  # noqa: E402
from zk_server import zookeeper  # noqa: E402,F401  (the session fixture)

ROOT = Path(__file__).resolve().parents[1]
TOPO = [sys.executable, "-m", "topo.cli"]

pytestmark = pytest.mark.timeout(300)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "tests" / "data"), env.get("PYTHONPATH", "")])
    return env


def _topo_run(cwd: Path, *args: str) -> None:
    """``topo run ARGS --quiet`` in ``cwd``, which must exit 0."""
    proc = subprocess.run(TOPO + ["run", *args, "--quiet"], cwd=cwd, env=_env(), capture_output=True, text=True,
                          timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]


class _Output:
    """A running process's stdout and stderr, read line by line as they come (so a test can
    wait for what the process prints while it runs)."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc, self.out, self.err = proc, [], []
        self.threads = [threading.Thread(target=self._read, args=(pipe, into), daemon=True)
                        for pipe, into in ((proc.stdout, self.out), (proc.stderr, self.err))]
        for t in self.threads:
            t.start()

    @staticmethod
    def _read(pipe, into: list[str]) -> None:
        for line in pipe:
            into.append(line)

    def wait_for(self, cond, timeout: float, what: str) -> None:
        """Until ``cond()``; fails naming ``what`` if the process ends or ``timeout`` passes first."""
        deadline = time.monotonic() + timeout
        while not cond():
            assert self.proc.poll() is None, f"the run ended before {what}: {''.join(self.err)[-2000:]}"
            assert time.monotonic() < deadline, f"no {what} within {timeout} s: {''.join(self.out)[-2000:]}"
            time.sleep(0.05)

    def finish(self, timeout: float) -> tuple[str, str]:
        """(stdout, stderr) once the process has ended."""
        self.proc.wait(timeout)
        for t in self.threads:
            t.join(timeout)
        return "".join(self.out), "".join(self.err)


def _console_emitted(lines: list[str]) -> list[int]:
    """The spout tuples of each plain console line of a ``topo run --workers 2``."""
    return [int(m.group(1).replace(",", "")) for line in list(lines)
            if line.startswith("[") and "] 2 workers, 2 tasks |" in line
            and (m := re.search(r"spout tuples ([\d,]+)", line))]


def test_placement_spreads_each_component_round_robin() -> None:
    b = TopologyBuilder("p")
    b.spout("s", Numbers(1))
    b.bolt("a", Pass(), parallelism=3).shuffle("s")
    b.bolt("c", Pass()).shuffle("a")
    owner = place(b.build(), 2, 0).owner
    # s: task 1 -> worker 0; a: tasks 2, 3, 4 -> 1, 0, 1; c: task 5 -> worker 0 (component 2, task 0)
    assert owner == {1: 0, 2: 1, 3: 0, 4: 1, 5: 0}


@pytest.mark.parametrize("workers, checkpoints", [(1, "null"), (2, "null"), (3, "null"), (2, "300")])
def test_word_counts_are_exact_with_any_number_of_workers(tmp_path: Path, workers: int, checkpoints: str) -> None:
    """(and with checkpoints across workers: the supervisor's global cuts, the last one sealing the table)"""
    _topo_run(tmp_path, str(ROOT / "configs" / "wordcount.yaml"), "--workers", str(workers),
              "--config", f"checkpoint.interval_ms={checkpoints}")
    assert dict(read_table(str(tmp_path / "wordcount.db"), "word_counts")) == dict(expected_counts(repeat=2000))


FINAL_COUNTS = """
name: final-counts
config: {acking: ACKING}
spouts:
  - {id: sentences, class: topo.examples.wordcount.SentenceSpout, kwargs: {repeat: 500}, parallelism: 2}
bolts:
  - {id: split, class: topo.examples.wordcount.SplitBolt, parallelism: 2}
  - {id: count, class: topo.examples.wordcount.FinalCountBolt, parallelism: 2}
  - id: sink
    class: topo.sinks.SQLiteSink
    kwargs: {path: final.db, table: word_counts, fields: [word, count], key_fields: [word]}
streams:
  - {from: sentences, to: split, grouping: {type: shuffle}}
  - {from: split, to: count, grouping: {type: fields, fields: [word]}}
  - {from: count, to: sink, grouping: {type: fields, fields: [word]}}
"""


@pytest.mark.parametrize("workers, acking", [(1, "false"), (2, "false"), (3, "true")])
def test_end_of_input_reaches_every_worker_and_final_counts_are_exact(tmp_path: Path, workers: int,
                                                                      acking: str) -> None:
    """A bounded run ends its ``end_of_input`` bolts as one process does: the counts, in
    whichever worker they are, emit their finals once every word reached them."""
    (tmp_path / "final.yaml").write_text(FINAL_COUNTS.replace("ACKING", acking))
    _topo_run(tmp_path, "final.yaml", "--workers", str(workers))
    assert dict(read_table(str(tmp_path / "final.db"), "word_counts")) == dict(expected_counts(repeat=500))


def _numbers_into_sqlite(total: int, db: Path, delay_s: float = 0.0, **config: object):
    b = TopologyBuilder("nums", {"acking": True, "backpressure.policy": "none", "max_spout_pending": 500,
                                 **config})
    b.spout("numbers", Numbers(total))
    b.bolt("pass", Pass(delay_s)).shuffle("numbers")      # component 1, task 0 -> worker 1
    from topo.sinks import SQLiteSink
    b.bolt("sink", SQLiteSink(str(db), "seen", ["n"], ["n"], flush_interval_s=0.05)).shuffle("pass")
    return b.build()


def _rows(db: Path) -> int:
    """Rows in the sink's table (0 before it exists)."""
    try:
        with sqlite3.connect(db) as conn:
            return conn.execute("SELECT count(*) FROM seen").fetchone()[0]
    except sqlite3.Error:
        return 0


@pytest.mark.parametrize("policy", ["none", "stepwise"])
def test_a_worker_killed_mid_run_is_restarted_and_nothing_is_lost(tmp_path: Path, policy: str) -> None:
    """With stepwise on the served embedded coordinator, the killed worker's session (its
    task claims and states) ends with its connection, so its replacement claims its tasks."""
    db = tmp_path / "seen.db"
    topology = _numbers_into_sqlite(20_000, db, delay_s=0.0002, message_timeout_s=2.0,
                                    **{"backpressure.policy": policy})
    cfg = resolve(topology.config, {})
    with tempfile.TemporaryDirectory() as d:
        sup = Supervisor(topology, cfg, 2, d)
        sup.start()
        assert (sup.coordinator is not None) == (policy == "stepwise")     # served to the workers
        box: dict[str, object] = {}
        t = threading.Thread(target=lambda: box.setdefault("result", sup.supervise(None)))
        t.start()
        try:
            # Killed once numbers went through it to the sink, and long before all of them did
            # (20,000 at 0.2 ms each: over 4 s), however slow the workers are to start.
            deadline = time.monotonic() + 60
            while not _rows(db) and t.is_alive() and time.monotonic() < deadline:
                time.sleep(0.02)
            victim = sup.procs[1].process            # runs the pass bolt
            assert 0 < _rows(db) < 20_000 and victim.is_alive(), "the pass bolt's worker was not killed mid-run"
            os.kill(victim.pid, signal.SIGKILL)
            t.join(240)
        finally:
            sup.stop_all()
        assert not t.is_alive()
    assert sup.procs[1].restarts == 1
    with sqlite3.connect(db) as conn:
        seen = {n for (n,) in conn.execute("SELECT n FROM seen")}
    assert seen == set(range(20_000))               # every number got through, replays included


SLOW = """
name: slow
config:
  acking: true
  max_spout_pending: 2000
  message_timeout_s: 60
  backpressure.policy: none
spouts:
  - {id: numbers, class: worker_components.Numbers, kwargs: {total: 0}}
bolts:
  - {id: slow, class: worker_components.Pass, kwargs: {delay_s: 0.002}}
streams:
  - {from: numbers, to: slow, grouping: {type: shuffle}}
"""


def test_sigterm_drains_across_workers_and_accounts_for_every_tuple(tmp_path: Path) -> None:
    (tmp_path / "slow.yaml").write_text(SLOW)
    proc = subprocess.Popen(TOPO + ["run", "slow.yaml", "--workers", "2", "--config", "drain_timeout_s=3"],
                            cwd=tmp_path, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    output = _Output(proc)
    try:    # SIGTERM once the console shows tuples emitted (not a fixed time: the workers may be slow to start)
        output.wait_for(lambda: any(_console_emitted(output.out)), 60, "console line with tuples emitted")
        proc.send_signal(signal.SIGTERM)
        out, err = output.finish(60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-2000:]
    row = next(line for line in out.splitlines() if line.startswith("numbers")).split()
    emitted, acked, failed = (int(row[i].replace(",", "")) for i in (2, 4, 5))
    assert emitted > 0 and emitted == acked + failed          # nothing in flight vanished
    assert "stopped (signal)" in out or "signal" in out


@pytest.mark.parametrize("coordinator", ["embedded", pytest.param("zookeeper", marks=pytest.mark.zookeeper)])
def test_stepwise_signals_cross_workers_through_the_coordinator(request: pytest.FixtureRequest,
                                                                coordinator: str) -> None:
    """On ZooKeeper, and on the embedded default, which the supervisor serves to its workers."""
    where = (request.getfixturevalue("zookeeper").url("/topo-workers") if coordinator == "zookeeper"
             else "embedded")
    b = TopologyBuilder("acrossworkers", {
        "acking": True, "max_spout_pending": 20000, "backpressure.policy": "stepwise",
        "queue.high_mark": "2KB", "queue.low_mark": "256B", "backpressure.sensitivity_ms": 200,
        "coordinator": where})
    b.spout("numbers", Numbers(8000))                      # worker 0
    b.bolt("slow", Pass(0.001)).shuffle("numbers")        # worker 1: its queue signals the spout
    topology = b.build()
    result = run_workers(topology, resolve(topology.config, {}), workers=2)
    spout = next(s for s in result.stats if s.component == "numbers")
    slow = next(s for s in result.stats if s.component == "slow")
    assert slow.signals_sent.get("BACKPRESSURE", 0) >= 1          # sent by worker 1 ...
    assert spout.signals_received.get("BACKPRESSURE", 0) >= 1     # ... obeyed by worker 0
    assert spout.acked == 8000 and slow.executed == 8000           # and nothing was lost


def test_what_cannot_run_in_workers_is_one_line() -> None:
    b = TopologyBuilder("x", {"backpressure.policy": "adaptive"})
    b.spout("numbers", Numbers(1))
    b.bolt("pass", Pass()).shuffle("numbers")
    t = b.build()
    check_shippable(t, resolve(t.config, {"backpressure.adaptive.autoscale": True}))   # autoscaling crosses workers
    check_shippable(t, resolve(t.config, {}))
    keyed = TopologyBuilder("k", {"backpressure.policy": "adaptive"})
    keyed.spout("numbers", Numbers(1))
    keyed.bolt("pass", Pass(), parallelism=2).fields("numbers", "n")
    kt = keyed.build()
    with pytest.raises(ConfigError, match=r"^config 'backpressure.adaptive.autoscale': bolt 'pass' is fed by fields "
                                          r"grouping on \['n'\] but is not a KeyedBolt"):
        check_shippable(kt, resolve(kt.config, {"backpressure.adaptive.autoscale": True}))
    check_shippable(kt, resolve(kt.config, {}))         # auto: that bolt keeps its tasks
    for policy in ("source_stop", "watermark", "window"):          # these cross workers now
        check_shippable(t, resolve(t.config, {"backpressure.policy": policy, "acking": True}))
    with pytest.raises(TopologyError, match="spout 'numbers' keeps no offsets to resume from"):
        check_shippable(t, resolve(t.config, {"checkpoint.interval_ms": 100, "backpressure.policy": "none"}))

    class Local(Pass):
        pass

    b = TopologyBuilder("y")
    b.spout("numbers", Numbers(1))
    b.bolt("pass", Local()).shuffle("numbers")
    t = b.build()
    with pytest.raises(TopologyError, match="cannot be shipped to a worker process"):
        check_shippable(t, resolve(t.config, {}))


def _free_ports(n: int) -> int:
    """The first of ``n`` consecutive ports on 127.0.0.1 that are free now."""
    import random
    import socket

    for _ in range(200):
        base = random.randint(20000, 60000)
        socks = []
        try:
            for p in range(base, base + n):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no consecutive free ports")


def _scrape(port: int, deadline: float) -> str:
    import urllib.request

    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                return r.read().decode()
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def test_every_worker_serves_its_metrics_on_its_own_port_with_a_worker_label() -> None:
    import re

    base = _free_ports(2)
    b = TopologyBuilder("metered", {"backpressure.policy": "none", "metrics.port": base})
    b.spout("numbers", Numbers(0))                      # task 1 -> worker 0
    b.bolt("slow", Pass(0.0005)).shuffle("numbers")     # task 2 -> worker 1
    topology = b.build()
    box: dict[str, object] = {}
    t = threading.Thread(target=lambda: box.setdefault("result", run_workers(
        topology, resolve(topology.config, {}), workers=2, duration=8)))
    t.start()
    try:
        deadline = time.monotonic() + 60
        pages = {i: _scrape(base + i, deadline) for i in (0, 1)}
    finally:
        t.join(120)
    assert not t.is_alive()
    for worker, page in pages.items():
        samples = [line for line in page.splitlines() if line.startswith("topo_")]
        assert samples and all(f'worker="{worker}"' in line for line in samples), page[:2000]
        tasks = set(re.findall(r'topo_tuples_emitted_total\{[^}]*task="(\d+)"', page))
        assert tasks == {str(worker + 1)}, page[:2000]      # worker 0 runs task 1, worker 1 task 2


def test_topo_run_with_workers_shows_every_worker_in_the_console_status_and_metrics(tmp_path: Path) -> None:
    """The live console (plain lines: stdout is a pipe), ``topo status`` and every worker's
    exporter, during one ``topo run --workers 2``."""
    (tmp_path / "slow.yaml").write_text(SLOW)
    base = _free_ports(2)
    status = tmp_path / "status.json"
    # No --duration: the run goes on until the test has seen all it checks, then stops on SIGTERM
    # (a fixed duration ended the run before a slow machine got that far).
    proc = subprocess.Popen(TOPO + ["run", "slow.yaml", "--workers", "2", "--metrics-port", str(base),
                                    "--config", "drain_timeout_s=3", "--config", f"status.path={status}"],
                            cwd=tmp_path, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    output = _Output(proc)
    try:
        deadline = time.monotonic() + 60
        pages = [_scrape(base + i, deadline) for i in (0, 1)]
        while True:       # topo status while the run goes on: every task of every worker
            assert proc.poll() is None, "the run ended before topo status showed every task"
            shown = subprocess.run(TOPO + ["status", "--file", str(status)], env=_env(), capture_output=True,
                                   text=True, timeout=60)
            lines = shown.stdout.splitlines()
            if shown.returncode == 0 and len(lines) == 4:
                break
            assert time.monotonic() < deadline, f"topo status did not show every task within 60 s: {shown.stdout}"
            time.sleep(0.2)
        output.wait_for(lambda: len(_console_emitted(output.out)) >= 3, 60, "three console lines")
        proc.send_signal(signal.SIGTERM)
        out, err = output.finish(120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-2000:]
    for i, page in enumerate(pages):
        assert f'topo_tuples_emitted_total{{' in page and f'worker="{i}"' in page
    notes = [line for line in err.splitlines() if line.startswith("workers: 2:")]
    assert notes == [f"workers: 2: metrics of worker i on 127.0.0.1:{base}+i ({base}-{base + 1})"]
    assert "running, 2 worker processes" in lines[0], shown.stdout
    assert lines[1].split()[-1] == "worker"
    assert [(line.split()[0], line.split()[1], line.split()[-1]) for line in lines[2:]] == [
        ("numbers", "1", "0"), ("slow", "2", "1")]
    # (the first line may come before the workers' first report)
    emitted = _console_emitted(out.splitlines())
    assert len(emitted) >= 3, out[-2000:]
    assert emitted[-1] > emitted[0] >= 0          # live: the counts move from line to line


def test_a_busy_port_of_any_worker_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import socket

    from topo.cli import main

    base = _free_ports(2)
    with socket.socket() as s:
        s.bind(("127.0.0.1", base + 1))
        s.listen()
        assert main(["run", str(ROOT / "configs" / "wordcount.yaml"), "--quiet", "--workers", "2",
                     "--config", "checkpoint.interval_ms=null", "--metrics-port", str(base)]) == 1
    assert capsys.readouterr().err == (f"--metrics-port: cannot listen on 127.0.0.1:{base + 1} (worker 1's port): "
                                       f"Address already in use (got {base})\n")


def test_the_prometheus_config_documents_one_target_per_worker() -> None:
    import yaml

    text = (ROOT / "configs" / "prometheus.yml").read_text()
    block = text[text.index("#  - job_name: topo-workers"):]
    job = yaml.safe_load("\n".join(line[1:] for line in block.splitlines()))[0]
    assert job["static_configs"][0]["targets"] == ["127.0.0.1:9464", "127.0.0.1:9465"]   # 9464 + worker index
