"""File spouts: text lines, JSON lines and CSV, from a file, a directory or a glob.

```python
from topo.sources.files import JsonLinesSpout
events = JsonLinesSpout("data/events.jsonl", fields=["ts", "user", "type"])
```

``path`` is one file, a directory (its files matching ``pattern``, sorted by name, hidden
files skipped) or a glob (``logs/*.jsonl``, ``**`` allowed). Each record is one line.

**Offsets.** A spout's position is the byte offset of the next line in each file, so a
restart with checkpoints on (``checkpoint.interval_ms``) resumes at the exact line, even
in the middle of a file (``snapshot_state`` / ``restore_state``). A tuple is tracked with
``msg_id = (file, byte offset of its line)``.

**Parallelism.** Task ``i`` of ``n`` reads the files whose name (without its directory)
hashes (CRC-32) to ``i`` mod ``n``; a file is read by one task, in order.

**Finite or following.** Without ``follow`` the spout reads every file to its end (an
unterminated last line included) and ends. It then emits one tuple ``[task, tasks]`` on
its ``end`` stream (``end_stream``; ``None``: not declared) and raises ``EndOfStream``;
with acking on it waits until every tuple it emitted was acked (or dead-lettered), so a
window bolt subscribed to ``end`` sees it after all the data (see ``topo.windows``).
With ``follow=True`` it never ends: it polls every ``poll_s`` for lines appended to its
files and for new files, and emits a line only once its newline is written. A file that
shrinks below its offset was truncated or replaced: it is read again from the start.

**Bad records.** ``on_error="raise"`` (the default) stops at a line that does not parse,
naming the file and byte offset; ``"skip"`` skips it and counts it in ``skipped``.
"""
from __future__ import annotations

import asyncio
import csv
import fnmatch
import glob
import json
import logging
import os
import zlib
from typing import IO, Any, Mapping, Sequence

from topo.api import DEFAULT_STREAM, EndOfStream, Spout, SpoutOutputCollector, TaskContext

log = logging.getLogger("topo.sources.files")

END_STREAM = "end"
END_FIELDS = ("task", "tasks")
MAX_LINE_BYTES = 16 * 1024 * 1024
_GLOB_CHARS = frozenset("*?[")


