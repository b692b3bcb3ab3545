"""The supervisor of worker processes polls fast only in a run's end phase."""
from __future__ import annotations

from runtime.local.workers import _END_PHASE_POLL_S, _POLL_S, poll_interval


def report(spouts_done: bool, quiescent: bool = False) -> dict[str, object]:
    return {"spouts_done": spouts_done, "quiescent": quiescent, "sent": 0, "received": 0}


def test_the_end_phase_is_polled_faster_than_the_run() -> None:
    assert _END_PHASE_POLL_S < _POLL_S


def test_a_worker_whose_spouts_still_run_keeps_the_usual_poll() -> None:
    assert poll_interval([report(True), report(False)], 2) == _POLL_S


def test_every_worker_done_with_its_spouts_starts_the_end_phase_poll() -> None:
    assert poll_interval([report(True), report(True, quiescent=True)], 2) == _END_PHASE_POLL_S


def test_a_missing_report_keeps_the_usual_poll() -> None:
    """A worker that did not answer (gone, restarting) is not known to be done."""
    assert poll_interval([report(True)], 2) == _POLL_S
