"""The local engine's send windows (document 002): a real outbox and queues, the window
flow control, and ``SendWindows`` between them, on a fake clock.

A spout task's outbox routes tracked tuples to two tasks of one component; each flush
sends no more tracked tuples to a task than its window has room for (W1), moves what
a shuffle would have sent to a full window to one with room (W7; under fields
grouping it waits), re-sends a failed tuple to another task (W4) under the number
it had (W5), and the windows follow the round trips of the acks (W2, W3).
"""
from __future__ import annotations

import random
from typing import Any

import pytest

from backpressure.drivers.window import WindowFlowControl
from backpressure.policy.window import BUSY, NORMAL, SLOW, WindowParams
from runtime.local.outbox import Outbox, StreamRoutes
from runtime.local.queue import ByteQueue
from runtime.local.send_windows import SendWindows
from topo.api import FieldIndex
from topo.groupings import FieldsGrouping, Grouping, ShuffleGrouping

SPOUT, A, B = 1, 10, 11


class Handle:
    def __init__(self, task_id: int, component: str, upstream: list[int]) -> None:
        self.task_id, self.component, self.upstream_task_ids = task_id, component, upstream
        self.is_spout = not upstream
        self.signals: list[tuple[str, str]] = []
        self.display: Any = None

    def count_signal(self, direction: str, kind: str) -> None:
        self.signals.append((direction, kind))

    def show(self, display: Any) -> None:
        self.display = display


class Rig:
    """One spout task's outbox towards tasks A and B of component ``b``, gated."""

    def __init__(self, grouping: Grouping) -> None:
        fi = FieldIndex.of(["k"])
        self.queues = {A: ByteQueue(10**6), B: ByteQueue(10**6)}
        router = grouping.router([A, B], fi, rng=random.Random(0))
        self.outbox = Outbox("src", SPOUT, {"default": StreamRoutes(fi, [router])}, self.queues, 64, 0.001)
        self.flow = WindowFlowControl(WindowParams(initial=2, min=1, max=8, rtt_threshold=0.2),
                                      slow_bytes=1, capacity=1)
        self.now = 0.0
        self.pending: dict[int, tuple] = {}
        movable = frozenset({"b"}) if isinstance(grouping, ShuffleGrouping) else frozenset()
        self.gate = SendWindows(self.flow, {SPOUT: self.pending}, {A: "b", B: "b"}, {SPOUT: movable},
                                {SPOUT: frozenset({"b"}) - movable}, clock=lambda: self.now)
        self.flow.window_gate = self.gate
        self.outbox.gate = self.gate.admit
        self.next_root = 100

    async def start(self) -> "Rig":
        await self.flow.start([Handle(SPOUT, "src", []), Handle(A, "b", [SPOUT]), Handle(B, "b", [SPOUT])])
        return self

    def emit(self, key: Any, msg_id: Any = None) -> int:
        """A tracked spout tuple (a new root, as the spout collector makes one per emit)."""
        self.next_root += 1
        root = self.next_root
        self.outbox.tracked["default"]([key], (root,), None, 0.0, random.Random(root).getrandbits)
        self.pending[root] = (key if msg_id is None else msg_id, [key], "default", 0, 0.0)
        return root

    def take(self, task: int) -> list[tuple[Any, int]]:
        """(key, root) of everything that reached ``task``'s queue, in order."""
        out = []
        while (item := self.queues[task].get_nowait()) is not None:
            out += [(t.values[0], next(iter(t.anchors))) for t in item[0]]
        return out

    def outcome(self, root: int, ok: bool, sent_again: bool = False, hand_over: bool = True) -> None:
        entry = self.pending.pop(root)
        self.gate.on_outcome(SPOUT, root, ok, entry[0], sent_again)
        if hand_over:
            self.gate.hand_over(SPOUT)

    def window(self, task: int) -> Any:
        return self.flow.senders[SPOUT].windows[task]


