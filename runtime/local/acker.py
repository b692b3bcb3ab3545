"""Storm's XOR-ledger acker, in process.

Every tracked spout tuple is a *root*. Each edge of its tuple tree (one tuple sent
to one task) gets a random 64-bit id. The ledger of a root holds the XOR of the
ids of edges created and not yet acked: creating an edge XORs it in, acking the
tuple on that edge XORs it out together with the edges of the tuples anchored to
it. The ledger is zero exactly when the whole tree is processed (with probability
1 - 2**-64 per update), however the updates interleave, in constant memory per root.

The acker is a plain object called by tasks on the same event loop (no acker task
and no queue hop), and the only code that knows the ledger's format: a spout's
emit ``open``s a root, a bolt's ack calls ``ack`` (the hot loops bind both as
locals). Each root records its owner as a callback (the owning spout task's
``on_outcome``), told of the completion or failure; ``expire`` fails roots older
than the message timeout.
"""
from __future__ import annotations

from typing import Callable, Sequence

from topo.api import Tuple

# The owner of a root: told (root, ok, reason) once its tree completes or fails.
Outcome = Callable[[int, bool, str], None]

# A ledger entry is a 3-item list, [xor, owner, deadline]: a list is the cheapest
# mutable record to make and update on the per-tuple path.
XOR, OWNER, DEADLINE = 0, 1, 2
Entry = list


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
        get = self.ledger.get
        for root, edge in anchors.items():
            e = get(root)
            if e is not None:
                x = e[XOR] ^ edge ^ value
                e[XOR] = x
                if not x:
                    self.complete(root, e)
            elif self.forward_ack is not None and root & 0xFF != self.root_tag:
                self.forward_ack(root, edge ^ value)

    def ack_batch(self, tuples: Sequence[Tuple]) -> None:
        """``ack`` of every tracked tuple of a batch in one call (a batch bolt's auto-ack)."""
        ack = self.ack
        for tup in tuples:
            anchors = tup.anchors
            if anchors:
                ack(anchors, tup.ackcell[0])

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
