"""A Redis Streams spout reading through a consumer group (local engine).

```python
from topo.sources.redis_streams import RedisStreamSpout
clicks = RedisStreamSpout("redis://127.0.0.1:6379/0", stream="clicks", group="topo",
                          fields=["ts", "user", "type"])
```

Each task is one consumer of ``group`` (named ``{topology}-{component}-{task index}``
unless ``consumer`` is given, so a restarted task is the same consumer); Redis spreads
the entries over the consumers. The group is created at ``start_id`` (``"0"``: the whole
stream; ``"$"``: only new entries) when it does not exist, and the stream with it.

**Delivery: at-least-once.** An entry is read with ``XREADGROUP`` (at most ``count`` per
call, blocking at most ``block_ms``) and stays in the group's pending entries list until
it is acknowledged with ``XACK``. Without checkpoints that is when its tuple tree is
acked (with acking off: as soon as it is emitted). With checkpoints on
(``checkpoint.interval_ms``) it is when a checkpoint that covers it is durable: the ids
read since the last durable checkpoint are the spout's checkpointed state, and a restore
acknowledges the ones its checkpoint covers instead of emitting them again. At start a
task first replays its own pending entries (read before a crash, never acknowledged),
then reads new ones; every ``claim_interval_s`` it also claims with ``XAUTOCLAIM`` the
entries another consumer left pending for ``claim_idle_ms`` (a consumer that is gone).
An entry dead-lettered by the engine stays pending, so it is replayed at the next start.

**Values.** Each of ``fields`` is an entry field; ``values="json"`` (the default, what
``topo.sinks.RedisStreamSink`` writes) parses each value as JSON, ``"text"`` keeps the
string. ``id_field`` adds the entry id to the tuple. An entry without one of ``fields``
or with a value that does not parse stops the spout with one line naming the stream,
the entry id and the field (``on_error="skip"`` acknowledges and counts it instead).
"""
from __future__ import annotations

import asyncio
import json
import time
from typing import Any, Callable, Sequence
from urllib.parse import urlparse

from topo.api import Spout, SpoutOutputCollector, TaskContext

DEFAULT_URL = "redis://127.0.0.1:6379/0"


def connect(url: str, owner: str) -> Any:
    """A client for ``url`` (strings decoded), checked with a PING; a failure is one line
    naming host, port and database, never the password."""
    import redis

    try:
        client = redis.Redis.from_url(url, decode_responses=True, socket_connect_timeout=5)
        client.ping()
        return client
    except (redis.RedisError, ValueError) as e:
        reason = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
        password = urlparse(url).password
        if password:
            reason = reason.replace(password, "***")
        raise ConnectionError(f"{owner}: cannot connect to Redis at {_where(url)}: {reason}") from None


def _where(url: str) -> str:
    try:
        u = urlparse(url)
        return f"host {u.hostname or '127.0.0.1'} port {u.port or 6379} db {(u.path or '/0').lstrip('/') or '0'}"
    except ValueError:
        return "the URL given (it does not parse; it is not shown)"


