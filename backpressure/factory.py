"""Build the flow control a topology's config asks for."""
from __future__ import annotations

from typing import Any

from backpressure.seams import FlowControl, NoFlowControl


def make_flow_control(config: dict[str, Any], topology_name: str) -> FlowControl:
    policy = config.get("backpressure.policy", "none")
    if policy == "none":
        return NoFlowControl()
    raise ValueError(f"config 'backpressure.policy': {policy!r} is not available yet")
