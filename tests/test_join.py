"""The stream join (topo.join.JoinBolt): inner and left, by key within a window."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgpack
import pytest

from topo.api import Bolt, Tuple
from topo.join import JoinBolt
from topo.sources.files import JsonLinesSpout
from topo.testing import BoltHarness
from topo.topology import TopologyBuilder

INPUTS = {"orders": ["order_id", "amount", "ts"], "payments": ["order", "paid", "ts"], "end": ["task", "tasks"]}


def join(**kw: Any) -> BoltHarness:
    options = dict(left="orders:orders", right="payments:payments", left_key=["order_id"], right_key=["order"],
                   left_fields=["order_id", "amount"], right_fields=["paid"], size_s=10)
    options.update(kw)
    return BoltHarness(JoinBolt(**options), input_fields=INPUTS)


def order(h: BoltHarness, oid: Any, amount: Any, ts: float) -> list[list[Any]]:
    return [e.values for e in h.feed(h.tuple([oid, amount, ts], "orders", source="orders"), raise_errors=True)]


def pay(h: BoltHarness, oid: Any, paid: Any, ts: float) -> list[list[Any]]:
    return [e.values for e in h.feed(h.tuple([oid, paid, ts], "payments", source="payments"), raise_errors=True)]


def test_inner_join_pairs_every_match_in_the_window_once_when_it_closes() -> None:
    h = join()
    assert pay(h, 1, "p1", 3) == []                     # the right side may come first
    order(h, 1, 10, 1)
    order(h, 2, 20, 2)
    order(h, 1, 11, 4)
    pay(h, 1, "p1b", 9)
    pay(h, 3, "p3", 5)                                  # no order 3: nothing for inner
    assert order(h, 8, 80, 12) == []                    # the watermark is the lesser side's: 9
    out = pay(h, 8, "x", 10)                            # watermark 10 closes [0, 10)
    assert out == [[1, 10, "p1"], [1, 10, "p1b"], [1, 11, "p1"], [1, 11, "p1b"]]
    assert h.bolt.open_windows()[0][:3] == (8, 10, 20)  # only the new window is left


def test_left_join_keeps_unmatched_left_tuples_with_none() -> None:
    h = join(how="left")
    order(h, 1, 10, 1)
    order(h, 2, 20, 2)
    pay(h, 1, "p1", 8)
    pay(h, 2, "p2", 12)                                 # order 2's payment falls in the next window
    out = order(h, 5, 50, 25)                           # watermark min(25, 12) = 12 closes [0, 10)
    assert out == [[1, 10, "p1"], [2, 20, None]]
    assert order(h, 6, 60, 100) == []                   # the right side holds the watermark at 12
    assert pay(h, 7, "p7", 100) == [[5, 50, None]]      # [10, 20) had only a right tuple: nothing


def test_multi_field_keys_out_of_order_and_late_tuples() -> None:
    h = BoltHarness(JoinBolt("a", "b", ["k1", "k2"], ["k1", "k2", "x"], ["y"], size_s=10, lateness_s=5),
                    input_fields={"default": ["k1", "k2", "x", "y", "ts"]})

    def send(src: str, k1: Any, k2: Any, v: Any, ts: float) -> list[tuple[str, list[Any]]]:
        t = h.tuple([k1, k2, v, v, ts], source=src)
        return [(e.stream, e.values) for e in h.feed(t, raise_errors=True)]

    send("a", 1, "x", "a1", 8)
    send("b", 1, "y", "b-other", 7)                     # same k1, other k2: no match
    send("a", 1, "y", "a2", 14)                         # watermark 9
    send("b", 1, "x", "b1", 4)                          # out of order, still on time
    assert send("a", 0, "z", "-", 15) == []             # the right side holds the watermark at 2
    out = send("b", 0, "z", "-", 15)                    # watermark 10: [0, 10) closes
    assert out == [("default", [1, "x", "a1", "b1"])]
    assert send("b", 1, "x", "b2", 9.5) == [("late", ["right", 1, "x", 9.5])]


def test_sliding_join_pairs_tuples_in_every_window_they_share() -> None:
    h = join(size_s=10, slide_s=5)
    order(h, 1, 10, 6)                                  # windows [0, 10) and [5, 15)
    pay(h, 1, "p", 12)                                  # windows [5, 15) and [10, 20)
    assert order(h, 0, 0, 100) == []                    # watermark 12: [0, 10) closes, no pair
    assert pay(h, 0, "q", 100) == [[1, 10, "p"]]        # once: only [5, 15) holds both


def test_processing_time_join_and_end_of_input() -> None:
    now = [50.0]
    h = join(time="processing", clock=lambda: now[0], how="left")
    order(h, 1, 10, 0)
    pay(h, 1, "p", 0)
    now[0] = 61.0
    assert [e.values for e in h.tick()] == [[1, 10, "p"]]
    h2 = join()
    order(h2, 1, 10, 1)
    pay(h2, 1, "p", 2)
    assert h2.feed(h2.tuple([0, 1], "end", source="src")) == []            # neither side's source
    assert h2.feed(h2.tuple([0, 1], "end", source="orders")) == []         # the right side is not done
    assert [e.values for e in h2.feed(h2.tuple([0, 1], "end", source="payments"))] == [[1, 10, "p"]]


def test_a_restored_join_continues_exactly() -> None:
    rows = [("o" if i % 3 else "p", i % 7, i * 0.7) for i in range(300)]

    def run(h: BoltHarness, part: list[Any]) -> list[list[Any]]:
        out: list[list[Any]] = []
        for side, k, ts in part:
            out += order(h, k, ts, ts) if side == "o" else pay(h, k, f"p{ts}", ts)
        return out

    whole = join(how="left", lateness_s=3)
    expected = run(whole, rows + [("o", 99, 10**6)])
    first = join(how="left", lateness_s=3)
    got = run(first, rows[:131])
    second = join(how="left", lateness_s=3)
    second.bolt.restore_state(msgpack.unpackb(msgpack.packb(first.bolt.snapshot_state()), raw=False))
    got += run(second, rows[131:] + [("o", 99, 10**6)])
    assert got == expected and len(expected) > 50


def test_bad_options_are_refused() -> None:
    with pytest.raises(ValueError, match="how"):
        JoinBolt("a", "b", ["k"], ["k"], ["v"], how="outer", size_s=1)
    with pytest.raises(ValueError, match="distinct"):
        JoinBolt("a", "b", ["k"], ["k", "v"], ["v"], size_s=1)
    with pytest.raises(ValueError, match="as many"):
        JoinBolt("a", "b", ["k"], ["k"], ["v"], right_key=["k", "j"], size_s=1)
    assert JoinBolt("a", "b", ["k"], ["k", "v"], ["v"], fields=["k", "lv", "rv"], size_s=1) \
        .declare_outputs()["default"] == ("k", "lv", "rv")
    h = join()
    with pytest.raises(ValueError, match="neither left"):
        h.feed(h.tuple([1, 1, 1], "orders", source="elsewhere"), raise_errors=True)


class Collect(Bolt):
    rows: list[list[Any]] = []

    def execute(self, tup: Tuple) -> None:
        Collect.rows.append(list(tup.values))


def test_join_end_to_end_on_the_local_engine(tmp_path: Path) -> None:
    from runtime.local.engine import run

    orders = [{"id": i, "amount": i * 10, "ts": i} for i in range(200)]
    payments = [{"order": i, "paid": f"p{i}", "ts": i + 3} for i in range(0, 200, 2)]
    (tmp_path / "orders.jsonl").write_text("".join(json.dumps(r) + "\n" for r in orders))
    (tmp_path / "payments.jsonl").write_text("".join(json.dumps(r) + "\n" for r in payments))
    b = TopologyBuilder("join-e2e", {"acking": True})
    b.spout("orders", JsonLinesSpout(str(tmp_path / "orders.jsonl"), fields=["id", "amount", "ts"]))
    b.spout("payments", JsonLinesSpout(str(tmp_path / "payments.jsonl"), fields=["order", "paid", "ts"]))
    b.bolt("join", JoinBolt("orders", "payments", ["id"], ["id", "amount"], ["paid"], right_key=["order"],
                            how="left", size_s=10, lateness_s=20), parallelism=2) \
        .fields("orders", "id").fields("payments", "order") \
        .all("orders", stream="end").all("payments", stream="end")
    b.bolt("collect", Collect()).global_("join")
    Collect.rows = []
    run(b.build())
    # an order joins its payment when both fall in the same 10 s window
    expected = sorted([i, i * 10, f"p{i}" if i % 2 == 0 and i // 10 == (i + 3) // 10 else None] for i in range(200))
    assert sorted(Collect.rows) == expected
