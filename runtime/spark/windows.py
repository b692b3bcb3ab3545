"""Window bolts on Spark: Spark's own event-time windowing, where it means the same.

A ``TumblingWindow`` or ``SlidingWindow`` (``topo.windows``) by event time, with a built-in
aggregate (``count``, ``sum``, ``min``, ``max``, ``mean``), becomes

    rows.withWatermark(ts, "<lateness_s> seconds")
        .groupBy(window(ts, "<size_s> seconds", "<slide_s> seconds"), key)
        .agg(...)

in append mode: each window is emitted once, when Spark's watermark (the largest event
time seen, minus the allowed lateness) passes its end, and dropped from the state store;
the windows are aligned to 0 as on the local engine, so the rows are the same
``[*key_fields, window_start, window_end, value]``. What differs, said plainly:

* Spark advances its watermark between micro-batches, over all partitions at once (not
  per upstream task), and drops late rows silently: nothing is emitted on the ``late``
  stream, so a topology that reads that stream is refused;
* a streaming query has no end of input, and the engine stops it once the source is
  exhausted: the last windows (those that the final watermark or the end of input would
  close) are not emitted; the local engine closes them at the end;
* the timestamp must be a number of seconds and the aggregated value a number.

Everything else is refused at start in one line naming the bolt: session, count and
processing-time windows, joins, ``idle_s``, and aggregates given as functions.
"""
from __future__ import annotations

from typing import Any, Callable, Iterator

import msgpack

from topo.join import JoinBolt
from topo.topology import ComponentSpec, Topology
from topo.windows import AGGREGATES, CountWindow, SlidingWindow, TumblingWindow, WindowedBolt

#: what a window row carries between the decode step and the aggregation
_DECODED_SCHEMA = "ts double, k binary, vi bigint, vd double"


def is_window(proto: Any) -> bool:
    """A window or join bolt (these never run as ordinary Spark stages)."""
    return isinstance(proto, (WindowedBolt, CountWindow))


def window_problem(topology: Topology, spec: ComponentSpec, proto: Any) -> str | None:
    """Why window bolt ``spec`` cannot run on Spark, in one line; None when it maps."""
    where = f"bolt {spec.id!r} ({spec.class_name})"
    if isinstance(proto, JoinBolt):
        return f"{where} is a join: joins run on the local engine only (topo run without --engine spark)"
    if not isinstance(proto, (TumblingWindow, SlidingWindow)):
        kind = "a count window" if isinstance(proto, CountWindow) else "a session window"
        return (f"{where} is {kind}: on Spark only tumbling and sliding event-time windows map "
                f"(run it on the local engine)")
    if proto.time != "event":
        return f"{where} uses processing time: on Spark only event-time windows map"
    if proto.idle_s is not None:
        return f"{where} sets idle_s: Spark's watermark does not follow the clock; remove it to run on Spark"
    if type(proto.aggregate) not in AGGREGATES.values():
        return (f"{where} aggregates with a function: on Spark agg must be one of {', '.join(AGGREGATES)}")
    late_readers = [c.id for c in topology.bolts for i in c.inputs
                    if i.source == spec.id and i.stream == proto.late_stream]
    if late_readers:
        return (f"{where}: {late_readers[0]!r} reads its {proto.late_stream!r} stream, but Spark drops late rows "
                f"without emitting them; set late_stream: null to run on Spark")
    return None


