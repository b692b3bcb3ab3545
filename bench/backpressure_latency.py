"""How long from a queue crossing the high mark to the upstream's new rate taking effect.

One downstream task, one upstream task, the real ``StepwiseFlowControl`` and the
real coordinators; the tasks are stand-ins whose queue bytes the benchmark sets.
Each sample: set the downstream's queue to the high mark and call ``poll`` (what
a bolt does after a batch); the clock stops when the upstream's ``set_rate`` is
called, which is when its limiter holds the new rate. In between: the policy's
check, the send-queue, the znode-create handler (a sequential znode under
``taskmessage/``), the child watch, the znode-delete handler (read, hand to the
trigger-queue, delete) and the target applying the signal. Then the queue goes
light, the release travels back, and the next sample starts.

Both coordinators: embedded (in process) and a real ZooKeeper on loopback
(``--zk URL`` to use a running one; otherwise Debian's package is started on a
free port, as the tests do). Goal: p99 <= 20 ms through ZooKeeper.

Through ZooKeeper twice, side by side: without credentials (open ACL) and with
digest credentials, every znode creator-only (issue 17; goal: within 10% of the
former). The two alternate in ``--rounds`` rounds, each round a fresh topology, so
a machine's load drifting during the run falls on both alike; each side's samples
are pooled over its rounds.

``python -m bench backpressure_latency`` writes ``bench/results/backpressure_latency.json``.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import platform
import secrets
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Callable

import uvloop

from backpressure.coordinator.base import Coordinator
from backpressure.coordinator.embedded import EmbeddedCoordinator
from backpressure.policy.stepwise import StepwiseParams
from backpressure.drivers.stepwise import StepwiseFlowControl
from bench.environment import stamp

RESULTS = Path(__file__).parent / "results"
SAMPLES = 300
WARMUP = 10
HIGH, LOW = 1_000_000, 10_000
GOAL_P99_MS = 20.0
ROUNDS = 6
GOAL_AUTH_OVERHEAD = 0.10


class Task:
    """A TaskHandle stand-in: settable queue bytes; ``set_rate`` stamps the time."""

    def __init__(self, task_id: int, upstream: list[int], rate: float = 10_000.0) -> None:
        self.task_id = task_id
        self.component = "spout" if not upstream else "bolt"
        self.upstream_task_ids = upstream
        self.is_spout = not upstream
        self.q = 0
        self.rate = rate
        self.limit: float | None = None
        self.applied_at = 0.0
        self.changed = asyncio.Event()

    def queue_bytes(self) -> int:
        return self.q

    def observed_rate(self) -> float:
        return self.rate

    def executed_count(self) -> int:
        return 0

    def set_rate(self, tuples_per_second: float | None) -> None:
        if tuples_per_second is not None:
            self.applied_at = time.perf_counter()
        self.limit = tuples_per_second
        self.changed.set()

    def show(self, display: object) -> None:
        """Nothing to display in a benchmark."""

    def count_signal(self, direction: str, kind: str) -> None:
        """Nothing to count in a benchmark."""


async def measure(coordinator: Coordinator, samples: int) -> list[float]:
    """Latencies in milliseconds, ``samples`` of them after ``WARMUP`` discarded ones."""
    params = StepwiseParams(step=0.5, high_mark=HIGH, low_mark=LOW, sensitivity=0.05, rate_floor=1.0)
    fc = StepwiseFlowControl(params, coordinator, period=0.005, heartbeat=0.5)
    up, down = Task(1, []), Task(2, [1])
    await fc.start([up, down])
    out: list[float] = []
    try:
        await _until(lambda: 1 in fc.states and 2 in fc.states, 10)
        for i in range(samples + WARMUP):
            up.changed.clear()
            down.q = HIGH
            t0 = time.perf_counter()
            fc.poll(down)
            await asyncio.wait_for(up.changed.wait(), 10)
            if i >= WARMUP:
                out.append((up.applied_at - t0) * 1000.0)
            down.q = 0
            await _until(lambda: up.limit is None and not fc.downstreams[2].pending, 10)
    finally:
        await fc.stop()
    return out


async def _until(cond: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not reached")
        await asyncio.sleep(0.001)


def summary(ms: list[float]) -> dict[str, Any]:
    s = sorted(ms)

    def q(p: float) -> float:
        return s[min(len(s) - 1, max(0, round(p * (len(s) - 1))))]

    return {"samples": len(s), "p50_ms": round(q(0.50), 3), "p90_ms": round(q(0.90), 3),
            "p99_ms": round(q(0.99), 3), "max_ms": round(s[-1], 3), "mean_ms": round(statistics.fmean(s), 3)}


def _start_zookeeper() -> Any:
    """Start Debian's ZooKeeper the way the tests do (tests/zk_server.py)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from zk_server import ZooKeeperServer

    server = ZooKeeperServer()
    server.start()
    return server


