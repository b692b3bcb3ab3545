"""Running a blocking ``execute`` off the event loop (a bolt with ``blocking = True``).

A plain ``execute`` that blocks (a synchronous HTTP call, a sleep) stops every task
of the process, signals included, and cannot be cancelled. A blocking bolt's
``execute`` runs instead on one worker thread of its own task, one tuple at a time
(so the bolt still sees one tuple at a time, as Storm promises), and the task awaits
it. When the call overruns ``execute_timeout_s`` the task stops waiting, fails the
tuple and goes on with a fresh thread: the stuck call is abandoned, not killed
(Python cannot kill a thread), and its daemon thread does not keep the process alive.
"""
from __future__ import annotations

import asyncio
import queue
import threading
from typing import Any, Callable

_STOP = object()


class BlockingRunner:
    """One daemon thread that runs calls handed to it, in order."""

    def __init__(self, name: str) -> None:
        self._calls: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)
        self._thread.start()

    def _work(self) -> None:
        while True:
            item = self._calls.get()
            if item is _STOP:
                return
            fn, arg, loop, fut = item
            try:
                result, exc = fn(arg), None
            except BaseException as e:  # handed to the awaiting task, which decides
                result, exc = None, e
            try:
                loop.call_soon_threadsafe(_settle, fut, result, exc)
            except RuntimeError:
                return  # the loop is closed: the run ended while this call was stuck

    def run(self, fn: Callable[[Any], Any], arg: Any) -> "asyncio.Future[Any]":
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._calls.put((fn, arg, loop, fut))
        return fut

    def close(self) -> None:
        """Let the thread end after its current call (if it ever returns)."""
        self._calls.put(_STOP)


def _settle(fut: "asyncio.Future[Any]", result: Any, exc: BaseException | None) -> None:
    if fut.done():
        return  # the task gave up on this call (timeout or stop)
    if exc is not None:
        fut.set_exception(exc)
    else:
        fut.set_result(result)
