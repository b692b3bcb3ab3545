"""The first-day example's one hand-written step: keep the tuples whose field has a value.

``configs/events_per_minute.yaml``: a JSON lines file (``JsonLinesSpout``) -> keep
``type == "click"`` (``Where``) -> count per user per minute (``TumblingWindow`` by event
time) -> SQLite (``SQLiteSink``), one row per user and minute.
"""
from __future__ import annotations

from typing import Any, Sequence

from topo.api import Bolt, Tuple


class Where(Bolt):
    """Passes on the tuples whose ``field`` equals ``equals`` (or is one of ``one_of``),
    with the fields it names in ``fields``."""

    def __init__(self, fields: Sequence[str], field: str, equals: Any = None,
                 one_of: Sequence[Any] | None = None) -> None:
        if field not in fields:
            raise ValueError(f"Where: field {field!r} is not one of fields {list(fields)}")
        self.outputs = list(fields)
        self.input_fields = tuple(fields)
        self.field = field
        self.allowed = list(one_of) if one_of is not None else [equals]

    def execute(self, tup: Tuple) -> None:
        if tup[self.field] in self.allowed:
            self.collector.emit([tup[f] for f in self.outputs])
