"""Windows: an aggregate per key and window, emitted once when the window closes.

```python
from topo.windows import TumblingWindow
per_minute = TumblingWindow(size_s=60, key_fields=["user"], timestamp_field="ts",
                            lateness_s=10, agg="count", as_field="events")
builder.bolt("per_minute", per_minute).fields("parse", "user")
```

The same from YAML: ``class: topo.windows.TumblingWindow`` with those ``kwargs``.

Window types (each a bolt; subscribe it with a fields grouping on ``key_fields``):

* ``TumblingWindow(size_s)``: ``[k * size, (k + 1) * size)``, aligned to 0;
* ``SlidingWindow(size_s, slide_s)``: windows of ``size_s`` starting every ``slide_s``;
  a tuple belongs to ``size_s / slide_s`` of them;
* ``SessionWindow(gap_s)``: per key, tuples less than ``gap_s`` apart form one session
  ``[first, last + gap_s)``; a tuple exactly ``gap_s`` after the last starts a new one.
  An out-of-order tuple may join two sessions into one;
* ``CountWindow(size, slide=None)``: Storm's count windows, per key: every ``slide``
  tuples (default ``size``: tumbling), the aggregate of the last ``size`` tuples.

**Time.** ``time="event"`` (the default) reads the tuple's ``timestamp_field`` (a number,
in seconds). Each upstream task is a channel: the watermark of a window task is the least,
over its upstream tasks, of the largest timestamp each sent, minus ``lateness_s`` (Flink's
rule, so a fast upstream task does not make a slow one's tuples late). A window
``[start, end)`` closes, and its aggregate is emitted, when the watermark reaches ``end``.
A tuple whose windows have all closed is late: it goes to the ``late_stream`` (``late``;
``None`` drops it) with ``late_fields``. So a tuple exactly ``lateness_s`` behind is still
on time. ``time="processing"`` stamps each tuple with ``clock()`` (``time.time`` unless
given, so tests are exact) and closes windows on the tick (``tick_s``) once ``clock()``
passes their end.

**Idle and finite inputs.** The engine tells each task its upstream tasks; one that has
sent nothing yet holds the watermark back. An upstream task that sent nothing for
``channel_idle_s`` (60 s; ``None``: wait for ever, as Flink without ``withIdleness``) is
left out of the minimum until it sends again (its tuples then behind the watermark are
late), so a quiet channel does not stall the windows for ever. With ``idle_s`` set, a
task that received nothing at all for ``idle_s`` seconds lets its watermark advance
with the clock (on the tick), so the last windows close while the source is quiet.
When every spout has run out by itself (a bounded input, not a stop), the local engine
calls ``end_of_input`` and every open window closes (Flink's MAX_WATERMARK), so a
bounded file gives complete results. A file source from ``topo.sources.files`` also
emits one tuple on its ``end`` stream; a window subscribed to it with an ``all``
grouping closes its windows when every task of each source that sent an end has ended
(with worker processes, where the end-of-input hook does not run, this is the way).

**Aggregates.** ``agg`` is ``count``, ``sum``, ``min``, ``max``, ``mean`` (of
``value_field``), a function (or its dotted name, from YAML) given the list of
``value_field`` values (or of the tuples as dicts when no ``value_field``), or an
``Aggregate``. Each window emits ``[*key_fields, window_start, window_end, as_field]``
on the default stream, once. Closed windows are evicted.

**State.** Open windows, the watermark and the ended sources are the bolt's
checkpointed state (``snapshot_state`` / ``restore_state``), so a restart with
checkpoints on resumes them exactly.

On the Spark engine tumbling and sliding event-time windows with a built-in aggregate run
as Spark's own windowed aggregation (``runtime.spark.windows`` says what differs); the
others are refused at start in one line naming the bolt.
"""
from __future__ import annotations

import heapq
import importlib
import math
import time as _time
from collections import deque
from typing import Any, Callable, Iterable, Sequence

from topo.api import DEFAULT_STREAM, Bolt, OutputCollector, TaskContext, Tuple
from topo.sources.files import END_STREAM
from topo.state import hashable_key

INF = math.inf


# -- aggregates ------------------------------------------------------------------------------

