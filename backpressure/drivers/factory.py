"""``backpressure.policy`` and ``coordinator`` settings -> the engine's FlowControl.

Imports are local to each branch so a run with flow control off, or with the
embedded coordinator, never imports kazoo.
"""
from __future__ import annotations

from typing import Any, Mapping

from backpressure.seams import FlowControl, NoFlowControl


# Not a setting (``resolve`` refuses it): the Unix socket of the embedded coordinator that
# a worker supervisor serves; it puts this into the config it hands each of its workers.
SERVED_SOCKET = "_coordinator.socket"
# Not a setting either: set by the supervisor in each worker's config, so a flow control
# that decides over the whole topology (source_stop, watermark) knows it is one worker of
# several and what the whole graph is: component -> (is a spout, task ids, its inputs).
WORKER_GRAPH = "_workers.graph"
# The policies whose decisions cross worker processes through a coordinator (window: its
# spouts' resume points; adaptive: the flags of its bolt tasks).
ACROSS_WORKERS = ("stepwise", "source_stop", "watermark", "window", "adaptive")


def make_coordinator(config: Mapping[str, Any], topology_name: str) -> Any:
    """``coordinator: embedded`` or ``coordinator: zookeeper://host:port/root``.

    Embedded in a worker process (the config carries ``SERVED_SOCKET``): a session on the
    tree the supervisor serves, so signals cross workers; otherwise a tree of this process.
    """
    where = str(config.get("coordinator", "embedded"))
    if where == "embedded" and config.get(SERVED_SOCKET):
        from backpressure.coordinator.served import ServedCoordinator

        return ServedCoordinator(topology_name, str(config[SERVED_SOCKET]))
    if where == "embedded":
        from backpressure.coordinator.embedded import EmbeddedCoordinator

        return EmbeddedCoordinator(topology_name)
    if where.startswith("zookeeper://"):
        from backpressure.coordinator.access import Tls, auth_from_config
        from backpressure.coordinator.zookeeper import ZooKeeperCoordinator

        return ZooKeeperCoordinator(where, topology_name,
                                    session_timeout=float(config.get("zookeeper.session_timeout_s", 10.0)),
                                    connect_timeout=float(config.get("zookeeper.connect_timeout_s", 5.0)),
                                    auth=auth_from_config(config), read_open=bool(config.get("zookeeper.read_open")),
                                    tls=Tls.from_config(config))
    raise ValueError(f"coordinator must be 'embedded' or 'zookeeper://host:port/root', got {where!r}")


def serve_coordinator(config: Mapping[str, Any], directory: str) -> tuple[Any, dict[str, Any]]:
    """For a supervisor of worker processes: with a policy of ``ACROSS_WORKERS`` on the embedded
    coordinator, serve one tree on a Unix socket in ``directory`` (a thread of this process;
    ``stop()`` ends it) and return it with what to add to each worker's config; otherwise
    ``(None, {})``."""
    if (config.get("backpressure.policy", "stepwise") not in ACROSS_WORKERS
            or str(config.get("coordinator", "embedded")) != "embedded"):
        return None, {}
    import os

    from backpressure.coordinator.served import SOCKET_NAME, serve_in_thread

    path = os.path.join(directory, SOCKET_NAME)
    return serve_in_thread(path), {SERVED_SOCKET: path}


def _graph(config: Mapping[str, Any]) -> dict[str, tuple[bool, list[int], list[str]]] | None:
    graph = config.get(WORKER_GRAPH)
    return {c: (bool(s), list(t), list(i)) for c, (s, t, i) in graph.items()} if graph else None


def _across(config: Mapping[str, Any], topology_name: str) -> Any:
    """In a worker process (the config carries ``WORKER_GRAPH``): the coordinator the
    workers share; in a single process: None (the policy decides in process)."""
    return make_coordinator(config, topology_name) if config.get(WORKER_GRAPH) else None


def make_flow_control(config: Mapping[str, Any], topology_name: str) -> FlowControl:
    policy = config.get("backpressure.policy", "stepwise")
    if policy == "none":
        return NoFlowControl()
    if policy == "stepwise":
        from backpressure.policy.stepwise import StepwiseParams
        from backpressure.drivers.stepwise import StepwiseFlowControl

        return StepwiseFlowControl(StepwiseParams.from_config(config),
                                   make_coordinator(config, topology_name))
    if policy == "source_stop":
        from backpressure.policy.source_stop import SourceStopParams
        from backpressure.drivers.source_stop import SourceStopFlowControl

        return SourceStopFlowControl(SourceStopParams.from_config(config), coordinator=_across(config, topology_name))
    if policy == "watermark":
        from backpressure.policy.watermark import WaterMarkParams
        from backpressure.drivers.watermark import WatermarkFlowControl

        return WatermarkFlowControl(WaterMarkParams.from_config(config), coordinator=_across(config, topology_name),
                                    graph=_graph(config))
    if policy == "adaptive":
        from backpressure.policy.adaptive import AdaptiveParams
        from backpressure.drivers.adaptive import AdaptiveFlowControl

        return AdaptiveFlowControl(AdaptiveParams.from_config(config), coordinator=_across(config, topology_name),
                                   graph=_graph(config))
    if policy == "window":
        from backpressure.policy.window import WindowParams
        from backpressure.drivers.window import WindowFlowControl

        # The resume points (W5) are kept in a coordinator that outlives a process: ZooKeeper,
        # or in worker processes the tree the supervisor serves; embedded in one process, none.
        durable = config.get(WORKER_GRAPH) or str(config.get("coordinator", "embedded")) != "embedded"
        return WindowFlowControl(WindowParams.from_config(config), slow_bytes=int(config["queue.high_mark"]),
                                 capacity=int(config["queue.hard_bound"]), graph=_graph(config),
                                 coordinator=make_coordinator(config, topology_name) if durable else None,
                                 discard_resume=not config.get("checkpoint.restore", True))
    raise ValueError(f"unknown backpressure.policy {policy!r}")
