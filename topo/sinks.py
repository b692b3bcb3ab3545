"""Sink bolts: databases, files, stdout and Redis Streams.

``SQLiteSink`` and ``PostgresSink`` upsert each tuple as a row keyed by ``key_fields``:
a replayed tuple rewrites the same row with the same values instead of adding one, so
at-least-once delivery does not double-count. Rows are buffered and written in one
transaction per flush; the input tuples are acked only after their transaction commits,
so a crash before the commit leaves them unacked and they are replayed.

With checkpoints on (``checkpoint.interval_ms``) a sink writes nothing on its own:
the rows it receives between two checkpoints are part of its checkpointed state, and
when a checkpoint is durable they are written in one transaction together with a
marker row ``(sink, checkpoint id)`` in ``_topo_commits`` (in the same database); a
checkpoint whose marker is already there is not written again. After any crash and
restart the table holds exactly what a crash-free run writes.

``JsonLinesSink`` and ``CsvSink`` append one line per tuple to a file. Without
checkpoints they write every ``flush_rows`` tuples, every ``flush_interval_s`` and at the
end, and ack after the write: at-least-once (a crash between a write and its acks
replays those tuples, whose lines are then written twice). With checkpoints they write
a checkpoint's lines when it is durable and keep in the checkpoint the file's length
before them; a restore truncates the file to that length and the lines are written
again, so after any crash the file holds exactly what a crash-free run writes.

``StdoutSink`` prints one JSON object per tuple (at-least-once: what is printed cannot
be taken back). ``RedisStreamSink`` adds one entry per tuple to a Redis stream with
``XADD`` (pipelined per flush, acked after the pipeline): at-least-once, with or without
checkpoints (a replayed tuple is added again).

Every sink declares the fields it reads (``input_fields``), so a topology whose input
stream lacks one is refused at validation in one line naming the sink and the field.
"""
from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import re
import sqlite3
import sys
import time
import zlib
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

from topo.api import Bolt, TaskContext, Tuple

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _ident(kind: str, name: str, owner: str = "SQLiteSink") -> str:
    if not _IDENT.match(name):
        raise ValueError(f"{owner}: {kind} {name!r} is not a plain SQL identifier")
    return f'"{name}"'


