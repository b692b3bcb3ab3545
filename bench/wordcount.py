"""Word count words/s: topo in one process against a bare asyncio chain and Bytewax 0.21
(pinned, installed into the venv by ``make bench``), same input, final counts checked
against the truth on every run, runs interleaved, medians and ratios; then the speed-up
of ``topo run --workers 2`` over ``--workers 1``.

The input is ``SENTENCES`` sentences from the word-count example (8 words on average).
Two variants, each compared like for like with Bytewax:

* **per tuple** (Storm's API): ``SentenceSpout`` (one sentence per ``next_tuple``) ->
  ``SplitBolt`` (``execute`` per sentence, ``emit`` per word) -> ``FinalCountBolt``
  (``execute`` per word, the counts emitted once at the end of the input); Bytewax:
  ``flat_map`` + ``count_final``.
* **batch**: ``SentenceSpout(batch=1000)`` (``emit_many`` of a ``Columns``) -> ``BatchSplitBolt``
  (``execute_batch``: the words by C-level maps, one ``emit_many`` of a ``Columns`` per batch)
  -> ``BatchFinalCountBolt`` (``execute_batch``: one ``Counter.update`` of the ``word``
  column); Bytewax: ``flat_map_batch`` with the same maps (``words_of_batch``) + ``count_final``.

Both topologies are shuffle then fields on ``word``, one task each, no sink; Bytewax
reads a ``TestingSource`` in batches of 1000 in both. topo runs each variant with acking
off and on, and with acking on at both granularities (``acking.granularity``: ``tuple``,
Storm's edge per tuple; ``batch``, Trident's tree per spout batch). The bare chain is
three asyncio tasks joined by ``asyncio.Queue(1000)`` passing one item per sentence/word.
The per-tuple API's floor (``run_api_floor``) calls the example's ``SplitBolt`` and
``FinalCountBolt`` with no engine between them (``emit`` a bare ``list.append``, tuple
objects built by C-level maps): what the per-tuple components cost before any engine work.
The sides the comparison with Bytewax rests on also run on the ``zipf`` input below
(``zipf_...``), whose 5,000 words are the many keys of real text where the example has 27.
One extra topo side keeps the topology earlier figures were taken on (``SplitBolt`` ->
``CountBolt``, which emits a running count per word).

Workers: ``topo run <spec> --quiet --workers N`` (wall time of the whole command,
process start included) on ``WORKER_SENTENCES`` sentences per tuple and ``WORKER_SENTENCES`` x
``BATCH_INPUT_FACTOR`` for the batch components (so that the runs last some 4-9 s and the
0.3-0.5 s of process start, paid once by a topology that runs for hours, is not a fifth of
a run), spout x2 (``local_or_shuffle``
to the split, so sentences stay in their worker), split x2, count x2 (fields), per-tuple
(``SplitBolt`` -> ``FinalCountBolt``) and batch variants, acking off, on, and on with
``acking.granularity: batch``, ``WORKER_ROUNDS`` (``--worker-rounds``) interleaved rounds, medians (and each speed-up also as the median
of the rounds' own ratios, ``speedup_2_vs_1_paired``, and over the quiet runs alone,
``quiet``: a two-core ``machine_speed`` reading is taken before and after every run, and a
run whose slower reading lies over ``QUIET_FACTOR`` times the 10th percentile of the readings is left out there), with bytecode
caching on (``PYTHONDONTWRITEBYTECODE`` dropped from the command's environment). Both counts
emit their finals at the end of the input (one end-of-input round across workers), as
Bytewax's ``count_final`` does,
to a ``JsonLinesSink`` x2 whose files are checked against the truth after every run. Beside them, in the same rounds, the same word count in
Bytewax (``bench/bytewax_wordcount.py``: two source partitions, ``flat_map`` or
``flat_map_batch``, ``count_final``) run by ``python -m bytewax.testing`` with ``-p 1``,
``-p 2`` and ``-w 2`` (wall time, final counts checked on every run), and topo against
Bytewax's faster way at the same number of processes. Inputs (``--worker-inputs``,
``WORKER_INPUTS``): the example's five sentences (27 distinct words), and made-up
sentences over 5,000 words drawn by Zipf's law (``zipf``, the many keys of real text) or
all alike (``uniform``: fields grouping then gives each count task half the words).

``python -m bench wordcount`` writes ``bench/results/wordcount.json``.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import re
import shutil
import statistics
import string
import subprocess
import sys
import tempfile
import time
from collections import Counter, deque
from itertools import chain
from pathlib import Path
from typing import Any, Callable, Collection, Iterable, Sequence

import uvloop

from topo.examples.wordcount import (DEFAULT_SENTENCES, BatchFinalCountBolt, BatchSplitBolt, CountBolt,
                                     FinalCountBolt, SentenceSpout, SplitBolt)
from topo.api import run_tuples
from topo.groupings import fields_task_index
from topo.topology import TopologyBuilder
from bench import environment
from bench.environment import stamp
from runtime.local.engine import LocalEngine

SENTENCES = 200_000
REPEATS = 5
WORKER_SENTENCES = 800_000   # with the bolt turns of 9374179 a 400,000-sentence run took 2.3-3.9 s
BATCH_INPUT_FACTOR = 4       # the batch components take 1/4 of the per-tuple ones' time per sentence
WORKER_ROUNDS = 5
# The workers bench's inputs (``sentences_for``): the example's sentences, or made-up ones
# over a vocabulary whose word of rank r has weight 1 / r ** value.
WORKER_INPUTS: dict[str, float | None] = {"example": None, "zipf": 1.0, "uniform": 0.0}
DEFAULT_WORKER_INPUTS = ("example", "zipf")
VOCABULARY_SENTENCES = 10_000
VOCABULARY_WORDS = 5_000
# How Bytewax runs at 1 and 2 processes: separate processes, or worker threads in one
# (the "-w/-p, whichever is faster for it"; both are measured).
BYTEWAX_PROCESSES = {"p1": ["-p", "1"], "p2": ["-p", "2"], "w2": ["-w", "2"]}
RESULTS = Path(__file__).parent / "results"
_WORD = re.compile(r"[a-z0-9']+")   # the example's SplitBolt's rule


def words(sentence: str) -> list[str]:
    return _WORD.findall(sentence.lower())


def words_of_batch(sentences: list[str]) -> list[str]:
    """The words of a batch of sentences, by the same C-level maps as ``BatchSplitBolt``."""
    return list(chain.from_iterable(map(_WORD.findall, map(str.lower, sentences))))


class _Registered:
    """Mixed into the example's count bolts: their counts kept where the bench can read them."""

    counts: Counter[str]

    def prepare(self, context: Any, collector: Any) -> None:
        super().prepare(context, collector)  # type: ignore[misc]
        _Counts.registry.append(self.counts)


