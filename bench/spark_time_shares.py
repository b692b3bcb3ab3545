"""Where a rate-control run's wall time went after the capacity drop: the batches' fixed
cost, idle time between them, and the work that processed rows.

Rows per second after the drop are ``work share x the marginal rate``: the marginal rate
(rows per second of processing beyond a batch's fixed cost) is the machine's, and it moved
between runs of one round by as much as the controllers' gaps (0.37x-0.61x of the capacity
before the drop within one run, BENCHMARKS.md). The shares are the controller's own: how
often it paid the fixed cost (once a batch) and how long the query sat idle between a batch's
end and the next trigger. So ``work share / fixed's work share`` compares controllers with the
machine's speed taken out, and ``1 - fixed_cost / interval`` bounds the work share of any
controller whose batches end within their interval (one batch, so one fixed cost, per
interval at the least while a backlog lasts; no idle at the most). The bound holds while
the backlog lasts: a controller that has caught up idles for want of rows (``fixed``'s
idle share says which: 0.1-1.1% in the full runs on record, 13% in a ``--quick`` run
where its round's drop was mild and it caught up).

The fixed cost is the round's calibration (``t_proc = a + rows / c`` over fixed-size batches
before the round's runs, ``bench.spark_rate_control.calibrate``); a batch is charged at most
its own processing time.

    python -m bench.spark_time_shares [bench/results/spark_rate_control.json ...]

reads results files as written; one from before the runs' drop times were kept takes each
run's drop at its first trigger plus half the offered span (the drop is set half the span
after the run begins, and the first trigger comes a little after that: shifting the
estimate by a second moves the shares by under 0.005 in the files on record).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

RESULTS = Path(__file__).parent / "results" / "spark_rate_control.json"


@dataclass(frozen=True)
class TimeShares:
    """Shares of a window's wall time (they sum to 1)."""

    fixed_cost: float   # batches x the fixed cost per batch
    idle: float         # no batch running
    work: float         # processing beyond the fixed cost: the rows' own time
    batches: int
    window_s: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def time_shares(batches: Iterable[Mapping[str, Any]], start: float, fixed_cost: float) -> TimeShares | None:
    """The shares over the batches with rows that start at or after ``start``, from the first
    one's start to the last one's end; ``None`` without any. ``batches``: as a results file
    keeps them (``BatchRecord.as_dict``: ``start``, ``end``, ``processing_time`` in seconds,
    ``rows``)."""
    after = [b for b in batches if b["start"] >= start and b["rows"] > 0]
    if not after:
        return None
    begin = min(b["start"] for b in after)
    window = max(b["end"] for b in after) - begin
    if window <= 0:
        return None
    busy = sum(b["processing_time"] for b in after)
    fixed = sum(min(fixed_cost, b["processing_time"]) for b in after)
    idle = max(0.0, window - busy)
    return TimeShares(fixed / window, idle / window, (busy - fixed) / window, len(after), window)


def in_interval_ceiling(fixed_cost: float, interval: float) -> float:
    """The largest work share of a controller whose batches end within their interval while a
    backlog lasts: one fixed cost per interval, no idle."""
    return max(0.0, 1.0 - fixed_cost / interval)


def estimated_drop_at(batches: Sequence[Mapping[str, Any]], periods: int) -> float:
    """A run's drop time where the file did not keep it: its first trigger plus half the span
    over which the source offers rows (module docstring)."""
    from bench.spark_rate_control import offered_span    # here: that module imports this one

    return min(float(b["submit"]) for b in batches) + offered_span(periods) / 2


