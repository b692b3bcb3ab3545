"""A stream join: two streams joined by key within a window, like Storm's ``JoinBolt``.

```python
from topo.join import JoinBolt
join = JoinBolt(left="orders", right="payments", left_key=["order_id"], right_key=["order"],
                left_fields=["order_id", "amount"], right_fields=["paid"], how="left",
                size_s=60, timestamp_field="ts", lateness_s=5)
builder.bolt("join", join).fields("orders", "order_id").fields("payments", "order")
```

``left`` and ``right`` name the inputs, each a component id or ``component:stream``.
Tuples of both are buffered per key in event-time windows (``size_s``, and ``slide_s``
for sliding ones; ``time="processing"`` works too, with the same options as
``topo.windows``). The watermark is the lesser of the two sides' (each side's largest
timestamp minus ``lateness_s``; a side whose source sent its ``end`` is done), so a
fast side does not make a slow side's tuples late. When a window closes it emits, in arrival order, one tuple
``[*left_fields, *right_fields]`` per pair of a left and a right tuple with the same
key (``how="inner"``), and with ``how="left"`` also each left tuple that has no match,
its right fields ``None``. ``fields`` renames the output (the default: the left and
right field names, which must then differ). Both inputs must be grouped by the key (a
fields grouping on ``left_key`` and on ``right_key``) so a key's tuples meet in one
task. A late tuple goes to the ``late`` stream as ``[side, *key, timestamp]``.
The buffered tuples are checkpointed and evicted when their window closes.
"""
from __future__ import annotations

from typing import Any, Sequence

from topo.api import DEFAULT_STREAM, Tuple
from topo.windows import Aggregate, SlidingWindow

LEFT, RIGHT = 0, 1


class _Buffer(Aggregate):
    """A window's tuples: ``[left rows, right rows]``."""

    def zero(self) -> Any:
        return [[], []]

    def add(self, acc: Any, value: Any) -> Any:
        side, row = value
        acc[side].append(row)
        return acc

    def merge(self, a: Any, b: Any) -> Any:
        return [a[0] + b[0], a[1] + b[1]]


class JoinBolt(SlidingWindow):
    """Joins ``left`` and ``right`` by key within a window (see the module docstring)."""

    def __init__(self, left: str, right: str, left_key: Sequence[str], left_fields: Sequence[str],
                 right_fields: Sequence[str], *, right_key: Sequence[str] | None = None, how: str = "inner",
                 size_s: float, slide_s: float | None = None, fields: Sequence[str] | None = None,
                 **options: Any) -> None:
        if how not in ("inner", "left"):
            raise ValueError(f"how must be 'inner' or 'left', got {how!r}")
        if left == right:
            raise ValueError(f"left and right are both {left!r}")
        right_key = left_key if right_key is None else right_key
        if not left_key or len(left_key) != len(right_key):
            raise ValueError(f"left_key {list(left_key)} and right_key {list(right_key)} must name as many "
                             f"fields, at least one")
        for opt in ("agg", "value_field", "as_field", "key_fields", "late_fields"):
            if opt in options:
                raise ValueError(f"JoinBolt takes no {opt!r}")
        self.left, self.right, self.how = left, right, how
        self.left_key, self.right_key = tuple(left_key), tuple(right_key)
        self.left_fields, self.right_fields = tuple(left_fields), tuple(right_fields)
        out = tuple(fields) if fields is not None else self.left_fields + self.right_fields
        if len(out) != len(self.left_fields) + len(self.right_fields) or len(set(out)) != len(out):
            raise ValueError(f"output fields {list(out)} must be {len(self.left_fields) + len(self.right_fields)} "
                             f"distinct names (rename clashing left and right fields with 'fields')")
        ts = options.get("timestamp_field", "ts")
        super().__init__(size_s, size_s if slide_s is None else slide_s, agg=_Buffer(),
                         late_fields=("side", *self.left_key, ts), **options)
        self.outputs[DEFAULT_STREAM] = out
        self._key = self._join_key

    # the watermark is the lesser of the two sides': a window closes once both passed it
    watermark_inputs = (LEFT, RIGHT)

    def _input_of(self, tup: Tuple) -> Any:
        return self._side(tup)

    def _inputs_ended_by(self, component: str) -> Any:
        return [side for side, name in ((LEFT, self.left), (RIGHT, self.right))
                if name.split(":", 1)[0] == component]

    def _group_of(self, component: str, stream: str) -> Any:
        for side, name in ((LEFT, self.left), (RIGHT, self.right)):
            if name == component or name == f"{component}:{stream}":
                return side
        return None

    def _side(self, tup: Tuple) -> int:
        for side, name in ((LEFT, self.left), (RIGHT, self.right)):
            if name == tup.source_component or name == f"{tup.source_component}:{tup.stream}":
                return side
        raise ValueError(f"a tuple from {tup.source_component}:{tup.stream} is neither left {self.left!r} "
                         f"nor right {self.right!r}")

    def _join_key(self, tup: Tuple) -> Any:
        names = self.left_key if self._side(tup) == LEFT else self.right_key
        return tup[names[0]] if len(names) == 1 else tuple(tup[n] for n in names)

    def _value(self, tup: Tuple) -> Any:
        side = self._side(tup)
        return [side, [tup[f] for f in (self.left_fields if side == LEFT else self.right_fields)]]

    def _late_values(self, tup: Tuple) -> list[Any]:
        key = self._key(tup)
        keys = [key] if len(self.left_key) == 1 else list(key)
        return ["left" if self._side(tup) == LEFT else "right", *keys, tup[self.timestamp_field]]

    def emit_window(self, key: Any, start: Any, end: Any, acc: Any) -> None:
        lefts, rights = acc
        emit = self.collector.emit
        for row in lefts:
            if rights:
                for other in rights:
                    emit([*row, *other])
            elif self.how == "left":
                emit([*row, *([None] * len(self.right_fields))])


__all__ = ["JoinBolt"]
