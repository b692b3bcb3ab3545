"""Failures in user code, logged so none is silent and none floods the log.

Every failure of a task's ``execute`` / ``next_tuple`` / ``tick`` goes through its
``FailureLog``: the first ``log_first`` are logged one by one (the first three
with their traceback), after that only a count per ``interval_s`` with the last
error, so a bolt that fails every tuple costs a line every few seconds, not one
per tuple, and still says what it is doing. The clock is injected for tests.
"""
from __future__ import annotations

import logging
import time
from typing import Callable

_TRACEBACKS = 3


class FailureLog:
    def __init__(self, who: str, log: logging.Logger, *, log_first: int = 10, interval_s: float = 10.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.who = who
        self.log = log
        self.log_first = log_first
        self.interval_s = interval_s
        self.clock = clock
        self.total = 0
        self.unreported = 0
        self.last = ""
        self._next_report = 0.0

    def record(self, what: str, exc: BaseException) -> None:
        """One failure: ``what`` says where (e.g. "execute failed a tuple")."""
        self.total += 1
        self.last = f"{type(exc).__name__}: {exc}"[:300]
        if self.total <= self.log_first:
            self.log.error("%s %s (%d so far): %s", self.who, what, self.total, self.last,
                           exc_info=exc if self.total <= _TRACEBACKS else None)
            if self.total == self.log_first:
                self._next_report = self.clock() + self.interval_s
            return
        self.unreported += 1
        self.flush()

    def flush(self, force: bool = False) -> None:
        """Log the count of failures not logged yet, once the interval is up (or now)."""
        if self.unreported and (force or self.clock() >= self._next_report):
            self.log.error("%s: %d more failures in the last %.0f s (%d in all); last: %s", self.who,
                           self.unreported, self.interval_s, self.total, self.last)
            self.unreported = 0
            self._next_report = self.clock() + self.interval_s
