"""A synthetic source with a rate profile, deterministic by offset.

Record number ``i`` (counting from 0 over the whole source) becomes available at time
``t0 + profile.time_of(i)`` and lives in partition ``i mod P`` at offset ``i // P``
(round robin, so the partitions stay even). Its content depends only on ``i`` and
``seed``: ``(id, payload, ts)`` where ``payload`` is a string of
``min_len..max_len`` characters (length from a 64-bit mix of ``i``), so work that is
linear in the record varies from record to record but identically on every run and
engine. ``ts`` is the time the record became available.

Profiles (``make_profile``):

* ``constant``: ``rate`` records per second;
* ``bursty``: document 001's figure 9, ``per_period`` records (600,000) spread evenly
  over the first ``burst_fraction`` (half) of every ``period`` (10 s), nothing in the
  rest.

``t0`` is set when the stream starts (``started_at``); ``total`` makes it finite.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from typing import Any, Iterator, Protocol

from topo.sources.base import check_range

SYNTHETIC_COLUMNS: tuple[str, ...] = ("id", "payload", "ts")
_MASK = (1 << 64) - 1


def mix64(x: int) -> int:
    """SplitMix64's finaliser: a well-spread 64-bit hash of ``x``."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


class Profile(Protocol):
    def count_at(self, t: float) -> int:
        """Records available ``t`` seconds after start."""
        ...

    def time_of(self, i: int) -> float:
        """Seconds after start when record ``i`` becomes available (inverse of count_at)."""
        ...


@dataclass(frozen=True)
class Constant:
    rate: float

    def __post_init__(self) -> None:
        if self.rate <= 0:
            raise ValueError("rate must be > 0")

    def count_at(self, t: float) -> int:
        return 0 if t < 0 else math.floor(self.rate * t + 1e-9)

    def time_of(self, i: int) -> float:
        return i / self.rate


@dataclass(frozen=True)
class Bursty:
    per_period: int = 600_000
    period: float = 10.0
    burst_fraction: float = 0.5

    def __post_init__(self) -> None:
        if self.per_period < 1 or self.period <= 0 or not 0 < self.burst_fraction <= 1:
            raise ValueError("bursty needs per_period >= 1, period > 0, 0 < burst_fraction <= 1")

    @property
    def burst(self) -> float:
        return self.period * self.burst_fraction

    def count_at(self, t: float) -> int:
        if t < 0:
            return 0
        k, within = divmod(t, self.period)
        done = min(self.per_period, math.floor(self.per_period * within / self.burst + 1e-9))
        return int(k) * self.per_period + done

    def time_of(self, i: int) -> float:
        k, j = divmod(i, self.per_period)
        return k * self.period + j * self.burst / self.per_period

    def rate_at(self, t: float) -> float:
        return self.per_period / self.burst if (t % self.period) < self.burst else 0.0


def make_profile(name: str, **params: Any) -> Profile:
    if name == "constant":
        return Constant(float(params.get("rate", 1000.0)))
    if name == "bursty":
        return Bursty(int(params.get("per_period", 600_000)), float(params.get("period", 10.0)),
                      float(params.get("burst_fraction", 0.5)))
    raise ValueError(f"unknown rate profile {name!r}; expected constant or bursty")


@dataclass(frozen=True)
class SyntheticSource:
    """An ``OffsetSource`` over a rate profile (see the module docstring)."""

    profile: Any
    partitions: int = 4
    total: int | None = None
    min_len: int = 16
    max_len: int = 256
    seed: int = 0
    t0: float | None = None
    columns: tuple[str, ...] = SYNTHETIC_COLUMNS

    def __post_init__(self) -> None:
        if self.partitions < 1:
            raise ValueError("partitions must be >= 1")
        if not 0 <= self.min_len <= self.max_len:
            raise ValueError("need 0 <= min_len <= max_len")
        if self.total is not None and self.total < 0:
            raise ValueError("total must be >= 0")

    def started_at(self, t0: float) -> "SyntheticSource":
        return replace(self, t0=t0)

    def describe(self) -> str:
        return f"synthetic {self.profile} over {self.partitions} partitions"

    def num_partitions(self) -> int:
        return self.partitions

    def available(self, now: float | None = None) -> int:
        """Records available over all partitions at ``now`` (wall clock)."""
        if self.t0 is None:
            raise RuntimeError("synthetic source not started (call started_at(t0))")
        n = self.profile.count_at((time.time() if now is None else now) - self.t0)
        return n if self.total is None else min(n, self.total)

    def offsets_for(self, count: int) -> dict[int, int]:
        """Per-partition end offsets when the first ``count`` records exist."""
        p = self.partitions
        return {q: (count - q + p - 1) // p for q in range(p)}

    def latest(self, now: float | None = None) -> dict[int, int]:
        return self.offsets_for(self.available(now))

    def bound(self) -> dict[int, int] | None:
        return None if self.total is None else self.offsets_for(self.total)

    def length_of(self, i: int) -> int:
        span = self.max_len - self.min_len + 1
        return self.min_len + mix64(i ^ (self.seed * 0x2545F4914F6CDD1D & _MASK)) % span

    def record(self, i: int) -> tuple[int, str, float]:
        n = self.length_of(i)
        payload = (_ALPHABET[i % 26:] + _ALPHABET * (n // 26 + 2))[:n]
        return (i, payload, (self.t0 or 0.0) + self.profile.time_of(i))

    def read(self, partition: int, start: int, end: int) -> Iterator[tuple[Any, ...]]:
        check_range(partition, start, end, self.partitions)
        p = self.partitions
        for offset in range(start, end):
            i = offset * p + partition
            if self.total is not None and i >= self.total:
                return
            yield self.record(i)

    def close(self) -> None:
        return None


_ALPHABET = "abcdefghijklmnopqrstuvwxyz"