class Aggregate:
    """An incremental aggregate: ``zero``, ``add`` a value, ``merge`` two (sessions), ``result``.
    Accumulators must be msgpack-serialisable (they are checkpointed)."""

    name = "value"

    def zero(self) -> Any:
        raise NotImplementedError

    def add(self, acc: Any, value: Any) -> Any:
        raise NotImplementedError

    def merge(self, a: Any, b: Any) -> Any:
        raise NotImplementedError

    def result(self, acc: Any) -> Any:
        return acc


class Count(Aggregate):
    name = "count"

    def zero(self) -> Any:
        return 0

    def add(self, acc: Any, value: Any) -> Any:
        return acc + 1

    def merge(self, a: Any, b: Any) -> Any:
        return a + b


class Sum(Aggregate):
    name = "sum"

    def zero(self) -> Any:
        return 0

    def add(self, acc: Any, value: Any) -> Any:
        return acc + value

    def merge(self, a: Any, b: Any) -> Any:
        return a + b


class Min(Aggregate):
    name = "min"
    pick = staticmethod(min)

    def zero(self) -> Any:
        return None

    def add(self, acc: Any, value: Any) -> Any:
        return value if acc is None else self.pick(acc, value)

    def merge(self, a: Any, b: Any) -> Any:
        return b if a is None else self.add(a, b) if b is not None else a


class Max(Min):
    name = "max"
    pick = staticmethod(max)


class Mean(Aggregate):
    name = "mean"

    def zero(self) -> Any:
        return [0, 0]

    def add(self, acc: Any, value: Any) -> Any:
        return [acc[0] + value, acc[1] + 1]

    def merge(self, a: Any, b: Any) -> Any:
        return [a[0] + b[0], a[1] + b[1]]

    def result(self, acc: Any) -> Any:
        return acc[0] / acc[1] if acc[1] else None


class Collect(Aggregate):
    """Keeps the window's values; ``result`` is ``fn(values)``."""

    def __init__(self, fn: Callable[[list[Any]], Any], name: str = "value") -> None:
        self.fn = fn
        self.name = name

    def zero(self) -> Any:
        return []

    def add(self, acc: Any, value: Any) -> Any:
        acc.append(value)
        return acc

    def merge(self, a: Any, b: Any) -> Any:
        return a + b

    def result(self, acc: Any) -> Any:
        return self.fn(acc)


AGGREGATES: dict[str, type[Aggregate]] = {"count": Count, "sum": Sum, "min": Min, "max": Max, "mean": Mean}


def make_aggregate(agg: str | Callable[[list[Any]], Any] | Aggregate, value_field: str | None) -> Aggregate:
    """``agg`` as an ``Aggregate``: a name of ``AGGREGATES``, a dotted name of a function, a
    function of the window's values, or an ``Aggregate``."""
    if isinstance(agg, Aggregate):
        return agg
    if isinstance(agg, str):
        if agg in AGGREGATES:
            if agg != "count" and value_field is None:
                raise ValueError(f"agg {agg!r} needs a value_field")
            return AGGREGATES[agg]()
        if "." not in agg:
            raise ValueError(f"unknown agg {agg!r}: one of {', '.join(AGGREGATES)}, a function, or the "
                             f"dotted name of one (mypkg.module.function)")
        module, _, name = agg.rpartition(".")
        fn = getattr(importlib.import_module(module), name, None)
        if not callable(fn):
            raise ValueError(f"agg {agg!r}: {module} has no function {name!r}")
        return Collect(fn, "value")
    if callable(agg):
        return Collect(agg, "value")
    raise ValueError(f"agg must be a name, a function or an Aggregate, got {agg!r:.80}")


def _key_getter(key_fields: tuple[str, ...]) -> Callable[[Tuple], Any]:
    if not key_fields:
        return lambda tup: None
    if len(key_fields) == 1:
        name = key_fields[0]
        return lambda tup: tup[name]
    return lambda tup: tuple(tup[f] for f in key_fields)


def _key_values(key_fields: tuple[str, ...], key: Any) -> list[Any]:
    if not key_fields:
        return []
    return [key] if len(key_fields) == 1 else list(key)


