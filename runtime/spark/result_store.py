"""The Spark engine's result store: its terminal streams written to a database,
idempotent by batch. (The sink *bolts* a topology contains are ``topo.sinks``; this
is where the Spark engine itself puts what no bolt reads.)

Every micro-batch's terminal tuples (declared streams that no bolt reads) are written
in **one transaction together with a marker row** ``(query_id, batch_id)`` in
``topo_batches``. When Spark replays a batch (after a failure between the write and
the checkpoint's commit), the marker is already there and the whole batch is skipped,
so nothing is counted twice. ``query_id`` is the streaming query's id, which Spark keeps
in the checkpoint: a restarted query keeps it, a fresh checkpoint gets a new one, so
two runs never mistake each other's batches.

One table per terminal stream, named after the component (``component_stream`` for a
stream other than ``default``, non-identifier characters replaced by ``_``), with
columns ``query_id, batch_id, seq`` and then the stream's declared fields. Rows are
appended: a Storm user reading a bolt's output sees every tuple it emitted, in order
(``batch_id, seq``); "latest per key" is a query away.

Backends by URL (``spark.sink``):

* ``sqlite:PATH`` (``sqlite:///abs/path.db`` or ``sqlite:relative.db``), the default:
  values stored as they are (numbers, text, bytes, NULL); lists and dicts as JSON text.
* ``postgresql://user@127.0.0.1:port/db``: through psycopg; field columns are
  ``jsonb`` (a bolt's fields carry no SQL types), markers and rows in one transaction.
* ``none``: nothing is written (the terminal tuples are still computed).
"""
from __future__ import annotations

import json
import re
import sqlite3
import time
from pathlib import Path
from typing import Any, Mapping, Protocol, Sequence

_NOT_IDENT = re.compile(r"[^A-Za-z0-9_]")

Rows = Mapping[tuple[str, str], Sequence[Sequence[Any]]]


def table_name(component: str, stream: str) -> str:
    base = component if stream == "default" else f"{component}_{stream}"
    name = _NOT_IDENT.sub("_", base)
    return name if not name[:1].isdigit() else f"t_{name}"


def quote(ident: str) -> str:
    if _NOT_IDENT.search(ident):
        raise ValueError(f"{ident!r} is not a plain SQL identifier")
    return f'"{ident}"'


class BatchSink(Protocol):
    # True: the sink keeps nothing, so the engine runs each batch without collecting its rows
    # on the driver (``NullSink``); the SQL sinks are handed every terminal tuple.
    discards: bool

    def write_batch(self, query_id: str, batch_id: int, rows: Rows) -> bool:
        """Write one batch's rows; False when that batch was already committed."""
        ...

    def close(self) -> None: ...


class _SqlSink:
    """What the SQLite and PostgreSQL sinks share: table layout and the write protocol."""

    placeholder = "?"
    field_type = ""
    discards = False

    def __init__(self, streams: Mapping[tuple[str, str], Sequence[str]]) -> None:
        self.streams = {k: tuple(v) for k, v in streams.items()}
        for fields in self.streams.values():
            for f in fields:
                quote(f)

    def _ddl(self) -> list[str]:
        out = ["CREATE TABLE IF NOT EXISTS topo_batches (query_id TEXT NOT NULL, batch_id BIGINT NOT NULL, "
               "rows BIGINT NOT NULL, committed_at DOUBLE PRECISION NOT NULL, PRIMARY KEY (query_id, batch_id))"]
        for (component, stream), fields in self.streams.items():
            cols = "".join(f", {quote(f)} {self.field_type}".rstrip() for f in fields)
            out.append(f"CREATE TABLE IF NOT EXISTS {quote(table_name(component, stream))} "
                       f"(query_id TEXT NOT NULL, batch_id BIGINT NOT NULL, seq BIGINT NOT NULL{cols})")
        return out

    def _insert_sql(self, key: tuple[str, str]) -> str:
        fields = self.streams[key]
        cols = ", ".join(["query_id", "batch_id", "seq"] + [quote(f) for f in fields])
        marks = ", ".join([self.placeholder] * (3 + len(fields)))
        return f"INSERT INTO {quote(table_name(*key))} ({cols}) VALUES ({marks})"

    def _marker_sql(self) -> str:
        m = self.placeholder
        return (f"INSERT INTO topo_batches (query_id, batch_id, rows, committed_at) VALUES ({m}, {m}, {m}, {m}) "
                f"ON CONFLICT (query_id, batch_id) DO NOTHING")

    def _convert(self, value: Any) -> Any:
        raise NotImplementedError

    def _params(self, query_id: str, batch_id: int, rows: Rows) -> dict[tuple[str, str], list[tuple[Any, ...]]]:
        out: dict[tuple[str, str], list[tuple[Any, ...]]] = {}
        for key, values in rows.items():
            if key not in self.streams:
                raise KeyError(f"no terminal stream {key!r} in this sink")
            conv = self._convert
            out[key] = [(query_id, batch_id, seq, *(conv(x) for x in vals)) for seq, vals in enumerate(values)]
        return out