class _UpsertSink(Bolt):
    """What the database sinks share: keyed upserts, acks after the commit, and the
    checkpoint protocol (sealed rows plus a marker row, in one transaction, once).

    A subclass opens the connection (``_connect``), names its placeholder (``_mark``)
    and gives a cursor inside one transaction (``_transaction``)."""

    auto_ack = False
    tick_interval_s = 0.25
    _mark = "?"

    def __init__(self, table: str, fields: Sequence[str], key_fields: Sequence[str],
                 flush_rows: int, flush_interval_s: float) -> None:
        owner = type(self).__name__
        self.table = table
        self.fields = list(fields)
        self.key_fields = list(key_fields)
        if not self.key_fields or any(k not in self.fields for k in self.key_fields):
            raise ValueError(f"{owner}: key_fields {self.key_fields} must be a non-empty subset of fields {self.fields}")
        for f in self.fields:
            _ident("field", f, owner)
        self.input_fields = tuple(self.fields)   # checked against its input streams at validation
        _ident("table", table, owner)
        self.flush_rows = flush_rows
        self.flush_interval_s = flush_interval_s
        self.tick_interval_s = flush_interval_s
        self._conn: Any = None
        self._rows: dict[tuple[Any, ...], tuple[Any, ...]] = {}
        self._tuples: list[Tuple] = []
        self._last_flush = 0.0
        self._checkpointing = False
        self._sealed: list[list[Any]] = []     # rows of checkpoints not yet committed here
        self._sink_id = ""
        self._table_ready = False

    def _q(self, kind: str, name: str) -> str:
        return _ident(kind, name, type(self).__name__)

    # -- what a database provides ----------------------------------------------------------
    def _connect(self) -> Any:
        raise NotImplementedError

    def _create_table(self, cur: Any, sample: Sequence[Any] | None) -> bool:
        """Make sure ``table`` exists: in ``prepare`` (``sample`` None) and, until this
        returns True, before the first write (``sample`` is a row of it). True once it does."""
        raise NotImplementedError

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[Any]:
        raise NotImplementedError
        yield

    # -- shared ----------------------------------------------------------------------------
    def prepare(self, context: TaskContext, collector: Any) -> None:
        super().prepare(context, collector)
        self._conn = self._connect()
        cols = ", ".join(self._q("field", f) for f in self.fields)
        keys = ", ".join(self._q("field", k) for k in self.key_fields)
        updates = ", ".join(f"{self._q('field', f)}=excluded.{self._q('field', f)}"
                            for f in self.fields if f not in self.key_fields)
        marks = ", ".join(self._mark for _ in self.fields)
        self._sql = (f"INSERT INTO {self._q('table', self.table)} ({cols}) VALUES ({marks}) "
                     f"ON CONFLICT ({keys}) DO " + (f"UPDATE SET {updates}" if updates else "NOTHING"))
        self._key_pos = [self.fields.index(k) for k in self.key_fields]
        self._last_flush = time.monotonic()
        self._checkpointing = context.config.get("checkpoint.interval_ms") is not None
        with self._transaction() as cur:
            self._table_ready = self._create_table(cur, None)
            if self._checkpointing:
                cur.execute("CREATE TABLE IF NOT EXISTS _topo_commits (sink TEXT, checkpoint BIGINT, "
                            "PRIMARY KEY (sink, checkpoint))")
        if self._checkpointing:
            self._sink_id = f"{context.topology}/{context.component}/{context.task_index}/{self.table}"

    def execute(self, tup: Tuple) -> None:
        row = tuple(tup[f] for f in self.fields)
        self._rows[tuple(row[i] for i in self._key_pos)] = row  # last value per key wins
        if self._checkpointing:     # the row is state now: written when its checkpoint completes
            self.collector.ack(tup)
            return
        self._tuples.append(tup)
        if len(self._tuples) >= self.flush_rows:
            self.flush()

    def tick(self) -> None:
        if self._tuples and time.monotonic() - self._last_flush >= self.flush_interval_s:
            self.flush()

    # -- with checkpoints: each checkpoint's rows in one transaction, once -------------------
    def snapshot_state(self) -> Any:
        """Seal the rows received since the last checkpoint; they are this checkpoint's output."""
        if self._rows:
            self._sealed.append([list(r) for r in self._rows.values()])
            self._rows.clear()
        return {"sealed": self._sealed}

    def restore_state(self, state: Any) -> None:
        self._sealed = list(state["sealed"])

    def checkpoint_complete(self, checkpoint_id: int) -> None:
        """Write the sealed rows with a marker row for ``checkpoint_id`` in one transaction,
        unless the marker is there already (this checkpoint's output was committed before
        a crash): so after any crash the table is what a crash-free run writes."""
        if not self._checkpointing or self._conn is None:
            return
        m = self._mark
        with self._transaction() as cur:
            done = cur.execute(f"SELECT 1 FROM _topo_commits WHERE sink = {m} AND checkpoint = {m}",
                               (self._sink_id, checkpoint_id)).fetchone()
            if not done:
                for rows in self._sealed:
                    self._upsert(cur, rows)
                cur.execute(f"INSERT INTO _topo_commits VALUES ({m}, {m})", (self._sink_id, checkpoint_id))
        self._sealed = []

    def _upsert(self, cur: Any, rows: Sequence[Sequence[Any]]) -> None:
        if rows and not self._table_ready:
            self._table_ready = self._create_table(cur, rows[0])
        cur.executemany(self._sql, rows)

    def flush(self) -> None:
        """One transaction for the buffered rows, then ack their tuples."""
        assert self._conn is not None
        if self._rows:
            with self._transaction() as cur:
                self._upsert(cur, list(self._rows.values()))
        for t in self._tuples:
            self.collector.ack(t)
        self._rows.clear()
        self._tuples.clear()
        self._last_flush = time.monotonic()

    def cleanup(self) -> None:
        if self._conn is not None:
            if not self._checkpointing:   # with checkpoints, rows past the last one are recomputed
                self.flush()
            self._conn.close()
            self._conn = None