async def test_w1_a_flush_sends_no_more_tracked_tuples_to_a_task_than_its_window_admits() -> None:
    rig = await Rig(ShuffleGrouping()).start()
    roots = [rig.emit(i) for i in range(10)]
    await rig.outbox.flush()
    a, b = rig.take(A), rig.take(B)
    assert len(a) == len(b) == 2                                   # window 2 each
    assert rig.outbox.pending_count == 6                          # the rest wait in their lanes
    assert len(rig.window(A).in_flight) == 2
    rig.now = 0.05
    for _, root in a:
        rig.outcome(root, True)                                    # W2: two NORMAL acks, 2 -> 2.5 -> 2.9
    assert rig.window(A).window == pytest.approx(2.9) and rig.window(A).state == NORMAL
    await rig.outbox.flush()
    again = rig.take(A)
    assert len(again) == 2 and rig.take(B) == []                   # a round trip grows it by one step
    rig.now = 0.1
    for _, root in again:
        rig.outcome(root, True)                                    # 2.9 -> 3.24 -> 3.55: three go
    await rig.outbox.flush()
    assert len(rig.take(A)) == 3 and rig.take(B) == []
    assert rig.outbox.pending_count == 1
    assert set(roots) >= set(rig.flow.numbers[SPOUT])


async def test_w3_slow_acks_shrink_the_window_and_fewer_go() -> None:
    rig = await Rig(FieldsGrouping("k")).start()
    keys = [k for k in range(40) if rig.outbox.streams["default"].routers[0].select([k]) == 0][:6]
    for k in keys:
        rig.emit(k)
    await rig.outbox.flush()
    sent = rig.take(A)
    assert len(sent) == 2
    rig.now = 0.01
    rig.outcome(sent[0][1], True)                                  # the base round trip (NORMAL: 2 -> 2.5)
    rig.now = 0.5
    rig.outcome(sent[1][1], True)                                  # 0.49 s over the base > 0.2 s: SLOW
    assert rig.window(A).window == 1.5 and rig.window(A).state == SLOW
    await rig.outbox.flush()
    assert len(rig.take(A)) == 1 and rig.outbox.pending_count == 3


async def test_w7_under_shuffle_tuples_over_a_full_window_go_to_a_task_with_room() -> None:
    rig = await Rig(ShuffleGrouping()).start()
    for i in range(4):
        rig.emit(i)
    await rig.outbox.flush()
    first_a, first_b = rig.take(A), rig.take(B)
    rig.now = 0.05
    for _, root in first_a:
        rig.outcome(root, True)                                    # A: window 2.9 (room 2), none in flight
    for i in range(4, 6):
        rig.emit(i)                                                # one per lane; B's window is full
    await rig.outbox.flush()
    got = [k for k, _ in rig.take(A)]
    assert len(got) == 2 and rig.take(B) == [] and rig.outbox.pending_count == 0
    assert {k for k in got} == set(range(4, 6))                    # B's one moved to A


async def test_w7_under_fields_grouping_tuples_wait_for_their_own_task() -> None:
    rig = await Rig(FieldsGrouping("k")).start()
    select = rig.outbox.streams["default"].routers[0].select
    on_a = [k for k in range(40) if select([k]) == 0][:4]
    on_b = [k for k in range(40) if select([k]) == 1][:4]
    for k in on_a[:2] + on_b[:2]:
        rig.emit(k)
    await rig.outbox.flush()
    rig.now = 0.05
    for _, root in rig.take(A):
        rig.outcome(root, True)
    rig.take(B)
    for k in on_a[2:] + on_b[2:]:
        rig.emit(k)
    await rig.outbox.flush()
    assert [k for k, _ in rig.take(A)] == on_a[2:]
    assert rig.take(B) == [] and rig.outbox.pending_count == 2     # B's keys wait for B


async def test_w4_a_failed_tuple_shrinks_its_window_and_its_replay_goes_to_the_other_task() -> None:
    rig = await Rig(ShuffleGrouping()).start()
    r0 = rig.emit("x", msg_id="m0")
    rig.emit("y", msg_id="m1")
    await rig.outbox.flush()
    busy = A if rig.take(A)[0][1] == r0 else B
    other = B if busy == A else A
    rig.take(other)
    rig.now = 0.3
    rig.outcome(r0, False, sent_again=True)                        # a timeout: BUSY, one smaller
    assert rig.window(busy).state == BUSY and rig.window(busy).window == 1
    replay = rig.emit("x", msg_id="m0")                            # the spout replays: a new root
    rig.emit("z", msg_id="m2")
    await rig.outbox.flush()
    to_other = [root for _, root in rig.take(other)]
    assert replay in to_other, "the replay did not go to another task"
    assert rig.flow.numbers[SPOUT][replay] == 1                    # W5: it keeps number 1
    assert rig.flow.acks[SPOUT].point == 0
    rig.now = 0.35
    rig.outcome(replay, True)
    assert rig.flow.acks[SPOUT].point == 1


