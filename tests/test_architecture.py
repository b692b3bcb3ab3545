"""The import rules of ARCHITECTURE.md, kept by parsing (never importing) every module.

Every module under ``topo/``, ``runtime/`` and ``backpressure/`` sits on one floor
(``FLOORS``); a module may import its own floor and the floors ``MAY_IMPORT`` lists
for it, nothing else. Every import counts here, also one inside a function or under
``TYPE_CHECKING``: a lazy import is still a dependency. Separately, module-level
imports (not inside a function, not under ``TYPE_CHECKING``) must form no cycle.

``KNOWN_VIOLATIONS`` lists what breaks the rules today and is being fixed; the test
fails on anything not listed, and on a listed entry that no longer occurs, so the
list only shrinks.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("topo", "runtime", "backpressure")

# Floor -> the modules on it. A name matches that module; a name ending in ``.*`` matches
# the package and everything under it. The most specific match wins.
FLOORS: dict[str, tuple[str, ...]] = {
    # What a user touches: ``topo.run``, the CLI, ``topo status``, the YAML loader, the test
    # harness, the examples. Nothing below imports it.
    "surface": ("topo", "topo.cli", "topo.status", "topo.spec", "topo.testing", "topo.examples.*"),
    # The local engine, top to bottom: the engine assembles tasks; tasks run collectors;
    # collectors emit through the outbox and the acker (with queue, limiter, dead letters).
    "local.workers": ("runtime.local.workers",),
    "local.engine": ("runtime.local.engine",),
    "local.checkpoints": ("runtime.local.checkpoints",),
    "local.tasks": ("runtime.local.tasks",),
    "local.collectors": ("runtime.local.collectors",),
    "local.parts": ("runtime.local.*",),
    # The Spark engine: its entry module, and the pieces it assembles.
    "spark.engine": ("runtime.spark.engine",),
    "spark.parts": ("runtime.spark.*",),
    # Stats, Prometheus exporter, console.
    "observe": ("runtime", "runtime.observe.*"),
    # Flow control, in three parts: asyncio drivers, coordinators, pure policies with the
    # vocabulary every part shares (signals, and the seams an engine implements).
    "drivers": ("backpressure.drivers.*", "backpressure.limits"),
    "coordinator": ("backpressure.coordinator.*",),
    "policy": ("backpressure", "backpressure.policy.*", "backpressure.signals", "backpressure.seams"),
    # The API every engine implements and reads: components, topologies, groupings,
    # settings, keyed state, the stock spouts and sinks.
    "api": ("topo.api", "topo.topology", "topo.groupings", "topo.config", "topo.state", "topo.sources.*",
            "topo.sinks", "topo.windows", "topo.join"),
}

_ENGINE_BELOW = ("observe", "drivers", "policy", "api")
MAY_IMPORT: dict[str, frozenset[str]] = {
    # An engine is reached through its entry module only.
    "surface": frozenset({"local.workers", "local.engine", "spark.engine", "observe", "drivers", "coordinator", "policy", "api"}),
    "local.workers": frozenset({"local.engine", "local.parts", *_ENGINE_BELOW}),
    "local.engine": frozenset({"local.checkpoints", "local.tasks", "local.collectors", "local.parts",
                               *_ENGINE_BELOW}),
    "local.checkpoints": frozenset({"local.tasks", "local.collectors", "local.parts", *_ENGINE_BELOW}),
    "local.tasks": frozenset({"local.collectors", "local.parts", *_ENGINE_BELOW}),
    "local.collectors": frozenset({"local.parts", *_ENGINE_BELOW}),
    "local.parts": frozenset(_ENGINE_BELOW),
    "spark.engine": frozenset({"spark.parts", *_ENGINE_BELOW}),
    "spark.parts": frozenset(_ENGINE_BELOW),
    "observe": frozenset({"policy", "api"}),
    # Flow control knows tasks only as ``seams.TaskHandle``: nothing from topo/ or runtime/.
    "drivers": frozenset({"coordinator", "policy"}),
    "coordinator": frozenset({"policy"}),
    "policy": frozenset(),
    "api": frozenset(),
}

# Violations being removed, each as the test reports it: "importer -> imported" for a floor
# rule, "cycle: a, b, ..." for an import cycle. Every entry must still occur (see the module
# docstring), so fixing one means deleting its line here. Emptied by the last two entries'
# fixes: "topo.cli -> runtime.local.outbox" (the CLI took TupleEncodingError from the local
# engine's outbox; it now takes EmitError from topo.api) and "runtime.local.tasks ->
# runtime.local.engine" (the engine <-> tasks cycle, whose tasks-side import was under
# TYPE_CHECKING: tasks now get a TaskWiring instead of the engine).
KNOWN_VIOLATIONS: set[str] = set()


@dataclass(frozen=True)
class Import:
    target: str          # the project module imported (or the nearest existing ancestor)
    module_level: bool   # executed on import: not inside a function, not under TYPE_CHECKING
    line: int


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            if "__pycache__" not in path.parts:
                out[module_name(path)] = path
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return ((isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
            or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def _imported_names(node: ast.Import | ast.ImportFrom, module: str, is_package: bool) -> Iterator[str]:
    if isinstance(node, ast.Import):
        for alias in node.names:
            yield alias.name
        return
    base = node.module or ""
    if node.level:
        package = module.split(".") if is_package else module.split(".")[:-1]
        package = package[:len(package) - (node.level - 1)]
        base = ".".join([*package, base] if base else package)
    for alias in node.names:
        yield f"{base}.{alias.name}"       # a submodule, or a name in ``base`` (resolved below)


def imports_of(source: str, module: str, known: Iterable[str], is_package: bool = False) -> list[Import]:
    """The project imports in ``source`` (module ``module``), each resolved to a module in ``known``."""
    known = set(known)
    found: list[Import] = []

    def resolve(name: str) -> str | None:
        while name:
            if name in known:
                return name
            name = name.rpartition(".")[0]
        return None

    def visit(node: ast.AST, module_level: bool) -> None:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for name in _imported_names(node, module, is_package):
                if name.split(".")[0] in PACKAGES:
                    target = resolve(name)
                    if target is not None and target != module:
                        found.append(Import(target, module_level, node.lineno))
            return
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            module_level = False
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.body:
                visit(child, False)
            for child in node.orelse:
                visit(child, module_level)
            return
        for child in ast.iter_child_nodes(node):
            visit(child, module_level)

    visit(ast.parse(source), True)
    return found


def floor_of(module: str) -> str | None:
    best: tuple[int, str] | None = None
    for floor, names in FLOORS.items():
        for name in names:
            if name.endswith(".*"):
                pkg = name[:-2]
                hit = module == pkg or module.startswith(pkg + ".")
                rank = len(pkg)
            else:
                hit = module == name
                rank = len(name) + 1          # an exact name beats a package pattern
            if hit and (best is None or rank > best[0]):
                best = (rank, floor)
    return best[1] if best else None


def import_graph() -> dict[str, list[Import]]:
    modules = project_modules()
    return {m: imports_of(p.read_text(encoding="utf-8"), m, modules, p.name == "__init__.py")
            for m, p in modules.items()}


def floor_violations(graph: dict[str, list[Import]]) -> dict[str, str]:
    """"importer -> imported" for every import the floors forbid, with where it is."""
    out: dict[str, str] = {}
    for module, imports in graph.items():
        src = floor_of(module)
        for imp in imports:
            dst = floor_of(imp.target)
            if src is None or dst is None or dst == src or dst in MAY_IMPORT[src]:
                continue
            out.setdefault(f"{module} -> {imp.target}",
                           f"{module}:{imp.line} ({src}) imports {imp.target} ({dst})")
    return out


def cycles(graph: dict[str, list[Import]]) -> list[list[str]]:
    """Strongly connected components of the module-level import graph with more than one module."""
    edges = {m: sorted({i.target for i in imps if i.module_level}) for m, imps in graph.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def connect(v: str) -> None:          # Tarjan; the graph is small, recursion is fine
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            connect(v)
    return out


# -- the rules ----------------------------------------------------------------------------------------------

def test_every_module_is_on_a_floor() -> None:
    assert set(FLOORS) == set(MAY_IMPORT)
    unplaced = [m for m in project_modules() if floor_of(m) is None]
    assert not unplaced, f"put these modules on a floor in FLOORS (and ARCHITECTURE.md): {unplaced}"


def test_imports_follow_the_floors_and_form_no_cycle() -> None:
    graph = import_graph()
    found = floor_violations(graph)
    for component in cycles(graph):
        found[f"cycle: {', '.join(component)}"] = f"module-level import cycle between {component}"
    new = sorted(found[k] for k in found.keys() - KNOWN_VIOLATIONS)
    fixed = sorted(KNOWN_VIOLATIONS - found.keys())
    assert not new, "imports that break ARCHITECTURE.md's rules:\n" + "\n".join(new)
    assert not fixed, "fixed: remove from KNOWN_VIOLATIONS:\n" + "\n".join(fixed)


# -- the scanner itself -------------------------------------------------------------------------------------

def test_scanner_sees_lazy_and_type_checking_imports_and_resolves_names() -> None:
    source = '''
from typing import TYPE_CHECKING
import topo.api
from runtime.local import outbox
from topo.api import Bolt
from . import sibling
if TYPE_CHECKING:
    from runtime.local.engine import LocalEngine
else:
    import backpressure.signals
try:
    import topo.config
except ImportError:
    pass
def later():
    from runtime.observe.stats import TaskStats
class K:
    import topo.groupings
'''
    known = ["topo", "topo.api", "topo.config", "topo.groupings", "runtime.local", "runtime.local.outbox",
             "runtime.local.engine", "runtime.local.sibling", "runtime.observe.stats", "backpressure.signals"]
    got = {(i.target, i.module_level) for i in imports_of(source, "runtime.local.tasks", known)}
    assert got == {("topo.api", True), ("runtime.local.outbox", True), ("runtime.local.sibling", True),
                   ("runtime.local.engine", False), ("backpressure.signals", True), ("topo.config", True),
                   ("runtime.observe.stats", False), ("topo.groupings", True)}


def test_floor_patterns_prefer_the_most_specific() -> None:
    assert floor_of("topo") == "surface" and floor_of("topo.api") == "api"
    assert floor_of("runtime.local.engine") == "local.engine" and floor_of("runtime.local.queue") == "local.parts"
    assert floor_of("topo.sources.log") == "api" and floor_of("backpressure.policy.stepwise") == "policy"
    assert floor_of("elsewhere") is None


def test_cycle_finder() -> None:
    def imp(target: str, module_level: bool = True) -> Import:
        return Import(target, module_level, 1)

    graph = {"a": [imp("b")], "b": [imp("c")], "c": [imp("a")], "d": [imp("a"), imp("e", False)],
             "e": [imp("d")]}
    assert cycles(graph) == [["a", "b", "c"]]
