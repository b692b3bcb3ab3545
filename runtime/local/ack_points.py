"""Document 002's cumulative ack point of one spout task, as a position to resume from.

The window policy numbers tuples in the order they are *sent* (W5), but tuples
overtake each other between lanes (a full window holds one lane back while another
goes), so a point in send order is no place to restart a source from. What a restart
needs is the same cumulative rule over the order the spout *emitted* its tuples:
the longest prefix of emissions that is all acked (or dead-lettered), and the
spout's state (``snapshot_state``) right after that prefix.

Emissions are taken in chunks: at every flush of the spout's outbox (``scan``) the
roots emitted since the last flush form the next chunk, numbered from 1, and the
spout's state is snapshot once for it (a spout is called between flushes, never
during one, so that state is exactly "everything up to this chunk emitted"). A chunk
is done when each of its tuples is acked, or dead-lettered; a failed tuple that is
sent again keeps its chunk open until its replay (a new root, same ``msg_id``) is
acked; one failed back at stop keeps it open for good (the restart sends it again).
``policy.window.CumulativeAck`` over the chunk numbers gives the point; each time it
moves, ``keep(point, state)`` is called with the state after that chunk.

Costs: one dict entry per tuple in flight and one state per open chunk (bounded by
``max_spout_pending``); a replay whose ``msg_id`` cannot be hashed cannot be linked
to its chunk, which then stays open (the point stops there: safe, never ahead).
"""
from __future__ import annotations

from typing import Any, Callable, Hashable, Mapping

from backpressure.policy.window import CumulativeAck

Keep = Callable[[int, Any], None]


class AckPoint:
    """One spout task's resume position (see the module docstring)."""

    def __init__(self, snapshot: Callable[[], Any], keep: Keep, stopping: Callable[[], bool]) -> None:
        self.snapshot = snapshot
        self.keep = keep
        self.stopping = stopping
        self.ack = CumulativeAck()
        self.chunks = 0
        self.open: dict[int, int] = {}               # chunk -> tuples not done yet
        self.chunk_of: dict[int, int] = {}           # root in flight -> its chunk
        self.replays: dict[Hashable, int] = {}       # msg_id sent again -> its chunk
        self.states: dict[int, Any] = {}             # chunk -> the spout's state after it
        self._last_born = 0.0

    def scan(self, pending: Mapping[int, tuple]) -> None:
        """The roots emitted since the last scan (first emissions only: a replay keeps its
        chunk) form the next chunk; ``pending`` is in emission order, ``born`` ascending."""
        new: list[int] = []
        last = self._last_born
        newest = last
        for root, p in reversed(pending.items()):
            born = p[4]
            if born <= last:
                break
            newest = max(newest, born)
            if p[3] == 0:
                new.append(root)
        self._last_born = newest
        if not new:
            return
        self.chunks += 1
        c = self.chunks
        self.states[c] = self.snapshot()
        self.open[c] = len(new)
        for root in new:
            self.chunk_of[root] = c

    def on_outcome(self, root: int, ok: bool, msg_id: Any, sent_again: bool) -> None:
        c = self.chunk_of.pop(root, None)
        key = hashable(msg_id)
        if c is None:
            if key is None or key not in self.replays:
                return                                # not a tuple of a chunk (emitted before scan)
            if not ok and sent_again:
                return                                # the replay failed and goes again
            c = self.replays.pop(key)
            if not ok and self.stopping():
                return                                # failed back at stop: the source keeps it
            self._done(c)
            return
        if ok:
            self._done(c)
        elif sent_again:
            if key is not None:
                self.replays[key] = c                 # (unhashable: its chunk stays open)
        elif not self.stopping():
            self._done(c)                             # dead-lettered: the point passes it

    def _done(self, c: int) -> None:
        left = self.open[c] - 1
        if left:
            self.open[c] = left
            return
        del self.open[c]
        before = self.ack.point
        if self.ack.on_ack(c, 0.0):
            point = self.ack.point
            state = self.states[point]
            for done in range(before + 1, point + 1):
                del self.states[done]
            self.keep(point, state)


def hashable(msg_id: Any) -> Hashable | None:
    """``msg_id`` if it can key a dict, else None."""
    try:
        hash(msg_id)
    except TypeError:
        return None
    return msg_id
