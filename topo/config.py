"""Every topology setting: its type, default and meaning, in one table.

``configs/default.yaml`` lists the same settings for users to read; a test keeps
the two in step. Keys are flat and dotted (Storm's ``topology.*`` style without the
prefix) so ``--config queue.high_mark=10MB`` addresses any of them.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Mapping


def short_repr(value: Any, limit: int = 80) -> str:
    """``repr(value)`` cut to ``limit`` characters, without ever building the whole of it.

    A value from a file can be huge (a long list, or a YAML alias bomb); an error
    message must cost no more than the line it prints. Containers are walked only as
    far as the budget goes; strings, bytes and integers are cut before ``repr``.
    """
    parts: list[str] = []
    budget = [limit + 1]

    def put(text: str) -> bool:
        parts.append(text)
        budget[0] -= len(text)
        return budget[0] > 0

    def walk(v: Any, depth: int) -> bool:
        if isinstance(v, (str, bytes)):
            return put(repr(v[: limit + 1]) if len(v) <= limit else repr(v[:limit])[:-1])
        if isinstance(v, int) and not isinstance(v, bool) and v.bit_length() > 128:
            return put(f"<an integer of {v.bit_length()} bits>")
        if isinstance(v, (list, tuple, dict, set, frozenset)):
            if depth > 20:
                return put("...")
            if isinstance(v, (set, frozenset)) and not v:
                return put(f"{type(v).__name__}()")
            if isinstance(v, frozenset):
                put("frozenset(")
            opening, closing = {list: "[]", tuple: "()", dict: "{}"}.get(type(v), "{}")
            if not put(opening):
                return False
            for i, item in enumerate(v.items() if isinstance(v, dict) else v):
                if i and not put(", "):
                    return False
                if isinstance(v, dict):
                    if not walk(item[0], depth + 1) or not put(": ") or not walk(item[1], depth + 1):
                        return False
                elif not walk(item, depth + 1):
                    return False
            if isinstance(v, tuple) and len(v) == 1 and not put(","):
                return False
            return put(closing + (")" if isinstance(v, frozenset) else ""))
        return put(repr(v))

    walk(value, 0)
    text = "".join(parts)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class ConfigError(ValueError):
    """A bad setting; ``key`` and ``value`` say which."""

    def __init__(self, key: str, value: Any, message: str) -> None:
        super().__init__(f"config {short_repr(key)}: {message} (got {short_repr(value)})")
        self.key = key
        self.value = value
        self.reason = message


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]i?b?|b)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3,
          "t": 1000**4, "tb": 1000**4, "ki": 1024, "kib": 1024, "mi": 1024**2, "mib": 1024**2,
          "gi": 1024**3, "gib": 1024**3, "ti": 1024**4, "tib": 1024**4}


def parse_bytes(value: Any) -> int:
    """``52428800``, ``"50MB"`` or ``"48MiB"`` -> bytes. MB is decimal, MiB binary.

    Document 000's marks, "50 MB" and "500 KB", are taken as 50 * 10**6 and
    500 * 10**3 bytes.
    """
    if isinstance(value, bool):
        raise ValueError("expected a size such as 50MB")
    if isinstance(value, int):
        if value < 0:
            raise ValueError("a size cannot be negative")
        return value
    if isinstance(value, float) and value >= 0 and value.is_integer():
        return int(value)
    if isinstance(value, str):
        m = _SIZE.match(value)
        if m:
            return int(float(m.group(1)) * _UNITS[(m.group(2) or "").lower()])
    raise ValueError("expected a size such as 50MB, 500KB or a number of bytes")


def _bool(v: Any) -> bool:
    if isinstance(v, bool):
        return v
    if isinstance(v, str) and v.lower() in ("true", "false", "yes", "no", "on", "off", "1", "0"):
        return v.lower() in ("true", "yes", "on", "1")
    raise ValueError("expected true or false")


def _auto_or_bool(v: Any) -> str:
    """``auto``, ``true`` or ``false`` (YAML's booleans accepted), kept as one of those words."""
    if isinstance(v, str) and v.lower() == "auto":
        return "auto"
    try:
        return "true" if _bool(v) else "false"
    except ValueError:
        raise ValueError("expected auto, true or false") from None


def _int(v: Any) -> int:
    if isinstance(v, bool):
        raise ValueError("expected an integer")
    if isinstance(v, int):
        return v
    if isinstance(v, str) and re.fullmatch(r"-?\d+", v.strip()):
        return int(v)
    raise ValueError("expected an integer")


def _float(v: Any) -> float:
    if isinstance(v, bool):
        raise ValueError("expected a number")
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            pass
    raise ValueError("expected a number")


def _str(v: Any) -> str:
    if isinstance(v, str):
        return v
    raise ValueError("expected a string")


@dataclass(frozen=True)
class Setting:
    key: str
    default: Any
    parse: Callable[[Any], Any]
    doc: str
    nullable: bool = False
    check: Callable[[Any], str | None] | None = None
    choices: tuple[str, ...] = ()


def _number(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else str(v)


def _size(n: float) -> str:
    for unit, scale in (("GB", 1000**3), ("MB", 1000**2), ("KB", 1000)):
        if n >= scale and n % scale == 0:
            return f"{n // scale:.0f} {unit}"
    return f"{n:.0f} B"


def _between(lo: float, hi: float, *, above: bool = False,
             show: Callable[[float], str] = _number) -> Callable[[Any], str | None]:
    """A check for ``lo <= v <= hi`` (``lo < v <= hi`` when ``above``); NaN and the
    infinities fail it. Every numeric setting has one, so no value can take the machine."""
    text = (f"must be > {show(lo)} and at most {show(hi)}" if above
            else f"must be between {show(lo)} and {show(hi)}")

    def check(v: Any) -> str | None:
        return None if (v > lo if above else v >= lo) and v <= hi else text
    return check


DAY_S = 86_400.0
HOUR_MS = 3_600_000.0
MAX_RATE = 1e9           # tuples or records per second
MAX_QUEUE = 64 * 1000**3


def _fraction(v: Any) -> str | None:
    return None if 0 < v < 1 else "must be between 0 and 1 (exclusive)"


def _headroom(v: Any) -> str | None:
    return None if 0 <= v < 0.5 else "must be at least 0 and under 0.5"


def _slow_start(v: Any) -> str | None:
    return None if 50 < v < 1000 else "must be between 50 and 1000 (exclusive), document 001's slow start"


def _coordinator(v: Any) -> str | None:
    if v == "embedded" or re.fullmatch(r"zookeeper://[^/\s]+:\d+(,[^/\s]+:\d+)*(/[^\s]*)?", v):
        return None
    return "must be embedded or zookeeper://host:port/root"


def _port(v: Any) -> str | None:
    return None if 0 <= v <= 65535 else "must be a port number 0..65535"


SETTINGS: tuple[Setting, ...] = (
    Setting("engine", "local", _str, "which engine runs the topology", choices=("local", "spark")),
    Setting("acking", False, _bool, "track every spout tuple's tree (at-least-once, Storm's XOR acker)"),
    Setting("acking.granularity", "tuple", _str, "what one ack covers: tuple (Storm: each spout tuple one tree, a failure replays that spout tuple) or batch (Trident: each spout batch one tree, each group of tuples one edge, a failure replays the whole batch; far cheaper)", choices=("tuple", "batch")),
    Setting("message_timeout_s", 30.0, _float, "a tracked tuple not fully acked within this fails and is replayed", check=_between(0, DAY_S, above=True)),
    Setting("max_retries", 3, _int, "replays of one spout tuple before it goes to the dead-letter file", check=_between(0, 1000)),
    Setting("max_spout_pending", 10000, _int, "tracked tuples in flight per spout task before next_tuple pauses", check=_between(1, 1_000_000)),
    Setting("dead_letter_path", "dead-letters.jsonl", _str, "JSON lines file for tuples that exhausted their retries"),
    Setting("drain_timeout_s", 10.0, _float, "on stop, how long in-flight tuples may take before they are failed back (Spark: how long the micro-batch in flight may take to finish before the query is stopped in the middle of it)", check=_between(0, 3600)),
    Setting("execute_timeout_s", 60.0, _float, "an async (or blocking: true) bolt execute running longer is cancelled and its tuple failed; a bolt's own execute_timeout_s wins", check=_between(0, DAY_S, above=True)),
    Setting("spout.max_consecutive_errors", 1000, _int, "a spout whose next_tuple raises this many times in a row (with backoff) stops the run", check=_between(1, 1_000_000_000)),
    Setting("errors.log_first", 10, _int, "failures of one task logged one by one before they are only counted per interval", check=_between(0, 100_000)),
    Setting("errors.log_interval_s", 10.0, _float, "how often a task logs how many further failures it had", check=_between(0, DAY_S, above=True)),
    Setting("workers", 1, _int, "worker processes a local run uses (its tasks are spread over them round robin)", check=_between(1, 64)),
    Setting("checkpoint.interval_ms", None, _float, "take a consistent checkpoint of spout offsets and bolt state this often; null: off (at-least-once acking only)", nullable=True, check=_between(10, 1000 * DAY_S)),
    Setting("checkpoint.dir", "checkpoints", _str, "where checkpoints are kept: one SQLite file per topology name"),
    Setting("checkpoint.keep", 3, _int, "completed checkpoints kept per topology (older ones are deleted)", check=_between(1, 1000)),
    Setting("checkpoint.timeout_s", 60.0, _float, "a checkpoint whose topology has not drained within this is abandoned (the next one tries again)", check=_between(0, DAY_S, above=True)),
    Setting("checkpoint.restore", True, _bool, "resume from the last completed checkpoint at start; false (topo run --from-scratch) discards it"),
    Setting("checkpoint.max_rollbacks", 10, _int, "rollbacks to the last checkpoint after a failed or timed-out tuple, in a row, before the run gives up", check=_between(0, 1_000_000)),
    Setting("queue.high_mark", 50_000_000, parse_bytes, "queue bytes at or over which a task is overloaded (document 000: 50 MB)", check=_between(1, MAX_QUEUE, show=_size)),
    Setting("queue.low_mark", 500_000, parse_bytes, "queue bytes at or under which a task is lightly loaded (document 000: 500 KB)",
            check=_between(0, MAX_QUEUE, show=_size)),
    Setting("queue.hard_bound", None, parse_bytes, "queue bytes at which emit waits; null means 2 x queue.high_mark", nullable=True, check=_between(1, 2 * MAX_QUEUE, show=_size)),
    Setting("batch.size", 256, _int, "tuples per transfer batch between tasks", check=_between(1, 65536)),
    Setting("batch.flush_interval_ms", 1.0, _float, "longest a partial batch waits before it is sent", check=_between(0, 60_000, above=True)),
    Setting("backpressure.policy", "stepwise", _str, "flow-control policy",
            choices=("none", "stepwise", "source_stop", "watermark", "window", "adaptive")),
    Setting("backpressure.step", 0.5, _float, "v': each backpressure step multiplies the upstream rate by this", check=_fraction),
    Setting("backpressure.sensitivity_ms", 2000.0, _float, "low mark must hold this long before a release; also the check period", check=_between(0, HOUR_MS, above=True)),
    Setting("backpressure.rate_floor", 1.0, _float, "no step takes a rate below this many tuples/s", check=_between(0, MAX_RATE, above=True)),
    Setting("backpressure.fine_steps", 1, _int, "stepwise: a step may be split into up to this many parts when the rate cycles between two neighbouring steps (halved at each reversal); 1 is document 000", check=_between(1, 64)),
    Setting("backpressure.originv_memory_ms", 6000.0, _float, "stepwise: an episode starting this soon after the last one ended keeps its originv when the measured rate is lower (the rate meter lags a release)", check=_between(0, HOUR_MS)),
    Setting("backpressure.originv_hold_ms", 0.0, _float, "stepwise: after the last step is released the limit stays at exactly originv this long before the limiter turns off (0: at once, document 000)", check=_between(0, HOUR_MS)),
    Setting("backpressure.queue_smoothing_ms", 0.0, _float, "stepwise: read the marks on an exponential average of the queue bytes with this time constant, so millisecond spikes are neither an overload nor break a light window (0: raw bytes, document 000)", check=_between(0, HOUR_MS)),
    Setting("backpressure.release_window_ms", 0.0, _float, "stepwise: how long the low mark must hold before each release (0: backpressure.sensitivity_ms, document 000); shorter gives the rate back sooner after an overload ends", check=_between(0, HOUR_MS)),
    Setting("backpressure.flat_queue_holds", False, _bool, "stepwise: a queue over the high mark that stopped growing since the last check (and is under halfway to the hard bound) is not stepped again: the rate in force matches the capacity (false: document 000)"),
    Setting("backpressure.bracket_search", False, _bool, "stepwise: each step goes halfway between the highest upstream rate seen to overload this task and the lowest seen to keep it light (meant with fine_steps > 1; false: document 000)"),
    Setting("backpressure.bracket_light_window_ms", 0.0, _float, "stepwise with bracket_search: how long (milliseconds) the low mark must hold for the first release after a step down (0: as any other release)", check=_between(0, HOUR_MS)),
    Setting("backpressure.bracket_interpolate", False, _bool, "stepwise with bracket_search: move to the rate where the queue's measured rise and fall put the capacity, not the middle of the bracket (false: the middle)"),
    Setting("backpressure.hold_starved_upstream", False, _bool, "stepwise: a light task does not release an upstream bolt whose own queue is idle (at most 1/32 of queue.low_mark) while that bolt holds its own upstreams back (it emits what it receives, not what its limit allows; false: document 000)"),
    Setting("backpressure.release_below_overload", False, _bool, "stepwise with bracket_search: for backpressure.sensitivity_ms after a light window read at a rate that had overloaded the task, each release is one fine step, not doubling, unless the queue stayed idle in the window (false: doubling)"),
    Setting("backpressure.step_from_recent_rate", False, _bool, "stepwise: once per overload episode, a step down that finds the upstream emitting under v' x its limit (it waits on a full queue, or its rate meter still carries a start burst) goes one step under what it emitted over the last backpressure.sensitivity_ms; originv stays the meter's figure, so releases still come back to it exactly; with bracket_search a bolt whose own limit rises forgets where its upstreams overloaded it (false: every step from the limit, document 000)"),
    Setting("backpressure.dry_release_window_ms", 0.0, _float, "stepwise: a light window in which a throttled spout's source ran dry (it had less to emit than its limit allowed, so the limit was not in use) releases that spout only once the low mark has held this long (milliseconds; a source that is on and off, or caught up, is not let go past the capacity on light read while it idled; 0: every light window releases, document 000)", check=_between(0, HOUR_MS)),
    Setting("backpressure.drain_margin_parts", 0, _int, "stepwise with bracket_search: a step down while a rate found light is known goes at least this many parts of a step (of backpressure.fine_steps) under that rate, so a backlog over queue.high_mark drains within about a second instead of standing there while the search moves one part at a time (0: the middle of the bracket)", check=_between(0, 1024)),
    Setting("backpressure.release_within_intake", False, _bool, "stepwise with bracket_search: a bolt whose own emit rate is limited does not release an upstream past the input rate that limit lets it execute (its limit times the tuples it takes in per tuple it emits), and a step down goes at least that far: a light queue under a limited bolt says nothing of faster rates, which only fill it (false: document 000)"),
    Setting("backpressure.settle_after_release", False, _bool, "stepwise with bracket_search and queue_smoothing_ms: after a release, a queue that was not idle counts its next light window only from when the release shows in the smoothed level (3 time constants): before that it reads light at the rate it had (false: document 000)"),
    Setting("backpressure.release_after_limit_in_use", False, _bool, "stepwise with queue_smoothing_ms: a light task releases an upstream bolt whose own input is held (it holds its upstreams, or one at its intake bound) only on a light window begun after that bolt's limit had bound its emits for 3 time constants of the smoothed level, waiting at most 4 x backpressure.sensitivity_ms for it (false: document 000)"),
    Setting("backpressure.source_stop.stop_rate", 200.0, _float, "source_stop: tuples/s a stopped spout may still emit (a resume waits out one emit call at this rate)", check=_between(0, MAX_RATE, above=True)),
    Setting("backpressure.water_mark.high", 0.8, _float, "watermark: fraction of queue.hard_bound at or over which a task is overloaded (document 003)", check=_fraction),
    Setting("backpressure.water_mark.low", 0.2, _float, "watermark: fraction of queue.hard_bound at or under which an overloaded task has recovered", check=_fraction),
    Setting("backpressure.water_mark.check_interval_ms", 1000.0, _float, "watermark: re-report and ramp-step period (JStorm's topology.backpressure.check.interval)", check=_between(0, HOUR_MS, above=True)),
    Setting("backpressure.adaptive.high", 0.7, _float, "adaptive: first threshold (high water level), fraction of queue.hard_bound (document 004)", check=_fraction),
    Setting("backpressure.adaptive.high_min", 0.6, _float, "adaptive: lowest the first threshold is moved to", check=_fraction),
    Setting("backpressure.adaptive.high_max", 0.9, _float, "adaptive: highest the first threshold is moved to", check=_between(0, 1, above=True)),
    Setting("backpressure.adaptive.low", 0.2, _float, "adaptive: second threshold (low water level), fraction of queue.hard_bound", check=_fraction),
    Setting("backpressure.adaptive.low_min", 0.1, _float, "adaptive: lowest the second threshold is moved to", check=_fraction),
    Setting("backpressure.adaptive.low_max", 0.4, _float, "adaptive: highest the second threshold is moved to", check=_fraction),
    Setting("backpressure.adaptive.threshold_step", 0.1, _float, "adaptive: both thresholds move together by this", check=_fraction),
    Setting("backpressure.adaptive.window_ms", 10000.0, _float, "adaptive: the backpressure window, a fixed period sampled uniformly", check=_between(0, HOUR_MS, above=True)),
    Setting("backpressure.adaptive.samples", 20, _int, "adaptive: samples per backpressure window", check=_between(1, 100_000)),
    Setting("backpressure.adaptive.preset_ratio", 0.5, _float, "adaptive: share of the window over the first threshold that raises the thresholds", check=_between(0, 1, above=True)),
    Setting("backpressure.adaptive.coefficient_step", 0.1, _float, "adaptive: an upstream's rate coefficient moves by this per flag added or removed", check=_fraction),
    Setting("backpressure.adaptive.preset_coefficient", 0.2, _float, "adaptive: the rate coefficient's floor; at it, flags ask for another parallel task", check=_between(0, 1, above=True)),
    Setting("backpressure.adaptive.scale_ratio", 0.5, _float, "adaptive: share of a component's tasks flagged that asks for one more task", check=_between(0, 1, above=True)),
    Setting("backpressure.adaptive.autoscale", "auto", _auto_or_bool, "adaptive: auto grows the bolts whose state autoscaling can keep exact (in one process or across workers: fields grouping only into a KeyedBolt on the same fields; with checkpoints, no bolt with a state of its own that is not such a KeyedBolt) and leaves the rest at their parallelism; true refuses, in one line, a topology where some bolt cannot be; false never scales"),
    Setting("backpressure.adaptive.max_parallelism", 4, _int, "adaptive: autoscaling never takes a component past this many tasks", check=_between(1, 1024)),
    Setting("backpressure.adaptive.cooldown_ms", 30000.0, _float, "adaptive: least time between two scale actions on one component", check=_between(0, DAY_S * 1000)),
    Setting("backpressure.adaptive.check_interval_ms", 250.0, _float, "adaptive: how often an upstream checks its downstream flags and levels", check=_between(0, HOUR_MS, above=True)),
    Setting("backpressure.adaptive.balance_shift", 0.1, _float, "adaptive: share of the fullest downstream task's traffic moved to the emptiest per check", check=_fraction),
    Setting("backpressure.window.initial", 16, _int, "window: send window (tuples in flight) per downstream task at start (document 002)", check=_between(1, 1_000_000)),
    Setting("backpressure.window.min", 1, _int, "window: smallest a send window shrinks to", check=_between(1, 1_000_000)),
    Setting("backpressure.window.max", 4096, _int, "window: largest a send window grows to", check=_between(1, 1_000_000)),
    Setting("backpressure.window.rtt_threshold_ms", 50.0, _float, "window: an ack round trip more than this over the smallest one seen (the queueing delay a window lets build up) is SLOW (the window shrinks), at most this over it NORMAL (it grows)", check=_between(0, HOUR_MS, above=True)),
    Setting("backpressure.window.batch", 256, _int, "window: tuples a spout sends together as one batch (as batch.size by default: smaller batches cost a CPU-bound topology throughput)", check=_between(1, 65536)),
    Setting("backpressure.window.check_interval_ms", 50.0, _float, "window: period of the windows' update when the engine reports no per-tuple acks", check=_between(0, HOUR_MS, above=True)),
    Setting("coordinator", "embedded", _str, "where signals travel: embedded, or zookeeper://host:port/root", check=_coordinator),
    Setting("zookeeper.session_timeout_s", 10.0, _float, "ZooKeeper session timeout; a task state vanishes this long after its process dies", check=_between(0, 600, above=True)),
    Setting("zookeeper.connect_timeout_s", 5.0, _float, "how long topo run waits for ZooKeeper at start before it gives up", check=_between(0, 300, above=True)),
    Setting("zookeeper.auth_file", None, _str, "file holding one line SCHEME:CREDENTIALS (digest:user:password) for ZooKeeper; the environment's TOPO_ZK_AUTH wins; with credentials every znode of the topology is creator-only", nullable=True),
    Setting("zookeeper.read_open", False, _bool, "with credentials, let anyone read the topology's znodes (rates, states); writing stays creator-only"),
    Setting("zookeeper.tls.ca", None, _str, "CA certificate (PEM) that signs ZooKeeper's; set to connect with TLS (to its secureClientPort)", nullable=True),
    Setting("zookeeper.tls.cert", None, _str, "client certificate (PEM) for a ZooKeeper that asks for one; with zookeeper.tls.key", nullable=True),
    Setting("zookeeper.tls.key", None, _str, "private key (PEM) of zookeeper.tls.cert", nullable=True),
    Setting("metrics.port", 0, _int, "Prometheus exporter port on 127.0.0.1; 0 turns it off", check=_port),
    Setting("metrics.host", "127.0.0.1", _str, "address the Prometheus exporter listens on; one that is not loopback gets a warning at start"),
    Setting("metrics.tls.cert", None, _str, "certificate (PEM) the Prometheus exporter serves HTTPS with; with metrics.tls.key", nullable=True),
    Setting("metrics.tls.key", None, _str, "private key (PEM) of metrics.tls.cert", nullable=True),
    Setting("metrics.tls.client_ca", None, _str, "CA (PEM): only scrapers with a client certificate it signed get an answer; needs metrics.tls.cert", nullable=True),
    Setting("status.path", None, _str, "file topo run writes its task states to every second (for topo status); null: $XDG_STATE_HOME/topo/status/<topology>.json", nullable=True),
    Setting("seed", None, _int, "seed for shuffle start positions; null picks one at random", nullable=True,
            check=_between(0, 2**63 - 1)),
    Setting("gc.young_threshold", 100_000, _int, "during a local run, allocations between young-generation GC passes (Python's default 700); 0 leaves GC alone", check=_between(0, 10_000_000)),
    Setting("spark.master", "local[*]", _str, "Spark master URL for the spark engine (--master overrides)"),
    Setting("spark.trigger_interval_ms", 1000.0, _float, "micro-batch interval (t_interval) in milliseconds", check=_between(0, HOUR_MS, above=True)),
    Setting("spark.rate_control", "doc001", _str, "admission control: document 001's controller, DStream PID, fixed cap or none",
            choices=("doc001", "pid", "fixed", "none")),
    Setting("spark.initial_rate", 500.0, _float, "slow start: records per source partition per second before the first batch ends",
            check=_slow_start),
    Setting("spark.min_rate", 100.0, _float, "the controllers never cap a source below this many records/s", check=_between(0, MAX_RATE)),
    Setting("spark.smooth_batches", 3, _int, "doc001 reads the processing rate over this many of the last finished batches (1: the latest alone, the document's reading)",
            check=_between(1, 3)),
    Setting("spark.headroom", 0.05, _float, "doc001 aims each batch this share of the interval under it (0: the whole interval, the document's aim)",
            check=_headroom),
    Setting("spark.late_floor", 0.5, _float, "doc001: a batch that starts late keeps at least this share of its cap when the reader cuts it (1: never cut)",
            check=_between(0, 1, above=True)),
    Setting("spark.max_rate_per_partition", None, _float, "fixed cap in records/s per source partition (rate_control fixed)",
            nullable=True, check=_between(0, MAX_RATE, above=True)),
    Setting("spark.max_rows_per_batch", None, _int, "hard limit on rows per micro-batch per source; null for none",
            nullable=True, check=_between(1, 1_000_000_000)),
    Setting("spark.core_num", None, _int, "cores pre-sharding spreads each batch over; null uses Spark's default parallelism",
            nullable=True, check=_between(1, 4096)),
    Setting("spark.shuffle_partitions", None, _int, "partitions of stateful stages (spark.sql.shuffle.partitions); null = core_num",
            nullable=True, check=_between(1, 100_000)),
    Setting("spark.chain", True, _bool, "run a bolt inside its spout's reader where it is the spout's only reader, reads "
            "nothing else and needs no shuffle (one Python stage where there were two, as Flink chains operators)"),
    Setting("spark.sink", "sqlite:topo-results.db", _str, "where terminal streams go: sqlite:PATH, postgresql://..., or none"),
    Setting("spark.checkpoint_dir", None, _str, "streaming checkpoint (keep it to resume a run); null uses a temporary one",
            nullable=True),
    Setting("spark.checkpoint_file_manager", "auto", _str, "what writes the offset and commit logs: auto (Spark's "
            "FileSystem-based manager for a local checkpoint, Spark's default elsewhere), filesystem, or spark",
            choices=("auto", "filesystem", "spark")),
    Setting("spark.state_dir", None, _str, "directory for the rate files the source reader reads; null uses a temporary one",
            nullable=True),
    Setting("spark.shared_dir", None, _str, "on a multi-machine cluster: a directory every worker and the driver mount at "
            "the same path; file logs must lie under it and the default checkpoint goes there", nullable=True),
    Setting("spark.log", "file", _str, "Spark's own log: a file under spark-logs/ (file) or the terminal (console)",
            choices=("file", "console")),
)

BY_KEY: dict[str, Setting] = {s.key: s for s in SETTINGS}


def coerce(key: str, value: Any) -> Any:
    """Parse and check one setting; raises ``ConfigError`` naming key and value."""
    s = BY_KEY.get(key)
    if s is None:
        close = [k for k in BY_KEY if k.split(".")[-1] == key.split(".")[-1] or k.startswith(key)]
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ConfigError(key, value, "unknown setting" + hint)
    if value is None:
        if s.nullable:
            return None
        raise ConfigError(key, value, "cannot be null")
    try:
        parsed = s.parse(value)
    except ValueError as e:
        raise ConfigError(key, value, str(e)) from None
    if s.choices and parsed not in s.choices:
        raise ConfigError(key, value, f"must be one of {', '.join(s.choices)}")
    if s.check:
        err = s.check(parsed)
        if err:
            raise ConfigError(key, value, err)
    return parsed


class ResolvedConfig(dict):
    """A complete, checked config (what ``resolve`` returns): engines take it as it is.

    A plain dict handed to an engine is a layer of overrides and is resolved first;
    the type, not the presence of some key, says which of the two a caller passed.
    """


def resolve(*layers: Mapping[str, Any]) -> ResolvedConfig:
    """Defaults overlaid by each layer in turn (file config, then command line)."""
    out = ResolvedConfig({s.key: s.default for s in BY_KEY.values()})
    for layer in layers:
        for k, v in layer.items():
            out[k] = coerce(k, v)
    if out["queue.hard_bound"] is None:
        out["queue.hard_bound"] = 2 * out["queue.high_mark"]
    if out["queue.low_mark"] >= out["queue.high_mark"]:
        raise ConfigError("queue.low_mark", out["queue.low_mark"], "must be below queue.high_mark")
    if out["backpressure.water_mark.low"] >= out["backpressure.water_mark.high"]:
        raise ConfigError("backpressure.water_mark.low", out["backpressure.water_mark.low"],
                          "must be below backpressure.water_mark.high")
    if out["backpressure.policy"] == "window" and not out["acking"]:
        raise ConfigError("backpressure.policy", "window",
                          "window sizes its send windows from ack round trips: set acking: true")
    if out["backpressure.policy"] == "window" and out["acking.granularity"] == "batch":
        raise ConfigError("acking.granularity", "batch",
                          "window acks and re-sends tuple by tuple: use acking.granularity: tuple with it")
    if out["queue.hard_bound"] < out["queue.high_mark"]:
        raise ConfigError("queue.hard_bound", out["queue.hard_bound"], "must be at least queue.high_mark")
    return out


def parse_override(text: str) -> tuple[str, Any]:
    """``key=value`` from the command line; the value is read as YAML scalar."""
    import yaml

    if "=" not in text:
        raise ConfigError(text, text, "expected key=value")
    key, raw = text.split("=", 1)
    key = key.strip()
    try:
        value = yaml.safe_load(raw) if raw.strip() else raw
    except yaml.YAMLError:
        value = raw
    return key, coerce(key, value)
