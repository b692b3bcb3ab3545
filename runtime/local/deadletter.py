"""Where tuples go that exhausted their retries: a JSON-lines file, one record each.

A record carries everything needed to inspect or re-inject the tuple: topology,
component, task, msg_id, stream, values, retries and the last error. Values that
JSON cannot hold (bytes, say) are written as their ``repr``.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import IO, Any, Sequence


class DeadLetterWriter:
    def __init__(self, path: str | Path, topology: str) -> None:
        self.path = Path(path)
        self.topology = topology
        self._file: IO[str] | None = None
        self.written = 0

    def write(self, component: str, task_id: int, msg_id: Any, stream: str,
              values: Sequence[Any], retries: int, error: str) -> None:
        if self._file is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = self.path.open("a", encoding="utf-8")
        record = {"time": time.time(), "topology": self.topology, "component": component,
                  "task": task_id, "msg_id": msg_id, "stream": stream, "values": list(values),
                  "retries": retries, "error": error}
        self._file.write(json.dumps(record, default=repr) + "\n")
        self._file.flush()
        self.written += 1

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
