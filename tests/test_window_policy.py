"""Every rule of the window policy (document 002, W1-W8 of its docstring), pure, fake clock."""
from __future__ import annotations

import pytest

from backpressure.policy.window import (BUSY, NORMAL, SLOW, Batcher, CumulativeAck, SendWindow, WindowParams,
                                        WindowSender)
from topo.config import ConfigError, resolve

P = WindowParams(initial=2, min=1, max=4, rtt_threshold=0.2)


def test_defaults_and_config() -> None:
    p = WindowParams.from_config(resolve({"backpressure.policy": "window", "acking": True}))
    assert (p.initial, p.min, p.max, p.rtt_threshold, p.batch) == (16, 1, 4096, 0.05, 256)
    with pytest.raises(ValueError):
        WindowParams(initial=0)


def test_w8_acking_is_required() -> None:
    with pytest.raises(ConfigError, match="acking"):
        resolve({"backpressure.policy": "window"})
    with pytest.raises(ValueError, match="acking"):
        WindowParams.from_config({"acking": False})


def test_w1_a_task_takes_tuples_only_while_its_window_has_room() -> None:
    w: SendWindow[int] = SendWindow(P)
    w.on_sent(1, 0.0)
    assert w.has_room()
    w.on_sent(2, 0.0)
    assert not w.has_room() and w.in_flight == {1: 0.0, 2: 0.0}


def test_w2_normal_acks_grow_the_window_linearly_up_to_max() -> None:
    w: SendWindow[int] = SendWindow(P)
    w.on_sent(1, 0.0)
    w.on_sent(2, 0.0)                                     # the window (2) is used
    assert w.on_ack(1, 0.0) == pytest.approx(0.0)         # the base round trip: NORMAL
    assert w.on_ack(2, 0.2) == pytest.approx(0.2)         # 0.2 over the base, at the threshold: NORMAL
    assert w.state == NORMAL
    assert w.window == pytest.approx(2 + 1 / 2 + 1 / 2.5)  # step / window per ack: not 4 (one per ack)
    for i in range(3, 30):
        for j in range(int(w.window)):
            w.on_sent(i * 10 + j, 1.0)                    # filled again
        w.on_ack(i * 10, 1.01)
    assert w.window == 4.0                                # max


def test_w2_a_round_trip_of_normal_acks_grows_the_window_by_one_step_not_doubles_it() -> None:
    """RFC 2001's linear increase (congestion avoidance), which document 002 keeps, is one
    segment per round trip; one per ack would double the window every round trip (slow start,
    which the document leaves out)."""
    w: SendWindow[int] = SendWindow(WindowParams(initial=100, min=1, max=4096, rtt_threshold=0.05))
    now = 0.0
    for rnd in range(3):                                  # three round trips of 10 ms, each a full window
        n = int(w.window)
        for i in range(n):
            w.on_sent((rnd, i), now)
        now += 0.01
        for i in range(n):
            w.on_ack((rnd, i), now)
    assert w.state == NORMAL
    assert 102.9 < w.window < 103.1                       # 100 + about 1 per round trip (800 per ack)


def test_w2b_a_window_the_spout_does_not_fill_does_not_grow() -> None:
    w: SendWindow[int] = SendWindow(P)
    for i in range(5):                                    # one tuple at a time into a window of 2
        w.on_sent(i, float(i))
        w.on_ack(i, i + 0.01)
    assert (w.state, w.window) == (NORMAL, 2.0)
    w.on_sent(10, 9.0)
    w.on_sent(11, 9.0)                                    # now it limits the spout: it grows
    w.on_ack(10, 9.01)
    assert w.window == 2.5


def test_w3_slow_acks_shrink_it_linearly_down_to_min() -> None:
    w: SendWindow[int] = SendWindow(P)
    w.on_sent(1, 0.0)
    w.on_ack(1, 0.05)                                     # the base: 0.05 s
    w.on_sent(2, 1.0)
    w.on_ack(2, 1.3)                                      # 0.25 over the base > 0.2: SLOW
    assert (w.state, w.window) == (SLOW, 1.0)
    w.on_sent(3, 2.0)
    w.on_ack(3, 3.0)
    assert w.window == 1.0                                # min
    assert w.on_ack(99, 3.0) is None                      # an ack for a root it does not hold: nothing


def test_w3b_the_threshold_counts_from_the_smallest_round_trip_seen() -> None:
    """A path whose bare round trip is 0.5 s (over the threshold itself) stays NORMAL while
    no queue builds up; a round trip 0.2 s over the base shrinks its window."""
    w: SendWindow[int] = SendWindow(WindowParams(initial=8, min=1, max=16, rtt_threshold=0.2))
    for i in range(8):
        w.on_sent(i, 0.0)
    grown = 8.0
    for i in range(4):
        w.on_ack(i, 0.5 + 0.05 * i)                       # 0.5-0.65 s: within 0.2 of the base 0.5
        grown += 1 / grown
    assert (w.state, w.base) == (NORMAL, 0.5) and w.window == pytest.approx(grown)
    w.on_ack(4, 0.75)                                     # 0.25 over the base: SLOW
    assert w.state == SLOW and w.window == pytest.approx(grown - 1)
    w.on_ack(5, 0.45)                                     # a faster one lowers the base
    assert w.base == 0.45


