"""Every rule of the source-stop policy (Heron's baseline), pure, on a fake clock."""
from __future__ import annotations

import pytest

from backpressure.policy.source_stop import (BECAME_OVERLOADED, BECAME_LIGHT, RESUME, STOP, Outcome, SourceStop,
                                             SourceStopParams)
from topo.config import resolve

P = SourceStopParams(high_mark=1000, low_mark=100, stop_rate=20.0)


def policy() -> SourceStop:
    return SourceStop(P, now=0.0)


def test_params_are_checked_and_read_from_config() -> None:
    with pytest.raises(ValueError):
        SourceStopParams(high_mark=100, low_mark=100)
    with pytest.raises(ValueError):
        SourceStopParams(high_mark=1000, low_mark=100, stop_rate=0.0)
    p = SourceStopParams.from_config(resolve({"queue.high_mark": "1MB", "queue.low_mark": "100KB",
                                              "backpressure.source_stop.stop_rate": 50}))
    assert (p.high_mark, p.low_mark, p.stop_rate) == (1_000_000, 100_000, 50.0)
    assert SourceStopParams.from_config(resolve()).stop_rate == 200.0 == SourceStopParams().stop_rate


def test_at_the_high_mark_the_spouts_stop() -> None:
    s = policy()
    assert s.observe(1, 999, 1.0) == Outcome()
    assert s.observe(1, 1000, 2.0) == Outcome(BECAME_OVERLOADED, STOP)       # "at or over"
    assert s.stopped and s.overloaded == {1} and s.stops == 1


def test_hysteresis_between_the_marks() -> None:
    s = policy()
    s.observe(1, 5000, 0.0)
    for q in (999, 500, 101):
        assert s.observe(1, q, 1.0) == Outcome()      # still overloaded, still stopped
    assert s.stopped
    assert s.observe(1, 100, 2.0) == Outcome(BECAME_LIGHT, RESUME)      # "at or under" the low mark
    assert not s.stopped
    for q in (101, 500, 999):
        assert s.observe(1, q, 3.0) == Outcome()      # rising again, under the high mark: running
    assert not s.stopped


def test_repeated_overload_observations_change_nothing() -> None:
    s = policy()
    s.observe(1, 2000, 0.0)
    assert s.observe(1, 3000, 0.1) == Outcome()
    assert s.stops == 1


def test_resume_only_when_every_overloaded_task_recovered() -> None:
    s = policy()
    assert s.observe(1, 2000, 0.0) == Outcome(BECAME_OVERLOADED, STOP)
    assert s.observe(2, 2000, 0.5) == Outcome(BECAME_OVERLOADED, None)       # already stopped: one episode
    assert s.observe(1, 0, 1.0) == Outcome(BECAME_LIGHT, None)           # task 2 still holds the spouts
    assert s.stopped
    assert s.observe(3, 0, 1.5) == Outcome()                          # never overloaded: no report
    assert s.observe(2, 50, 2.0) == Outcome(BECAME_LIGHT, RESUME)
    assert s.stops == 1


def test_a_task_that_goes_away_no_longer_holds_the_spouts() -> None:
    s = policy()
    s.observe(7, 2000, 0.0)
    assert s.forget(8, 1.0) == Outcome()
    assert s.forget(7, 1.0) == Outcome(BECAME_LIGHT, RESUME)
    assert not s.stopped and not s.overloaded


def test_stopped_time_is_accounted_on_the_injected_clock() -> None:
    s = policy()
    s.observe(1, 2000, 1.0)
    assert s.stopped_for(3.5) == pytest.approx(2.5)
    s.observe(1, 0, 4.0)
    s.observe(1, 2000, 10.0)
    s.observe(1, 0, 10.5)
    assert s.stops == 2
    assert s.stopped_for(20.0) == pytest.approx(3.5)


def test_the_factory_builds_it_from_the_policy_setting() -> None:
    from backpressure.drivers.factory import make_flow_control
    from backpressure.drivers.source_stop import SourceStopFlowControl

    fc = make_flow_control(resolve({"backpressure.policy": "source_stop"}), "t")
    assert isinstance(fc, SourceStopFlowControl) and fc.params.stop_rate == 200.0
