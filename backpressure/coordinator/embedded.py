"""The embedded coordinator: ZooKeeper's data model in process, the default.

``MemoryServer`` is a znode tree with what the coordinator relies on from
ZooKeeper: persistent and ephemeral znodes, per-parent sequence numbers (ten
digits, so names sort in creation order), one-shot data and child watches, and
sessions whose ephemeral znodes vanish when they close or expire. ``MemoryStore``
is one session on it. A run makes its own server (no global state); tests hand
one server to several stores to play several processes, and use ``expire`` and
``disconnect`` / ``reconnect`` to play what a real ZooKeeper does to a client.

Watches fire through ``loop.call_soon``, never inside the call that caused them,
as ZooKeeper's notifications arrive after the response.
"""
from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass, field
from typing import Callable

from backpressure.coordinator.base import (CHANGED, CHILD, CONNECTED, CREATED, DELETED, DEFAULT_ROOT, LOST,
                                           SESSION, SUSPENDED, Coordinator, NodeExists, NoNode,
                                           StoreUnavailable, WatchEvent, Watcher)


@dataclass
class _Node:
    data: bytes
    owner: int | None                 # session id for an ephemeral znode
    children: set[str] = field(default_factory=set)
    cversion: int = 0                 # bumps on each child create: the sequence counter


class MemoryServer:
    """An in-process znode tree shared by the ``MemoryStore`` sessions on it."""

    def __init__(self) -> None:
        self.nodes: dict[str, _Node] = {"/": _Node(b"", None)}
        self._session_ids = itertools.count(1)
        self.sessions: dict[int, "MemoryStore"] = {}

    def open_session(self, store: "MemoryStore") -> int:
        sid = next(self._session_ids)
        self.sessions[sid] = store
        return sid

    def close_session(self, sid: int) -> None:
        """Drop a session: its ephemeral znodes are deleted (watchers of others fire)."""
        self.sessions.pop(sid, None)
        for path in [p for p, n in self.nodes.items() if n.owner == sid]:
            if path in self.nodes:
                self._remove(path)

    def expire(self, store: "MemoryStore") -> None:
        """What a ZooKeeper session expiry does to ``store``: LOST, then a new session."""
        store._expire()

    # -- tree operations (called by MemoryStore with a live session) --------------------

    def create(self, sid: int, path: str, data: bytes, ephemeral: bool, sequence: bool,
               makepath: bool) -> str:
        parent, _, name = path.rpartition("/")
        parent = parent or "/"
        if parent not in self.nodes:
            if not makepath:
                raise NoNode(parent)
            self.create(sid, parent, b"", False, False, True)
        pnode = self.nodes[parent]
        if self.nodes[parent].owner is not None:
            raise NoNode(f"{parent} is ephemeral and cannot have children")
        if sequence:
            name = f"{name}{pnode.cversion:010d}"
            path = f"{parent.rstrip('/')}/{name}"
        if path in self.nodes:
            raise NodeExists(path)
        self.nodes[path] = _Node(bytes(data), sid if ephemeral else None)
        pnode.children.add(name)
        pnode.cversion += 1
        self._fire(path, CREATED, data=True)
        self._fire(parent, CHILD, child=True)
        return path

    def get(self, path: str) -> bytes:
        node = self.nodes.get(path)
        if node is None:
            raise NoNode(path)
        return node.data

    def set(self, path: str, data: bytes) -> None:
        node = self.nodes.get(path)
        if node is None:
            raise NoNode(path)
        node.data = bytes(data)
        self._fire(path, CHANGED, data=True)

    def delete(self, path: str) -> None:
        node = self.nodes.get(path)
        if node is None:
            raise NoNode(path)
        if node.children:
            raise NodeExists(f"{path} has children")
        self._remove(path)

    def children(self, path: str) -> list[str]:
        node = self.nodes.get(path)
        if node is None:
            raise NoNode(path)
        return sorted(node.children)

    def _remove(self, path: str) -> None:
        del self.nodes[path]
        parent, _, name = path.rpartition("/")
        parent = parent or "/"
        self.nodes[parent].children.discard(name)
        self._fire(path, DELETED, data=True)
        self._fire(parent, CHILD, child=True)

    def _fire(self, path: str, kind: str, *, data: bool = False, child: bool = False) -> None:
        for store in list(self.sessions.values()):
            store._fire(path, kind, data, child)


