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

``--workers 2`` runs the same cases in two worker processes (``runtime.local.rescaling``:
the supervisor fences the component on every worker, waits until it is still, moves
the key groups' state between the processes and lifts the fence; the pause is each
``Rescale.paused_ms``). The spout and the sink write what they emitted and the highest
count per word they saw to files when they close; counts exact means those agree.

``python -m bench rescale_pause`` writes ``bench/results/rescale_pause.json``
(``rescale_pause_workers.json`` with ``--workers 2``).
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
from bench.environment import stamp

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

    def __init__(self, tally: Tally, dump: str = "") -> None:
        self.tally, self.i, self.dump = tally, 0, dump

    def next_tuple(self) -> None:
        w = WORDS[self.i % len(WORDS)]
        self.i += 1
        self.tally.emitted[w] += 1
        self.collector.emit([w, PAD])

    def close(self) -> None:
        if self.dump:          # in a worker process: what it emitted, for the supervisor's check
            Path(self.dump, f"emitted-{os.getpid()}.json").write_text(json.dumps(self.tally.emitted))


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
    def __init__(self, tally: Tally, tps: float, dump: str = "") -> None:
        self.tally, self.tps, self.due, self.dump = tally, tps, 0.0, dump

    def cleanup(self) -> None:
        if self.dump:          # in a worker process: the highest count per word seen
            Path(self.dump, f"final-{os.getpid()}.json").write_text(json.dumps(self.tally.final))

    async def execute(self, tup: Tuple) -> None:
        w, n = tup["word"], tup["n"]
        if n > self.tally.final.get(w, 0):
            self.tally.final[w] = n
        now = time.monotonic()
        self.due = max(self.due, now - 0.05) + 1.0 / self.tps
        if self.due - now > 0.002:
            await asyncio.sleep(self.due - now)


def topology(tally: Tally, count_tps: float, sink_tps: float, dump: str = "") -> Any:
    b = TopologyBuilder("rescale-pause", {
        "backpressure.policy": "adaptive", "backpressure.adaptive.cooldown_ms": 3_600_000,
        "backpressure.adaptive.max_parallelism": 3, "queue.hard_bound": "128KB", "queue.high_mark": "64KB",
        "queue.low_mark": "16KB", "drain_timeout_s": 30})
    b.spout("words", Words(tally, dump))
    b.bolt("count", Count(count_tps), parallelism=2).fields("words", "word")
    b.bolt("sink", Sink(tally, sink_tps, dump)).shuffle("count")
    return b.build()


def _summary(count_tps: float, sink_tps: float, pauses: list[float], exact: bool) -> dict[str, Any]:
    return {"count_tps_per_task": count_tps, "sink_tps": sink_tps, "rescales": len(pauses),
            "pause_ms": [round(p, 1) for p in pauses], "median_ms": round(statistics.median(pauses), 1),
            "max_ms": round(max(pauses), 1), "counts_exact": exact}


def run_case_workers(count_tps: float, sink_tps: float, rounds: int, workers: int) -> dict[str, Any]:
    """The same case in ``workers`` processes: words on worker 0, the counts on 1 and 0."""
    import tempfile
    import threading

    from runtime.local.workers import Supervisor
    from topo.config import resolve

    with tempfile.TemporaryDirectory(prefix="rescale-pause-") as directory:
        t = topology(Tally(), count_tps, sink_tps, dump=directory)
        sup = Supervisor(t, resolve(t.config, {}), workers, directory)
        failed: list[BaseException] = []

        def rescale() -> None:
            try:
                for kind in ["add", "remove"] * rounds:
                    time.sleep(1.0)                        # the queues fill up again
                    done = len(sup.rescales)
                    sup.request_scale("count", kind)
                    while len(sup.rescales) == done:
                        time.sleep(0.01)
                    assert sup.rescales[-1].task is not None, sup.rescales[-1]
            except BaseException as e:
                failed.append(e)
            sup.stop_soon("stopped")

        try:
            sup.start()
            threading.Thread(target=rescale, daemon=True).start()
            sup.supervise(None)
        finally:
            sup.stop_all()
        if failed:
            raise failed[0]
        emitted: Counter[str] = Counter()
        final: dict[str, int] = {}
        for f in Path(directory).glob("emitted-*.json"):
            emitted.update(json.loads(f.read_text()))
        for f in Path(directory).glob("final-*.json"):
            for w, n in json.loads(f.read_text()).items():
                final[w] = max(n, final.get(w, 0))
        return _summary(count_tps, sink_tps, [r.paused_ms for r in sup.rescales], final == dict(emitted))


async def run_case(count_tps: float, sink_tps: float, rounds: int) -> dict[str, Any]:
    tally = Tally()
    engine = LocalEngine(topology(tally, count_tps, sink_tps))

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
    return _summary(count_tps, sink_tps, pauses, tally.final == {w: n for w, n in tally.emitted.items()})


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench rescale_pause")
    ap.add_argument("--rounds", type=int, default=5, help="add + remove pairs per case")
    ap.add_argument("--workers", type=int, default=1, help="worker processes (1: one process)")
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args(argv if argv is not None else [])
    load0 = os.getloadavg()
    speeds = [(2_000.0, 20_000.0),      # the counts are the bottleneck
              (2_000.0, 1_000.0)]       # a slower sink downstream of them
    if args.workers > 1:
        cases = [run_case_workers(c, s, args.rounds, args.workers) for c, s in speeds]
    else:
        cases = [uvloop.run(run_case(c, s, args.rounds)) for c, s in speeds]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=Path(__file__).parent).stdout.strip()
    report = {"cases": cases, "workers": args.workers, "load_start": load0, "load_end": os.getloadavg(),
              "commit": commit, "python": platform.python_version(),
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = "rescale_pause.json" if args.workers == 1 else "rescale_pause_workers.json"
    report = stamp(report, "rescale_pause")
    (out / name).write_text(json.dumps(report, indent=1) + "\n")
    for c in cases:
        print(f"count {c['count_tps_per_task']:.0f}/s per task, sink {c['sink_tps']:.0f}/s: "
              f"{c['rescales']} rescales, pause median {c['median_ms']} ms, max {c['max_ms']} ms, "
              f"counts exact: {c['counts_exact']}")
    print(f"load {load0[0]:.2f} -> {report['load_end'][0]:.2f}; wrote {out / name}")


if __name__ == "__main__":
    main(sys.argv[1:])
