"""The live console ``topo run`` shows while a topology works (a local-engine ``Service``).

Every second it reads ``engine.stats`` through ``TaskStats.snapshot()`` (the same
records ``topo status`` and the state records carry, so the three never disagree)
and shows per component and task: emit rate against its limit, input queue level as
a bar against the low and high marks, the backpressure flag and step count ``k``,
acked and failed. A bounded run (``--duration``, ``--max-tuples``) gets a progress bar.
A run in worker processes shows every task of every worker (the supervisor's
``WorkersView`` reads them from the workers' reports): each record then carries its
``worker``, shown in a column of its own.

On a terminal this is a ``rich.Live`` table redrawn in place. When stdout is not a
terminal (a pipe, a log file, CI) it prints one plain summary line per second
instead: escape codes and redraws would make a log unreadable. The rendering
functions take snapshot records, not an engine, so they are testable alone and
reusable by anything that has the records.
"""
from __future__ import annotations

import asyncio
import sys
import time
from typing import Any, Iterable, Sequence, TextIO

from rich.console import Console as RichConsole
from rich.console import Group, RenderableType
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

Record = dict[str, Any]

BAR_WIDTH = 16


def _si(n: float) -> str:
    """1234 -> 1.2k: rates and counts stay narrow enough for one row per task."""
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.1f}{unit}"
    return f"{n:.0f}" if float(n).is_integer() or abs(n) >= 10 else f"{n:.1f}"


def _bytes(n: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f}{unit}"
    return f"{n:.0f}B"


def rate_text(record: Record) -> Text:
    """``limit / emitted / processed`` per second; the limit reads ``-`` when the limiter is off,
    processed reads ``-`` for a spout (it executes nothing)."""
    limit = record.get("rate")
    text = Text("-" if limit is None else f"{_si(limit)}/s", style="dim" if limit is None else "yellow")
    text.append(f" / {_si(record.get('observed_rate') or 0.0)}/s")
    text.append(" / -" if record.get("spout") else f" / {_si(record.get('processed_rate') or 0.0)}/s")
    return text


def over_high_mark(record: Record) -> bool:
    """A bolt task whose queue is at or over its high mark: a bottleneck right now."""
    return not record.get("spout") and bool(record.get("high_mark")) and \
        record.get("queue_bytes", 0) >= record["high_mark"]


def throttled_by(record: Record, by_task: dict[Any, Record]) -> list[Record]:
    """The tasks an overloaded task is holding down: its direct upstreams under a limit
    (stepwise), or else the spouts under a limit (source_stop and watermark stop spouts)."""
    ups = [by_task[u] for u in record.get("upstream") or () if u in by_task]
    held = [u for u in ups if u.get("backpressure")]
    if held:
        return held
    return [r for r in by_task.values() if r.get("spout") and r.get("backpressure")]


def queue_bar(record: Record, width: int = BAR_WIDTH) -> Text:
    """The queue's bytes as a bar over the hard bound, with the marks drawn in it.

    ``L`` is the low mark and ``H`` the high mark; the fill is green at or under the
    low mark, yellow between the marks and red at or over the high mark.
    """
    bound = record.get("hard_bound") or 0
    if record.get("spout") or bound <= 0:
        return Text("-", style="dim")
    used, low, high = record.get("queue_bytes", 0), record.get("low_mark", 0), record.get("high_mark", 0)
    fill = min(width, round(width * used / bound))
    style = "red" if used >= high else "green" if used <= low else "yellow"
    marks = {min(width - 1, int(width * low / bound)): "L", min(width - 1, int(width * high / bound)): "H"}
    bar = Text()
    for i in range(width):
        if i < fill:
            bar.append("█", style=style)
        else:
            bar.append(marks.get(i, "·"), style="bold" if i in marks else "dim")
    bar.append(f" {_bytes(used)}")
    return bar


