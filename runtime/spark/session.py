"""Starting a SparkSession the way the engine needs it.

* ``PYSPARK_PYTHON`` defaults to this interpreter (the venv's), ``SPARK_LOCAL_IP`` to
  ``127.0.0.1``; the driver binds to 127.0.0.1 and the web UI is off, so nothing
  listens beyond loopback.
* The driver JVM gets ``-Xss32m``: stopping a streaming query walks deep plans and can
  overflow the default stack.
* Python workers must import the user's bolt classes by module name, so the
  directories on this interpreter's ``sys.path`` (the working directory, a test
  directory) are added to ``PYTHONPATH`` before the JVM starts; workers inherit it.

A session takes about 10 s to start on a small machine; callers that run several
topologies (tests, the bench) create one and pass it to ``engine.run(spark=...)``.
"""
from __future__ import annotations

import os
import sys
from typing import Any

SITE_MARKERS = ("site-packages", "dist-packages", f"lib{os.sep}python")


def prepare_environment() -> None:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    have = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    extra = [os.path.abspath(p or os.curdir) for p in sys.path
             if os.path.isdir(p or os.curdir) and not any(m in p for m in SITE_MARKERS)]
    merged = list(dict.fromkeys(have + extra))
    if merged:
        os.environ["PYTHONPATH"] = os.pathsep.join(merged)


def get_session(master: str = "local[*]", *, shuffle_partitions: int | None = None,
                app_name: str = "topo", log_level: str = "WARN") -> Any:
    """A session for the engine (``getOrCreate``: an active session is reused as is)."""
    prepare_environment()
    from pyspark.sql import SparkSession

    builder = (SparkSession.builder.master(master).appName(app_name)
               .config("spark.driver.extraJavaOptions", "-Xss32m")
               .config("spark.driver.host", "127.0.0.1")
               .config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.streaming.metricsEnabled", "false")
               .config("spark.sql.adaptive.enabled", "false"))
    if shuffle_partitions is not None:
        builder = builder.config("spark.sql.shuffle.partitions", str(shuffle_partitions))
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(log_level)
    return spark
