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
* The JVM's stderr and stdout reach the terminal through threads (``JvmOutput``) that drop
  what every run printed and no setting silences: the boot warning ``WARNING: Using
  incubator modules: jdk.incubator.vector`` (Spark's launcher always adds that module)
  and the lines PySpark's driver-side ``transformWithStateInPandas`` worker prints at
  every call. Everything else the JVM and its Python workers write passes unchanged.
* Python workers must import the user's bolt classes by module name, so the
  directories on this interpreter's ``sys.path`` (the working directory, a test
  directory) are added to ``PYTHONPATH`` before the JVM starts; workers inherit it.

A session takes about 10 s to start on a small machine; callers that run several
topologies (tests, the bench) create one and pass it to ``engine.run(spark=...)``.
"""
from __future__ import annotations

import os
import sys
import threading
from pathlib import Path
from typing import IO, Any, Callable

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


JVM_BOOT_NOISE = (b"WARNING: Using incubator modules:",)
# PySpark's driver-side worker for transformWithStateInPandas prints these at its start and
# at every call, each followed by an empty line (to stderr, which it shares with the JVM).
TWS_WORKER_NOISE = (b"Starting Streaming TransformWithStateInPandas Python worker",
                    b"Streaming TransformWithStateInPandas Python worker ")


class JvmOutput:
    """Copies one of the JVM's output streams to this process's file descriptor ``fd``
    (where the JVM would have written), line by line, without the lines that start with one
    of ``noise`` and the empty line that follows each of them."""

    def __init__(self, stream: IO[bytes], noise: tuple[bytes, ...], fd: int = 2,
                 write: Callable[[bytes], Any] | None = None) -> None:
        self.stream = stream
        self.noise = noise
        self.write = write or (lambda line: os.write(fd, line))
        self.thread = threading.Thread(target=self._copy, name=f"spark-jvm-output-{fd}", daemon=True)

    def start(self) -> "JvmOutput":
        self.thread.start()
        return self

    def _copy(self) -> None:
        dropped = False
        for line in iter(self.stream.readline, b""):
            if line.startswith(self.noise) or (dropped and line == b"\n"):
                dropped = not dropped or line != b"\n"
                continue
            dropped = False
            self.write(line)

    def join(self, timeout: float) -> None:
        """Wait for what a JVM that has exited still wrote (its error, when it failed to start)."""
        self.thread.join(timeout)


def session_settings(master: str, app_name: str, log_file: str | None,
                     shuffle_partitions: int | None) -> dict[str, str]:
    """The Spark settings of the engine's session (module docstring)."""
    settings = {"spark.master": master, "spark.app.name": app_name,
                "spark.driver.extraJavaOptions": java_options(log_file),
                "spark.driver.host": driver_host(), "spark.driver.bindAddress": driver_host(),
                "spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false",
                "spark.sql.streaming.metricsEnabled": "false", "spark.sql.adaptive.enabled": "false"}
    if shuffle_partitions is not None:
        settings["spark.sql.shuffle.partitions"] = str(shuffle_partitions)
    return settings


def _start_jvm(settings: dict[str, str]) -> None:
    """Start Spark's JVM with its stdout and stderr through ``JvmOutput`` and a context on it,
    unless this process already has a JVM (a session before, or a shell that launched one).

    The pipes are read from before the JVM starts, so a JVM that writes much while it boots
    cannot block on a full pipe, and one that fails to start still has its error shown."""
    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway

    if SparkContext._gateway is not None or "PYSPARK_GATEWAY_PORT" in os.environ:
        return
    conf = SparkConf().setAll(list(settings.items()))
    pipes = {1: os.pipe(), 2: os.pipe()}
    noise = JVM_BOOT_NOISE + TWS_WORKER_NOISE
    copiers = [JvmOutput(os.fdopen(read_end, "rb"), noise, fd).start() for fd, (read_end, _) in pipes.items()]
    try:
        gateway = launch_gateway(conf, popen_kwargs={"stdout": pipes[1][1], "stderr": pipes[2][1]})
    except BaseException:
        for _, write_end in pipes.values():
            os.close(write_end)
        for copier in copiers:
            copier.join(2.0)
        raise
    for _, write_end in pipes.values():
        os.close(write_end)      # the JVM holds its own copies; EOF comes when it exits
    SparkContext(conf=conf, gateway=gateway)


def get_session(master: str = "local[*]", *, shuffle_partitions: int | None = None,
                app_name: str = "topo", log_level: str = "WARN", log_file: str | None = None) -> Any:
    """A session for the engine (``getOrCreate``: an active session is reused as is);
    Spark's log goes to ``log_file`` (an absolute path) when given, else to the terminal."""
    prepare_environment()
    from pyspark.sql import SparkSession

    settings = session_settings(master, app_name, log_file, shuffle_partitions)
    _start_jvm(settings)
    builder = SparkSession.builder
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(log_level)
    return spark
