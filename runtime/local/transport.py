"""Batches and acks between worker processes, over Unix domain sockets.

Every worker listens on ``<dir>/w<i>.sock``. A task that sends to a task of another
worker puts its batches into a ``RemoteQueue`` for that task, which looks to the
outbox like the target's ``ByteQueue`` (``put(batch, nbytes)``, ``hard_bound``) and
keeps its promises:

* **Bounded bytes, credit-based.** A sender has at most ``hard_bound`` bytes per
  target task in flight (sent and not yet credited back); the receiver credits a
  batch only once it is in the target's byte-bounded queue, which is where a full
  queue makes it wait. So between the two queues there is at most one bound's worth
  of bytes in socket buffers, and a full receiver stops its senders: no unbounded
  buffer anywhere, and backpressure means the same across processes.
* **Order per (sender task, target task)**: one connection per pair of workers, and
  frames are written in order.
* **Acks travel to their root's owner.** A root id carries its spout's worker in its
  low byte; an ack or fail for a root owned elsewhere is batched (``AckForwarder``)
  and applied by the owner's acker, where the XOR ledger is.

Frames are msgpack arrays, 4-byte length prefixed, bounded by ``MAX_FRAME``:
``["B", target, nbytes, groups]`` (a batch by columns: ``TupleCodec``; under batch granularity
a column of ack group sizes, so the receiver shares one ack cell per group), ``["C", target, nbytes]`` (credit),
``["A", [[root, xor], ...]]``, ``["F", [[root, reason], ...]]``. Counters of frames
sent and received let the supervisor tell when nothing is in flight anywhere.
"""
from __future__ import annotations

import asyncio
import logging
import struct
from collections import deque
from itertools import repeat
from operator import attrgetter
from pathlib import Path
from typing import Any, Callable

import msgpack

from topo.api import Columns, FieldIndex, Origin, TupleBatch, WireTuple, interleave
from runtime.local.acker import GROUP_CELL, all_in_groups, new_group
from runtime.local.outbox import array_header_len, columns_wire_bytes
from runtime.local.stretches import stretch_bounds

log = logging.getLogger("topo.transport")

MAX_FRAME = 256 * 1024 * 1024
_LEN = struct.Struct(">I")
WORKER_BITS = 8                      # a root id's low byte names the worker that owns it
WORKER_MASK = (1 << WORKER_BITS) - 1


def socket_path(directory: str | Path, worker: int) -> str:
    return str(Path(directory) / f"w{worker}.sock")


def owner_of(root: int) -> int:
    return root & WORKER_MASK


class Counters:
    """Frames that carry work (batches, acks, fails) sent and received by this worker."""

    def __init__(self) -> None:
        self.sent = 0
        self.received = 0


