"""The drivers' windowed counter (stepwise's recent emits, adaptive's and the water-mark
policy's executed counts): what a count grew by since the newest sample at least a window old."""
from __future__ import annotations

import pytest

from backpressure.drivers.count_window import CountWindow


def test_a_count_window_counts_over_the_newest_sample_at_least_a_window_old() -> None:
    meter = CountWindow(window=0.25)
    assert meter.since_oldest(0.0, 0) is None            # nothing sampled yet
    for i in range(9):                                   # every 125 ms, 10 tuples each
        meter.sample(0.125 * i, 10 * i)
    # at 1 s: the samples kept start at 0.75 s (the newest at least 0.25 s old)
    assert meter.since_oldest(1.0, 80) == (20, 0.25)
    assert meter.since_oldest(1.0625, 83) == (23, 0.3125)


def test_a_count_window_keeps_the_newest_sample_a_window_old_however_far_back_and_forgets_on_clear() -> None:
    meter = CountWindow(window=0.25)
    meter.sample(0.0, 0)
    meter.sample(5.0, 100)                               # far past a window: the older one still counts
    assert meter.since_oldest(5.0, 100) == (100, 5.0)
    meter.sample(5.1, 110)                               # 5.0 is not a window old yet: 0.0 stays
    assert meter.since_oldest(5.1, 110) == (110, 5.1)
    meter.sample(5.3, 130)                               # now 5.0 is: 0.0 goes
    done, span = meter.since_oldest(5.3, 130)
    assert done == 30 and span == pytest.approx(0.3)
    meter.clear()
    assert meter.since_oldest(6.0, 120) is None