class SQLiteBatchSink(_SqlSink):
    def __init__(self, path: str, streams: Mapping[tuple[str, str], Sequence[str]]) -> None:
        super().__init__(streams)
        self.path = path
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self.conn = sqlite3.connect(path, timeout=30, check_same_thread=False)
        self.conn.execute("PRAGMA journal_mode=WAL")
        with self.conn:
            for stmt in self._ddl():
                self.conn.execute(stmt)

    def _convert(self, value: Any) -> Any:
        if value is None or isinstance(value, (int, float, str, bytes)):
            return value
        return json.dumps(value)

    def write_batch(self, query_id: str, batch_id: int, rows: Rows) -> bool:
        params = self._params(query_id, batch_id, rows)
        total = sum(len(v) for v in params.values())
        with self.conn:
            cur = self.conn.execute(self._marker_sql(), (query_id, batch_id, total, time.time()))
            if cur.rowcount == 0:
                return False
            for key, batch in params.items():
                if batch:
                    self.conn.executemany(self._insert_sql(key), batch)
        return True

    def close(self) -> None:
        self.conn.close()


class PostgresBatchSink(_SqlSink):
    placeholder = "%s"
    field_type = "jsonb"

    def __init__(self, dsn: str, streams: Mapping[tuple[str, str], Sequence[str]]) -> None:
        import psycopg

        super().__init__(streams)
        self.conn = psycopg.connect(dsn, connect_timeout=10)
        with self.conn.transaction():
            for stmt in self._ddl():
                self.conn.execute(stmt)

    def _convert(self, value: Any) -> Any:
        from psycopg.types.json import Jsonb

        if isinstance(value, bytes):
            value = value.decode("utf-8", "backslashreplace")
        return Jsonb(value)

    def write_batch(self, query_id: str, batch_id: int, rows: Rows) -> bool:
        params = self._params(query_id, batch_id, rows)
        total = sum(len(v) for v in params.values())
        with self.conn.transaction():
            cur = self.conn.execute(self._marker_sql() + " RETURNING 1", (query_id, batch_id, total, time.time()))
            if cur.fetchone() is None:
                return False
            with self.conn.cursor() as c:
                for key, batch in params.items():
                    if batch:
                        c.executemany(self._insert_sql(key), batch)
        return True

    def close(self) -> None:
        self.conn.close()


class NullSink:
    """``spark.sink: none``: every bolt runs and the terminal tuples are dropped where they are
    made (``discards``: the engine runs the batch into Spark's ``noop`` sink instead of
    collecting its tuples on the driver for nothing)."""

    discards = True

    def write_batch(self, query_id: str, batch_id: int, rows: Rows) -> bool:
        return True

    def close(self) -> None:
        return None


def open_sink(url: str, streams: Mapping[tuple[str, str], Sequence[str]]) -> BatchSink:
    """``sqlite:PATH``, ``postgresql://...`` (or ``postgres://``), or ``none``."""
    if url == "none":
        return NullSink()
    if url.startswith("sqlite:"):
        path = url[len("sqlite:"):]
        if path.startswith("//"):
            path = path[2:]
        if not path:
            raise ValueError("sqlite sink needs a path: sqlite:results.db or sqlite:///abs/results.db")
        return SQLiteBatchSink(path, streams)
    if url.startswith(("postgresql://", "postgres://")):
        return PostgresBatchSink(url, streams)
    raise ValueError(f"unknown sink {url!r}: use sqlite:PATH, postgresql://... or none")


def read_rows(url: str, component: str, stream: str = "default") -> list[tuple[Any, ...]]:
    """All rows of one terminal stream's table, in emit order (for tests and checks)."""
    table = quote(table_name(component, stream))
    if url.startswith("sqlite:"):
        path = url[len("sqlite:"):]
        path = path[2:] if path.startswith("//") else path
        with sqlite3.connect(path) as conn:
            return list(conn.execute(f"SELECT * FROM {table} ORDER BY query_id, batch_id, seq"))
    import psycopg

    with psycopg.connect(url, connect_timeout=10) as conn:
        return list(conn.execute(f"SELECT * FROM {table} ORDER BY query_id, batch_id, seq"))