class _Keyed(Bolt):
    """What every window bolt shares: key, aggregate, output fields."""

    def __init__(self, key_fields: Sequence[str], agg: Any, value_field: str | None,
                 as_field: str | None) -> None:
        self.key_fields = tuple(key_fields)
        self.aggregate = make_aggregate(agg, value_field)
        self.value_field = value_field
        self.as_field = as_field or self.aggregate.name
        self.outputs = {DEFAULT_STREAM: (*self.key_fields, "window_start", "window_end", self.as_field)}
        self._key = _key_getter(self.key_fields)
        # a function without value_field gets whole tuples; a count needs no value at all
        self._whole = value_field is None and isinstance(self.aggregate, Collect)

    def _value(self, tup: Tuple) -> Any:
        if self.value_field is not None:
            return tup[self.value_field]
        return tup.as_dict() if self._whole else None


# -- time windows ----------------------------------------------------------------------------

class WindowedBolt(_Keyed):
    """Base of the time windows (see the module docstring); subclasses say which windows a
    timestamp belongs to (``assign``) or merge them (sessions)."""

    def __init__(self, *, key_fields: Sequence[str] = (), agg: Any = "count", value_field: str | None = None,
                 as_field: str | None = None, time: str = "event", timestamp_field: str = "ts",
                 lateness_s: float = 0, late_stream: str | None = "late",
                 late_fields: Sequence[str] | None = None, end_stream: str = END_STREAM,
                 idle_s: float | None = None, channel_idle_s: float | None = 60.0, tick_s: float = 1.0,
                 clock: Callable[[], float] | None = None) -> None:
        super().__init__(key_fields, agg, value_field, as_field)
        if time not in ("event", "processing"):
            raise ValueError(f"time must be 'event' or 'processing', got {time!r}")
        if lateness_s < 0:
            raise ValueError(f"lateness_s must be >= 0, got {lateness_s!r}")
        if idle_s is not None and idle_s <= 0:
            raise ValueError(f"idle_s must be > 0, got {idle_s!r}")
        if channel_idle_s is not None and channel_idle_s <= 0:
            raise ValueError(f"channel_idle_s must be > 0 (or None: wait for ever), got {channel_idle_s!r}")
        self.time = time
        self.timestamp_field = timestamp_field
        self.lateness_s = lateness_s
        self.late_stream = late_stream if time == "event" else None
        self.end_stream = end_stream
        self.idle_s = idle_s
        self.channel_idle_s = channel_idle_s
        self.clock = clock or _time.time
        if late_fields is None:
            late_fields = [*self.key_fields, timestamp_field] + ([value_field] if value_field else [])
        self.late_fields = tuple(dict.fromkeys(late_fields))
        if self.late_stream:
            self.outputs[self.late_stream] = self.late_fields
        ticks = time == "processing" or idle_s is not None or channel_idle_s is not None
        self.tick_interval_s = tick_s if ticks else None
        self.late_count = 0

    def prepare(self, context: TaskContext, collector: OutputCollector) -> None:
        super().prepare(context, collector)
        self._windows: dict[tuple[Any, Any], list[Any]] = {}   # (key, start) -> [end, acc]
        self._heap: list[tuple[Any, int, Any, Any]] = []        # (end, seq, key, start)
        self._seq = 0
        # input (see ``watermark_inputs``) -> upstream task -> the largest timestamp it sent
        self._max: dict[Any, dict[int, Any]] = {}
        self._wm = -INF           # the watermark: windows with end <= it are closed
        self._last_arrival = self.clock()
        self._started = self._last_arrival
        self._arrival: dict[int, float] = {}     # upstream task -> when it last sent a tuple
        self._done: set[Any] = set()             # inputs that ended
        self._idle: set[int] = set()             # upstream tasks quiet for channel_idle_s (on the tick)
        # the upstream tasks of each input, as the engine says (Flink waits for every channel)
        self._expected: dict[Any, set[int]] = {}
        for name, tasks in getattr(context, "inputs", {}).items():
            component, _, stream = name.partition(":")
            group = self._group_of(component, stream)
            if group is not None:
                self._expected.setdefault(group, set()).update(tasks)
        self._waiting = {g: set(tasks) for g, tasks in self._expected.items()}   # ... not heard from yet
        self._track_arrivals = self.channel_idle_s is not None
        self._least = INF        # the least input watermark last computed (INF: compute it again)
        self._ended: dict[str, list[Any]] = {}   # source component -> [tasks ended, of how many]
        self._by_key: dict[Any, list[Any]] = {}  # sessions: key -> starts of its open sessions

    # -- what subclasses define ---------------------------------------------------------
    def assign(self, ts: Any) -> Iterable[tuple[Any, Any]]:
        """The windows ``(start, end)`` a timestamp belongs to."""
        raise NotImplementedError

    # -- the stream ---------------------------------------------------------------------
    def execute(self, tup: Tuple) -> None:
        if tup.stream == self.end_stream:
            self._on_end(tup)
            return
        now = self.clock()
        self._last_arrival = now
        if self.time == "processing":
            ts = now
            self._advance(now)
        else:
            ts = tup[self.timestamp_field]
            if not isinstance(ts, (int, float)) or isinstance(ts, bool):
                raise ValueError(f"{self.timestamp_field!r} is {ts!r:.40}, not a number of seconds")
        if not self._add(self._key(tup), ts, self._value(tup)):
            self.late_count += 1
            if self.late_stream:
                self.collector.emit(self._late_values(tup), self.late_stream)
        channel = tup.source_task
        if self._track_arrivals:
            self._arrival[channel] = now
            if self._idle:
                self._idle.discard(channel)
        group = self._input_of(tup)
        seen = self._max.get(group)
        if seen is None:
            seen = self._max[group] = {}
        last = seen.get(channel)
        if last is None:
            waiting = self._waiting.get(group)
            if waiting:
                waiting.discard(channel)
            seen[channel] = ts
            self._advance_inputs()
        elif ts > last:
            seen[channel] = ts
            if last <= self._least:       # it may have held the minimum back: look again
                self._advance_inputs()

    def tick(self) -> None:
        now = self.clock()
        if self.time == "processing":
            self._advance(now)
        else:
            if self.channel_idle_s is not None:
                self._mark_idle(now)
            self._advance_inputs()
            if self.idle_s is not None and now - self._last_arrival >= self.idle_s and self._max:
                furthest = [max(seen.values()) for seen in self._max.values() if seen]
                if furthest:   # the whole task is idle: its watermark moves on with the clock
                    self._advance(min(furthest) - self.lateness_s + (now - self._last_arrival))

    def end_of_input(self) -> None:
        """Every spout ran out (the engine's end-of-input hook): close every open window
        (Flink's MAX_WATERMARK at the end of a bounded input)."""
        self._done.update(self.watermark_inputs)
        self._advance(INF)

    # -- the watermark over inputs ------------------------------------------------------
    #: the inputs the watermark waits for: it is the least of their largest timestamps minus
    #: the lateness (one input here; a join has two, its left and its right)
    watermark_inputs: tuple[Any, ...] = (0,)

    def _input_of(self, tup: Tuple) -> Any:
        return 0

    def _group_of(self, component: str, stream: str) -> Any:
        """The input (of ``watermark_inputs``) that ``component:stream`` feeds; the end
        stream feeds none (it carries no timestamps)."""
        return None if stream == self.end_stream else 0

    def _inputs_ended_by(self, component: str) -> Iterable[Any]:
        """The inputs that end when every task of ``component`` sent its end: here the one
        input, once every source that sent an end has ended."""
        return (0,) if all(len(done) >= n for done, n in self._ended.values()) else ()

    def _mark_idle(self, now: float) -> None:
        """On the tick: the upstream tasks quiet for ``channel_idle_s`` (one never heard from
        counts from the start) are left out of the minimum until they send again."""
        limit = now - self.channel_idle_s   # type: ignore[operator]
        started = self._started
        arrival = self._arrival
        self._idle = {t for t, at in arrival.items() if at <= limit}
        for tasks in self._waiting.values():
            quiet = {t for t in tasks if arrival.get(t, started) <= limit}
            tasks -= quiet
            self._idle |= quiet

    def _input_watermark(self, group: Any) -> Any:
        """The least largest timestamp over the input's upstream tasks (Flink's per-channel
        minimum), leaving out the idle ones; -inf while a task the engine named has not
        sent yet, +inf once the input ended."""
        if group in self._done:
            return INF
        if self._waiting.get(group):
            return -INF
        seen = self._max.get(group)
        if not seen:
            return -INF
        idle = self._idle
        if idle:
            live = [m for t, m in seen.items() if t not in idle]
            return min(live) if live else max(seen.values())
        return min(seen.values())

    def _advance_inputs(self) -> None:
        inputs = self.watermark_inputs
        wm = self._input_watermark(inputs[0]) if len(inputs) == 1 else min(map(self._input_watermark, inputs))
        self._least = wm
        self._advance(wm - self.lateness_s)

    def _on_end(self, tup: Tuple) -> None:
        seen = self._ended.setdefault(tup.source_component, [[], int(tup["tasks"])])
        if tup["task"] not in seen[0]:
            seen[0].append(tup["task"])
        if len(seen[0]) >= seen[1]:
            self._done.update(self._inputs_ended_by(tup.source_component))
            self._advance_inputs()

    # -- windows --------------------------------------------------------------------------
    def _add(self, key: Any, ts: Any, value: Any) -> bool:
        """Add to the open windows of ``ts``; False when all of them are closed (late)."""
        agg, windows, wm = self.aggregate, self._windows, self._wm
        added = False
        for start, end in self.assign(ts):
            if end <= wm:
                continue
            slot = windows.get((key, start))
            if slot is None:
                slot = windows[(key, start)] = [end, agg.zero()]
                self._push(end, key, start)
            slot[1] = agg.add(slot[1], value)
            added = True
        return added

    def _push(self, end: Any, key: Any, start: Any) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (end, self._seq, key, start))

    def _advance(self, wm: Any) -> None:
        """Move the watermark to ``wm`` (never back) and emit every window it closes, by end."""
        if wm <= self._wm:
            return
        self._wm = wm
        heap, windows = self._heap, self._windows
        while heap and heap[0][0] <= wm:
            end, _, key, start = heapq.heappop(heap)
            slot = windows.get((key, start))
            if slot is None or slot[0] != end:
                continue      # merged away (sessions)
            del windows[(key, start)]
            self._closed(key, start, end)
            self.emit_window(key, start, end, slot[1])

    def emit_window(self, key: Any, start: Any, end: Any, acc: Any) -> None:
        """Emit a closed window's result (once)."""
        self.collector.emit([*_key_values(self.key_fields, key), start, end, self.aggregate.result(acc)])

    def _late_values(self, tup: Tuple) -> list[Any]:
        return [tup[f] for f in self.late_fields]

    def _closed(self, key: Any, start: Any, end: Any) -> None:
        """A window was evicted (sessions keep an index to update)."""

    @property
    def watermark(self) -> float:
        return self._wm

    def open_windows(self) -> list[tuple[Any, Any, Any, Any]]:
        """``(key, start, end, accumulator)`` of every open window, by end (tests, dumps)."""
        return [(k, s, e, self._windows[(k, s)][1]) for e, _, k, s in sorted(self._heap)
                if self._windows.get((k, s), [None])[0] == e]

    # -- checkpoints ----------------------------------------------------------------------
    def snapshot_state(self) -> Any:
        return {"windows": [list(w) for w in self.open_windows()],
                "max": [[g, t, m] for g, seen in self._max.items() for t, m in seen.items()],
                "done": list(self._done),
                "wm": self._wm,
                "ended": [[c, done, n] for c, (done, n) in self._ended.items()],
                "late": self.late_count}

    def restore_state(self, state: Any) -> None:
        self._windows, self._heap, self._seq, self._by_key = {}, [], 0, {}
        for key, start, end, acc in state["windows"]:
            key = hashable_key(key)
            self._windows[(key, start)] = [end, acc]
            self._push(end, key, start)
            self._index(key, start)
        self._max = {}
        for g, t, m in state["max"]:
            self._max.setdefault(g, {})[t] = m
        self._done = set(state.get("done", ()))
        self._waiting = {g: tasks - set(self._max.get(g, ())) for g, tasks in self._expected.items()}
        self._least = INF
        self._wm = state["wm"]
        self._ended = {c: [list(done), n] for c, done, n in state["ended"]}
        self.late_count = state.get("late", 0)

    def _index(self, key: Any, start: Any) -> None:
        """Sessions index their open windows by key."""