class SQLiteSink(_UpsertSink):
    """Upsert ``fields`` into ``table`` at ``path``, keyed by ``key_fields``."""

    def __init__(self, path: str, table: str, fields: Sequence[str], key_fields: Sequence[str],
                 flush_rows: int = 1000, flush_interval_s: float = 0.25) -> None:
        super().__init__(table, fields, key_fields, flush_rows, flush_interval_s)
        self.path = path
        self.writes_to = {"path": path}          # checked to be writable before a run starts

    def _connect(self) -> sqlite3.Connection:
        Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(self.path, timeout=30)
        conn.execute("PRAGMA journal_mode=WAL")
        return conn

    def _create_table(self, cur: Any, sample: Sequence[Any] | None) -> bool:
        cols = ", ".join(self._q("field", f) for f in self.fields)
        keys = ", ".join(self._q("field", k) for k in self.key_fields)
        cur.execute(f"CREATE TABLE IF NOT EXISTS {self._q('table', self.table)} ({cols}, PRIMARY KEY ({keys}))")
        return True

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[sqlite3.Cursor]:
        with self._conn:                # commits, or rolls back on an exception
            yield self._conn.cursor()


class PostgresSink(_UpsertSink):
    """Upsert ``fields`` into ``table`` of the PostgreSQL database at ``dsn``, keyed by
    ``key_fields`` (``INSERT ... ON CONFLICT (keys) DO UPDATE``).

    ``dsn`` is a libpq connection string or URI, or ``env:VARNAME`` to read it from that
    environment variable when the task starts (so no password is written in the YAML).
    The DSN is never printed: a failed connection is one line naming host, port,
    database and user. A table that does not exist is created at the first write, each
    column typed by ``column_types`` (field -> SQL type) or else by the first row's value
    (int BIGINT, float DOUBLE PRECISION, bool BOOLEAN, bytes BYTEA, otherwise TEXT).
    """

    _mark = "%s"

    def __init__(self, dsn: str, table: str, fields: Sequence[str], key_fields: Sequence[str],
                 flush_rows: int = 1000, flush_interval_s: float = 0.25,
                 column_types: Mapping[str, str] | None = None) -> None:
        super().__init__(table, fields, key_fields, flush_rows, flush_interval_s)
        self.dsn = dsn
        self.column_types = dict(column_types or {})
        unknown = sorted(set(self.column_types) - set(self.fields))
        if unknown:
            raise ValueError(f"PostgresSink: column_types names {unknown}, which are not in fields {self.fields}")
        for f, t in self.column_types.items():
            if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_ ()\[\],]*", t):
                raise ValueError(f"PostgresSink: column_types[{f!r}] {t!r} is not a plain SQL type")

    def __repr__(self) -> str:          # never the DSN: it may hold a password
        return f"PostgresSink(table={self.table!r}, fields={self.fields}, key_fields={self.key_fields})"

    def _resolved_dsn(self) -> str:
        if not self.dsn.startswith("env:"):
            return self.dsn
        name = self.dsn[len("env:"):]
        value = os.environ.get(name)
        if not value:
            raise ValueError(f"PostgresSink: dsn is env:{name} but the environment variable {name} is not set")
        return value

    def _connect(self) -> Any:
        import psycopg

        dsn = self._resolved_dsn()
        try:
            return psycopg.connect(dsn, autocommit=True, connect_timeout=10)
        except psycopg.Error as e:
            reason = _redact(str(e), dsn)
        raise ConnectionError(f"PostgresSink: cannot connect to {_where(dsn)}: {reason}")

    def _create_table(self, cur: Any, sample: Sequence[Any] | None) -> bool:
        # Parallel tasks start together: one at a time creates the tables (CREATE TABLE IF
        # NOT EXISTS can otherwise race on the catalogue).
        cur.execute("SELECT pg_advisory_xact_lock(%s)", (zlib.crc32(b"topo.sinks.PostgresSink"),))
        table = self._q("table", self.table)
        if sample is None and any(f not in self.column_types for f in self.fields):
            # a type to infer from the first row: create it then, unless it exists
            return cur.execute("SELECT to_regclass(%s)", (table,)).fetchone()[0] is not None
        types = [self.column_types.get(f) or _pg_type(sample[i] if sample is not None else None)
                 for i, f in enumerate(self.fields)]
        cols = ", ".join(f"{self._q('field', f)} {t}" for f, t in zip(self.fields, types))
        keys = ", ".join(self._q("field", k) for k in self.key_fields)
        cur.execute(f"CREATE TABLE IF NOT EXISTS {table} ({cols}, PRIMARY KEY ({keys}))")
        return True

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[Any]:
        with self._conn.transaction(), self._conn.cursor() as cur:
            yield cur


