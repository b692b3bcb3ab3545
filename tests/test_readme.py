"""Every example in README.md and docs/ works as written and shows what the page says.

The Python blocks run as scripts, in order, in one directory per page; a block after
a line ending in "`name.py`:" (or any other file name) is written to that file
instead, for the blocks after it to use. A ```text block after "prints" is the
output of the Python block before it, compared exactly. README's YAML block must be
`configs/wordcount.yaml`. Every shell command has a check below, keyed by the
command as the page spells it: a command a page gains without a check here fails
`test_every_shell_command_is_checked`.
"""
from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from topo.examples.wordcount import expected_counts
from topo.sinks import read_table
from zk_server import zookeeper  # noqa: F401  (the fixture, for docs/security.md's example)

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
DOCS = sorted((ROOT / "docs").glob("*.md"))
# Pages whose Python blocks are not yet complete scripts, with why; remove an entry
# once its page's examples run.
NOT_RUN: dict[str, str] = {}
BLOCK = re.compile(r"^```(\w+)\n(.*?)^```", re.M | re.S)
NAMED = re.compile(r"`([\w.-]+\.\w+)`:\s*$")


def blocks(lang: str, text: str = README) -> list[str]:
    return [body for kind, body in BLOCK.findall(text) if kind == lang]


def page_steps(text: str) -> list[tuple[str, str, str | None]]:
    """(kind, body, file name or None) per block in order; kind "output" for a text
    block after "prints"."""
    steps: list[tuple[str, str, str | None]] = []
    pos = 0
    for m in BLOCK.finditer(text):
        before = text[pos:m.start()].rstrip()
        pos = m.end()
        kind, body = m.group(1), m.group(2)
        named = NAMED.search(before.splitlines()[-1]) if before else None
        if kind == "text" and before.endswith("prints"):
            kind = "output"
        steps.append((kind, body, named.group(1) if named else None))
    return steps


def commands(block: str) -> list[str]:
    """The block's command lines, comments and blank lines left out."""
    out = []
    for line in block.splitlines():
        line = re.sub(r"\s+#\s.*$", "", line).strip()
        if line and not line.startswith("#"):
            out.append(line)
    return out


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    env["PATH"] = os.pathsep.join((str(Path(sys.executable).parent), env.get("PATH", "")))
    return env


def _workdir(tmp_path: Path) -> Path:
    """A directory laid out like the repository root (configs/), so commands run verbatim."""
    (tmp_path / "configs").symlink_to(ROOT / "configs")
    return tmp_path


def _sh(command: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-c", command], cwd=cwd, env=_env(), capture_output=True, text=True,
                          timeout=timeout)


# -- Python ----------------------------------------------------------------------------

def run_page(text: str, cwd: Path) -> int:
    """Write the page's named blocks, run its Python blocks, compare shown outputs;
    returns how many outputs were compared."""
    last: subprocess.CompletedProcess[str] | None = None
    compared = 0
    for kind, body, name in page_steps(text):
        if name is not None:
            (cwd / name).write_text(body)
        elif kind == "python":
            (cwd / "example.py").write_text(body)
            last = subprocess.run([sys.executable, "example.py"], cwd=cwd, env=_env(), capture_output=True,
                                  text=True, timeout=120)
            assert last.returncode == 0, f"{body}\n---\n{last.stderr}"
        elif kind == "output":
            assert last is not None, "an output shown before any example ran"
            assert last.stdout == body
            compared += 1
    return compared


def test_the_python_example_runs_and_prints_what_the_readme_shows(tmp_path):
    assert run_page(README, tmp_path) == len(blocks("python")) >= 1


@pytest.mark.parametrize("page", DOCS, ids=[p.name for p in DOCS])
def test_the_examples_of_a_docs_page_run_and_print_what_it_shows(page, tmp_path):
    if page.name in NOT_RUN:
        pytest.skip(NOT_RUN[page.name])
    run_page(page.read_text(encoding="utf-8"), tmp_path)


