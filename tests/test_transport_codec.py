"""A batch to another worker is packed once: the size its remote queue counts is the size the
outbox gives any queue, and what arrives is what was sent."""
from __future__ import annotations

import asyncio
from typing import Any

import msgpack

from topo.api import FieldIndex, Origin, WireTuple
from runtime.local.outbox import Outbox, StreamRoutes
from runtime.local.transport import RemoteQueue, TupleCodec

FIELDS = FieldIndex.of(["word", "n"])


def _batch(origins: list[Origin], tracked: bool = False) -> list[WireTuple]:
    values = [[f"w{i}" * (i % 7), i * 1000] for i in range(300)]       # sizes across msgpack's headers
    return [WireTuple((v, origins[i % len(origins)], {5: 9} if tracked else None, 1.5 if tracked else 0.0,
                       [0] if tracked else None)) for i, v in enumerate(values)]


def _outbox() -> Outbox:
    return Outbox("split", 3, {"default": StreamRoutes(FIELDS, [])}, {}, 256, 0.001)


def test_the_packed_size_is_the_outbox_size_and_decoding_gives_the_batch_back() -> None:
    codec = TupleCodec({"split": {"default": ("word", "n")}})
    pack = msgpack.Packer(autoreset=True).pack
    one = Origin(FIELDS, "default", "split", 3)
    other = Origin(FIELDS, "default", "split", 4)
    for batch in (_batch([one]), _batch([one, other]), _batch([one], tracked=True)):
        groups, nbytes = TupleCodec.encode_sized(batch, pack)
        assert nbytes == _outbox().batch_bytes(batch)
        assert all(isinstance(g[3], bytes) for g in groups)            # the values travel packed
        wire = msgpack.unpackb(msgpack.packb(["B", 1, nbytes, groups], use_bin_type=True), raw=False,
                               strict_map_key=False)
        back = codec.decode(wire[3])
        assert [(t.values, t.origin, t.anchors, t.born) for t in back] == \
               [(list(t.values), t.origin, t.anchors, t.born) for t in batch]


class _Link:
    def __init__(self) -> None:
        self.credit_waiters: dict[int, Any] = {}
        self.frames: list[list[Any]] = []

    async def send(self, frame: list[Any]) -> None:
        self.frames.append(frame)


def test_a_remote_queue_refuses_what_it_cannot_pack_or_what_is_over_its_bound() -> None:
    one = Origin(FIELDS, "default", "split", 3)
    link = _Link()
    q = RemoteQueue(7, link, 10_000, TupleCodec.encode)       # type: ignore[arg-type]
    ok = _batch([one])[:50]
    assert asyncio.run(q.put_packing(ok)) is not None and q.bytes == _outbox().batch_bytes(ok)
    bad = [WireTuple(([object(), 1], one, None, 0.0, None))]
    assert asyncio.run(q.put_packing(bad)) is None                  # the outbox sizes it and names it
    small = RemoteQueue(8, link, 100, TupleCodec.encode)       # type: ignore[arg-type]
    assert asyncio.run(small.put_packing(ok)) is None               # ... or cuts it into pieces
    assert len(link.frames) == 1 and link.frames[0][2] == q.bytes
