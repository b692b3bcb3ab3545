"""The Python streaming data source that reads a topology's offset sources on Spark.

One source per spout. Spark runs the reader (``OffsetStreamReader``) in a Python
process of its own, for the whole query: ``initialOffset``, ``latestOffset``,
``partitions`` and ``commit`` are called there, ``read`` in the Python workers of the
executors. So nothing is shared with the driver's objects:

* **Admission control** (document 001, step 4): ``latestOffset(start, limit)`` reads the
  controller's current cap from the rate file the driver publishes
  (``write_rate``/``read_rate``: a small JSON file replaced atomically) and lets each
  source partition advance by ``rate * t_interval / P`` records, or all that remains
  (``per_partition_cap``). A trigger that fires after the boundary the cap was decided
  for (the previous batch ran over it) has that much less time before the next one: the
  reader cuts the cap by the marginal rate published with it (``late_start_rate``), so
  the batch ends by the next boundary. With ``ReadAllAvailable`` (Trigger.AvailableNow), Spark's
  limit wins and the cap is ignored, as the API requires. ``ReadMaxRows`` (from
  ``spark.max_rows_per_batch``) trims the batch further.
* **Batch starts** go back the same way: when ``latestOffset`` admits rows, the reader
  writes a start report (time, rows, cap) that the driver's submission ticker reads to
  tell the controller a batch is running (document 001, 3.2.1).
* **Stopping** (``write_stop``): once the driver decides to stop, the reader admits no
  more rows (``latestOffset`` returns the start offsets), so the batch in flight is the
  last one and the query can be stopped after it instead of in the middle of it.
* **Chained bolts** (``spark.chain``, ``runtime.spark.plan.chains``): the ``chain``
  option carries the plans of the bolts that run inside this reader; ``read`` passes
  its rows through each in turn (the ``mapInArrow`` function each would have run in a
  stage of its own), so the source's rows are the last bolt's. Spark's
  ``numInputRows`` then counts those, not the records read, so the driver counts a
  batch's records by its offsets (``runtime.observe.spark_progress.source_rows``).
* **Pre-sharding** (step 2): ``partitions(start, end)`` splits each source partition's
  range into ``map_num`` Spark partitions (``runtime.spark.presharding``); a partition
  carries only ``(partition, start, end)`` and ``read`` fetches the records when the
  Spark task runs.

Rows are ``(src, stream, v)``: the spout's component id, ``"default"``, and the tuple's
values as a msgpack list, the same bus format every bolt stage uses. ``read`` yields
Arrow record batches, so there is no per-row conversion in Spark's Python layer.
"""
from __future__ import annotations

import base64
import json
import os
import pickle
import time
from pathlib import Path
from typing import Any, Iterator, Mapping

import msgpack

from backpressure.policy.rate_control import LATE_FLOOR, late_start_rate, per_partition_cap
from runtime.spark.bolts import StagePlan, enter_workdir, partition_function
from runtime.spark.presharding import preshard
from topo.sources.base import OffsetSource

try:  # the reader and tasks import this module; keep it importable without Spark
    from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows
except ImportError:  # pragma: no cover - the engine checks for pyspark first
    DataSource = DataSourceStreamReader = InputPartition = object  # type: ignore[assignment,misc]
    ReadAllAvailable = ReadLimit = ReadMaxRows = object  # type: ignore[assignment,misc]

SOURCE_NAME = "topo_offsets"
BUS_SCHEMA = "src string, stream string, v binary"
READ_CHUNK = 8192
MAX_STATE_FILE = 64 * 1024
NO_ROW_LIMIT = 1 << 62


# -- driver <-> reader state files --------------------------------------------------------

def _atomic_write(path: Path, payload: Mapping[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(payload))
    os.replace(tmp, path)


def _bounded_read(path: Path) -> dict[str, Any] | None:
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_STATE_FILE + 1)
    except FileNotFoundError:
        return None
    if len(raw) > MAX_STATE_FILE:
        raise ValueError(f"{path}: state file over {MAX_STATE_FILE} bytes")
    try:
        out = json.loads(raw)
    except ValueError:
        return None  # a torn write cannot happen with os.replace, but never crash the reader
    return out if isinstance(out, dict) else None


def rate_path(state_dir: str, component: str) -> Path:
    return Path(state_dir) / f"{component}.rate.json"


