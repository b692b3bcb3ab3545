"""The ``topo`` command: run, validate, status, bench.

A user's mistake (a bad topology file, a bad ``--config``) is one line on stderr and
exit status 2, like a compiler error, never a traceback: the line already says
file, line, key and value, and a traceback would bury it. Argument syntax errors
are argparse's (also status 2). Anything else is a bug and keeps its traceback.

The working directory is put on ``sys.path`` (as ``python -m`` does) so a topology
file can name classes of the project it is run from.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from topo import EngineUnavailable
from topo.api import ComponentError, EmitError
from topo.config import ConfigError, coerce, parse_override
from topo.spec import SpecError, TopologySpec, config_problem, load_spec

USAGE_ERROR = 2
_ZK = re.compile(r"^zookeeper://[^/:\s]+(:\d+)?(/\S*)?$")


class UsageError(Exception):
    """A bad command-line value, printed as one line ``--flag: message (got value)``."""


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
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = sub.add_parser("run", help="run a topology file", description="Run a topology described by a YAML file.")
    run.add_argument("topology", help="topology.yaml")
    run.add_argument("--engine", choices=("local", "spark"), help="default: the file's `engine` setting (local)")
    run.add_argument("--master", help="Spark master URL, e.g. local[2] or spark://host:7077 (spark engine)")
    run.add_argument("--duration", type=_positive_float, metavar="S", help="stop (with drain) after S seconds")
    run.add_argument("--max-tuples", type=_positive_int, metavar="N", help="stop after N spout tuples")
    _config_argument(run)
    run.add_argument("--zk", metavar="URL", help="coordinate through ZooKeeper: zookeeper://host:port/root")
    run.add_argument("--metrics-port", type=int, metavar="N", help="serve Prometheus metrics on port N")
    run.add_argument("--quiet", action="store_true", help="no live console and no summary")
    run.set_defaults(func=cmd_run)

    validate = sub.add_parser("validate", help="check a topology file without running it")
    validate.add_argument("topology", help="topology.yaml")
    _config_argument(validate)
    validate.set_defaults(func=cmd_validate)

    status = sub.add_parser("status", help="show the task states of a running topology", add_help=False)
    status.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    status.set_defaults(func=cmd_status)

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
    engine = config["engine"]
    if args.master and engine != "spark":
        raise UsageError(f"--master: only the spark engine takes a master URL (engine is {engine!r})")
    services = local_services(config, args) if engine == "local" else []
    started = time.monotonic()
    result = topo.run(spec.topology, engine, config=config, duration=args.duration,
                      max_tuples=args.max_tuples, master=args.master, services=services,
                      handle_signals=engine == "local")
    if not args.quiet:
        print(summary(spec.topology, result, time.monotonic() - started))
    return 0


def local_services(config: dict[str, Any], args: argparse.Namespace) -> list[Any]:
    """What runs beside a local topology: the live console, the Prometheus exporter
    (``metrics.port``) and the status file ``topo status`` reads (``status.path``)."""
    services: list[Any] = []
    if not args.quiet:
        from runtime.observe.console import Console

        services.append(Console(duration=args.duration, max_tuples=args.max_tuples))
    from runtime.observe.prometheus import MetricsService

    exporter = MetricsService.from_config(config)
    if exporter is not None:
        services.append(exporter)
    if config.get("status.path"):
        from topo.status import StatusWriter

        services.append(StatusWriter(config["status.path"]))
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
    if argv and argv[0] in _PASSTHROUGH:  # argparse's REMAINDER would reject a leading --option
        args = argparse.Namespace(command=argv[0], rest=argv[1:], func=_PASSTHROUGH[argv[0]])
    else:
        args = build_parser().parse_args(argv)
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except SpecError as e:
        print(e, file=sys.stderr)
    except ConfigError as e:  # from parse_override: a --config pair
        print(config_problem("--config", None, e), file=sys.stderr)
    except UsageError as e:
        print(e, file=sys.stderr)
    except EngineUnavailable as e:
        print(f"topo {args.command}: {e}", file=sys.stderr)
        return 1
    except (EmitError, ComponentError) as e:
        # A component emitted what the wire cannot carry, or its open/prepare/next_tuple
        # failed for good: the message names the component; the engine has cleaned up.
        print(f"topo {args.command}: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return USAGE_ERROR


if __name__ == "__main__":
    sys.exit(main())
