"""A topology as one Structured Streaming query.

``check(topology)`` lists every reason a topology cannot run on Spark, each naming the
component; ``build(...)`` turns a mappable topology into the streaming DataFrame whose
rows are the tuples of its *terminal streams* (declared streams no bolt subscribes to).

What maps, and how (see ``runtime.spark.bolts`` for the run-time side):

* a spout must be a ``topo.sources.OffsetSpout`` (``MessageLogSpout``,
  ``SyntheticSpout``): Spark replays a batch by offsets, which an arbitrary
  ``next_tuple`` cannot do. Each becomes one streaming source (pre-sharded,
  admission-controlled);
* a bolt whose inputs are all shuffle-like (shuffle, local_or_shuffle, load_aware)
  runs per partition (``mapInArrow``);
* a ``KeyedBolt`` runs grouped by its key with its state in the state store; every
  input must be a fields grouping on exactly its ``key_fields``;
* any other bolt behind a fields, global or all grouping runs as ``parallelism``
  Storm tasks whose attributes are kept in the state store;
* one stateful stage uses ``applyInPandasWithState``; Spark allows only one of those
  per query, so with several stateful stages every one uses
  ``transformWithStateInPandas`` (RocksDB state store; needs the ``protobuf`` package);
* a bolt fed by several inputs gets their union; a component read by several bolts is
  computed once per reader (sources are deterministic by offset, so they agree);
* **chaining** (``spark.chain``, as Flink chains operators): a ``partition`` bolt that is
  the only reader of a spout (or of a bolt already chained to one), reads nothing else,
  and whose upstream has no terminal stream, runs inside the spout's reader
  (``chains``): one Python stage where there were two, and a batch pays one Python
  worker round trip fewer.

What does not map: other spouts; a ``KeyedBolt`` behind any other grouping, or a
fields grouping on different fields; groupings without a Spark mapping (custom ones);
session, count and processing-time windows and joins; tumbling and sliding event-time
windows map to Spark's own windowing (``runtime.spark.windows``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from runtime.spark.bolts import InputRoute, StagePlan
from topo.groupings import (AllGrouping, FieldsGrouping, GlobalGrouping, LoadAwareGrouping,
                            LocalOrShuffleGrouping, ShuffleGrouping)
from topo.sources.spouts import OffsetSpout
from topo.state import KeyedBolt
from topo.topology import ComponentSpec, Topology, TopologyError
from runtime.spark.windows import is_window, window_frame, window_problem

SHUFFLE_LIKE = (ShuffleGrouping, LocalOrShuffleGrouping, LoadAwareGrouping)
STATEFUL_GROUPINGS = (FieldsGrouping, GlobalGrouping, AllGrouping)


@dataclass
class SpoutPlan:
    component: str
    spout: OffsetSpout


def _proto(spec: ComponentSpec) -> Any:
    return spec.instance()


def bolt_mode(spec: ComponentSpec, proto: Any) -> tuple[str | None, list[str]]:
    """``(mode, problems)`` for one bolt."""
    problems: list[str] = []
    kinds = [type(i.grouping) for i in spec.inputs]
    if isinstance(proto, KeyedBolt):
        key = set(proto.key_fields)
        if not key:
            problems.append(f"bolt {spec.id!r} is a KeyedBolt without key_fields")
        for i in spec.inputs:
            if not isinstance(i.grouping, FieldsGrouping) or set(i.grouping.fields) != key:
                problems.append(
                    f"bolt {spec.id!r} is a KeyedBolt on {sorted(key)} but its input from {i.source!r} uses "
                    f"{i.grouping.describe()}; on Spark its state is stored per key, so every input must be a "
                    f"fields grouping on exactly its key_fields")
        return "keyed", problems
    for i in spec.inputs:
        if not isinstance(i.grouping, SHUFFLE_LIKE + STATEFUL_GROUPINGS):
            problems.append(f"bolt {spec.id!r}: grouping {i.grouping.describe()} from {i.source!r} has no "
                            f"Spark mapping")
    if any(issubclass(k, STATEFUL_GROUPINGS) for k in kinds):
        return "task", problems
    return "partition", problems


def check(topology: Topology) -> list[str]:
    """Every reason ``topology`` cannot run on the Spark engine."""
    problems: list[str] = []
    for spec in topology.spouts:
        proto = _proto(spec)
        if not isinstance(proto, OffsetSpout):
            problems.append(
                f"spout {spec.id!r} ({spec.class_name}) is not an offset-addressable source: Spark re-reads "
                f"a micro-batch by offsets, which next_tuple cannot do; use topo.sources.MessageLogSpout "
                f"or topo.sources.SyntheticSpout")
    for spec in topology.bolts:
        proto = _proto(spec)
        if is_window(proto):      # Spark's own event-time windows where they map (runtime.spark.windows)
            problems.extend(p for p in [window_problem(topology, spec, proto)] if p)
            continue
        _, errs = bolt_mode(spec, proto)
        problems.extend(errs)
    return problems


def topological_order(topology: Topology) -> list[ComponentSpec]:
    done: set[str] = set()
    order: list[ComponentSpec] = []
    pending = list(topology.components.values())
    while pending:
        ready = [c for c in pending if all(i.source in done for i in c.inputs)]
        if not ready:
            raise TopologyError(f"topology {topology.name!r} has a cycle")
        for c in ready:
            order.append(c)
            done.add(c.id)
        pending = [c for c in pending if c.id not in done]
    return order


def spark_bolt_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The config a bolt's ``TaskContext`` carries on Spark. The local engine's
    checkpoints (``checkpoint.interval_ms``) are off: on Spark a micro-batch is the unit
    of recovery (replayed by offsets, ``spark.checkpoint_dir``), and no engine would call
    ``checkpoint_complete``, so a sink waiting for it (``SQLiteSink``) would write nothing."""
    return {**config, "checkpoint.interval_ms": None}


