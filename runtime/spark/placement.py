"""Where a topology's files are when Spark's executors are not the driver's threads.

In ``local[*]`` the executors are threads of the driver's JVM and their Python workers
its children: same machine, same working directory. On a cluster they are processes a
worker started, with the worker's working directory, maybe on another machine. Three
cases, by the master URL:

* ``local``/``local[N]``: nothing changes.
* **a cluster on this machine**: a standalone master on a loopback address
  (``spark://127.0.0.1:7077``, ``spark://localhost:7077``) can only have workers on this
  machine (they connect to it over loopback). Every path is shared; the executors'
  Python workers enter the directory ``topo run`` was started from (``workdir``), so a
  relative path means what it means on ``local[*]``.
* **any other master** (a standalone master on a routable address, ``yarn``,
  ``k8s://``): executors may run on other machines. They connect back to the driver, so
  a driver listening on loopback (``SPARK_LOCAL_IP`` unset or 127.0.0.1) is refused; and
  what they would read or write as a local file is refused at start, in one line naming
  the component or setting (``check``): a file-backed message log unless it lies under ``spark.shared_dir`` (a
  directory every machine mounts at the same path); a bolt that writes a file (a
  ``SQLiteSink``: SQLite over a network mount is not safe, and the file would be on
  whichever machine ran the task); stateful bolts without a shared
  ``spark.checkpoint_dir`` (their state store is written by the executors) unless
  ``spark.shared_dir`` gives a place for the default one. The database sink
  (``spark.sink``) and the rate files (``spark.state_dir``) are written by the driver and
  stay local.
"""
from __future__ import annotations

import os
import re
from typing import Any, Mapping
from urllib.parse import urlparse

from topo.sources.log import FileLog
from topo.topology import Topology, TopologyError

_SPARK_HOSTS = re.compile(r"^spark://(?P<hosts>[^/]+)/?$")
_LOOPBACK = ("localhost", "::1", "[::1]")


class PlacementError(TopologyError):
    """What executors on other machines cannot reach. ``component`` (with ``key``, a
    kwargs path) or ``key`` alone (a setting) says where the value came from."""

    def __init__(self, message: str, *, component: str | None = None, key: str) -> None:
        super().__init__(message)
        self.component = component
        self.key = key


def is_local(master: str) -> bool:
    return master == "local" or master.startswith("local[") or master.startswith("local-cluster[")


def on_this_machine(master: str) -> bool:
    """True for ``local`` masters and standalone masters on loopback addresses only."""
    if is_local(master):
        return True
    m = _SPARK_HOSTS.match(master)
    if m is None:
        return False
    hosts = [h.rsplit(":", 1)[0] if not h.startswith("[") else h.split("]")[0] + "]"
             for h in m.group("hosts").split(",")]
    return all(_loopback(h) for h in hosts)


def executor_workdir(master: str) -> str | None:
    """The directory executors' Python workers enter: the driver's, on a cluster on this
    machine; None otherwise (``local``: they already share it; elsewhere: it may not exist)."""
    return os.getcwd() if on_this_machine(master) and not is_local(master) else None


def has_scheme(url: str) -> bool:
    """A location on another file system (hdfs://, s3a://, ...), not a plain path, ``file:``
    or a Windows drive letter."""
    scheme = urlparse(url).scheme
    return len(scheme) > 1 and scheme != "file"


def _under(path: str, shared: str | None) -> bool:
    if not shared or not os.path.isabs(path):
        return False
    return os.path.commonpath([os.path.realpath(path), os.path.realpath(shared)]) == os.path.realpath(shared)


def _loopback(host: str) -> bool:
    return host in _LOOPBACK or host.startswith("127.")


def check(topology: Topology, cfg: Mapping[str, Any], master: str, sources: Mapping[str, Any],
          stateful: list[str], driver_host: str = "127.0.0.1") -> None:
    """Raise ``PlacementError`` for the first thing executors on other machines cannot
    reach (module docstring); ``sources`` are the spouts' sources by component id,
    ``stateful`` the ids of the bolts whose state the executors keep, ``driver_host``
    the address the driver listens on (executors connect back to it)."""
    if on_this_machine(master):
        return
    shared = cfg.get("spark.shared_dir")
    where = f"on {master} executors may run on other machines"
    if _loopback(driver_host):
        raise PlacementError(
            f"the driver listens on {driver_host} (SPARK_LOCAL_IP), and {where}, which connect back to it: "
            "set SPARK_LOCAL_IP to an address of this machine they can reach", key="spark.master")
    if shared and not os.path.isabs(shared):
        raise PlacementError(f"spark.shared_dir must be an absolute path that every machine mounts "
                             f"(got {shared!r})", key="spark.shared_dir")
    for cid, source in sources.items():
        if isinstance(source, FileLog) and not _under(source.root, shared):
            raise PlacementError(
                f"spout {cid!r} reads the file log {source.root!r}, and {where}: put the log on storage "
                "every machine mounts at the same path and name that directory in spark.shared_dir, "
                "or use a redis:// log", component=cid, key="kwargs.log")
    for c in topology.components.values():
        for arg, path in c.writes_to.items():
            raise PlacementError(
                f"bolt {c.id!r} writes the file {path} from Spark's executors, and {where}: send the "
                "results through spark.sink instead (sqlite:PATH is written by the driver, or postgresql://...)",
                component=c.id, key=f"kwargs.{arg}")
    checkpoint = cfg.get("spark.checkpoint_dir")
    if stateful and checkpoint and not (has_scheme(checkpoint) or _under(checkpoint, shared)):
        raise PlacementError(
            f"spark.checkpoint_dir {checkpoint} is a local path, and {where}, which write the state of "
            f"{', '.join(stateful)} there: use hdfs://, s3a://... or a directory under spark.shared_dir",
            key="spark.checkpoint_dir")
    if stateful and not checkpoint and not shared:
        raise PlacementError(
            f"bolts {', '.join(stateful)} keep state, which the executors write to the checkpoint, and "
            f"{where}: set spark.checkpoint_dir (hdfs://, s3a://...) or spark.shared_dir",
            key="spark.checkpoint_dir")
