"""``topo status``: one row per task of a running topology, and the file that feeds it.

Two sources, the same columns (component, task, rate, originv, k, backpressure
flag, queue bytes, marks):

* ZooKeeper: the ``taskstate/<task_id>`` znodes every task publishes under
  ``/<root>/<topology>/`` (the coordinator's ``ZnodeLayout``; ``--zk
  zookeeper://host:port/root`` and the topology's name, or a topology.yaml whose
  config says ``coordinator: zookeeper://...``).
  Read with a short-lived kazoo client: this is a command, not the event loop.
* A status file: a run with the embedded coordinator has no shared store, so the
  ``StatusWriter`` service writes the run's task states to ``status.path`` every
  second (atomically: write, then rename); ``--file PATH`` or a topology.yaml whose
  ``status.path`` is set reads it. When ``status.path`` is null, ``topo run`` writes
  to the default place, ``$XDG_STATE_HOME/topo/status/<topology>.json`` (XDG_STATE_HOME
  defaults to ``~/.local/state``), and ``topo status`` with no argument shows the
  run that started last there.
  A run in worker processes writes one file for all of them (the supervisor writes
  it from the workers' reports): every task of every worker, each row with its
  ``worker``, shown in a column of its own.

Usage::

    topo status                               # the last local run
    topo status topology.yaml                 # uses its coordinator / status.path
    topo status --zk zookeeper://127.0.0.1:2181/topo --name wordcount
    topo status --file /tmp/wordcount.status.json [--json]

A topology whose znodes are protected (``zookeeper.auth_file`` or ``TOPO_ZK_AUTH``)
is read with the same credentials: the environment, ``--auth-file PATH`` or the
topology.yaml's setting; without them ZooKeeper's NoAuth is one line, exit 1.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Sequence

COLUMNS = ("component", "task", "rate", "originv", "k", "flag", "queue", "low/high mark")
STALE_S = 5.0
MAX_FILE_BYTES = 16 * 1024 * 1024


class StatusError(Exception):
    """Nothing to show (no such topology, no file): the message says why."""


def default_status_dir() -> Path:
    """Where local runs write their status when ``status.path`` is null."""
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(state) / "topo" / "status"


def default_status_path(topology: str) -> Path:
    return default_status_dir() / f"{topology}.json"


def last_run() -> Path:
    """The status file in the default place of the run that started last."""
    where = default_status_dir()
    newest: tuple[float, Path] | None = None
    for p in where.glob("*.json") if where.is_dir() else ():
        try:
            with p.open("rb") as f:
                started = float(json.loads(f.read(MAX_FILE_BYTES)).get("started", 0))
        except (OSError, ValueError, TypeError, AttributeError):
            continue
        if newest is None or started > newest[0]:
            newest = (started, p)
    if newest is None:
        raise StatusError(f"no local run has written its status under {where}; "
                          "give a topology.yaml, --file PATH or --zk URL --name NAME")
    return newest[1]


# -- the run side: write the task states every second ---------------------------------------

class StatusWriter:
    """An engine service that writes every task's state to ``path`` once per ``interval``."""

    def __init__(self, path: str | os.PathLike[str], interval: float = 1.0, *, best_effort: bool = False) -> None:
        self.path = Path(path)
        self.interval = interval
        self.best_effort = best_effort   # the default place: a run goes on without it
        self.started = time.time()
        self._task: asyncio.Task[None] | None = None
        self._engine: Any = None

    async def start(self, engine: Any) -> None:
        self._engine = engine
        try:
            self.write()
        except OSError:
            if not self.best_effort:
                raise
            self._engine = None     # cannot write the default place: no status file this run
            return
        self._task = asyncio.create_task(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        if self._engine is not None:
            try:
                self.write(running=False)
            except OSError:
                if not self.best_effort:
                    raise

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                self.write()
            except OSError:
                if not self.best_effort:
                    raise

    def document(self, running: bool = True) -> dict[str, Any]:
        engine = self._engine
        # The same records the live console reads: TaskStats.snapshot().
        tasks = [s.snapshot() for s in engine.stats]
        return {"topology": engine.topology.name, "coordinator": engine.config.get("coordinator"),
                "running": running, "started": self.started, "written": time.time(), "pid": os.getpid(),
                "tasks": tasks}

    def write(self, running: bool = True) -> None:
        doc = self.document(running)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(doc, indent=1))
        os.replace(tmp, self.path)