def stage_plans(topology: Topology, config: dict[str, Any]) -> dict[str, StagePlan]:
    """A ``StagePlan`` per bolt (raises ``TopologyError`` listing every problem)."""
    problems = check(topology)
    if problems:
        raise TopologyError(f"topology {topology.name!r} cannot run on Spark: " + "; ".join(problems))
    plans: dict[str, StagePlan] = {}
    bolt_config = spark_bolt_config(config)
    for spec in topology.bolts:
        proto = _proto(spec)
        mode = "window" if is_window(proto) else bolt_mode(spec, proto)[0]
        assert mode is not None
        inputs: dict[tuple[str, str], tuple[str, ...]] = {}
        routes: dict[tuple[str, str], InputRoute] = {}
        for i in spec.inputs:
            fields = topology.components[i.source].outputs[i.stream]
            inputs[(i.source, i.stream)] = tuple(fields)
            g = i.grouping
            if mode == "keyed":
                key_fields = tuple(proto.key_fields)
                routes[(i.source, i.stream)] = InputRoute("fields", tuple(fields.index(f) for f in key_fields))
            elif isinstance(g, FieldsGrouping):
                routes[(i.source, i.stream)] = InputRoute("fields", tuple(fields.index(f) for f in g.fields))
            elif isinstance(g, GlobalGrouping):
                routes[(i.source, i.stream)] = InputRoute("global")
            elif isinstance(g, AllGrouping):
                routes[(i.source, i.stream)] = InputRoute("all")
            else:
                routes[(i.source, i.stream)] = InputRoute("shuffle")
        plans[spec.id] = StagePlan(spec.id, spec.make, spec.parallelism, topology.name, bolt_config, mode,
                                   inputs, dict(spec.outputs), routes)
    return plans


def terminal_streams(topology: Topology) -> dict[str, list[str]]:
    """Per component, its declared streams that no bolt subscribes to."""
    consumed = {(i.source, i.stream) for c in topology.bolts for i in c.inputs}
    out: dict[str, list[str]] = {}
    for c in topology.components.values():
        free = [s for s in c.outputs if (c.id, s) not in consumed]
        if free:
            out[c.id] = free
    return out


def leaves(topology: Topology) -> list[str]:
    """Components nothing reads from (they must run even when they emit nothing)."""
    read = {i.source for c in topology.bolts for i in c.inputs}
    return [c.id for c in topology.components.values() if c.id not in read]


