"""Which worker process runs which task (``workers: N``).

The rule, round robin that spreads each component: the ``k``-th task of the ``c``-th
component (in the topology's order, both from 0) runs on worker ``(c + k) % N``. So a
component with N tasks has one on every worker, and the first tasks of consecutive
components start on different workers (a spout and the first bolt after it are not
stacked on worker 0 when each has one task).
"""
from __future__ import annotations

from dataclasses import dataclass

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
    owner: dict[int, int] = {}
    next_id = 1
    for c_index, c in enumerate(topology.components.values()):
        for k in range(c.parallelism):
            owner[next_id] = (c_index + k) % workers
            next_id += 1
    return Placement(worker, workers, owner)
