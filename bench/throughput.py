"""Throughput and latency of spout -> bolt -> bolt against a bare asyncio chain.

The baseline is what one would write by hand: three asyncio tasks joined by
``asyncio.Queue``s, one tuple per queue item, on the same uvloop, doing the same
work (make a tuple, transform it, sum it). topo runs the same work as a topology
(shuffle groupings, one task per component), with acking off and on.

topo raises the young-generation GC threshold during a run (``gc.young_threshold``);
the baseline is also run a second time under the same setting, so the report shows
how much of the ratio is that setting and how much is the engine.

Latency is end to end, spout emit to the last bolt, measured on every 64th tuple.
Both sides get queues of about the same capacity in tuples (1000 per queue: the
baseline's ``maxsize``, topo's byte bound set to 1000 encoded tuples), because
under saturation latency is queue depth divided by throughput.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import msgpack
import uvloop

from topo.api import Bolt, EndOfStream, Spout, Tuple
from topo.topology import TopologyBuilder
from topo.config import resolve
from runtime.local.engine import LocalEngine, _young_gc_threshold
from bench.environment import stamp

N = 300_000
REPEATS = 3
QUEUE_TUPLES = 1000
SAMPLE_EVERY = 64
RESULTS = Path(__file__).parent / "results"


def make_values(i: int) -> list[Any]:
    return [i, f"key-{i % 1000}", time.perf_counter()]


def transform(values: list[Any]) -> list[Any]:
    return [values[0] * 2, values[1], values[2]]


class Sink:
    """The last stage's work, shared by both sides: a sum and sampled latencies."""

    def __init__(self) -> None:
        self.total = 0
        self.count = 0
        self.latencies: list[float] = []

    def consume(self, values: list[Any]) -> None:
        self.total += values[0]
        self.count += 1
        if values[0] % (2 * SAMPLE_EVERY) == 0:
            self.latencies.append(time.perf_counter() - values[2])


async def baseline(n: int) -> tuple[float, Sink]:
    q1: asyncio.Queue = asyncio.Queue(QUEUE_TUPLES)
    q2: asyncio.Queue = asyncio.Queue(QUEUE_TUPLES)
    sink = Sink()

    async def spout() -> None:
        for i in range(n):
            await q1.put(make_values(i))
        await q1.put(None)

    async def bolt1() -> None:
        while (v := await q1.get()) is not None:
            await q2.put(transform(v))
        await q2.put(None)

    async def bolt2() -> None:
        while (v := await q2.get()) is not None:
            sink.consume(v)

    t0 = time.perf_counter()
    await asyncio.gather(spout(), bolt1(), bolt2())
    return time.perf_counter() - t0, sink


class BenchSpout(Spout):
    outputs = ["n", "key", "t"]

    def __init__(self, n: int) -> None:
        self.n = n
        self.i = 0

    def next_tuple(self) -> None:
        i = self.i
        if i >= self.n:
            raise EndOfStream
        self.collector.emit(make_values(i), msg_id=i)
        self.i = i + 1


class Transform(Bolt):
    outputs = ["n", "key", "t"]

    def execute(self, tup: Tuple) -> None:
        self.collector.emit(transform(tup.values))


class SinkBolt(Bolt):
    def __init__(self, sink: Sink) -> None:
        self.sink = sink

    def execute(self, tup: Tuple) -> None:
        self.sink.consume(tup.values)

    def __deepcopy__(self, memo: dict) -> "SinkBolt":
        return SinkBolt(self.sink)


