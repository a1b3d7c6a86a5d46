"""Imports run one way: the planner's rules never import the planner, the runtime never imports the
measuring code, and no project modules import each other in a ring; modules and folders stay small.
Read from the source (every import statement, also those inside functions or under ``TYPE_CHECKING``),
not by importing it."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("app.py", "config", "backend")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def modules() -> dict[str, Path]:
    """Every project module by dotted name."""
    found: dict[str, Path] = {}
    for top in PACKAGES:
        paths = [ROOT / top] if top.endswith(".py") else sorted((ROOT / top).rglob("*.py"))
        for path in paths:
            found[module_name(path)] = path
    return found


def imported(name: str) -> Iterator[str]:
    """The project modules ``name`` imports: ``from a.b import c`` is ``a.b.c`` when that is a
    module, else ``a.b``."""
    path = modules()[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules() else base for a in node.names]
        else:
            continue
        yield from (t for t in targets if t in modules())


def under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def crossing(source: str, target: str) -> dict[str, list[str]]:
    """The modules under ``source`` that import a module under ``target``, with what they import."""
    found = {name: sorted({i for i in imported(name) if under(i, target)}) for name in modules() if under(name, source)}
    return {name: targets for name, targets in found.items() if targets}


def test_rules_do_not_import_the_planner() -> None:
    """What the rules share (``Draft``, ``PINNED_BY_YOU``) is in ``config.draft``; the planner alone
    runs the rules, in its one listed order."""
    assert not crossing("config.rules", "config.planner")
    assert not crossing("config.draft", "config.rules")


def test_runtime_does_not_import_measure() -> None:
    """Starting and serving the engines needs none of the measuring code (bench, tune, verify)."""
    assert not crossing("backend.runtime", "backend.measure")


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component: list[str] = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_cycles() -> None:
    """No two project modules import each other, directly or through others."""
    graph = {name: set(imported(name)) - {name} for name in modules()}
    assert not cycles(graph)


def test_cycle_check_finds_a_ring() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert not cycles({"a": {"b"}, "b": {"c"}, "c": set()})


MAX_LINES = 450
MAX_MODULES = 12
COMMAND_TABLE = ROOT / "backend" / "cli"
"""One module per command: the folder the size limit leaves aside."""


def test_no_module_over_450_lines() -> None:
    """A module that long holds more than one concern."""
    long = {
        str(p.relative_to(ROOT)): n for p in modules().values() if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert not long


def test_no_folder_over_12_modules() -> None:
    """A folder that full holds more than one concern: its parts get subpackages of their own."""
    folders: dict[Path, int] = {}
    for path in modules().values():
        if path.name != "__init__.py" and path.parent != ROOT:
            folders[path.parent] = folders.get(path.parent, 0) + 1
    full = {str(d.relative_to(ROOT)): n for d, n in folders.items() if n > MAX_MODULES and d != COMMAND_TABLE}
    assert not full