def _pg_type(value: Any) -> str:
    """The column type a new table gets for a field whose first value is ``value``."""
    if isinstance(value, bool):
        return "BOOLEAN"
    if isinstance(value, int):
        return "BIGINT"
    if isinstance(value, float):
        return "DOUBLE PRECISION"
    if isinstance(value, (bytes, bytearray)):
        return "BYTEA"
    return "TEXT"


def _where(dsn: str) -> str:
    """``host H port P database D user U`` of a DSN, without its password."""
    from psycopg.conninfo import conninfo_to_dict

    try:
        info = conninfo_to_dict(dsn)
    except Exception:
        return "the server (the DSN does not parse; it is not shown)"
    env = os.environ
    host = info.get("host") or info.get("hostaddr") or env.get("PGHOST") or "localhost"
    user = info.get("user") or env.get("PGUSER") or "(default user)"
    db = info.get("dbname") or env.get("PGDATABASE") or user
    port = info.get("port") or env.get("PGPORT") or "5432"
    return f"host {host} port {port} database {db} user {user}"


def _redact(text: str, dsn: str) -> str:
    """One line of a libpq error, with no trace of the DSN's password."""
    from psycopg.conninfo import conninfo_to_dict

    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    line = "; ".join(lines) or "connection failed"
    try:
        password = conninfo_to_dict(dsn).get("password")
    except Exception:           # unparsable: its text may hold anything, say nothing of it
        return "the DSN does not parse"
    if password:
        line = line.replace(str(password), "***")
    return line[:300]


# -- line sinks: files, stdout, Redis Streams ---------------------------------------------------

class _BatchSink(Bolt):
    """What the line sinks share: rows buffered and written together (every ``flush_rows``
    tuples, every ``flush_interval_s``, when a checkpoint completes, at the end), their
    tuples acked after the write."""

    auto_ack = False

    def __init__(self, fields: Sequence[str], flush_rows: int, flush_interval_s: float) -> None:
        owner = type(self).__name__
        names = isinstance(fields, (list, tuple)) and all(isinstance(f, str) for f in fields)
        self.fields = list(fields) if names else []
        if not self.fields or len(set(self.fields)) != len(self.fields):
            raise ValueError(f"{owner}: fields must be a list of distinct field names, got {fields!r}")
        if not isinstance(flush_rows, int) or flush_rows < 1:
            raise ValueError(f"{owner}: flush_rows must be an integer >= 1, got {flush_rows!r}")
        if not isinstance(flush_interval_s, (int, float)) or flush_interval_s <= 0:
            raise ValueError(f"{owner}: flush_interval_s must be > 0, got {flush_interval_s!r}")
        self.input_fields = tuple(self.fields)   # checked against its input streams at validation
        self.flush_rows = flush_rows
        self.flush_interval_s = flush_interval_s
        self.tick_interval_s = flush_interval_s
        self._rows: list[list[Any]] = []
        self._tuples: list[Tuple] = []
        self._last_flush = 0.0

    def _write(self, rows: list[list[Any]]) -> None:
        raise NotImplementedError

    def prepare(self, context: TaskContext, collector: Any) -> None:
        super().prepare(context, collector)
        self._last_flush = time.monotonic()

    def execute(self, tup: Tuple) -> None:
        self._rows.append([tup[f] for f in self.fields])
        self._tuples.append(tup)
        if len(self._rows) >= self.flush_rows:
            self.flush()

    def tick(self) -> None:
        if self._tuples and time.monotonic() - self._last_flush >= self.flush_interval_s:
            self.flush()

    def flush(self) -> None:
        """Write the buffered rows, then ack their tuples."""
        if self._rows:
            self._write(self._rows)
        for t in self._tuples:
            self.collector.ack(t)
        self._rows = []
        self._tuples.clear()
        self._last_flush = time.monotonic()

    def checkpoint_complete(self, checkpoint_id: int) -> None:
        """A checkpoint is durable: what came before it goes out now too."""
        self.flush()

    def cleanup(self) -> None:
        self.flush()


