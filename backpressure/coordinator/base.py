"""How signals travel (document 000, figures 2 and 3), written once over a znode store.

The document's message path, under ``/<root>/<topology>/``:

1. a task puts a signal on the **send-queue** (``Coordinator.send``, never waits);
2. the **znode-create handler** takes it off and creates a persistent sequential
   znode ``taskmessage/m<target>-<sequence>`` holding the msgpack signal;
3. the **znode-delete handler** watches ``taskmessage/``, reads the znodes of the
   targets this process runs in sequence order, hands each message to the
   **trigger-queue** and deletes the znode;
4. the target upstream takes its own messages off the trigger-queue (the flow
   control does that, and checks ``target`` again);
5. each task publishes its state under ``taskstate/<task_id>`` (an ephemeral
   znode, so it vanishes with the process that owns it);
6. every task watches ``taskstate/`` (one watch per process, fanned out).

One run per topology name: before anything else a process claims each of its tasks
with an ephemeral znode ``tasklock/<task_id>`` holding who it is (host, pid, start
time). Two runs of one topology under one root would consume each other's signals
and throttle each other, so a claim held by another live run refuses the start with
``RunConflict`` (one line naming the holder). Processes that share a topology by
running disjoint tasks do not conflict. A claim is ephemeral, so a dead run's claim
goes with its session; until then (a ZooKeeper session outlives a killed process by
up to its timeout) a claim whose holder is a process on this host that no longer
exists is waited out for ``claim_wait`` seconds; a holder on another host cannot be
checked and refuses the start at once (the message says its claim expires with its
session). After a session expiry a run claims its tasks again.

The target's id is in the znode *name* so that several processes sharing one
ZooKeeper each consume only their own tasks' messages without reading the rest.
``ZnodeLayout`` spells these paths; the coordinators and ``topo status`` use it.

The store is ZooKeeper (``zookeeper.KazooStore``) or an in-process tree with the
same paths, sequence numbers and one-shot watches (``embedded.MemoryStore``), so
one class carries both and the same tests run against both.

Robustness: the send-queue keeps only the newest signal per (source, target)
pair (signals carry absolute step counts, so the newest one says everything) and
survives a disconnection; every store call that fails for want of a connection is
retried once the session is back; after any reconnection the process re-publishes
its tasks' states, re-arms its watches and re-reads ``taskmessage/`` and
``taskstate/`` in full. A znode whose payload is malformed or over the size limit
is logged and deleted (messages) or ignored (states).
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import socket
import time
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Callable, Iterable, Protocol, TypeVar

from backpressure.signals import Signal, SignalError, TaskState

log = logging.getLogger(__name__)

CONNECTED = "connected"
SUSPENDED = "suspended"
LOST = "lost"

CHILD = "child"
CHANGED = "changed"
DELETED = "deleted"
CREATED = "created"
SESSION = "session"


class NoNode(Exception):
    """The znode does not exist."""


class NodeExists(Exception):
    """The znode already exists."""


class StoreUnavailable(Exception):
    """No session right now (connection lost, session expired, store closed)."""


class NotAuthorized(Exception):
    """ZooKeeper refused an operation (NoAuth) or a tree's ACL is not this run's: one line, no secret."""


class CredentialsError(Exception):
    """ZooKeeper credentials cannot be read or are malformed: one line that never shows them."""


class RunConflict(Exception):
    """Another live run holds this topology's tasks under the same root: one line saying whose."""


@dataclass(frozen=True)
class WatchEvent:
    """A one-shot watch firing: ``type`` is one of CHILD, CHANGED, DELETED, CREATED, SESSION."""

    type: str
    path: str | None


Watcher = Callable[[WatchEvent], None]


class Store(Protocol):
    """The few ZooKeeper calls the coordinator needs; watches are one-shot and are
    called on the event loop; ``listen`` gets CONNECTED / SUSPENDED / LOST."""

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    def listen(self, callback: Callable[[str], None]) -> None: ...

    async def create(self, path: str, data: bytes = b"", *, ephemeral: bool = False,
                     sequence: bool = False, makepath: bool = False) -> str: ...

    async def get(self, path: str, watch: Watcher | None = None) -> bytes: ...

    async def set(self, path: str, data: bytes) -> None: ...

    async def delete(self, path: str) -> None: ...

    async def children(self, path: str, watch: Watcher | None = None) -> list[str]: ...


