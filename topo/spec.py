"""topology.yaml -> Topology, in the shape of Storm Flux.

```yaml
name: wordcount
config: {acking: true, queue.high_mark: 10MB}
spouts:
  - {id: sentences, class: mypkg.spouts.Sentences, args: [1000], parallelism: 1}
bolts:
  - {id: split, class: mypkg.bolts.Split, kwargs: {lower: true}, parallelism: 2}
  - {id: count, class: mypkg.bolts.Count, parallelism: 2}
streams:
  - {from: sentences, to: split, grouping: {type: shuffle}}
  - {from: split, to: count, grouping: {type: fields, fields: [word]}}
```

A bolt may also set ``blocking: true`` (run ``execute`` on a worker thread) and
``execute_timeout_s`` (cancel an execute that runs longer and fail its tuple), the
YAML form of the ``Bolt`` attributes of the same names.

The file is composed (``yaml.compose`` with ``SafeLoader``) rather than loaded, and
the node tree is walked by hand: nodes keep their line, plain dicts do not, and every
mistake must come back as one line ``path:line: key: message (got value)`` that points
into the file. Scalars and ``args``/``kwargs`` are built by the same safe constructor
``yaml.safe_load`` uses, so the accepted YAML is exactly safe YAML (anchors and merge
keys included). All schema mistakes of a file are reported together; the
topology-level checks (``Topology.problems``: unknown sources, undeclared streams,
fields, cycles) run once the schema is clean, and each is mapped back to the line of
the stream or component it names. Keeping those checks in ``topology.py`` and only
*locating* them here means the Python builder and the YAML loader cannot disagree.

Hostile files are bounded: a file over ``MAX_FILE_BYTES`` (1 MB) is refused before
it is parsed; nesting deeper than ``MAX_DEPTH`` levels is refused while composing; and
aliases may repeat at most ``MAX_ALIAS_EXPANSION`` values in all (a "billion laughs"
file is refused before anything expands it). Values are shortened before they are
formatted into a message (``topo.config.short_repr``), so no error costs more than
its line.

Each parallel task gets its own instance: the builder is handed a zero-argument
factory that constructs the class with a deep copy of ``args``/``kwargs``.
Classes are imported by dotted name from ``sys.path`` as it is; the ``topo`` command
puts the working directory on it, as ``python -m`` does.
"""
from __future__ import annotations

import copy
import difflib
import functools
import importlib
import inspect
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from topo.api import DEFAULT_STREAM, Bolt, Spout
from topo.config import BY_KEY, ConfigError, coerce, resolve, short_repr
from topo.groupings import GROUPINGS, FieldsGrouping, Grouping
from topo.topology import MAX_PARALLELISM, BoltDeclarer, Topology, TopologyBuilder, TopologyError

_NO_VALUE: Any = object()
MAX_FILE_BYTES = 1_000_000       # a topology file is a few KB; this is generous
MAX_DEPTH = 100                  # levels of nested mappings and lists
MAX_ALIAS_EXPANSION = 100_000    # values that aliases may repeat, in all
_MAX_MESSAGE = 500
_ID = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*$")

TOP_KEYS = ("name", "config", "spouts", "bolts", "streams")
COMPONENT_KEYS = ("id", "class", "args", "kwargs", "parallelism", "execute_timeout_s", "blocking")
# Bolt attributes a YAML file may set per component (``Bolt.execute_timeout_s``, ``Bolt.blocking``).
BOLT_ATTRIBUTES = ("execute_timeout_s", "blocking")
STREAM_KEYS = ("name", "from", "to", "grouping")
GROUPING_KEYS = ("type", "fields", "stream")

# Flux spellings a Storm user will reach for first, and what topo calls them.
# ``name@context`` entries apply inside one kind of mapping only.
_RENAMED: dict[str, tuple[str | None, str]] = {
    "className": ("class", "use 'class'"),
    "constructorArgs": ("args", "use 'args' (a list) or 'kwargs' (a mapping)"),
    "streamId": ("stream", "use 'stream'"),
    "args@grouping": ("fields", "use 'fields: [...]' for a fields grouping"),
    "includes": (None, "includes are not supported; put the whole topology in one file"),
    "components": (None, "Flux bean components are not supported; pass values through 'args'/'kwargs'"),
    "topologySource": (None, "topologySource is not supported; list spouts, bolts and streams"),
    "configMethods": (None, "configMethods are not supported; pass values through 'args'/'kwargs'"),
    "properties": (None, "properties are not supported; pass values through 'kwargs'"),
}