def _json_line(fields: Sequence[str], row: Sequence[Any]) -> str:
    return json.dumps(dict(zip(fields, row)), ensure_ascii=False, default=str) + "\n"


class _FileSink(_BatchSink):
    """A file of lines, appended to. With checkpoints, exact: see the module docstring."""

    def __init__(self, path: str, fields: Sequence[str], flush_rows: int, flush_interval_s: float) -> None:
        super().__init__(fields, flush_rows, flush_interval_s)
        if not isinstance(path, str) or not path:
            raise ValueError(f"{type(self).__name__}: path must be a file name, got {path!r}")
        self.path = path
        self.writes_to = {"path": path}          # checked to be writable before a run starts
        self._file: Any = None
        self._checkpointing = False
        self._sealed: list[list[Any]] = []       # rows of checkpoints not yet written
        self._file_path = path

    def _encode(self, rows: list[list[Any]], at_start: bool) -> bytes:
        raise NotImplementedError

    def prepare(self, context: TaskContext, collector: Any) -> None:
        owner = type(self).__name__
        if "{task}" in self.path:
            self._file_path = self.path.replace("{task}", str(context.task_index))
        elif context.parallelism > 1:
            raise ValueError(f"{owner}: path {self.path!r} would be written by {context.parallelism} tasks at "
                             "once: put {task} in it (one file per task)")
        Path(self._file_path).parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self._file_path, "ab", buffering=0)
        self._checkpointing = context.config.get("checkpoint.interval_ms") is not None
        super().prepare(context, collector)

    def execute(self, tup: Tuple) -> None:
        if self._checkpointing:     # the row is state now: written when its checkpoint is durable
            self._rows.append([tup[f] for f in self.fields])
            self.collector.ack(tup)
            return
        super().execute(tup)

    def tick(self) -> None:
        if not self._checkpointing:
            super().tick()

    def _size(self) -> int:
        return os.fstat(self._file.fileno()).st_size

    def _write(self, rows: list[list[Any]]) -> None:
        self._file.write(self._encode(rows, self._size() == 0))

    def snapshot_state(self) -> Any:
        """Seal the rows since the last checkpoint, with the file's length before any of them."""
        self._sealed.extend(self._rows)
        self._rows = []
        return {"sealed": self._sealed, "length": self._size()}

    def restore_state(self, state: Any) -> None:
        """Cut what was written after the checkpoint; its sealed rows are written again."""
        length = int(state["length"])
        size = self._size()
        if size < length:
            raise ValueError(f"{type(self).__name__}: {self._file_path} is {size} bytes, shorter than the "
                             f"{length} bytes the checkpoint had written: it was changed outside the run")
        self._file.truncate(length)
        self._sealed = [list(r) for r in state["sealed"]]

    def checkpoint_complete(self, checkpoint_id: int) -> None:
        if self._checkpointing and self._sealed and self._file is not None:
            self._write(self._sealed)
            os.fsync(self._file.fileno())
            self._sealed = []

    def cleanup(self) -> None:
        if self._file is None:
            return
        if not self._checkpointing:   # with checkpoints, rows past the last one are recomputed
            self.flush()
        self._file.close()
        self._file = None


class JsonLinesSink(_FileSink):
    """One JSON object per tuple (``{field: value}`` for ``fields``) appended to ``path``
    (``{task}`` in it is replaced by the task's index: needed with parallelism > 1)."""

    def __init__(self, path: str, fields: Sequence[str], flush_rows: int = 1000,
                 flush_interval_s: float = 0.25) -> None:
        super().__init__(path, fields, flush_rows, flush_interval_s)

    def _encode(self, rows: list[list[Any]], at_start: bool) -> bytes:
        fields = self.fields
        return "".join(_json_line(fields, r) for r in rows).encode("utf-8")


