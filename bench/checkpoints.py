"""What checkpoints cost: throughput, checkpoint duration, and recovery of a big state.

1. **Throughput** of spout -> keyed count (fields grouping, 10,000 keys of checkpointed
   state) -> sum, with checkpoints every 1 s against checkpoints off, runs interleaved
   in one process; the ratio is the median of the per-pair ratios.
2. **Checkpoint duration** (spouts paused -> resumed, i.e. the drain; the store write
   happens after the resume, off the loop, and is reported separately), p50/p99, on the
   same topology unloaded and with a slow stage under stepwise backpressure.
3. **Recovery** of a keyed state of 1,000,000 keys: the time from a new engine to
   restored state (read the newest checkpoint from SQLite, check its digest, unpack,
   hand each task its keys), which is what a restart after kill -9 waits for before the
   first tuple. The checkpoint's own duration and size are reported too.

``python -m bench checkpoints`` writes ``bench/results/checkpoints.json``.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

import uvloop

from topo.api import Bolt, EndOfStream, Spout, Tuple
from topo.state import KeyedBolt
from topo.topology import TopologyBuilder
from runtime.local.engine import LocalEngine
from bench.environment import stamp

RESULTS = Path(__file__).parent / "results"


class Keys(Spout):
    outputs = ["key", "n"]

    def __init__(self, total: int, keys: int) -> None:
        self.total, self.keys, self.i = total, keys, 0

    def next_tuple(self) -> None:
        if self.i >= self.total:
            raise EndOfStream
        for _ in range(64):
            if self.i >= self.total:
                return
            self.collector.emit([f"k{self.i % self.keys}", self.i])
            self.i += 1

    def snapshot_state(self) -> Any:
        return self.i

    def restore_state(self, state: Any) -> None:
        self.i = state


class Count(KeyedBolt):
    key_fields = ("key",)
    outputs = ["key", "count"]

    def process(self, tup: Tuple, state: dict[str, Any]) -> None:
        state["c"] = state.get("c", 0) + 1
        self.collector.emit([tup["key"], state["c"]])


class Sum(Bolt):
    def __init__(self, delay_s: float = 0.0) -> None:
        self.total = 0
        self.delay_s = delay_s

    def execute(self, tup: Tuple) -> None:
        if self.delay_s:
            time.sleep(self.delay_s)   # a slow stage
        self.total += tup["count"]


def _topology(total: int, keys: int, ckpt_dir: str, interval_ms: float | None, **config: Any) -> Any:
    b = TopologyBuilder("ckbench", {"checkpoint.interval_ms": interval_ms, "checkpoint.dir": ckpt_dir,
                                    "checkpoint.restore": False, **config})
    b.spout("keys", Keys(total, keys))
    b.bolt("count", Count(), parallelism=2).fields("keys", "key")
    b.bolt("sum", Sum()).shuffle("count")
    return b.build()


async def _throughput(total: int, interval_ms: float | None) -> tuple[float, list[float]]:
    with tempfile.TemporaryDirectory() as d:
        engine = LocalEngine(_topology(total, 10_000, d, interval_ms, **{"backpressure.policy": "none"}))
        t0 = time.perf_counter()
        await engine.run()
        elapsed = time.perf_counter() - t0
        durations = engine.checkpointer.stats.durations_s if engine.checkpointer else []
        snapshots = engine.checkpointer.stats.snapshot_s if engine.checkpointer else []
        return total / elapsed, durations + [-s for s in snapshots]


async def _under_backpressure(seconds: float) -> dict[str, list[float]]:
    with tempfile.TemporaryDirectory() as d:
        b = TopologyBuilder("ckbp", {"checkpoint.interval_ms": 500, "checkpoint.dir": d,
                                     "checkpoint.restore": False, "backpressure.policy": "stepwise",
                                     "queue.high_mark": "256KB", "queue.low_mark": "32KB",
                                     "backpressure.sensitivity_ms": 200})
        b.spout("keys", Keys(10**12, 10_000))
        b.bolt("count", Count(), parallelism=2).fields("keys", "key")
        b.bolt("sum", Sum(delay_s=0.0001)).shuffle("count")
        engine = LocalEngine(b.build())
        await engine.run(duration=seconds)
        assert engine.checkpointer is not None
        held = max(t.stats.k for t in engine.spout_tasks)
        return {"durations_s": engine.checkpointer.stats.durations_s, "snapshot_s": engine.checkpointer.stats.snapshot_s,
                "write_s": engine.checkpointer.stats.write_s, "spout_k_at_end": [float(held)]}


async def _recovery(keys: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as d:
        first = LocalEngine(_topology(keys, keys, d, 10**7, **{"backpressure.policy": "none"}))
        await first.run()        # the final checkpoint holds every key's state
        assert first.checkpointer is not None
        path = first.checkpointer.store.path
        size = sum(p.stat().st_size for p in (path, path.with_name(path.name + "-wal")) if p.exists())
        final_s = first.checkpointer.stats.durations_s[-1]
        snapshot_s = first.checkpointer.stats.snapshot_s[-1]
        write_s = first.checkpointer.stats.write_s[-1]
        t0 = time.perf_counter()
        again = LocalEngine(_topology(keys, keys, d, 10**7, **{"backpressure.policy": "none",
                                                                "checkpoint.restore": True}))
        again._open_components()
        cp = again.checkpointer.restore()   # type: ignore[union-attr]
        recovery = time.perf_counter() - t0
        restored = sum(len(t.bolt._states) for t in again.bolt_tasks if t.component == "count")  # type: ignore[attr-defined]
        assert cp is not None and restored == keys, (restored, keys)
        return {"keys": keys, "recovery_s": recovery, "checkpoint_file_bytes": size,
                "final_checkpoint_drain_s": final_s, "final_checkpoint_snapshot_s": snapshot_s,
                "final_checkpoint_write_s": write_s}


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def measure(total: int = 1_500_000, repeats: int = 6, keys: int = 1_000_000, bp_seconds: float = 15.0) -> dict:
    off, on, durations, snapshots = [], [], [], []
    for i in range(repeats):
        # Alternate which side runs first: a pair's second run finds a warmer process.
        for interval in ((None, 1000.0) if i % 2 == 0 else (1000.0, None)):
            rate, d = uvloop.run(_throughput(total, interval))
            if interval is None:
                off.append(rate)
                continue
            on.append(rate)
            durations += [x for x in d if x >= 0]
            snapshots += [-x for x in d if x < 0]
    ratios = [b / a for a, b in zip(off, on)]
    bp = uvloop.run(_under_backpressure(bp_seconds))
    rec = uvloop.run(_recovery(keys))
    return {
        "throughput": {"tuples": total, "repeats": repeats, "off_tuples_per_s": off, "on_1s_tuples_per_s": on,
                       "ratio_median": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios)},
        "checkpoint_drain_unloaded_s": {"n": len(durations), "p50": _pct(durations, 0.5), "p99": _pct(durations, 0.99),
                                        "snapshot_p50": _pct(snapshots, 0.5)},
        "checkpoint_drain_under_backpressure_s": {"n": len(bp["durations_s"]), "p50": _pct(bp["durations_s"], 0.5),
                                                  "p99": _pct(bp["durations_s"], 0.99),
                                                  "write_p50": _pct(bp["write_s"], 0.5),
                                                  "snapshot_p50": _pct(bp["snapshot_s"], 0.5),
                                                  "spout_k_at_end": bp["spout_k_at_end"][0]},
        "recovery": rec,
        "python": sys.version.split()[0],
    }


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.checkpoints", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true",
                   help="a short run: 300,000 tuples, 2 pairs, 100,000 keys to recover, 5 s under backpressure")
    return p.parse_args(list(argv or []))  # None: the defaults (python -m bench passes nothing)


def main(argv: Sequence[str] | None = None) -> None:
    a = parse_args(argv)
    out = measure(total=300_000, repeats=2, keys=100_000, bp_seconds=5.0) if a.quick else measure()
    RESULTS.mkdir(exist_ok=True)
    out = stamp(out, "checkpoints")
    (RESULTS / "checkpoints.json").write_text(json.dumps(out, indent=2) + "\n")
    t = out["throughput"]
    print(f"throughput with checkpoints every 1 s / off: {t['ratio_median']:.3f}x "
          f"(range {t['ratio_min']:.3f}-{t['ratio_max']:.3f}, {t['repeats']} pairs)")
    for name in ("checkpoint_drain_unloaded_s", "checkpoint_drain_under_backpressure_s"):
        d = out[name]
        print(f"{name}: p50 {d['p50'] * 1000:.1f} ms, p99 {d['p99'] * 1000:.1f} ms over {d['n']}")
    r = out["recovery"]
    print(f"recovery of {r['keys']:,} keys: {r['recovery_s']:.2f} s (file {r['checkpoint_file_bytes'] / 1e6:.1f} MB)")


if __name__ == "__main__":
    main(sys.argv[1:])