# -- the command side ---------------------------------------------------------------------------

def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="topo status", description="show the task states of a running topology; "
                                "with no argument, of the last local run")
    p.add_argument("topology", nargs="?", help="topology.yaml (its name, coordinator and status.path)")
    p.add_argument("--zk", metavar="URL", help="read taskstate from ZooKeeper: zookeeper://host:port/root")
    p.add_argument("--name", help="topology name (with --zk, or alone for a local run's default status file)")
    p.add_argument("--file", metavar="PATH", help="read the status file a run writes (status.path)")
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    p.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for ZooKeeper")
    p.add_argument("--auth-file", metavar="PATH", help="ZooKeeper credentials, one line SCHEME:CREDENTIALS "
                   "(TOPO_ZK_AUTH wins; default: the topology.yaml's zookeeper.auth_file)")
    p.add_argument("--tls-ca", metavar="PATH", help="connect to ZooKeeper with TLS, trusting this CA (PEM)")
    p.add_argument("--tls-cert", metavar="PATH", help="client certificate (PEM) for TLS, with --tls-key")
    p.add_argument("--tls-key", metavar="PATH", help="private key (PEM) of --tls-cert")
    return p


def status_command(args: argparse.Namespace) -> int:
    """Entry point for ``topo status``; ``args.rest`` holds the words after ``status``
    (or the namespace already carries this module's options). Returns the exit status."""
    rest = getattr(args, "rest", None)
    ns = parser().parse_args(rest) if rest is not None else args
    try:
        title, rows = collect(ns)
    except StatusError as e:
        print(f"topo status: {e}", file=sys.stderr)
        return 1
    if getattr(ns, "json", False):
        print(json.dumps(rows, indent=1))
    else:
        print(title)
        print(render(rows))
    return 0


def collect(ns: argparse.Namespace) -> tuple[str, list[dict[str, Any]]]:
    """Find the source the options point at and read its rows."""
    zk, name, path = getattr(ns, "zk", None), getattr(ns, "name", None), getattr(ns, "file", None)
    access: dict[str, Any] = {"zookeeper.auth_file": getattr(ns, "auth_file", None)}
    access.update({f"zookeeper.tls.{k}": getattr(ns, f"tls_{k}", None) for k in ("ca", "cert", "key")})
    if getattr(ns, "topology", None):
        from topo.spec import load_spec

        spec = load_spec(ns.topology)
        config = spec.resolve_config({})
        name = name or spec.topology.name
        access = {k: v if v is not None else config.get(k) for k, v in access.items()}
        if not zk and not path:
            coordinator = str(config.get("coordinator", "embedded"))
            if coordinator.startswith("zookeeper://"):
                zk = coordinator
            else:
                path = config.get("status.path") or default_status_path(name)
    if path:
        return read_file(path)
    if zk:
        if not name:
            raise StatusError("--zk needs the topology's name (--name NAME or a topology.yaml)")
        from backpressure.coordinator.base import CredentialsError

        try:
            from backpressure.coordinator.access import Tls, auth_from_config

            auth, tls = auth_from_config(access), Tls.from_config(access)
        except CredentialsError as e:
            raise StatusError(str(e)) from None
        return read_zookeeper(zk, name, float(getattr(ns, "timeout", 5.0)), auth, tls)
    return read_file(default_status_path(name) if name else last_run())


