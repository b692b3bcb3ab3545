"""Stream groupings: which downstream task(s) receive each tuple.

A ``Grouping`` is a declarative value held in the topology; at run time the
engine asks it for a ``Router`` bound to the concrete target tasks. Routers are on
the per-tuple hot path, so they are small closures over precomputed lists.

``fields`` hashes the grouping fields' msgpack encoding with CRC32 rather than
Python's ``hash``: the routing is then the same in every process and every run
(string hashing is salted per process), which the Spark engine and replays rely on.

A router built ``scalable`` can change its targets while it runs (autoscaling,
document 004): ``retarget`` mutates the router in place, since the outbox's emit
closures hold its ``select`` and ``targets``. A scalable fields router routes by
*key group* (``KEY_GROUPS`` fixed groups, each owned by one task, as Flink's
max-parallelism key groups): a rescale moves whole groups, and only as many as
evening out the counts needs (``spread_key_groups``), so the engine moves the keyed
state of those groups and of no others.
"""
from __future__ import annotations

import random
import zlib
from dataclasses import dataclass
from operator import itemgetter
from typing import Any, Callable, Iterable, Protocol, Sequence

import msgpack

from topo.api import Columns, FieldIndex


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
    # Scalable routers only: ``retarget(targets, key_owners)`` switches to these targets
    # in place; a fields router also takes the new owner task of every key group.
    retarget: Callable[[Sequence[int], Sequence[int] | None], None] | None = None
    key_owners: list[int] | None = None    # a scalable fields router: owner task per key group
    # ``select`` of every values of a list at once, where a router can do better than one
    # call per values (a fields router's remembered keys); None: ``map(select, ...)``.
    select_many: Callable[[Sequence[Sequence[Any]]], Iterable[int]] | None = None


class Grouping:
    """Base of all groupings; ``kind`` is the name used in topology.yaml."""

    kind: str = ""

    def check(self, upstream_fields: Sequence[str]) -> str | None:
        """An error message when this grouping cannot apply to the upstream fields."""
        return None

    def router(self, targets: list[int], fields: FieldIndex, *, rng: random.Random,
               local_tasks: frozenset[int] = frozenset(), load: LoadView | None = None,
               scalable: bool = False) -> Router:
        """``scalable``: the router must be able to ``retarget`` while it runs."""
        raise NotImplementedError

    def describe(self) -> dict[str, Any]:
        return {"type": self.kind}


class ShuffleGrouping(Grouping):
    """Round-robin from a random start: even spread, cheaper than a random draw per tuple."""

    kind = "shuffle"

    def router(self, targets, fields, *, rng, local_tasks=frozenset(), load=None, scalable=False) -> Router:
        return _round_robin_router(targets, rng, scalable)


SCHEDULE_SLOTS = 100   # a weighted shuffle's cycle: shares are honoured to 1%


def _round_robin_router(targets: list[int], rng: random.Random, scalable: bool = False) -> Router:
    """Round robin from a random start over a schedule of target indices: one slot per
    target (even spread) until ``weigh`` spreads the slots by shares."""
    n = len(targets)
    if n == 1 and not scalable:
        return Router(targets, lambda values: 0)
    targets = list(targets)
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

    def retarget(new: Sequence[int], key_owners: Sequence[int] | None = None) -> None:
        targets[:] = new
        state[1], state[2], state[0] = list(range(len(new))), len(new), 0

    return Router(targets, select, weigh=weigh, retarget=retarget if scalable else None)


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

    def router(self, targets, fields, *, rng, local_tasks=frozenset(), load=None, scalable=False) -> Router:
        n = len(targets)
        positions = [fields.index[f] for f in self.fields]
        packb = msgpack.packb
        crc = zlib.crc32
        if scalable:
            return _key_group_router(list(targets), positions)
        if n == 1:
            return Router(targets, lambda values: 0)
        if len(positions) == 1:
            select, select_many = _memo_select(positions[0], n)
            return Router(targets, select, select_many=select_many)
        return Router(targets, lambda values: crc(packb([values[p] for p in positions])) % n)

    def describe(self) -> dict[str, Any]:
        return {"type": self.kind, "fields": list(self.fields)}


