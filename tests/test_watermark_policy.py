"""Every rule of the water-mark policy (document 003, R1-R7 of its docstring), pure, fake clock."""
from __future__ import annotations

import pytest

from backpressure.policy.watermark import (LIFT, SPEEDUP, THROTTLE, Command, MasterPolicy, Report,
                                           TaskWaterMark, WaterMarkParams, source_spouts)
from topo.config import ConfigError, resolve

P = WaterMarkParams(capacity=1000, high=0.8, low=0.2, check_interval=1.0, ramp_steps=4, headroom=0.8,
                    rate_floor=1.0)


def no_rate(task: int) -> float:
    return 0.0


def over(task: int, comp: str, level: float, svc: float, ts: float) -> Report:
    return Report(task, comp, True, level, svc, ts)


def clear(task: int, comp: str, ts: float) -> Report:
    return Report(task, comp, False, 0.1, 0.0, ts)


# -- parameters and configuration --------------------------------------------------------

def test_marks_are_fractions_of_the_capacity() -> None:
    assert (P.high_bytes, P.low_bytes) == (800, 200)
    with pytest.raises(ValueError):
        WaterMarkParams(capacity=1000, high=0.2, low=0.2)
    with pytest.raises(ValueError):
        WaterMarkParams(capacity=0)
    with pytest.raises(ValueError):
        WaterMarkParams(capacity=10, headroom=1.0)


def test_document_003_defaults_and_config_names() -> None:
    cfg = resolve({"queue.hard_bound": "2MB", "queue.high_mark": "1MB"})
    p = WaterMarkParams.from_config(cfg)
    assert (p.capacity, p.high, p.low, p.check_interval) == (2_000_000, 0.8, 0.2, 1.0)
    p = WaterMarkParams.from_config(resolve({"backpressure.water_mark.high": 0.5,
                                             "backpressure.water_mark.low": 0.05,
                                             "backpressure.water_mark.check_interval_ms": 250}))
    assert (p.high, p.low, p.check_interval) == (0.5, 0.05, 0.25)
    with pytest.raises(ConfigError):
        resolve({"backpressure.water_mark.high": 0.3, "backpressure.water_mark.low": 0.4})
    with pytest.raises(ConfigError):
        resolve({"backpressure.water_mark.high": 1.5})


# -- R1, R2: the task side ---------------------------------------------------------------

def test_r1_overloaded_at_the_high_mark_recovered_at_the_low_mark() -> None:
    t = TaskWaterMark(5, "slow", P)
    assert t.observe(0.0, 799) is None
    r = t.observe(0.1, 800, 4000.0)
    assert r == Report(5, "slow", True, 0.8, 4000.0, 0.1)
    for q in (900, 500, 201):                  # hysteresis: nothing between the marks
        assert t.observe(0.2, q) is None
    r = t.observe(0.3, 200)
    assert r is not None and not r.overloaded and r.level == 0.2
    assert t.observe(0.4, 799) is None          # under the high mark again: nothing


def test_r2_an_overloaded_task_re_reports_once_per_check_interval() -> None:
    t = TaskWaterMark(5, "slow", P)
    t.observe(0.0, 900)
    assert t.observe(0.5, 900) is None
    r = t.observe(1.0, 700, 3000.0)
    assert r is not None and r.overloaded and r.level == 0.7 and r.service_rate == 3000.0
    assert t.observe(1.9, 700) is None
    assert t.observe(2.0, 700) is not None


# -- R3: who is throttled ----------------------------------------------------------------

def test_r3_source_spouts_walk_the_dag_upward() -> None:
    inputs = {"a": [], "b": [], "relay": ["a"], "slow": ["relay", "b"], "fast": ["a"], "sink": ["slow"]}
    got = source_spouts(inputs, ["a", "b"])
    assert got["slow"] == {"a", "b"} and got["sink"] == {"a", "b"}
    assert got["relay"] == {"a"} and got["fast"] == {"a"} and got["a"] == {"a"}
    assert source_spouts({"x": ["y"], "y": ["x"]}, []) == {"x": frozenset(), "y": frozenset()}


