"""Spouts over offset-addressable sources: what a topology names to be runnable on
both engines.

On the local engine these are ordinary spouts: task ``i`` of ``n`` reads the source
partitions ``p`` with ``p % n == i``, a chunk of at most ``batch`` records per
``next_tuple``, round robin over its partitions, and emits each record with
``msg_id = (partition, offset)`` (so acking can track it). On the Spark engine the
spout is not run: the engine asks it for ``source()`` and ``bound()`` and reads the
source through the streaming data source (pre-sharding, admission control), with the
same columns in the same order, so a bolt sees the same tuples on either engine.

``columns`` picks which record columns become the tuple (``LOG_COLUMNS`` or
``SYNTHETIC_COLUMNS``), ``fields`` names them (default: the column names).

Finite or not, as a Storm user would expect from the source: a message log spout with
``follow=False`` (the default) reads what the log holds when the topology starts and
then ends (``EndOfStream``), like reading a file; with ``follow=True`` it keeps polling
for new records like a Kafka spout. A synthetic spout ends after ``total`` records
when ``total`` is given, and runs forever otherwise.
"""
from __future__ import annotations

import asyncio
import time
from typing import Any, Sequence

from topo.api import EndOfStream, Spout, SpoutOutputCollector, TaskContext
from topo.sources.base import OffsetSource, select_columns
from topo.sources.log import open_log
from topo.sources.synthetic import SyntheticSource, make_profile

IDLE_SLEEP_S = 0.005


class OffsetSpout(Spout):
    """Base of the spouts over an ``OffsetSource``."""

    idle_sleep_s: float = IDLE_SLEEP_S

    def __init__(self, columns: Sequence[str], fields: Sequence[str] | None, batch: int) -> None:
        if batch < 1:
            raise ValueError("batch must be >= 1")
        self.columns = tuple(columns)
        self.fields = tuple(fields) if fields is not None else self.columns
        if len(self.fields) != len(self.columns):
            raise ValueError(f"fields {list(self.fields)} and columns {list(self.columns)} differ in length")
        self.outputs = list(self.fields)
        self.batch = batch

    # -- what the Spark engine asks -------------------------------------------------
    def source(self) -> OffsetSource:
        raise NotImplementedError

    def bound(self, source: OffsetSource) -> dict[int, int] | None:
        """End offsets when this spout's stream is finite (``None``: runs until stopped)."""
        raise NotImplementedError

    # -- the local engine -------------------------------------------------------------
    def open(self, context: TaskContext, collector: SpoutOutputCollector) -> None:
        super().open(context, collector)
        self._source = self.started_source()
        self._pick = select_columns(self._source.columns, self.columns)
        n = self._source.num_partitions()
        self._mine = [p for p in range(n) if p % context.parallelism == context.task_index]
        self._pos = {p: 0 for p in self._mine}
        bound = self.bound(self._source)
        self._bound = None if bound is None else {p: bound[p] for p in self._mine}
        self._turn = 0

    def started_source(self) -> OffsetSource:
        return self.source()

    def _latest(self) -> dict[int, int]:
        return self._source.latest()

    def _exhausted(self) -> bool:
        return self._bound is not None and all(self._pos[p] >= self._bound[p] for p in self._mine)

    async def next_tuple(self) -> None:
        if not self._mine or self._exhausted():
            raise EndOfStream()
        latest = self._latest()
        for _ in range(len(self._mine)):
            p = self._mine[self._turn % len(self._mine)]
            self._turn += 1
            end = latest.get(p, 0)
            if self._bound is not None:
                end = min(end, self._bound[p])
            start = self._pos[p]
            if end <= start:
                continue
            end = min(end, start + self.batch)
            pick = self._pick
            emit = self.collector.emit
            offset = start
            for record in self._source.read(p, start, end):
                emit([record[i] for i in pick], msg_id=(p, offset))
                offset += 1
            self._pos[p] = offset
            return
        await asyncio.sleep(self.idle_sleep_s)

    # -- checkpoints: the next offset to read, per partition of this task -------------
    def snapshot_state(self) -> Any:
        return {"pos": dict(self._pos)}

    def restore_state(self, state: Any) -> None:
        for p, offset in state["pos"].items():
            if int(p) in self._pos:
                self._pos[int(p)] = int(offset)

    def close(self) -> None:
        src = getattr(self, "_source", None)
        if src is not None:
            src.close()


class MessageLogSpout(OffsetSpout):
    """Reads a topic of the partitioned message log (``file:///dir``, a path, or ``redis://``)."""

    def __init__(self, log: str, topic: str, *, columns: Sequence[str] = ("key", "value"),
                 fields: Sequence[str] | None = None, follow: bool = False, batch: int = 256,
                 prefix: str = "topo") -> None:
        super().__init__(columns, fields, batch)
        self.log = log
        self.topic = topic
        self.follow = follow
        self.prefix = prefix
        select_columns(("partition", "offset", "key", "value", "timestamp"), self.columns)

    def source(self) -> OffsetSource:
        kwargs = {"prefix": self.prefix} if self.log.startswith("redis://") else {}
        return open_log(self.log, self.topic, **kwargs)

    def bound(self, source: OffsetSource) -> dict[int, int] | None:
        return None if self.follow else source.latest()


class SyntheticSpout(OffsetSpout):
    """A synthetic rate profile (``constant`` or ``bursty``); see ``topo.sources.synthetic``."""

    def __init__(self, profile: str = "constant", *, rate: float = 1000.0, per_period: int = 600_000,
                 period: float = 10.0, burst_fraction: float = 0.5, partitions: int = 4,
                 total: int | None = None, min_len: int = 16, max_len: int = 256, seed: int = 0,
                 columns: Sequence[str] = ("id", "payload"), fields: Sequence[str] | None = None,
                 batch: int = 256) -> None:
        super().__init__(columns, fields, batch)
        params: dict[str, Any] = {"rate": rate} if profile == "constant" else {
            "per_period": per_period, "period": period, "burst_fraction": burst_fraction}
        self.spec = SyntheticSource(make_profile(profile, **params), partitions, total, min_len, max_len, seed)
        select_columns(self.spec.columns, self.columns)

    def source(self) -> SyntheticSource:
        return self.spec

    def started_source(self) -> OffsetSource:
        return self.spec.started_at(time.time())

    def bound(self, source: OffsetSource) -> dict[int, int] | None:
        return self.spec.bound()
