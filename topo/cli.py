"""The ``topo`` command: run, validate, status, bench.

A user's mistake (a bad topology file, a bad ``--config``, a topology the chosen
engine cannot run) is one line on stderr and exit status 2, like a compiler error;
a problem of the environment (a busy ``--metrics-port``, a ZooKeeper nobody answers
at, a path that cannot be written, another run holding the topology's name) is one
line and exit status 1. The line says where (file and line, or the flag), the key
and the value; a traceback would bury it. What a run writes and listens on is
checked before anything starts (``preflight``), not at the first dead letter.
Argument syntax errors are argparse's (also status 2). Anything else is a bug: one
line too, saying so; ``--debug`` shows the traceback instead.

The working directory is put on ``sys.path`` (as ``python -m`` does) so a topology
file can name classes of the project it is run from.
"""
from __future__ import annotations

import argparse
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from topo import EngineUnavailable
from topo.api import CheckpointError, ComponentError, EmitError
from topo.config import ConfigError, coerce, parse_override
from topo.spec import SpecError, TopologySpec, config_problem, load_spec
from topo.topology import TopologyError

USAGE_ERROR = 2
ENVIRONMENT_ERROR = 1
_ZK = re.compile(r"^zookeeper://[^/:\s]+(:\d+)?(/\S*)?$")


class UsageError(Exception):
    """A bad command-line value, printed as one line ``--flag: message (got value)``."""


class EnvironmentProblem(Exception):
    """What the machine does not allow (a port, a path, a server): one line, exit status 1."""


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("topo")
    except PackageNotFoundError:
        return "unknown (not installed)"


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, a number > 0 (got {text!r})") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected seconds, a number > 0 (got {text!r})")
    return value


def _positive_int(text: str) -> int:
    if not re.fullmatch(r"\d+", text.strip()) or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1 (got {text!r})")
    return int(text)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="topo", description="Run and inspect topo stream topologies.")
    parser.add_argument("--version", action="version", version=f"topo {_version()}")
    parser.add_argument("--debug", action="store_true",
                        help="show tracebacks and library logs instead of one-line errors (also after the command)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = sub.add_parser("run", help="run a topology file", description="Run a topology described by a YAML file.")
    run.add_argument("topology", help="topology.yaml (at most 1 MB)")
    run.add_argument("--engine", choices=("local", "spark"), help="default: the file's `engine` setting (local)")
    run.add_argument("--master", help="Spark master URL, e.g. local[2] or spark://host:7077 (spark engine)")
    run.add_argument("--duration", type=_positive_float, metavar="S", help="stop (with drain) after S seconds")
    run.add_argument("--max-tuples", type=_positive_int, metavar="N", help="stop after N spout tuples")
    run.add_argument("--workers", type=_positive_int, metavar="N",
                     help="run the topology in N worker processes (same as --config workers=N)")
    run.add_argument("--from-scratch", action="store_true",
                     help="discard this topology's checkpoints and start from the beginning "
                          "(same as --config checkpoint.restore=false)")
    _config_argument(run)
    run.add_argument("--zk", metavar="URL", help="coordinate through ZooKeeper: zookeeper://host:port/root")
    run.add_argument("--metrics-port", type=int, metavar="N", help="serve Prometheus metrics on port N")
    run.add_argument("--quiet", action="store_true", help="no live console and no summary")
    run.set_defaults(func=cmd_run)

    validate = sub.add_parser("validate", help="check a topology file without running it")
    validate.add_argument("topology", help="topology.yaml (at most 1 MB)")
    _config_argument(validate)
    validate.set_defaults(func=cmd_validate)

    status = sub.add_parser("status", help="show the task states of a running topology", add_help=False)
    status.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    status.set_defaults(func=cmd_status)

    zk = sub.add_parser("zk", help="ZooKeeper housekeeping: secure a topology's znodes")
    zk_sub = zk.add_subparsers(dest="zk_command", required=True, metavar="ZK_COMMAND")
    secure = zk_sub.add_parser("secure", help="give a topology's existing znodes the creator-only ACL of the "
                               "credentials in TOPO_ZK_AUTH (or --auth-file)")
    secure.add_argument("url", help="zookeeper://host:port/root")
    secure.add_argument("name", help="topology name")
    secure.add_argument("--auth-file", metavar="PATH", help="file with one line SCHEME:CREDENTIALS")
    secure.add_argument("--read-open", action="store_true", help="let anyone read them (zookeeper.read_open)")
    secure.set_defaults(func=cmd_zk_secure)

    bench = sub.add_parser("bench", help="run the benchmark scenarios (python -m bench)", add_help=False)
    bench.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    bench.set_defaults(func=cmd_bench)
    return parser


def _config_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", action="append", default=[], metavar="KEY=VALUE",
                        help="override a setting (see configs/default.yaml); repeatable")