_MEMO_KEYS = 65536   # string keys a fields router remembers the target of (then it starts over)


def _memo_select(p: int, n: int) -> tuple[Callable[[Sequence[Any]], int],
                                          Callable[[Sequence[Sequence[Any]]], Iterable[int]]]:
    """``select`` and ``select_many`` of a one-field fields router: the target index of the
    key at position ``p`` (CRC32 of its msgpack encoding, mod ``n``), remembered per string key: a word count routes the same few thousand words
    millions of times, and a dict lookup costs a small part of a pack and a CRC. Only
    strings are remembered, since only for them equal keys always encode alike (``1``,
    ``1.0`` and ``True`` are equal dict keys with three encodings)."""
    packb, crc = msgpack.packb, zlib.crc32
    memo: dict[str, int] = {}

    def select(values: Sequence[Any]) -> int:
        key = values[p]
        if type(key) is not str:
            return crc(packb(key)) % n
        i = memo.get(key)
        if i is None:
            if len(memo) >= _MEMO_KEYS:
                memo.clear()
            i = memo[key] = crc(packb(key)) % n
        return i

    key_of = itemgetter(p)

    def select_many(values_list: Sequence[Sequence[Any]]) -> Iterable[int]:
        """All from the memo by C-level maps (``Columns``: straight from the key's column, no
        row made); one call per values when a key is new or no string."""
        keys = values_list.columns[p] if type(values_list) is Columns else map(key_of, values_list)
        try:
            return list(map(memo.__getitem__, keys))
        except (KeyError, TypeError):
            return list(map(select, values_list))

    return select, select_many


KEY_GROUPS = 1024   # a scalable fields router's fixed key groups (parallelism never passes 1024)


def key_group(key: Any) -> int:
    """The key group of a key as ``KeyedBolt.key_of`` returns it (one value, or a tuple of
    them: msgpack encodes a tuple as the list the router hashes)."""
    return zlib.crc32(msgpack.packb(key)) % KEY_GROUPS


def spread_key_groups(owners: Sequence[int], targets: Sequence[int]) -> list[int]:
    """New owners (task ids) of the key groups for ``targets``, moving as few groups as
    evening the counts needs: groups of a task no longer in ``targets``, and a task's
    groups beyond its fair share (``len // n``, one more for the tasks that hold most),
    go to the tasks under theirs. Deterministic, so every router into one component
    that starts from the same owners ends with the same ones."""
    n = len(targets)
    if n == 0:
        raise ValueError("key groups need at least one task")
    held: dict[int, list[int]] = {t: [] for t in targets}
    pool: list[int] = []
    for g, t in enumerate(owners):
        (held[t] if t in held else pool).append(g)
    base, extra = divmod(len(owners), n)
    by_size = sorted(targets, key=lambda t: (-len(held[t]), t))
    quota = {t: base + (1 if i < extra else 0) for i, t in enumerate(by_size)}
    for t in targets:
        while len(held[t]) > quota[t]:
            pool.append(held[t].pop())
    pool.sort()
    out = list(owners)
    for t in targets:
        while len(held[t]) < quota[t]:
            g = pool.pop(0)
            held[t].append(g)
            out[g] = t
    return out


