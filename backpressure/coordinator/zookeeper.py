"""The ZooKeeper coordinator: the document's message queue on a real ZooKeeper.

``KazooStore`` adapts kazoo to the ``Store`` the coordinator is written against.
Every call uses kazoo's ``*_async`` API: kazoo's own threads do the socket work
and complete an asyncio future through ``call_soon_threadsafe``, so no ZooKeeper
round trip ever blocks the event loop (``start`` and ``close``, which kazoo only
offers blocking, run in the default executor). Watch callbacks and connection
state changes are forwarded to the loop the same way.

kazoo queues requests while it reconnects and fails them with ``ConnectionLoss``
or ``SessionExpiredError`` when the connection or the session goes; those become
``StoreUnavailable`` and the coordinator retries once the session is back. It
retries connecting forever (``connection_retry`` without a try limit), so a
ZooKeeper restart mid-run only pauses signals; tuples keep flowing at the rates
last set, which live in the engine's limiters, not in ZooKeeper.

kazoo logs every failed connection attempt; those lines go to a logger of ours
(``backpressure.coordinator.zookeeper.kazoo``) that is quiet unless a user turns it
up (``topo --debug`` does). The store logs one line per change of the connection
instead. ``probe`` answers "is anyone there?" within a timeout, for ``topo run``'s
checks before a run starts.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable
from urllib.parse import urlparse

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import (AuthFailedError, ConnectionClosedError, ConnectionLoss, NoAuthError,
                              NodeExistsError, NoNodeError, OperationTimeoutError, SessionExpiredError)
from kazoo.protocol.states import EventType, WatchedEvent

from backpressure.coordinator.base import (CHANGED, CHILD, CONNECTED, CREATED, DELETED, DEFAULT_ROOT, LOST,
                                           SESSION, SUSPENDED, Coordinator, NodeExists, NoNode, NotAuthorized,
                                           StoreUnavailable, WatchEvent, Watcher, ZnodeLayout)
from backpressure.coordinator.access import Tls, ZkAuth, acl_problem, redact

log = logging.getLogger(__name__)
kazoo_log = logging.getLogger(__name__ + ".kazoo")
if kazoo_log.level == logging.NOTSET:
    kazoo_log.setLevel(logging.CRITICAL)
kazoo_log.addFilter(redact)         # whatever kazoo logs, no credential in it

_UNAVAILABLE = (ConnectionLoss, SessionExpiredError, ConnectionClosedError, OperationTimeoutError)
_EVENTS = {EventType.CREATED: CREATED, EventType.DELETED: DELETED, EventType.CHANGED: CHANGED,
           EventType.CHILD: CHILD}
_STATES = {KazooState.CONNECTED: CONNECTED, KazooState.SUSPENDED: SUSPENDED, KazooState.LOST: LOST}


def parse_zookeeper_url(url: str) -> tuple[str, str]:
    """``zookeeper://host:port[,host:port]/root`` -> (kazoo hosts string, root path)."""
    parsed = urlparse(url)
    if parsed.scheme != "zookeeper" or not parsed.netloc:
        raise ValueError(f"expected zookeeper://host:port/root, got {url!r}")
    root = parsed.path.rstrip("/") or DEFAULT_ROOT
    return parsed.netloc, root


def client_args(auth: ZkAuth | None, tls: Tls | None) -> dict[str, Any]:
    """kazoo's own auth and TLS arguments (``auth_data``, ``default_acl``, ``use_ssl``...)."""
    out: dict[str, Any] = {}
    if auth is not None:
        out["auth_data"] = auth.auth_data()
    if tls is not None:
        out.update(tls.kazoo_args())
    return out


def unreachable(hosts: str, timeout: float, tls: Tls | None) -> str:
    """The one line for a connection that did not come up within ``timeout``."""
    problem = tls.handshake_problem(hosts, timeout) if tls is not None else None
    return problem or f"cannot reach ZooKeeper at {hosts} within {timeout:g}s"


def connect(url: str, timeout: float, auth: ZkAuth | None = None, tls: Tls | None = None) -> KazooClient:
    """A started blocking kazoo client (for commands, not the event loop); one line on failure."""
    hosts, _ = parse_zookeeper_url(url)
    client = KazooClient(hosts=hosts, timeout=max(timeout, 1.0), logger=kazoo_log,
                         connection_retry={"max_tries": -1, "delay": 0.05, "max_delay": 0.5},
                         **client_args(auth, tls))
    try:
        client.start(timeout)
    except AuthFailedError:
        _close(client)
        raise NotAuthorized(f"ZooKeeper at {hosts} refused the credentials ({auth})") from None
    except Exception:
        _close(client)
        raise StoreUnavailable(unreachable(hosts, timeout, tls)) from None
    return client


def _close(client: KazooClient) -> None:
    try:
        client.stop()
    finally:
        client.close()