def backpressure_text(record: Record, by_task: dict[Any, Record] | None = None) -> Text:
    """``BP k=..`` for a task being throttled; ``OVER H`` (and whom it throttles) for a
    task whose queue is over its high mark: the bottleneck, which is not itself limited."""
    k = record.get("k", 0)
    if record.get("backpressure"):
        text = Text(f"BP k={k}", style="bold red")
    else:
        text = Text(f"ok k={k}", style="yellow" if k else "green")
    if over_high_mark(record):
        text = Text("OVER H", style="bold red") if not record.get("backpressure") else text + Text(" OVER H")
        held = throttled_by(record, by_task or {})
        if held:
            text.append(" -> " + ", ".join(f"{r['component']}:{r['task']}" for r in held[:3])
                        + (" ..." if len(held) > 3 else ""), style="red")
    return text


def by_component(records: Iterable[Record]) -> dict[str, list[Record]]:
    out: dict[str, list[Record]] = {}
    for r in records:
        out.setdefault(r["component"], []).append(r)
    return out


def _total(records: Sequence[Record]) -> Record:
    """A component row: sums of counters, the fullest queue, the worst backpressure."""
    fullest = max(records, key=lambda r: (r.get("queue_bytes", 0) / (r.get("hard_bound") or 1)))
    limits = [r["rate"] for r in records if r.get("rate") is not None]
    return {
        **fullest,
        "task": f"{len(records)} tasks" if len(records) > 1 else records[0]["task"],
        "observed_rate": sum(r.get("observed_rate") or 0.0 for r in records),
        "processed_rate": sum(r.get("processed_rate") or 0.0 for r in records),
        "upstream": sorted({u for r in records for u in r.get("upstream") or ()}),
        "rate": sum(limits) if limits else None,
        "k": max(r.get("k", 0) for r in records),
        "backpressure": any(r.get("backpressure") for r in records),
        **{c: sum(r.get(c, 0) for r in records) for c in ("emitted", "executed", "acked", "failed")},
    }


COLUMNS = ("component", "task", "rate (limit / emit / processed)", "queue (L low, H high)", "backpressure",
           "emitted", "acked", "failed")


def workers_of(records: Iterable[Record]) -> list[int]:
    """The worker processes the records come from (empty for a single-process run)."""
    return sorted({r["worker"] for r in records if r.get("worker") is not None})


def render_table(records: Sequence[Record], title: str = "") -> Table:
    """One row per component (totals), then one per task when it has several; with worker
    processes a ``worker`` column says where each task runs."""
    table = Table(title=title or None, expand=False, header_style="bold")
    with_workers = bool(workers_of(records))
    for name in COLUMNS + (("worker",) if with_workers else ()):
        table.add_column(name, justify="right" if name in ("emitted", "acked", "failed", "worker") else "left",
                         no_wrap=True)
    by_task = {r["task"]: r for r in records}
    for component, rows in by_component(records).items():
        groups = [(_total(rows), component)] + ([(r, "") for r in rows] if len(rows) > 1 else [])
        for record, label in groups:
            where = (",".join(map(str, workers_of(rows))) if label else str(record.get("worker", "")),)
            table.add_row(label, str(record["task"]), rate_text(record), queue_bar(record),
                          backpressure_text(record, by_task), _si(record.get("emitted", 0)),
                          _si(record.get("acked", 0)),
                          Text(_si(record.get("failed", 0)), style="red" if record.get("failed") else ""),
                          *(where if with_workers else ()), style="bold" if label else "dim")
    return table


def progress(records: Sequence[Record], elapsed: float, duration: float | None,
             max_tuples: int | None) -> tuple[float, str] | None:
    """(fraction done, label) of a bounded run; None when the run is unbounded."""
    if max_tuples:
        sent = sum(r.get("emitted", 0) for r in records if r.get("spout"))
        done = min(1.0, sent / max_tuples)
        if duration:
            done = max(done, min(1.0, elapsed / duration))
        return done, f"{sent:,}/{max_tuples:,} tuples, {elapsed:.0f}s"
    if duration:
        return min(1.0, elapsed / duration), f"{elapsed:.0f}s/{duration:.0f}s"
    return None


