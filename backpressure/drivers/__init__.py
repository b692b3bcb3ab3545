"""The asyncio drivers of the flow-control policies: each runs a pure policy from
``backpressure.policy`` over an engine's ``TaskHandle``s and carries its decisions
through a coordinator (or, for the in-process policies, directly)."""
