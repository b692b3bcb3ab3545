"""Storm's XOR-ledger acker, in process.

Every tracked spout tuple is a *root*. Each edge of its tuple tree (one tuple sent
to one task) gets a random 64-bit id. The ledger of a root holds the XOR of the
ids of edges created and not yet acked: creating an edge XORs it in, acking the
tuple on that edge XORs it out together with the edges of the tuples anchored to
it. The ledger is zero exactly when the whole tree is processed (with probability
1 - 2**-64 per update), however the updates interleave, in constant memory per root.

The acker is a plain object called by tasks on the same event loop (no acker task
and no queue hop), and it owns the ledger's format: a spout's emit ``open``s a root
(its common case, a root on the default stream, writes the entry inline, in
``open``'s format: ``collectors.SpoutCollector``), a bolt's ack calls ``ack`` or, for
a batch, ``ack_all`` (the hot loops bind them as locals). Each root records its owner as a callback (the owning spout task's
``on_outcome``), told of the completion or failure; ``expire`` fails roots older
than the message timeout.

Granularity (``acking.granularity``). An edge is one tuple sent to one task, with its
own random id, or an ack group (``AckGroup``): the tuples one emitting task sent to one target under
the same parent between two flushes share one id, and the target acks that id once, when
the last of them is processed (a count, not a ledger update, per tuple). With ``tuple``
(Storm's) a root is one spout tuple; its own edge is a tuple's, and a bolt's tuples go
in groups unless they are read one by one on the way (``bolt_groups_edges`` in
``tasks.py``). With ``batch`` (Trident's) a root is every tracked tuple of one spout
batch, and a failure anywhere replays the whole batch. The ledger's rule is unchanged
(the XOR of the ids created and not yet acked), so the two kinds of edge mix in one tree.
"""
from __future__ import annotations

from collections import deque
from itertools import compress, repeat
from operator import attrgetter, itemgetter, not_, setitem, sub
from typing import Callable, Iterable, Sequence

from topo.api import Tuple, TupleBatch, run_tuples
from runtime.local.stretches import stretch_bounds, stretch_lengths

# The owner of a root: told (root, ok, reason) once its tree completes or fails.
Outcome = Callable[[int, bool, str], None]

# A ledger entry is a 3-item list, [xor, owner, deadline]: a list is the cheapest
# mutable record to make and update on the per-tuple path.
XOR, OWNER, DEADLINE = 0, 1, 2
_cell, _anchors = attrgetter("ackcell"), attrgetter("anchors")
_xor, _left = itemgetter(0), itemgetter(1)     # a cell's xor; a group's count of tuples not yet processed
Entry = list


# The shared ack cell of a group of tuples: ``[xor, left, edge]``, the XOR of the ids of
# the edges anchored to any of them, how many are not yet processed, and the group's own
# edge id. A per-tuple cell is a one-item list ``[xor]``; both are read through
# ``ack_tuple``, told apart by their length. A plain list, so the per-emit count
# (``g[1] += 1``) takes the interpreter's list fast path. The edge makes two groups'
# cells unequal (with probability 1 - 2**-64, the ledger's own odds), so ``list.count``
# finds the tuples of one group at C speed: it tries identity first, and a group is
# never equal to another group, a per-tuple cell (a shorter list) or None.
AckGroup = list
GROUP_CELL = 3   # len() of a group's cell


def new_group(edge: int, size: int = 0) -> AckGroup:
    """The cell of a new ack group whose edge id is ``edge`` (of ``size`` tuples so far)."""
    return [0, size, edge]


def all_in_groups(cells: list[list[int] | None]) -> bool:
    """Whether every tuple of these ack cells belongs to an ack group (batch granularity):
    none untracked, none with an edge of its own. C-level scans."""
    return None not in cells and set(map(len, cells)) == {GROUP_CELL}  # type: ignore[arg-type]