def read_file(path: str | os.PathLike[str]) -> tuple[str, list[dict[str, Any]]]:
    p = Path(path)
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        raise StatusError(f"{p}: no status file (is the topology running with status.path set?)") from None
    if len(raw) > MAX_FILE_BYTES:
        raise StatusError(f"{p}: status file too large ({len(raw)} bytes)")
    try:
        doc = json.loads(raw)
        rows = list(doc["tasks"])
    except (ValueError, KeyError, TypeError) as e:
        raise StatusError(f"{p}: not a status file ({e})") from None
    age = time.time() - float(doc.get("written", 0))
    state = "running" if doc.get("running", True) else "stopped"
    workers = len({r.get("worker") for r in rows if isinstance(r, dict) and r.get("worker") is not None})
    title = (f"topology {doc.get('topology')!r} ({state}, " + (f"{workers} worker processes, " if workers else "")
             + f"embedded coordinator, status file {p}, {age:.1f}s old)")
    if state == "running" and age > STALE_S:
        title += f"  WARNING: not updated for {age:.0f}s: the run may have died"
    return title, rows


def read_zookeeper(url: str, name: str, timeout: float = 5.0, auth: Any = None,
                   tls: Any = None) -> tuple[str, list[dict[str, Any]]]:
    """The rows of ``taskstate/`` under ``url`` for topology ``name``, read with ``auth``
    (``access.ZkAuth``) and ``tls`` (``access.Tls``) when given."""
    from kazoo.exceptions import NoAuthError, NoNodeError

    from backpressure.coordinator.base import NotAuthorized, StoreUnavailable, ZnodeLayout
    from backpressure.coordinator.zookeeper import connect, parse_zookeeper_url
    from backpressure.signals import SignalError, TaskState

    hosts, root = parse_zookeeper_url(url)
    missing = StatusError(f"no topology {name!r} under {root} on {hosts}")
    try:
        layout = ZnodeLayout(name, root)
    except ValueError:      # a name no topology can have
        raise missing from None
    try:
        client = connect(url, timeout, auth, tls)
    except (StoreUnavailable, NotAuthorized) as e:
        raise StatusError(str(e)) from None
    try:
        try:
            children = client.get_children(layout.states)
        except NoNodeError:
            raise missing from None
        except NoAuthError:
            raise StatusError(f"{layout.states} on {hosts} is readable only with its credentials: " + (
                f"{auth} are not they" if auth is not None else
                "none given; set TOPO_ZK_AUTH=SCHEME:CREDENTIALS or --auth-file PATH")) from None
        rows = []
        for child in children:
            try:
                data, _ = client.get(layout.state(child))
                rows.append(TaskState.decode(data).row())
            except (NoNodeError, NoAuthError):
                continue
            except SignalError as e:
                print(f"topo status: skipping {layout.state(child)}: {e}", file=sys.stderr)
    finally:
        client.stop()
        client.close()
    if not rows:
        raise StatusError(f"topology {name!r} has no running tasks under {root} on {hosts}")
    return f"topology {name!r} (ZooKeeper {hosts}{root}, {len(rows)} tasks)", rows


def render(rows: Sequence[dict[str, Any]]) -> str:
    """The table: one line per task, sorted by task id."""
    with_workers = any(r.get("worker") is not None for r in rows)     # a run in worker processes
    table: list[tuple[str, ...]] = [COLUMNS + (("worker",) if with_workers else ())]
    for r in sorted(rows, key=lambda r: r.get("task", 0)):
        table.append((str(r.get("component", "")), str(r.get("task", "")), _rate(r.get("rate"), "off"),
                      _rate(r.get("originv")), str(r.get("k", 0)), "BP" if r.get("backpressure") else "-",
                      _bytes(r.get("queue_bytes", 0)),
                      f"{_bytes(r.get('low_mark', 0))} / {_bytes(r.get('high_mark', 0))}")
                     + ((str(r.get("worker", "")),) if with_workers else ()))
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    lines = []
    for row in table:
        cells = [c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def _rate(v: Any, none: str = "-") -> str:
    return none if v is None else f"{float(v):,.1f}/s"


def _bytes(n: Any) -> str:
    n = float(n or 0)
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"
