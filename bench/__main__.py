"""Run every benchmark under bench/ (``make bench``) and print where results went.

Each benchmark module has a ``main()`` that writes its figures to
``bench/results/<name>.json``; ``python -m bench NAME ...`` runs only those named.
Before them the machine and versions go to ``bench/results/environment.json``; after
them ``bench.report`` renders BENCHMARKS.md's generated section from the results.
"""
from __future__ import annotations

import importlib
import json
import pkgutil
import sys
import traceback
from pathlib import Path

from bench import environment, report


# Modules of this package that are not benchmarks (spark_time_shares analyses spark_rate_control's results).
NOT_BENCHMARKS = {"environment", "report", "variant_text", "bytewax_wordcount", "spark_time_shares"}


def main(argv: list[str]) -> int:
    here = Path(__file__).parent
    names = sorted(m.name for m in pkgutil.iter_modules([str(here)])
                   if not m.name.startswith("_") and m.name not in NOT_BENCHMARKS)
    chosen = argv or names
    unknown = [n for n in chosen if n not in names]
    if unknown:
        print(f"unknown benchmark(s): {', '.join(unknown)}; available: {', '.join(names)}")
        return 2
    failed = []
    (here / "results").mkdir(exist_ok=True)
    (here / "results" / "environment.json").write_text(json.dumps(environment.record(), indent=1) + "\n")
    for name in chosen:
        mod = importlib.import_module(f"bench.{name}")
        if not hasattr(mod, "main"):
            continue
        print(f"== bench {name}", flush=True)
        try:
            mod.main()
        except Exception:
            traceback.print_exc()
            failed.append(name)
    if report.main([]) != 0:
        failed.append("report")
    if failed:
        print(f"failed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