def overrides_from(args: argparse.Namespace) -> dict[str, Any]:
    """``--config`` pairs, then the dedicated flags (which win: they are more specific)."""
    out: dict[str, Any] = {}
    for text in args.config:
        key, value = parse_override(text)
        out[key] = value
    flags = (("engine", getattr(args, "engine", None), "--engine"),
             ("coordinator", getattr(args, "zk", None), "--zk"),
             ("metrics.port", getattr(args, "metrics_port", None), "--metrics-port"))
    for key, value, flag in flags:
        if value is None:
            continue
        if flag == "--zk" and not _ZK.match(value):
            raise UsageError(f"--zk: expected zookeeper://host:port/root (got {value!r})")
        try:
            out[key] = coerce(key, value)
        except ConfigError as e:
            raise UsageError(f"{flag}: {e.reason} (got {value!r})") from None
    return out


def _load(args: argparse.Namespace) -> tuple[TopologySpec, dict[str, Any]]:
    spec = load_spec(args.topology)
    return spec, spec.resolve_config(overrides_from(args))


def cmd_validate(args: argparse.Namespace) -> int:
    spec, _ = _load(args)
    t = spec.topology
    tasks = sum(c.parallelism for c in t.components.values())
    streams = sum(len(c.inputs) for c in t.components.values())
    n_spouts, n_bolts = len(t.spouts), len(t.bolts)
    print(f"{args.topology}: topology {t.name!r} is valid: {len(t.components)} components "
          f"({_plural(n_spouts, 'spout')}, {_plural(n_bolts, 'bolt')}), {_plural(tasks, 'task')}, "
          f"{_plural(streams, 'stream')}")
    return 0


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def cmd_run(args: argparse.Namespace) -> int:
    import topo

    spec, config = _load(args)
    if args.from_scratch:
        config["checkpoint.restore"] = False
    if args.workers is not None:
        config["workers"] = coerce("workers", args.workers)
    engine = config["engine"]
    if args.master and engine != "spark":
        raise UsageError(f"--master: only the spark engine takes a master URL (engine is {engine!r})")
    if engine == "local" and config["workers"] > 1:
        from runtime.local.workers import check_shippable

        try:
            check_shippable(spec.topology, config)
        except TopologyError as e:
            raise UsageError(f"{setting_source(spec, args, 'workers')}: {e} (got {config['workers']})") from None
    if engine == "local":
        preflight(spec, config, args)
    services = local_services(config, args, spec.topology.name) if engine == "local" else []
    started = time.monotonic()
    try:
        result = topo.run(spec.topology, engine, config=config, duration=args.duration,
                          max_tuples=args.max_tuples, master=args.master, services=services)
    except TopologyError as e:      # the engine cannot run this topology (Spark's plan)
        if isinstance(e, SpecError):
            raise
        key = getattr(e, "key", None)
        if key:     # Spark on a cluster: what executors on other machines cannot reach (a kwarg, a setting)
            component = getattr(e, "component", None)
            raise UsageError(f"{spec.where(component, key) if component else setting_source(spec, args, key)}: "
                             f"{e}") from None
        raise UsageError(f"{setting_source(spec, args, 'engine')}: {e} (got {engine!r})") from None
    if not args.quiet:
        print(summary(spec.topology, result, time.monotonic() - started))
    return 0


_FLAGS = {"engine": "engine", "coordinator": "zk", "metrics.port": "metrics_port", "workers": "workers",
          "spark.master": "master"}


def setting_source(spec: TopologySpec, args: argparse.Namespace, key: str) -> str:
    """Where ``key``'s value came from, as a message prefix: the flag, ``--config: key``,
    ``file:line: config.key``, or ``file: config.key`` for a default."""
    flag = _FLAGS.get(key)
    if flag and getattr(args, flag, None) is not None:
        return "--" + flag.replace("_", "-")
    if any(text.split("=", 1)[0].strip() == key for text in getattr(args, "config", [])):
        return f"--config: {key}"
    line = spec.config_lines.get(key)
    return f"{spec.path}:{line}: config.{key}" if line else f"{spec.path}: config.{key}"


