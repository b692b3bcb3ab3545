"""Who may steer a topology (issue 17): credentials, creator-only ACLs, mixed setups,
TLS, tampering a run can notice, and no secret in any output.

Everything that involves ZooKeeper runs against a real one (``zk_server``): a stranger
is a second kazoo client without credentials or with other credentials, and each test
asserts what that stranger gets back from ZooKeeper itself.
"""
from __future__ import annotations

import asyncio
import logging
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any, Iterator

import pytest
from kazoo.exceptions import NoAuthError

from backpressure.coordinator.access import ZkAuth, load_auth, parse_auth
from backpressure.coordinator.base import CredentialsError, NotAuthorized, StoreUnavailable
from backpressure.coordinator.zookeeper import ZooKeeperCoordinator, secure
from backpressure.drivers.stepwise import StepwiseFlowControl
from backpressure.policy.stepwise import StepwiseParams
from backpressure.signals import BACKPRESSURE, Signal, TaskState
from coord_backends import until
from test_stepwise_flow import HIGH, PARAMS, FakeTask
from topo.status import status_command
from zk_server import ZooKeeperServer, zookeeper, zookeeper_tls  # noqa: F401

pytestmark = pytest.mark.timeout(120)

REPO = Path(__file__).resolve().parent.parent


def alice() -> ZkAuth:
    return parse_auth(f"digest:alice:{secrets.token_urlsafe(12)}", "test")


def root() -> str:
    return f"/topo-acl-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def zk(zookeeper: ZooKeeperServer) -> Iterator[ZooKeeperServer]:  # noqa: F811
    zookeeper.start()
    yield zookeeper


def strangers(zk: ZooKeeperServer) -> list[Any]:
    """A client without credentials and one with other credentials."""
    return [zk.client(), zk.client(("digest", "mallory:" + secrets.token_urlsafe(8)))]


def close(*clients: Any) -> None:
    for c in clients:
        c.stop()
        c.close()


class Seen:
    def __init__(self) -> None:
        self.states: dict[int, TaskState | None] = {}

    def __call__(self, task: int, state: TaskState | None) -> None:
        self.states[task] = state


# -- credentials ----------------------------------------------------------------------------

def test_credentials_come_from_the_environment_or_a_file_and_never_show(tmp_path: Path,
                                                                        caplog: pytest.LogCaptureFixture) -> None:
    secret = secrets.token_urlsafe(12)
    auth = load_auth(None, {"TOPO_ZK_AUTH": f"digest:alice:{secret}"})
    assert auth is not None and auth.auth_data() == [("digest", f"alice:{secret}")]
    assert secret not in repr(auth) and secret not in str(auth) and secret not in repr([auth])
    assert repr(auth) == "ZkAuth(digest:alice:***, from TOPO_ZK_AUTH)"
    assert load_auth(None, {}) is None

    f = tmp_path / "zk.auth"
    f.write_text(f"digest:bob:{secret}\n")
    os.chmod(f, 0o600)
    with caplog.at_level(logging.WARNING):
        assert load_auth(f, {}).user == "bob"  # type: ignore[union-attr]
    assert not caplog.records
    assert load_auth(f, {"TOPO_ZK_AUTH": "digest:carol:x"}).user == "carol"  # type: ignore[union-attr]

    os.chmod(f, 0o644)                  # readable by others: one warning line, as ssh does
    with caplog.at_level(logging.WARNING):
        load_auth(f, {})
    assert [r.getMessage() for r in caplog.records] == [
        f"zookeeper.auth_file {f}: readable by other users (mode 644); chmod 600 it"]

    for bad in (f"digest{secret}", f"digest:{secret}", f"digest:alice:{secret}\nsecond line", ":x"):
        with pytest.raises(CredentialsError) as info:
            load_auth(None, {"TOPO_ZK_AUTH": bad})
        assert secret not in str(info.value) and "(the value is not shown)" in str(info.value)
    with pytest.raises(CredentialsError) as info:
        load_auth(tmp_path / "missing", {})
    assert str(info.value) == f"zookeeper.auth_file {tmp_path / 'missing'}: cannot read it: No such file or directory"


