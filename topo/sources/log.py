"""A partitioned message log (document 001, step 1), with two backends.

Producers pick the partition as the document says: ``partNum = MD5(key) mod
numPartitions``, the MD5 digest read as a big-endian integer; a record without a key
gets a random one for the hash (its stored key stays ``None``), which spreads keyless
records evenly. Every partition holds records at contiguous integer offsets from 0.

Backends, chosen by URL in ``open_log``:

* ``file:///dir`` or a plain path: **embedded, file-backed** (the default). A topic is a
  directory with ``meta.json`` (partition count) and per partition a data file of
  msgpack records ``[key, value, timestamp]`` and an index file of 8-byte little-endian
  end positions, one per record. An append writes the record, then its index entry,
  under an exclusive ``flock`` of the index file, so several producer processes can
  share a topic and a reader never sees an index entry before its data. The offset
  count is the index size / 8, so ``latest`` is one ``stat``.
* ``redis://127.0.0.1:port/db``: **Redis Streams**. One stream per partition, key
  ``{prefix}:{topic}:{partition}``; records are added with id ``0-*`` so Redis assigns
  ``0-1, 0-2, ...``: offset ``n`` is id ``0-(n+1)``, contiguous and atomic without a
  script. Needs Redis >= 7.0. Reads use ``XRANGE ... COUNT`` in chunks of at most
  ``chunk`` entries, so no reply is unbounded.

Both are picklable descriptions: connections and file handles are opened lazily in
whichever process reads, and dropped on pickling.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import random
import struct
import time
from pathlib import Path
from typing import Any, Iterator, Protocol, Sequence
from urllib.parse import urlparse

import msgpack

from topo.sources.base import check_range

LOG_COLUMNS: tuple[str, ...] = ("partition", "offset", "key", "value", "timestamp")
_IDX = struct.Struct("<Q")
DEFAULT_CHUNK = 4096
MAX_RECORD_BYTES = 16 * 1024 * 1024


def partition_for(key: Any, num_partitions: int, rng: random.Random | None = None) -> int:
    """``MD5(key) mod numPartitions``; ``None`` keys hash a random key instead."""
    if num_partitions < 1:
        raise ValueError("num_partitions must be >= 1")
    if key is None:
        key = (rng or random.SystemRandom()).getrandbits(64).to_bytes(8, "big")
    if isinstance(key, str):
        data = key.encode("utf-8")
    elif isinstance(key, bytes):
        data = key
    else:
        data = msgpack.packb(key)
    return int.from_bytes(hashlib.md5(data).digest(), "big") % num_partitions


def pack_record(value: Any, key: Any, timestamp: float | None) -> bytes:
    """The stored form of one record, ``[key, value, timestamp]`` in msgpack, size-checked."""
    record = msgpack.packb([key, value, time.time() if timestamp is None else timestamp])
    if len(record) > MAX_RECORD_BYTES:
        raise ValueError(f"record of {len(record)} bytes is over the {MAX_RECORD_BYTES} byte limit")
    return record


class MessageLog(Protocol):
    """One topic of a partitioned log: produce by key, read by offset."""

    columns: tuple[str, ...]

    def num_partitions(self) -> int: ...

    def produce(self, value: Any, key: Any = None, timestamp: float | None = None) -> tuple[int, int]:
        """Append one record; returns ``(partition, offset)``."""
        ...

    def latest(self) -> dict[int, int]: ...

    def read(self, partition: int, start: int, end: int) -> Iterator[tuple[Any, ...]]: ...

    def describe(self) -> str: ...

    def close(self) -> None: ...


class FileLog:
    """Embedded file-backed topic (see the module docstring for the layout)."""

    columns = LOG_COLUMNS

    def __init__(self, root: str | os.PathLike[str], topic: str, partitions: int | None = None,
                 *, chunk: int = DEFAULT_CHUNK) -> None:
        if not topic or "/" in topic or topic.startswith("."):
            raise ValueError(f"bad topic name {topic!r}")
        self.root = str(root)
        self.topic = topic
        self.chunk = chunk
        self._dir = Path(self.root) / topic
        self._partitions = self._init_meta(partitions)
        self._rng = random.Random()

    def _init_meta(self, partitions: int | None) -> int:
        meta = self._dir / "meta.json"
        if meta.exists():
            have = int(json.loads(meta.read_text())["partitions"])
            if partitions is not None and partitions != have:
                raise ValueError(f"topic {self.topic!r} at {self._dir} has {have} partitions, not {partitions}")
            return have
        if partitions is None:
            raise FileNotFoundError(f"no topic {self.topic!r} under {self.root} (give partitions= to create it)")
        if partitions < 1:
            raise ValueError("partitions must be >= 1")
        self._dir.mkdir(parents=True, exist_ok=True)
        tmp = self._dir / f".meta.{os.getpid()}.tmp"
        tmp.write_text(json.dumps({"partitions": partitions}))
        try:
            os.link(tmp, meta)  # first creator wins; others read its count
        except FileExistsError:
            pass
        finally:
            tmp.unlink()
        return self._init_meta(partitions)

    def __getstate__(self) -> dict[str, Any]:
        return {"root": self.root, "topic": self.topic, "chunk": self.chunk, "partitions": self._partitions}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.root, self.topic, self.chunk = state["root"], state["topic"], state["chunk"]
        self._dir = Path(self.root) / self.topic
        self._partitions = state["partitions"]
        self._rng = random.Random()

    def describe(self) -> str:
        return f"file log {self._dir} ({self._partitions} partitions)"

    def num_partitions(self) -> int:
        return self._partitions

    def _paths(self, partition: int) -> tuple[Path, Path]:
        return self._dir / f"{partition}.log", self._dir / f"{partition}.idx"

    def produce(self, value: Any, key: Any = None, timestamp: float | None = None) -> tuple[int, int]:
        return self.produce_to(partition_for(key, self._partitions, self._rng), value, key, timestamp)

    def produce_to(self, partition: int, value: Any, key: Any = None, timestamp: float | None = None) -> tuple[int, int]:
        """Append to a given partition (the producer already chose it)."""
        check_range(partition, 0, 0, self._partitions)
        record = pack_record(value, key, timestamp)
        data_path, idx_path = self._paths(partition)
        idx_fd = os.open(idx_path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            fcntl.flock(idx_fd, fcntl.LOCK_EX)
            data_fd = os.open(data_path, os.O_WRONLY | os.O_CREAT, 0o644)
            try:
                size = os.fstat(idx_fd).st_size
                offset = size // _IDX.size
                pos = self._end_position(idx_fd, offset)
                # Bytes after the last indexed record (a crashed append) are overwritten.
                os.pwrite(data_fd, record, pos)
                os.write(idx_fd, _IDX.pack(pos + len(record)))
            finally:
                os.close(data_fd)
        finally:
            os.close(idx_fd)
        return partition, offset

    @staticmethod
    def _end_position(idx_fd: int, count: int) -> int:
        if count == 0:
            return 0
        return _IDX.unpack(os.pread(idx_fd, _IDX.size, (count - 1) * _IDX.size))[0]

    def latest(self) -> dict[int, int]:
        out = {}
        for p in range(self._partitions):
            try:
                out[p] = os.stat(self._paths(p)[1]).st_size // _IDX.size
            except FileNotFoundError:
                out[p] = 0
        return out

    def read(self, partition: int, start: int, end: int) -> Iterator[tuple[Any, ...]]:
        check_range(partition, start, end, self._partitions)
        if end == start:
            return
        data_path, idx_path = self._paths(partition)
        with open(idx_path, "rb") as idx, open(data_path, "rb") as data:
            have = os.fstat(idx.fileno()).st_size // _IDX.size
            end = min(end, have)
            offset = start
            while offset < end:
                stop = min(end, offset + self.chunk)
                begin = 0 if offset == 0 else _IDX.unpack(os.pread(idx.fileno(), _IDX.size, (offset - 1) * _IDX.size))[0]
                raw = os.pread(idx.fileno(), (stop - offset) * _IDX.size, offset * _IDX.size)
                ends = [e for (e,) in _IDX.iter_unpack(raw)]
                data.seek(begin)
                blob = data.read(ends[-1] - begin)
                unpacker = msgpack.Unpacker(raw=False, max_buffer_size=max(len(blob), 1))
                unpacker.feed(blob)
                for i, (key, value, ts) in enumerate(unpacker):
                    yield (partition, offset + i, key, value, ts)
                offset = stop

    def close(self) -> None:
        return None


class RedisLog:
    """A topic on Redis Streams (see the module docstring)."""

    columns = LOG_COLUMNS

    def __init__(self, url: str, topic: str, partitions: int | None = None, *,
                 prefix: str = "topo", chunk: int = DEFAULT_CHUNK, socket_timeout: float = 10.0) -> None:
        parsed = urlparse(url)
        if parsed.scheme != "redis":
            raise ValueError(f"expected a redis:// URL, got {url!r}")
        self.url = url
        self.topic = topic
        self.prefix = prefix
        self.chunk = chunk
        self.socket_timeout = socket_timeout
        self._client: Any = None
        self._rng = random.Random()
        self._partitions = self._init_meta(partitions)

    def __getstate__(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in ("url", "topic", "prefix", "chunk", "socket_timeout", "_partitions")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._client = None
        self._rng = random.Random()

    @property
    def client(self) -> Any:
        if self._client is None:
            import redis

            self._client = redis.Redis.from_url(self.url, socket_timeout=self.socket_timeout,
                                                socket_connect_timeout=self.socket_timeout)
        return self._client

    def _meta_key(self) -> str:
        return f"{self.prefix}:{self.topic}:meta"

    def _stream(self, partition: int) -> str:
        return f"{self.prefix}:{self.topic}:{partition}"

    def _init_meta(self, partitions: int | None) -> int:
        if partitions is not None:
            if partitions < 1:
                raise ValueError("partitions must be >= 1")
            self.client.hsetnx(self._meta_key(), "partitions", partitions)
        raw = self.client.hget(self._meta_key(), "partitions")
        if raw is None:
            raise LookupError(f"no topic {self.topic!r} on {self.url} (give partitions= to create it)")
        have = int(raw)
        if partitions is not None and partitions != have:
            raise ValueError(f"topic {self.topic!r} on {self.url} has {have} partitions, not {partitions}")
        return have

    def describe(self) -> str:
        return f"redis log {self.url} {self.prefix}:{self.topic} ({self._partitions} partitions)"

    def num_partitions(self) -> int:
        return self._partitions

    def produce(self, value: Any, key: Any = None, timestamp: float | None = None) -> tuple[int, int]:
        return self.produce_to(partition_for(key, self._partitions, self._rng), value, key, timestamp)

    def produce_to(self, partition: int, value: Any, key: Any = None, timestamp: float | None = None) -> tuple[int, int]:
        check_range(partition, 0, 0, self._partitions)
        record = pack_record(value, key, timestamp)
        entry_id = self.client.xadd(self._stream(partition), {"r": record}, id="0-*")
        seq = int(entry_id.split(b"-")[1])
        return partition, seq - 1

    def latest(self) -> dict[int, int]:
        pipe = self.client.pipeline(transaction=False)
        for p in range(self._partitions):
            pipe.xrevrange(self._stream(p), "+", "-", count=1)
        out = {}
        for p, last in enumerate(pipe.execute()):
            out[p] = int(last[0][0].split(b"-")[1]) if last else 0
        return out

    def read(self, partition: int, start: int, end: int) -> Iterator[tuple[Any, ...]]:
        check_range(partition, start, end, self._partitions)
        offset = start
        stream = self._stream(partition)
        while offset < end:
            n = min(self.chunk, end - offset)
            entries = self.client.xrange(stream, f"0-{offset + 1}", f"0-{offset + n}", count=n)
            if not entries:
                return
            for entry_id, fields in entries:
                key, value, ts = msgpack.unpackb(fields[b"r"], raw=False)
                yield (partition, int(entry_id.split(b"-")[1]) - 1, key, value, ts)
            offset += len(entries)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


def open_log(url: str, topic: str, partitions: int | None = None, **kwargs: Any) -> FileLog | RedisLog:
    """``file:///dir``, a plain directory path, or ``redis://host:port/db``."""
    parsed = urlparse(url)
    if parsed.scheme == "redis":
        return RedisLog(url, topic, partitions, **kwargs)
    if parsed.scheme == "file":
        return FileLog(parsed.path, topic, partitions, **kwargs)
    if parsed.scheme in ("", None) or len(parsed.scheme) == 1:  # plain or Windows-ish path
        return FileLog(url, topic, partitions, **kwargs)
    raise ValueError(f"unknown message log URL {url!r}: use file:///dir, a path, or redis://host:port/db")