@dataclass(frozen=True)
class Problem:
    """One mistake: where (file and line), which key, what is wrong, and the value seen."""

    path: str
    line: int | None
    key: str
    message: str
    value: Any = _NO_VALUE

    def __str__(self) -> str:
        where = self.path if self.line is None else f"{self.path}:{self.line}"
        got = "" if self.value is _NO_VALUE else f" (got {short_repr(self.value)})"
        message = self.message.replace("\n", " ")  # one line, whatever a constructor raised
        if len(message) > _MAX_MESSAGE:
            message = message[: _MAX_MESSAGE - 3] + "..."
        key = self.key if len(self.key) <= 200 else self.key[:197] + "..."
        return f"{where}: {key}: {message}{got}"


class SpecError(TopologyError):
    """A topology file that cannot run. ``str()`` is one line per mistake, no traceback needed."""

    def __init__(self, problems: Sequence[Problem]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(map(str, self.problems)))

    @property
    def first(self) -> Problem:
        return self.problems[0]

    @property
    def line(self) -> int | None:
        return self.first.line

    @property
    def key(self) -> str:
        return self.first.key


def config_problem(source: str, line: int | None, err: ConfigError, prefix: str = "") -> Problem:
    """A ``ConfigError`` as a ``Problem``; for unknown keys a close spelling is suggested."""
    message = err.reason
    if message == "unknown setting":
        close = difflib.get_close_matches(err.key, list(BY_KEY), n=1, cutoff=0.6)
        if close:
            message += f"; did you mean {close[0]!r}?"
    return Problem(source, line, prefix + err.key, message, err.value)


@dataclass
class _Component:
    """Where one component sits in the file, for mapping later problems back to it."""

    id: str
    kind: str
    prefix: str
    line: int
    lines: dict[str, int] = field(default_factory=dict)
    loaded: bool = False


@dataclass
class _Stream:
    source: str
    target: str
    stream: str
    prefix: str
    line: int
    lines: dict[str, int] = field(default_factory=dict)
    values: dict[str, Any] = field(default_factory=dict)


@dataclass
class TopologySpec:
    """A loaded topology file: the topology plus where everything was written."""

    path: str
    topology: Topology
    config_lines: dict[str, int]
    config_line: int | None
    # component id -> (key prefix such as "bolts[2]", its line, the lines of its keys)
    component_places: dict[str, tuple[str, int, dict[str, int]]] = field(default_factory=dict)

    def where(self, component: str, part: str) -> str:
        """``file:line: bolts[2].kwargs.path``: where a component's ``part`` was written."""
        prefix, line, lines = self.component_places.get(component, (component, None, {}))
        line = lines.get(part) or lines.get(part.split(".", 1)[0], line)
        return f"{self.path}:{line}: {prefix}.{part}" if line else f"{self.path}: {prefix}.{part}"

    def resolve_config(self, overrides: Mapping[str, Any] | None = None,
                       source: str = "--config") -> dict[str, Any]:
        """The run's config: defaults, then the file's ``config``, then ``overrides``.

        A cross-setting mistake (``queue.low_mark`` above ``queue.high_mark``) is
        blamed on the override when it came from the command line, else on the file.
        """
        overrides = dict(overrides or {})
        try:
            return resolve(self.topology.config, overrides)
        except ConfigError as e:
            if e.key in overrides:
                raise SpecError([config_problem(source, None, e)]) from None
            line = self.config_lines.get(e.key, self.config_line)
            raise SpecError([config_problem(self.path, line, e, "config.")]) from None


def load(path: str | Path) -> Topology:
    """The topology described by the file at ``path``; raises ``SpecError``."""
    return load_spec(path).topology