def test_credentials_are_not_a_yaml_value_but_the_files_name_is(tmp_path: Path) -> None:
    from topo.config import ConfigError, coerce, parse_override

    assert parse_override(f"zookeeper.auth_file={tmp_path / 'a'}") == ("zookeeper.auth_file", str(tmp_path / "a"))
    with pytest.raises(ConfigError):
        coerce("zookeeper.auth", "digest:a:b")


# -- creator-only ACLs ----------------------------------------------------------------------

@pytest.mark.zookeeper
async def test_a_stranger_cannot_signal_overwrite_delete_or_read_and_rates_are_unchanged(zk: ZooKeeperServer) -> None:
    url, auth = zk.url(root()), alice()
    spout, bolt = FakeTask(1, "spout", rate=8_000.0), FakeTask(2, "bolt", [1])
    params = StepwiseParams(high_mark=PARAMS.high_mark, low_mark=PARAMS.low_mark, sensitivity=30.0)
    fc = StepwiseFlowControl(params, ZooKeeperCoordinator(url, "guarded", auth=auth), period=0.02, heartbeat=0.1)
    await fc.start([spout, bolt])
    layout = fc.coordinator.layout
    others = strangers(zk)
    try:
        await until(lambda: others[0].exists(layout.state(1)) is not None, what="task 1's state")
        forged = Signal(BACKPRESSURE, 1, 2, 8, 10**6, 0.0).encode()      # well-formed: obeyed were it let in
        for stranger in others:
            with pytest.raises(NoAuthError):
                stranger.create(layout.message_prefix(1), forged, sequence=True)
            with pytest.raises(NoAuthError):
                stranger.set(layout.state(1), TaskState(task=1, k=8, version=(9, 9)).encode())
            with pytest.raises(NoAuthError):
                stranger.delete(layout.state(1))
            with pytest.raises(NoAuthError):
                stranger.delete(layout.base, recursive=True)
            with pytest.raises(NoAuthError):
                stranger.delete(layout.messages)
            with pytest.raises(NoAuthError):
                stranger.get_children(layout.states)       # reading is closed unless zookeeper.read_open
            with pytest.raises(NoAuthError):
                stranger.get(layout.state(1))
        await asyncio.sleep(0.5)
        assert spout.limit is None and fc.coordinator.counters["consumed"] == 0   # rates unchanged
        bolt.q = HIGH                                   # the run's own signals still travel
        fc.poll(bolt)
        await until(lambda: spout.limit == 4_000.0, what="the run's own signal")
        superuser = zk.client(zk.super_auth)              # ZooKeeper's super user keeps every right
        try:
            assert superuser.get_children(layout.states)
        finally:
            close(superuser)
    finally:
        close(*others)
        await fc.stop()


@pytest.mark.zookeeper
async def test_read_open_lets_anyone_read_but_writing_stays_creator_only(zk: ZooKeeperServer) -> None:
    c = ZooKeeperCoordinator(zk.url(root()), "readable", auth=alice(), read_open=True)
    await c.start([1], Seen())
    c.publish(TaskState(task=1, k=2, version=(1, 1)))
    stranger = zk.client()
    try:
        await until(lambda: stranger.exists(c.layout.state(1)) is not None, what="task 1's state")
        data, _ = stranger.get(c.layout.state(1))
        assert TaskState.decode(data).k == 2
        with pytest.raises(NoAuthError):
            stranger.set(c.layout.state(1), b"")
        with pytest.raises(NoAuthError):
            stranger.create(c.layout.message_prefix(1), b"x", sequence=True)
    finally:
        close(stranger)
        await c.stop()


# -- mixed setups ---------------------------------------------------------------------------