def _decoder(spec: ComponentSpec, proto: Any, input_fields: dict[tuple[str, str], tuple[str, ...]]
             ) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """``mapInArrow``: bus rows -> (ts, msgpack key, value as int or float)."""
    positions = {}
    for src_stream, fields in input_fields.items():
        value_pos = fields.index(proto.value_field) if proto.value_field else None
        positions[src_stream] = (fields.index(proto.timestamp_field),
                                 [fields.index(k) for k in proto.key_fields], value_pos)
    single = len(proto.key_fields) == 1
    name = spec.id

    def run(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        for rb in batches:
            cols = rb.to_pydict()
            ts_out: list[float] = []
            k_out: list[bytes] = []
            vi_out: list[int | None] = []
            vd_out: list[float | None] = []
            for src, stream, v in zip(cols["src"], cols["stream"], cols["v"]):
                values = msgpack.unpackb(v, raw=False)
                t_pos, k_pos, v_pos = positions[(src, stream)]
                ts = values[t_pos]
                if not isinstance(ts, (int, float)) or isinstance(ts, bool):
                    raise ValueError(f"bolt {name!r}: {proto.timestamp_field!r} is {ts!r:.40}, "
                                     f"not a number of seconds")
                key = values[k_pos[0]] if single else [values[p] for p in k_pos]
                value = values[v_pos] if v_pos is not None else None
                if value is not None and (not isinstance(value, (int, float)) or isinstance(value, bool)):
                    raise ValueError(f"bolt {name!r}: {proto.value_field!r} is {value!r:.40}, not a number")
                ts_out.append(float(ts))
                k_out.append(msgpack.packb(key))
                vi_out.append(value if isinstance(value, int) else None)
                vd_out.append(value if isinstance(value, float) else None)
            yield pa.RecordBatch.from_pydict(
                {"ts": ts_out, "k": k_out, "vi": vi_out, "vd": vd_out},
                schema=pa.schema([("ts", pa.float64()), ("k", pa.binary()), ("vi", pa.int64()),
                                  ("vd", pa.float64())]))

    return run


def _encoder(spec: ComponentSpec, proto: Any) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """``mapInArrow``: aggregated windows -> bus rows ``[*key, start, end, value]``."""
    agg = proto.aggregate.name
    whole = all(float(x).is_integer() for x in (proto.size_s, getattr(proto, "slide_s", proto.size_s)))
    single = len(proto.key_fields) == 1
    keyless = not proto.key_fields
    name = spec.id

    def number(x: float) -> Any:
        return int(x) if whole and float(x).is_integer() else x

    def run(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        for rb in batches:
            cols = rb.to_pydict()
            out: list[bytes] = []
            for i in range(rb.num_rows):
                key = msgpack.unpackb(cols["k"][i], raw=False)
                keys = [] if keyless else [key] if single else list(key)
                if agg == "count":
                    value: Any = cols["n"][i]
                elif agg == "mean":
                    value = cols["x"][i]
                else:       # sum, min, max: an int while every value was one, as on the local engine
                    value = cols["i"][i] if cols["nf"][i] == 0 else cols["x"][i]
                out.append(msgpack.packb([*keys, number(cols["start"][i]), number(cols["end"][i]), value]))
            yield pa.RecordBatch.from_pydict({"src": [name] * len(out), "stream": ["default"] * len(out), "v": out})

    return run


def window_frame(df: Any, topology: Topology, spec: ComponentSpec) -> Any:
    """The streaming DataFrame of window bolt ``spec``'s output (bus rows), from ``df``, the
    union of its inputs (bus rows)."""
    from pyspark.sql import functions as F

    from runtime.spark.datasource import BUS_SCHEMA

    proto = spec.instance()
    problem = window_problem(topology, spec, proto)
    if problem:
        raise ValueError(problem)
    inputs = {(i.source, i.stream): topology.components[i.source].outputs[i.stream] for i in spec.inputs}
    decoded = df.mapInArrow(_decoder(spec, proto, inputs), _DECODED_SCHEMA)
    slide = getattr(proto, "slide_s", proto.size_s)
    timed = decoded.withColumn("et", F.timestamp_seconds(F.col("ts"))) \
        .withWatermark("et", f"{_micros(proto.lateness_s)} microseconds")
    window = F.window(F.col("et"), f"{_micros(proto.size_s)} microseconds", f"{_micros(slide)} microseconds")
    x = F.coalesce(F.col("vd"), F.col("vi").cast("double"))
    agg = proto.aggregate.name
    aggs = [F.count(F.lit(1)).alias("n"), F.count(F.col("vd")).alias("nf")]
    if agg in ("sum", "min", "max"):
        fn = {"sum": F.sum, "min": F.min, "max": F.max}[agg]
        aggs += [fn(F.col("vi")).alias("i"), fn(x).alias("x")]
    elif agg == "mean":
        aggs += [F.avg(x).alias("x")]
    grouped = timed.groupBy(window.alias("w"), F.col("k")).agg(*aggs)
    flat = grouped.select(
        F.col("k"), (F.unix_micros(F.col("w.start")) / 1e6).alias("start"),
        (F.unix_micros(F.col("w.end")) / 1e6).alias("end"), *[F.col(c) for c in grouped.columns if c not in ("w", "k")])
    if "i" not in flat.columns:
        flat = flat.withColumn("i", F.lit(None).cast("bigint"))
    if "x" not in flat.columns:
        flat = flat.withColumn("x", F.lit(None).cast("double"))
    return flat.mapInArrow(_encoder(spec, proto), BUS_SCHEMA)


def _micros(seconds: float) -> int:
    return int(round(seconds * 1_000_000))
