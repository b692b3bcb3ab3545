"""topo: a Storm-like stream-processing runtime for Python with flow control that works.

```python
from topo import Spout, Bolt, TopologyBuilder, run
builder = TopologyBuilder("wordcount")
...
print(run(builder.build(), duration=10))   # a per-component summary
```
"""
from __future__ import annotations

import contextlib
import importlib.util
import signal
import threading
from typing import Any, Iterator, Mapping, Sequence

from topo.api import Bolt, EndOfStream, Spout, TaskContext, Tuple
from topo.topology import Topology, TopologyBuilder, TopologyError

ENGINES = ("local", "spark")
#: what the spark engine imports, all in the ``spark`` extra of the package
SPARK_MODULES = ("pyspark", "pyarrow", "pandas")
SPARK_INSTALL = "pip install 'topo[spark]' (in a source checkout: pip install -e '.[spark]', or make test)"


class EngineUnavailable(RuntimeError):
    """The chosen engine cannot be imported here (e.g. Spark is not installed)."""


def run(topology: Topology, engine: str | None = None, *, config: Mapping[str, Any] | None = None,
        duration: float | None = None, max_tuples: int | None = None, master: str | None = None,
        services: Sequence[Any] = (), handle_signals: bool | None = None) -> Any:
    """Run ``topology`` on an engine, as ``topo run`` does, and return the engine's result.

    ``config`` overrides the topology's own settings (both are checked by
    ``topo.config.resolve``). ``engine`` defaults to the ``engine`` setting, which is
    ``local`` unless the topology says otherwise. Engines are imported here, lazily,
    so ``import topo`` stays light and needs no Spark.

    Signals: called from the main thread (``handle_signals=None``, the default) the
    run handles SIGINT (Ctrl-C) and SIGTERM itself: the spouts stop, what is in
    flight drains for up to ``drain_timeout_s``, and ``run`` returns its result
    (reason ``"signal"``) instead of raising ``KeyboardInterrupt``; a second signal
    stops without the drain. ``handle_signals=False`` leaves the process's handlers
    alone (on Spark, Ctrl-C still ends the query cleanly).
    """
    from topo.config import resolve

    resolved = resolve(topology.config, dict(config or {}))
    engine = engine or resolved["engine"]
    if handle_signals is None:
        handle_signals = threading.current_thread() is threading.main_thread()
    if engine == "local":
        if master is not None:
            raise ValueError("the local engine takes no master URL; use engine='spark'")
        if resolved["workers"] > 1:
            from runtime.local.workers import run_workers

            if max_tuples is not None:
                raise ValueError("with workers > 1, max_tuples is not available yet")
            return run_workers(topology, resolved, workers=resolved["workers"], duration=duration,
                               handle_signals=handle_signals, services=services)
        from runtime.local.engine import run as run_local

        return run_local(topology, resolved, duration=duration, max_tuples=max_tuples,
                         services=services, handle_signals=handle_signals)
    if engine == "spark":
        if services:
            raise ValueError("services (console, exporters) run beside the local engine only")
        run_spark = _spark_engine()
        with _sigterm_interrupts(handle_signals):
            return run_spark(topology, resolved, master=master, duration=duration, max_tuples=max_tuples)
    raise ValueError(f"unknown engine {engine!r}; one of {', '.join(ENGINES)}")


def _spark_engine() -> Any:
    """The Spark engine's ``run``, or ``EngineUnavailable`` saying in one line how to install it."""
    missing = [m for m in SPARK_MODULES if _find(m) is None]
    if missing:
        raise EngineUnavailable(f"the spark engine needs {', '.join(missing)} (the 'spark' extra): {SPARK_INSTALL}")
    try:
        from runtime.spark.engine import run as run_spark
    except ImportError as e:
        raise EngineUnavailable(f"the spark engine cannot be imported ({e}): {SPARK_INSTALL}") from None
    return run_spark


def _find(module: str) -> Any:
    try:
        return importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None


@contextlib.contextmanager
def _sigterm_interrupts(enabled: bool) -> Iterator[None]:
    """While a Spark run waits, SIGTERM stops it as Ctrl-C does (the engine ends its query)."""
    if not enabled or threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


__all__ = ["Spout", "Bolt", "Tuple", "EndOfStream", "TaskContext", "TopologyBuilder", "Topology",
           "TopologyError", "EngineUnavailable", "run"]
