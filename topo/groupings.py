"""Stream groupings: which downstream task(s) receive each tuple.

A ``Grouping`` is a declarative value held in the topology; at run time the
engine asks it for a ``Router`` bound to the concrete target tasks. Routers are on
the per-tuple hot path, so they are small closures over precomputed lists.

``fields`` hashes the grouping fields' msgpack encoding with CRC32 rather than
Python's ``hash``: the routing is then the same in every process and every run
(string hashing is salted per process), which the Spark engine and replays rely on.
"""
from __future__ import annotations

import random
import zlib
from dataclasses import dataclass
from typing import Any, Callable, Protocol, Sequence

import msgpack

from topo.api import FieldIndex


class LoadView(Protocol):
    """How loaded a task is, as the fraction of its queue's hard bound in use (0..1)."""

    def water_level(self, task_id: int) -> float: ...


@dataclass
class Router:
    """Chooses targets for one (upstream stream -> downstream component) edge.

    ``broadcast`` routers send every tuple to all ``targets``; others return the
    index into ``targets`` of the one task that gets it.
    """

    targets: list[int]
    select: Callable[[Sequence[Any]], int]
    broadcast: bool = False
    # Shuffle-like routers can be weighted while they run (document 004's load
    # balancing): ``weigh(shares)`` with one share per target; None for the others.
    weigh: Callable[[Sequence[float]], None] | None = None


class Grouping:
    """Base of all groupings; ``kind`` is the name used in topology.yaml."""

    kind: str = ""

    def check(self, upstream_fields: Sequence[str]) -> str | None:
        """An error message when this grouping cannot apply to the upstream fields."""
        return None

    def router(self, targets: list[int], fields: FieldIndex, *, rng: random.Random,
               local_tasks: frozenset[int] = frozenset(), load: LoadView | None = None) -> Router:
        raise NotImplementedError

    def describe(self) -> dict[str, Any]:
        return {"type": self.kind}


class ShuffleGrouping(Grouping):
    """Round-robin from a random start: even spread, cheaper than a random draw per tuple."""

    kind = "shuffle"

    def router(self, targets, fields, *, rng, local_tasks=frozenset(), load=None) -> Router:
        return _round_robin_router(targets, rng)


SCHEDULE_SLOTS = 100   # a weighted shuffle's cycle: shares are honoured to 1%


def _round_robin_router(targets: list[int], rng: random.Random) -> Router:
    """Round robin from a random start over a schedule of target indices: one slot per
    target (even spread) until ``weigh`` spreads the slots by shares."""
    n = len(targets)
    if n == 1:
        return Router(targets, lambda values: 0)
    state: list[Any] = [rng.randrange(n), list(range(n)), n]    # position, schedule, its length

    def select(values: Sequence[Any]) -> int:
        i = state[0] + 1
        if i >= state[2]:
            i = 0
        state[0] = i
        return state[1][i]

    def weigh(shares: Sequence[float]) -> None:
        schedule = weighted_schedule(shares)
        state[1], state[2], state[0] = schedule, len(schedule), 0

    return Router(targets, select, weigh=weigh)


def weighted_schedule(shares: Sequence[float], slots: int = SCHEDULE_SLOTS) -> list[int]:
    """Target indices interleaved in proportion to ``shares`` (smooth weighted round robin,
    as nginx spreads upstream weights): no long run of one target."""
    total = sum(max(0.0, s) for s in shares)
    if total <= 0:
        return list(range(len(shares)))
    weights = [max(0.0, s) / total for s in shares]
    current = [0.0] * len(weights)
    out = []
    for _ in range(slots):
        for k, w in enumerate(weights):
            current[k] += w
        best = max(range(len(weights)), key=current.__getitem__)
        current[best] -= 1.0
        out.append(best)
    return out


@dataclass
class FieldsGrouping(Grouping):
    """Tuples with equal values in ``fields`` always go to the same task."""

    fields: tuple[str, ...]
    kind = "fields"

    def __init__(self, fields: Sequence[str] | str) -> None:
        self.fields = (fields,) if isinstance(fields, str) else tuple(fields)

    def check(self, upstream_fields: Sequence[str]) -> str | None:
        if not self.fields:
            return "fields grouping needs at least one field"
        missing = [f for f in self.fields if f not in upstream_fields]
        if missing:
            return (f"fields grouping on {', '.join(map(repr, missing))} but the upstream "
                    f"declares {list(upstream_fields)}")
        return None

    def router(self, targets, fields, *, rng, local_tasks=frozenset(), load=None) -> Router:
        n = len(targets)
        positions = [fields.index[f] for f in self.fields]
        packb = msgpack.packb
        crc = zlib.crc32
        if n == 1:
            return Router(targets, lambda values: 0)
        if len(positions) == 1:
            p = positions[0]
            return Router(targets, lambda values: crc(packb(values[p])) % n)
        return Router(targets, lambda values: crc(packb([values[p] for p in positions])) % n)

    def describe(self) -> dict[str, Any]:
        return {"type": self.kind, "fields": list(self.fields)}


def fields_task_index(key_values: Sequence[Any], n: int) -> int:
    """The task index a fields grouping picks for ``key_values`` among ``n`` tasks."""
    key = key_values[0] if len(key_values) == 1 else list(key_values)
    return zlib.crc32(msgpack.packb(key)) % n


class AllGrouping(Grouping):
    """Every task of the downstream component gets a copy."""

    kind = "all"

    def router(self, targets, fields, *, rng, local_tasks=frozenset(), load=None) -> Router:
        return Router(targets, lambda values: 0, broadcast=True)


class GlobalGrouping(Grouping):
    """The whole stream goes to the downstream task with the lowest id (Storm's rule)."""

    kind = "global"

    def router(self, targets, fields, *, rng, local_tasks=frozenset(), load=None) -> Router:
        return Router([min(targets)], lambda values: 0)


class LocalOrShuffleGrouping(Grouping):
    """Shuffle among targets in the emitter's own worker process when there are any.

    In the local engine every task shares one process, so this is a shuffle over all
    targets; the distinction matters on engines with several workers.
    """

    kind = "local_or_shuffle"

    def router(self, targets, fields, *, rng, local_tasks=frozenset(), load=None) -> Router:
        local = [t for t in targets if t in local_tasks] if local_tasks else []
        chosen = local or targets
        return _round_robin_router(chosen, rng)


class LoadAwareGrouping(Grouping):
    """Power of two choices on the targets' water levels (document 004's load balancing).

    Draws two distinct targets and sends to the one whose queue is fuller by the
    smaller fraction; with no ``LoadView`` it degrades to shuffle. Two random
    choices avoid the herding of always picking the single least-loaded task from
    stale load figures.
    """

    kind = "load_aware"

    def router(self, targets, fields, *, rng, local_tasks=frozenset(), load=None) -> Router:
        n = len(targets)
        if load is None or n == 1:
            return _round_robin_router(targets, rng)
        level = load.water_level
        rand = rng.randrange

        def select(values: Sequence[Any]) -> int:
            a = rand(n)
            b = rand(n - 1)
            if b >= a:
                b += 1
            return a if level(targets[a]) <= level(targets[b]) else b

        return Router(targets, select)


GROUPINGS: dict[str, type[Grouping]] = {
    g.kind: g for g in (ShuffleGrouping, FieldsGrouping, AllGrouping, GlobalGrouping,
                        LocalOrShuffleGrouping, LoadAwareGrouping)
}