class Acker:
    """Ledger of in-flight roots."""

    def __init__(self, timeout_s: float, *, worker: int = 0,
                 forward_ack: Callable[[int, int], None] | None = None,
                 forward_fail: Callable[[int, str], None] | None = None) -> None:
        self.ledger: dict[int, Entry] = {}
        self.timeout_s = timeout_s
        # With worker processes a root id's low byte names the worker whose ledger holds
        # it (``root_tag``); updates for roots of other workers go to them.
        self.root_tag = worker
        self.forward_ack = forward_ack
        self.forward_fail = forward_fail

    def __len__(self) -> int:
        return len(self.ledger)

    def open(self, root: int, edges: int, owner: Outcome, born: float) -> None:
        """A spout emitted tracked root ``root`` whose first edges XOR to ``edges``."""
        if edges:
            self.ledger[root] = [edges, owner, born + self.timeout_s]
        else:
            owner(root, True, "")  # no subscriber: the tree is complete at once

    def ack(self, anchors: dict[int, int], value: int) -> None:
        """A tuple with ``anchors`` (root -> its edge) was processed; ``value`` is the XOR of
        the edges anchored to it (its children). A root already gone (failed or timed out)
        is skipped."""
        self.ack_all(((anchors, value),))

    def ack_all(self, acks: Iterable[tuple[dict[int, int], int]]) -> None:
        """``ack`` of each (anchors, value), in one loop: a batch's ledger updates in one call.
        The ledger's rule commutes, so the order of the updates does not matter."""
        ledger = self.ledger
        for anchors, value in acks:
            for root, edge in anchors.items():
                e = ledger.get(root)
                if e is not None:
                    e[XOR] = x = e[XOR] ^ edge ^ value
                    if not x:           # ``complete``, inlined: once per tree
                        del ledger[root]
                        e[OWNER](root, True, "")
                elif self.forward_ack is not None and root & 0xFF != self.root_tag:
                    self.forward_ack(root, edge ^ value)

    def ack_tuple(self, anchors: dict[int, int], cell: list[int]) -> None:
        """A tracked tuple was processed: its own edge acked at once, or its group's
        (``AckGroup``) once the last tuple of the group is processed."""
        if len(cell) == 1:
            self.ack(anchors, cell[0])
        else:
            left = cell[1] - 1
            cell[1] = left
            if not left:
                self.ack(anchors, cell[0])

    def ack_batch(self, tuples: Sequence[Tuple]) -> None:
        """``ack_tuple`` of every tracked tuple of a batch in one call (a batch bolt's
        auto-ack). A batch all of one group (the common case under batch granularity)
        costs one C-level identity scan and one ledger update."""
        if not tuples:
            return
        if type(tuples) is TupleBatch:
            return self._ack_runs(tuples)
        first = tuples[0].ackcell
        if first is not None and len(first) == 3:      # (GROUP_CELL: a literal on hot paths)
            # One count and at most one ledger update per stretch of tuples that share a
            # cell, the stretches found by C-level identity maps. A group split over several
            # stretches is counted down by each and completes at its last.
            cells = list(map(_cell, tuples))
            if cells[-1] is first and cells.count(first) == len(cells):     # all of one group
                left = first[1] - len(cells)
                first[1] = left
                if not left:
                    self.ack(tuples[0].anchors, first[0])  # type: ignore[arg-type]
                return
            bounds = stretch_bounds(cells)
            starts = bounds[:-1]
            heads = list(map(cells.__getitem__, starts))     # each stretch's cell
            if None not in heads and set(map(len, heads)) == {3}:
                # Every stretch a group's (the usual batch of a bolt's children): each group
                # counted down by its stretch's length, the ones that reach zero acked in one
                # ``ack_all``, all by C-level maps.
                lefts = list(map(sub, map(_left, heads), stretch_lengths(bounds)))
                deque(map(setitem, heads, repeat(1), lefts), 0)
                gone = list(map(not_, lefts))
                if any(gone):
                    self.ack_all(zip(map(_anchors, compress(map(tuples.__getitem__, starts), gone)),
                                     map(_xor, compress(heads, gone))))
                return
            done = []            # (anchors, value) of the groups completed here: one ack_all
            ack_tuple = self.ack_tuple
            for a, b in zip(bounds, bounds[1:]):
                cell = cells[a]
                if cell is None:
                    continue
                if len(cell) == 3:
                    left = cell[1] - (b - a)
                    cell[1] = left
                    if not left:
                        done.append((tuples[a].anchors, cell[0]))
                else:                # (cells of the tuples' own edges)
                    for tup in tuples[a:b]:
                        if tup.anchors:
                            ack_tuple(tup.anchors, tup.ackcell)
            if done:
                self.ack_all(done)
            return
        # Tuple granularity. Every tuple tracked with an edge of its own (the common case): one
        # ``ack_all`` over C-level maps. Else tuple by tuple, through ``ack_tuple``.
        cells = list(map(_cell, tuples))
        if None not in cells and set(map(len, cells)) == {1}:
            return self.ack_all(zip(map(_anchors, tuples), map(_xor, cells)))
        ack_tuple = self.ack_tuple
        for tup in tuples:
            if tup.anchors:
                ack_tuple(tup.anchors, tup.ackcell)

    def _ack_runs(self, batch: TupleBatch) -> None:
        """``ack_batch`` of a batch kept as runs: a run's tuples share one ack group (or are
        untracked), so each run is one count and at most one ledger update."""
        for run in batch.runs:
            anchors, cell = run[2], run[4]
            if not anchors:
                continue
            if len(cell) == 3:
                left = cell[1] - len(run[0])
                cell[1] = left
                if not left:
                    self.ack(anchors, cell[0])
            else:                    # (a cell of one tuple's own edge: each tuple acked alone)
                for tup in run_tuples(run):
                    self.ack_tuple(anchors, tup.ackcell)

    def apply(self, root: int, xor: int) -> None:
        """An ack of a tuple of this worker's root, made in another worker."""
        e = self.ledger.get(root)
        if e is not None:
            x = e[XOR] ^ xor
            e[XOR] = x
            if not x:
                self.complete(root, e)

    def complete(self, root: int, e: Entry) -> None:
        """The ledger of ``root`` reached zero: the tree is fully processed."""
        del self.ledger[root]
        e[OWNER](root, True, "")

    def fail(self, root: int, reason: str) -> None:
        e = self.ledger.pop(root, None)
        if e is not None:
            e[OWNER](root, False, reason)
        elif self.forward_fail is not None and root & 0xFF != self.root_tag:
            self.forward_fail(root, reason)

    def expire(self, now: float) -> int:
        """Fail every root past its deadline. Roots are kept in insertion (= deadline) order."""
        expired = []
        for root, e in self.ledger.items():
            if e[DEADLINE] > now:
                break
            expired.append(root)
        for root in expired:
            self.fail(root, "timeout")
        return len(expired)

    def fail_all(self, reason: str) -> int:
        roots = list(self.ledger)
        for root in roots:
            self.fail(root, reason)
        return len(roots)