async def test_acks_reach_the_windows_in_bulk_at_the_next_flush() -> None:
    rig = await Rig(ShuffleGrouping()).start()
    roots = [rig.emit(i) for i in range(10)]
    await rig.outbox.flush()
    rig.now = 0.05
    for _, root in rig.take(A):
        rig.outcome(root, True, hand_over=False)
    assert rig.window(A).window == 2 and len(rig.window(A).in_flight) == 2    # not yet: collected
    await rig.outbox.flush()                                                 # room is read: handed over
    assert rig.window(A).window == pytest.approx(2.9) and len(rig.take(A)) == 2
    assert set(roots) >= set(rig.flow.numbers[SPOUT])


# --- the resume position (W5 for restarts): runtime/local/ack_points.py -------------------
class Source:
    """A spout's pending dict and state, as ``SpoutTask`` keeps them: (msg_id, values,
    stream, retries, born) per root, in emission order, ``born`` ascending."""

    def __init__(self) -> None:
        self.pending: dict[int, tuple] = {}
        self.offset = 0
        self.born = 0.0
        self.stopping = False
        self.kept: list[tuple[int, Any]] = []

    def emit(self, *msg_ids: Any, retries: int = 0) -> list[int]:
        roots = []
        for m in msg_ids:
            self.born += 1.0
            root = 1000 + len(self.pending) + int(self.born)
            self.pending[root] = (m, [m], "default", retries, self.born)
            roots.append(root)
            if not retries:
                self.offset += 1
        return roots

    def point(self) -> Any:
        from runtime.local.ack_points import AckPoint
        return AckPoint(lambda: {"offset": self.offset}, lambda p, s: self.kept.append((p, s)),
                        lambda: self.stopping)


def test_the_resume_position_is_the_state_after_the_longest_fully_acked_prefix_of_emissions() -> None:
    src = Source()
    ap = src.point()
    r1 = src.emit("a", "b")
    ap.scan(src.pending)                       # chunk 1: a, b (offset 2)
    r2 = src.emit("c")
    ap.scan(src.pending)                       # chunk 2: c (offset 3)
    ap.scan(src.pending)                       # nothing new: no chunk
    ap.on_outcome(r2[0], True, "c", False)     # chunk 2 done, chunk 1 not: the point stays at 0
    ap.on_outcome(r1[0], True, "a", False)
    assert src.kept == [] and ap.ack.point == 0
    ap.on_outcome(r1[1], True, "b", False)     # chunk 1 done: the point passes 1 and 2 at once
    assert src.kept == [(2, {"offset": 3})] and ap.states == {}


def test_a_replayed_tuple_keeps_its_chunk_open_until_the_replay_is_acked() -> None:
    src = Source()
    ap = src.point()
    (r,) = src.emit("a")
    ap.scan(src.pending)
    ap.on_outcome(r, False, "a", True)         # failed, sent again: chunk 1 waits for the replay
    (again,) = src.emit("a", retries=1)
    ap.scan(src.pending)                       # a replay makes no chunk of its own
    assert ap.chunks == 1 and src.kept == []
    ap.on_outcome(again, False, "a", True)     # the replay failed too, and goes again
    assert src.kept == []
    (third,) = src.emit("a", retries=2)
    ap.on_outcome(third, True, "a", False)
    assert src.kept == [(1, {"offset": 1})]


def test_a_dead_letter_passes_the_point_but_a_tuple_failed_back_at_stop_holds_it() -> None:
    src = Source()
    ap = src.point()
    r1 = src.emit("a")
    ap.scan(src.pending)
    r2 = src.emit("b")
    ap.scan(src.pending)
    ap.on_outcome(r1[0], False, "a", False)    # out of retries: dead-lettered, not lost
    assert src.kept == [(1, {"offset": 1})]
    src.stopping = True
    ap.on_outcome(r2[0], False, "b", False)    # failed back to the source at stop: resend it
    assert src.kept == [(1, {"offset": 1})]


def test_an_unhashable_msg_id_that_is_replayed_keeps_its_chunk_open() -> None:
    src = Source()
    ap = src.point()
    (r,) = src.emit(["unhashable"])
    ap.scan(src.pending)
    ap.on_outcome(r, False, ["unhashable"], True)
    (again,) = src.emit(["unhashable"], retries=1)
    ap.on_outcome(again, True, ["unhashable"], False)
    assert src.kept == [] and ap.open == {1: 1}   # never ahead of what was delivered