class Link:
    """This worker's connection to one other worker (created lazily, reconnected on loss)."""

    def __init__(self, directory: str, peer: int, counters: Counters) -> None:
        self.path = socket_path(directory, peer)
        self.peer = peer
        self.counters = counters
        self.writer: asyncio.StreamWriter | None = None
        self._connecting: asyncio.Lock | None = None
        self.credit_waiters: dict[int, "RemoteQueue"] = {}

    async def _connect(self) -> asyncio.StreamWriter:
        if self._connecting is None:
            self._connecting = asyncio.Lock()
        async with self._connecting:
            if self.writer is not None and not self.writer.is_closing():
                return self.writer
            delay = 0.01
            while True:
                try:
                    reader, writer = await asyncio.open_unix_connection(self.path)
                    break
                except (FileNotFoundError, ConnectionRefusedError, OSError):
                    await asyncio.sleep(delay)      # the peer is starting or restarting
                    delay = min(0.5, delay * 2)
            self.writer = writer
            for q in self.credit_waiters.values():
                q.reset_credit()        # what was in flight to a dead peer is gone; acking replays it
            asyncio.get_running_loop().create_task(self._read_credits(reader, writer))
            return writer

    async def send(self, frame: list[Any]) -> None:
        data = msgpack.packb(frame, use_bin_type=True)
        while True:
            writer = self.writer if self.writer is not None and not self.writer.is_closing() else await self._connect()
            try:
                writer.write(_LEN.pack(len(data)) + data)
                await writer.drain()
                self.counters.sent += 1
                return
            except (ConnectionError, OSError):
                self.writer = None
                await asyncio.sleep(0.01)

    async def _read_credits(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                frame = await read_frame(reader)
                if frame is None:
                    break
                if frame[0] == "C":
                    q = self.credit_waiters.get(frame[1])
                    if q is not None:
                        q.credit(frame[2])
        except (ConnectionError, OSError, ValueError):
            pass
        finally:
            if self.writer is writer:
                self.writer = None


class RemoteQueue:
    """A bolt task of another worker, as a queue the outbox can put batches into."""

    def __init__(self, target: int, link: Link, hard_bound: int, encode: Callable[[list[Any]], list[Any]]) -> None:
        self.target = target
        self.link = link
        self.hard_bound = hard_bound
        self.bytes = 0           # in flight: sent, not yet credited (what water_level sees)
        self.count = 0
        self.peak_bytes = 0
        self._encode = encode
        self._pack = msgpack.Packer(autoreset=True, use_bin_type=True).pack
        self._waiters: deque[asyncio.Future[None]] = deque()
        link.credit_waiters[target] = self

    async def put(self, batch: list[Any], nbytes: int) -> int:
        return await self._send(batch, nbytes, self._encode(batch))

    async def put_packing(self, batch: list[Any]) -> int | None:
        """``put`` of a batch not sized yet: its values are packed once, for the size and for
        the wire (the outbox would pack them a second time to size them). None, and nothing
        sent, when a value cannot be encoded or the batch is over the bound: the outbox then
        sizes it (naming the culprit) or cuts it into pieces as for any queue."""
        try:
            groups, nbytes = TupleCodec.encode_sized(batch, self._pack)
        except (TypeError, ValueError, OverflowError):
            return None
        if nbytes > self.hard_bound:
            return None
        return await self._send(batch, nbytes, groups)

    async def _send(self, batch: list[Any], nbytes: int, groups: list[Any]) -> int:
        loop = asyncio.get_running_loop()
        start = loop.time()
        while not (self.bytes == 0 or self.bytes + nbytes <= self.hard_bound):
            fut = loop.create_future()
            self._waiters.append(fut)
            await fut
        self.bytes += nbytes
        self.peak_bytes = max(self.peak_bytes, self.bytes)
        await self.link.send(["B", self.target, nbytes, groups])
        return int((loop.time() - start) * 1e9)

    def credit(self, nbytes: int) -> None:
        self.bytes = max(0, self.bytes - nbytes)
        self._wake()

    def reset_credit(self) -> None:
        self.bytes = 0
        self._wake()

    def _wake(self) -> None:
        while self._waiters:
            f = self._waiters.popleft()
            if not f.done():
                f.set_result(None)

    def put_marker(self, marker: list[Any]) -> None:   # pragma: no cover - markers are local only
        raise RuntimeError("control markers never cross workers")


async def read_frame(reader: asyncio.StreamReader) -> list[Any] | None:
    try:
        head = await reader.readexactly(_LEN.size)
    except asyncio.IncompleteReadError:
        return None
    (n,) = _LEN.unpack(head)
    if n > MAX_FRAME:
        raise ValueError(f"frame of {n} bytes over the {MAX_FRAME} limit")
    return msgpack.unpackb(await reader.readexactly(n), raw=False, strict_map_key=False)


class TupleCodec:
    """WireTuples <-> plain lists for the wire; origins are rebuilt from the topology.

    A batch travels by columns, one group per run of tuples from the same origin (a lane
    holds one sending task's tuples, so usually one group): ``[component, stream, task,
    values, anchors, borns]``, with ``anchors`` and ``borns`` None when no tuple of the
    group is tracked. Both ways are C-level maps over the batch, no Python loop per tuple
    (an untracked one's ``born`` is 0.0, as its emit made it). Under batch granularity a
    group whose tuples all belong to one ack group carries that group's anchors, born and
    size once (``anchors`` is then a dict, not a list); otherwise a seventh column gives
    each tuple's ack group size (0 for a tuple with an edge of its own). A run emitted as
    ``Columns`` travels packed column by column (``{"columns": [bytes, ...]}``) and arrives
    as ``Columns``: no row is made on either side."""

    def __init__(self, streams: dict[str, dict[str, tuple[str, ...]]]) -> None:
        self._fields = {(c, s): FieldIndex.of(f) for c, outs in streams.items() for s, f in outs.items()}
        self._origins: dict[tuple[str, str, int], Origin] = {}
        # Ack groups (batch granularity) being received: the group's edge id -> [the one
        # AckGroup its tuples share here, how many of them arrived]; an entry goes once all
        # did (a group is complete before its first tuple leaves, so its size is known).
        self._groups: dict[int, list[Any]] = {}

    @staticmethod
    def encode(batch: list[Any]) -> list[Any]:
        return TupleCodec.encode_sized(batch)[0]

    @staticmethod
    def encode_sized(batch: list[Any], pack: Callable[[Any], bytes] | None = None) -> tuple[list[Any], int]:
        """The groups of ``batch`` and, with ``pack``, its wire size: each group's values are
        then packed here, once, and travel as those bytes (the size is what the outbox's
        ``batch_bytes`` gives: the values' encodings without the list headers)."""
        if type(batch) is TupleBatch and all(_one_group(r) for r in batch.runs):
            return TupleCodec._encode_runs(batch, pack)
        origins = list(map(_origin, batch))
        if origins.count(origins[0]) == len(origins):      # (identity first: one origin, C speed)
            runs = [(origins[0], batch)]
        else:
            runs, start = [], 0
            for i in range(1, len(batch) + 1):
                if i == len(batch) or origins[i] is not origins[start]:
                    runs.append((origins[start], batch[start:i]))
                    start = i
        groups = []
        nbytes = 0
        for o, part in (r for o, whole in runs for r in _by_ack_group(o, whole)):
            anchors = list(map(_anchors, part))
            tracked = any(anchors)
            values: Any = list(map(_values, part))
            if pack is not None:
                values = pack(values)
                nbytes += len(values) - array_header_len(len(part))
            group = [o.component, o.stream, o.task, values, None, None]
            if tracked:
                cells = list(map(_cell, part))
                first = cells[0]
                if first is not None and len(first) == GROUP_CELL and cells.count(first) == len(cells):
                    # Batch granularity, one ack group (the usual batch): its anchors, born
                    # and size once (its tuples share them).
                    group[4:] = [part[0].anchors, part[0].born, first[1]]
                else:
                    group[4:] = [anchors, list(map(_born, part))]
                    if any(c is not None and len(c) == GROUP_CELL for c in cells):
                        # Batch granularity: each tuple's group size (0: a tuple with its own edge).
                        group.append([c[1] if c is not None and len(c) == GROUP_CELL else 0 for c in cells])
            groups.append(group)
        return groups, nbytes

    @staticmethod
    def _encode_runs(batch: TupleBatch, pack: Callable[[Any], bytes] | None) -> tuple[list[Any], int]:
        """``encode_sized`` of a batch kept as runs, each untracked or of one ack group: a
        group per run, read off the run (no tuple objects)."""
        groups = []
        nbytes = 0
        for values, o, anchors, born, cell, _ in batch.runs:
            n = len(values)
            rows: Any = values
            if pack is None:
                rows = list(values) if type(values) is Columns else values
            elif type(values) is Columns:          # each column packed alone: {"columns": [bytes, ...]}
                cols = [pack(c) for c in values.columns]
                nbytes += columns_wire_bytes(cols, n)
                rows = {"columns": cols}
            else:
                rows = pack(rows)
                nbytes += len(rows) - array_header_len(n)
            group = [o.component, o.stream, o.task, rows, None, None]
            if anchors:
                group[4:] = [anchors, born, cell[1]]
            groups.append(group)
        return groups, nbytes

    def decode(self, groups: list[Any]) -> list[Any] | TupleBatch:
        """The batch sent: its untracked groups and those of one ack group as runs (a
        ``TupleBatch`` when there is nothing else), tuples made only for the others."""
        out: list[Any] = []
        runs = []
        n = 0
        for comp, stream, task, values, anchors, borns, *sizes in groups:
            if isinstance(values, bytes):            # packed by ``encode_sized``
                values = msgpack.unpackb(values, raw=False, strict_map_key=False)
            elif isinstance(values, dict):           # ... column by column (a run of ``Columns``)
                values = Columns(*[msgpack.unpackb(c, raw=False, strict_map_key=False) for c in values["columns"]])
            origin = self._origin(comp, stream, task)
            n += len(values)
            if anchors is None:
                runs.append([values, origin, None, 0.0, None, len(out)])
            elif isinstance(anchors, dict):          # one ack group: anchors, born, size once
                runs.append([values, origin, anchors, borns, self._arrived(anchors, sizes[0], len(values)), len(out)])
            else:
                cells = [[0] if a else None for a in anchors] if not sizes else self._cells(anchors, sizes[0])
                out += map(WireTuple, zip(values, repeat(origin), anchors, borns, cells))
        if not out:
            return TupleBatch(runs, n)
        return interleave(out, runs) if runs else out

    def _origin(self, comp: str, stream: str, task: int) -> Origin:
        key = (comp, stream, task)
        origin = self._origins.get(key)
        if origin is None:
            origin = self._origins[key] = Origin(self._fields[(comp, stream)], stream, comp, task)
        return origin

    def _arrived(self, anchors: dict[int, int], size: int, count: int) -> Any:
        """``count`` more tuples of the ack group with ``anchors`` (of ``size`` tuples in all)
        arrived: the one ``AckGroup`` its tuples share here (acked once the last is processed),
        across as many batches as the group came in."""
        edge = next(iter(anchors.values()))
        registry = self._groups
        entry = registry.get(edge)
        if entry is None:
            g = new_group(edge, size)
            entry = registry[edge] = [g, 0]
        entry[1] += count
        if entry[1] >= size:
            del registry[edge]
        return entry[0]

    def _cells(self, anchors: list[Any], sizes: list[int]) -> list[Any]:
        """Ack cells of received tuples, tuple by tuple (``_arrived`` for those of a group)."""
        return [self._arrived(a, size, 1) if size else [0] if a else None for a, size in zip(anchors, sizes)]


_origin, _anchors, _values, _born, _cell = (attrgetter(a) for a in ("origin", "anchors", "values", "born", "ackcell"))


def _by_ack_group(origin: Origin, part: list[Any]) -> list[tuple[Origin, list[Any]]]:
    """``part`` cut where its tuples' ack group changes, when every tuple belongs to an ack
    group (batch granularity): each piece then travels as one group (anchors, born and size
    once) and arrives as a run. A lane's batch often spans two groups (its task's input moved
    on to the next spout batch mid-batch), and sent whole it would travel tuple by tuple,
    each tuple's cell made again on the far side. Found by C-level maps."""
    first = part[0].ackcell if part else None
    if first is None or len(first) != GROUP_CELL:        # untracked, or an edge of its own: as it is
        return [(origin, part)]
    cells = list(map(_cell, part))
    if cells.count(first) == len(cells) or not all_in_groups(cells):
        return [(origin, part)]
    bounds = stretch_bounds(cells)
    return [(origin, part[a:b]) for a, b in zip(bounds, bounds[1:])]


def _one_group(run: list[Any]) -> bool:
    """Whether a run's tuples are untracked or share one ack group (batch granularity)."""
    return run[2] is None or (run[4] is not None and len(run[4]) == GROUP_CELL)


class AckForwarder:
    """Acks and fails for roots owned by other workers, batched per owner."""

    def __init__(self, links: dict[int, Link]) -> None:
        self.links = links
        self.acks: dict[int, list[list[int]]] = {}
        self.fails: dict[int, list[list[Any]]] = {}
        self._scheduled = False

    def ack(self, root: int, xor: int) -> None:
        self.acks.setdefault(owner_of(root), []).append([root, xor])
        self._schedule()

    def fail(self, root: int, reason: str) -> None:
        self.fails.setdefault(owner_of(root), []).append([root, reason[:200]])
        self._schedule()

    def _schedule(self) -> None:
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._scheduled = False
        acks, self.acks = self.acks, {}
        fails, self.fails = self.fails, {}
        loop = asyncio.get_running_loop()
        for owner, items in acks.items():
            loop.create_task(self.links[owner].send(["A", items]))
        for owner, items in fails.items():
            loop.create_task(self.links[owner].send(["F", items]))


class Listener:
    """This worker's socket: batches into local queues (credited once queued), acks into the acker."""

    def __init__(self, directory: str, worker: int, queues: dict[int, Any], codec: TupleCodec,
                 apply_ack: Callable[[int, int], None], apply_fail: Callable[[int, str], None],
                 counters: Counters) -> None:
        self.path = socket_path(directory, worker)
        self.queues = queues
        self.codec = codec
        self.apply_ack = apply_ack
        self.apply_fail = apply_fail
        self.counters = counters
        self.server: asyncio.base_events.Server | None = None
        self._conns: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        Path(self.path).unlink(missing_ok=True)
        self.server = await asyncio.start_unix_server(self._serve, self.path)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._conns.add(task)
        try:
            while True:
                frame = await read_frame(reader)
                if frame is None:
                    return
                kind = frame[0]
                if kind == "B":
                    _, target, nbytes, rows = frame
                    await self.queues[target].put(self.codec.decode(rows), nbytes)
                    self.counters.received += 1
                    writer.write(_credit(target, nbytes))
                elif kind == "A":
                    for root, xor in frame[1]:
                        self.apply_ack(root, xor)
                    self.counters.received += 1
                elif kind == "F":
                    for root, reason in frame[1]:
                        self.apply_fail(root, reason)
                    self.counters.received += 1
        except (ConnectionError, OSError, ValueError) as e:
            log.debug("connection from a peer ended: %s", e)
        except asyncio.CancelledError:
            pass      # this worker is closing its socket (asyncio's stream callback would log it)
        finally:
            writer.close()
            if task is not None:
                self._conns.discard(task)

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
        for t in list(self._conns):
            t.cancel()
        Path(self.path).unlink(missing_ok=True)


def _credit(target: int, nbytes: int) -> bytes:
    data = msgpack.packb(["C", target, nbytes])
    return _LEN.pack(len(data)) + data


class WorkerNetwork:
    """Everything one worker process needs to reach the others: links, codec, acks, counters."""

    def __init__(self, directory: str, worker: int, owner: dict[int, int], workers: int,
                 streams: dict[str, dict[str, tuple[str, ...]]]) -> None:
        self.directory = directory
        self.worker = worker
        self.owner = owner
        self.counters = Counters()
        self.links = {w: Link(directory, w, self.counters) for w in range(workers) if w != worker}
        self.codec = TupleCodec(streams)
        self.forwarder = AckForwarder(self.links)
        self.finish: asyncio.Event | None = None    # set when the supervisor says the run is over
        self.drained = True                          # ... and whether everything was processed
        self.listener: Listener | None = None

    def local(self, task_id: int) -> bool:
        return self.owner[task_id] == self.worker

    def remote_queue(self, task_id: int, hard_bound: int) -> RemoteQueue:
        return RemoteQueue(task_id, self.links[self.owner[task_id]], hard_bound, self.codec.encode)

    async def start(self, queues: dict[int, Any], apply_ack: Callable[[int, int], None],
                    apply_fail: Callable[[int, str], None]) -> None:
        self.finish = asyncio.Event()
        self.listener = Listener(self.directory, self.worker, queues, self.codec, apply_ack, apply_fail,
                                 self.counters)
        await self.listener.start()

    async def close(self) -> None:
        if self.listener is not None:
            await self.listener.close()
        for link in self.links.values():
            if link.writer is not None:
                link.writer.close()
