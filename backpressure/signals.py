"""The messages of document 000, msgpack-encoded, and the task state records.

Two kinds of record travel through a coordinator:

* ``Signal``: one task telling one direct upstream task how many backpressure
  steps it holds on it (BACKPRESSURE when the count went up, RELEASE when it went
  down). A signal carries the *absolute* step count the sender now holds, not a
  "one more step" delta, so applying it twice, or applying an older one after a
  newer one was seen (the ``seq`` says which is newer), changes nothing: signals
  are idempotent and a lost one is repaired by the sender's next state record.
* ``TaskState``: what a task publishes under ``taskstate/<task_id>``: its rate,
  ``originv``, step count ``k``, backpressure flag, queue bytes and marks (what
  ``topo status`` shows), plus the bookkeeping that lets every other task
  reconcile: ``holds`` (steps this task holds on each of its upstreams, as of its
  signal ``seq``) and ``applied`` (the newest signal ``(run, seq)`` it applied from
  each of its downstreams: the acknowledgement that ends a "mid-step"), ``granted``
  (the steps each downstream really holds on it, which may be fewer than asked),
  and when it last stepped down and for whom (``step_age``, ``stepped_by``).

Sequence numbers are ``(run, seq)`` pairs: ``run`` is a random id drawn when a
process starts and ``seq`` a counter within it, so ordering never depends on a
clock (a restarted process whose clock went back is still newer, because its run
is new). The same run id is the first half of a state's ``version``.

Decoding is bounded: a payload longer than ``MAX_PAYLOAD`` bytes, or one whose
containers exceed small limits, or whose fields have the wrong types, raises
``SignalError``; a coordinator logs and skips such a znode.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import msgpack

BACKPRESSURE = "BACKPRESSURE"
RELEASE = "RELEASE"
KINDS = (BACKPRESSURE, RELEASE)

MAX_PAYLOAD = 64 * 1024          # bytes read from one znode, at most
_MAX_MAP = 4096                  # entries in holds / applied (tasks in a topology)
_MAX_STR = 512


class SignalError(ValueError):
    """A payload that is not a well-formed signal or state record."""


@dataclass(frozen=True, slots=True)
class Signal:
    """``source`` now holds ``k`` backpressure steps on its upstream ``target``."""

    kind: str
    target: int
    source: int
    k: int
    seq: int
    ts: float
    run: int = 0            # the sender's run id: seq counts within it

    def encode(self) -> bytes:
        return msgpack.packb({"signal": self.kind, "target": self.target, "source": self.source,
                              "k": self.k, "seq": self.seq, "ts": self.ts, "run": self.run})

    @classmethod
    def decode(cls, data: bytes) -> "Signal":
        m = _unpack(data)
        kind = _field(m, "signal", str)
        if kind not in KINDS:
            raise SignalError(f"unknown signal {kind!r}")
        k = _field(m, "k", int)
        if k < 0:
            raise SignalError("negative step count")
        run = _field(m, "run", int) if "run" in m else 0
        return cls(kind, _field(m, "target", int), _field(m, "source", int), k,
                   _field(m, "seq", int), float(_field(m, "ts", (int, float))), run)


@dataclass(slots=True)
class TaskState:
    """One task's published state (``taskstate/<task_id>``)."""

    task: int
    component: str = ""
    spout: bool = False
    rate: float | None = None          # current limit in tuples/s; None = limiter off
    originv: float | None = None       # emit rate recorded at the first step of this episode
    k: int = 0                         # steps applied: rate == originv * step**k
    backpressure: bool = False         # the document's backpressure flag
    at_floor: bool = False             # one more step would go under backpressure.rate_floor
    queue_bytes: int = 0
    high_mark: int = 0
    low_mark: int = 0
    observed_rate: float = 0.0
    holds: dict[int, int] = field(default_factory=dict)    # upstream -> steps asked of it
    seq: int = 0                                            # newest signal seq this task sent
    applied: dict[int, tuple[int, int]] = field(default_factory=dict)  # downstream -> newest (run, seq) applied
    granted: dict[int, int] = field(default_factory=dict)  # downstream -> steps it holds here
    step_age: float | None = None                           # seconds since the last step down (at publish)
    stepped_by: int = -1                                    # the downstream that asked for it (-1: none)
    version: tuple[int, int] = (0, 0)                       # (run id of the publisher, publish counter)
    ts: float = 0.0                                         # wall clock of the publish
    service_rate: float = 0.0                               # watermark: tuples/s executed while busy
    dry: bool = False                                       # a spout whose source ran dry under its limit
    at_intake: bool = False                                 # a bolt holding an upstream at its intake bound
    in_use_age: float | None = None                         # seconds its limit has bound its emits (None: not)

    def encode(self) -> bytes:
        return msgpack.packb({
            "task": self.task, "component": self.component, "spout": self.spout,
            "rate": self.rate, "originv": self.originv, "k": self.k,
            "backpressure": self.backpressure, "at_floor": self.at_floor,
            "queue_bytes": self.queue_bytes, "high_mark": self.high_mark, "low_mark": self.low_mark,
            "observed_rate": self.observed_rate, "holds": self.holds, "seq": self.seq,
            "applied": {t: list(a) for t, a in self.applied.items()}, "granted": self.granted,
            "step_age": self.step_age, "stepped_by": self.stepped_by,
            "version": list(self.version), "ts": self.ts, "service_rate": self.service_rate,
            "dry": self.dry, "at_intake": self.at_intake, "in_use_age": self.in_use_age,
        })

    @classmethod
    def decode(cls, data: bytes) -> "TaskState":
        m = _unpack(data)
        version = _field(m, "version", list)
        if len(version) != 2 or not all(isinstance(v, int) and not isinstance(v, bool) for v in version):
            raise SignalError("version must be two integers")
        return cls(
            task=_field(m, "task", int), component=_field(m, "component", str),
            spout=_field(m, "spout", bool), rate=_opt_float(m, "rate"), originv=_opt_float(m, "originv"),
            k=_field(m, "k", int), backpressure=_field(m, "backpressure", bool),
            at_floor=_field(m, "at_floor", bool), queue_bytes=_field(m, "queue_bytes", int),
            high_mark=_field(m, "high_mark", int), low_mark=_field(m, "low_mark", int),
            observed_rate=float(_field(m, "observed_rate", (int, float))),
            holds=_int_map(m, "holds"), seq=_field(m, "seq", int), applied=_pair_map(m, "applied"),
            granted=_int_map(m, "granted"), step_age=_opt_float(m, "step_age"),
            stepped_by=_field(m, "stepped_by", int), version=(version[0], version[1]), ts=float(_field(m, "ts", (int, float))),
            service_rate=float(_field(m, "service_rate", (int, float))) if "service_rate" in m else 0.0,
            dry=_field(m, "dry", bool) if "dry" in m else False,
            at_intake=_field(m, "at_intake", bool) if "at_intake" in m else False,
            in_use_age=_opt_float(m, "in_use_age"),
        )

    def row(self) -> dict[str, Any]:
        """The columns ``topo status`` prints."""
        return {"component": self.component, "task": self.task, "rate": self.rate,
                "originv": self.originv, "k": self.k, "backpressure": self.backpressure,
                "queue_bytes": self.queue_bytes, "high_mark": self.high_mark, "low_mark": self.low_mark}