def master(**sources: list[int]) -> MasterPolicy:
    par = {c: 1 for c in sources}
    return MasterPolicy(P, sources or {"slow": [1]}, par)


def test_r3_only_spouts_feeding_the_overloaded_component_are_throttled() -> None:
    m = master(slow=[1], fast=[2])
    cmds = m.on_report(over(10, "slow", 0.8, 5000.0, 0.0), 0.0, no_rate)
    assert [c.spout for c in cmds] == [1]
    assert m.rate(2) is None and m.throttled


# -- R4: how much -------------------------------------------------------------------------

def test_r4_the_spout_runs_at_the_slow_components_pace_with_headroom() -> None:
    m = MasterPolicy(P, {"slow": [1, 2]}, {"slow": 3})
    cmds = m.on_report(over(10, "slow", 0.8, 5000.0, 0.0), 0.0, no_rate)
    m.on_report(over(11, "slow", 0.8, 4000.0, 0.0), 0.0, no_rate)
    # slowest task 4000/s x 3 tasks, shared by 2 spout tasks, x headroom 0.8
    assert cmds == [Command(1, 0.8 * 7500.0, 4, THROTTLE), Command(2, 0.8 * 7500.0, 4, THROTTLE)]
    assert m.rate(1) == pytest.approx(0.8 * 4000.0 * 3 / 2)


def test_r4_without_a_service_rate_the_spout_rate_is_halved() -> None:
    m = master()
    cmds = m.on_report(over(10, "slow", 0.8, 0.0, 0.0), 0.0, lambda s: 20_000.0)
    assert cmds == [Command(1, 10_000.0, 4, THROTTLE)]


def test_r4_with_nothing_measured_nothing_is_throttled_until_the_next_report() -> None:
    m = master()
    assert m.on_report(over(10, "slow", 0.8, 0.0, 0.0), 0.0, no_rate) == []
    assert m.rate(1) is None
    cmds = m.on_report(over(10, "slow", 0.9, 5000.0, 1.0), 1.0, no_rate)
    assert cmds == [Command(1, 4000.0, 4, THROTTLE)]


def test_r4_never_under_the_floor_and_never_faster() -> None:
    m = master()
    m.on_report(over(10, "slow", 0.8, 0.5, 0.0), 0.0, no_rate)
    assert m.rate(1) == P.rate_floor
    m2 = MasterPolicy(P, {"slow": [1], "other": [1]}, {"slow": 1, "other": 1})
    m2.on_report(over(10, "slow", 0.8, 1000.0, 0.0), 0.0, no_rate)
    assert m2.on_report(over(20, "other", 0.8, 9000.0, 0.0), 0.0, no_rate) == []
    assert m2.rate(1) == pytest.approx(800.0)


# -- R5: still overloaded ------------------------------------------------------------------

def test_r5_a_queue_that_is_not_falling_slows_the_spout_further() -> None:
    m = master()
    m.on_report(over(10, "slow", 0.8, 5000.0, 0.0), 0.0, no_rate)
    cmds = m.on_report(over(10, "slow", 0.85, 5000.0, 1.0), 1.0, no_rate)
    assert cmds == [Command(1, 4000.0 * 0.8, 4, THROTTLE)]
    assert m.on_report(over(10, "slow", 0.6, 5000.0, 2.0), 2.0, no_rate) == []   # falling: keep
    assert m.rate(1) == pytest.approx(3200.0)


# -- R6, R7: release -----------------------------------------------------------------------

