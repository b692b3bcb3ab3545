"""Rows a micro-batch read, from Spark's progress reports (``StreamingQueryProgress`` as dicts).

Spark's ``numInputRows`` counts the rows its source operator put out. A topo source
whose reader runs chained bolts (``runtime.spark.plan.chains``) puts out the last
bolt's rows, so the rows a batch *read* are taken from each source's offsets instead:
the offset sources count records per partition, and end less start is what was read.
"""
from __future__ import annotations

import json
from typing import Any, Mapping


def offsets_of(value: Any) -> dict[str, int] | None:
    """A progress ``startOffset`` / ``endOffset`` as ``{partition: offset}`` (None when it
    is not one of the offset sources' per-partition maps)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    if not isinstance(value, dict):
        return None
    try:
        return {str(k): int(v) for k, v in value.items()}
    except (TypeError, ValueError):
        return None


def source_rows(src: Mapping[str, Any]) -> int:
    """Records one progress ``sources[i]`` entry read: its end offsets less its start
    (none before the first batch), so a reader that runs chained bolts (whose rows Spark
    counts in ``numInputRows``) is counted by what it read; Spark's count otherwise."""
    end = offsets_of(src.get("endOffset"))
    if end is None:
        return int(src.get("numInputRows") or 0)
    start = offsets_of(src.get("startOffset")) or {}
    return sum(max(0, o - start.get(p, 0)) for p, o in end.items())


def progress_rows(progress: Mapping[str, Any]) -> int:
    """Records a batch read from all its sources (``source_rows``)."""
    sources = progress.get("sources")
    if not sources:
        return int(progress.get("numInputRows") or 0)
    return sum(source_rows(src) for src in sources)