def probe(url: str, timeout: float, auth: ZkAuth | None = None, tls: Tls | None = None) -> None:
    """Connect to the ZooKeeper at ``url`` and leave; ``StoreUnavailable`` (one line)
    when nobody answers within ``timeout`` seconds."""
    _close(connect(url, timeout, auth, tls))


def secure(url: str, topology: str, auth: ZkAuth, read_open: bool = False, timeout: float = 5.0) -> int:
    """Give the tree of ``topology`` under ``url``'s root the ACL a run with ``auth``
    makes (``topo zk secure``); returns how many znodes were changed. Needs the right
    to change their ACLs: an open tree, or ZooKeeper's super user."""
    layout = ZnodeLayout(topology, parse_zookeeper_url(url)[1])
    acl = auth.acl(read_open)
    client = connect(url, timeout, auth)
    changed = 0
    try:
        todo = [layout.base]
        while todo:
            path = todo.pop()
            try:
                client.set_acls(path, acl)
                changed += 1
                todo.extend(f"{path}/{c}" for c in client.get_children(path))
            except NoNodeError:
                continue
            except NoAuthError:
                raise NotAuthorized(f"not allowed to change the ACL of {path} with {auth}: "
                                    "only its creator or ZooKeeper's super user may") from None
    finally:
        _close(client)
    return changed


class KazooStore:
    """A ``Store`` on kazoo's asynchronous API."""

    def __init__(self, hosts: str, session_timeout: float = 10.0, connect_timeout: float = 15.0, *,
                 auth: ZkAuth | None = None, read_open: bool = False, tls: Tls | None = None) -> None:
        self.hosts = hosts
        self.connect_timeout = connect_timeout
        self.auth = auth
        self.tls = tls
        self.acl = auth.acl(read_open) if auth is not None else None   # every znode we create gets it
        self.client = KazooClient(hosts=hosts, timeout=session_timeout,
                                  connection_retry={"max_tries": -1, "delay": 0.05, "backoff": 1.5,
                                                    "max_delay": 1.0},
                                  command_retry=None, logger=kazoo_log, **client_args(auth, tls))
        self._loop: asyncio.AbstractEventLoop | None = None
        self._listeners: list[Callable[[str], None]] = []
        self._connected_once = False
        self._closing = False
        self.client.add_listener(self._on_kazoo_state)

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        try:
            await self._loop.run_in_executor(None, self.client.start, self.connect_timeout)
        except AuthFailedError:
            await self._loop.run_in_executor(None, self._stop_and_close)
            raise NotAuthorized(f"ZooKeeper at {self.hosts} refused the credentials ({self.auth})") from None
        except Exception:
            await self._loop.run_in_executor(None, self._stop_and_close)   # no retrying behind our back
            reason = await self._loop.run_in_executor(None, unreachable, self.hosts, self.connect_timeout, self.tls)
            raise StoreUnavailable(reason) from None

    async def close(self) -> None:
        self._closing = True
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self._stop_and_close)

    def _stop_and_close(self) -> None:
        try:
            self.client.stop()
        finally:
            self.client.close()

    def listen(self, callback: Callable[[str], None]) -> None:
        self._listeners.append(callback)

    @property
    def session_id(self) -> int | None:
        cid = self.client.client_id
        return cid[0] if cid else None

    # -- calls ----------------------------------------------------------------------------

    async def create(self, path: str, data: bytes = b"", *, ephemeral: bool = False,
                     sequence: bool = False, makepath: bool = False) -> str:
        return await self._await(self.client.create_async(path, data, acl=self.acl, ephemeral=ephemeral,
                                                          sequence=sequence, makepath=makepath), path)

    async def acl_problem(self, path: str) -> str | None:
        """Why ``path``'s ACL is not the one this store creates with (None: it is, or no auth)."""
        if self.auth is None or self.acl is None:
            return None
        acls, _stat = await self._await(self.client.get_acls_async(path), path)
        return acl_problem(acls, self.acl, self.auth)

    async def get(self, path: str, watch: Watcher | None = None) -> bytes:
        data, _stat = await self._await(self.client.get_async(path, watch=self._wrap(watch)), path)
        return data

    async def set(self, path: str, data: bytes) -> None:
        await self._await(self.client.set_async(path, data), path)

    async def delete(self, path: str) -> None:
        await self._await(self.client.delete_async(path), path)

    async def children(self, path: str, watch: Watcher | None = None) -> list[str]:
        return list(await self._await(self.client.get_children_async(path, watch=self._wrap(watch)), path))

    # -- thread hand-off ------------------------------------------------------------------

    async def _await(self, result: Any, path: str = "") -> Any:
        loop = self._loop or asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        who = self.auth

        def done(r: Any) -> None:        # runs in a kazoo thread
            try:
                loop.call_soon_threadsafe(_settle, fut, r, path, who)
            except RuntimeError:        # the loop is closed: nobody is waiting any more
                pass

        result.rawlink(done)
        return await fut

    def _wrap(self, watch: Watcher | None) -> Callable[[WatchedEvent], None] | None:
        if watch is None:
            return None
        return _Forward(self, watch)

    def _on_kazoo_state(self, state: str) -> None:   # kazoo's connection thread: never block
        name = _STATES.get(state)
        if name is None or self._loop is None:
            return
        if name == CONNECTED:
            self._connected_once = True
        elif not self._connected_once or self._closing:
            pass                    # a failed start or our own close: said elsewhere, or nothing to say
        elif name == SUSPENDED:
            log.warning("ZooKeeper %s: connection lost; signals wait until it is back", self.hosts)
        elif name == LOST:
            log.warning("ZooKeeper %s: session expired; task states are published again on reconnection",
                        self.hosts)
        for cb in self._listeners:
            try:
                self._loop.call_soon_threadsafe(cb, name)
            except RuntimeError:
                return