def _id_key(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


class RedisStreamSpout(Spout):
    """Entries of a Redis stream through a consumer group; see the module docstring."""

    def __init__(self, url: str = DEFAULT_URL, *, stream: str, group: str, fields: Sequence[str],
                 consumer: str | None = None, start_id: str = "0", values: str = "json",
                 id_field: str | None = None, count: int = 256, block_ms: int = 100,
                 claim_idle_ms: int = 60_000, claim_interval_s: float = 5.0, on_error: str = "raise",
                 clock: Callable[[], float] | None = None) -> None:
        if not isinstance(stream, str) or not stream:
            raise ValueError(f"RedisStreamSpout: stream must be a key name, got {stream!r}")
        if not isinstance(group, str) or not group:
            raise ValueError(f"RedisStreamSpout: group must be a name, got {group!r}")
        names = isinstance(fields, (list, tuple)) and all(isinstance(f, str) for f in fields)
        self.fields = list(fields) if names else []
        if not self.fields or len(set(self.fields)) != len(self.fields):
            raise ValueError(f"RedisStreamSpout: fields must be a list of distinct names, got {fields!r}")
        if values not in ("json", "text"):
            raise ValueError(f"RedisStreamSpout: values must be 'json' or 'text', got {values!r}")
        if on_error not in ("raise", "skip"):
            raise ValueError(f"RedisStreamSpout: on_error must be 'raise' or 'skip', got {on_error!r}")
        for name, v, low in (("count", count, 1), ("block_ms", block_ms, 1), ("claim_idle_ms", claim_idle_ms, 0)):
            if not isinstance(v, int) or isinstance(v, bool) or v < low:
                raise ValueError(f"RedisStreamSpout: {name} must be an integer >= {low}, got {v!r}")
        if id_field is not None and id_field in self.fields:
            raise ValueError(f"RedisStreamSpout: id_field {id_field!r} is also one of fields")
        self.url = url
        self.stream = stream
        self.group = group
        self.consumer = consumer
        self.start_id = start_id
        self.values = values
        self.id_field = id_field
        self.count = count
        self.block_ms = block_ms
        self.claim_idle_ms = claim_idle_ms
        self.claim_interval_s = claim_interval_s
        self.on_error = on_error
        self.clock = clock or time.monotonic
        self.outputs = [*self.fields, *([id_field] if id_field else [])]
        self.skipped = 0
        self._client: Any = None

    def __repr__(self) -> str:          # never the URL: it may hold a password
        return f"RedisStreamSpout(stream={self.stream!r}, group={self.group!r}, fields={self.fields})"

    # -- lifecycle -----------------------------------------------------------------------
    def open(self, context: TaskContext, collector: SpoutOutputCollector) -> None:
        import redis

        super().open(context, collector)
        self._client = connect(self.url, "RedisStreamSpout")
        self._name = self.consumer or f"{context.topology}-{context.component}-{context.task_index}"
        self._checkpointing = context.config.get("checkpoint.interval_ms") is not None
        try:
            self._client.xgroup_create(self.stream, self.group, id=self.start_id, mkstream=True)
        except redis.ResponseError as e:
            if "BUSYGROUP" not in str(e):
                raise ValueError(f"RedisStreamSpout: cannot create group {self.group!r} on stream "
                                 f"{self.stream!r} at start_id {self.start_id!r}: {e}") from None
        self._pending_cursor: str | None = "0"   # replaying our own pending entries; None: done
        self._to_ack: list[str] = []             # acknowledged here, not yet sent with XACK
        self._since: list[str] = []              # with checkpoints: emitted since the last snapshot
        self._sealed: list[str] = []             # ... and in snapshots not yet durable
        self._covered: set[str] = set()          # restored: in the checkpoint, acknowledge, do not emit
        self._claim_cursor = "0-0"
        self._next_claim = self.clock() + self.claim_interval_s

    async def next_tuple(self) -> None:
        self._send_acks()
        if self._pending_cursor is not None:
            entries = self._client.xreadgroup(self.group, self._name, {self.stream: self._pending_cursor},
                                              count=self.count)
            batch = entries[0][1] if entries else []
            if not batch:
                self._pending_cursor = None
            else:
                self._pending_cursor = batch[-1][0]
                self._emit_all(batch)
                return
        if self.clock() >= self._next_claim:
            self._next_claim = self.clock() + self.claim_interval_s
            if self._claim():
                return
        entries = await asyncio.to_thread(self._client.xreadgroup, self.group, self._name, {self.stream: ">"},
                                          count=self.count, block=self.block_ms)
        if entries:
            self._emit_all(entries[0][1])

    def _claim(self) -> bool:
        """Take over entries another consumer left pending for ``claim_idle_ms``."""
        reply = self._client.xautoclaim(self.stream, self.group, self._name, self.claim_idle_ms,
                                        start_id=self._claim_cursor, count=self.count)
        self._claim_cursor = reply[0]
        claimed = [e for e in reply[1] if e and e[0] is not None]
        self._emit_all(claimed)
        return bool(claimed)

    def _emit_all(self, batch: Sequence[Any]) -> None:
        emit = self.collector.emit
        for entry_id, data in batch:
            if entry_id in self._covered:          # its effects are in the restored checkpoint
                self._covered.discard(entry_id)
                self._to_ack.append(entry_id)
                continue
            if not data:                           # deleted or trimmed since it was read
                self._to_ack.append(entry_id)
                continue
            values = self._decode(entry_id, data)
            if values is None:
                self._to_ack.append(entry_id)
                continue
            if self.id_field:
                values.append(entry_id)
            emit(values, msg_id=entry_id)
            if self._checkpointing:
                self._since.append(entry_id)

    def _decode(self, entry_id: str, data: dict[str, str]) -> list[Any] | None:
        out = []
        for f in self.fields:
            raw = data.get(f)
            try:
                if raw is None:
                    raise ValueError("the entry has no such field")
                out.append(json.loads(raw) if self.values == "json" else raw)
            except ValueError as e:
                if self.on_error == "skip":
                    self.skipped += 1
                    return None
                raise ValueError(f"RedisStreamSpout: stream {self.stream!r} entry {entry_id} field {f!r}: "
                                 f"{e} (value {raw!r:.60})") from None
        return out

    def ack(self, msg_id: Any) -> None:
        if not self._checkpointing:     # with checkpoints: when a checkpoint covering it is durable
            self._to_ack.append(msg_id)

    def _send_acks(self) -> None:
        if self._to_ack:
            ids, self._to_ack = self._to_ack, []
            self._client.xack(self.stream, self.group, *ids)

    # -- checkpoints ---------------------------------------------------------------------
    def snapshot_state(self) -> Any:
        """The ids read and not yet acknowledged that this checkpoint covers."""
        self._sealed.extend(self._since)
        self._since = []
        return {"ids": list(self._sealed)}

    def restore_state(self, state: Any) -> None:
        self._covered = set(state["ids"])
        # acknowledged now if already redelivered elsewhere; otherwise when replay reaches them
        self._sealed = []

    def checkpoint_complete(self, checkpoint_id: int) -> None:
        if self._sealed and self._client is not None:
            self._client.xack(self.stream, self.group, *self._sealed)
            self._sealed = []

    def close(self) -> None:
        if self._client is not None:
            try:
                self._send_acks()
            finally:
                self._client.close()
                self._client = None


__all__ = ["RedisStreamSpout", "connect", "DEFAULT_URL"]
