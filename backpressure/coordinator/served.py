"""The embedded coordinator across worker processes: one ``MemoryServer``, served.

With ``workers: N`` and ``coordinator: embedded`` the supervisor runs one
``MemoryServer`` (``StoreServer``, on an event loop of its own thread:
``serve_in_thread``) and listens on a Unix domain socket in its temporary
directory; every worker's coordinator is a ``ServedCoordinator`` whose store,
``SocketStore``, speaks to it. So stepwise signals cross workers on the default
coordinator as they do through ZooKeeper, with the same paths, sequence numbers,
one-shot watches and ephemerals: the same ``Coordinator`` runs over it.

* **One session per connection.** A connection that drops (the worker exited or was
  killed) closes its session on the server, so its ephemeral znodes (task states,
  task claims) vanish, as ZooKeeper's do when a session ends. There is no session
  that outlives its connection: the client reports ``LOST``, connects again (a new
  session) and reports ``CONNECTED``, and the coordinator re-publishes and re-claims.
* **Watches are pushed.** A watch is armed on the server for the connection's
  session when the read that sets it succeeds; when it fires the server sends an
  event frame; the client arms its own watcher when the reply is read, before any
  later frame, so no event can overtake the watch it fires.
* **Bounded.** Frames are msgpack arrays behind a 4-byte big-endian length, at most
  ``MAX_FRAME`` bytes each way; a longer frame, or one that does not decode to a
  request, closes the connection. A client that does not read its events is cut
  off once ``MAX_BACKLOG`` bytes wait to be written to it.

Frames: request ``[id, op, *args]`` with ``op`` one of ``create`` (path, data,
ephemeral, sequence, makepath), ``get`` (path, watch), ``set`` (path, data),
``delete`` (path), ``children`` (path, watch); reply ``[id, "ok", result]`` or
``[id, "err", kind, message]``; ``[0, "hello", session]`` once on connect;
``[0, "watch", type, path, data_watch]`` when a watch fires.
"""
from __future__ import annotations

import asyncio
import logging
import struct
import threading
from typing import Any, Callable

import msgpack

from backpressure.coordinator.base import (CONNECTED, DEFAULT_ROOT, LOST, SESSION, Coordinator, NodeExists,
                                           NoNode, StoreUnavailable, WatchEvent, Watcher)
from backpressure.coordinator.embedded import MemoryServer

log = logging.getLogger(__name__)

MAX_FRAME = 4 * 1024 * 1024          # bytes in one frame, either way
MAX_BACKLOG = 16 * 1024 * 1024       # bytes the server lets wait for a client that does not read
_LEN = struct.Struct(">I")
_ERRORS: dict[str, type[Exception]] = {"NoNode": NoNode, "NodeExists": NodeExists}
SOCKET_NAME = "coordinator.sock"


class FrameError(Exception):
    """A frame over ``MAX_FRAME`` or one that is not a msgpack array."""


async def read_frame(reader: asyncio.StreamReader) -> list[Any]:
    """One frame; ``asyncio.IncompleteReadError`` at the end of the stream."""
    (n,) = _LEN.unpack(await reader.readexactly(_LEN.size))
    if n > MAX_FRAME:
        raise FrameError(f"frame of {n} bytes is over the {MAX_FRAME}-byte limit")
    body = await reader.readexactly(n)
    try:
        frame = msgpack.unpackb(body, raw=False)     # limits: at most the frame itself
    except Exception as e:
        raise FrameError(f"undecodable frame: {e}") from None
    if not isinstance(frame, list) or len(frame) < 2 or not isinstance(frame[0], int):
        raise FrameError("a frame is an array [id, kind, ...]")
    return frame


def encode_frame(frame: list[Any]) -> bytes:
    body = msgpack.packb(frame, use_bin_type=True)
    if len(body) > MAX_FRAME:
        raise FrameError(f"frame of {len(body)} bytes is over the {MAX_FRAME}-byte limit")
    return _LEN.pack(len(body)) + body


# -- the server (the supervisor) -----------------------------------------------------------