def test_r6_ramp_back_in_steps_of_the_wait_then_limiter_off() -> None:
    m = master()
    m.on_report(over(10, "slow", 0.8, 5000.0, 0.0), 0.0, no_rate)     # 4000/s: wait 0.25 ms
    cmds = m.on_report(clear(10, "slow", 3.0), 3.0, no_rate)          # first step at once
    assert cmds == [Command(1, pytest.approx(4000.0 * 4 / 3), 3, SPEEDUP)]
    assert m.advance(3.9) == []
    assert m.advance(4.0) == [Command(1, pytest.approx(8000.0), 2, SPEEDUP)]
    assert m.advance(5.0) == [Command(1, pytest.approx(16000.0), 1, SPEEDUP)]
    assert m.throttled
    assert m.advance(6.0) == [Command(1, None, 0, LIFT)]
    assert m.rate(1) is None and not m.throttled                      # R7
    assert m.advance(7.0) == []


def test_r6_no_ramp_while_another_component_the_spout_feeds_is_overloaded() -> None:
    m = MasterPolicy(P, {"slow": [1], "other": [1]}, {"slow": 1, "other": 1})
    m.on_report(over(10, "slow", 0.8, 5000.0, 0.0), 0.0, no_rate)
    m.on_report(over(20, "other", 0.8, 5000.0, 0.0), 0.0, no_rate)
    assert m.on_report(clear(10, "slow", 1.0), 1.0, no_rate) == []
    assert m.advance(5.0) == []
    assert m.on_report(clear(20, "other", 6.0), 6.0, no_rate)[0].kind == SPEEDUP


def test_r6_no_ramp_while_another_task_of_the_component_is_overloaded() -> None:
    m = MasterPolicy(P, {"slow": [1]}, {"slow": 2})
    m.on_report(over(10, "slow", 0.8, 5000.0, 0.0), 0.0, no_rate)
    m.on_report(over(11, "slow", 0.8, 5000.0, 0.0), 0.0, no_rate)
    assert m.on_report(clear(10, "slow", 1.0), 1.0, no_rate) == []
    assert m.on_report(clear(11, "slow", 2.0), 2.0, no_rate)[0].kind == SPEEDUP


def test_r6_an_overload_during_the_ramp_throttles_again_and_restarts_it() -> None:
    m = master()
    m.on_report(over(10, "slow", 0.8, 5000.0, 0.0), 0.0, no_rate)
    m.on_report(clear(10, "slow", 1.0), 1.0, no_rate)
    m.advance(2.0)                                                        # at 8000/s, k 2
    cmds = m.on_report(over(10, "slow", 0.8, 5000.0, 2.5), 2.5, no_rate)
    assert cmds == [Command(1, pytest.approx(4000.0), 4, THROTTLE)]
    assert m.advance(10.0) == []                                          # not ramping while overloaded


def test_duplicate_and_stale_reports_are_harmless() -> None:
    m = master()
    m.on_report(over(10, "slow", 0.8, 5000.0, 0.0), 0.0, no_rate)
    m.on_report(clear(10, "slow", 1.0), 1.0, no_rate)
    assert m.on_report(clear(10, "slow", 1.1), 1.1, no_rate) == []    # a duplicate recovery
    assert m.advance(2.0)[0].k == 2                                       # the ramp goes on unchanged


def test_a_vanished_task_releases_what_it_held_and_stop_releases_all() -> None:
    m = master()
    m.on_report(over(10, "slow", 0.8, 5000.0, 0.0), 0.0, no_rate)
    assert m.forget(99, 1.0) == []
    assert m.forget(10, 1.0)[0].kind == SPEEDUP
    assert m.release_all() == [Command(1, None, 0, LIFT)]
    assert not m.throttled and m.rate(1) is None


def test_the_factory_builds_it_from_the_policy_setting() -> None:
    from backpressure.drivers.factory import make_flow_control
    from backpressure.drivers.watermark import WatermarkFlowControl

    fc = make_flow_control(resolve({"backpressure.policy": "watermark", "queue.hard_bound": "2MB",
                                    "queue.high_mark": "1MB"}), "t")
    assert isinstance(fc, WatermarkFlowControl)
    assert (fc.params.capacity, fc.params.high_bytes, fc.params.low_bytes) == (2_000_000, 1_600_000, 400_000)