class _Counts(_Registered, CountBolt):
    registry: list[Counter[str]] = []


class _Final(_Registered, FinalCountBolt):
    pass


class _BatchFinal(_Registered, BatchFinalCountBolt):
    pass


async def run_topo(n: int, acking: bool, variant: str, granularity: str = "tuple",
                   sentences: Sequence[str] = DEFAULT_SENTENCES) -> tuple[float, Counter[str]]:
    """``variant``: "per_tuple", "batch" or "running" (the running counts of earlier figures);
    ``granularity``: what one ack covers with acking on (``acking.granularity``); sentence
    ``i`` is ``sentences[i % len(sentences)]``."""
    _Counts.registry = []
    b = TopologyBuilder("wc-bench", {"acking": acking, "backpressure.policy": "none",
                                     "max_spout_pending": 5000, "acking.granularity": granularity})
    batch = variant == "batch"
    b.spout("sentences", SentenceSpout(sentences, repeat=n // len(sentences), batch=1000 if batch else 1))
    b.bolt("split", BatchSplitBolt() if batch else SplitBolt()).shuffle("sentences")
    count = {"batch": _BatchFinal, "per_tuple": _Final, "running": _Counts}[variant]
    b.bolt("count", count()).fields("split", "word")
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


class _AppendCollector:
    """A collector whose ``emit`` is a bare ``list.append`` of the values: less than any
    engine can do (no count, no routing, no tuple built at the emit)."""

    def __init__(self) -> None:
        self.out: list[Any] = []
        self.emit = self.out.append


def _wire(values: list[Any]) -> Any:
    """Tuple objects for ``values`` (one list of values each), untracked, built by C-level maps
    as the engine builds a run's (``run_tuples``)."""
    return run_tuples([values, None, None, 0.0, None, 0])


def run_api_floor(n: int, sentences: Sequence[str] = DEFAULT_SENTENCES) -> tuple[float, Counter[str]]:
    """The per-tuple components' own calls with no engine between them: the example's
    ``SplitBolt.execute`` once per sentence (its ``emit`` a bare ``list.append``), then
    ``FinalCountBolt.execute`` once per word, every tuple object built by C-level maps,
    1,000 sentences at a time.
    What Storm's per-tuple API costs in Python before any engine work: no engine that
    calls these components as they are written can be faster."""
    split, count, collector = SplitBolt(), FinalCountBolt(), _AppendCollector()
    split.collector = collector  # type: ignore[assignment]
    rows = [[sentences[i % len(sentences)]] for i in range(n)]
    out = collector.out
    t0 = time.perf_counter()
    for i in range(0, n, 1000):     # 1,000 sentences at a time, as Bytewax reads them
        deque(map(split.execute, _wire(rows[i:i + 1000])), 0)
        deque(map(count.execute, _wire(out)), 0)
        out.clear()
    return time.perf_counter() - t0, count.counts


def run_bytewax(n: int, batch: bool, sentences: Sequence[str] = DEFAULT_SENTENCES) -> tuple[float, Counter[str]] | None:
    try:
        import bytewax.operators as op
        from bytewax.dataflow import Dataflow
        from bytewax.testing import TestingSink, TestingSource, run_main
    except ImportError:
        return None
    items = [sentences[i % len(sentences)] for i in range(n)]
    out: list[tuple[str, int]] = []
    flow = Dataflow("wordcount")
    src = op.input("in", flow, TestingSource(items, batch_size=1000))
    if batch:
        ws = op.flat_map_batch("split", src, words_of_batch)
    else:
        ws = op.flat_map("split", src, words)
    counted = op.count_final("count", ws, lambda w: w)
    op.output("out", counted, TestingSink(out))
    t0 = time.perf_counter()
    run_main(flow)
    return time.perf_counter() - t0, Counter(dict(out))


def measure(n: int = SENTENCES, repeats: int = REPEATS) -> dict[str, Any]:
    """Words/s of every side on the example's sentences and, for the sides the comparison
    with Bytewax rests on, on the ``zipf`` input too (keys ``zipf_...``: 5,000 words, where
    the example has 27; ``n`` rounded to whole passes over its 10,000 sentences)."""
    truth = truth_of(DEFAULT_SENTENCES, n // len(DEFAULT_SENTENCES) * len(DEFAULT_SENTENCES))
    n_words = sum(truth.values())
    zipf = vocabulary_sentences(WORKER_INPUTS["zipf"])
    n_zipf = max(n // len(zipf), 1) * len(zipf)
    truth_zipf = truth_of(zipf, n_zipf)
    sides: dict[str, Callable[[], tuple[float, Counter[str]] | None]] = {
        "topo_per_tuple_acking_off": lambda: uvloop.run(run_topo(n, False, "per_tuple")),
        "topo_per_tuple_acking_on": lambda: uvloop.run(run_topo(n, True, "per_tuple")),
        "topo_batch_acking_off": lambda: uvloop.run(run_topo(n, False, "batch")),
        "topo_batch_acking_on": lambda: uvloop.run(run_topo(n, True, "batch")),
        "topo_per_tuple_acking_on_batch_granularity": lambda: uvloop.run(run_topo(n, True, "per_tuple", "batch")),
        "topo_batch_acking_on_batch_granularity": lambda: uvloop.run(run_topo(n, True, "batch", "batch")),
        "topo_running_counts_acking_off": lambda: uvloop.run(run_topo(n, False, "running")),
        "bare_asyncio_chain": lambda: uvloop.run(run_bare(n)),
        "per_tuple_api_floor": lambda: run_api_floor(n),
        "bytewax_flat_map": lambda: run_bytewax(n, False),
        "bytewax_flat_map_batch": lambda: run_bytewax(n, True),
        "zipf_topo_per_tuple_acking_off": lambda: uvloop.run(run_topo(n_zipf, False, "per_tuple", sentences=zipf)),
        "zipf_topo_per_tuple_acking_on_batch_granularity":
            lambda: uvloop.run(run_topo(n_zipf, True, "per_tuple", "batch", sentences=zipf)),
        "zipf_topo_batch_acking_off": lambda: uvloop.run(run_topo(n_zipf, False, "batch", sentences=zipf)),
        "zipf_topo_batch_acking_on_batch_granularity":
            lambda: uvloop.run(run_topo(n_zipf, True, "batch", "batch", sentences=zipf)),
        "zipf_per_tuple_api_floor": lambda: run_api_floor(n_zipf, zipf),
        "zipf_bytewax_flat_map": lambda: run_bytewax(n_zipf, False, zipf),
        "zipf_bytewax_flat_map_batch": lambda: run_bytewax(n_zipf, True, zipf),
    }
    truths = {k: (truth_zipf if k.startswith("zipf_") else truth) for k in sides}
    rates: dict[str, list[float]] = {k: [] for k in sides}
    for i in range(repeats):
        order = list(sides) if i % 2 == 0 else list(reversed(sides))
        for name in order:
            got = sides[name]()
            if got is None:
                continue
            elapsed, counts = got
            if counts != truths[name]:
                raise AssertionError(f"{name}: wrong counts")
            rates[name].append(sum(truths[name].values()) / elapsed)
    med = {k: statistics.median(v) for k, v in rates.items() if v}
    out: dict[str, Any] = {"sentences": n, "words": n_words, "repeats": repeats,
                           "zipf_sentences": n_zipf, "zipf_words": sum(truth_zipf.values()),
                           "python": sys.version.split()[0], "machine": platform.machine(),
                           "words_per_s": rates, "median_words_per_s": med}
    ratios = {"per_tuple_vs_bytewax": ("topo_per_tuple_acking_off", "bytewax_flat_map"),
              "per_tuple_acking_on_vs_bytewax": ("topo_per_tuple_acking_on", "bytewax_flat_map"),
              "batch_vs_bytewax": ("topo_batch_acking_off", "bytewax_flat_map_batch"),
              "batch_acking_on_vs_bytewax": ("topo_batch_acking_on", "bytewax_flat_map_batch"),
              "per_tuple_acking_on_vs_off": ("topo_per_tuple_acking_on", "topo_per_tuple_acking_off"),
              "batch_acking_on_vs_off": ("topo_batch_acking_on", "topo_batch_acking_off"),
              "per_tuple_batch_granularity_vs_off": ("topo_per_tuple_acking_on_batch_granularity",
                                                     "topo_per_tuple_acking_off"),
              "batch_batch_granularity_vs_off": ("topo_batch_acking_on_batch_granularity", "topo_batch_acking_off"),
              "batch_vs_per_tuple": ("topo_batch_acking_off", "topo_per_tuple_acking_off"),
              "per_tuple_vs_bare": ("topo_per_tuple_acking_off", "bare_asyncio_chain"),
              "per_tuple_vs_api_floor": ("topo_per_tuple_acking_off", "per_tuple_api_floor"),
              "api_floor_vs_bytewax": ("per_tuple_api_floor", "bytewax_flat_map"),
              "zipf_per_tuple_vs_bytewax": ("zipf_topo_per_tuple_acking_off", "zipf_bytewax_flat_map"),
              "zipf_per_tuple_batch_granularity_vs_bytewax": ("zipf_topo_per_tuple_acking_on_batch_granularity",
                                                              "zipf_bytewax_flat_map"),
              "zipf_batch_vs_bytewax": ("zipf_topo_batch_acking_off", "zipf_bytewax_flat_map_batch"),
              "zipf_batch_batch_granularity_vs_bytewax": ("zipf_topo_batch_acking_on_batch_granularity",
                                                          "zipf_bytewax_flat_map_batch"),
              "zipf_per_tuple_vs_api_floor": ("zipf_topo_per_tuple_acking_off", "zipf_per_tuple_api_floor"),
              "zipf_api_floor_vs_bytewax": ("zipf_per_tuple_api_floor", "zipf_bytewax_flat_map")}
    out["ratios"] = {k: med[a] / med[b] for k, (a, b) in ratios.items() if a in med and b in med}
    return out


def vocabulary_sentences(zipf: float, n: int = VOCABULARY_SENTENCES, vocabulary: int = VOCABULARY_WORDS,
                         seed: int = 0) -> list[str]:
    """``n`` sentences over ``vocabulary`` made-up words, the word of rank ``r`` drawn with
    weight ``1 / r ** zipf`` (1: Zipf's law, as in natural text; 0: every word alike), 4-9
    words each (6.5 on average; the example's 6.4), words of 2-6 letters. Seeded: the same
    sentences on every run."""
    rng = random.Random(seed)
    words: list[str] = []
    seen: set[str] = set()
    while len(words) < vocabulary:
        w = "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(2, 6)))
        if w not in seen:
            seen.add(w)
            words.append(w)
    weights = [1.0 / r ** zipf for r in range(1, vocabulary + 1)]
    return [" ".join(rng.choices(words, weights, k=rng.randint(4, 9))) for _ in range(n)]


def sentences_for(source: str, d: Path) -> tuple[str, list[str]]:
    """The spout's ``path`` kwarg ("" = the example's sentences) and the sentences of the
    workers bench's input ``source`` (``WORKER_INPUTS``; a made-up one is written into ``d``).

    Fields grouping cannot spread a skewed input's words evenly over two tasks: the
    example's five sentences (27 distinct words) give one count task 20 of every 32 words,
    and the ``zipf`` input, whose most frequent word is 11% of all, gives one 62%. The
    ``uniform`` input (5,000 words drawn alike) gives each 50%: it shows what two workers
    do when the keys are not what limits them."""
    if source == "example":
        return "", list(DEFAULT_SENTENCES)
    if source not in WORKER_INPUTS:
        raise ValueError(f"unknown workers input {source!r} (known: {', '.join(WORKER_INPUTS)})")
    sentences = vocabulary_sentences(WORKER_INPUTS[source])
    path = d / f"{source}.txt"
    path.write_text("\n".join(sentences) + "\n", encoding="utf-8")
    return str(path), sentences


def truth_of(sentences: Sequence[str], total: int) -> Counter[str]:
    """Counts of ``total`` sentences, sentence ``i`` being ``sentences[i % len(sentences)]``."""
    once = Counter(chain.from_iterable(map(words, sentences)))
    full, rest = divmod(total, len(sentences))
    out = Counter({w: n * full for w, n in once.items()})
    out.update(chain.from_iterable(map(words, sentences[:rest])))
    return +out


def key_shares(sentences: Sequence[str], tasks: int = 2) -> list[float]:
    """The share of all words fields grouping gives each of ``tasks`` count tasks."""
    share = [0] * tasks
    for w, n in truth_of(sentences, len(sentences)).items():
        share[fields_task_index([w], tasks)] += n
    return [x / sum(share) for x in share]


def worker_spec(variant: str, sentences: int, path: str = "", per_file: int = len(DEFAULT_SENTENCES),
                out: str = "out") -> str:
    """The YAML the workers bench runs (see the module docstring); ``path``: a file of
    ``per_file`` sentences to read instead of the example's; ``out``: the directory the
    counts are written to (a JSON-lines file per count task, read by ``read_topo_counts``)."""
    batch = variant == "batch"
    source = f"path: {json.dumps(path)}, " if path else ""
    counts = json.dumps(str(Path(out) / "counts-{task}.jsonl"))
    return f"""name: wc-workers
config:
  backpressure.policy: none
  max_spout_pending: 5000
spouts:
  - id: sentences
    class: topo.examples.wordcount.SentenceSpout
    kwargs: {{{source}repeat: {sentences // per_file}, batch: {1000 if batch else 1}}}
    parallelism: 2
bolts:
  - id: split
    class: topo.examples.wordcount.{"BatchSplitBolt" if batch else "SplitBolt"}
    parallelism: 2
  - id: count
    class: topo.examples.wordcount.{"BatchFinalCountBolt" if batch else "FinalCountBolt"}
    parallelism: 2
  - id: counts
    class: topo.sinks.JsonLinesSink
    kwargs: {{path: {counts}, fields: [word, count]}}
    parallelism: 2
streams:
  - {{from: sentences, to: split, grouping: {{type: local_or_shuffle}}}}
  - {{from: split, to: count, grouping: {{type: fields, fields: [word]}}}}
  - {{from: count, to: counts, grouping: {{type: local_or_shuffle}}}}
"""


def merge_counts(pairs: Iterable[tuple[str, int]]) -> dict[str, int]:
    """Final ``(word, count)`` pairs from several tasks or workers, as one dict; a word's
    final count comes from one place, so a word seen twice is an error."""
    total: dict[str, int] = {}
    for w, n in pairs:
        if w in total:
            raise AssertionError(f"{w!r} counted twice")
        total[w] = n
    return total


def read_topo_counts(out: str) -> dict[str, int]:
    """The final counts the workers bench's sink tasks wrote (a word's count in one line)."""
    rows = (json.loads(line) for p in Path(out).glob("counts-*.jsonl")
            for line in p.read_text(encoding="utf-8").splitlines())
    return merge_counts((r["word"], r["count"]) for r in rows)


WORKER_VARIANTS = ("per_tuple", "batch")
WORKER_MODES = {"off": ["acking=false"], "on": ["acking=true"],
                "on_batch_granularity": ["acking=true", "acking.granularity=batch"]}


def _bytewax_installed() -> bool:
    try:
        import bytewax  # noqa: F401
    except ImportError:
        return False
    return True


def measure_workers(sentences: int = WORKER_SENTENCES, rounds: int = WORKER_ROUNDS,
                    modes: Sequence[str] = tuple(WORKER_MODES),
                    inputs: Sequence[str] = DEFAULT_WORKER_INPUTS,
                    variants: Sequence[str] = WORKER_VARIANTS) -> dict[str, Any]:
    """Wall seconds of ``topo run --workers N`` per (input, variant, acking mode, N) and of
    the same word count in Bytewax at 1 and 2 processes (``-p 1``, ``-p 2`` and ``-w 2``;
    final counts checked), medians, speed-ups and topo against Bytewax at the same number
    of processes; ``modes``: which of ``WORKER_MODES``; ``inputs``: which of ``WORKER_INPUTS``.
    Keys of the example input have no prefix, those of another input its name first."""
    times: dict[str, list[float]] = {}
    speeds: dict[str, list[float]] = {}      # ``machine_speed`` around each run (the slower reading)
    # Bytecode caching on, as in a usual install: with it off every worker compiles its modules.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    root = str(Path(__file__).resolve().parents[1])      # bench.bytewax_wordcount, from any cwd
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
    bytewax = _bytewax_installed()
    totals: dict[str, int] = {}
    with tempfile.TemporaryDirectory() as d:
        made = {source: sentences_for(source, Path(d)) for source in WORKER_INPUTS}
        shares = {source: key_shares(sents) for source, (_, sents) in made.items()}   # every input's, run or not
        out = str(Path(d) / "out")           # where every run writes its final counts
        runs: list[tuple[str, list[str], Counter[str], Callable[[str], dict[str, int]]]] = []
        for source in inputs:
            path, sents = made[source]
            prefix = "" if source == "example" else f"{source}_"
            for v, wanted in (("per_tuple", sentences), ("batch", sentences * BATCH_INPUT_FACTOR)):
                if v not in variants:
                    continue
                total = wanted // len(sents) * len(sents)
                totals[f"{prefix}{v}"] = total
                spec = Path(d) / f"{prefix}{v}.yaml"
                spec.write_text(worker_spec(v, total, path, len(sents), out))
                truth = truth_of(sents, total)
                for mode in modes:
                    for w in (1, 2):
                        cmd = [sys.executable, "-m", "topo.cli", "run", str(spec), "--quiet", "--workers", str(w)]
                        for setting in WORKER_MODES[mode]:
                            cmd += ["--config", setting]
                        runs.append((f"{prefix}{v}_acking_{mode}_workers_{w}", cmd, truth, read_topo_counts))
                if bytewax:
                    from bench.bytewax_wordcount import read_counts
                    flow = f"bench.bytewax_wordcount:flow({v!r}, {total}, {path!r}, {out!r})"
                    for name, flags in BYTEWAX_PROCESSES.items():
                        runs.append((f"{prefix}bytewax_{v}_{name}",
                                     [sys.executable, "-m", "bytewax.testing", flow, *flags], truth, read_counts))
        for i in range(rounds):
            for key, cmd, truth, read in (runs if i % 2 == 0 else runs[::-1]):
                before = machine_speed()
                times.setdefault(key, []).append(_timed_run(cmd, out, env, truth, read))
                speeds.setdefault(key, []).append(max(before, machine_speed()))
    med = {k: statistics.median(v) for k, v in times.items()}
    speedup = speedups(med)
    # The same ratio taken within each round (its 1- and 2-worker runs follow each other), then
    # the median over rounds: a slow phase of the machine then slows both sides of a ratio.
    paired = {k.replace("_workers_1", ""): statistics.median(
                  a / b for a, b in zip(times[k], times[k.replace("_workers_1", "_workers_2")]))
              for k in med if k.endswith("_workers_1")}
    # Fastest over fastest: each side's least disturbed run (what timeit reports). Two workers
    # need both cores free at once, so others' load on a shared machine costs them more often.
    best = {k.replace("_workers_1", ""): min(times[k]) / min(times[k.replace("_workers_1", "_workers_2")])
            for k in med if k.endswith("_workers_1")}
    bytewax_at, bytewax_speedup, vs_bytewax = versus_bytewax(med)
    return {"sentences": totals, "inputs": list(inputs), "key_shares_2_tasks": shares, "rounds": rounds,
            "seconds": times, "median_seconds": med, "speedup_2_vs_1": speedup,
            "speedup_2_vs_1_paired": paired, "speedup_2_vs_1_fastest": best,
            "bytewax_seconds_at": bytewax_at, "bytewax_speedup_2_vs_1": bytewax_speedup,
            "topo_vs_bytewax_same_processes": vs_bytewax, "machine_speed_s": speeds,
            "quiet": quiet_runs(times, speeds)}


def speedups(med: dict[str, float]) -> dict[str, float]:
    """2 workers against 1 from medians (one worker's time over two workers'), for every
    side ``med`` has both the ``_workers_1`` and the ``_workers_2`` median of."""
    return {k[:-len("_workers_1")]: med[k] / med[k[:-1] + "2"]
            for k in med if k.endswith("_workers_1") and k[:-1] + "2" in med}


def versus_bytewax(med: dict[str, float]) -> tuple[dict[str, float], dict[str, float], dict[str, float]]:
    """From medians: Bytewax's time at 1 and 2 processes (at 2 the faster of ``-p 2`` and
    ``-w 2``), its speed-up, and topo against it at the same number of processes (Bytewax's
    time over topo's), for every input, variant and acking mode ``med`` has both sides of."""
    at_n: dict[str, float] = {}
    speedup: dict[str, float] = {}
    versus: dict[str, float] = {}
    for p1 in [k for k in med if "bytewax_" in k and k.endswith("_p1")]:
        bx = p1[:-len("_p1")]                       # "<prefix>bytewax_<variant>"
        twos = [med[k] for k in (f"{bx}_p2", f"{bx}_w2") if k in med]
        if not twos:
            continue
        at = {1: med[p1], 2: min(twos)}
        at_n[f"{bx}_1"], at_n[f"{bx}_2"] = at[1], at[2]
        speedup[bx] = at[1] / at[2]
        topo = bx.replace("bytewax_", "") + "_acking_"
        for key in med:
            if key.startswith(topo) and key[-10:-1] == "_workers_":
                versus[key] = at[int(key[-1])] / med[key]
    return at_n, speedup, versus


CANARY = "import time; t = time.perf_counter(); sum(range(12_000_000)); print(time.perf_counter() - t)"
QUIET_FACTOR = 1.2      # a run is quiet when the machine ran within 20% of its fast readings


def machine_speed(cores: int = 2) -> float:
    """Seconds of the slowest of ``cores`` copies of one fixed pure-Python loop run at once,
    each timed inside its own process (start-up left out): how fast the machine runs, just
    now, for work that needs every core. On a shared machine others' load slows it for
    minutes at a time, and a run that needs both cores then loses more than one that needs one."""
    procs = [subprocess.Popen([sys.executable, "-c", CANARY], stdout=subprocess.PIPE, text=True)
             for _ in range(cores)]
    return max(float(p.communicate()[0]) for p in procs)


def quiet_runs(times: dict[str, list[float]], speeds: dict[str, list[float]],
               factor: float = QUIET_FACTOR) -> dict[str, Any]:
    """The figures again over the quiet runs only: those whose ``machine_speed`` reading (the
    slower of the one before and the one after) lay within ``factor`` of the bench's fast
    readings (its 10th percentile: not the single fastest, which luck can set). The reading
    moves by some 15% on an idle machine; in the disturbed phases of this machine it rose by
    25-30% and the runs slowed by as much. Every side is filtered by the same rule; a side
    with no quiet run has no median, and a ratio needs both of its sides."""
    if not speeds:
        return {}
    readings = sorted(x for v in speeds.values() for x in v)
    threshold = factor * readings[len(readings) // 10]
    kept = {k: [t for t, sp in zip(times[k], speeds[k]) if sp <= threshold] for k in times}
    med = {k: statistics.median(v) for k, v in kept.items() if v}
    _, bytewax_speedup, vs_bytewax = versus_bytewax(med)
    return {"factor": factor, "threshold_s": threshold, "runs": {k: len(v) for k, v in kept.items()},
            "median_seconds": med, "speedup_2_vs_1": speedups(med), "bytewax_speedup_2_vs_1": bytewax_speedup,
            "topo_vs_bytewax_same_processes": vs_bytewax}


def _timed_run(cmd: list[str], out: str, env: dict[str, str], truth: Counter[str],
               read: Callable[[str], dict[str, int]]) -> float:
    """Wall seconds of ``cmd`` (process start included), run in the emptied directory ``out``;
    the final counts it wrote there, as ``read`` gives them (``read_topo_counts`` for topo's
    sink tasks, ``bench.bytewax_wordcount.read_counts`` for Bytewax's workers), must equal
    ``truth``."""
    shutil.rmtree(out, ignore_errors=True)
    Path(out).mkdir(parents=True)
    t0 = time.perf_counter()
    done = subprocess.run(cmd, cwd=out, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, text=True)
    elapsed = time.perf_counter() - t0
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {done.returncode}: {done.stderr.strip()[-2000:]}")
    if Counter(read(out)) != truth:
        raise AssertionError(f"{' '.join(cmd)}: wrong counts")
    return elapsed


def widest_from_median(runs: dict[str, list[float]]) -> dict[str, float]:
    """Per side, how far its farthest run lies from its median (a fraction of the median)."""
    out = {}
    for k, v in runs.items():
        if v:
            m = statistics.median(v)
            out[k] = max(abs(x - m) for x in v) / m
    return out


def _names(p: argparse.ArgumentParser, flag: str, given: str | None, known: Collection[str],
           default: Iterable[str]) -> list[str]:
    """The comma-separated names ``flag`` was given (``default`` without it); a name not in
    ``known`` is a one-line error."""
    if given is None:
        return list(default)
    names = given.split(",")
    unknown = [m for m in names if m not in known]
    if unknown:
        p.error(f"{flag}: unknown {unknown} (known: {', '.join(known)})")
    return names


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.wordcount", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true",
                   help="a short run: fewer sentences, 2 repeats, one round of the workers bench")
    p.add_argument("--worker-modes", metavar="MODE,...",
                   help=f"acking modes of the workers bench (of {', '.join(WORKER_MODES)}; default all); "
                   "off,on_batch_granularity is a shorter run (acking on at tuple granularity is the "
                   "slowest pair of cells, and one process measures what it costs)")
    p.add_argument("--worker-inputs", metavar="INPUT,...",
                   help=f"inputs of the workers bench (of {', '.join(WORKER_INPUTS)}; "
                   f"default {','.join(DEFAULT_WORKER_INPUTS)})")
    p.add_argument("--worker-variants", metavar="VARIANT,...",
                   help=f"variants of the workers bench (of {', '.join(WORKER_VARIANTS)}; default all)")
    p.add_argument("--worker-rounds", default=str(WORKER_ROUNDS), metavar="N",
                   help=f"interleaved rounds of the workers bench ({WORKER_ROUNDS}; 1 with --quick)")
    a = p.parse_args(list(argv or []))  # None: the defaults (python -m bench passes nothing)
    a.worker_modes = _names(p, "--worker-modes", a.worker_modes, WORKER_MODES, WORKER_MODES)
    a.worker_inputs = _names(p, "--worker-inputs", a.worker_inputs, WORKER_INPUTS, DEFAULT_WORKER_INPUTS)
    a.worker_variants = _names(p, "--worker-variants", a.worker_variants, WORKER_VARIANTS, WORKER_VARIANTS)
    if not a.worker_rounds.isdigit() or int(a.worker_rounds) < 1:
        p.error(f"--worker-rounds: a whole number >= 1, got {a.worker_rounds!r}")
    a.worker_rounds = int(a.worker_rounds)
    return a


def main(argv: Sequence[str] | None = None) -> None:
    a = parse_args(argv)
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    load_start = os.getloadavg()
    out = measure(n=50_000, repeats=2) if a.quick else measure()
    out["spread"] = widest_from_median(out["words_per_s"])
    out["workers"] = (measure_workers(60_000, 1, a.worker_modes, a.worker_inputs, a.worker_variants) if a.quick
                      else measure_workers(rounds=a.worker_rounds, modes=a.worker_modes, inputs=a.worker_inputs,
                                           variants=a.worker_variants))
    out["workers"]["spread"] = widest_from_median(out["workers"]["seconds"])
    out["run"] = {"commit": environment.commit() or "unknown", "started": started,
                  "ended": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
                  "load_average_1min_start": load_start[0], "load_average_1min_end": os.getloadavg()[0]}
    RESULTS.mkdir(exist_ok=True)
    out = stamp(out, "wordcount")
    (RESULTS / "wordcount.json").write_text(json.dumps(out, indent=2) + "\n")
    for k, v in out["median_words_per_s"].items():
        print(f"{k:32s} {v:12,.0f} words/s")
    for k, r in out["ratios"].items():
        print(f"{k}: {r:.2f}")
    for k, v in out["workers"]["median_seconds"].items():
        print(f"{k:36s} {v:6.2f} s")
    for k, r in out["workers"]["speedup_2_vs_1"].items():
        print(f"2 workers vs 1, {k}: {r:.2f}x (median of the rounds' own ratios "
              f"{out['workers']['speedup_2_vs_1_paired'][k]:.2f}x, fastest over fastest "
              f"{out['workers']['speedup_2_vs_1_fastest'][k]:.2f}x)")
    for k, r in out["workers"]["bytewax_speedup_2_vs_1"].items():
        print(f"2 processes vs 1, {k}: {r:.2f}x")
    for k, r in out["workers"]["topo_vs_bytewax_same_processes"].items():
        print(f"topo vs Bytewax at the same processes, {k}: {r:.2f}x")
    quiet = out["workers"]["quiet"]
    if quiet:
        print(f"quiet runs (machine within {quiet['factor']:.2f}x of its 10th-percentile reading, "
              f"{quiet['threshold_s']:.3f} s): " + ", ".join(f"{k} {n}" for k, n in quiet["runs"].items()))
        for k, r in quiet["speedup_2_vs_1"].items():
            print(f"2 workers vs 1 over quiet runs, {k}: {r:.2f}x")
    print("fields grouping's share of words per count task (2 tasks):",
          {k: [round(x, 3) for x in v] for k, v in out["workers"]["key_shares_2_tasks"].items()})


if __name__ == "__main__":
    main(sys.argv[1:])