def _key_group_router(targets: list[int], positions: list[int]) -> Router:
    """Fields grouping over key groups: a key's group is fixed, the group's owner can move."""
    groups = KEY_GROUPS
    owners = [targets[g % len(targets)] for g in range(groups)]
    index = [g % len(targets) for g in range(groups)]
    packb = msgpack.packb
    crc = zlib.crc32
    if len(positions) == 1:
        p = positions[0]

        def select(values: Sequence[Any]) -> int:
            return index[crc(packb(values[p])) % groups]
    else:
        def select(values: Sequence[Any]) -> int:
            return index[crc(packb([values[p] for p in positions])) % groups]

    def retarget(new: Sequence[int], key_owners: Sequence[int] | None = None) -> None:
        if key_owners is None or len(key_owners) != groups or not set(key_owners) <= set(new):
            raise ValueError("a fields router needs an owner among the targets for every key group")
        targets[:] = new
        at = {t: i for i, t in enumerate(new)}
        owners[:] = key_owners
        index[:] = [at[t] for t in key_owners]

    return Router(targets, select, retarget=retarget, key_owners=owners)


def fields_task_index(key_values: Sequence[Any], n: int) -> int:
    """The task index a fields grouping picks for ``key_values`` among ``n`` tasks."""
    key = key_values[0] if len(key_values) == 1 else list(key_values)
    return zlib.crc32(msgpack.packb(key)) % n


class AllGrouping(Grouping):
    """Every task of the downstream component gets a copy."""

    kind = "all"

    def router(self, targets, fields, *, rng, local_tasks=frozenset(), load=None, scalable=False) -> Router:
        if not scalable:
            return Router(targets, lambda values: 0, broadcast=True)
        targets = list(targets)

        def retarget(new: Sequence[int], key_owners: Sequence[int] | None = None) -> None:
            targets[:] = new

        return Router(targets, lambda values: 0, broadcast=True, retarget=retarget)


class GlobalGrouping(Grouping):
    """The whole stream goes to the downstream task with the lowest id (Storm's rule)."""

    kind = "global"

    def router(self, targets, fields, *, rng, local_tasks=frozenset(), load=None, scalable=False) -> Router:
        chosen = [min(targets)]

        def retarget(new: Sequence[int], key_owners: Sequence[int] | None = None) -> None:
            chosen[:] = [min(new)]

        return Router(chosen, lambda values: 0, retarget=retarget if scalable else None)


class LocalOrShuffleGrouping(Grouping):
    """Shuffle among targets in the emitter's own worker process when there are any.

    In the local engine every task shares one process, so this is a shuffle over all
    targets; the distinction matters on engines with several workers.
    """

    kind = "local_or_shuffle"

    def router(self, targets, fields, *, rng, local_tasks=frozenset(), load=None, scalable=False) -> Router:
        local = [t for t in targets if t in local_tasks] if local_tasks else []
        chosen = local or targets
        return _round_robin_router(chosen, rng, scalable)


class LoadAwareGrouping(Grouping):
    """Power of two choices on the targets' water levels (document 004's load balancing).

    Draws two distinct targets and sends to the one whose queue is fuller by the
    smaller fraction; with no ``LoadView`` it degrades to shuffle. Two random
    choices avoid the herding of always picking the single least-loaded task from
    stale load figures.
    """

    kind = "load_aware"

    def router(self, targets, fields, *, rng, local_tasks=frozenset(), load=None, scalable=False) -> Router:
        n = len(targets)
        if load is None or (n == 1 and not scalable):
            return _round_robin_router(targets, rng, scalable)
        level = load.water_level
        rand = rng.randrange
        targets = list(targets)
        size = [n]

        def select(values: Sequence[Any]) -> int:
            n = size[0]
            if n == 1:
                return 0
            a = rand(n)
            b = rand(n - 1)
            if b >= a:
                b += 1
            return a if level(targets[a]) <= level(targets[b]) else b

        def retarget(new: Sequence[int], key_owners: Sequence[int] | None = None) -> None:
            targets[:] = new
            size[0] = len(new)

        return Router(targets, select, retarget=retarget if scalable else None)


GROUPINGS: dict[str, type[Grouping]] = {
    g.kind: g for g in (ShuffleGrouping, FieldsGrouping, AllGrouping, GlobalGrouping,
                        LocalOrShuffleGrouping, LoadAwareGrouping)
}