class CsvSink(_FileSink):
    """One CSV row per tuple appended to ``path``, after a header row of ``fields`` when the
    file is empty (``{task}`` in ``path`` as for ``JsonLinesSink``)."""

    def __init__(self, path: str, fields: Sequence[str], flush_rows: int = 1000,
                 flush_interval_s: float = 0.25, delimiter: str = ",") -> None:
        super().__init__(path, fields, flush_rows, flush_interval_s)
        if not isinstance(delimiter, str) or len(delimiter) != 1:
            raise ValueError(f"CsvSink: delimiter must be one character, got {delimiter!r}")
        self.delimiter = delimiter

    def _encode(self, rows: list[list[Any]], at_start: bool) -> bytes:
        out = io.StringIO()
        w = csv.writer(out, delimiter=self.delimiter, lineterminator="\n")
        if at_start:
            w.writerow(self.fields)
        w.writerows(rows)
        return out.getvalue().encode("utf-8")


class StdoutSink(_BatchSink):
    """Prints one JSON object per tuple (``{field: value}`` for ``fields``) on ``stream``
    (``stdout`` or ``stderr``), a batch at a time. At-least-once."""

    def __init__(self, fields: Sequence[str], stream: str = "stdout", flush_rows: int = 100,
                 flush_interval_s: float = 0.25) -> None:
        super().__init__(fields, flush_rows, flush_interval_s)
        if stream not in ("stdout", "stderr"):
            raise ValueError(f"StdoutSink: stream must be 'stdout' or 'stderr', got {stream!r}")
        self.stream = stream

    def _write(self, rows: list[list[Any]]) -> None:
        out = getattr(sys, self.stream)
        out.write("".join(_json_line(self.fields, r) for r in rows))
        out.flush()


class RedisStreamSink(_BatchSink):
    """Adds one entry per tuple to the Redis stream ``stream`` at ``url`` with ``XADD``
    (``*`` ids), each field's value JSON-encoded, so ``RedisStreamSpout`` reads back the
    same values; ``maxlen`` trims the stream (approximately) as Redis's ``MAXLEN ~``.
    A flush is one pipeline; its tuples are acked after it. At-least-once."""

    def __init__(self, url: str, stream: str, fields: Sequence[str], maxlen: int | None = None,
                 flush_rows: int = 500, flush_interval_s: float = 0.1) -> None:
        super().__init__(fields, flush_rows, flush_interval_s)
        if not isinstance(stream, str) or not stream:
            raise ValueError(f"RedisStreamSink: stream must be a key name, got {stream!r}")
        if maxlen is not None and (not isinstance(maxlen, int) or maxlen < 1):
            raise ValueError(f"RedisStreamSink: maxlen must be an integer >= 1, got {maxlen!r}")
        self.url = url
        self.stream = stream
        self.maxlen = maxlen
        self._client: Any = None

    def __repr__(self) -> str:          # never the URL: it may hold a password
        return f"RedisStreamSink(stream={self.stream!r}, fields={self.fields})"

    def prepare(self, context: TaskContext, collector: Any) -> None:
        from topo.sources.redis_streams import connect

        self._client = connect(self.url, "RedisStreamSink")
        super().prepare(context, collector)

    def _write(self, rows: list[list[Any]]) -> None:
        pipe = self._client.pipeline(transaction=False)
        fields = self.fields
        for r in rows:
            pipe.xadd(self.stream, {f: json.dumps(v, default=str) for f, v in zip(fields, r)},
                      maxlen=self.maxlen, approximate=True)
        pipe.execute()

    def cleanup(self) -> None:
        if self._client is not None:
            self.flush()
            self._client.close()
            self._client = None


def read_table(path: str, table: str) -> list[tuple[Any, ...]]:
    """All rows of ``table`` (for checking a run's results)."""
    with sqlite3.connect(path) as conn:
        return list(conn.execute(f"SELECT * FROM {_ident('table', table)}"))