class FileSpout(Spout):
    """Base of the file spouts: one record per line, byte offsets per file (see the module
    docstring). A subclass implements ``parse(text, file, offset)``."""

    def __init__(self, path: str, fields: Sequence[str], *, pattern: str = "*", follow: bool = False,
                 poll_s: float = 0.2, batch: int = 256, on_error: str = "raise", encoding: str = "utf-8",
                 end_stream: str | None = END_STREAM, max_line_bytes: int = MAX_LINE_BYTES) -> None:
        if batch < 1:
            raise ValueError("batch must be >= 1")
        if on_error not in ("raise", "skip"):
            raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
        if not fields:
            raise ValueError("fields must name at least one field")
        self.path = str(path)
        self.pattern = pattern
        self.follow = follow
        self.poll_s = poll_s
        self.batch = batch
        self.on_error = on_error
        self.encoding = encoding
        self.max_line_bytes = max_line_bytes
        self.fields = tuple(fields)
        self.end_stream = None if follow else end_stream
        self.outputs = {DEFAULT_STREAM: self.fields}
        if self.end_stream:
            self.outputs[self.end_stream] = END_FIELDS
        self.skipped = 0

    # -- what a format defines -----------------------------------------------------------
    def parse(self, text: str, file: str, offset: int) -> list[Any] | None:
        """The values of one line (``None``: no record on this line). Raise ``ValueError``
        for a line that does not parse."""
        raise NotImplementedError

    def start_file(self, file: str, f: IO[bytes]) -> int:
        """Called when a file is first read from offset 0; returns where its records start
        (a CSV header is read here). ``f`` is at offset 0."""
        return 0

    def resume_file(self, file: str, f: IO[bytes]) -> None:
        """Called when a file is opened at an offset past 0 (after a restore)."""

    # -- files ---------------------------------------------------------------------------
    def files(self) -> list[str]:
        """Every file ``path`` names now, sorted."""
        p = self.path
        if _GLOB_CHARS & set(p):
            found = glob.glob(p, recursive=True)
        elif os.path.isdir(p):
            found = [os.path.join(p, n) for n in os.listdir(p)
                     if not n.startswith(".") and fnmatch.fnmatch(n, self.pattern)]
        else:
            found = [p] if os.path.exists(p) or not self.follow else []
        return sorted(f for f in found if not os.path.isdir(f))

    def _is_mine(self, file: str) -> bool:
        n = self.context.parallelism
        # The file's own name, not its path: the split stays the same wherever the
        # directory is (and so does what a checkpoint's offsets belong to).
        name = os.path.basename(file)
        return n == 1 or zlib.crc32(name.encode("utf-8", "surrogateescape")) % n == self.context.task_index

    def open(self, context: TaskContext, collector: SpoutOutputCollector) -> None:
        super().open(context, collector)
        self._pos: dict[str, int] = {}
        self._done: set[str] = set()            # read to the end (finite mode)
        self._handle: tuple[str, IO[bytes]] | None = None
        self._turn = 0
        self._pending: set[Any] = set()
        self._fails: dict[Any, int] = {}
        self._max_retries = int(context.config.get("max_retries", 3))
        self._acking = bool(context.config.get("acking", False))
        self._ended = False
        self._files = [f for f in self.files() if self._is_mine(f)]
        if not self.follow:
            missing = [f for f in self._files if not os.path.exists(f)]
            if missing:
                raise FileNotFoundError(f"{type(self).__name__}: no such file {missing[0]!r}")

    def _open(self, file: str) -> IO[bytes]:
        if self._handle is not None and self._handle[0] == file:
            return self._handle[1]
        self._close_handle()
        f = open(file, "rb")
        pos = self._pos.get(file)
        if not pos:                         # (re)started: at 0, or a header not complete before
            self._pos[file] = self.start_file(file, f)
        elif pos > 0:
            self.resume_file(file, f)
        self._handle = (file, f)
        return f

    def _close_handle(self) -> None:
        if self._handle is not None:
            self._handle[1].close()
            self._handle = None

    # -- the stream ------------------------------------------------------------------------
    async def next_tuple(self) -> None:
        if self.follow:
            if not self._read_some():
                self._files = [f for f in self.files() if self._is_mine(f)]
                if not self._read_some():
                    await asyncio.sleep(self.poll_s)
            return
        if self._read_some():
            return
        if self._acking and self._pending:
            await asyncio.sleep(0.005)     # wait for the last tuples' trees before the end marker
            return
        if self.end_stream and not self._ended:
            self.collector.emit([self.context.task_index, self.context.parallelism], self.end_stream)
        self._ended = True
        raise EndOfStream

    def _read_some(self) -> bool:
        """Emit up to ``batch`` records from the next file that has some; False when none has."""
        files = [f for f in self._files if f not in self._done]
        if self.follow and files:           # round robin; finite: one file after the other
            k = self._turn % len(files)
            files = files[k:] + files[:k]
            self._turn += 1
        for file in files:
            if self._read_file(file):
                return True
        return False

    def _read_file(self, file: str) -> bool:
        try:
            if self.follow and file in self._pos and os.path.getsize(file) < self._pos[file]:
                log.warning("%s shrank below offset %d: reading it again from the start", file, self._pos[file])
                self._close_handle()
                del self._pos[file]
            f = self._open(file)
        except FileNotFoundError:
            if self.follow:
                return False
            raise
        pos = self._pos[file]
        f.seek(pos)
        emit = self.collector.emit
        emitted = 0
        while emitted < self.batch:
            line = f.readline(self.max_line_bytes + 1)
            if not line:
                break
            if not line.endswith(b"\n"):
                if len(line) > self.max_line_bytes:
                    raise ValueError(f"{file}: byte {pos}: a line over {self.max_line_bytes} bytes")
                if self.follow:
                    break                   # the rest of this line is not written yet
            start, pos = pos, pos + len(line)
            text = line.decode(self.encoding).rstrip("\r\n")
            try:
                values = self.parse(text, file, start)
            except (ValueError, KeyError, TypeError) as e:
                if self.on_error == "raise":
                    raise ValueError(f"{file}: byte {start}: {e}") from None
                self.skipped += 1
                values = None
            self._pos[file] = pos
            if values is not None:
                msg_id = (file, start)
                if self._acking:
                    self._pending.add(msg_id)
                emit(values, msg_id=msg_id)
                emitted += 1
        if not self.follow and emitted < self.batch:
            self._done.add(file)
            self._close_handle()
        return emitted > 0

    def ack(self, msg_id: Any) -> None:
        self._pending.discard(msg_id)
        self._fails.pop(msg_id, None)

    def fail(self, msg_id: Any) -> None:
        n = self._fails[msg_id] = self._fails.get(msg_id, 0) + 1
        if n > self._max_retries:          # dead-lettered: it will not come back
            self._pending.discard(msg_id)
            del self._fails[msg_id]

    # -- checkpoints: the byte offset of the next line, per file ----------------------------
    def snapshot_state(self) -> Any:
        return {"pos": dict(self._pos)}

    def restore_state(self, state: Any) -> None:
        self._close_handle()
        self._pos = {str(f): int(p) for f, p in state["pos"].items()}
        self._done = set()

    def close(self) -> None:
        if hasattr(self, "_handle"):
            self._close_handle()


