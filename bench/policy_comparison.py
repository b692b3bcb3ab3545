"""The comparison the flow-control claims rest on: none / source_stop / watermark / stepwise.

The slow-stage scenario of ``configs/slow_stage.yaml``: ``events`` offers 20,000
tuples/s, ``enrich`` manages 5,000/s (then ``enriched``), and ``tally`` is a fast
branch from the same source. Each policy runs it for ``--duration`` seconds
(25 by default; the four runs take under two minutes) on the local engine with the
file's marks (1 MB high, 100 KB low, hard bound 2 MB). The water-mark policy gets
the same marks as fractions of the hard bound (0.5 / 0.05) and its check interval
equals stepwise's sensitivity (1 s), so the policies differ in their rules, not
in their thresholds.

Per policy, measured after the first ``--warmup`` seconds:

* ``fast_branch_tps``: tuples/s ``tally`` executed;
* ``slow_stage_tps``: tuples/s ``enrich`` executed (at most 5,000);
* ``peak_queue_bytes``: the most ``enrich``'s queue ever held (whole run), against
  the 2 MB hard bound where ``emit`` waits;
* oscillation: ``rate_changes`` (limit changes on the spout, or on any task for
  stepwise, whole run), and ``emit_cv``, the coefficient of variation of the
  spout's emit rate sampled every 250 ms.

In this topology the fast branch hangs off the very spout ``enrich`` is fed by, so
every policy that throttles the spout slows ``tally`` too; stepwise's advantage
(it throttles only the *direct* upstream) shows when a relay stands in between,
see ``tests/test_backpressure_e2e.py``.

``python -m bench policy_comparison`` writes ``bench/results/policy_comparison.json``.
Two cores are shared with other work while it runs: read the figures as a
comparison between policies measured the same way, not as absolute capacities.
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
from typing import Any

import uvloop

from runtime.local.engine import LocalEngine
from topo.spec import load

RESULTS = Path(__file__).parent / "results"
SCENARIO = Path(__file__).resolve().parent.parent / "configs" / "slow_stage.yaml"
POLICIES = ("none", "source_stop", "watermark", "stepwise")
SAMPLE_S = 0.25
OFFERED = 20_000.0

# The water marks as fractions of the scenario's hard bound (2 x its 1 MB high mark).
_OVERRIDES: dict[str, dict[str, Any]] = {
    "none": {},
    "source_stop": {},
    "watermark": {"backpressure.water_mark.high": 0.5, "backpressure.water_mark.low": 0.05,
                  "backpressure.water_mark.check_interval_ms": 1000},
    "stepwise": {},
}


async def run_policy(policy: str, duration: float, warmup: float) -> dict[str, Any]:
    """One run of the scenario under ``policy``; the figures listed in the module docstring."""
    topology = load(SCENARIO)
    engine = LocalEngine(topology, {"backpressure.policy": policy, **_OVERRIDES[policy]})
    by_component = {t.component: t for t in engine.tasks}
    spout, enrich, tally = by_component["events"], by_component["enrich"], by_component["tally"]
    changes: list[tuple[float, int, float | None]] = []
    t0 = time.monotonic()
    engine.flow.on_rate_change = lambda task, rate: changes.append((time.monotonic() - t0, task, rate))
    samples: list[tuple[float, int, int, int, int]] = []

    async def sampler() -> None:
        while True:
            samples.append((time.monotonic() - t0, spout.stats.emitted, enrich.executed_count(),
                            tally.executed_count(), enrich.queue_bytes()))
            await asyncio.sleep(SAMPLE_S)

    probe = asyncio.create_task(sampler())
    result = await engine.run(duration=duration)
    probe.cancel()
    steady = [s for s in samples if warmup <= s[0] <= duration]
    (ta, ea, sa, fa, _), (tb, eb, sb, fb, _) = steady[0], steady[-1]
    span = tb - ta
    emit_rates = [(b[1] - a[1]) / (b[0] - a[0]) for a, b in zip(steady, steady[1:]) if b[0] > a[0]]
    mean = statistics.fmean(emit_rates)
    totals = result.component_totals()
    assert enrich.queue is not None
    return {
        "policy": policy,
        "fast_branch_tps": round((fb - fa) / span, 1),
        "slow_stage_tps": round((sb - sa) / span, 1),
        "spout_emit_tps": round((eb - ea) / span, 1),
        "peak_queue_bytes": enrich.queue.peak_bytes,
        "hard_bound": enrich.queue.hard_bound,
        "rate_changes": len(changes),
        "rate_changes_after_warmup": sum(1 for c in changes if c[0] >= warmup),
        "emit_cv": round(statistics.pstdev(emit_rates) / mean, 3) if mean > 0 else None,
        "emit_samples": len(emit_rates),
        "lost": totals["events"]["emitted"] - totals["enrich"]["executed"],
        "stop_reason": result.reason,
    }


def measure(duration: float, warmup: float) -> dict[str, Any]:
    runs = []
    for policy in POLICIES:
        print(f"  {policy}: {duration:.0f} s ...", flush=True)
        runs.append(uvloop.run(run_policy(policy, duration, warmup)))
    return {"scenario": str(SCENARIO.relative_to(SCENARIO.parent.parent)), "offered_tps": OFFERED,
            "slow_stage_capacity_tps": 5_000.0, "duration_s": duration, "warmup_s": warmup,
            "sample_s": SAMPLE_S, "python": platform.python_version(), "runs": runs}


def table(report: dict[str, Any]) -> str:
    head = (f"{'policy':<12} {'fast tps':>9} {'slow tps':>9} {'spout tps':>9} {'peak queue':>11} "
            f"{'changes':>8} {'emit cv':>8} {'lost':>5}")
    rows = [head, "-" * len(head)]
    for r in report["runs"]:
        cv = "-" if r["emit_cv"] is None else f"{r['emit_cv']:.3f}"
        rows.append(f"{r['policy']:<12} {r['fast_branch_tps']:>9.0f} {r['slow_stage_tps']:>9.0f} "
                    f"{r['spout_emit_tps']:>9.0f} {r['peak_queue_bytes']:>11,d} {r['rate_changes']:>8d} "
                    f"{cv:>8} {r['lost']:>5d}")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench policy_comparison")
    ap.add_argument("--duration", type=float, default=25.0, help="seconds per policy")
    ap.add_argument("--warmup", type=float, default=5.0, help="seconds left out of the rates")
    args = ap.parse_args(argv if argv is not None else [])
    report = measure(args.duration, args.warmup)
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / "policy_comparison.json"
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(table(report))
    print(f"wrote {out}")


if __name__ == "__main__":
    main(sys.argv[1:])