def unwritable(path: str | os.PathLike[str]) -> str | None:
    """Why a file cannot be created or appended to at ``path`` (its missing parent
    directories may be created), or None. Nothing is created."""
    p = Path(path)
    if p.is_dir():
        return f"{p} is a directory"
    if p.exists():
        return None if os.access(p, os.W_OK) else f"{p} is not writable"
    parent = p.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        return f"{parent} is not a directory"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"{parent} is not writable"
    return None


def preflight(spec: TopologySpec, config: dict[str, Any], args: argparse.Namespace) -> None:
    """Check what a local run will write and listen on before anything starts; raises
    ``EnvironmentProblem`` with one line naming where the value came from."""
    def refuse(where: str, reason: str, value: Any) -> None:
        raise EnvironmentProblem(f"{where}: {reason} (got {value!r})")

    for key in ("dead_letter_path", "status.path"):
        if config.get(key):
            reason = unwritable(config[key])
            if reason:
                refuse(setting_source(spec, args, key), f"cannot write there: {reason}", config[key])
    for c in spec.topology.components.values():
        for arg, path in c.writes_to.items():
            reason = unwritable(path)
            if reason:
                refuse(spec.where(c.id, f"kwargs.{arg}"), f"cannot write there: {reason}", path)
    port = config.get("metrics.port") or 0
    workers = int(config.get("workers") or 1)
    # With workers, worker i serves its own exporter on metrics.port + i.
    for each in range(port, port + workers) if port else ():
        host = str(config.get("metrics.host") or "127.0.0.1")
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((host, each))
            except OSError as e:
                whose = f" (worker {each - port}'s port)" if workers > 1 else ""
                refuse(setting_source(spec, args, "metrics.port"),
                       f"cannot listen on {host}:{each}{whose}: {e.strerror or e}", port)
    url = str(config.get("coordinator", ""))
    if url.startswith("zookeeper://") and config.get("backpressure.policy") == "stepwise":
        from backpressure.coordinator.access import Tls, auth_from_config
        from backpressure.coordinator.base import StoreUnavailable
        from backpressure.coordinator.zookeeper import probe

        auth, tls = auth_from_config(config), Tls.from_config(config)   # CredentialsError: one line, exit 1
        try:
            probe(url, float(config["zookeeper.connect_timeout_s"]), auth, tls)
        except StoreUnavailable as e:
            refuse(setting_source(spec, args, "coordinator"), str(e), url)


def local_services(config: dict[str, Any], args: argparse.Namespace, name: str) -> list[Any]:
    """What runs beside a local topology: the live console, the Prometheus exporter
    (``metrics.port``) and the status file ``topo status`` reads (``status.path``, or
    the default place for topology ``name``). With worker processes the supervisor runs
    the console and the status file over every worker's tasks, and each worker serves
    its own exporter (``metrics.port + i``, from the config it is given; one line says
    where), so none runs here."""
    services: list[Any] = []
    workers = config.get("workers", 1)
    if workers > 1 and not args.quiet and config.get("metrics.port"):
        port = config["metrics.port"]
        print(f"workers: {workers}: metrics of worker i on {config.get('metrics.host') or '127.0.0.1'}:{port}+i "
              f"({port}-{port + workers - 1})", file=sys.stderr)
    if not args.quiet:
        from runtime.observe.console import Console

        services.append(Console(duration=args.duration, max_tuples=args.max_tuples))
    from runtime.observe.prometheus import MetricsService

    exporter = MetricsService.from_config(config) if workers == 1 else None
    if exporter is not None:
        services.append(exporter)
    from topo.status import StatusWriter, default_status_path

    if config.get("status.path"):
        services.append(StatusWriter(config["status.path"]))
    else:       # the default place, for `topo status` with no argument; a run goes on without it
        services.append(StatusWriter(default_status_path(name), best_effort=True))
    return services


def summary(topology: Any, result: Any, elapsed: float) -> str:
    """Per-component totals after a run, as plain aligned text (fine in logs and pipes)."""
    stats = getattr(result, "stats", None)
    reason = getattr(result, "reason", "")
    head = (f"topology {topology.name!r} stopped ({reason}) after {elapsed:.1f}s"
            if reason and reason != "exhausted" else
            f"topology {topology.name!r} finished (its spouts ended) after {elapsed:.1f}s")
    if not stats:  # the Spark engine has no tasks; it summarises its batches
        facts = result.summary() if callable(getattr(result, "summary", None)) else None
        if not isinstance(facts, dict):
            return head
        return "\n".join([head] + [f"  {k}: {v:.6g}" if isinstance(v, float) else f"  {k}: {v}"
                                   for k, v in facts.items()])
    columns = ("emitted", "executed", "acked", "failed")
    totals: dict[str, list[int]] = {}
    tasks: dict[str, int] = {}
    for s in stats:
        row = totals.setdefault(s.component, [0] * len(columns))
        tasks[s.component] = tasks.get(s.component, 0) + 1
        for i, name in enumerate(columns):
            row[i] += getattr(s, name)
    width = max(9, *(len(c) for c in totals))
    lines = [head, f"{'component':<{width}} {'tasks':>5} " + " ".join(f"{c:>10}" for c in columns)]
    for component, row in totals.items():
        lines.append(f"{component:<{width}} {tasks[component]:>5} " + " ".join(f"{v:>10}" for v in row))
    return "\n".join(lines)


