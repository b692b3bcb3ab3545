"""The seam between an engine and flow control.

An engine hands flow control one ``TaskHandle`` per task. Through it flow control
observes (queue bytes, observed emit rate, the clock) and acts (set or clear the
task's emit rate limit). Flow control never touches a queue or an emitter itself,
and the engine never decides when to throttle: that is the policy's job.
"""
from __future__ import annotations

from typing import Protocol, Sequence


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

    def set_rate(self, tuples_per_second: float) -> None:
        """Limit this task's emits to this rate."""
        ...

    def clear_rate(self) -> None:
        """Turn this task's limiter off: it emits as fast as it can, as before any signal."""
        ...


class FlowControl(Protocol):
    """What an engine drives. ``poll`` is on the hot path and must be cheap."""

    async def start(self, handles: Sequence[TaskHandle]) -> None: ...

    def poll(self, handle: TaskHandle) -> None:
        """Called by a bolt task after each input batch it processed."""
        ...

    async def stop(self) -> None:
        """Release everything this run holds (signals, znodes) and stop timers."""
        ...


class NoFlowControl:
    """Flow control off: only the queues' hard bound limits a producer."""

    async def start(self, handles: Sequence[TaskHandle]) -> None:
        return None

    def poll(self, handle: TaskHandle) -> None:
        return None

    async def stop(self) -> None:
        return None