def produce_all(log: MessageLog, records: Sequence[Any], keys: Sequence[Any] | None = None) -> list[tuple[int, int]]:
    """Append ``records`` (with ``keys`` when given); returns where each landed."""
    if keys is not None and len(keys) != len(records):
        raise ValueError("records and keys differ in length")
    return [log.produce(v, None if keys is None else keys[i]) for i, v in enumerate(records)]


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m topo.sources.log LOG TOPIC [--partitions N] [--key-field K]``: produce
    the lines of stdin (one record each; ``--tab-key`` takes the key before a tab)."""
    import argparse
    import sys

    p = argparse.ArgumentParser(description="append stdin's lines to a message log topic")
    p.add_argument("log", help="file:///dir, a directory, or redis://127.0.0.1:port/db")
    p.add_argument("topic")
    p.add_argument("--partitions", type=int, default=None, help="create the topic with this many partitions")
    p.add_argument("--tab-key", action="store_true", help="each line is KEY<TAB>VALUE")
    a = p.parse_args(argv)
    log = open_log(a.log, a.topic, a.partitions)
    n = 0
    try:
        for line in sys.stdin:
            line = line.rstrip("\n")
            key, value = line.split("\t", 1) if a.tab_key and "\t" in line else (None, line)
            log.produce(value, key=key)
            n += 1
    finally:
        log.close()
    print(f"{n} records -> {log.describe()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
