"""Database sink bolts.

``SQLiteSink`` upserts each tuple as a row keyed by ``key_fields``: a replayed tuple
rewrites the same row with the same values instead of adding one, so at-least-once
delivery does not double-count. Rows are buffered and written in one transaction
per flush; the input tuples are acked only after their transaction commits, so a
crash before the commit leaves them unacked and they are replayed.

With checkpoints on (``checkpoint.interval_ms``) the sink writes nothing on its own:
the rows it receives between two checkpoints are part of its checkpointed state, and
when a checkpoint is durable they are written in one transaction together with a
marker row ``(sink, checkpoint id)`` in ``_topo_commits``; a checkpoint whose marker
is already there is not written again. After any crash and restart the table holds
exactly what a crash-free run writes.
"""
from __future__ import annotations

import re
import sqlite3
import time
from pathlib import Path
from typing import Any, Sequence

from topo.api import Bolt, TaskContext, Tuple

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _ident(kind: str, name: str) -> str:
    if not _IDENT.match(name):
        raise ValueError(f"SQLiteSink: {kind} {name!r} is not a plain SQL identifier")
    return f'"{name}"'


class SQLiteSink(Bolt):
    """Upsert ``fields`` into ``table`` at ``path``, keyed by ``key_fields``."""

    auto_ack = False
    tick_interval_s = 0.25

    def __init__(self, path: str, table: str, fields: Sequence[str], key_fields: Sequence[str],
                 flush_rows: int = 1000, flush_interval_s: float = 0.25) -> None:
        self.path = path
        self.table = table
        self.fields = list(fields)
        self.key_fields = list(key_fields)
        if not self.key_fields or any(k not in self.fields for k in self.key_fields):
            raise ValueError(f"SQLiteSink: key_fields {self.key_fields} must be a non-empty subset of fields {self.fields}")
        for f in self.fields:
            _ident("field", f)
        self.input_fields = tuple(self.fields)   # checked against its input streams at validation
        self.writes_to = {"path": path}          # checked to be writable before a run starts
        _ident("table", table)
        self.flush_rows = flush_rows
        self.flush_interval_s = flush_interval_s
        self.tick_interval_s = flush_interval_s
        self._conn: sqlite3.Connection | None = None
        self._rows: dict[tuple[Any, ...], tuple[Any, ...]] = {}
        self._tuples: list[Tuple] = []
        self._last_flush = 0.0
        self._checkpointing = False
        self._sealed: list[list[Any]] = []     # rows of checkpoints not yet committed here
        self._sink_id = ""

    def prepare(self, context: TaskContext, collector: Any) -> None:
        super().prepare(context, collector)
        Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self._conn = sqlite3.connect(self.path, timeout=30)
        self._conn.execute("PRAGMA journal_mode=WAL")
        cols = ", ".join(_ident("field", f) for f in self.fields)
        keys = ", ".join(_ident("field", k) for k in self.key_fields)
        self._conn.execute(f"CREATE TABLE IF NOT EXISTS {_ident('table', self.table)} ({cols}, PRIMARY KEY ({keys}))")
        self._conn.commit()
        updates = ", ".join(f"{_ident('field', f)}=excluded.{_ident('field', f)}"
                            for f in self.fields if f not in self.key_fields)
        marks = ", ".join("?" for _ in self.fields)
        self._sql = (f"INSERT INTO {_ident('table', self.table)} ({cols}) VALUES ({marks}) "
                     f"ON CONFLICT ({keys}) DO " + (f"UPDATE SET {updates}" if updates else "NOTHING"))
        self._key_pos = [self.fields.index(k) for k in self.key_fields]
        self._last_flush = time.monotonic()
        self._checkpointing = context.config.get("checkpoint.interval_ms") is not None
        if self._checkpointing:
            self._sink_id = f"{context.topology}/{context.component}/{context.task_index}/{self.table}"
            self._conn.execute("CREATE TABLE IF NOT EXISTS _topo_commits (sink TEXT, checkpoint INTEGER, "
                               "PRIMARY KEY (sink, checkpoint))")
            self._conn.commit()

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
        with self._conn:
            done = self._conn.execute("SELECT 1 FROM _topo_commits WHERE sink = ? AND checkpoint = ?",
                                      (self._sink_id, checkpoint_id)).fetchone()
            if not done:
                for rows in self._sealed:
                    self._conn.executemany(self._sql, rows)
                self._conn.execute("INSERT INTO _topo_commits VALUES (?, ?)", (self._sink_id, checkpoint_id))
        self._sealed = []

    def flush(self) -> None:
        """One transaction for the buffered rows, then ack their tuples."""
        assert self._conn is not None
        if self._rows:
            with self._conn:
                self._conn.executemany(self._sql, list(self._rows.values()))
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


def read_table(path: str, table: str) -> list[tuple[Any, ...]]:
    """All rows of ``table`` (for checking a run's results)."""
    with sqlite3.connect(path) as conn:
        return list(conn.execute(f"SELECT * FROM {_ident('table', table)}"))