@pytest.mark.zookeeper
async def test_an_open_tree_from_an_older_run_is_refused_in_one_line_and_zk_secure_fixes_it(zk: ZooKeeperServer) -> None:
    url, auth = zk.url(root()), alice()
    old = ZooKeeperCoordinator(url, "legacy")                     # no credentials: ZooKeeper's open ACL
    await old.start([1], Seen())
    await old.stop()
    c = ZooKeeperCoordinator(url, "legacy", auth=auth)
    with pytest.raises(NotAuthorized) as info:
        await c.start([1], Seen())
    base = c.layout.base
    assert str(info.value) == (
        f"topology 'legacy': {base} on {zk.hosts} has an open ACL (anyone who reaches ZooKeeper may write or "
        "delete it; an older run without credentials?); refusing to run on it: fix it with "
        f"`topo zk secure {url} legacy` (with these credentials, or as ZooKeeper's super user), or delete the tree")
    assert not c.store.client.connected                    # type: ignore[attr-defined]
    loop = asyncio.get_running_loop()
    stranger = zk.client(("digest", "mallory:x"))
    try:        # once secured, only these credentials (or the super user) may change the ACL again
        assert await loop.run_in_executor(None, secure, url, "legacy", auth) == 4
        with pytest.raises(NotAuthorized):
            await loop.run_in_executor(None, secure, url, "legacy", parse_auth("digest:mallory:x", "t"))
    finally:
        close(stranger)
    c = ZooKeeperCoordinator(url, "legacy", auth=auth)
    await c.start([1], Seen())
    await c.stop()
    stranger = zk.client()
    try:
        with pytest.raises(NoAuthError):
            stranger.create(c.layout.message_prefix(1), b"x", sequence=True)
    finally:
        close(stranger)


@pytest.mark.zookeeper
async def test_a_wrong_password_or_no_credentials_on_a_protected_tree_is_one_line(zk: ZooKeeperServer) -> None:
    url, auth = zk.url(root()), alice()
    first = ZooKeeperCoordinator(url, "mine", auth=auth)
    await first.start([1], Seen())
    await first.stop()
    wrong = parse_auth("digest:alice:not-the-password", "TOPO_ZK_AUTH")
    c = ZooKeeperCoordinator(url, "mine", auth=wrong)
    started = time.monotonic()
    with pytest.raises(NotAuthorized) as info:
        await c.start([1], Seen())
    assert time.monotonic() - started < 3                  # no retry storm
    assert str(info.value) == (
        f"topology 'mine': {first.layout.base} on {zk.hosts} is protected for other credentials than "
        "ZkAuth(digest:alice:***, from TOPO_ZK_AUTH) (a wrong password?); refusing to run on it: check TOPO_ZK_AUTH / zookeeper.auth_file")
    nobody = ZooKeeperCoordinator(url, "mine")
    with pytest.raises(NotAuthorized) as info:
        await nobody.start([1], Seen())
    assert str(info.value) == (
        f"ZooKeeper refused access to {first.layout.messages} (NoAuth): it is protected; "
        "set TOPO_ZK_AUTH or zookeeper.auth_file to its credentials (SCHEME:CREDENTIALS)")


def _topo() -> list[str]:
    exe = REPO / ".venv" / "bin" / "topo"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "topo.cli"]


@pytest.mark.zookeeper
def test_topo_run_with_a_wrong_password_is_one_line_exit_1(zk: ZooKeeperServer, tmp_path: Path) -> None:
    url = zk.url(root())
    secret = secrets.token_urlsafe(12)
    owner = zk.client(("digest", f"alice:{secret}"))
    try:
        owner.create(url.split(zk.hosts, 1)[1] + "/wordcount/taskmessage", makepath=True,
                     acl=parse_auth(f"digest:alice:{secret}", "t").acl())
    finally:
        close(owner)
    wrong = secrets.token_urlsafe(12)
    env = dict(os.environ, TOPO_ZK_AUTH=f"digest:alice:{wrong}")
    started = time.monotonic()
    r = subprocess.run([*_topo(), "run", str(REPO / "configs" / "wordcount.yaml"), "--quiet", "--zk", url,
                        "--max-tuples", "100"], cwd=tmp_path, capture_output=True, text=True, timeout=60, env=env)
    assert time.monotonic() - started < 30
    assert (r.returncode, r.stdout) == (1, "")
    assert r.stderr.count("\n") == 1, r.stderr
    assert "is protected for other credentials than ZkAuth(digest:alice:***, from TOPO_ZK_AUTH) (a wrong password?)" in r.stderr
    assert wrong not in r.stderr and secret not in r.stderr


