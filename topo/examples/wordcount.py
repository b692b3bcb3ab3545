"""Word count, the hello-world of stream processing.

sentences (spout) -> split (shuffle) -> count (fields grouping on ``word``) -> sink
(SQLite upsert of running totals). With a fixed input and ``repeat`` the final
counts are exact, which the tests and the Spark engine's comparison rely on.
"""
from __future__ import annotations

import argparse
import random
import re
from collections import Counter
from pathlib import Path
from typing import Sequence

from topo.api import Bolt, EndOfStream, Spout, Tuple

DEFAULT_SENTENCES = (
    "the cow jumped over the moon",
    "an apple a day keeps the doctor away",
    "four score and seven years ago",
    "snow white and the seven dwarfs",
    "i am at two with nature",
)

_WORD = re.compile(r"[a-z0-9']+")


class SentenceSpout(Spout):
    """Emits each sentence ``repeat`` times (0 = forever), tracked by its sequence number."""

    outputs = ["sentence"]

    def __init__(self, sentences: Sequence[str] = DEFAULT_SENTENCES, repeat: int = 1000,
                 path: str | None = None, shuffle_seed: int | None = None) -> None:
        self.sentences = list(Path(path).read_text(encoding="utf-8").splitlines() if path else sentences)
        if shuffle_seed is not None:
            random.Random(shuffle_seed).shuffle(self.sentences)
        self.repeat = repeat
        self.seq = 0

    def next_tuple(self) -> None:
        total = len(self.sentences) * self.repeat
        # Tasks of a parallel spout split the sequence between them.
        step = self.context.parallelism
        i = self.seq * step + self.context.task_index
        if self.repeat and i >= total:
            raise EndOfStream
        self.collector.emit([self.sentences[i % len(self.sentences)]], msg_id=i)
        self.seq += 1


class SplitBolt(Bolt):
    outputs = ["word"]

    def execute(self, tup: Tuple) -> None:
        for word in _WORD.findall(tup[0].lower()):
            self.collector.emit([word])


class CountBolt(Bolt):
    """Running count per word; emits ``(word, count)`` after each update."""

    outputs = ["word", "count"]

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    def execute(self, tup: Tuple) -> None:
        word = tup["word"]
        self.counts[word] += 1
        self.collector.emit([word, self.counts[word]])


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
