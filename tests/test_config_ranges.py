"""Every numeric setting has a finite, sane range (issue 9, item 7): a value that would
take the machine (a 10**8 batch, a timeout of a million years) is refused when the
config is resolved, with the allowed range in the message."""
from __future__ import annotations

import pytest

from topo.config import SETTINGS, ConfigError, coerce, parse_bytes

NUMERIC = [s for s in SETTINGS if s.parse.__name__ in ("_int", "_float") or s.parse is parse_bytes]


def test_the_numeric_settings_are_found() -> None:
    assert {"batch.size", "max_spout_pending", "queue.high_mark", "message_timeout_s", "seed"} <= {
        s.key for s in NUMERIC}


@pytest.mark.parametrize("setting", NUMERIC, ids=lambda s: s.key)
def test_every_numeric_setting_is_bounded(setting) -> None:  # type: ignore[no-untyped-def]
    for bad in (10**20, -(10**20), float("inf"), float("-inf"), float("nan")):
        with pytest.raises(ConfigError):
            coerce(setting.key, bad)
    if setting.default is not None:
        assert coerce(setting.key, setting.default) == setting.default


def test_the_message_gives_the_range() -> None:
    with pytest.raises(ConfigError) as info:
        coerce("batch.size", 100_000_000)
    assert info.value.reason == "must be between 1 and 65536"
    with pytest.raises(ConfigError) as info:
        coerce("message_timeout_s", float("inf"))
    assert info.value.reason == "must be > 0 and at most 86400"
    with pytest.raises(ConfigError) as info:
        coerce("queue.high_mark", "1TB")
    assert info.value.reason == "must be between 1 B and 64 GB"