R = TypeVar("R", Signal, TaskState)
StateCallback = Callable[[int, "TaskState | None"], None]

DEFAULT_ROOT = "/topo"
_MSG_NAME = re.compile(r"^m(\d+)-(\d{10,})$")


@dataclass(frozen=True)
class ZnodeLayout:
    """Where one topology's znodes live; the only place their paths are spelled.

    * ``{root}/{topology}/taskmessage/m<target>-<sequence>``: persistent sequential
      znodes, one per signal, the target task's id in the name;
    * ``{root}/{topology}/taskstate/<task_id>``: one ephemeral znode per task;
    * ``{root}/{topology}/tasklock/<task_id>``: the ephemeral claim of the run that
      runs the task (one run per topology name);
    * ``{root}/{topology}/resumepoint/<task_id>``: a persistent znode per spout task, where
      it resumes after a restart (document 002's ack point, ``drivers.resume_points``).
    """

    topology: str
    root: str = DEFAULT_ROOT

    def __post_init__(self) -> None:
        if not self.topology or "/" in self.topology:
            raise ValueError(f"bad topology name for a znode path: {self.topology!r}")

    @property
    def base(self) -> str:
        return f"{self.root.rstrip('/')}/{self.topology}"

    @property
    def messages(self) -> str:
        """The ``taskmessage`` directory."""
        return f"{self.base}/taskmessage"

    @property
    def states(self) -> str:
        """The ``taskstate`` directory."""
        return f"{self.base}/taskstate"

    @property
    def locks(self) -> str:
        """The ``tasklock`` directory."""
        return f"{self.base}/tasklock"

    def lock(self, task: int | str) -> str:
        """The claim znode of ``task``."""
        return f"{self.locks}/{task}"

    def state(self, task: int | str) -> str:
        """The state znode of ``task`` (an id, or a child name read from ``states``)."""
        return f"{self.states}/{task}"

    def resume_point(self, task: int) -> str:
        """The persistent resume point of spout task ``task``."""
        return f"{self.base}/resumepoint/{task}"

    def message(self, name: str) -> str:
        """The message znode called ``name`` (a child name read from ``messages``)."""
        return f"{self.messages}/{name}"

    def message_prefix(self, target: int) -> str:
        """What a sequential create for ``target`` is given; the store appends the sequence."""
        return f"{self.messages}/m{target}-"

    @staticmethod
    def parse_message(name: str) -> tuple[int, int] | None:
        """``m<target>-<sequence>`` -> (target, sequence); None for any other name."""
        m = _MSG_NAME.match(name)
        return (int(m.group(1)), int(m.group(2))) if m else None


class SendQueue:
    """The send-queue: FIFO of signals, keeping only the newest per (source, target)."""

    def __init__(self) -> None:
        self._items: OrderedDict[tuple[int, int], Signal] = OrderedDict()
        self._ready = asyncio.Event()

    def put(self, sig: Signal) -> None:
        self._items[(sig.source, sig.target)] = sig
        self._ready.set()

    def putback(self, sig: Signal) -> None:
        """Return an unsent signal to the front unless a newer one for the pair is queued."""
        key = (sig.source, sig.target)
        if key not in self._items:
            self._items[key] = sig
            self._items.move_to_end(key, last=False)
            self._ready.set()

    async def get(self) -> Signal:
        while not self._items:
            self._ready.clear()
            await self._ready.wait()
        return self._items.popitem(last=False)[1]

    def __len__(self) -> int:
        return len(self._items)