def start_path(state_dir: str, component: str) -> Path:
    return Path(state_dir) / f"{component}.start.json"


def stop_path(state_dir: str) -> Path:
    return Path(state_dir) / "stopping"


def write_stop(state_dir: str) -> None:
    """The driver is stopping the query: every reader of this run admits nothing more."""
    stop_path(state_dir).touch()


def clear_stop(state_dir: str) -> None:
    """A run starts (a ``spark.state_dir`` kept from a stopped run holds the marker)."""
    stop_path(state_dir).unlink(missing_ok=True)


def write_rate(state_dir: str, component: str, rate: float | None, submit_time: float,
               marginal: float | None = None, floor: float = LATE_FLOOR) -> None:
    """The driver publishes the cap (records/s for the whole source) for the batch due at
    ``submit_time``, and the controller's marginal rate for cutting it if that batch
    starts late (``None``: never cut) with the share of the cap a cut keeps (``floor``,
    ``spark.late_floor``)."""
    _atomic_write(rate_path(state_dir, component),
                  {"rate": rate, "submit": submit_time, "marginal": marginal, "floor": floor, "t": time.time()})


def read_rate(state_dir: str, component: str, now: float | None = None,
              interval: float = 1.0) -> tuple[bool, float | None]:
    """``(found, rate)``; ``rate`` None means no cap. Given ``now`` (when the trigger
    fired) and the trigger ``interval``, the cap of a trigger later than the boundary it
    was decided for is cut by ``late_start_rate``."""
    got = _bounded_read(rate_path(state_dir, component))
    if got is None:
        return False, None
    rate = got.get("rate")
    rate = None if rate is None else float(rate)
    marginal = got.get("marginal")
    if now is not None and rate is not None and marginal is not None:
        lateness = now - float(got.get("submit", now))
        floor = float(got.get("floor", LATE_FLOOR))
        rate = late_start_rate(rate, float(marginal), lateness, interval, min(1.0, max(floor, 0.0)))
    return True, rate


def write_start(state_dir: str, component: str, t: float, rows: int, rate: float | None) -> None:
    _atomic_write(start_path(state_dir, component), {"t": t, "rows": rows, "rate": rate})


def read_start(state_dir: str, component: str) -> dict[str, Any] | None:
    return _bounded_read(start_path(state_dir, component))


# -- options ---------------------------------------------------------------------------------

def encode_source(source: OffsetSource) -> str:
    return base64.b64encode(pickle.dumps(source)).decode("ascii")


def decode_source(text: str) -> OffsetSource:
    return pickle.loads(base64.b64decode(text))


def encode_chain(plans: list[StagePlan]) -> str:
    """The ``chain`` option: the chained bolts' plans, pickled as Spark pickles the
    functions of its own stages (cloudpickle: a topology built in ``__main__`` ships too)."""
    from pyspark import cloudpickle

    return base64.b64encode(cloudpickle.dumps(plans)).decode("ascii")


def decode_chain(text: str) -> list[StagePlan]:
    return pickle.loads(base64.b64decode(text)) if text else []


def source_options(component: str, source: OffsetSource, pick: list[int], *, core_num: int,
                   interval_s: float, state_dir: str, bound: dict[int, int] | None,
                   max_rows: int | None) -> dict[str, str]:
    """The string options ``spark.readStream.format(SOURCE_NAME)`` takes."""
    return {
        "component": component,
        "source": encode_source(source),
        "pick": json.dumps(pick),
        "core_num": str(core_num),
        "interval_s": repr(interval_s),
        "state_dir": state_dir,
        "bound": json.dumps(None if bound is None else {str(p): o for p, o in bound.items()}),
        "max_rows": str(max_rows or NO_ROW_LIMIT),
    }


# -- admission arithmetic (pure; the reader calls it) -----------------------------------------

def admit(start: Mapping[int, int], latest: Mapping[int, int], bound: Mapping[int, int] | None,
          per_partition: int | None, max_rows: int | None) -> dict[int, int]:
    """End offsets for one batch: each partition advances by at most ``per_partition``
    records (None: no cap), never past ``latest`` or ``bound``, and the batch holds at
    most ``max_rows`` in all (taken partition by partition in order)."""
    end: dict[int, int] = {}
    budget = max_rows
    for p in sorted(start):
        s = start[p]
        e = latest.get(p, s)
        if bound is not None:
            e = min(e, bound.get(p, e))
        if per_partition is not None:
            e = min(e, s + per_partition)
        e = max(e, s)
        if budget is not None:
            e = min(e, s + budget)
            budget -= e - s
        end[p] = e
    return end


