"""The user's code, zipped for Spark's executors.

On a cluster, executors run in processes the driver did not start, with the worker's
environment: they import what is installed there (``topo`` and its dependencies) and
nothing of the directory the topology was started from. Spark's own way to ship Python
code is a zip on every worker's ``sys.path`` (``SparkContext.addPyFile``), so at start
the engine zips the modules that define the topology's components (their classes,
base classes and the classes of their attributes) and, transitively, every module
those import (at module level or inside a function) that is the user's own:

* **installed** code is not shipped: a top-level module or package that belongs to an
  installed distribution (``importlib.metadata.packages_distributions``, which covers
  ``topo`` itself, also installed in editable mode), the standard library, or a file
  under a ``site-packages``/``dist-packages`` directory;
* **the user's** code is shipped by top-level name: a single ``name.py`` as is, a
  package as every ``.py`` file under its directory (so relative and lazy imports
  inside it resolve), without ``__pycache__``.

A class defined in ``__main__`` is pickled by value (cloudpickle) and needs nothing.
"""
from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import os
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator

INSTALLED_MARKERS = ("site-packages", "dist-packages")
MAX_SHIPPED_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class Shipped:
    """One top-level module (``path`` is its ``.py`` file) or package (its directory)."""

    name: str
    path: Path
    package: bool

    def files(self) -> Iterator[tuple[Path, str]]:
        """``(file, name in the zip)`` for every source file of this module or package."""
        if not self.package:
            yield self.path, self.path.name
            return
        for root, dirs, files in os.walk(self.path):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__" and not d.startswith("."))
            for f in sorted(files):
                if f.endswith(".py"):
                    full = Path(root) / f
                    yield full, str(Path(self.path.name) / full.relative_to(self.path))


def roots_of(instances: Iterable[Any]) -> set[str]:
    """The modules of the components' classes, their base classes, and the classes of
    their attributes' values (a bolt holding an object of the user's class)."""
    out: set[str] = set()
    for obj in instances:
        kinds = [type(obj), *(type(v) for v in getattr(obj, "__dict__", {}).values())]
        for kind in kinds:
            out.update(k.__module__ for k in kind.__mro__ if isinstance(getattr(k, "__module__", None), str))
    return out


def _is_installed(top: str, origin: str | None, distributions: set[str]) -> bool:
    if top in distributions or top in sys.stdlib_module_names or top in sys.builtin_module_names:
        return True
    return origin is None or any(m in Path(origin).parts for m in INSTALLED_MARKERS)


def _locate(top: str) -> Shipped | None:
    """Where top-level module ``top`` comes from, or None when it has no source file."""
    module = sys.modules.get(top)
    origin = getattr(module, "__file__", None) if module is not None else None
    locations = list(getattr(module, "__path__", []) or []) if module is not None else []
    if module is None:
        try:
            spec = importlib.util.find_spec(top)
        except (ImportError, ValueError):
            return None
        if spec is None:
            return None
        origin = spec.origin if spec.has_location else None
        locations = list(spec.submodule_search_locations or [])
    if locations:                                   # a package (maybe a namespace package)
        return Shipped(top, Path(locations[0]).resolve(), True)
    if origin and origin.endswith(".py"):
        return Shipped(top, Path(origin).resolve(), False)
    return None


def imported_names(source: str) -> set[str]:
    """Top-level names of the absolute imports anywhere in ``source`` (inside functions too)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module.split(".")[0])
    return out


def user_modules(roots: Iterable[str], *, distributions: set[str] | None = None) -> list[Shipped]:
    """The user's top-level modules and packages ``roots`` need, transitively (docstring)."""
    installed = set(importlib.metadata.packages_distributions()) if distributions is None else distributions
    found: dict[str, Shipped] = {}
    seen: set[str] = set()
    queue = [r.split(".")[0] for r in roots]
    while queue:
        top = queue.pop()
        if top in seen or top == "__main__":
            continue
        seen.add(top)
        where = _locate(top)
        if where is None or _is_installed(top, str(where.path), installed):
            continue
        found[top] = where
        for file, _ in where.files():
            try:
                queue.extend(imported_names(file.read_text(encoding="utf-8")))
            except (OSError, SyntaxError, UnicodeDecodeError):
                continue   # not ours to judge: the import itself would have failed on the driver
    return sorted(found.values(), key=lambda s: s.name)


def build_zip(modules: Iterable[Shipped], path: Path) -> Path:
    """Write ``modules`` into the zip ``path`` (Spark puts it on the workers' ``sys.path``)."""
    total = 0
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for m in modules:
            for file, arcname in m.files():
                total += file.stat().st_size
                if total > MAX_SHIPPED_BYTES:
                    raise ValueError(f"the user code to ship to Spark's executors passed "
                                     f"{MAX_SHIPPED_BYTES >> 20} MiB at {file} (module {m.name!r}): "
                                     "install large code on the workers instead")
                z.write(file, arcname)
    return path