def chains(topology: Topology, plans: Mapping[str, StagePlan]) -> dict[str, list[str]]:
    """Per spout, the bolts that run inside its reader, in order (module docstring).

    A bolt joins its upstream's chain when it is in ``partition`` mode, it is the
    upstream's only reader, every input it has comes from that upstream, and the upstream
    has no terminal stream (whose rows would otherwise have to leave the reader too)."""
    terminal = terminal_streams(topology)
    readers: dict[str, list[str]] = {}
    for c in topology.bolts:
        for src in dict.fromkeys(i.source for i in c.inputs):
            readers.setdefault(src, []).append(c.id)
    out: dict[str, list[str]] = {}
    for spout in topology.spouts:
        chain: list[str] = []
        upstream = spout.id
        while len(readers.get(upstream, [])) == 1 and upstream not in terminal:
            bolt = readers[upstream][0]
            if plans[bolt].mode != "partition" or {i.source for i in topology.components[bolt].inputs} != {upstream}:
                break
            chain.append(bolt)
            upstream = bolt
        if chain:
            out[spout.id] = chain
    return out


def build(spark: Any, topology: Topology, plans: dict[str, StagePlan], sources: dict[str, Any],
          chained: Mapping[str, list[str]] | None = None) -> Any:
    """The streaming DataFrame of the topology's terminal tuples.

    ``sources`` maps each spout id to its streaming DataFrame (bus rows); ``chained``
    (``chains``) names the bolts each spout's reader already runs: their rows are that
    source's rows, and no stage of their own is built.
    """
    from pyspark.sql import functions as F

    from runtime.spark.bolts import (STATE_SCHEMA, apply_in_pandas_function, keyer_function,
                                     partition_function, stateful_processor)
    from runtime.spark.datasource import BUS_SCHEMA

    use_tws = needs_tws(plans)
    frames: dict[str, Any] = dict(sources)
    inside = {bolt: spout for spout, chain in (chained or {}).items() for bolt in chain}
    for spec in topological_order(topology):
        if spec.kind == "spout":
            continue
        if spec.id in inside:
            frames[spec.id] = sources[inside[spec.id]]
            continue
        plan = plans[spec.id]
        parts = []
        for i in spec.inputs:
            df = frames[i.source]
            if len(topology.components[i.source].outputs) > 1:
                df = df.filter(F.col("stream") == i.stream)
            parts.append(df)
        merged = parts[0]
        for df in parts[1:]:
            merged = merged.unionByName(df)
        if plan.mode == "partition":
            frames[spec.id] = merged.mapInArrow(partition_function(plan), BUS_SCHEMA)
            continue
        if plan.mode == "window":
            frames[spec.id] = window_frame(merged, topology, spec)
            continue
        keyed = merged.mapInArrow(keyer_function(plan), BUS_SCHEMA + ", g binary")
        grouped = keyed.groupBy("g")
        if use_tws:
            frames[spec.id] = grouped.transformWithStateInPandas(
                statefulProcessor=stateful_processor(plan), outputStructType=BUS_SCHEMA,
                outputMode="Append", timeMode="None")
        else:
            from pyspark.sql.streaming.state import GroupStateTimeout

            frames[spec.id] = grouped.applyInPandasWithState(
                apply_in_pandas_function(plan), BUS_SCHEMA, STATE_SCHEMA, "append",
                GroupStateTimeout.NoTimeout)
    terminal = terminal_streams(topology)
    outs = []
    for cid in dict.fromkeys(list(terminal) + leaves(topology)):
        df = frames[cid]
        streams = terminal.get(cid)
        # A leaf that declares no streams emits nothing but must still run: no filter
        # (a constant-false filter would let the optimizer prune the whole branch).
        if streams is not None and len(streams) < len(topology.components[cid].outputs):
            df = df.filter(F.col("stream").isin(streams))
        outs.append(df)
    result = outs[0]
    for df in outs[1:]:
        result = result.unionByName(df)
    return result


def needs_tws(plans: dict[str, StagePlan]) -> bool:
    return sum(1 for p in plans.values() if p.mode not in ("partition", "window")) > 1