class MemoryStore:
    """One session on a ``MemoryServer``; the ``Store`` the coordinator uses."""

    def __init__(self, server: MemoryServer | None = None) -> None:
        self.server = server if server is not None else MemoryServer()
        self.sid: int | None = None
        self._data_watches: dict[str, set[Watcher]] = {}
        self._child_watches: dict[str, set[Watcher]] = {}
        self._listeners: list[Callable[[str], None]] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._up = False

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.sid = self.server.open_session(self)
        self._up = True
        self._notify(CONNECTED)

    async def close(self) -> None:
        if self.sid is not None:
            self.server.close_session(self.sid)
        self.sid = None
        self._up = False
        self._data_watches.clear()
        self._child_watches.clear()

    def listen(self, callback: Callable[[str], None]) -> None:
        self._listeners.append(callback)

    # -- fault injection (tests) ------------------------------------------------------

    def disconnect(self) -> None:
        """Connection to the server lost; the session lives on (until ``expire``)."""
        self._up = False
        self._reset_watches()
        self._notify(SUSPENDED)

    def reconnect(self) -> None:
        self._up = True
        self._notify(CONNECTED)

    def _expire(self) -> None:
        if self.sid is not None:
            self.server.close_session(self.sid)
        self._reset_watches()
        self._notify(LOST)
        self.sid = self.server.open_session(self)
        self._up = True
        self._notify(CONNECTED)

    # -- store calls --------------------------------------------------------------------

    def _live(self) -> int:
        if not self._up or self.sid is None:
            raise StoreUnavailable("not connected")
        return self.sid

    async def create(self, path: str, data: bytes = b"", *, ephemeral: bool = False,
                     sequence: bool = False, makepath: bool = False) -> str:
        return self.server.create(self._live(), path, data, ephemeral, sequence, makepath)

    async def get(self, path: str, watch: Watcher | None = None) -> bytes:
        self._live()
        data = self.server.get(path)
        if watch is not None:
            self._data_watches.setdefault(path, set()).add(watch)
        return data

    async def set(self, path: str, data: bytes) -> None:
        self._live()
        self.server.set(path, data)

    async def delete(self, path: str) -> None:
        self._live()
        self.server.delete(path)

    async def children(self, path: str, watch: Watcher | None = None) -> list[str]:
        self._live()
        names = self.server.children(path)
        if watch is not None:
            self._child_watches.setdefault(path, set()).add(watch)
        return names

    # -- watch delivery -----------------------------------------------------------------

    def _fire(self, path: str, kind: str, data: bool, child: bool) -> None:
        book = self._data_watches if data else self._child_watches
        watchers = book.pop(path, None)
        if watchers and self._loop is not None:
            event = WatchEvent(kind, path)
            for w in watchers:
                self._loop.call_soon(w, event)

    def _reset_watches(self) -> None:
        """As kazoo does on a lost connection: every watch fires once with a session event."""
        watchers = [w for ws in (*self._data_watches.values(), *self._child_watches.values()) for w in ws]
        self._data_watches.clear()
        self._child_watches.clear()
        if self._loop is not None:
            for w in watchers:
                self._loop.call_soon(w, WatchEvent(SESSION, None))

    def _notify(self, state: str) -> None:
        for cb in self._listeners:
            if self._loop is not None:
                self._loop.call_soon(cb, state)


class EmbeddedCoordinator(Coordinator):
    """The default coordinator: the document's message path on an in-process tree."""

    def __init__(self, topology: str, root: str = DEFAULT_ROOT, server: MemoryServer | None = None) -> None:
        super().__init__(MemoryStore(server), topology, root)
