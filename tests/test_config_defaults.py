"""configs/default.yaml is what users read; it must list exactly the settings of
topo/config.py with the same defaults, each under a comment line. A new setting
fails this test until it is documented there."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from topo.config import BY_KEY, SETTINGS, coerce, resolve

DEFAULTS = Path(__file__).resolve().parent.parent / "configs" / "default.yaml"
_TOP_KEY = re.compile(r"^([A-Za-z_][\w.]*)\s*:")


def _lines() -> list[str]:
    return DEFAULTS.read_text(encoding="utf-8").splitlines()


def _top_keys() -> list[tuple[int, str]]:
    return [(i, m.group(1)) for i, line in enumerate(_lines()) if (m := _TOP_KEY.match(line))]


def test_lists_exactly_the_settings() -> None:
    keys = [k for _, k in _top_keys()]
    assert len(keys) == len(set(keys)), f"keys listed twice: {sorted({k for k in keys if keys.count(k) > 1})}"
    missing = sorted(set(BY_KEY) - set(keys))
    extra = sorted(set(keys) - set(BY_KEY))
    assert not missing, f"settings missing from {DEFAULTS.name}: {missing}"
    assert not extra, f"{DEFAULTS.name} lists keys that are not settings: {extra}"


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: s.key)
def test_default_matches(setting) -> None:
    listed = yaml.safe_load(DEFAULTS.read_text(encoding="utf-8"))
    assert setting.key in listed, f"{setting.key} missing from {DEFAULTS.name}"
    value = listed[setting.key]
    if setting.default is None:
        assert value is None, f"{setting.key}: default is null, file says {value!r}"
    else:
        assert coerce(setting.key, value) == setting.default, \
            f"{setting.key}: default is {setting.default!r}, file says {value!r}"


def test_every_key_has_a_comment_line() -> None:
    lines = _lines()
    for i, key in _top_keys():
        assert i > 0 and lines[i - 1].lstrip().startswith("#") and len(lines[i - 1].strip()) > 2, \
            f"{DEFAULTS.name}:{i + 1}: {key} needs a one-line comment above it"


def test_file_resolves_to_the_defaults() -> None:
    listed = yaml.safe_load(DEFAULTS.read_text(encoding="utf-8"))
    assert resolve(listed) == resolve()