def analyse(results: Mapping[str, Any]) -> dict[str, Any]:
    """Per controller of ``capacity_drop``: each run's shares after the drop and their means,
    each run's work share over the same round's best, and per round the in-interval ceiling
    over that round's best work share."""
    setup = results["setup"]
    interval = float(setup["interval_ms"]) / 1000.0
    rounds = setup["rounds"]
    data = results["scenarios"]["capacity_drop"]
    kept = data.get("runs", {})
    per: dict[str, list[TimeShares | None]] = {}
    estimated = False
    for name, runs in data["batches"].items():
        per[name] = []
        metas = kept.get(name, [])
        for r, batches in enumerate(runs):
            meta = metas[r] if r < len(metas) else {}
            if "drop_at" in meta:
                drop_at = float(meta["drop_at"])
            else:
                drop_at, estimated = estimated_drop_at(batches, int(setup["periods"])), True
            round_index = int(meta.get("round", r))
            per[name].append(time_shares(batches, drop_at, float(rounds[round_index]["fixed_cost_per_batch_s"])))
    n_rounds = min(len(v) for v in per.values())
    best = [max((v[r].work for v in per.values() if v[r] is not None), default=0.0) for r in range(n_rounds)]
    out: dict[str, Any] = {"interval_s": interval, "drop_time_estimated": estimated, "controllers": {}}
    for name, shares in per.items():
        have = [s for s in shares if s is not None]
        out["controllers"][name] = {
            "per_run": [None if s is None else s.as_dict() for s in shares],
            "mean": {k: statistics.fmean(getattr(s, k) for s in have) if have else None
                     for k in ("fixed_cost", "idle", "work")},
            "work_over_best_per_round": [None if s is None or best[r] <= 0 else s.work / best[r]
                                         for r, s in enumerate(shares[:n_rounds])],
        }
    ceilings = [in_interval_ceiling(float(rounds[r]["fixed_cost_per_batch_s"]), interval) / best[r]
                for r in range(n_rounds) if best[r] > 0]
    out["in_interval_ceiling_over_best_per_round"] = ceilings
    out["in_interval_ceiling_over_best_mean"] = statistics.fmean(ceilings) if ceilings else None
    for c in out["controllers"].values():
        ratios = [x for x in c["work_over_best_per_round"] if x is not None]
        c["work_over_best_mean"] = statistics.fmean(ratios) if ratios else None
    return out


def table(analysis: Mapping[str, Any]) -> str:
    """The shares as a Markdown table, one row per controller."""
    def cell(x: float | None, fmt: str) -> str:
        return "-" if x is None else f"{x:{fmt}}"

    lines = ["| controller (after the drop) | fixed cost | idle | work | work / the round's best, mean (per round) |",
             "|---|---|---|---|---|"]
    for name, c in analysis["controllers"].items():
        m = c["mean"]
        per_round = ", ".join(cell(x, ".2f") for x in c["work_over_best_per_round"])
        lines.append(f"| {name} | {cell(m['fixed_cost'], '.3f')} | {cell(m['idle'], '.3f')} | {cell(m['work'], '.3f')} | "
                     f"{cell(c['work_over_best_mean'], '.2f')} ({per_round}) |")
    ceilings = analysis["in_interval_ceiling_over_best_per_round"]
    lines += ["", "A controller whose batches end within their interval, idle never, the round's fixed cost once an "
              f"interval: work / the round's best at most {cell(analysis['in_interval_ceiling_over_best_mean'], '.2f')} "
              f"({', '.join(f'{x:.2f}' for x in ceilings)})."]
    if analysis["drop_time_estimated"]:
        lines.append("(Drop times estimated: the file did not keep them; see `bench.spark_time_shares`.)")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("files", nargs="*", type=Path, default=[RESULTS])
    a = p.parse_args(list(argv or []))
    for path in a.files:
        try:
            results = json.loads(path.read_text(encoding="utf-8"))
            analysis = analyse(results)
        except (OSError, ValueError) as exc:
            print(f"{path}: not a readable results file ({exc})", file=sys.stderr)
            return 1
        except KeyError as exc:
            print(f"{path}: no capacity_drop runs with batches and calibrations (missing {exc})", file=sys.stderr)
            return 1
        print(f"{path.name}:\n{table(analysis)}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