async def topo_chain(n: int, acking: bool, metrics_port: int = 0) -> tuple[float, Sink]:
    sink = Sink()
    tuple_bytes = len(msgpack.packb(make_values(n)))
    b = TopologyBuilder("bench", {"acking": acking, "backpressure.policy": "none",
                                  "queue.hard_bound": QUEUE_TUPLES * tuple_bytes,
                                  "queue.high_mark": QUEUE_TUPLES * tuple_bytes // 2,
                                  "queue.low_mark": QUEUE_TUPLES * tuple_bytes // 10,
                                  "metrics.port": metrics_port})
    b.spout("spout", BenchSpout(n))
    b.bolt("transform", Transform()).shuffle("spout")
    b.bolt("sink", SinkBolt(sink)).shuffle("transform")
    engine = LocalEngine(b.build())
    t0 = time.perf_counter()
    await engine.run()
    return time.perf_counter() - t0, sink


def _summary(runs: list[tuple[float, Sink]], n: int) -> dict[str, float]:
    rates = sorted(n / dt for dt, _ in runs)
    lat = sorted(x for _, s in runs for x in s.latencies)
    for _, s in runs:
        assert s.count == n, f"lost tuples: {s.count} != {n}"
    return {"tuples_per_s": statistics.median(rates),
            "p50_latency_ms": 1000 * lat[len(lat) // 2],
            "p99_latency_ms": 1000 * lat[int(len(lat) * 0.99)]}


async def baseline_same_gc(n: int) -> tuple[float, Sink]:
    with _young_gc_threshold(resolve()["gc.young_threshold"]):
        return await baseline(n)


def measure(n: int = N, repeats: int = REPEATS) -> dict[str, Any]:
    results: dict[str, list[tuple[float, Sink]]] = {
        "baseline": [], "baseline_same_gc": [], "topo_acking_off": [], "topo_acking_on": []}
    for _ in range(repeats):  # interleaved so drift on the machine hits every side alike
        results["baseline"].append(uvloop.run(baseline(n)))
        results["baseline_same_gc"].append(uvloop.run(baseline_same_gc(n)))
        results["topo_acking_off"].append(uvloop.run(topo_chain(n, False)))
        results["topo_acking_on"].append(uvloop.run(topo_chain(n, True)))
    out: dict[str, Any] = {k: _summary(v, n) for k, v in results.items()}
    base = out["baseline"]["tuples_per_s"]
    out["ratio_acking_off"] = out["topo_acking_off"]["tuples_per_s"] / base
    out["ratio_acking_on"] = out["topo_acking_on"]["tuples_per_s"] / base
    tuned = out["baseline_same_gc"]["tuples_per_s"]
    out["ratio_acking_off_vs_same_gc_baseline"] = out["topo_acking_off"]["tuples_per_s"] / tuned
    out["ratio_acking_on_vs_same_gc_baseline"] = out["topo_acking_on"]["tuples_per_s"] / tuned
    out["tuples"] = n
    out["repeats"] = repeats
    out["python"] = platform.python_version()
    return out


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.throughput", description=__doc__.split("\n\n")[0])
    return p.parse_args(list(argv or []))  # None: the defaults (python -m bench passes nothing); no options


def main(argv: Sequence[str] | None = None) -> None:
    parse_args(argv)
    out = measure()
    RESULTS.mkdir(exist_ok=True)
    out = stamp(out, "throughput")
    (RESULTS / "throughput.json").write_text(json.dumps(out, indent=2) + "\n")
    for k in ("baseline", "baseline_same_gc", "topo_acking_off", "topo_acking_on"):
        r = out[k]
        print(f"{k:18} {r['tuples_per_s']:>10,.0f} tuples/s  p50 {r['p50_latency_ms']:.2f} ms  "
              f"p99 {r['p99_latency_ms']:.2f} ms")
    print(f"ratio vs bare asyncio chain: acking off {out['ratio_acking_off']:.2f}x, "
          f"acking on {out['ratio_acking_on']:.2f}x")
    print(f"ratio vs the chain under topo's GC setting: acking off "
          f"{out['ratio_acking_off_vs_same_gc_baseline']:.2f}x, acking on "
          f"{out['ratio_acking_on_vs_same_gc_baseline']:.2f}x")


if __name__ == "__main__":
    main(sys.argv[1:])