def summary_line(records: Sequence[Record], elapsed: float, duration: float | None = None,
                 max_tuples: int | None = None) -> str:
    """The one line a second written when stdout is not a terminal."""
    spouts = [r for r in records if r.get("spout")]
    bolts = [r for r in records if not r.get("spout")]
    rate = sum(r.get("observed_rate") or 0.0 for r in spouts)
    fullest = max(bolts, key=lambda r: r.get("queue_bytes", 0), default=None)
    pressed = [r for r in records if r.get("backpressure")]
    workers = workers_of(records)
    parts = [f"[{elapsed:6.1f}s]" + (f" {len(workers)} workers, {len(records)} tasks" if workers else ""),
             f"spout tuples {sum(r.get('emitted', 0) for r in spouts):,} ({_si(rate)}/s)",
             f"acked {sum(r.get('acked', 0) for r in spouts):,}",
             f"failed {sum(r.get('failed', 0) for r in records):,}"]
    if fullest is not None:
        parts.append(f"fullest queue {fullest['component']}:{fullest['task']} "
                     f"{_bytes(fullest.get('queue_bytes', 0))}/{_bytes(fullest.get('high_mark', 0))}")
    parts.append(f"backpressure {len(pressed)} task(s), max k={max((r.get('k', 0) for r in records), default=0)}")
    over = [r for r in bolts if over_high_mark(r)]
    if over:
        by_task = {r["task"]: r for r in records}
        worst = max(over, key=lambda r: r.get("queue_bytes", 0) / (r.get("high_mark") or 1))
        held = throttled_by(worst, by_task)
        parts.append(f"bottleneck {worst['component']}:{worst['task']} "
                     f"({_si(worst.get('processed_rate') or 0.0)}/s processed)"
                     + (" throttling " + ", ".join(f"{r['component']}:{r['task']}" for r in held[:3])
                        if held else ""))
    bounded = progress(records, elapsed, duration, max_tuples)
    if bounded:
        parts.append(f"{bounded[0]:.0%} done")
    return " | ".join(parts)


class Console:
    """The live view as a ``Service``: ``start`` spawns a refresh loop, ``stop`` ends it
    with a last frame so the final state stays on screen."""

    def __init__(self, *, duration: float | None = None, max_tuples: int | None = None,
                 refresh_s: float = 1.0, out: TextIO | None = None, live: bool | None = None) -> None:
        self.duration = duration
        self.max_tuples = max_tuples
        self.refresh_s = refresh_s
        self.out = out if out is not None else sys.stdout
        self.live = self.out.isatty() if live is None else live
        self._engine: Any = None
        self._task: asyncio.Task[None] | None = None
        self._live: Live | None = None
        self._started = 0.0

    def records(self) -> list[Record]:
        return [s.snapshot() for s in self._engine.stats]

    def render(self) -> RenderableType:
        records = self.records()
        elapsed = time.monotonic() - self._started
        name = records[0]["topology"] if records else self._engine.topology.name
        workers = workers_of(records)
        table = render_table(records, f"topology {name!r}  {elapsed:.0f}s"
                             + (f"  {len(workers)} workers" if workers else ""))
        bounded = progress(records, elapsed, self.duration, self.max_tuples)
        if bounded is None:
            return table
        bar = Table.grid(padding=(0, 1))
        bar.add_row(ProgressBar(total=1.0, completed=bounded[0], width=40), Text(bounded[1]))
        return Group(table, bar)

    async def start(self, engine: Any) -> None:
        self._engine = engine
        self._started = time.monotonic()
        if self.live:
            console = RichConsole(file=self.out, force_terminal=True)
            self._live = Live(self.render(), console=console, auto_refresh=False, transient=False)
            self._live.start(refresh=True)
        self._task = asyncio.create_task(self._loop(), name="console")

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.refresh_s)
            self._frame()

    def _frame(self) -> None:
        if self._live is not None:
            self._live.update(self.render(), refresh=True)
        else:
            records = self.records()
            line = summary_line(records, time.monotonic() - self._started, self.duration, self.max_tuples)
            print(line, file=self.out, flush=True)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        if self._live is not None:
            self._live.update(self.render(), refresh=True)
            self._live.stop()
            self._live = None
