"""Word count words/s: topo (one process, acking off and on) against a bare asyncio chain
and Bytewax 0.21 (pinned, installed into the venv by ``make bench``), same input, final
counts checked against the truth every run, runs interleaved, medians and ratios.

The input is ``SENTENCES`` sentences from the word-count example (8 words on average).
topo runs the example's own components (``SentenceSpout`` -> ``SplitBolt`` shuffle ->
``CountBolt`` fields on ``word``), without the SQLite sink; Bytewax runs the same
split/count as ``flat_map`` + ``count_final`` over a ``TestingSource`` in batches of
1000 (its fast path); the bare chain is three asyncio tasks joined by
``asyncio.Queue(1000)`` passing one item per sentence/word.

``python -m bench wordcount`` writes ``bench/results/wordcount.json``.
"""
from __future__ import annotations

import asyncio
import json
import platform
import re
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable

import uvloop

from topo.examples.wordcount import DEFAULT_SENTENCES, CountBolt, SentenceSpout, SplitBolt, expected_counts
from topo.topology import TopologyBuilder
from runtime.local.engine import LocalEngine

SENTENCES = 200_000
REPEATS = 5
RESULTS = Path(__file__).parent / "results"
_WORD = re.compile(r"[a-z0-9']+")   # the example's SplitBolt's rule


def words(sentence: str) -> list[str]:
    return _WORD.findall(sentence.lower())


def _truth(n: int) -> Counter[str]:
    return expected_counts(repeat=n // len(DEFAULT_SENTENCES))


class _Counts(CountBolt):
    """The example's count, keeping its counts where the bench can read them."""

    registry: list[Counter[str]] = []

    def prepare(self, context: Any, collector: Any) -> None:
        super().prepare(context, collector)
        self.registry.append(self.counts)


async def run_topo(n: int, acking: bool) -> tuple[float, Counter[str]]:
    _Counts.registry = []
    b = TopologyBuilder("wc-bench", {"acking": acking, "backpressure.policy": "none",
                                     "max_spout_pending": 5000})
    b.spout("sentences", SentenceSpout(repeat=n // len(DEFAULT_SENTENCES)))
    b.bolt("split", SplitBolt()).shuffle("sentences")
    b.bolt("count", _Counts()).fields("split", "word")
    engine = LocalEngine(b.build())
    t0 = time.perf_counter()
    await engine.run()
    elapsed = time.perf_counter() - t0
    total: Counter[str] = Counter()
    for c in _Counts.registry:
        total.update(c)
    return elapsed, total


async def run_bare(n: int) -> tuple[float, Counter[str]]:
    q1: asyncio.Queue[Any] = asyncio.Queue(1000)
    q2: asyncio.Queue[Any] = asyncio.Queue(1000)
    counts: Counter[str] = Counter()

    async def spout() -> None:
        for i in range(n):
            await q1.put(DEFAULT_SENTENCES[i % len(DEFAULT_SENTENCES)])
        await q1.put(None)

    async def split() -> None:
        while (s := await q1.get()) is not None:
            for w in words(s):
                await q2.put(w)
        await q2.put(None)

    async def count() -> None:
        while (w := await q2.get()) is not None:
            counts[w] += 1

    t0 = time.perf_counter()
    await asyncio.gather(spout(), split(), count())
    return time.perf_counter() - t0, counts


def run_bytewax(n: int) -> tuple[float, Counter[str]] | None:
    try:
        import bytewax.operators as op
        from bytewax.dataflow import Dataflow
        from bytewax.testing import TestingSink, TestingSource, run_main
    except ImportError:
        return None
    sentences = [DEFAULT_SENTENCES[i % len(DEFAULT_SENTENCES)] for i in range(n)]
    out: list[tuple[str, int]] = []
    flow = Dataflow("wordcount")
    src = op.input("in", flow, TestingSource(sentences, batch_size=1000))
    ws = op.flat_map("split", src, words)
    counted = op.count_final("count", ws, lambda w: w)
    op.output("out", counted, TestingSink(out))
    t0 = time.perf_counter()
    run_main(flow)
    return time.perf_counter() - t0, Counter(dict(out))


def measure(n: int = SENTENCES, repeats: int = REPEATS) -> dict[str, Any]:
    truth = _truth(n)
    n_words = sum(truth.values())
    sides: dict[str, Callable[[], tuple[float, Counter[str]] | None]] = {
        "topo_acking_off": lambda: uvloop.run(run_topo(n, False)),
        "topo_acking_on": lambda: uvloop.run(run_topo(n, True)),
        "bare_asyncio_chain": lambda: uvloop.run(run_bare(n)),
        "bytewax_0_21": lambda: run_bytewax(n),
    }
    rates: dict[str, list[float]] = {k: [] for k in sides}
    for i in range(repeats):
        order = list(sides) if i % 2 == 0 else list(reversed(sides))
        for name in order:
            got = sides[name]()
            if got is None:
                continue
            elapsed, counts = got
            if counts != truth:
                raise AssertionError(f"{name}: wrong counts")
            rates[name].append(n_words / elapsed)
    med = {k: statistics.median(v) for k, v in rates.items() if v}
    out: dict[str, Any] = {"sentences": n, "words": n_words, "repeats": repeats,
                           "python": sys.version.split()[0], "machine": platform.machine(),
                           "words_per_s": rates, "median_words_per_s": med}
    if "bytewax_0_21" in med:
        out["ratio_topo_off_vs_bytewax"] = med["topo_acking_off"] / med["bytewax_0_21"]
        out["ratio_topo_on_vs_bytewax"] = med["topo_acking_on"] / med["bytewax_0_21"]
    out["ratio_acking_on_vs_off"] = med["topo_acking_on"] / med["topo_acking_off"]
    out["ratio_topo_off_vs_bare"] = med["topo_acking_off"] / med["bare_asyncio_chain"]
    return out


def main(argv: list[str] | None = None) -> None:
    quick = bool(argv) and "--quick" in argv
    out = measure(n=50_000, repeats=2) if quick else measure()
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "wordcount.json").write_text(json.dumps(out, indent=2) + "\n")
    for k, v in out["median_words_per_s"].items():
        print(f"{k:22s} {v:12,.0f} words/s")
    for k in ("ratio_topo_off_vs_bytewax", "ratio_topo_on_vs_bytewax", "ratio_acking_on_vs_off",
              "ratio_topo_off_vs_bare"):
        if k in out:
            print(f"{k}: {out[k]:.2f}")


if __name__ == "__main__":
    main(sys.argv[1:])
