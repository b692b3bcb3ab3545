"""Writes configs/data/clicks.jsonl, the clickstream example's input (deterministic: seed 13).

One JSON object per line: ``ts`` (epoch seconds, not in order: each up to 8 s behind the
clock of the stream, and about 3 % of them 15 to 60 s behind, so later than the example's
10 s of allowed lateness), ``user`` and ``type`` (click, view or scroll).

    python configs/data/make_clicks.py        # from the repository root
"""
from __future__ import annotations

import json
import random
from pathlib import Path

START = 1_767_225_600        # 2026-01-01T00:00:00Z
LINES = 3000
USERS = [f"u{i:02d}" for i in range(12)]
TYPES = ["click"] * 6 + ["view"] * 3 + ["scroll"]


def records(seed: int = 13) -> list[dict[str, object]]:
    rng = random.Random(seed)
    out: list[dict[str, object]] = []
    clock = START
    for _ in range(LINES):
        clock += rng.choice([0, 0, 1, 1, 2, 3])
        behind = rng.randint(15, 60) if rng.random() < 0.03 else rng.randint(0, 8)
        out.append({"ts": clock - behind, "user": rng.choice(USERS), "type": rng.choice(TYPES)})
    return out


def main() -> None:
    path = Path(__file__).with_name("clicks.jsonl")
    path.write_text("".join(json.dumps(r) + "\n" for r in records()))


if __name__ == "__main__":
    main()
