"""Consistent checkpoints of a running topology (``checkpoint.interval_ms``).

Why a drained cut, not barriers in the queues
---------------------------------------------
Flink aligns barriers per input *channel*: a task that has the barrier from one
channel blocks that channel until every other channel's barrier arrives. Here a bolt
task has one byte-bounded queue shared by all its upstream tasks, so a channel cannot
be blocked without either buffering its tuples beside the queue (memory outside the
byte bound) or leaving them in the queue (where they can fill it and keep the other
channels' barriers out: a deadlock). In one process there is a simpler cut with the
same meaning, the degenerate case of Chandy-Lamport in which every channel is empty:

1. the spouts stop pulling at their next call boundary (``RunState.paused``); what they
   already emitted keeps flowing, acks keep arriving;
2. when every queue and outbox is empty, every bolt idle and (with acking) no tuple
   tree in flight, each stateful task's ``snapshot_state`` is taken and packed: spout
   offsets and bolt state describe the same point of the stream;
3. the spouts resume at once; the packed states are written to the store on a worker
   thread (SQLite, one transaction), off the event loop;
4. once the write committed, every component is told ``checkpoint_complete(id)``: a
   sink commits the output it sealed for that checkpoint, once per id.

Across worker processes (``workers: N``) the cut is the same, made global by the
supervisor (``runtime.local.workers``): it tells every worker to ``pause``, waits until
every worker's spouts hold, every worker is quiescent and the batches sent between
workers equal those received (twice, with the same totals), then asks each worker for
its ``snapshot``, and only once it has every worker's tells them all to ``resume`` (a
worker that went on at once would feed another's bolts before that one's snapshot);
then it writes the checkpoint itself (one writer) and tells every worker it is
``complete``. Such a checkpointer is *driven*
(``interval_s`` None): it takes no checkpoint of its own.

What bounds a checkpoint's duration is step 2: the data in flight when the spouts
paused must be processed, at most every queue's hard bound at the bottleneck's rate,
the same bound an aligned barrier waiting behind a full queue has. The bottleneck
stays busy through it (it is working off its backlog), so under backpressure a
checkpoint costs the slow stage nothing; with idle queues it takes milliseconds. A
checkpoint that has not drained within ``checkpoint.timeout_s`` is abandoned and the
next interval tries again.
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import msgpack

from topo.api import CheckpointError, Component
from runtime.local.checkpoint_store import Checkpoint, CheckpointStore, fingerprint_difference
from runtime.local.tasks import BoltTask, RunState, SpoutTask

log = logging.getLogger("topo.checkpoint")

_DRAIN_POLL_S = 0.002


@dataclass
class CheckpointStats:
    completed: int = 0
    abandoned: int = 0
    last_id: int = 0
    durations_s: list[float] = field(default_factory=list)   # pause -> resume, per checkpoint
    snapshot_s: list[float] = field(default_factory=list)    # of which packing the states (on the loop)
    write_s: list[float] = field(default_factory=list)       # store write, off the loop


def topology_fingerprint(components: Sequence[tuple[str, str, Component, int]]) -> dict[str, Any]:
    """(id, kind, instance, parallelism) per component -> what a checkpoint must match."""
    return {cid: {"kind": kind, "class": f"{type(inst).__module__}.{type(inst).__qualname__}",
                  "parallelism": parallelism, "stateful": type(inst).has_state()}
            for cid, kind, inst, parallelism in components}


class Checkpointer:
    """Takes checkpoints of one engine's tasks and restores them at start."""

    def __init__(self, store: CheckpointStore, fingerprint: dict[str, Any], run: RunState,
                 spouts: Sequence[SpoutTask], bolts: Sequence[BoltTask], quiescent: Callable[[], bool], *,
                 interval_s: float | None, timeout_s: float) -> None:
        self.store = store
        self.fingerprint = fingerprint
        self.run = run
        self.spouts = list(spouts)
        self.bolts = list(bolts)
        self.quiescent = quiescent
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.stats = CheckpointStats()
        self._writing: asyncio.Future[None] | None = None

    # -- start: restore ----------------------------------------------------------------------

    def restore(self) -> Checkpoint | None:
        """Give every task its state from the newest intact checkpoint (after open/prepare)."""
        cp = self.store.latest()
        if cp is None:
            return None
        diff = fingerprint_difference(cp.fingerprint, self.fingerprint)
        if diff:
            raise CheckpointError(f"checkpoint {cp.id} in {self.store.path} is of a different topology: {diff} "
                                  f"(topo run --from-scratch discards it)")
        for t in self._tasks():
            packed = cp.states.get(t.component, {}).get(t.context.task_index)
            if packed is not None:
                t.instance.restore_state(msgpack.unpackb(packed, raw=False, strict_map_key=False))
        self._complete(cp.id)
        self.stats.last_id = cp.id
        log.info("resumed from checkpoint %d (%s)", cp.id, time.strftime("%Y-%m-%d %H:%M:%S",
                                                                       time.localtime(cp.taken_at)))
        return cp

    # -- running -----------------------------------------------------------------------------

    @property
    def driven(self) -> bool:
        """Checkpoints are taken when a supervisor says (one worker of several), not here."""
        return self.interval_s is None

    async def loop(self) -> None:
        if self.interval_s is None:
            return
        while True:
            await asyncio.sleep(self.interval_s)
            if self.run.stopping:
                return
            await self.take()

    async def take(self, final: bool = False) -> bool:
        """One checkpoint: pause the spouts, drain, snapshot, resume, write, notify.

        ``final``: the run is ending and has drained; the last checkpoint seals its output.
        """
        if self.driven:
            return False         # the supervisor takes every checkpoint, the final one too
        run = self.run
        started = time.monotonic()
        run.holds.add("checkpoint")
        try:
            while not (self._spouts_holding() and self.quiescent()):
                if run.stopping and not final:
                    return False    # the run is ending: its own drain, then the final checkpoint
                if time.monotonic() - started > self.timeout_s:
                    self.stats.abandoned += 1
                    log.warning("checkpoint abandoned: the topology did not drain within %.1f s "
                                "(checkpoint.timeout_s)", self.timeout_s)
                    return False
                await asyncio.sleep(_DRAIN_POLL_S)
            t_snap = time.monotonic()
            states = self.snapshot()
            self.stats.snapshot_s.append(time.monotonic() - t_snap)
        finally:
            run.holds.discard("checkpoint")
            for s in self.spouts:
                s.wake()
        self.stats.durations_s.append(time.monotonic() - started)
        cid = self.store.next_id(self.stats.last_id)
        t0 = time.monotonic()
        # One write at a time on the store's connection: a periodic checkpoint cancelled
        # mid-write (the run is ending) leaves its thread running; the final one waits for it.
        if self._writing is not None:
            await asyncio.gather(asyncio.shield(self._writing), return_exceptions=True)
        self._writing = write = asyncio.ensure_future(
            asyncio.to_thread(self.store.save, cid, self.fingerprint, states))
        try:
            await asyncio.shield(write)
        finally:
            if write.done():
                self._writing = None
        self.stats.write_s.append(time.monotonic() - t0)
        self.stats.last_id = cid
        self.stats.completed += 1
        self._complete(cid)
        return True

    def snapshot(self) -> dict[str, dict[int, bytes]]:
        """Every stateful task's state, packed now (the cut is consistent only this instant)."""
        out: dict[str, dict[int, bytes]] = {}
        for t in self._tasks():
            if type(t.instance).has_state():
                out.setdefault(t.component, {})[t.context.task_index] = msgpack.packb(
                    t.instance.snapshot_state(), use_bin_type=True)
        return out

    async def close(self) -> None:
        """Wait for a write under way, then close the store's connection."""
        if self._writing is not None:
            await asyncio.gather(self._writing, return_exceptions=True)
            self._writing = None
        self.store.close()

    # -- driven by a supervisor (one worker of several) ----------------------------------------

    def pause(self) -> None:
        """Spouts hold at their next call boundary (the global cut is being drained)."""
        self.run.holds.add("checkpoint")

    def resume(self) -> None:
        self.run.holds.discard("checkpoint")
        for s in self.spouts:
            s.wake()

    def holding(self) -> bool:
        """Every spout is parked at a call boundary, or will emit nothing more."""
        return self._spouts_holding()

    def complete(self, checkpoint_id: int) -> None:
        """The supervisor wrote checkpoint ``checkpoint_id``: sinks commit what they sealed."""
        self.stats.last_id = checkpoint_id
        self.stats.completed += 1
        self._complete(checkpoint_id)

    def _complete(self, checkpoint_id: int) -> None:
        for t in self._tasks():
            t.instance.checkpoint_complete(checkpoint_id)

    def _tasks(self) -> list[SpoutTask | BoltTask]:
        return [*self.spouts, *self.bolts]

    def _spouts_holding(self) -> bool:
        """Every spout is parked at a call boundary, or will emit nothing more."""
        return all(s.holding or s.exhausted or s.finished for s in self.spouts)