def test_w4_busy_shrinks_by_one_and_resends_to_another_task() -> None:
    s: WindowSender[str] = WindowSender(P, {"b": [10, 11, 12]})
    s.on_sent("r", 11, 0.0)
    assert s.on_fail("r") == 11
    assert s.windows[11].state == BUSY and s.windows[11].window == 1.0
    assert s.resend_target("b", 11) == 12                 # the next task after the busy one
    s.on_sent("x", 12, 0.0)
    s.on_sent("y", 12, 0.0)
    assert s.resend_target("b", 11) == 10                 # 12 full: skipped
    assert s.on_fail("never-sent") is None


def test_w4_under_fields_grouping_the_tuple_waits_for_its_task() -> None:
    s: WindowSender[str] = WindowSender(P, {"b": [10, 11]}, keyed=frozenset({"b"}))
    s.on_sent("r", 10, 0.0)
    s.on_fail("r")
    assert s.resend_target("b", 10) == 10


def test_w4_with_no_other_task_with_room_it_waits() -> None:
    s: WindowSender[str] = WindowSender(WindowParams(initial=1, min=1, max=4), {"b": [10, 11]})
    s.on_sent("a", 11, 0.0)
    s.on_sent("r", 10, 0.0)
    s.on_fail("r")
    assert s.resend_target("b", 10) is None


def test_w5_cumulative_ack_point_and_resume_position() -> None:
    c = CumulativeAck()
    assert c.on_ack(1, 0.1)
    assert not c.on_ack(3, 0.3) and not c.on_ack(4, 0.4)
    assert (c.point, c.point_rt, c.resume_position) == (1, 0.1, 2)      # acks of 1, 3, 4: the point is 1
    assert c.on_ack(2, 0.2)
    assert (c.point, c.point_rt, c.resume_position) == (4, 0.4, 5)      # then 2: it is 4, with 4's rt
    assert not c.on_ack(2, 0.9)                                        # a duplicate ack changes nothing


def test_w5_a_failed_tuple_holds_the_point_until_its_resend_is_acked() -> None:
    from backpressure.drivers.window import WindowFlowControl
    fc = WindowFlowControl(P, slow_bytes=100, capacity=200)
    fc.senders[0] = WindowSender(P, {"b": [10, 11]})
    fc.acks[0], fc.numbers[0], fc.last_number[0] = CumulativeAck(), {}, 0
    fc.handles = {0: _H(0, "s"), 10: _H(10, "b"), 11: _H(11, "b")}
    fc.component_of = {10: "b", 11: "b"}
    fc.on_sent(0, 10, "r1", 0.0)
    fc.on_sent(0, 11, "r2", 0.0)
    assert fc.on_failed(0, "r1", 0.1) == 10
    fc.on_acked(0, "r2", 0.1)
    assert fc.acks[0].point == 0
    target = fc.resend_target(0, 10)
    assert target == 11
    fc.on_sent(0, target, "r1b", 0.2, resend_of="r1")     # the replay (a new root) keeps number 1
    fc.on_acked(0, "r1b", 0.3)
    assert fc.acks[0].point == 2
    fc.on_sent(0, 10, "r3", 0.4)
    fc.on_sent(0, 10, "r4", 0.4)
    fc.on_acked(0, "r4", 0.5)                             # out of order: the point waits for 3
    fc.on_sent(0, 11, "r5", 0.5)                          # numbers never repeat after such an ack
    assert fc.numbers[0] == {"r3": 3, "r5": 5}
    fc.on_failed(0, "r3", 0.6)
    fc.on_dropped(0, "r3")                                # dead-lettered: the point passes it
    assert fc.acks[0].point == 4 and fc.acks[0].resume_position == 5


def test_w6_records_go_in_batches() -> None:
    b = Batcher(3)
    assert b.add(1) is None and b.add(2) is None
    assert b.add(3) == [1, 2, 3]
    b.add(4)
    assert b.flush() == [4] and b.flush() is None


def test_w7_round_robin_skips_full_windows() -> None:
    s: WindowSender[str] = WindowSender(WindowParams(initial=1, min=1, max=4), {"b": [10, 11, 12]})
    picks = []
    for r in "abc":
        t = s.pick("b")
        picks.append(t)
        s.on_sent(r, t, 0.0)
    assert sorted(picks) == [10, 11, 12]
    assert s.pick("b") is None                             # every window full
    s.on_ack(r, 0.01)
    assert s.pick("b") == picks[-1]


class _H:
    def __init__(self, task_id: int, component: str) -> None:
        self.task_id, self.component = task_id, component
        self.upstream_task_ids: list[int] = []
        self.counted: list[tuple[str, str]] = []

    def count_signal(self, direction: str, kind: str) -> None:
        self.counted.append((direction, kind))

    def show(self, display: object) -> None:
        self.shown = display


def test_w9_a_tuple_fanned_out_to_two_components_is_freed_from_both_windows_by_its_ack() -> None:
    s: WindowSender[str] = WindowSender(P, {"fast": [10], "relay": [20]})
    for root in ("q", "r"):                                                # both windows (2) filled
        s.on_sent(root, 10, 0.0)
        s.on_sent(root, 20, 0.0)
    assert s.windows[10].in_flight == {"q": 0.0, "r": 0.0} == s.windows[20].in_flight
    assert s.on_ack("r", 0.1) == pytest.approx(0.1)
    assert s.windows[10].in_flight == {"q": 0.0} == s.windows[20].in_flight   # neither window leaks it
    assert s.windows[10].window == s.windows[20].window == 2.5             # both saw a NORMAL ack
    s.on_sent("f", 10, 1.0)
    s.on_sent("f", 20, 1.0)
    assert s.on_fail("f") == 10
    assert s.windows[10].state == s.windows[20].state == BUSY and "f" not in s.windows[20].in_flight
