"""Routing and batching of one task's emits.

``emit`` is synchronous and cheap: it sizes the tuple (its msgpack encoding is its
wire size), asks each subscribed edge's router for the target task, and appends to
that target's pending batch. ``flush`` moves pending batches into the targets'
byte-bounded queues, waiting where a queue is full. Batches travel between tasks
(Storm 2's batching) because a queue hop costs about as much as a small tuple's
whole processing; spouts and bolts still see one tuple at a time.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Sequence

import msgpack

from topo.api import FieldIndex, Tuple
from topo.groupings import Router
from runtime.local.queue import ByteQueue


class TupleEncodingError(TypeError):
    """An emitted value has no msgpack encoding (the wire format between tasks)."""


class UnknownStreamError(ValueError):
    """An emit on a stream the component did not declare, or with the wrong arity."""


@dataclass
class StreamRoutes:
    """Everything ``emit`` needs for one declared stream of the emitting component."""

    fields: FieldIndex
    routers: list[Router]


class Outbox:
    """Pending batches of one task, keyed by target task id."""

    def __init__(self, component: str, task_id: int, streams: dict[str, StreamRoutes],
                 queues: dict[int, ByteQueue], batch_size: int, flush_interval_s: float) -> None:
        self.component = component
        self.task_id = task_id
        self.streams = streams
        self.queues = queues
        self.batch_size = batch_size
        self.flush_interval_s = flush_interval_s
        self.pending: dict[int, list[Tuple]] = {}
        self.pending_bytes: dict[int, int] = {}
        self.pending_count = 0
        self.first_pending_at = 0.0
        self._pack = msgpack.Packer(autoreset=True).pack

    def size_of(self, values: Sequence[Any], stream: str) -> int:
        """Wire size of ``values``; a clear error naming component and field if unencodable."""
        try:
            return len(self._pack(values))
        except (TypeError, ValueError, OverflowError) as e:
            names = self.streams[stream].fields.names
            for name, v in zip(names, values):
                try:
                    self._pack(v)
                except (TypeError, ValueError, OverflowError):
                    raise TupleEncodingError(
                        f"component {self.component!r} (task {self.task_id}) emitted on stream "
                        f"{stream!r} a value for field {name!r} that msgpack cannot encode: "
                        f"{type(v).__name__} {v!r:.80}") from None
            raise TupleEncodingError(f"component {self.component!r}: cannot encode {values!r:.80}: {e}") from None

    def routes(self, stream: str, values: Sequence[Any]) -> StreamRoutes:
        r = self.streams.get(stream)
        if r is None:
            raise UnknownStreamError(
                f"component {self.component!r} emitted on stream {stream!r}, which it does not declare "
                f"(declared: {sorted(self.streams)})")
        if len(values) != len(r.fields.names):
            raise UnknownStreamError(
                f"component {self.component!r} emitted {len(values)} values on stream {stream!r}, "
                f"which declares {len(r.fields.names)} fields {list(r.fields.names)}")
        return r

    def push(self, target: int, tup: Tuple, size: int) -> None:
        batch = self.pending.get(target)
        if batch is None:
            self.pending[target] = [tup]
            self.pending_bytes[target] = size
            if self.pending_count == 0:
                self.first_pending_at = time.monotonic()
        else:
            batch.append(tup)
            self.pending_bytes[target] += size
        self.pending_count += 1

    def due(self) -> bool:
        """Whether the pending batches should go now (full, or waited past the interval)."""
        n = self.pending_count
        return n >= self.batch_size or (n > 0 and time.monotonic() - self.first_pending_at >= self.flush_interval_s)

    async def flush(self) -> int:
        """Send every pending batch; returns nanoseconds spent waiting for queue room."""
        if not self.pending_count:
            return 0
        pending, sizes = self.pending, self.pending_bytes
        self.pending, self.pending_bytes, self.pending_count = {}, {}, 0
        waited = 0
        queues = self.queues
        for target, batch in pending.items():
            waited += await queues[target].put(batch, sizes[target])
        return waited