def _unpack(data: bytes) -> Mapping[str, Any]:
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise SignalError("payload is not bytes")
    if len(data) > MAX_PAYLOAD:
        raise SignalError(f"payload of {len(data)} bytes is over the {MAX_PAYLOAD}-byte limit")
    try:
        m = msgpack.unpackb(bytes(data), raw=False, strict_map_key=False, use_list=True,
                            max_str_len=_MAX_STR, max_bin_len=0, max_ext_len=0,
                            max_array_len=_MAX_MAP, max_map_len=_MAX_MAP)
    except Exception as e:  # msgpack raises several unrelated types on garbage
        raise SignalError(f"not msgpack: {e}") from None
    if not isinstance(m, dict):
        raise SignalError("payload is not a map")
    return m


def _field(m: Mapping[str, Any], key: str, kind: type | tuple[type, ...]) -> Any:
    if key not in m:
        raise SignalError(f"missing field {key!r}")
    v = m[key]
    if isinstance(v, bool) and kind is not bool and (kind is int or (isinstance(kind, tuple) and bool not in kind)):
        raise SignalError(f"field {key!r} has the wrong type")
    if not isinstance(v, kind):
        raise SignalError(f"field {key!r} has the wrong type")
    return v


def _opt_float(m: Mapping[str, Any], key: str) -> float | None:
    v = m.get(key)
    if v is None:
        return None
    return float(_field(m, key, (int, float)))


def _pair_map(m: Mapping[str, Any], key: str) -> dict[int, tuple[int, int]]:
    v = _field(m, key, dict)
    out: dict[int, tuple[int, int]] = {}
    for a, b in v.items():
        if (type(a) is not int or not isinstance(b, list) or len(b) != 2
                or not all(type(x) is int for x in b)):
            raise SignalError(f"field {key!r} must map task ids to (run, seq) pairs")
        out[a] = (b[0], b[1])
    return out


def _int_map(m: Mapping[str, Any], key: str) -> dict[int, int]:
    v = _field(m, key, dict)
    out: dict[int, int] = {}
    for a, b in v.items():
        if type(a) is not int or type(b) is not int:
            raise SignalError(f"field {key!r} must map task ids to integers")
        out[a] = b
    return out