@pytest.mark.zookeeper
def test_topo_zk_secure_and_auth_file_on_the_command_line(zk: ZooKeeperServer, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from topo.cli import main

    url = zk.url(root())
    open_client = zk.client()
    try:
        open_client.create(url.split(zk.hosts, 1)[1] + "/wordcount/taskstate", makepath=True)
    finally:
        close(open_client)
    monkeypatch.delenv("TOPO_ZK_AUTH", raising=False)
    assert main(["zk", "secure", url, "wordcount"]) == 1
    assert capsys.readouterr().err == ("topo zk: no credentials: set TOPO_ZK_AUTH=SCHEME:CREDENTIALS "
                                       "or give --auth-file PATH\n")
    secret = secrets.token_urlsafe(12)
    f = tmp_path / "zk.auth"
    f.write_text(f"digest:alice:{secret}\n")
    os.chmod(f, 0o600)
    assert main(["zk", "secure", url, "wordcount", "--auth-file", str(f)]) == 0
    out = capsys.readouterr()
    assert out.out == f"topology 'wordcount': 2 znodes under {url} now creator-only for 'alice'\n"
    assert secret not in out.out + out.err
    stranger = zk.client()
    try:
        with pytest.raises(NoAuthError):
            stranger.create(url.split(zk.hosts, 1)[1] + "/wordcount/taskstate/1", b"")
    finally:
        close(stranger)
    # topo run takes the file like any key; a missing one is one line, exit 1, before anything starts
    assert main(["run", str(REPO / "configs" / "wordcount.yaml"), "--quiet", "--zk", url,
                 "--config", f"zookeeper.auth_file={tmp_path / 'nope'}"]) == 1
    assert capsys.readouterr().err == (f"topo run: zookeeper.auth_file {tmp_path / 'nope'}: cannot read it: "
                                       "No such file or directory\n")


def test_kazoo_log_lines_never_carry_a_known_credential(caplog: pytest.LogCaptureFixture) -> None:
    from backpressure.coordinator.zookeeper import kazoo_log

    auth = alice()
    kazoo_log.setLevel(logging.DEBUG)
    try:
        with caplog.at_level(logging.DEBUG, logger=kazoo_log.name):
            kazoo_log.debug("Sending request: Auth(scheme=%r, auth=%r)", "digest", auth.credential)
    finally:
        kazoo_log.setLevel(logging.CRITICAL)
    assert caplog.records and auth.credential not in caplog.text and "auth='***'" in caplog.text


# -- topo status ------------------------------------------------------------------------------

@pytest.mark.zookeeper
async def test_status_reads_protected_states_with_the_credentials_and_is_one_line_without(
        zk: ZooKeeperServer, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    import argparse

    url, auth = zk.url(root()), alice()
    c = ZooKeeperCoordinator(url, "guarded", auth=auth)
    await c.start([1], Seen())
    c.publish(TaskState(task=1, k=3, version=(1, 1)))
    await c.flush(5)
    loop = asyncio.get_running_loop()

    def status(*words: str) -> int:
        return status_command(argparse.Namespace(rest=list(words)))

    try:
        monkeypatch.delenv("TOPO_ZK_AUTH", raising=False)
        assert await loop.run_in_executor(None, status, "--zk", url, "--name", "guarded") == 1
        captured = capsys.readouterr()
        assert captured.err == (f"topo status: {c.layout.states} on {zk.hosts} is readable only with its "
                                "credentials: none given; set TOPO_ZK_AUTH=SCHEME:CREDENTIALS or --auth-file PATH\n")
        f = tmp_path / "auth"
        f.write_text(f"digest:{auth.credential}\n")
        os.chmod(f, 0o600)
        assert await loop.run_in_executor(None, status, "--zk", url, "--name", "guarded", "--auth-file", str(f)) == 0
        out = capsys.readouterr()
        assert out.out.splitlines()[0].startswith("topology 'guarded' (ZooKeeper")
        assert auth.credential not in out.out + out.err
        monkeypatch.setenv("TOPO_ZK_AUTH", "digest:alice:wrong")
        assert await loop.run_in_executor(None, status, "--zk", url, "--name", "guarded") == 1
        assert capsys.readouterr().err == (
            f"topo status: {c.layout.states} on {zk.hosts} is readable only with its credentials: "
            "ZkAuth(digest:alice:***, from TOPO_ZK_AUTH) are not they\n")
    finally:
        await c.stop()


# -- tampering a run without credentials can notice ---------------------------------------

@pytest.mark.zookeeper
async def test_an_open_run_says_when_its_tree_is_deleted_or_its_state_overwritten(
        zk: ZooKeeperServer, caplog: pytest.LogCaptureFixture) -> None:
    a, b = ZooKeeperCoordinator(zk.url(root()), "open"), None
    await a.start([1], Seen())
    a.publish(TaskState(task=1, k=1, version=(1, 1)))
    await a.flush(5)
    stranger = zk.client()
    try:
        await until(lambda: 1 in a._written, what="state written")
        with caplog.at_level(logging.ERROR, logger="backpressure.coordinator.base"):
            stranger.set(a.layout.state(1), TaskState(task=1, k=7, version=(9, 9)).encode())
            await until(lambda: a.counters["tampered"] >= 1, what="overwrite noticed")
            await until(lambda: TaskState.decode(stranger.get(a.layout.state(1))[0]).k == 1, what="state restored")
            stranger.delete(a.layout.messages, recursive=True)
            a.send(Signal(BACKPRESSURE, 1, 2, 1, 1, 0.0))
            got = await asyncio.wait_for(a.trigger_queue.get(), 10)    # the tree is made again: signals go on
            assert got.target == 1
        said = [r.getMessage() for r in caplog.records]
        assert (f"topology 'open': the state of its task 1 was overwritten under {a.layout.base} by another client "
                "while this run was using it; protect the tree with credentials (TOPO_ZK_AUTH or "
                "zookeeper.auth_file)") in said
        assert any("its znodes were deleted under" in s for s in said)
    finally:
        close(stranger)
        caplog.clear()
        with caplog.at_level(logging.ERROR, logger="backpressure.coordinator.base"):
            await a.stop()
        assert any("were changed by another client" in r.getMessage() for r in caplog.records)
    del b


# -- TLS ----------------------------------------------------------------------------------------

@pytest.mark.zookeeper
async def test_tls_with_the_right_ca_and_client_certificate_carries_signals(zookeeper_tls: ZooKeeperServer) -> None:  # noqa: F811
    from backpressure.coordinator.access import Tls

    zk = zookeeper_tls
    tls = Tls(str(zk.certs["ca"]), str(zk.certs["cert"]), str(zk.certs["key"]))
    c = ZooKeeperCoordinator(zk.tls_url(root()), "tls", auth=alice(), tls=tls)
    await c.start([1], Seen())
    try:
        c.send(Signal(BACKPRESSURE, 1, 2, 1, 1, 0.0))
        assert (await asyncio.wait_for(c.trigger_queue.get(), 10)).target == 1
    finally:
        await c.stop()


@pytest.mark.zookeeper
async def test_tls_with_a_wrong_ca_is_one_line(zookeeper_tls: ZooKeeperServer) -> None:  # noqa: F811
    from backpressure.coordinator.access import Tls

    zk = zookeeper_tls
    tls = Tls(str(zk.certs["other_ca"]), str(zk.certs["cert"]), str(zk.certs["key"]))
    c = ZooKeeperCoordinator(zk.tls_url("/t"), "tls", connect_timeout=1.0, tls=tls)
    with pytest.raises(StoreUnavailable) as info:
        await c.start([1], Seen())
    assert str(info.value) == (
        f"TLS handshake with 127.0.0.1:{zk.tls_port} failed: unable to get local issuer certificate "
        "(is zookeeper.tls.ca the CA that signed the server's certificate?)")


@pytest.mark.zookeeper
def test_topo_run_with_a_wrong_ca_is_one_line_exit_1(zookeeper_tls: ZooKeeperServer, tmp_path: Path,  # noqa: F811
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    from topo.cli import main

    zk = zookeeper_tls
    url = zk.tls_url("/t")
    certs = [f"zookeeper.tls.{k}={zk.certs[v]}" for k, v in (("ca", "other_ca"), ("cert", "cert"), ("key", "key"))]
    assert main(["run", str(REPO / "configs" / "wordcount.yaml"), "--quiet", "--zk", url,
                 *(w for c in certs for w in ("--config", c)), "--config", "zookeeper.connect_timeout_s=1"]) == 1
    assert capsys.readouterr().err == (
        f"--zk: TLS handshake with 127.0.0.1:{zk.tls_port} failed: unable to get local issuer certificate "
        f"(is zookeeper.tls.ca the CA that signed the server's certificate?) (got '{url}')\n")


# -- no secret in any output -------------------------------------------------------------------

@pytest.mark.zookeeper
def test_no_output_of_a_run_or_of_status_contains_the_secret(zk: ZooKeeperServer, tmp_path: Path) -> None:
    """The run takes the secret from a key file, ``topo status`` from TOPO_ZK_AUTH and the
    file; every output is searched: the run's console (not --quiet, not a terminal) and
    --debug log lines, a metrics scrape, the status file, ``topo status`` in all its forms."""
    secret = "s3cret-" + secrets.token_urlsafe(16)
    url = zk.url(root())
    key_file = tmp_path / "zk.auth"
    key_file.write_text(f"digest:alice:{secret}\n")
    os.chmod(key_file, 0o600)
    plain = {k: v for k, v in os.environ.items() if k != "TOPO_ZK_AUTH"}
    env = dict(plain, TOPO_ZK_AUTH=f"digest:alice:{secret}")
    status_path = tmp_path / "status.json"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        metrics_port = s.getsockname()[1]
    run = subprocess.Popen([*_topo(), "--debug", "run", str(REPO / "configs" / "slow_stage.yaml"), "--zk", url,
                            "--duration", "60", "--config", f"status.path={status_path}",
                            "--config", f"zookeeper.auth_file={key_file}", "--metrics-port", str(metrics_port)],
                           cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=plain)
    outputs: list[str] = []
    try:
        client = zk.client(("digest", f"alice:{secret}"))
        try:
            deadline = time.monotonic() + 30
            base = url.split(zk.hosts, 1)[1] + "/slow_stage"
            while not (client.exists(base + "/taskstate/1") and status_path.exists()):
                assert time.monotonic() < deadline and run.poll() is None, "the run did not start"
                time.sleep(0.1)
            first = status_path.stat().st_mtime_ns
            while status_path.stat().st_mtime_ns == first:     # written again: the run handles SIGTERM now
                assert time.monotonic() < deadline and run.poll() is None, "the run stopped"
                time.sleep(0.1)
        finally:
            close(client)
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as r:
            scraped = r.read().decode()
        assert 'topology="slow_stage"' in scraped          # labels and values: the scrape is a real one
        outputs.append(scraped)
        for words in (["--zk", url, "--name", "slow_stage"], ["--zk", url, "--name", "slow_stage", "--json"],
                      ["--file", str(status_path)]):
            r = subprocess.run([*_topo(), "--debug", "status", *words], capture_output=True, text=True,
                               timeout=60, env=env)
            assert r.returncode == 0, r.stderr
            outputs += [r.stdout, r.stderr]
        r = subprocess.run([*_topo(), "status", "--zk", url, "--name", "slow_stage", "--auth-file", str(key_file)],
                           capture_output=True, text=True, timeout=60, env=plain)
        assert r.returncode == 0, r.stderr
        outputs += [r.stdout, r.stderr]
        bad = subprocess.run([*_topo(), "status", "--zk", url, "--name", "slow_stage"], capture_output=True,
                             text=True, timeout=60, env=dict(env, TOPO_ZK_AUTH=f"digest{secret}"))
        assert bad.returncode == 1 and bad.stderr.count("\n") == 1
        outputs += [bad.stdout, bad.stderr]
    finally:
        run.send_signal(signal.SIGTERM)
        out, err = run.communicate(timeout=60)
        outputs += [out, err]
    outputs.append(status_path.read_text())
    assert run.returncode == 0, err[-2000:]
    assert "spout tuples" in out and "slow_stage" in out and "topo.task" in err   # console and log lines were there
    for text in outputs:
        assert secret not in text