def load_spec(path: str | Path) -> TopologySpec:
    """Read and check ``path``; raises ``SpecError`` naming file, line and key."""
    name = str(path)
    try:
        with open(path, "rb") as f:     # never more than the limit, whatever the file claims
            size = max(os.fstat(f.fileno()).st_size, 0)
            data = f.read(MAX_FILE_BYTES + 1) if size <= MAX_FILE_BYTES else b""
        text = data.decode("utf-8")
    except (OSError, UnicodeDecodeError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise SpecError([Problem(name, None, "file", f"cannot read: {reason}")]) from None
    if size > MAX_FILE_BYTES or len(data) > MAX_FILE_BYTES:
        raise SpecError([_too_big(name, size if size > MAX_FILE_BYTES else None)])
    return loads(text, name)


def _too_big(name: str, size: int | None) -> Problem:
    got = f"{size} bytes" if size is not None else f"more than {MAX_FILE_BYTES} bytes"
    return Problem(name, None, "file", f"over the {MAX_FILE_BYTES // 1_000_000} MB limit for a topology file "
                                       f"(got {got})")


def loads(text: str, path: str = "<string>") -> TopologySpec:
    """Like ``load_spec`` for YAML text; ``path`` is only used in messages."""
    if len(text) > MAX_FILE_BYTES:
        raise SpecError([_too_big(path, len(text.encode("utf-8", "replace")))])
    return _Reader(path).read(text)


class _BoundedLoader(yaml.SafeLoader):
    """``SafeLoader`` that refuses deep nesting while composing (PyYAML's composer is
    recursive) and remembers where each alias is used, for ``_check_aliases``."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.depth = 0
        self.alias_uses: list[tuple[Node, Any]] = []

    def compose_node(self, parent: Node | None, index: Any) -> Node:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            node = super().compose_node(parent, index)
            self.alias_uses.append((node, event.start_mark))
            return node
        self.depth += 1
        try:
            if self.depth > MAX_DEPTH:
                raise yaml.composer.ComposerError(None, None, f"nested deeper than {MAX_DEPTH} levels",
                                                  event.start_mark)
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


def _compose(text: str) -> tuple[Node | None, list[tuple[Node, Any]]]:
    loader = _BoundedLoader(text)
    try:
        return loader.get_single_node(), loader.alias_uses
    finally:
        loader.dispose()


def _check_aliases(uses: list[tuple[Node, Any]]) -> tuple[int, str] | None:
    """(line, message) when aliases repeat more than ``MAX_ALIAS_EXPANSION`` values in
    all (a "billion laughs" document), or one refers to a node that contains it."""
    sizes: dict[int, int] = {}
    open_: set[int] = set()

    def size(node: Node) -> int:        # values under node, aliases expanded (memoised: linear)
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in open_:
            raise RecursionError
        open_.add(key)
        n = 1
        if isinstance(node, SequenceNode):
            n += sum(size(c) for c in node.value)
        elif isinstance(node, MappingNode):
            n += sum(size(k) + size(v) for k, v in node.value)
        open_.discard(key)
        sizes[key] = n = min(n, 1 << 62)
        return n

    repeated = 0
    for node, mark in uses:
        try:
            repeated += size(node)
        except RecursionError:
            return mark.line + 1, "an alias refers to a node that contains it"
        if repeated > MAX_ALIAS_EXPANSION:
            return mark.line + 1, (f"aliases expand to more than {MAX_ALIAS_EXPANSION} values "
                                   "(an alias bomb?); an anchor may be reused, not multiplied")
    return None


def _instantiate(cls: type, args: list[Any], kwargs: dict[str, Any],
                 attributes: dict[str, Any] | None = None) -> Any:
    """One fresh instance per task; args are copied so tasks never share mutable state.
    ``attributes`` (``execute_timeout_s``, ``blocking``) are set on the instance."""
    instance = cls(*copy.deepcopy(args), **copy.deepcopy(kwargs))
    for name, value in (attributes or {}).items():
        setattr(instance, name, value)
    return instance


def import_class(dotted: str) -> Any:
    """``package.module.Name`` (or ``package.module.Outer.Inner``) -> the object.

    Raises ``LookupError`` with a user-facing message; an exception raised while
    importing the user's module is reported as such, not as "not found".
    """
    parts = dotted.split(".")
    if len(parts) < 2 or not all(p.isidentifier() for p in parts):
        raise LookupError("expected a dotted name such as package.module.ClassName")
    for cut in range(len(parts) - 1, 0, -1):
        module_name = ".".join(parts[:cut])
        try:
            obj: Any = importlib.import_module(module_name)
        except ModuleNotFoundError as e:
            if e.name and (module_name == e.name or module_name.startswith(e.name + ".")):
                continue  # this prefix is not a module; try a shorter one
            raise LookupError(f"importing {module_name} failed: {type(e).__name__}: {e}") from None
        except Exception as e:  # the user's module itself is broken
            raise LookupError(f"importing {module_name} failed: {type(e).__name__}: {e}") from None
        for i, attr in enumerate(parts[cut:], cut):
            if not hasattr(obj, attr):
                raise LookupError(f"{'.'.join(parts[:i])} has no attribute {attr!r}")
            obj = getattr(obj, attr)
        return obj
    raise LookupError(f"no module named {parts[0]!r} (is it installed, or on PYTHONPATH?)")


class _Reader:
    """Walks one file's node tree, collecting problems instead of stopping at the first."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.problems: list[Problem] = []
        self._constructor = yaml.SafeLoader("")  # builds plain values from nodes, safely
        self.components: dict[str, _Component] = {}
        self.streams: list[_Stream] = []
        self.declarers: dict[str, BoltDeclarer] = {}
        # (mapping node, key) pairs already blamed on a misspelling: not "missing" too.
        self.misspelled: set[tuple[int, str]] = set()
        self.top_lines: dict[str, int] = {}

    # -- reporting -------------------------------------------------------------------
    def error(self, where: Node | int | None, key: str, message: str, value: Any = _NO_VALUE) -> None:
        line = where.start_mark.line + 1 if isinstance(where, Node) else where
        self.problems.append(Problem(self.path, line, key, message, value))

    def missing(self, node: Node, key: str, message: str) -> None:
        """Report a required key that is absent, unless it was reported misspelled."""
        if (id(node), key.rsplit(".", 1)[-1]) not in self.misspelled:
            self.error(node, key, "missing; " + message)

    def fail(self) -> SpecError:
        return SpecError(self.problems)

    # -- node readers ----------------------------------------------------------------
    def value(self, node: Node, key: str) -> Any:
        """The plain Python value of ``node`` (what safe_load would give)."""
        try:
            return self._constructor.construct_object(node, deep=True)
        except yaml.YAMLError as e:
            self.error(node, key, f"cannot read value: {getattr(e, 'problem', None) or e}")
            return _NO_VALUE

    def mapping(self, node: Node, key: str, allowed: Sequence[str], what: str = "a mapping",
                context: str = "") -> dict[str, tuple[Node, Node]] | None:
        """``{key: (key node, value node)}``; flags unknown and duplicated keys."""
        if not isinstance(node, MappingNode):
            self.error(node, key or "topology", f"expected {what}", self.value(node, key))
            return None
        first: dict[str, int] = {}
        for k, _ in node.value:
            if isinstance(k, ScalarNode) and k.tag != "tag:yaml.org,2002:merge":
                if k.value in first:
                    self.error(k, _join(key, k.value), f"duplicate key (first at line {first[k.value]})")
                first.setdefault(k.value, k.start_mark.line + 1)
        try:
            self._constructor.flatten_mapping(node)  # resolve `<<: *anchor` merge keys
        except yaml.YAMLError as e:
            self.error(node, key, f"bad merge key: {getattr(e, 'problem', None) or e}")
            return None
        out: dict[str, tuple[Node, Node]] = {}
        for k, v in node.value:
            if not isinstance(k, ScalarNode) or k.tag != "tag:yaml.org,2002:str":
                self.error(k, key or "topology", "keys must be strings", self.value(k, key))
                continue
            name = k.value
            if name not in allowed:
                meant, hint = _RENAMED.get(f"{name}@{context}") or _RENAMED.get(name) or (None, "")
                if not hint:
                    close = difflib.get_close_matches(name, allowed, n=1, cutoff=0.6)
                    meant = close[0] if close else None
                    hint = f"did you mean {meant!r}?" if meant else "expected one of " + ", ".join(allowed)
                self.error(k, _join(key, name), f"unknown key; {hint}")
                if meant:
                    self.misspelled.add((id(node), meant))
                continue
            out[name] = (k, v)
        return out

    def sequence(self, node: Node, key: str, what: str) -> list[Node] | None:
        if _is_null(node):
            return []
        if not isinstance(node, SequenceNode):
            self.error(node, key, f"expected {what}", self.value(node, key))
            return None
        return list(node.value)

    def string(self, node: Node, key: str, pattern: re.Pattern[str] | None = None,
               what: str = "a string") -> str | None:
        value = self.value(node, key)
        if value is _NO_VALUE:
            return None
        if not isinstance(value, str) or not value:
            self.error(node, key, f"expected {what}", value)
            return None
        if pattern and not pattern.match(value):
            self.error(node, key, f"expected {what}: letters, digits, '_', '.', '-', "
                                  "not starting with '.' or '-'", value)
            return None
        return value

    # -- the file --------------------------------------------------------------------
    def read(self, text: str) -> TopologySpec:
        try:
            root, alias_uses = _compose(text)
        except yaml.MarkedYAMLError as e:
            mark = e.problem_mark or e.context_mark
            line = mark.line + 1 if mark else None
            lines = text.splitlines()
            got = lines[line - 1].strip() if line and line <= len(lines) else _NO_VALUE
            self.error(line, "syntax", str(e.problem or e.context or "invalid YAML"), got)
            raise self.fail() from None
        except yaml.YAMLError as e:
            self.error(None, "syntax", str(e))
            raise self.fail() from None
        too_many = _check_aliases(alias_uses)
        if too_many is not None:
            self.error(too_many[0], "yaml", too_many[1])
            raise self.fail()
        if root is None or _is_null(root):
            self.error(1, "topology", "the file is empty; expected a mapping with name, spouts, bolts, streams")
            raise self.fail()
        top = self.mapping(root, "", TOP_KEYS, "a mapping with name, spouts, bolts, streams")
        if top is None:
            raise self.fail()
        self.top_lines = {k: kn.start_mark.line + 1 for k, (kn, _) in top.items()}

        name = None
        if "name" not in top:
            self.missing(root, "name", "every topology needs a name")
        else:
            name = self.string(top["name"][1], "name", _ID, "a topology name")
        config, config_lines = self.config(top.get("config"))
        builder = TopologyBuilder(name or "?", config)
        for kind in ("spouts", "bolts"):
            if kind in top:
                self.components_of(top[kind][1], kind, builder)
            elif kind == "spouts":
                self.missing(root, "spouts", "a topology needs at least one spout")
        if "streams" in top:
            self.streams_of(top["streams"][1], builder)
        if self.problems:
            raise self.fail()

        try:
            topology = builder.build()
        except TopologyError:
            # The same checks, one problem at a time, so each can be located.
            # (the builder only offers the joined message; its components are what it checked)
            topology = Topology(builder.name, dict(builder._components), dict(builder.config))
            for message in topology.problems():
                self.locate(message)
            raise self.fail() from None
        config_line = self.top_lines.get("config")
        spec = TopologySpec(self.path, topology, config_lines, config_line,
                            {c.id: (c.prefix, c.line, c.lines) for c in self.components.values()})
        spec.resolve_config()  # cross-setting checks (low mark below high mark) belong to the file
        return spec

    def config(self, entry: tuple[Node, Node] | None) -> tuple[dict[str, Any], dict[str, int]]:
        """The file's settings, each checked on its own line.

        Keys are the flat dotted names of ``configs/default.yaml``; nested mappings
        (``queue: {high_mark: 10MB}``) are accepted and flattened to the same names.
        """
        out: dict[str, Any] = {}
        lines: dict[str, int] = {}
        if entry is None or _is_null(entry[1]):
            return out, lines

        def walk(node: Node, prefix: str) -> None:
            if not isinstance(node, MappingNode):
                self.error(node, prefix.rstrip(".") or "config", "expected a mapping of settings",
                           self.value(node, "config"))
                return
            for k, v in node.value:
                if not isinstance(k, ScalarNode):
                    self.error(k, "config", "keys must be strings", self.value(k, "config"))
                    continue
                key = prefix + str(k.value)
                if isinstance(v, MappingNode) and key not in BY_KEY:
                    walk(v, key + ".")
                    continue
                if key in lines:
                    self.error(k, f"config.{key}", f"duplicate setting (first at line {lines[key]})")
                    continue
                lines[key] = k.start_mark.line + 1
                value = self.value(v, f"config.{key}")
                if value is _NO_VALUE:
                    continue
                try:
                    out[key] = coerce(key, value)
                except ConfigError as e:
                    self.problems.append(config_problem(self.path, v.start_mark.line + 1, e, "config."))

        walk(entry[1], "")
        return out, lines

    def components_of(self, node: Node, kind: str, builder: TopologyBuilder) -> None:
        items = self.sequence(node, kind, f"a list of {kind}")
        for i, item in enumerate(items or ()):
            self.component(item, kind, f"{kind}[{i}]", builder)

    def component(self, node: Node, kind: str, prefix: str, builder: TopologyBuilder) -> None:
        what = "a spout" if kind == "spouts" else "a bolt"
        m = self.mapping(node, prefix, COMPONENT_KEYS, f"{what}: a mapping with id and class")
        if m is None:
            return
        lines = {k: kn.start_mark.line + 1 for k, (kn, _) in m.items()}
        problems_before = len(self.problems)

        cid = None
        if "id" not in m:
            self.missing(node, f"{prefix}.id", "every component needs an id")
        else:
            cid = self.string(m["id"][1], f"{prefix}.id", _ID, "a component id")
            if cid is not None and cid in self.components:
                self.error(m["id"][1], f"{prefix}.id",
                           f"duplicate id (first at line {self.components[cid].line})", cid)
                cid = None
        if cid is not None:
            self.components[cid] = _Component(cid, kind[:-1], prefix, node.start_mark.line + 1, lines)

        cls = self.component_class(m, node, kind, prefix)
        args: list[Any] = []
        kwargs: dict[str, Any] = {}
        if "args" in m and not _is_null(m["args"][1]):
            value = self.value(m["args"][1], f"{prefix}.args")
            if value is not _NO_VALUE and not isinstance(value, list):
                self.error(m["args"][1], f"{prefix}.args", "expected a list of constructor arguments", value)
            elif value is not _NO_VALUE:
                args = value
        if "kwargs" in m and isinstance(m["kwargs"][1], MappingNode):
            lines.update({f"kwargs.{k.value}": k.start_mark.line + 1 for k, _ in m["kwargs"][1].value
                          if isinstance(k, ScalarNode)})
        if "kwargs" in m and not _is_null(m["kwargs"][1]):
            value = self.value(m["kwargs"][1], f"{prefix}.kwargs")
            if value is not _NO_VALUE and not (isinstance(value, dict) and all(isinstance(k, str) for k in value)):
                self.error(m["kwargs"][1], f"{prefix}.kwargs", "expected a mapping of keyword arguments", value)
            elif value is not _NO_VALUE:
                kwargs = value
        parallelism = 1
        if "parallelism" in m:
            value = self.value(m["parallelism"][1], f"{prefix}.parallelism")
            if value is not _NO_VALUE and (not isinstance(value, int) or isinstance(value, bool)
                                           or not 1 <= value <= MAX_PARALLELISM):
                self.error(m["parallelism"][1], f"{prefix}.parallelism",
                           f"must be an integer from 1 to {MAX_PARALLELISM}", value)
            elif value is not _NO_VALUE:
                parallelism = value
        attributes: dict[str, Any] = {}
        for name in BOLT_ATTRIBUTES:
            if name not in m:
                continue
            value = self.value(m[name][1], f"{prefix}.{name}")
            if value is _NO_VALUE:
                continue
            if kind != "bolts":
                self.error(m[name][1], f"{prefix}.{name}", "only a bolt has this setting", value)
            elif name == "blocking" and not isinstance(value, bool):
                self.error(m[name][1], f"{prefix}.{name}", "must be true or false", value)
            elif name == "execute_timeout_s" and (isinstance(value, bool) or not isinstance(value, (int, float))
                                                  or not 0 < value <= 86_400):
                self.error(m[name][1], f"{prefix}.{name}", "must be a number of seconds above 0 and at most 86400",
                           value)
            else:
                attributes[name] = float(value) if name == "execute_timeout_s" else value
        if cid is None or cls is None or len(self.problems) > problems_before:
            return

        # Blame the constructor's complaint on what the user wrote last for it.
        blame = next((k for k in ("kwargs", "args", "class") if k in m), "class")
        blame_node = m[blame][1]
        try:
            inspect.signature(cls).bind(*args, **kwargs)
        except TypeError as e:
            self.error(blame_node, f"{prefix}.{blame}", f"{cls.__name__}() does not take these arguments: {e}",
                       self.value(blame_node, blame))
            return
        except ValueError:
            pass  # no introspectable signature; constructing will tell
        factory = functools.partial(_instantiate, cls, args, kwargs, attributes)
        try:
            if kind == "spouts":
                builder.spout(cid, factory, parallelism)
            else:
                self.declarers[cid] = builder.bolt(cid, factory, parallelism)
        except Exception as e:
            self.error(blame_node, f"{prefix}.{blame}",
                       f"constructing {cls.__name__} raised {type(e).__name__}: {e}", self.value(blame_node, blame))
            return
        self.components[cid].loaded = True

    def component_class(self, m: dict[str, tuple[Node, Node]], node: Node, kind: str, prefix: str) -> type | None:
        base = Spout if kind == "spouts" else Bolt
        if "class" not in m:
            self.missing(node, f"{prefix}.class", f"name a {base.__name__} subclass as package.module.Name")
            return None
        class_node = m["class"][1]
        dotted = self.string(class_node, f"{prefix}.class", what="a class name such as package.module.Name")
        if dotted is None:
            return None
        try:
            obj = import_class(dotted)
        except LookupError as e:
            self.error(class_node, f"{prefix}.class", str(e), dotted)
            return None
        if not isinstance(obj, type):
            self.error(class_node, f"{prefix}.class", f"is a {type(obj).__name__}, not a {base.__name__} class", dotted)
            return None
        if not issubclass(obj, base):
            other = Bolt if base is Spout else Spout
            place = "bolts" if base is Spout else "spouts"
            why = (f"is a {other.__name__}; list it under {place}" if issubclass(obj, other)
                   else f"is not a subclass of topo.{base.__name__}")
            self.error(class_node, f"{prefix}.class", why, dotted)
            return None
        return obj

    def streams_of(self, node: Node, builder: TopologyBuilder) -> None:
        items = self.sequence(node, "streams", "a list of streams")
        for i, item in enumerate(items or ()):
            self.stream(item, f"streams[{i}]", builder)

    def stream(self, node: Node, prefix: str, builder: TopologyBuilder) -> None:
        m = self.mapping(node, prefix, STREAM_KEYS, "a stream: a mapping with from, to and grouping")
        if m is None:
            return
        lines = {k: kn.start_mark.line + 1 for k, (kn, _) in m.items()}
        problems_before = len(self.problems)
        if "name" in m:
            self.string(m["name"][1], f"{prefix}.name")
        ends: dict[str, str | None] = {}
        for end in ("from", "to"):
            if end not in m:
                self.missing(node, f"{prefix}.{end}", "name a component id")
                ends[end] = None
                continue
            ends[end] = cid = self.string(m[end][1], f"{prefix}.{end}", what="a component id")
            if cid is None:
                continue
            known = self.components.get(cid)
            if known is None:
                self.error(m[end][1], f"{prefix}.{end}",
                           f"unknown component; declared: {', '.join(self.components) or 'none'}", cid)
                ends[end] = None
            elif end == "to" and known.kind == "spout":
                self.error(m[end][1], f"{prefix}.to", "is a spout; a stream must go into a bolt", cid)
                ends[end] = None
        grouping, stream, values = None, DEFAULT_STREAM, {}
        if "grouping" not in m:
            self.missing(node, f"{prefix}.grouping", "e.g. grouping: {type: shuffle}")
        else:
            grouping, stream, g_lines, values = self.grouping(m["grouping"][1], f"{prefix}.grouping")
            lines.update(g_lines)
        source, target = ends["from"], ends["to"]
        if source is None or target is None or grouping is None or len(self.problems) > problems_before:
            return
        self.streams.append(_Stream(source, target, stream, prefix, node.start_mark.line + 1, lines, values))
        if self.components[source].loaded and target in self.declarers:
            self.declarers[target].grouping(source, grouping, stream)

    def grouping(self, node: Node, key: str) -> tuple[Grouping | None, str, dict[str, int], dict[str, Any]]:
        stream = DEFAULT_STREAM
        m = self.mapping(node, key, GROUPING_KEYS, "a mapping such as {type: shuffle}", context="grouping")
        if m is None:
            return None, stream, {}, {}
        lines = {f"grouping.{k}": kn.start_mark.line + 1 for k, (kn, _) in m.items()}
        values: dict[str, Any] = {}
        if "stream" in m:
            stream = self.string(m["stream"][1], f"{key}.stream", what="a stream name") or stream
            values["stream"] = stream
        if "type" not in m:
            self.missing(node, f"{key}.type", f"one of {', '.join(GROUPINGS)}")
            return None, stream, lines, values
        kind = self.string(m["type"][1], f"{key}.type", what=f"one of {', '.join(GROUPINGS)}")
        if kind is None:
            return None, stream, lines, values
        cls = GROUPINGS.get(kind.lower())
        if cls is None:
            close = difflib.get_close_matches(kind.lower(), list(GROUPINGS), n=1, cutoff=0.6)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            self.error(m["type"][1], f"{key}.type", f"unknown grouping; one of {', '.join(GROUPINGS)}{hint}", kind)
            return None, stream, lines, values
        if cls is FieldsGrouping:
            if "fields" not in m:
                self.missing(node, f"{key}.fields", "a fields grouping needs fields: [name, ...]")
                return None, stream, lines, values
            fields = self.value(m["fields"][1], f"{key}.fields")
            if isinstance(fields, str):
                fields = [fields]
            if fields is _NO_VALUE:
                return None, stream, lines, values
            if not isinstance(fields, list) or not fields or not all(isinstance(f, str) and f for f in fields):
                self.error(m["fields"][1], f"{key}.fields", "expected a non-empty list of field names", fields)
                return None, stream, lines, values
            values["fields"] = fields
            return FieldsGrouping(fields), stream, lines, values
        if "fields" in m:
            self.error(m["fields"][0], f"{key}.fields", f"only a fields grouping takes fields, this one is {kind!r}",
                       self.value(m["fields"][1], f"{key}.fields"))
            return None, stream, lines, values
        return cls(), stream, lines, values

    # -- mapping Topology.problems() back to the file --------------------------------
    def locate(self, message: str) -> None:
        """Add ``message`` (from ``Topology.problems``) at the line of what it names."""
        m = re.match(r"bolt '([^']*)' reads from unknown component '([^']*)'", message)
        if m:
            return self.at_stream(m.group(2), m.group(1), None, "from", message)
        m = re.match(r"bolt '([^']*)' reads stream '([^']*)' that '([^']*)'", message)
        if m:
            return self.at_stream(m.group(3), m.group(1), m.group(2), "stream", message)
        m = re.match(r"bolt '([^']*)' subscribes to stream '([^']*)' of '([^']*)' twice", message)
        if m:
            if self.at_last_stream(lambda s: (s.source, s.target, s.stream) == (m.group(3), m.group(1), m.group(2)),
                                   message):
                return None
        m = re.match(r"bolt '([^']*)' reads fields ", message)
        if m and m.group(1) in self.components:
            c = self.components[m.group(1)]
            part = "kwargs" if "kwargs" in c.lines else "class"
            return self.error(c.lines.get(part, c.line), f"{c.prefix}.{part}", message)
        m = re.match(r"bolt '([^']*)' from '([^']*)': ", message)
        if m:
            return self.at_stream(m.group(2), m.group(1), None, "fields", message)
        m = re.match(r"cycle (\S+(?: -> \S+)+)", message)
        if m:
            path = m.group(1).split(" -> ")
            edges = set(zip(path, path[1:])) | set(zip(path[1:], path))
            if self.at_last_stream(lambda s: (s.source, s.target) in edges, message):
                return None
        m = re.match(r"component '([^']*)': parallelism", message)
        if m and m.group(1) in self.components:
            c = self.components[m.group(1)]
            return self.error(c.lines.get("parallelism", c.line), f"{c.prefix}.parallelism", message)
        if message == "no spouts":
            return self.error(self.top_lines.get("spouts", 1), "spouts", "a topology needs at least one spout")
        named = [n for n in re.findall(r"'([^']*)'", message) if n in self.components]
        if named:
            c = self.components[named[0]]
            return self.error(c.line, c.prefix, message, c.id)
        self.error(1, "topology", message)

    def at_last_stream(self, which: Callable[[_Stream], bool], message: str) -> bool:
        """Blame ``message`` on the last stream ``which`` selects (the one that closed a
        cycle or repeated a subscription); False when none does."""
        chosen = [s for s in self.streams if which(s)]
        if chosen:
            s = chosen[-1]
            self.error(s.line, s.prefix, message, f"{s.source} -> {s.target}")
        return bool(chosen)

    def at_stream(self, source: str, target: str, stream: str | None, part: str, message: str) -> None:
        candidates = [s for s in self.streams if s.source == source and s.target == target
                      and (stream is None or s.stream == stream)]
        if not candidates:
            return self.locate_component(target, message)
        s = candidates[0]
        if part == "from":
            return self.error(s.lines.get("from", s.line), f"{s.prefix}.from", message, source)
        sub = f"grouping.{part}"
        if sub in s.lines:
            return self.error(s.lines[sub], f"{s.prefix}.{sub}", message, s.values.get(part, _NO_VALUE))
        line = s.lines.get("grouping", s.line)
        value = stream if part == "stream" and stream is not None else _NO_VALUE
        self.error(line, f"{s.prefix}.grouping", message, value)

    def locate_component(self, cid: str, message: str) -> None:
        c = self.components.get(cid)
        self.error(c.line if c else 1, c.prefix if c else "topology", message)


def _join(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


def _is_null(node: Node) -> bool:
    return isinstance(node, ScalarNode) and node.tag == "tag:yaml.org,2002:null"
