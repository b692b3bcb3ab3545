"""Starting a SparkSession the way the engine needs it.

* ``PYSPARK_PYTHON`` defaults to this interpreter (the venv's), ``SPARK_LOCAL_IP`` to
  ``127.0.0.1``; the driver binds to ``SPARK_LOCAL_IP`` and the web UI is off, so
  nothing listens beyond loopback unless the user sets ``SPARK_LOCAL_IP`` (which a
  cluster on other machines needs: its executors connect back to the driver).
* The driver JVM gets ``-Xss32m``: stopping a streaming query walks deep plans and can
  overflow the default stack.
* The driver logs through ``log4j2.properties`` beside this module (to the terminal), or
  with ``log_file`` through ``log4j2-file.properties`` to that file, with full traces
  (``spark.log: file``, what the engine does by default): warnings and errors, without the messages a normal streaming run produces
  (batches falling behind, job groups already gone at a stop); the Python workers
  get ``PYTHONWARNINGS`` filtering PySpark's FutureWarning about the pandas version
  (the driver filters it in ``runtime/spark/__init__.py``). A normal run and its
  shutdown print no stack trace.
* Python workers must import the user's bolt classes by module name, so the
  directories on this interpreter's ``sys.path`` (the working directory, a test
  directory) are added to ``PYTHONPATH`` before the JVM starts; workers inherit it.

A session takes about 10 s to start on a small machine; callers that run several
topologies (tests, the bench) create one and pass it to ``engine.run(spark=...)``.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from runtime.spark import PANDAS_WARNING

SITE_MARKERS = ("site-packages", "dist-packages", f"lib{os.sep}python")
LOG4J_CONFIG = Path(__file__).with_name("log4j2.properties")
LOG4J_FILE_CONFIG = Path(__file__).with_name("log4j2-file.properties")


def prepare_environment() -> None:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    have = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    extra = [os.path.abspath(p or os.curdir) for p in sys.path
             if os.path.isdir(p or os.curdir) and not any(m in p for m in SITE_MARKERS)]
    merged = list(dict.fromkeys(have + extra))
    if merged:
        os.environ["PYTHONPATH"] = os.pathsep.join(merged)
    quiet = f"ignore:{PANDAS_WARNING}:FutureWarning"
    given = os.environ.get("PYTHONWARNINGS", "")
    if quiet not in given.split(","):
        os.environ["PYTHONWARNINGS"] = ",".join(w for w in (given, quiet) if w)


def driver_host() -> str:
    """The address the driver listens on: ``SPARK_LOCAL_IP``, 127.0.0.1 unless set."""
    return os.environ.get("SPARK_LOCAL_IP") or "127.0.0.1"


def java_options(log_file: str | None) -> str:
    """The driver JVM's options: the stack size and where log4j writes (module docstring)."""
    if log_file is None:
        return f"-Xss32m -Dlog4j2.configurationFile={LOG4J_CONFIG.as_uri()}"
    Path(log_file).parent.mkdir(parents=True, exist_ok=True)
    return f"-Xss32m -Dlog4j2.configurationFile={LOG4J_FILE_CONFIG.as_uri()} -Dtopo.spark.log={log_file}"


def get_session(master: str = "local[*]", *, shuffle_partitions: int | None = None,
                app_name: str = "topo", log_level: str = "WARN", log_file: str | None = None) -> Any:
    """A session for the engine (``getOrCreate``: an active session is reused as is);
    Spark's log goes to ``log_file`` (an absolute path) when given, else to the terminal."""
    prepare_environment()
    from pyspark.sql import SparkSession

    builder = (SparkSession.builder.master(master).appName(app_name)
               .config("spark.driver.extraJavaOptions", java_options(log_file))
               .config("spark.driver.host", driver_host())
               .config("spark.driver.bindAddress", driver_host())
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.streaming.metricsEnabled", "false")
               .config("spark.sql.adaptive.enabled", "false"))
    if shuffle_partitions is not None:
        builder = builder.config("spark.sql.shuffle.partitions", str(shuffle_partitions))
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(log_level)
    return spark