class _Session:
    """One connection's session on the ``MemoryServer``: the watches it armed."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self.writer = writer
        self.sid = 0
        self.data_watches: set[str] = set()
        self.child_watches: set[str] = set()

    def send(self, frame: list[Any]) -> None:
        if self.writer.is_closing():
            return
        if self.writer.transport.get_write_buffer_size() > MAX_BACKLOG:
            log.warning("coordinator client of session %d does not read: closing it", self.sid)
            self.writer.close()
            return
        self.writer.write(encode_frame(frame))

    def _fire(self, path: str, kind: str, data: bool, child: bool) -> None:
        """Called by ``MemoryServer`` for every change: push the watch if this session armed it."""
        book = self.data_watches if data else self.child_watches
        if path in book:
            book.discard(path)
            self.send([0, "watch", kind, path, data])


class StoreServer:
    """A ``MemoryServer`` served on a Unix socket, one session per connection."""

    def __init__(self, path: str, server: MemoryServer | None = None) -> None:
        self.path = path
        self.tree = server if server is not None else MemoryServer()
        self._listener: asyncio.AbstractServer | None = None
        self.sessions: dict[int, _Session] = {}
        self._handlers: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self._listener = await asyncio.start_unix_server(self._serve, self.path, limit=MAX_FRAME + _LEN.size)

    async def stop(self) -> None:
        """Stop listening and drop every connection (their sessions close)."""
        if self._listener is not None:
            self._listener.close()
            await self._listener.wait_closed()
            self._listener = None
        for s in list(self.sessions.values()):
            s.writer.close()
        for t in list(self._handlers):
            t.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)

    def drop(self, sid: int) -> None:
        """Cut one session's connection (what a worker's death does; tests use it as an expiry)."""
        s = self.sessions.get(sid)
        if s is not None:
            s.writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        session = _Session(writer)
        session.sid = self.tree.open_session(session)  # type: ignore[arg-type]
        self.sessions[session.sid] = session
        try:
            session.send([0, "hello", session.sid])
            while not writer.is_closing():
                frame = await read_frame(reader)
                session.send(self._call(session, frame))
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        except FrameError as e:
            log.warning("coordinator session %d: %s; closing it", session.sid, e)
        finally:
            self.sessions.pop(session.sid, None)
            self.tree.close_session(session.sid)
            writer.close()
            self._handlers.discard(task)

    def _call(self, session: _Session, frame: list[Any]) -> list[Any]:
        rid, op, args = frame[0], frame[1], frame[2:]
        tree = self.tree
        try:
            if op == "create" and len(args) == 5:
                path, data, ephemeral, sequence, makepath = args
                result: Any = tree.create(session.sid, _path(path), _bytes(data), bool(ephemeral), bool(sequence),
                                          bool(makepath))
            elif op == "get" and len(args) == 2:
                result = tree.get(_path(args[0]))
                if args[1]:
                    session.data_watches.add(args[0])
            elif op == "set" and len(args) == 2:
                result = tree.set(_path(args[0]), _bytes(args[1]))
            elif op == "delete" and len(args) == 1:
                result = tree.delete(_path(args[0]))
            elif op == "children" and len(args) == 2:
                result = tree.children(_path(args[0]))
                if args[1]:
                    session.child_watches.add(args[0])
            else:
                return [rid, "err", "BadRequest", f"unknown request {op!r} with {len(args)} arguments"]
        except (NoNode, NodeExists) as e:
            return [rid, "err", type(e).__name__, str(e)]
        except (TypeError, ValueError) as e:
            return [rid, "err", "BadRequest", str(e)]
        return [rid, "ok", result]


def _path(p: Any) -> str:
    if not isinstance(p, str) or not p.startswith("/") or (len(p) > 1 and p.endswith("/")):
        raise ValueError(f"bad znode path {p!r}")
    return p


def _bytes(b: Any) -> bytes:
    if not isinstance(b, (bytes, bytearray)):
        raise TypeError("znode data must be bytes")
    return bytes(b)


class ServedThread:
    """A ``StoreServer`` on its own event loop in a daemon thread, for a caller without one
    (the supervisor, whose main thread polls its workers)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.loop = asyncio.new_event_loop()
        self.server = StoreServer(path)
        self._thread = threading.Thread(target=self.loop.run_forever, name="coordinator-server", daemon=True)

    def start(self) -> "ServedThread":
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self.server.start(), self.loop).result(10)
        return self

    def call(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` on the server's loop (the tree is not thread-safe) and return its result."""
        async def run() -> Any:
            return fn()
        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(10)

    def stop(self) -> None:
        if not self._thread.is_alive():
            return
        try:
            asyncio.run_coroutine_threadsafe(self.server.stop(), self.loop).result(10)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(10)
            if not self._thread.is_alive():
                self.loop.close()


def serve_in_thread(path: str) -> ServedThread:
    """Serve a fresh ``MemoryServer`` on the Unix socket ``path``; ``stop()`` ends it."""
    return ServedThread(path).start()


# -- the client (each worker) ----------------------------------------------------------------

class SocketStore:
    """The ``Store`` a worker's coordinator uses: a session on a served ``MemoryServer``.

    ``start`` connects (waiting up to ``connect_timeout`` for the socket to appear);
    after a lost connection every watch fires once with a SESSION event, LOST is
    reported, and the store connects again in the background (a new session), then
    reports CONNECTED. Calls while disconnected raise ``StoreUnavailable``.
    """

    def __init__(self, path: str, connect_timeout: float = 10.0) -> None:
        self.path = path
        self.hosts = f"unix:{path}"           # how a RunConflict message names where it runs
        self.connect_timeout = connect_timeout
        self.session_id: int | None = None
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._pending: dict[int, tuple[asyncio.Future[Any], dict[str, set[Watcher]] | None, str, Watcher | None]] = {}
        self._ids = 0
        self._data_watches: dict[str, set[Watcher]] = {}
        self._child_watches: dict[str, set[Watcher]] = {}
        self._listeners: list[Callable[[str], None]] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pump: asyncio.Task[None] | None = None
        self._closed = False

    def listen(self, callback: Callable[[str], None]) -> None:
        self._listeners.append(callback)

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._closed = False
        deadline = self._loop.time() + self.connect_timeout
        while True:
            try:
                await self._connect()
                break
            except (OSError, asyncio.IncompleteReadError, FrameError) as e:
                if self._loop.time() >= deadline:
                    raise StoreUnavailable(f"no coordinator at {self.path}: {e}") from None
                await asyncio.sleep(0.05)
        self._notify(CONNECTED)

    async def _connect(self) -> None:
        reader, writer = await asyncio.open_unix_connection(self.path, limit=MAX_FRAME + _LEN.size)
        try:
            hello = await asyncio.wait_for(read_frame(reader), 5.0)
        except BaseException:
            writer.close()
            raise
        if hello[1] != "hello" or len(hello) != 3:
            writer.close()
            raise FrameError("the coordinator server did not say hello")
        self.session_id = int(hello[2])
        self._reader, self._writer = reader, writer
        self._pump = asyncio.get_running_loop().create_task(self._read_loop(reader, writer))

    async def close(self) -> None:
        self._closed = True
        pump, self._pump = self._pump, None
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.close()
        if pump is not None and pump is not asyncio.current_task():
            pump.cancel()
            await asyncio.gather(pump, return_exceptions=True)
        self._fail_pending()
        self._data_watches.clear()
        self._child_watches.clear()

    # -- the reader ---------------------------------------------------------------------

    async def _read_loop(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                self._dispatch(await read_frame(reader))
        except asyncio.CancelledError:
            raise
        except (asyncio.IncompleteReadError, ConnectionError, FrameError) as e:
            if not self._closed:
                log.warning("connection to the coordinator server lost (%s); connecting again",
                            e if isinstance(e, FrameError) else "closed")
        writer.close()
        if self._closed or self._writer is not writer:
            return
        self._writer = None
        self._fail_pending()
        self._reset_watches()
        self._notify(LOST)
        self._pump = asyncio.get_running_loop().create_task(self._reconnect())

    async def _reconnect(self) -> None:
        delay = 0.05
        while not self._closed:
            try:
                await self._connect()
            except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError, FrameError):
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)
                continue
            self._notify(CONNECTED)
            return

    def _dispatch(self, frame: list[Any]) -> None:
        rid, kind = frame[0], frame[1]
        if rid == 0:
            if kind == "watch" and len(frame) == 5 and isinstance(frame[3], str):
                book = self._data_watches if frame[4] else self._child_watches
                for w in book.pop(frame[3], ()):
                    self._call_soon(w, WatchEvent(str(frame[2]), frame[3]))
            return
        pending = self._pending.pop(rid, None)
        if pending is None:
            return
        future, book, path, watch = pending
        if future.done():
            return
        if kind == "ok" and len(frame) == 3:
            if book is not None and watch is not None:
                book.setdefault(path, set()).add(watch)     # armed before any later frame is read
            future.set_result(frame[2])
        elif kind == "err" and len(frame) == 4:
            future.set_exception(_ERRORS.get(frame[2], RuntimeError)(str(frame[3])))
        else:
            future.set_exception(RuntimeError(f"malformed reply from the coordinator server: {frame!r:.200}"))

    def _fail_pending(self) -> None:
        pending, self._pending = self._pending, {}
        for future, *_ in pending.values():
            if not future.done():
                future.set_exception(StoreUnavailable("connection to the coordinator server lost"))

    def _reset_watches(self) -> None:
        watchers = [w for ws in (*self._data_watches.values(), *self._child_watches.values()) for w in ws]
        self._data_watches.clear()
        self._child_watches.clear()
        for w in watchers:
            self._call_soon(w, WatchEvent(SESSION, None))

    def _call_soon(self, fn: Callable[..., None], *args: Any) -> None:
        if self._loop is not None:
            self._loop.call_soon(fn, *args)

    def _notify(self, state: str) -> None:
        for cb in self._listeners:
            self._call_soon(cb, state)

    # -- store calls --------------------------------------------------------------------

    async def _request(self, op: str, args: list[Any], book: dict[str, set[Watcher]] | None = None,
                       watch: Watcher | None = None) -> Any:
        writer = self._writer
        if writer is None or writer.is_closing():
            raise StoreUnavailable("not connected to the coordinator server")
        self._ids += 1
        rid = self._ids
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[rid] = (future, book, args[0], watch)
        try:
            writer.write(encode_frame([rid, op, *args]))
        except FrameError:
            self._pending.pop(rid, None)
            raise ValueError(f"{op} {args[0]}: request over the {MAX_FRAME}-byte frame limit") from None
        return await future

    async def create(self, path: str, data: bytes = b"", *, ephemeral: bool = False,
                     sequence: bool = False, makepath: bool = False) -> str:
        return str(await self._request("create", [path, bytes(data), ephemeral, sequence, makepath]))

    async def get(self, path: str, watch: Watcher | None = None) -> bytes:
        return bytes(await self._request("get", [path, watch is not None], self._data_watches, watch))

    async def set(self, path: str, data: bytes) -> None:
        await self._request("set", [path, bytes(data)])

    async def delete(self, path: str) -> None:
        await self._request("delete", [path])

    async def children(self, path: str, watch: Watcher | None = None) -> list[str]:
        return [str(n) for n in await self._request("children", [path, watch is not None], self._child_watches,
                                                    watch)]


class ServedCoordinator(Coordinator):
    """A worker's coordinator on the supervisor's served ``MemoryServer`` at ``path``.

    A claim left by a worker that was killed vanishes once the server reads the end of
    its connection, which may be a moment after its replacement starts: ``claim_wait``
    waits that out (a live holder still refuses the start at once).
    """

    def __init__(self, topology: str, path: str, root: str = DEFAULT_ROOT, *, claim_wait: float = 5.0) -> None:
        super().__init__(SocketStore(path), topology, root, claim_wait=claim_wait)
