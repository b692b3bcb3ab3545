"""topo: a Storm-like stream-processing runtime for Python with flow control that works.

```python
from topo import Spout, Bolt, TopologyBuilder, run
builder = TopologyBuilder("wordcount")
...
result = run(builder.build(), duration=10)
```
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

from topo.api import Bolt, EndOfStream, Spout, TaskContext, Tuple
from topo.topology import Topology, TopologyBuilder, TopologyError

ENGINES = ("local", "spark")


class EngineUnavailable(RuntimeError):
    """The chosen engine cannot be imported here (e.g. Spark is not installed)."""


def run(topology: Topology, engine: str | None = None, *, config: Mapping[str, Any] | None = None,
        duration: float | None = None, max_tuples: int | None = None, master: str | None = None,
        services: Sequence[Any] = (), handle_signals: bool = False) -> Any:
    """Run ``topology`` on an engine, as ``topo run`` does, and return the engine's result.

    ``config`` overrides the topology's own settings (both are checked by
    ``topo.config.resolve``). ``engine`` defaults to the ``engine`` setting, which is
    ``local`` unless the topology says otherwise. Engines are imported here, lazily,
    so ``import topo`` stays light and needs no Spark.
    """
    from topo.config import resolve

    resolved = resolve(topology.config, dict(config or {}))
    engine = engine or resolved["engine"]
    if engine == "local":
        if master is not None:
            raise ValueError("the local engine takes no master URL; use engine='spark'")
        from runtime.local.engine import run as run_local

        return run_local(topology, resolved, duration=duration, max_tuples=max_tuples,
                         services=services, handle_signals=handle_signals)
    if engine == "spark":
        if services:
            raise ValueError("services (console, exporters) run beside the local engine only")
        try:
            from runtime.spark.engine import run as run_spark
        except ImportError as e:
            raise EngineUnavailable(f"the spark engine is not available: {e}") from None
        return run_spark(topology, resolved, master=master, duration=duration, max_tuples=max_tuples)
    raise ValueError(f"unknown engine {engine!r}; one of {', '.join(ENGINES)}")


__all__ = ["Spout", "Bolt", "Tuple", "EndOfStream", "TaskContext", "TopologyBuilder", "Topology",
           "TopologyError", "EngineUnavailable", "run"]
