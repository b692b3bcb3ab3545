"""Run every benchmark under bench/ (``make bench``) and print where results went.

Each benchmark module has a ``main()`` that writes its figures to
``bench/results/<name>.json``; ``python -m bench NAME ...`` runs only those named.
"""
from __future__ import annotations

import importlib
import pkgutil
import sys
import traceback
from pathlib import Path


def main(argv: list[str]) -> int:
    here = Path(__file__).parent
    names = sorted(m.name for m in pkgutil.iter_modules([str(here)]) if not m.name.startswith("_"))
    chosen = argv or names
    unknown = [n for n in chosen if n not in names]
    if unknown:
        print(f"unknown benchmark(s): {', '.join(unknown)}; available: {', '.join(names)}")
        return 2
    failed = []
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
    if failed:
        print(f"failed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