class Coordinator:
    """Carries signals and task states between tasks through a ``Store``."""

    def __init__(self, store: Store, topology: str, root: str = DEFAULT_ROOT, *, claim_wait: float = 0.0) -> None:
        self.store = store
        self.layout = ZnodeLayout(topology, root)
        self.claim_wait = claim_wait               # how long a dead local holder's claim is waited out
        self.claim = json.dumps({"host": socket.gethostname(), "pid": os.getpid(),
                                 "started": round(time.time(), 3)}).encode()
        self._claimed: set[int] = set()
        self.send_queue = SendQueue()
        self.trigger_queue: asyncio.Queue[Signal] = asyncio.Queue()
        self.connected = asyncio.Event()
        self.counters = {"created": 0, "consumed": 0, "malformed": 0, "resyncs": 0, "retries": 0,
                         "tampered": 0, "refused": 0}
        self._tamper_said: set[str] = set()
        self._recent: dict[int, deque[bytes]] = {}  # our last payloads per local task (tamper check)
        self._written: set[int] = set()             # local tasks whose state we have written
        self._local: set[int] = set()
        self._on_state: StateCallback = lambda task, state: None
        self._published: dict[int, bytes] = {}     # last payload per local task (re-publish)
        self._dirty: dict[int, bytes] = {}         # payloads waiting to be written
        self._publishing: set[int] = set()
        self._known_states: set[int] = set()
        self._reading: set[str] = set()
        self._reread: set[str] = set()
        self._undeleted: set[str] = set()          # handed over, delete still to do
        self._msg_wake = asyncio.Event()
        self._state_wake = asyncio.Event()
        self._pub_wake = asyncio.Event()
        self._busy = 0                             # create/publish calls in flight
        self._tasks: list[asyncio.Task[None]] = []
        self._started = False
        self._closing = False
        self._outage = False

    # -- life cycle -------------------------------------------------------------------

    async def start(self, local_tasks: Iterable[int], on_state: StateCallback) -> None:
        """Connect, purge stale messages for our tasks, read every state, start the handlers."""
        self._local = set(local_tasks)
        self._on_state = on_state
        self.store.listen(self._on_session)
        await self.store.start()
        self.connected.set()
        try:
            await self._check_tree()
            await self._make_tree()
            await self._claim_tasks()
        except BaseException:
            await self._release_claims()
            await self.store.close()
            raise
        await self._purge_stale_messages()
        self._started = True
        for coro in (self._create_handler(), self._delete_handler(), self._state_reader(),
                     self._state_publisher()):
            self._tasks.append(asyncio.create_task(coro))
        self._msg_wake.set()
        self._state_wake.set()
        await self.read_states_once()

    async def _check_tree(self) -> None:
        """Refuse a tree this coordinator must not use (ZooKeeper: an ACL not its own)."""

    async def _make_tree(self) -> None:
        for path in (self.layout.messages, self.layout.states, self.layout.locks):
            try:
                await self.store.create(path, b"", makepath=True)
            except NodeExists:
                pass

    def tampered(self, what: str) -> None:
        """Another client changed this topology's znodes under our feet: say so (once per kind)."""
        self.counters["tampered"] += 1
        if what not in self._tamper_said:
            self._tamper_said.add(what)
            log.error("topology %r: %s under %s by another client while this run was using it; "
                      "protect the tree with credentials (TOPO_ZK_AUTH or zookeeper.auth_file)",
                      self.layout.topology, what, self.layout.base)

    async def _tree_gone(self) -> None:
        self.tampered("its znodes were deleted")
        try:
            await self._make_tree()
        except NoNode:
            pass

    async def stop(self, flush_timeout: float = 2.0) -> None:
        """Flush what is queued (bounded), remove our state znodes, close the session."""
        if not self._started:
            return
        await self.flush(flush_timeout)
        self._closing = True
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        for task in list(self._published):
            try:
                await asyncio.wait_for(self.store.delete(self.layout.state(task)), 0.5)
            except (NoNode, StoreUnavailable, asyncio.TimeoutError):
                pass
        await self._release_claims()
        await self.store.close()
        self._started = False
        if self.counters["tampered"]:
            log.error("topology %r: its znodes under %s were changed by another client %d time(s) during this run",
                      self.layout.topology, self.layout.base, self.counters["tampered"])

    # -- one run per topology name -----------------------------------------------------

    async def _claim_tasks(self) -> None:
        """Create ``tasklock/<task>`` for each local task; ``RunConflict`` if another live
        run holds one (a dead holder on this host is waited out for ``claim_wait``)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.claim_wait
        waiting_said = False
        for task in sorted(self._local):
            while True:
                try:
                    await self.store.create(self.layout.lock(task), self.claim, ephemeral=True)
                    self._claimed.add(task)
                    break
                except NodeExists:
                    pass
                try:
                    held = await self.store.get(self.layout.lock(task))
                except NoNode:
                    continue                        # gone meanwhile: claim it
                holder = _holder(held)
                if _gone_from_this_host(holder) and loop.time() < deadline:
                    if not waiting_said:
                        log.warning("topology %r: task %d is still claimed by pid %s, which has exited; waiting "
                                    "up to %.0fs for its session to expire", self.layout.topology, task,
                                    holder.get("pid"), self.claim_wait)
                        waiting_said = True
                    await asyncio.sleep(0.2)
                    continue
                raise RunConflict(self._conflict(task, holder))

    def _conflict(self, task: int, holder: dict) -> str:
        where = getattr(self.store, "hosts", None)
        under = f"{where}{self.layout.root}" if where else self.layout.root
        since = (time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(holder["started"]))
                 if isinstance(holder.get("started"), (int, float)) else "an unknown time")
        who = (f"pid {holder.get('pid')} on host {holder.get('host')} since {since}" if holder
               else "a run that did not say who it is")
        return (f"topology {self.layout.topology!r} is already running under {under}: task {task} is held by "
                f"{who}; stop that run first or give this one another name (the claim of a run that died "
                "goes with its ZooKeeper session)")

    async def _release_claims(self) -> None:
        for task in sorted(self._claimed):
            try:
                await asyncio.wait_for(self.store.delete(self.layout.lock(task)), 0.5)
            except (NoNode, StoreUnavailable, asyncio.TimeoutError):
                pass
        self._claimed.clear()

    async def _reclaim(self) -> None:
        """After a session expiry our claims are gone: take them again."""
        for task in sorted(self._claimed):
            try:
                await self.store.create(self.layout.lock(task), self.claim, ephemeral=True)
            except NodeExists:
                try:
                    held = await self.store.get(self.layout.lock(task))
                except (NoNode, StoreUnavailable):
                    continue
                if held != self.claim:
                    log.error("topology %r: task %d was claimed by another run while our session was gone: %s",
                              self.layout.topology, task, self._conflict(task, _holder(held)))
            except StoreUnavailable:
                return                              # the next reconnection tries again

    async def flush(self, timeout: float) -> bool:
        """Wait until the send-queue and pending state writes are empty; False on timeout."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while len(self.send_queue) or self._dirty or self._busy:
            if loop.time() >= deadline:
                return False
            await asyncio.sleep(0.005)
        return True

    # -- what the flow control calls ---------------------------------------------------

    def send(self, sig: Signal) -> None:
        """Put a signal on the send-queue; returns at once."""
        self.send_queue.put(sig)

    def publish(self, state: TaskState) -> None:
        """Queue ``state`` for ``taskstate/<task>``; newer publishes of a task replace older ones."""
        payload = state.encode()
        self._recent.setdefault(state.task, deque(maxlen=32)).append(payload)
        self._published[state.task] = payload
        self._dirty[state.task] = payload
        self._pub_wake.set()

    # -- persistent records (they outlive the run: a restarted one reads them) ---------------

    async def save_record(self, path: str, payload: bytes) -> None:
        """Create or overwrite the persistent znode ``path`` (a path of ``layout``)."""
        await self._upsert(path, payload, ephemeral=False)

    async def read_record(self, path: str) -> bytes | None:
        try:
            return await self.store.get(path)
        except NoNode:
            return None

    async def drop_record(self, path: str) -> None:
        try:
            await self.store.delete(path)
        except NoNode:
            pass

    async def read_states_once(self) -> dict[int, TaskState]:
        """Read every task state now and hand each to the state callback."""
        out: dict[int, TaskState] = {}
        while True:
            try:
                names = await self.store.children(self.layout.states)
                break
            except StoreUnavailable:
                await self._await_connection()
        for name in names:
            if not name.isdigit():
                continue
            try:
                state = await self._read_state(name, watch=False)
            except StoreUnavailable:
                continue        # the resync after reconnection reads it
            if state is not None:
                out[state.task] = state
        return out

    # -- the handlers ------------------------------------------------------------------

    async def _create_handler(self) -> None:
        """znode-create handler: send-queue -> sequential znodes under taskmessage/."""
        while True:
            sig = await self.send_queue.get()
            self._busy += 1
            try:
                await self.store.create(self.layout.message_prefix(sig.target), sig.encode(), sequence=True)
                self.counters["created"] += 1
            except NoNode:
                self.send_queue.putback(sig)
                await self._tree_gone()
            except NotAuthorized as e:
                self._refused(e)
            except StoreUnavailable:
                # A create lost with the connection may have happened anyway: a duplicate
                # is harmless (the target ignores a seq it has applied).
                self.send_queue.putback(sig)
                await self._await_connection()
            finally:
                self._busy -= 1

    async def _delete_handler(self) -> None:
        """znode-delete handler: read our targets' znodes in order, trigger, delete."""
        while True:
            await self._msg_wake.wait()
            self._msg_wake.clear()
            try:
                await self._drain_messages()
            except NoNode:
                await self._tree_gone()
                self._msg_wake.set()
            except NotAuthorized as e:
                self._refused(e)
                await asyncio.sleep(1.0)
            except StoreUnavailable:
                self._msg_wake.set()
                await self._await_connection()

    async def _drain_messages(self) -> None:
        names = await self.store.children(self.layout.messages, watch=self._on_msg_watch)
        mine = sorted((parsed[1], name, parsed[0])
                      for name in names if (parsed := self.layout.parse_message(name)) and parsed[0] in self._local)
        self._undeleted &= set(names)
        for _, name, target in mine:
            path = self.layout.message(name)
            if name not in self._undeleted:
                try:
                    data = await self.store.get(path)
                except NoNode:
                    continue
                sig = self._decode(Signal, data, path, "target", target)
                if sig is not None:
                    self.trigger_queue.put_nowait(sig)
                    self.counters["consumed"] += 1
                self._undeleted.add(name)
            try:
                await self.store.delete(path)
            except NoNode:
                pass
            self._undeleted.discard(name)

    async def _purge_stale_messages(self) -> None:
        """Messages left for our task ids by an earlier run would carry foreign seqs."""
        for name in await self.store.children(self.layout.messages):
            parsed = self.layout.parse_message(name)
            if parsed and parsed[0] in self._local:
                try:
                    await self.store.delete(self.layout.message(name))
                except NoNode:
                    pass

    async def _state_publisher(self) -> None:
        while True:
            await self._pub_wake.wait()
            self._pub_wake.clear()
            while self._dirty:
                task, payload = next(iter(self._dirty.items()))
                del self._dirty[task]
                self._busy += 1
                try:
                    await self._upsert(self.layout.state(task), payload)
                    self._written.add(task)
                except NoNode:
                    self._dirty.setdefault(task, payload)
                    await self._tree_gone()
                except NotAuthorized as e:
                    self._refused(e)
                except StoreUnavailable:
                    self._dirty.setdefault(task, payload)
                    await self._await_connection()
                finally:
                    self._busy -= 1

    async def _upsert(self, path: str, payload: bytes, *, ephemeral: bool = True) -> None:
        try:
            await self.store.set(path, payload)
        except NoNode:
            try:
                await self.store.create(path, payload, ephemeral=ephemeral, makepath=not ephemeral)
            except NodeExists:
                await self.store.set(path, payload)

    async def _state_reader(self) -> None:
        """Watch taskstate/ children; each child gets its own data watch."""
        while True:
            await self._state_wake.wait()
            self._state_wake.clear()
            try:
                names = await self.store.children(self.layout.states, watch=self._on_state_children)
            except NoNode:
                await self._tree_gone()
                self._state_wake.set()
                continue
            except NotAuthorized as e:
                self._refused(e)
                await asyncio.sleep(1.0)
                self._state_wake.set()
                continue
            except StoreUnavailable:
                self._state_wake.set()
                await self._await_connection()
                continue
            present = {int(n) for n in names if n.isdigit()}
            for task in self._known_states - present:
                self._state_gone(task)
            for name in names:
                if name.isdigit() and int(name) not in self._known_states:
                    self._refresh(name)

    def _refresh(self, name: str) -> None:
        if name in self._reading:
            self._reread.add(name)
            return
        self._reading.add(name)
        asyncio.get_running_loop().create_task(self._refresh_loop(name))

    async def _refresh_loop(self, name: str) -> None:
        try:
            while True:
                self._reread.discard(name)
                try:
                    await self._read_state(name, watch=True)
                except StoreUnavailable:
                    return      # the resync after reconnection reads it again
                if name not in self._reread:
                    return
        finally:
            self._reading.discard(name)

    async def _read_state(self, name: str, watch: bool) -> TaskState | None:
        task = int(name)
        try:
            data = await self.store.get(self.layout.state(name), watch=self._on_state_data if watch else None)
        except NoNode:
            self._state_gone(task)
            return None
        if task in self._written and data not in self._recent.get(task, ()) and not self._closing:
            self.tampered(f"the state of its task {task} was overwritten")
            self._dirty.setdefault(task, self._published[task])
            self._pub_wake.set()
            return None
        state = self._decode(TaskState, data, self.layout.state(name), "task", task)
        if state is None:
            return None
        self._known_states.add(task)
        self._on_state(task, state)
        return state

    def _decode(self, kind: type[R], data: bytes, path: str, attr: str, owner: int) -> R | None:
        """Decode a znode's payload; a malformed one (or one whose ``attr`` disagrees with
        the task its path names) is counted, logged and skipped."""
        try:
            rec = kind.decode(data)  # type: ignore[attr-defined]
            if getattr(rec, attr) != owner:
                raise SignalError(f"{attr} {getattr(rec, attr)} does not match the znode's task {owner}")
        except SignalError as e:
            self.counters["malformed"] += 1
            log.warning("skipping malformed znode %s: %s", path, e)
            return None
        return rec

    def _state_gone(self, task: int) -> None:
        if task not in self._known_states and task not in self._local:
            return
        self._known_states.discard(task)
        if task in self._local and task in self._published and not self._closing:
            # Our own ephemeral node went with an expired session: put it back.
            self._dirty.setdefault(task, self._published[task])
            self._pub_wake.set()
            return
        self._on_state(task, None)

    # -- watches and session events (called on the event loop) --------------------------

    def _on_msg_watch(self, event: WatchEvent) -> None:
        if event.type != SESSION:
            self._msg_wake.set()

    def _on_state_children(self, event: WatchEvent) -> None:
        if event.type != SESSION:
            self._state_wake.set()

    def _on_state_data(self, event: WatchEvent) -> None:
        if event.type == SESSION or event.path is None:
            return
        name = event.path.rsplit("/", 1)[-1]
        if event.type == DELETED:
            self._state_gone(int(name))
        self._refresh(name)

    def _on_session(self, state: str) -> None:
        if state != CONNECTED:
            self.connected.clear()
            self._outage = True
            return
        self.connected.set()
        if self._outage and self._started and not self._closing:
            self._outage = False
            self.counters["resyncs"] += 1
            self._dirty.update(self._published)
            self._pub_wake.set()
            self._known_states_resync()
            self._tasks.append(asyncio.get_running_loop().create_task(self._reclaim()))

    def _known_states_resync(self) -> None:
        """After a reconnection every watch is gone: re-arm them all and re-read."""
        self._msg_wake.set()
        self._state_wake.set()
        for task in list(self._known_states):
            self._refresh(str(task))

    def _refused(self, error: Exception) -> None:
        self.counters["refused"] += 1
        if self.counters["refused"] == 1:
            log.error("topology %r: %s", self.layout.topology, error)

    async def _await_connection(self) -> None:
        self.counters["retries"] += 1
        try:
            await asyncio.wait_for(self.connected.wait(), 1.0)
        except asyncio.TimeoutError:
            pass
        await asyncio.sleep(0.01)


def _holder(data: bytes) -> dict:
    """Who holds a claim (``{}`` when its payload does not say)."""
    try:
        holder = json.loads(data)
    except ValueError:
        return {}
    return holder if isinstance(holder, dict) else {}


def _gone_from_this_host(holder: dict) -> bool:
    """True when the holder ran on this host and its process no longer exists."""
    pid = holder.get("pid")
    if holder.get("host") != socket.gethostname() or not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False            # exists, owned by someone else
    return False
