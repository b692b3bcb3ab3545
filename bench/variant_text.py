"""``NAME=BASE,KEY=VALUE...``: how a benchmark's ``--variant`` names a setup of its own.

The policy bench and the Spark rate-control bench both take it; each then checks the base
and the settings against what it runs (a policy or a controller, the config's parser).
"""
from __future__ import annotations


def split_variant(text: str) -> tuple[str, str, dict[str, str]]:
    """(name, base, settings as written); a malformed text is a ``ValueError`` naming it."""
    name, sep, rest = text.partition("=")
    name = name.strip()
    if not sep or not rest.strip():
        raise ValueError(f"--variant {text!r}: expected NAME=BASE[,KEY=VALUE...]")
    base, *pairs = [x.strip() for x in rest.split(",")]
    settings: dict[str, str] = {}
    for pair in pairs:
        key, eq, value = (x.strip() for x in pair.partition("="))
        if not eq or not key:
            raise ValueError(f"--variant {text!r}: expected KEY=VALUE, got {pair!r}")
        settings[key] = value
    return name, base, settings