# -- YAML ------------------------------------------------------------------------------

def test_the_yaml_example_is_configs_wordcount():
    (shown,) = blocks("yaml")
    assert yaml.safe_load(shown) == yaml.safe_load((ROOT / "configs" / "wordcount.yaml").read_text())


# -- shell -----------------------------------------------------------------------------

def _make_dry_run(target: str, tmp_path: Path) -> str:
    """What `make <target>` would run in a fresh checkout (a new venv, no stamps)."""
    proc = subprocess.run(["make", "-n", "-B", target, f"VENV={tmp_path / 'venv'}"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def check_make_run(tmp_path: Path) -> None:
    """`make run` sets up its own venv with the local engine only: no Spark, no pandas."""
    plan = _make_dry_run("run", tmp_path)
    installs = [line for line in plan.splitlines() if "pip install" in line and "--upgrade pip" not in line]
    assert installs and all(line.rstrip().endswith("-e .") for line in installs), plan
    assert "topo run configs/wordcount.yaml" in plan and "topo.examples.wordcount wordcount.db" in plan


def check_make_test(tmp_path: Path) -> None:
    """`make test` installs every extra (Spark included), the Debian servers, then runs pytest."""
    plan = _make_dry_run("test", tmp_path)
    assert re.search(r"pip install -q -e '\.\[[^]]*spark[^]]*servers[^]]*test", plan), plan
    assert "apt-get install" in plan and "-m pytest" in plan


def check_wordcount_commands(tmp_path: Path) -> None:
    """validate, run, and show the counts, as the README's block runs them, in one directory."""
    cwd = _workdir(tmp_path)
    proc = _sh("topo validate configs/wordcount.yaml", cwd)
    assert proc.returncode == 0, proc.stderr
    proc = _sh("topo run configs/wordcount.yaml", cwd)
    assert proc.returncode == 0, proc.stderr
    assert "finished (its spouts ended)" in proc.stdout
    assert dict(read_table(str(cwd / "wordcount.db"), "word_counts")) == dict(expected_counts(repeat=2000))
    proc = _sh("python -m topo.examples.wordcount wordcount.db", cwd)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[:2] == ["27 words in wordcount.db; top 20:", "  the          8000"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check_metrics_block(block: str, tmp_path: Path) -> None:
    """The scrape happens while the topology still runs and shows its backpressure step k
    and queue bytes (the port is swapped for a free one: 9464 may be taken here)."""
    script = block.replace("9464", str(_free_port()))
    proc = _sh(script, _workdir(tmp_path), timeout=90)
    assert proc.returncode == 0, proc.stderr
    assert re.search(r'^topo_backpressure_step_k\{.*component="events".*\} \d', proc.stdout, re.M), proc.stdout
    assert re.search(r'^topo_queue_bytes\{.*component="enrich".*\} \d', proc.stdout, re.M), proc.stdout


# Commands checked elsewhere, with where.
ELSEWHERE = {
    "topo run --engine spark configs/wordcount.yaml":
        "tests/test_spark_engine.py::test_wordcount_same_counts_on_local_and_spark",
    "pip install 'topo[spark]'": "make test installs the same extra; tests/test_spark_engine.py needs it",
    "topo run --engine spark --master spark://127.0.0.1:7077 configs/wordcount.yaml":
        "tests/test_spark_cluster.py::test_wordcount_on_the_cluster_gives_the_local_engines_counts (free ports)",
    "prometheus --config.file=configs/prometheus.yml --storage.tsdb.path=/tmp/topo-prom \\":
        "tests/test_prometheus.py runs a real Prometheus",
    "--web.listen-address=127.0.0.1:9090": "the line above's continuation",
    "topo run configs/wordcount.yaml --workers 2 --config checkpoint.interval_ms=null":
        "tests/test_workers.py runs it with 1, 2 and 3 workers",
}
WORDCOUNT = ("topo validate configs/wordcount.yaml", "topo run configs/wordcount.yaml",
             "python -m topo.examples.wordcount wordcount.db")
METRICS = "topo run configs/slow_stage.yaml --duration 20 --quiet --metrics-port 9464 &"
SECURITY = "umask 077"      # the first line of docs/security.md's worked example, run below


def test_every_shell_command_is_checked():
    known = {"make run", "make test", *WORDCOUNT, *ELSEWHERE}
    for block in blocks("sh") + [b for page in DOCS for b in blocks("sh", page.read_text(encoding="utf-8"))]:
        cmds = commands(block)
        if cmds[0] in (METRICS, SECURITY):
            continue
        unchecked = [c for c in cmds if c not in known]
        assert not unchecked, f"README shell commands without a check in {__file__}: {unchecked}"


def test_make_run_installs_only_the_local_engine_and_make_test_everything(tmp_path):
    (first,) = [b for b in blocks("sh") if commands(b) == ["make run", "make test"]]
    assert first
    check_make_run(tmp_path)
    check_make_test(tmp_path)


def test_wordcount_commands(tmp_path):
    (block,) = [b for b in blocks("sh") if commands(b)[0] == WORDCOUNT[0]]
    assert [c for c in commands(block) if c not in ELSEWHERE] == list(WORDCOUNT)
    check_wordcount_commands(tmp_path)


@pytest.mark.skipif(shutil.which("curl") is None, reason="the README's scrape uses curl")
def test_metrics_example_scrapes_a_running_topology(tmp_path):
    (block,) = [b for b in blocks("sh") if commands(b)[0] == METRICS]
    metrics_page = (ROOT / "docs" / "metrics.md").read_text(encoding="utf-8")
    assert block in blocks("sh", metrics_page)          # docs/metrics.md shows the same block
    check_metrics_block(block, tmp_path)


@pytest.mark.zookeeper
@pytest.mark.skipif(shutil.which("curl") is None or shutil.which("openssl") is None,
                    reason="the worked example uses curl and openssl")
def test_security_example_protects_the_tree_and_serves_metrics_over_https(tmp_path, zookeeper):
    """docs/security.md's worked example against the tests' ZooKeeper (its URL and a free
    port swapped in): HTTPS scrape, no plain HTTP, status with and without credentials,
    and a stranger gets NoAuth on the tree the run made."""
    from kazoo.exceptions import NoAuthError

    page = (ROOT / "docs" / "security.md").read_text(encoding="utf-8")
    (block,) = [b for b in blocks("sh", page) if commands(b)[0] == SECURITY]
    zookeeper.start()
    url = zookeeper.url(f"/topo-doc-{os.getpid()}")
    script = block.replace("zookeeper://127.0.0.1:2181/topo", url).replace("9464", str(_free_port()))
    proc = _sh(script, _workdir(tmp_path), timeout=90)
    assert proc.returncode == 0, proc.stderr
    base = url.split(zookeeper.hosts, 1)[1]
    assert proc.stdout.splitlines() == [
        "4", "plain HTTP: no answer", f"topology 'slow_stage' (ZooKeeper {zookeeper.hosts}{base}, 4 tasks)"], proc.stdout
    assert proc.stderr.splitlines() == [
        f"topo status: {base}/slow_stage/taskstate on {zookeeper.hosts} is readable only with its credentials: "
        "none given; set TOPO_ZK_AUTH=SCHEME:CREDENTIALS or --auth-file PATH"], proc.stderr
    secret = (tmp_path / "zk.auth").read_text().strip()
    assert secret.startswith("digest:alice:") and secret.split(":", 2)[2] not in proc.stdout + proc.stderr
    stranger = zookeeper.client()
    try:
        with pytest.raises(NoAuthError):
            stranger.create(f"{base}/slow_stage/taskmessage/x", b"")
    finally:
        stranger.stop()
        stranger.close()
