"""Where completed checkpoints live: one SQLite file per topology, in ``checkpoint.dir``.

A checkpoint is one row ``(id, taken_at, fingerprint, payload, digest)`` written in one
transaction (WAL mode), so a crash leaves either the whole row or none of it; the
same transaction deletes all but the newest ``keep``. ``payload`` is the msgpack of
``{component: {task_index: packed task state}}`` and ``digest`` its SHA-256: a row
whose payload does not match its digest (a damaged file) is skipped with a warning
and the one before it is used. A file that is not a database at all is reported in
one line naming it (``topo run --from-scratch`` starts over).

``fingerprint`` describes the topology the checkpoint belongs to (components, their
classes and parallelism); restoring into a topology that differs is refused with the
difference spelled out, since offsets and keyed state are laid out per task.
"""
from __future__ import annotations

import hashlib
import json
import logging
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack

from topo.api import CheckpointError

log = logging.getLogger("topo.checkpoint")

MAX_PAYLOAD = 1 << 31   # 2 GiB: a bound on what is read back from the file



@dataclass(frozen=True)
class Checkpoint:
    id: int
    taken_at: float
    fingerprint: dict[str, Any]
    states: dict[str, dict[int, bytes]]    # component -> task index -> packed state


def fingerprint_difference(saved: dict[str, Any], now: dict[str, Any]) -> str | None:
    """What changed between two topology fingerprints, in words; None when compatible."""
    problems = []
    for cid in sorted(set(saved) | set(now)):
        if cid not in now:
            problems.append(f"component {cid!r} is gone")
        elif cid not in saved:
            if now[cid].get("stateful"):
                problems.append(f"component {cid!r} is new")
        else:
            a, b = saved[cid], now[cid]
            for key in ("kind", "class", "parallelism"):
                if a.get(key) != b.get(key):
                    problems.append(f"component {cid!r} {key} {a.get(key)!r} -> {b.get(key)!r}")
    return "; ".join(problems) or None


class CheckpointStore:
    """The SQLite file of one topology's checkpoints."""

    def __init__(self, directory: str | Path, topology: str, keep: int = 3) -> None:
        self.path = Path(directory) / f"{topology}.checkpoints.sqlite"
        self.keep = keep
        self._conn: sqlite3.Connection | None = None

    def _db(self) -> sqlite3.Connection:
        if self._conn is None:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                conn = sqlite3.connect(self.path, timeout=30, check_same_thread=False)
                conn.execute("PRAGMA busy_timeout=30000")
                if conn.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
                    conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("PRAGMA synchronous=FULL")
                conn.execute("CREATE TABLE IF NOT EXISTS checkpoints (id INTEGER PRIMARY KEY, taken_at REAL, "
                             "fingerprint TEXT, payload BLOB, digest TEXT)")
                conn.commit()
            except (sqlite3.DatabaseError, OSError) as e:
                raise CheckpointError(f"checkpoint file {self.path}: {e} (topo run --from-scratch "
                                      f"starts over; move the file away to keep it)") from None
            self._conn = conn
        return self._conn

    def save(self, checkpoint_id: int, fingerprint: dict[str, Any],
             states: dict[str, dict[int, bytes]]) -> None:
        """Write one completed checkpoint atomically and drop all but the newest ``keep``."""
        payload = msgpack.packb({cid: {str(i): b for i, b in tasks.items()} for cid, tasks in states.items()},
                                use_bin_type=True)
        db = self._db()
        with db:
            db.execute("INSERT OR REPLACE INTO checkpoints VALUES (?, ?, ?, ?, ?)",
                       (checkpoint_id, time.time(), json.dumps(fingerprint, sort_keys=True), payload,
                        hashlib.sha256(payload).hexdigest()))
            db.execute("DELETE FROM checkpoints WHERE id NOT IN "
                       "(SELECT id FROM checkpoints ORDER BY id DESC LIMIT ?)", (self.keep,))

    def latest(self) -> Checkpoint | None:
        """The newest checkpoint whose payload is intact (a damaged one is skipped)."""
        if not self.path.exists():
            return None
        try:
            rows = self._db().execute("SELECT id, taken_at, fingerprint, payload, digest FROM checkpoints "
                                      "ORDER BY id DESC").fetchall()
        except sqlite3.DatabaseError as e:
            raise CheckpointError(f"checkpoint file {self.path}: {e} (topo run --from-scratch starts over)") from None
        for cid, taken_at, fp, payload, digest in rows:
            try:
                if payload is None or len(payload) > MAX_PAYLOAD or hashlib.sha256(payload).hexdigest() != digest:
                    raise ValueError("payload does not match its digest")
                raw = msgpack.unpackb(payload, raw=False, strict_map_key=False)
                states = {c: {int(i): b for i, b in tasks.items()} for c, tasks in raw.items()}
                return Checkpoint(cid, taken_at, json.loads(fp), states)
            except (ValueError, TypeError, msgpack.UnpackException) as e:
                log.warning("checkpoint %d in %s is damaged (%s): using the one before it", cid, self.path, e)
        return None

    def next_id(self, after: int) -> int:
        """A checkpoint id never used before for this topology name: the wall clock in ms,
        kept above ``after``. Sinks commit each checkpoint's output once per id, so ids
        must not repeat even when the file is deleted or ``--from-scratch`` empties it."""
        return max(after + 1, int(time.time() * 1000))

    def discard(self) -> None:
        """Forget every checkpoint (``--from-scratch``)."""
        if self.path.exists():
            db = self._db()
            with db:
                db.execute("DELETE FROM checkpoints")

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