class TumblingWindow(WindowedBolt):
    """Windows ``[k * size_s, (k + 1) * size_s)``; see the module docstring for the options."""

    def __init__(self, size_s: float, **options: Any) -> None:
        if size_s <= 0:
            raise ValueError(f"size_s must be > 0, got {size_s!r}")
        self.size_s = size_s
        super().__init__(**options)

    def assign(self, ts: Any) -> Iterable[tuple[Any, Any]]:
        start = (ts // self.size_s) * self.size_s
        return ((start, start + self.size_s),)


class SlidingWindow(WindowedBolt):
    """Windows of ``size_s`` starting at every multiple of ``slide_s``."""

    def __init__(self, size_s: float, slide_s: float, **options: Any) -> None:
        if size_s <= 0 or slide_s <= 0 or slide_s > size_s:
            raise ValueError(f"need 0 < slide_s <= size_s, got size_s={size_s!r} slide_s={slide_s!r}")
        self.size_s = size_s
        self.slide_s = slide_s
        super().__init__(**options)

    def assign(self, ts: Any) -> Iterable[tuple[Any, Any]]:
        start = (ts // self.slide_s) * self.slide_s       # the latest window holding ts
        out = []
        while start > ts - self.size_s:
            out.append((start, start + self.size_s))
            start -= self.slide_s
        out.reverse()
        return out


class SessionWindow(WindowedBolt):
    """Per key, tuples less than ``gap_s`` apart form one session ``[first, last + gap_s)``."""

    def __init__(self, gap_s: float, **options: Any) -> None:
        if gap_s <= 0:
            raise ValueError(f"gap_s must be > 0, got {gap_s!r}")
        self.gap_s = gap_s
        super().__init__(**options)

    def _add(self, key: Any, ts: Any, value: Any) -> bool:
        windows = self._windows
        start, end = ts, ts + self.gap_s
        starts = self._by_key.get(key, [])
        merged = sorted(s for s in starts if s < end and start < windows[(key, s)][0])   # half-open overlap
        if not merged and end <= self._wm:
            return False      # late (a session it overlaps is open, so ends past the watermark)
        agg = self.aggregate
        acc = agg.zero()
        for s in merged:      # earlier sessions' values first, then the new one
            e, a = windows.pop((key, s))
            start, end = min(start, s), max(end, e)
            acc = agg.merge(acc, a)
        acc = agg.add(acc, value)
        self._by_key[key] = [s for s in starts if s not in merged] + [start]
        windows[(key, start)] = [end, acc]
        self._push(end, key, start)
        return True

    def _closed(self, key: Any, start: Any, end: Any) -> None:
        starts = self._by_key.get(key)
        if starts is not None:
            starts.remove(start)
            if not starts:
                del self._by_key[key]

    def _index(self, key: Any, start: Any) -> None:
        self._by_key.setdefault(key, []).append(start)


# -- count windows ---------------------------------------------------------------------------

class CountWindow(_Keyed):
    """Storm's count windows, per key: every ``slide`` tuples of a key (default ``size``,
    tumbling), the aggregate of its last ``size`` tuples. ``window_start`` and
    ``window_end`` number the key's tuples from 0, half-open. A window that never fills
    (the end of the stream) is not emitted, as in Storm."""

    def __init__(self, size: int, slide: int | None = None, *, key_fields: Sequence[str] = (),
                 agg: Any = "count", value_field: str | None = None, as_field: str | None = None) -> None:
        slide = size if slide is None else slide
        if not 0 < slide <= size:
            raise ValueError(f"need 0 < slide <= size, got size={size!r} slide={slide!r}")
        self.size = int(size)
        self.slide = int(slide)
        super().__init__(key_fields, agg, value_field, as_field)

    def prepare(self, context: TaskContext, collector: OutputCollector) -> None:
        super().prepare(context, collector)
        self._keys: dict[Any, list[Any]] = {}     # key -> [tuples seen, last `size` values]

    def execute(self, tup: Tuple) -> None:
        key = self._key(tup)
        slot = self._keys.get(key)
        if slot is None:
            slot = self._keys[key] = [0, deque(maxlen=self.size)]
        slot[0] += 1
        slot[1].append(self._value(tup))
        n = slot[0]
        if n >= self.size and (n - self.size) % self.slide == 0:
            agg = self.aggregate
            acc = agg.zero()
            for v in slot[1]:
                acc = agg.add(acc, v)
            self.collector.emit([*_key_values(self.key_fields, key), n - self.size, n, agg.result(acc)])
            if self.slide == self.size:
                slot[1].clear()

    def snapshot_state(self) -> Any:
        return [[k, n, list(vals)] for k, (n, vals) in self._keys.items()]

    def restore_state(self, state: Any) -> None:
        self._keys = {hashable_key(k): [n, deque(vals, maxlen=self.size)] for k, n, vals in state}


__all__ = ["Aggregate", "AGGREGATES", "make_aggregate", "WindowedBolt", "TumblingWindow", "SlidingWindow",
           "SessionWindow", "CountWindow"]
