"""Document 002's send windows on the local engine: the engine side of ``seams.WindowGate``.

A spout's tracked tuples are routed as usual into its outbox's lanes (one per
downstream task, W6's batches). When the outbox flushes, ``admit`` says how many of
each lane's tuples go now: no more tracked tuples than the window towards that task
has room for (the flow control's ``room``, W1); the rest wait in their lane, in
order, until acks free room. The spout stops asking for new tuples once
``max_spout_pending`` are in flight, so what waits is bounded.

Where the grouping lets a tuple go to any task of the component (shuffle,
local_or_shuffle, load_aware), tuples beyond a full window move to a task of the same
component whose window has room (W7), and a failed tuple's replay goes to the flow
control's ``resend_target`` (W4: another task with room). Under fields, all and
global grouping a tuple's task is fixed: it waits for that task's window.

The spout task reports every outcome (``on_outcome``): an ack grows or shrinks the
window by its round trip (W2, W3), a fail or timeout makes the task BUSY (W4) and,
if the tuple is sent again, its replay keeps its number for the ack point (W5).

Resume positions (W5 for restarts): when the flow control keeps them
(``track_ack_points``), each spout that keeps state gets an ``ack_points.AckPoint``,
scanned at every flush and told every outcome; a restarted spout is put back at the
kept state by ``restore_spout``. Not with checkpoints on: a checkpoint is a drained
cut, where the ack point is every spout's offset, so the checkpoint is the durable
ack point; resuming a spout later than it would skip tuples whose effects the bolts'
restored state lacks.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Hashable, Mapping, Protocol, Sequence

from runtime.local.ack_points import AckPoint, Keep, hashable
from runtime.local.outbox import Lane, Outbox


class WindowFlow(Protocol):
    """What the flow control (``drivers.window.WindowFlowControl``) offers the gate."""

    def room(self, spout: int, target: int) -> int: ...

    def on_sent(self, spout: int, target: int, root: Hashable, now: float,
                resend_of: Hashable | None = None) -> None: ...

    def on_sent_many(self, spout: int, target: int, roots: Sequence[Hashable], now: float) -> None: ...

    def on_acked_many(self, spout: int, acked: Sequence[tuple[Hashable, float]]) -> None: ...

    def on_failed(self, spout: int, root: Hashable, now: float) -> int | None: ...

    def on_dropped(self, spout: int, root: Hashable) -> None: ...

    def resend_target(self, spout: int, busy: int) -> int | None: ...


_ACKS_AT_ONCE = 64


class SendWindows:
    """``seams.WindowGate`` for the spouts of one local engine."""

    def __init__(self, flow: WindowFlow, pending: Mapping[int, Mapping[int, tuple]],
                 component_of: Mapping[int, str], movable: Mapping[int, frozenset[str]],
                 keyed: Mapping[int, frozenset[str]], clock: Callable[[], float] = time.perf_counter,
                 positions: Mapping[int, tuple[Callable[[], Any], Callable[[Any], None]]] | None = None,
                 stopping: Callable[[], bool] = lambda: False) -> None:
        self.flow = flow
        self.positions = positions or {}    # spout -> (snapshot_state, restore_state): spouts that can resume
        self.stopping = stopping
        self.ack_points: dict[int, AckPoint] = {}
        self.pending = pending              # spout task -> its pending roots (root -> (msg_id, ...))
        self.component_of = component_of    # downstream task -> its component
        self.movable = movable              # spout -> components whose tuples may change task
        self.keyed = keyed                  # spout -> components whose tuples may not
        self.resend: dict[int, dict[Hashable, tuple[int, int]]] = {s: {} for s in pending}
        # Acks (root, time) not yet handed to the flow control: handed over in bulk at the next
        # flush (when room is read), before a fail, or every ``_ACKS_AT_ONCE``.
        self.acked: dict[int, list[tuple[Hashable, float]]] = {s: [] for s in pending}
        self.clock = clock

    # --- seams.WindowGate ----------------------------------------------------------
    def routes_tracked_tuples(self) -> bool:
        return True

    def keyed_components(self, spout: int) -> frozenset[str]:
        return self.keyed.get(spout, frozenset())

    def track_ack_points(self, keep: Callable[[int, int, Any], None]) -> frozenset[int]:
        """From now on each spout that can resume reports its state at every new ack point."""
        for spout, (snapshot, _) in self.positions.items():
            k: Keep = lambda point, state, spout=spout: keep(spout, point, state)
            self.ack_points[spout] = AckPoint(snapshot, k, self.stopping)
        return frozenset(self.positions)

    def restore_spout(self, spout: int, state: Any) -> bool:
        """Put ``spout`` back at a state kept at its ack point (False: it cannot resume)."""
        entry = self.positions.get(spout)
        if entry is None:
            return False
        entry[1](state)
        return True

    # --- what the spout task and its outbox call --------------------------------------
    def on_outcome(self, spout: int, root: int, ok: bool, msg_id: Any, sent_again: bool) -> None:
        now = self.clock()
        ap = self.ack_points.get(spout)
        if ap is not None:
            ap.on_outcome(root, ok, msg_id, sent_again)
        acked = self.acked[spout]
        if ok:
            acked.append((root, now))
            if len(acked) >= _ACKS_AT_ONCE:
                self.hand_over(spout)
            return
        if acked:
            self.hand_over(spout)
        busy = self.flow.on_failed(spout, root, now)
        key = hashable(msg_id)
        if sent_again and busy is not None and key is not None:
            self.resend[spout][key] = (root, busy)
        else:
            self.flow.on_dropped(spout, root)

    def admit(self, outbox: Outbox) -> dict[int, int]:
        """Per target, how many of its lane's first tuples go now (W1); reports them sent."""
        spout = outbox.task_id
        flow = self.flow
        pending = self.pending[spout]
        ap = self.ack_points.get(spout)
        if ap is not None:
            ap.scan(pending)
        if self.acked[spout]:
            self.hand_over(spout)
        resend = self.resend[spout]
        if self.movable[spout]:
            self._spread(spout, outbox.lanes, pending, resend)
        now = self.clock()
        admitted: dict[int, int] = {}
        for target, lane in outbox.lanes.items():
            batch = lane.batch
            if not batch:
                continue
            room = flow.room(spout, target)
            k = 0
            sent: list[Hashable] = []
            for t in batch:
                anchors = t.anchors
                if anchors:
                    if room <= 0:
                        break
                    room -= 1
                    for root in anchors:             # a spout tuple has one root
                        old = None
                        if resend:
                            entry = pending.get(root)
                            key = hashable(entry[0]) if entry is not None else None
                            old = resend.pop(key, None) if key is not None else None
                        if old is not None:
                            flow.on_sent(spout, target, root, now, old[0])
                        else:
                            sent.append(root)
                k += 1
            if sent:
                flow.on_sent_many(spout, target, sent, now)
            admitted[target] = k
        return admitted

    def hand_over(self, spout: int) -> None:
        """The acks collected for ``spout`` go to the flow control now (its windows move)."""
        acked = self.acked[spout]
        self.acked[spout] = []
        self.flow.on_acked_many(spout, acked)

    def _resend_to(self, spout: int, t: Any, pending: Mapping[int, tuple],
                   resend: Mapping[Hashable, tuple[int, int]]) -> int | None:
        """W4: where a replayed tuple should go (None: not a replay, or nowhere better)."""
        entry = pending.get(next(iter(t.anchors)))
        key = hashable(entry[0]) if entry is not None else None
        hit = resend.get(key) if key is not None else None
        return self.flow.resend_target(spout, hit[1]) if hit is not None else None

    def _spread(self, spout: int, lanes: Mapping[int, Lane], pending: Mapping[int, tuple],
                resend: Mapping[Hashable, tuple[int, int]]) -> None:
        """W4 and W7 on components whose tuples may change task: replays to their resend
        target, tuples beyond a full window to lanes of the same component with room."""
        movable = self.movable[spout]
        groups: dict[str, list[Lane]] = {}
        for target, lane in lanes.items():
            comp = self.component_of.get(target)
            if comp in movable:
                groups.setdefault(comp, []).append(lane)
        for comp_lanes in groups.values():
            if len(comp_lanes) < 2:
                continue
            room = {lane.target: self.flow.room(spout, lane.target) for lane in comp_lanes}
            if not resend and not any(room.values()):
                continue                             # every window full: all wait where they are
            by_target = {lane.target: lane for lane in comp_lanes}
            replays: list[tuple[Any, int]] = []
            if resend:                                   # W4 first: a replay takes the room it finds
                for lane in comp_lanes:
                    keep = []
                    for t in lane.batch:
                        want = self._resend_to(spout, t, pending, resend) if t.anchors else None
                        if want is not None and want != lane.target and room.get(want, 0) > 0:
                            room[want] -= 1
                            replays.append((t, want))
                        else:
                            keep.append(t)
                    lane.batch = keep
            spill: list[tuple[Any, Lane]] = []           # W7: over a full window, to one with room
            for lane in comp_lanes:
                keep = []
                for t in lane.batch:
                    if t.anchors:
                        if room[lane.target] <= 0:
                            spill.append((t, lane))
                            continue
                        room[lane.target] -= 1
                    keep.append(t)
                lane.batch = keep
            for t, want in replays:
                by_target[want].batch.insert(0, t)       # first in line, so this flush sends it
            for t, home in spill:
                best = max(room, key=room.__getitem__)
                if room[best] > 0:
                    room[best] -= 1
                    by_target[best].batch.append(t)
                else:
                    home.batch.append(t)                 # no room anywhere: it waits in its lane