async def _zookeeper_side_by_side(zk_url: str, samples: int, rounds: int) -> dict[str, list[float]]:
    """Auth off and auth on (digest credentials, creator-only ACLs), alternating per round."""
    from backpressure.coordinator.access import parse_auth
    from backpressure.coordinator.zookeeper import ZooKeeperCoordinator

    auth = parse_auth(f"digest:bench:{secrets.token_urlsafe(12)}", "bench")
    out: dict[str, list[float]] = {"zookeeper": [], "zookeeper_auth": []}
    per_round = max(1, samples // rounds)
    for r in range(rounds):
        order = ("zookeeper", "zookeeper_auth") if r % 2 == 0 else ("zookeeper_auth", "zookeeper")
        for side in order:
            topology = f"bench-{uuid.uuid4().hex[:6]}"
            coordinator = (ZooKeeperCoordinator(zk_url, topology, auth=auth) if side == "zookeeper_auth"
                           else ZooKeeperCoordinator(zk_url, topology))
            out[side] += await measure(coordinator, per_round)
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(prog="bench backpressure_latency")
    ap.add_argument("--zk", help="zookeeper://host:port/root of a running ZooKeeper (default: start one)")
    ap.add_argument("--samples", type=int, default=SAMPLES)
    ap.add_argument("--rounds", type=int, default=ROUNDS,
                    help="ZooKeeper with and without credentials alternate this many times")
    args = ap.parse_args(argv or [])
    server = None
    zk_url = args.zk
    result: dict[str, Any] = {
        "benchmark": "backpressure_latency",
        "what": "high-mark crossing (poll) -> upstream set_rate, stepwise policy, sensitivity 50 ms",
        "goal_p99_ms_zookeeper": GOAL_P99_MS,
        "goal_auth_overhead": GOAL_AUTH_OVERHEAD,
        "python": platform.python_version(), "machine": platform.machine(),
    }
    try:
        result["embedded"] = summary(uvloop.run(measure(EmbeddedCoordinator("bench"), args.samples)))
        try:
            if zk_url is None:
                server = _start_zookeeper()
                zk_url = server.url("/topo-bench")
            sides = uvloop.run(_zookeeper_side_by_side(zk_url, args.samples, args.rounds))
            for side, ms in sides.items():
                result[side] = {**summary(ms), "url": zk_url, "rounds": args.rounds}
            result["zookeeper_auth"]["what"] = "digest credentials, every znode creator-only"
            result["goal_met"] = result["zookeeper"]["p99_ms"] <= GOAL_P99_MS
            off, on = result["zookeeper"], result["zookeeper_auth"]
            ratios = {f"{k}_ratio": round(on[f"{k}_ms"] / off[f"{k}_ms"], 3) for k in ("p50", "p90", "p99", "mean")}
            result["auth_overhead"] = {**ratios, "within_goal": ratios["p50_ratio"] <= 1 + GOAL_AUTH_OVERHEAD
                                       and ratios["mean_ratio"] <= 1 + GOAL_AUTH_OVERHEAD}
        except Exception as e:  # no Java / no ZooKeeper: report the embedded figures anyway
            result["zookeeper"] = {"error": f"{type(e).__name__}: {e}"}
            result["goal_met"] = None
    finally:
        if server is not None:
            server.cleanup()
    RESULTS.mkdir(parents=True, exist_ok=True)
    result = stamp(result, "backpressure_latency")
    (RESULTS / "backpressure_latency.json").write_text(json.dumps(result, indent=2) + "\n")
    for name in ("embedded", "zookeeper", "zookeeper_auth"):
        r = result.get(name, {})
        if "p50_ms" in r:
            print(f"{name:>14}: p50 {r['p50_ms']:.2f} ms  p90 {r['p90_ms']:.2f} ms  p99 {r['p99_ms']:.2f} ms  "
                  f"max {r['max_ms']:.2f} ms  mean {r['mean_ms']:.2f} ms ({r['samples']} samples)")
        elif r:
            print(f"{name:>14}: {r.get('error')}")
    if "auth_overhead" in result:
        o = result["auth_overhead"]
        print(f"auth on / off: p50 {o['p50_ratio']:.3f}  p90 {o['p90_ratio']:.3f}  p99 {o['p99_ratio']:.3f}  "
              f"mean {o['mean_ratio']:.3f} (goal: p50 and mean within {GOAL_AUTH_OVERHEAD:.0%})")
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