def cmd_zk_secure(args: argparse.Namespace) -> int:
    from backpressure.coordinator.access import CredentialsError, load_auth
    from backpressure.coordinator.zookeeper import secure

    if not _ZK.match(args.url):
        raise UsageError(f"url: expected zookeeper://host:port/root (got {args.url!r})")
    auth = load_auth(args.auth_file)
    if auth is None:
        raise CredentialsError("no credentials: set TOPO_ZK_AUTH=SCHEME:CREDENTIALS or give --auth-file PATH")
    n = secure(args.url, args.name, auth, read_open=args.read_open)
    print(f"topology {args.name!r}: {n} znodes under {args.url} now creator-only for {auth.user!r}"
          + (" (readable by anyone)" if args.read_open else ""))
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    try:
        from topo.status import status_command
    except ImportError:
        print("topo status: not available", file=sys.stderr)
        return 1
    return int(status_command(args) or 0)


def cmd_bench(args: argparse.Namespace) -> int:
    """``python -m bench`` from the source tree this topo comes from (bench is not installed)."""
    root = Path(__file__).resolve().parent.parent
    env = dict(os.environ)
    if (root / "bench").is_dir():
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(root), env.get("PYTHONPATH", "")) if p)
    return subprocess.call([sys.executable, "-m", "bench", *args.rest], env=env)


# Commands whose own options are parsed elsewhere: every word after them is theirs.
_PASSTHROUGH = {"status": cmd_status, "bench": cmd_bench}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv       # anywhere: before or after the command
    argv = [a for a in argv if a != "--debug"]
    if argv and argv[0] in _PASSTHROUGH:  # argparse's REMAINDER would reject a leading --option
        args = argparse.Namespace(command=argv[0], rest=argv[1:], func=_PASSTHROUGH[argv[0]])
    else:
        args = build_parser().parse_args(argv)
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    if debug:
        import logging

        logging.basicConfig(level=logging.DEBUG)
        logging.getLogger("kazoo").setLevel(logging.DEBUG)
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except BrokenPipeError:
        # The reader went away (``topo status | head -1``): stop quietly, as Unix tools do;
        # point stdout at /dev/null so the interpreter's final flush does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as e:
        if debug:
            raise
        return _one_line(args, e)
    except KeyboardInterrupt:
        return 130


def _one_line(args: argparse.Namespace, error: Exception) -> int:
    """Print ``error`` as the one line of the error contract; return the exit status."""
    from backpressure.coordinator.base import CredentialsError, NotAuthorized, RunConflict, StoreUnavailable

    try:
        raise error
    except SpecError as e:
        print(e, file=sys.stderr)
    except ConfigError as e:  # from parse_override: a --config pair
        print(config_problem("--config", None, e), file=sys.stderr)
    except UsageError as e:
        print(e, file=sys.stderr)
    except EnvironmentProblem as e:
        print(e, file=sys.stderr)
        return ENVIRONMENT_ERROR
    except (RunConflict, StoreUnavailable, NotAuthorized, CredentialsError, OSError) as e:
        print(f"topo {args.command}: {e}", file=sys.stderr)
        return ENVIRONMENT_ERROR
    except EngineUnavailable as e:
        print(f"topo {args.command}: {e}", file=sys.stderr)
        return 1
    except (EmitError, ComponentError, CheckpointError) as e:
        # A component emitted what the wire cannot carry, or its open/prepare/next_tuple
        # failed for good: the message names the component; the engine has cleaned up.
        print(f"topo {args.command}: {e}", file=sys.stderr)
        return 1
    except Exception as e:
        text = str(e).replace("\n", " ")
        text = text if len(text) <= 300 else text[:297] + "..."
        print(f"topo {args.command}: unexpected {type(e).__name__}: {text} "
              "(run again with --debug for the traceback)", file=sys.stderr)
        return 1
    return USAGE_ERROR


if __name__ == "__main__":
    sys.exit(main())
