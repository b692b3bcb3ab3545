"""Autoscaling across worker processes: the supervisor's side of one rescale.

A component's tasks are spread over several workers, and every worker routes to them,
so a task is added or removed by the supervisor, the one place that sees every
worker, in steps each worker carries out in one turn of its event loop (the
engine's ``fence``, ``keyed_still``, ``take_keys_for``, ``give_keys_to``,
``apply_tasks``, ``task_drained``, ``retire_task``, ``forget_task``). The supervisor
keeps the ``placement.Layout``; a worker started again is built from it.

* **Add, shuffle-like inputs**: the chosen worker opens the task (prepared, running,
  routed to by nobody), then every worker switches its routers. Nothing pauses.
* **Remove, shuffle-like inputs**: every worker stops routing to the newest task; once
  no worker has a tuple for it in a lane or on the wire and its queue is empty (twice
  in a row), its worker stops it and every worker forgets it.
* **Fields grouping into a KeyedBolt** (add or remove): the key groups move with their
  state, exactly. (1) *Fence*: every worker holds its spouts and holds every batch it
  sends towards the component (``fence.HeldQueue``); upstream bolts keep working.
  (2) *Still*: what was already queued or on the wire drains, until every worker
  reports the component's tasks idle with nothing in flight to them, with the same
  counts twice. Nothing can reach the component any more. (3) *Take*: each worker
  takes out of its tasks the keys whose group gets another owner. (4) *Commit*: the
  layout changes here. (5) *Give*: each key's state goes to its new owner's worker.
  (6) *Apply*: every worker switches its routers, sends what it held and what waits in
  its lanes by the new owners, and lifts the fence. (7) *Resume* the spouts.

A worker that dies (``kill -9``) before the commit abandons the rescale: the keys
taken go back to the tasks they came from, a task opened is stopped, the fence is
lifted with the old routes, and the supervisor starts the dead worker again from the
unchanged layout. After the commit the rescale goes on with the living workers and
the dead one comes back from the new layout. Either way, with acking on, the tuples
the dead worker held time out at their spouts and are replayed: nothing is lost (its
keyed state is, as it is without a rescale; with checkpoints on, every worker rolls
back to the last checkpoint, which records the layout it was taken with).
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from topo.groupings import KEY_GROUPS, spread_key_groups
from runtime.local.placement import Layout

log = logging.getLogger("topo.rescaling")

_POLL_S = 0.01

# send(worker, command) -> False if the worker is gone; reply(worker, kind) -> its reply or None.
Send = Callable[[int, tuple[Any, ...]], bool]
Reply = Callable[[int, str], Any]


@dataclass
class Rescale:
    """What one rescale did: ``task`` is the task added or removed (None: declined, ``why``)."""

    kind: str                    # "add" | "remove"
    component: str
    task: int | None
    tasks_after: int
    paused_ms: float = 0.0       # spouts held (keyed rescales only)
    why: str = ""
    asked_by: int | None = None  # the worker whose adaptive driver asked (None: ``request_scale``)


class Abandoned(Exception):
    """A worker died, or the component did not drain in time, before the commit."""


class Rescaler:
    """Carries out rescales over ``workers`` worker processes, keeping ``layout``."""

    def __init__(self, layout: Layout, keyed: Callable[[str], bool], send: Send, reply: Reply,
                 timeout_s: float, on_phase: Callable[[str, str], None] | None = None) -> None:
        self.layout = layout
        self.keyed = keyed
        self._send = send
        self._reply = reply
        self.timeout_s = timeout_s
        self.on_phase = on_phase       # (phase, component): for tests that kill a worker mid-way

    # --- what the supervisor calls ---------------------------------------------------
    def add(self, component: str) -> Rescale:
        layout = self.layout
        ids = layout.task_ids[component]
        tid, worker = layout.next_id, layout.worker_for_new_task(component)
        layout.next_id += 1
        self._phase("open", component)
        if not self._ask(worker, ("rs_open", component, tid), "rs_open"):
            return Rescale("add", component, None, len(ids), why=f"worker {worker} could not open task {tid}")
        if not self.keyed(component):
            self._commit(component, [*ids, tid], None, {tid: worker})
            self._everyone(("rs_apply", component, layout.task_ids[component], None, {tid: worker}), "rs_apply")
            return Rescale("add", component, tid, len(layout.task_ids[component]))
        new_ids = [*ids, tid]
        owners = spread_key_groups(self._owners(component), new_ids)
        return self._move("add", component, new_ids, owners, {tid: worker}, opened=(worker, tid))

    def remove(self, component: str) -> Rescale:
        layout = self.layout
        ids = list(layout.task_ids[component])
        if len(ids) <= 1:
            return Rescale("remove", component, None, len(ids), why="one task left")
        victim = ids[-1]
        rest = ids[:-1]
        if self.keyed(component):
            owners = spread_key_groups(self._owners(component), rest)
            return self._move("remove", component, rest, owners, {}, victim=victim)
        self._commit(component, rest, None, {})
        self._everyone(("rs_apply", component, rest, None, {}), "rs_apply")
        self._phase("draining", component)
        why = self._settle(("rs_drained", victim), "rs_drained")
        if why:
            self._commit(component, ids, None, {})          # it stays
            self._everyone(("rs_apply", component, ids, None, {}), "rs_apply")
            return Rescale("remove", component, None, len(ids), why=why)
        self._retire(component, victim)
        return Rescale("remove", component, victim, len(rest))

    # --- a keyed rescale ---------------------------------------------------------------
    def _move(self, kind: str, component: str, ids: list[int], owners: list[int], where: dict[int, int],
              opened: tuple[int, int] | None = None, victim: int | None = None) -> Rescale:
        t0 = time.monotonic()
        taken: list[list[Any]] = []
        before = len(self.layout.task_ids[component])
        try:
            self._phase("fence", component)
            if not self._everyone(("rs_fence", component), "rs_fence"):
                raise Abandoned("a worker is gone")
            self._phase("still", component)
            why = self._settle(("rs_still", component), "rs_still")
            if why:
                raise Abandoned(why)
            self._phase("take", component)
            for w in range(self.layout.workers):
                reply = self._ask(w, ("rs_take", component, owners), "rs_take", whole=True)
                if reply is None:
                    raise Abandoned(f"worker {w} is gone")
                taken += reply[1]
        except Abandoned as e:
            self._abandon(component, taken, opened)
            log.warning("autoscaling: %s %r abandoned: %s", kind, component, e)
            return Rescale(kind, component, None, before, (time.monotonic() - t0) * 1000, str(e))
        self._commit(component, ids, owners, where)
        self._phase("commit", component)
        self._give([[dst, k, v] for _, dst, k, v in taken])
        self._everyone(("rs_apply", component, ids, owners, where), "rs_apply")
        if victim is not None:
            self._retire(component, victim)
        self._everyone(("rs_resume",), "rs_resume")
        ms = (time.monotonic() - t0) * 1000
        log.info("autoscaling: %s %r: %d keys moved, spouts held %.0f ms", kind, component, len(taken), ms)
        task = opened[1] if opened is not None else victim
        return Rescale(kind, component, task, len(ids), ms)

    def _abandon(self, component: str, taken: list[list[Any]], opened: tuple[int, int] | None) -> None:
        """Before the commit: keys back to where they came from, the opened task stopped,
        the fence lifted with the old routes, the spouts on."""
        self._give([[src, k, v] for src, _, k, v in taken])
        self._everyone(("rs_unfence", component), "rs_unfence")
        if opened is not None:
            self._ask(opened[0], ("rs_retire", opened[1]), "rs_retire")
        self._everyone(("rs_resume",), "rs_resume")

    # --- helpers ---------------------------------------------------------------------
    def _owners(self, component: str) -> list[int]:
        """The key groups' owners now (as a scalable fields router starts: group g on task g mod n)."""
        owners = self.layout.key_owners.get(component)
        if owners is not None:
            return list(owners)
        ids = self.layout.task_ids[component]
        return [ids[g % len(ids)] for g in range(KEY_GROUPS)]

    def _commit(self, component: str, ids: Sequence[int], owners: Sequence[int] | None,
                where: dict[int, int]) -> None:
        self.layout.task_ids[component] = list(ids)
        self.layout.owner.update(where)
        if owners is not None:
            self.layout.key_owners[component] = list(owners)

    def _give(self, items: list[list[Any]]) -> None:
        by_worker: dict[int, list[list[Any]]] = {}
        for item in items:
            by_worker.setdefault(self.layout.owner[item[0]], []).append(item)
        for w, part in by_worker.items():
            self._ask(w, ("rs_give", part), "rs_give")

    def _retire(self, component: str, victim: int) -> None:
        self._ask(self.layout.owner[victim], ("rs_retire", victim), "rs_retire")
        self._everyone(("rs_forget", component, victim), "rs_forget")

    def _phase(self, phase: str, component: str) -> None:
        if self.on_phase is not None:
            self.on_phase(phase, component)

    def _ask(self, worker: int, cmd: tuple[Any, ...], kind: str, whole: bool = False) -> Any:
        """One worker's reply to ``cmd`` (its value, or the whole message), None if it is gone."""
        if not self._send(worker, cmd):
            return None
        reply = self._reply(worker, kind)
        if reply is None:
            return None
        return reply if whole else reply[1]

    def _everyone(self, cmd: tuple[Any, ...], kind: str) -> bool:
        """``cmd`` to every worker, then every reply: False if one is gone (the others did it)."""
        sent = [w for w in range(self.layout.workers) if self._send(w, cmd)]
        ok = len(sent) == self.layout.workers
        for w in sent:
            if self._reply(w, kind) is None:
                ok = False
        return ok

    def _settle(self, cmd: tuple[Any, ...], kind: str) -> str:
        """Ask every worker until all answer a mark (not None) and the same marks twice in a
        row, within ``timeout_s``: "" then, else why not (a worker gone, or the time)."""
        deadline = time.monotonic() + self.timeout_s
        last = None
        while time.monotonic() < deadline:
            marks = []
            for w in range(self.layout.workers):
                reply = self._reply(w, kind) if self._send(w, cmd) else None
                if reply is None:
                    return f"worker {w} is gone"
                marks.append(reply[1])
            if all(m is not None for m in marks) and marks == last:
                return ""
            last = marks
            time.sleep(_POLL_S)
        return "the component did not drain within drain_timeout_s"
