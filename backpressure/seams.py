"""The seam between an engine and flow control: everything a driver may use, declared.

An engine hands flow control one ``TaskHandle`` per task. Through it flow control
observes (queue bytes, observed emit rate, executed and emitted counts) and acts (set or clear
the task's emit rate limit), and tells the engine what to *show* about the task
(its step count, backpressure flag and ``originv``, and the signals it counted).
Flow control never touches a queue, an emitter or a stats record itself, and the
engine never decides when to throttle: that is the policy's job.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Literal, Mapping, Protocol, Sequence

Direction = Literal["sent", "received"]

# ``on_rate_change(task_id, rate)`` after every limit a flow control sets (None: limiter off).
RateListener = Callable[[int, "float | None"], None]


@dataclass(frozen=True)
class FlowDisplay:
    """What a policy says about one task for consoles, exporters and ``topo status``.

    ``k``: steps (or stop/ramp count) in force; ``backpressure``: the document's flag;
    ``originv``: the rate before the first step of the last episode (None: never throttled).
    The limit itself is not here: the task shows the rate its limiter really has.
    """

    k: int = 0
    backpressure: bool = False
    originv: float | None = None


class TaskHandle(Protocol):
    """One running task as flow control sees it."""

    task_id: int
    component: str
    upstream_task_ids: Sequence[int]   # direct upstream tasks (those that send to this task)
    is_spout: bool

    def queue_bytes(self) -> int:
        """Bytes (msgpack wire size) currently in this task's input queue; 0 for spouts."""
        ...

    def observed_rate(self) -> float:
        """This task's emit rate in tuples/s, an EWMA over recent seconds."""
        ...

    def executed_count(self) -> int:
        """Input tuples this task has executed so far (0 for spouts): service-rate meters read it."""
        ...

    def emitted_count(self) -> int:
        """Tuples this task has emitted so far: a recent-rate meter reads it (stepwise's
        ``step_from_recent_rate``; a driver not using that never calls it)."""
        ...

    def dry_count(self) -> int:
        """Rounds in which this spout's source had less to give than its limit allowed (0 for bolts): a
        driver reads whether the limit was in use (stepwise's ``dry_release_window``)."""
        ...

    def wait_count(self) -> int:
        """Emits that found this task's limit binding (its limiter made it wait, however briefly): a driver
        reads since when the limit has been in use (stepwise's ``release_after_limit_in_use``)."""
        ...

    def set_rate(self, tuples_per_second: float | None) -> None:
        """Limit this task's emits to this rate; None turns the limiter off (as before any signal)."""
        ...

    def show(self, display: FlowDisplay) -> None:
        """Publish the policy's view of this task for display (one call per change)."""
        ...

    def count_signal(self, direction: Direction, kind: str) -> None:
        """Count one flow-control signal of ``kind`` this task sent or received."""
        ...


class FlowControl(Protocol):
    """What an engine drives. ``poll`` is on the hot path and must be cheap."""

    on_rate_change: RateListener | None   # benchmarks and tests listen to every limit change

    async def start(self, handles: Sequence[TaskHandle]) -> None: ...

    def poll(self, handle: TaskHandle) -> None:
        """Called by a bolt task after each input batch it processed."""
        ...

    async def stop(self) -> None:
        """Release everything this run holds (signals, znodes) and stop timers."""
        ...


class NoFlowControl:
    """Flow control off: only the queues' hard bound limits a producer."""

    def __init__(self) -> None:
        self.on_rate_change: RateListener | None = None   # never called: no limit is ever set

    async def start(self, handles: Sequence[TaskHandle]) -> None:
        return None

    def poll(self, handle: TaskHandle) -> None:
        return None

    async def stop(self) -> None:
        return None


# --- optional engine capabilities (documents 002 and 004) ----------------------------
# A flow control that can use one of these has an attribute of that name (``scaler``,
# ``share_router``, ``window_gate``) set to None; an engine that offers the capability
# assigns it before ``start``. Without it the driver logs and counts each decision.


class Scaler(Protocol):
    """Adds or removes a parallel task of a running component (document 004's management node).

    ``add_task`` returns the new task's handle once it runs (its upstreams already route
    to it); ``remove_task`` drains one task of the component and returns its id. Both
    return None when the engine declines (at ``max_parallelism`` or one task, while
    stopping, or when the topology did not drain in time); what it could not keep exact
    (fields grouping into state it cannot move) it refuses before the run. The engine
    keeps every task's ``upstream_task_ids`` view consistent.
    """

    async def add_task(self, component: str) -> TaskHandle | None: ...

    async def remove_task(self, component: str) -> int | None: ...


class ShareRouter(Protocol):
    """Weights one upstream task's routing to the tasks of one downstream component.

    ``shares`` maps downstream task ids to fractions summing to 1; the engine applies
    them on shuffle-like edges only (never fields, all or global) and returns whether it
    did.
    """

    def set_shares(self, upstream_task_id: int, component: str, shares: Mapping[int, float]) -> bool: ...


class WindowGate(Protocol):
    """Per-downstream-task send windows on a spout's tracked tuples (document 002).

    The engine routes, the flow control keeps the windows. When a spout's batches go
    out the engine asks the flow control's ``room(spout, target)`` (tuples the window
    towards ``target`` still admits) and sends no more tracked tuples than that; it
    reports each one sent with ``on_sent(spout, target, root, now, resend_of)`` and each
    outcome with ``on_acked(spout, root, now)`` or ``on_failed(spout, root, now)``
    (which returns the busy task); a failed tuple's replay goes to
    ``resend_target(spout, busy)`` (None: where the grouping puts it) and waits there
    for room. Through this protocol the engine says it does all that, and which
    downstream components a spout feeds by a grouping that fixes a tuple's task.
    """

    def routes_tracked_tuples(self) -> bool: ...

    def keyed_components(self, spout: int) -> frozenset[str]:
        """Components ``spout`` feeds where a tuple may not move to another task (fields,
        all, global): there a BUSY tuple waits for its own task."""
        ...

    def track_ack_points(self, keep: Callable[[int, int, Any], None]) -> frozenset[int]:
        """From now on report ``keep(spout, point, state)`` each time a spout's cumulative ack
        point over the order it emitted moves (``state``: the spout's state there); returns
        the spouts that can (a spout with state, and no checkpoints: those resume the spouts)."""
        ...

    def restore_spout(self, spout: int, state: Any) -> bool:
        """Before the spout runs: put it back at a state ``keep`` was given by an earlier run."""
        ...
