"""Which worker process runs which task (``workers: N``), and where an added task goes.

The rule, round robin that spreads each component: the ``k``-th task of the ``c``-th
component (in the topology's order, both from 0) runs on worker ``(c + k) % N``. So a
component with N tasks has one on every worker, and the first tasks of consecutive
components start on different workers (a spout and the first bolt after it are not
stacked on worker 0 when each has one task).

Autoscaling changes the tasks while the run goes on, so the supervisor keeps a
``Layout`` (the tasks of every component as they stand, each task's worker, and the
key-group owners of a rescaled fields-grouped component). A worker started again
after a crash is built from it, not from the topology's parallelism. A task added
goes to the worker with the fewest tasks of its component, then the fewest tasks in
all, then the lowest index (so it spreads the component as the start-up rule does).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from topo.topology import Topology


@dataclass(frozen=True)
class Placement:
    worker: int                      # this process's worker index
    workers: int                     # how many there are
    owner: dict[int, int]            # task id -> worker index

    def local(self, task_id: int) -> bool:
        return self.owner[task_id] == self.worker


def place(topology: Topology, workers: int, worker: int) -> Placement:
    """Task ids are numbered from 1 in component order, as the engine numbers them."""
    return Layout.initial(topology, workers).placement(worker)


@dataclass
class Layout:
    """Every task of a running topology: what autoscaling changes and a restart rebuilds."""

    workers: int
    task_ids: dict[str, list[int]]                 # component -> its tasks, in order
    owner: dict[int, int]                          # task id -> worker index
    next_id: int                                   # the id the next added task gets
    key_owners: dict[str, list[int]] = field(default_factory=dict)   # after a keyed rescale

    @classmethod
    def initial(cls, topology: Topology, workers: int) -> "Layout":
        task_ids: dict[str, list[int]] = {}
        owner: dict[int, int] = {}
        next_id = 1
        for c_index, c in enumerate(topology.components.values()):
            task_ids[c.id] = list(range(next_id, next_id + c.parallelism))
            for k in range(c.parallelism):
                owner[next_id + k] = (c_index + k) % workers
            next_id += c.parallelism
        return cls(workers, task_ids, owner, next_id)

    def placement(self, worker: int) -> Placement:
        return Placement(worker, self.workers, dict(self.owner))

    def copy(self) -> "Layout":
        return copy.deepcopy(self)

    def to_record(self) -> dict[str, Any]:
        """Plain data (msgpack): what a checkpoint keeps so a rollback rebuilds these tasks."""
        return {"workers": self.workers, "task_ids": self.task_ids, "owner": self.owner,
                "next_id": self.next_id, "key_owners": self.key_owners}

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> "Layout":
        return cls(int(record["workers"]), {c: list(ids) for c, ids in record["task_ids"].items()},
                   {int(t): int(w) for t, w in record["owner"].items()}, int(record["next_id"]),
                   {c: list(o) for c, o in record["key_owners"].items()})

    def worker_for_new_task(self, component: str) -> int:
        """The worker an added task of ``component`` runs on (see the module docstring)."""
        mine = [0] * self.workers
        total = [0] * self.workers
        for c, ids in self.task_ids.items():
            for t in ids:
                total[self.owner[t]] += 1
                if c == component:
                    mine[self.owner[t]] += 1
        return min(range(self.workers), key=lambda w: (mine[w], total[w], w))
