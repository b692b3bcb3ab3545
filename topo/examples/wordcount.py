"""Word count, the hello-world of stream processing.

sentences (spout) -> split (shuffle) -> count (fields grouping on ``word``) -> sink
(SQLite upsert of running totals). The sentences are a deterministic generated
source addressed by sentence index, so ``configs/wordcount.yaml`` runs unchanged on
the local engine and on Spark, and with ``repeat`` the final counts are exact on both.
"""
from __future__ import annotations

import argparse
import random
import re
from collections import Counter
from itertools import chain, repeat
from operator import mod
from pathlib import Path
from typing import Any, Iterator, Sequence

from topo.api import Bolt, Columns, EndOfStream, Repeated, Spout, SpoutOutputCollector, TaskContext, Tuple, column
from topo.sources.base import OffsetSource, check_range
from topo.sources.spouts import OffsetSpout

DEFAULT_SENTENCES = (
    "the cow jumped over the moon",
    "an apple a day keeps the doctor away",
    "four score and seven years ago",
    "snow white and the seven dwarfs",
    "i am at two with nature",
)

_WORD = re.compile(r"[a-z0-9']+")


ENDLESS = 1 << 62   # "always more": where an endless sentence source says each partition ends


class SentenceSource:
    """The sentences as an offset-addressable source (``topo.sources.OffsetSource``).

    Sentence number ``i`` (counting from 0) is ``sentences[i % len(sentences)]``; with
    ``partitions`` P it lives in partition ``i % P`` at offset ``i // P``, so with one
    partition the offset is the sentence index. ``total`` sentences in all, or endless
    (``None``: every partition reports ``ENDLESS`` records, so on Spark keep a rate
    control other than ``none`` or set ``spark.max_rows_per_batch``). Nothing is stored:
    reading a range twice gives the same sentences, on any engine, in any process.
    """

    columns: tuple[str, ...] = ("sentence",)

    def __init__(self, sentences: Sequence[str], total: int | None, partitions: int = 1) -> None:
        if not sentences:
            raise ValueError("no sentences")
        if partitions < 1:
            raise ValueError("partitions must be >= 1")
        self.sentences = tuple(sentences)
        self.total = total
        self.partitions = partitions

    def describe(self) -> str:
        size = "endless" if self.total is None else f"{self.total} sentences"
        return f"sentence source ({size}, {self.partitions} partitions)"

    def num_partitions(self) -> int:
        return self.partitions

    def latest(self) -> dict[int, int]:
        p = self.partitions
        if self.total is None:
            return {q: ENDLESS for q in range(p)}
        return {q: (self.total - q + p - 1) // p for q in range(p)}

    def sentence(self, i: int) -> str:
        return self.sentences[i % len(self.sentences)]

    def read(self, partition: int, start: int, end: int) -> Iterator[tuple[Any, ...]]:
        check_range(partition, start, end, self.partitions)
        end = min(end, self.latest()[partition])
        for offset in range(start, end):
            yield (self.sentence(offset * self.partitions + partition),)

    def close(self) -> None:
        return None


class SentenceSpout(OffsetSpout):
    """Emits each sentence ``repeat`` times (0 = forever), tracked by its sentence index.

    Runs unchanged on both engines. On the local engine task ``k`` of ``n`` emits the
    sentences ``i = k, k + n, k + 2n, ...`` (partition ``k`` of an ``n``-partition
    ``SentenceSource``) with ``msg_id = i``, ``batch`` of them per ``next_tuple`` (with
    more than one, in one ``emit_many``: a source that reads in batches); on Spark the engine reads the one-partition
    source by offset (offset = sentence index) and pre-shards it over the cores.
    """

    def __init__(self, sentences: Sequence[str] = DEFAULT_SENTENCES, repeat: int = 1000,
                 path: str | None = None, shuffle_seed: int | None = None, batch: int = 1) -> None:
        super().__init__(columns=SentenceSource.columns, fields=None, batch=batch)
        self.sentences = list(Path(path).read_text(encoding="utf-8").splitlines() if path else sentences)
        if shuffle_seed is not None:
            random.Random(shuffle_seed).shuffle(self.sentences)
        if repeat < 0:
            raise ValueError(f"repeat must be >= 0 (0 = forever), got {repeat!r}")
        self.repeat = repeat
        self.seq = 0

    def source(self, partitions: int = 1) -> SentenceSource:
        return SentenceSource(self.sentences, len(self.sentences) * self.repeat if self.repeat else None, partitions)

    def bound(self, source: OffsetSource) -> dict[int, int] | None:
        return None if self.repeat == 0 else source.latest()

    def open(self, context: TaskContext, collector: SpoutOutputCollector) -> None:
        Spout.open(self, context, collector)
        self._source = self.source(partitions=context.parallelism)
        self._end = self._source.latest()[context.task_index]

    def next_tuple(self) -> None:
        offset = self.seq
        if offset >= self._end:
            raise EndOfStream
        p, k = self.context.parallelism, self.context.task_index
        if self.batch == 1:
            i = offset * p + k
            self.collector.emit([self._source.sentence(i)], msg_id=i)
            self.seq += 1
            return
        end = min(self._end, offset + self.batch)
        ids = range(offset * p + k, end * p + k, p)
        sentences = self._source.sentences       # sentence i is sentences[i % n] (C-level maps)
        picked = map(sentences.__getitem__, map(mod, ids, repeat(len(sentences))))
        self.collector.emit_many(Columns(list(picked)), msg_ids=ids)     # the "sentence" column
        self.seq = end

    def snapshot_state(self) -> dict[str, int]:
        return {"seq": self.seq}      # the next offset of this task's partition

    def restore_state(self, state: dict[str, int]) -> None:
        self.seq = int(state["seq"])


class SplitBolt(Bolt):
    outputs = ["word"]

    def execute(self, tup: Tuple) -> None:
        for word in _WORD.findall(tup.values[0].lower()):
            self.collector.emit([word])


class BatchSplitBolt(SplitBolt):
    """``SplitBolt`` a batch at a time: the words of all its sentences in one ``emit_many``,
    each word anchored to its sentence."""

    def execute_batch(self, tuples: Sequence[Tuple]) -> None:
        # C-level maps, no Python loop per sentence: each sentence's words, then each
        # word's parent (its sentence, standing for as many words as it has)
        per_sentence = list(map(_WORD.findall, map(str.lower, column(tuples, "sentence"))))
        words = list(chain.from_iterable(per_sentence))
        parents = Repeated(tuples, map(len, per_sentence))      # each sentence once, with its word count
        self.collector.emit_many(Columns(words), anchor_each=parents)       # the "word" column


class CountBolt(Bolt):
    """Running count per word; emits ``(word, count)`` after each update."""

    outputs = ["word", "count"]

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    def execute(self, tup: Tuple) -> None:
        word = tup["word"]
        self.counts[word] += 1
        self.collector.emit([word, self.counts[word]])

    def snapshot_state(self) -> dict[str, int]:
        return dict(self.counts)

    def restore_state(self, state: dict[str, int]) -> None:
        self.counts = Counter(state)


class FinalCountBolt(Bolt):
    """Count per word, emitted once per word when the input ends (``end_of_input``; Bytewax's
    ``count_final``): for a bounded input, where the running counts are not wanted."""

    outputs = ["word", "count"]

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    def execute(self, tup: Tuple) -> None:
        self.counts[tup.values[0]] += 1

    def end_of_input(self) -> None:
        for word, n in self.counts.items():
            self.collector.emit([word, n])

    def snapshot_state(self) -> dict[str, int]:
        return dict(self.counts)

    def restore_state(self, state: dict[str, int]) -> None:
        self.counts = Counter(state)


class BatchFinalCountBolt(FinalCountBolt):
    """``FinalCountBolt`` a batch at a time: one ``Counter.update`` per batch, of the batch's
    ``word`` column (no tuple objects made)."""

    def execute_batch(self, tuples: Sequence[Tuple]) -> None:
        self.counts.update(column(tuples, "word"))


def expected_counts(sentences: Sequence[str] = DEFAULT_SENTENCES, repeat: int = 1000) -> Counter[str]:
    """What a correct run over this input must produce, computed without a topology."""
    c: Counter[str] = Counter()
    for s in sentences:
        c.update(_WORD.findall(s.lower()))
    return Counter({w: n * repeat for w, n in c.items()})


def main(argv: Sequence[str] | None = None) -> int:
    """Print the counts a run left in the sink's database, most frequent first."""
    from topo.sinks import read_table

    p = argparse.ArgumentParser(description="show word counts from a word-count run")
    p.add_argument("db", nargs="?", default="wordcount.db")
    p.add_argument("--top", type=int, default=20)
    a = p.parse_args(argv)
    if not Path(a.db).exists():
        print(f"{a.db}: no such database (run the topology first)")
        return 1
    rows = sorted(read_table(a.db, "word_counts"), key=lambda r: (-r[1], r[0]))
    print(f"{len(rows)} words in {a.db}; top {min(a.top, len(rows))}:")
    for word, count in rows[: a.top]:
        print(f"  {word:<12} {count}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