class _Forward:
    """A kazoo watcher that calls ``watch`` on the loop; equal for equal targets, so
    kazoo (which keeps watchers in a set) does not pile up duplicates on a path."""

    __slots__ = ("store", "watch")

    def __init__(self, store: KazooStore, watch: Watcher) -> None:
        self.store = store
        self.watch = watch

    def __call__(self, event: WatchedEvent) -> None:
        kind = _EVENTS.get(event.type, SESSION)
        loop = self.store._loop
        if loop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(self.watch, WatchEvent(kind, event.path if kind != SESSION else None))
            except RuntimeError:
                pass

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Forward) and other.store is self.store and other.watch == self.watch

    def __hash__(self) -> int:
        return hash((id(self.store), self.watch))


def _settle(fut: "asyncio.Future[Any]", result: Any, path: str = "", auth: ZkAuth | None = None) -> None:
    if fut.done():
        return
    try:
        fut.set_result(result.get_nowait())
    except NoAuthError:
        fut.set_exception(NotAuthorized(refused(path, auth)))
    except NoNodeError as e:
        fut.set_exception(NoNode(str(e)))
    except NodeExistsError as e:
        fut.set_exception(NodeExists(str(e)))
    except _UNAVAILABLE as e:
        fut.set_exception(StoreUnavailable(f"{type(e).__name__}: {e}"))
    except Exception as e:  # anything else kazoo raises is a bug to surface, not swallow
        fut.set_exception(e)


def refused(path: str, auth: ZkAuth | None) -> str:
    """ZooKeeper's NoAuth on ``path`` as one line naming the credentials (never the secret)."""
    if auth is None:
        return (f"ZooKeeper refused access to {path} (NoAuth): it is protected; "
                "set TOPO_ZK_AUTH or zookeeper.auth_file to its credentials (SCHEME:CREDENTIALS)")
    return f"ZooKeeper refused access to {path} (NoAuth) for {auth}: wrong credentials for this topology?"


class ZooKeeperCoordinator(Coordinator):
    """The document's message path on a real ZooKeeper (``zookeeper://host:port/root``).

    With ``auth`` every znode it creates gets the creator-only ACL (``access``), and
    a tree that exists with another ACL (an older open run, other credentials) is
    refused at start with one line instead of being used unprotected."""

    def __init__(self, url: str, topology: str, session_timeout: float = 10.0, connect_timeout: float = 5.0, *,
                 auth: ZkAuth | None = None, read_open: bool = False, tls: Tls | None = None) -> None:
        hosts, root = parse_zookeeper_url(url)
        self.url = url
        # A killed run's claim lives as long as its session: wait that out for a holder
        # that is gone from this host.
        super().__init__(KazooStore(hosts, session_timeout=session_timeout, connect_timeout=connect_timeout,
                                    auth=auth, read_open=read_open, tls=tls),
                         topology, root,
                         claim_wait=session_timeout + 2.0)

    async def _check_tree(self) -> None:
        store: KazooStore = self.store  # type: ignore[assignment]
        if store.auth is None:
            return
        for path in (self.layout.base, self.layout.messages, self.layout.states, self.layout.locks):
            try:
                problem = await store.acl_problem(path)
            except NoNode:
                continue
            except NotAuthorized:           # not even allowed to read its ACL
                problem = f"is protected for other credentials than {store.auth} (a wrong password?)"
            if problem:
                hint = (f"fix it with `topo zk secure {self.url} {self.layout.topology}` (with these credentials, "
                        "or as ZooKeeper's super user), or delete the tree"
                        if "open ACL" in problem or "other than" in problem else
                        "check TOPO_ZK_AUTH / zookeeper.auth_file")
                raise NotAuthorized(f"topology {self.layout.topology!r}: {path} on {store.hosts} {problem}; "
                                    f"refusing to run on it: {hint}")