# -- the data source ------------------------------------------------------------------------

class ShardPartition(InputPartition):  # type: ignore[misc,valid-type]
    """One pre-shard: records ``[start, end)`` of source partition ``partition``."""

    def __init__(self, partition: int, start: int, end: int) -> None:
        super().__init__((partition, start, end))
        self.partition = partition
        self.start = start
        self.end = end


def _offsets(d: Mapping[str, Any]) -> dict[int, int]:
    return {int(k): int(v) for k, v in d.items()}


class OffsetStreamReader(DataSourceStreamReader):  # type: ignore[misc,valid-type]
    def __init__(self, options: Mapping[str, str]) -> None:
        self.component = options["component"]
        self.source = decode_source(options["source"])
        self.pick = json.loads(options["pick"])
        self.core_num = int(options["core_num"])
        self.interval_s = float(options["interval_s"])
        self.state_dir = options["state_dir"]
        bound = json.loads(options.get("bound") or "null")
        self.bound = None if bound is None else _offsets(bound)
        self.max_rows = int(options.get("max_rows") or NO_ROW_LIMIT)
        self.partition_count = self.source.num_partitions()
        self.workdir = options.get("workdir") or None   # the driver's directory, on a cluster on this machine
        self.chain = options.get("chain") or ""          # decoded where read runs: it imports the bolts

    def initialOffset(self) -> dict[str, int]:
        return {str(p): 0 for p in range(self.partition_count)}

    def getDefaultReadLimit(self) -> Any:
        return ReadMaxRows(self.max_rows)

    def latestOffset(self, start: dict[str, int], limit: Any) -> dict[str, int]:
        begin = _offsets(start)
        if stop_path(self.state_dir).exists():
            return {str(p): o for p, o in begin.items()}     # stopping: no new batch
        latest = self.source.latest()
        if isinstance(limit, ReadAllAvailable):
            rate, per_partition, max_rows = None, None, None
        else:
            found, rate = read_rate(self.state_dir, self.component, time.time(), self.interval_s)
            per_partition = per_partition_cap(rate, self.interval_s, self.partition_count) if found else None
            max_rows = getattr(limit, "max_rows", None)
        end = admit(begin, latest, self.bound, per_partition, max_rows)
        rows = sum(end[p] - begin[p] for p in begin)
        if rows:
            write_start(self.state_dir, self.component, time.time(), rows, rate)
        return {str(p): o for p, o in end.items()}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[ShardPartition]:
        a, b = _offsets(start), _offsets(end)
        ranges = {p: (a.get(p, 0), b[p]) for p in b}
        return [ShardPartition(s.partition, s.start, s.end) for s in preshard(ranges, self.core_num)]

    def read(self, partition: ShardPartition) -> Iterator[Any]:
        enter_workdir(self.workdir)
        batches = self._records(partition)
        for plan in decode_chain(self.chain):
            batches = partition_function(plan)(batches)
        yield from batches

    def _records(self, partition: ShardPartition) -> Iterator[Any]:
        """The partition's records as bus batches of ``READ_CHUNK`` rows."""
        import pyarrow as pa

        pick = self.pick
        packb = msgpack.packb
        values: list[bytes] = []
        for record in self.source.read(partition.partition, partition.start, partition.end):
            values.append(packb([record[i] for i in pick]))
            if len(values) >= READ_CHUNK:
                yield _bus_batch(pa, self.component, values)
                values = []
        if values:
            yield _bus_batch(pa, self.component, values)

    def commit(self, end: dict[str, int]) -> None:
        return None

    def stop(self) -> None:
        self.source.close()


def _bus_batch(pa: Any, component: str, values: list[bytes]) -> Any:
    n = len(values)
    return pa.RecordBatch.from_arrays(
        [pa.array([component] * n, pa.string()), pa.array(["default"] * n, pa.string()),
         pa.array(values, pa.binary())],
        names=["src", "stream", "v"])


class OffsetDataSource(DataSource):  # type: ignore[misc,valid-type]
    """``spark.readStream.format("topo_offsets").options(**source_options(...))``."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> str:
        return BUS_SCHEMA

    def streamReader(self, schema: Any) -> OffsetStreamReader:
        return OffsetStreamReader(self.options)