class TextFileSpout(FileSpout):
    """Each line as one field (``line``, or the one name in ``fields``)."""

    def __init__(self, path: str, fields: Sequence[str] = ("line",), *, skip_blank: bool = False,
                 **options: Any) -> None:
        if len(fields) != 1:
            raise ValueError(f"TextFileSpout emits one field per line, got fields {list(fields)}")
        self.skip_blank = skip_blank
        super().__init__(path, fields, **options)

    def parse(self, text: str, file: str, offset: int) -> list[Any] | None:
        return None if self.skip_blank and not text.strip() else [text]


class JsonLinesSpout(FileSpout):
    """One JSON object per line; ``fields`` picks its keys (a missing key is ``None``).
    Without ``fields`` the whole object is one field, ``record``. Blank lines are skipped."""

    def __init__(self, path: str, fields: Sequence[str] | None = None, **options: Any) -> None:
        self.whole = fields is None
        super().__init__(path, ("record",) if fields is None else fields, **options)

    def parse(self, text: str, file: str, offset: int) -> list[Any] | None:
        if not text.strip():
            return None
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"not JSON: {e}") from None
        if not isinstance(obj, dict):
            raise ValueError(f"a JSON {type(obj).__name__}, not an object")
        return [obj] if self.whole else [obj.get(f) for f in self.fields]


_CONVERT = {"str": str, "int": int, "float": float}


class CsvSpout(FileSpout):
    """One CSV record per line (quoted fields may not span lines). With ``header`` (the
    default) each file's first line names its columns and ``fields`` are picked by name;
    without, ``fields`` name the columns in order. ``types`` converts columns
    (``{"ts": "int", "price": "float"}``; an empty value becomes ``None``); the rest stay
    strings. Blank lines are skipped."""

    def __init__(self, path: str, fields: Sequence[str], *, header: bool = True, delimiter: str = ",",
                 types: Mapping[str, str] | None = None, **options: Any) -> None:
        self.header = header
        self.delimiter = delimiter
        self.types = dict(types or {})
        bad = {k: v for k, v in self.types.items() if v not in _CONVERT or k not in fields}
        if bad:
            raise ValueError(f"types {bad}: each must name one of fields {list(fields)} and be one of "
                             f"{', '.join(_CONVERT)}")
        super().__init__(path, fields, **options)
        self._convert = [(i, _CONVERT[self.types[f]]) for i, f in enumerate(self.fields)
                         if self.types.get(f, "str") != "str"]
        self._picks: dict[str, list[int]] = {}

    def _row(self, text: str) -> list[str]:
        return next(csv.reader([text], delimiter=self.delimiter), [])

    def _read_header(self, file: str, f: IO[bytes]) -> int:
        f.seek(0)
        line = f.readline(self.max_line_bytes + 1)
        if not line.endswith(b"\n") and (self.follow or not line):
            return 0                        # no header yet: the file is empty or being written
        names = self._row(line.decode(self.encoding).rstrip("\r\n"))
        missing = [n for n in self.fields if n not in names]
        if missing:
            raise ValueError(f"{file}: the header {names} has no column(s) {missing}")
        self._picks[file] = [names.index(n) for n in self.fields]
        return len(line)

    def start_file(self, file: str, f: IO[bytes]) -> int:
        return self._read_header(file, f) if self.header else 0

    def resume_file(self, file: str, f: IO[bytes]) -> None:
        if self.header:
            self._read_header(file, f)

    def parse(self, text: str, file: str, offset: int) -> list[Any] | None:
        if not text.strip():
            return None
        row = self._row(text)
        picks = self._picks.get(file) if self.header else range(len(self.fields))
        assert picks is not None
        if len(row) <= max(picks):
            raise ValueError(f"{len(row)} columns, expected at least {max(picks) + 1}")
        values: list[Any] = [row[i] for i in picks]
        for i, convert in self._convert:
            values[i] = None if values[i] == "" else convert(values[i])
        return values


__all__ = ["END_STREAM", "END_FIELDS", "FileSpout", "TextFileSpout", "JsonLinesSpout", "CsvSpout"]
