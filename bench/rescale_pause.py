"""How long a rescale of a fields-grouped component holds the spouts (document 004's
added task, ``LocalEngine.add_task`` / ``remove_task``).

Under fields grouping a key's state (``KeyedBolt``) must move with its key group, so
the engine holds the spouts until nothing routed by the old key owners is left in
flight towards the component, moves the groups and their state in one synchronous
step, and lets the spouts go (``_pause_drained``). This measures that hold, the
``ms`` of each ``LocalEngine.rescales`` entry, in the topology

    words (endless, as fast as allowed) -> count (KeyedBolt, fields, 2 tasks, ``count_tps``
    each) -> sink (``sink_tps``, shuffle)

under overload (policy ``adaptive`` with autoscaling decided by hand: the bench calls
``add_task`` and ``remove_task`` itself, ``rounds`` times each, once the queues are full).
Two sinks: as fast as the counts (the pause is what the count queue holds) and a
sink slower than the counts (a slow stage *downstream* of the rescaled component:
the pause does not wait for it). Counts are checked exact at the end.

``python -m bench rescale_pause`` writes ``bench/results/rescale_pause.json``.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import uvloop

from runtime.local.engine import LocalEngine
from topo.api import Bolt, Spout, Tuple
from topo.state import KeyedBolt
from topo.topology import TopologyBuilder

RESULTS = Path(__file__).parent / "results"
WORDS = [f"w{i}" for i in range(500)]
PAD = "x" * 100           # about 110 bytes on the wire: a 128 KB queue holds about 1,000 tuples


class Tally:
    """Shared by every copy of a component (the engine deep-copies components)."""

    def __init__(self) -> None:
        self.emitted: Counter[str] = Counter()
        self.final: dict[str, int] = {}

    def __deepcopy__(self, memo: dict) -> "Tally":
        return self


class Words(Spout):
    outputs = ["word", "pad"]

    def __init__(self, tally: Tally) -> None:
        self.tally, self.i = tally, 0

    def next_tuple(self) -> None:
        w = WORDS[self.i % len(WORDS)]
        self.i += 1
        self.tally.emitted[w] += 1
        self.collector.emit([w, PAD])


class Count(KeyedBolt):
    outputs = ["word", "n"]
    key_fields = ("word",)

    def __init__(self, tps: float) -> None:
        self.tps, self.due = tps, 0.0

    def process(self, tup: Tuple, state: dict[str, Any]) -> None:
        state["n"] = state.get("n", 0) + 1
        self.collector.emit([tup["word"], state["n"]])

    async def execute(self, tup: Tuple) -> None:
        super().execute(tup)
        now = time.monotonic()
        self.due = max(self.due, now - 0.05) + 1.0 / self.tps
        if self.due - now > 0.002:
            await asyncio.sleep(self.due - now)


class Sink(Bolt):
    def __init__(self, tally: Tally, tps: float) -> None:
        self.tally, self.tps, self.due = tally, tps, 0.0

    async def execute(self, tup: Tuple) -> None:
        w, n = tup["word"], tup["n"]
        if n > self.tally.final.get(w, 0):
            self.tally.final[w] = n
        now = time.monotonic()
        self.due = max(self.due, now - 0.05) + 1.0 / self.tps
        if self.due - now > 0.002:
            await asyncio.sleep(self.due - now)


async def run_case(count_tps: float, sink_tps: float, rounds: int) -> dict[str, Any]:
    tally = Tally()
    b = TopologyBuilder("rescale-pause", {
        "backpressure.policy": "adaptive", "backpressure.adaptive.cooldown_ms": 3_600_000,
        "backpressure.adaptive.max_parallelism": 3, "queue.hard_bound": "128KB", "queue.high_mark": "64KB",
        "queue.low_mark": "16KB", "drain_timeout_s": 30})
    b.spout("words", Words(tally))
    b.bolt("count", Count(count_tps), parallelism=2).fields("words", "word")
    b.bolt("sink", Sink(tally, sink_tps)).shuffle("count")
    engine = LocalEngine(b.build())

    async def rescale() -> None:
        for _ in range(rounds):
            await asyncio.sleep(1.0)                       # the queues fill up again
            assert await engine.add_task("count") is not None
            await asyncio.sleep(1.0)
            assert await engine.remove_task("count") is not None
        engine.request_stop()

    driver = asyncio.create_task(rescale())
    await engine.run()
    await driver
    pauses = [ms for _, _, _, ms in engine.rescales]
    exact = tally.final == {w: n for w, n in tally.emitted.items()}
    return {"count_tps_per_task": count_tps, "sink_tps": sink_tps, "rescales": len(pauses),
            "pause_ms": [round(p, 1) for p in pauses], "median_ms": round(statistics.median(pauses), 1),
            "max_ms": round(max(pauses), 1), "counts_exact": exact}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench rescale_pause")
    ap.add_argument("--rounds", type=int, default=5, help="add + remove pairs per case")
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args(argv if argv is not None else [])
    load0 = os.getloadavg()
    cases = [uvloop.run(run_case(2_000.0, 20_000.0, args.rounds)),     # the counts are the bottleneck
             uvloop.run(run_case(2_000.0, 1_000.0, args.rounds))]      # a slower sink downstream of them
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=Path(__file__).parent).stdout.strip()
    report = {"cases": cases, "load_start": load0, "load_end": os.getloadavg(), "commit": commit,
              "python": platform.python_version(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "rescale_pause.json").write_text(json.dumps(report, indent=1) + "\n")
    for c in cases:
        print(f"count {c['count_tps_per_task']:.0f}/s per task, sink {c['sink_tps']:.0f}/s: "
              f"{c['rescales']} rescales, pause median {c['median_ms']} ms, max {c['max_ms']} ms, "
              f"counts exact: {c['counts_exact']}")
    print(f"load {load0[0]:.2f} -> {report['load_end'][0]:.2f}; wrote {out / 'rescale_pause.json'}")


if __name__ == "__main__":
    main(sys.argv[1:])
