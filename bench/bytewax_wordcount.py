"""The word count as a Bytewax 0.21 dataflow that runs in several processes, for the
workers bench (``bench/wordcount.py``): ``python -m bytewax.testing
'bench.bytewax_wordcount:flow("per_tuple", 400000, "", "/out")' -p 2``.

The input is split as topo's ``SentenceSpout`` x P splits it: ``PARTITIONS`` source
partitions, partition ``k`` reading sentences ``k, k + P, ...``, 1,000 per batch (as the
one-process bench's ``TestingSource``), so each process reads its share. ``flat_map`` (per
tuple) or ``flat_map_batch`` (batch) splits, ``count_final`` counts (keyed, so a word's
count lives in one worker and the words cross processes as topo's fields grouping sends
them), and every worker writes its final counts to ``<out>/worker-<i>.json``, which the
bench sums and checks against the truth.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, List

import bytewax.operators as op
from bytewax.dataflow import Dataflow
from bytewax.inputs import FixedPartitionedSource, StatefulSourcePartition
from bytewax.outputs import DynamicSink, StatelessSinkPartition

from bench.wordcount import merge_counts, words, words_of_batch
from topo.examples.wordcount import SentenceSource, SentenceSpout

PARTITIONS = 2          # as topo's spout x2 in the workers bench
BATCH = 1000


class _Part(StatefulSourcePartition[str, int]):
    """Partition ``k`` of the ``SentenceSource`` (sentences ``k, k + P, ...``), ``BATCH`` per
    ``next_batch``."""

    def __init__(self, source: SentenceSource, k: int, resume: int | None) -> None:
        self.sentences, self.k = source.sentences, k
        self.seq = resume or 0
        self.end = source.latest()[k]

    def next_batch(self) -> List[str]:
        if self.seq >= self.end:
            raise StopIteration
        stop = min(self.end, self.seq + BATCH)
        n = len(self.sentences)
        out = [self.sentences[(i * PARTITIONS + self.k) % n] for i in range(self.seq, stop)]
        self.seq = stop
        return out

    def snapshot(self) -> int:
        return self.seq


class _Sentences(FixedPartitionedSource[str, int]):
    def __init__(self, sentences: list[str], total: int) -> None:
        self.source = SentenceSource(sentences, total, PARTITIONS)

    def list_parts(self) -> List[str]:
        return [str(k) for k in range(PARTITIONS)]

    def build_part(self, step_id: str, for_part: str, resume_state: int | None) -> _Part:
        return _Part(self.source, int(for_part), resume_state)


class _CountsFile(StatelessSinkPartition[Any]):
    def __init__(self, path: Path) -> None:
        self.path, self.counts = path, {}

    def write_batch(self, items: List[Any]) -> None:
        self.counts.update(items)

    def close(self) -> None:
        self.path.write_text(json.dumps(self.counts))


class _CountsDir(DynamicSink[Any]):
    def __init__(self, out: str) -> None:
        self.out = Path(out)

    def build(self, step_id: str, worker_index: int, worker_count: int) -> _CountsFile:
        return _CountsFile(self.out / f"worker-{worker_index}.json")


def flow(variant: str, total: int, path: str, out: str) -> Dataflow:
    """The dataflow: ``variant`` "per_tuple" (``flat_map``) or "batch" (``flat_map_batch``)."""
    f = Dataflow("wordcount")
    src = op.input("in", f, _Sentences(SentenceSpout(path=path or None).sentences, total))   # read as topo's spout reads them
    ws = op.flat_map_batch("split", src, words_of_batch) if variant == "batch" else op.flat_map("split", src, words)
    op.output("out", op.count_final("count", ws, lambda w: w), _CountsDir(out))
    return f


def read_counts(out: str) -> dict[str, int]:
    """The final counts every worker wrote (a word's count lives in one worker)."""
    return merge_counts(pair for p in Path(out).glob("worker-*.json") for pair in json.loads(p.read_text()).items())
