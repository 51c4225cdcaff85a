"""specwise's modules import each other without cycles, and each one can be imported on its own.

The import graph is read from the source (ast): an edge M -> T for every specwise module T whose import
M executes. Two graphs are checked. At import time (module and class bodies): a cycle there leaves a
module half-initialised when the cycle is entered at the wrong module, so an import can fail depending
on what was imported first. With the imports inside functions too: those run only when the function is
called, after every module has loaded, so they cannot break an import, but one that closes a cycle only
hides a two-way dependency between modules instead of removing it. `if TYPE_CHECKING:` blocks never run
and are left out of both.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from collections import deque
from collections.abc import Iterator
from pathlib import Path

import pytest

import specwise

PACKAGE = Path(specwise.__file__).parent
ROOT = PACKAGE.parent


def module_names() -> dict[str, Path]:
    """Every module of specwise by dotted name (a package by its own name), __main__ left out."""
    names = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__main__":
            continue
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def _is_type_checking(test: ast.expr) -> bool:
    return ((isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
            or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def _imports(body: list[ast.stmt], deferred: bool = False) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool]]:
    """The import statements in a block, each with whether it is deferred (inside a function)."""
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node, deferred
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            yield from _imports(node.orelse, deferred)
        else:  # function bodies are deferred; class bodies and if/try/with/for blocks run where they stand
            inner = deferred or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            for block in _blocks(node):
                yield from _imports(block, inner)


def _blocks(node: ast.stmt) -> Iterator[list[ast.stmt]]:
    """The statement lists nested in a compound statement."""
    for field in ("body", "orelse", "finalbody"):
        value = getattr(node, field, None)
        if isinstance(value, list):
            yield value
    for nested in getattr(node, "handlers", []) + getattr(node, "cases", []):
        yield nested.body


def _ancestors(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def import_graph(deferred: bool) -> dict[str, set[str]]:
    """M -> the specwise modules whose import M executes (directly, not transitively): at import time,
    or also inside M's functions when `deferred`."""
    modules = module_names()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        targets: set[str] = set()
        for node, inside_function in _imports(ast.parse(path.read_text(), str(path)).body):
            if inside_function and not deferred:
                continue
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
                continue
            if node.level:  # relative: resolved against the module's package
                package = name.split(".") if is_package else name.split(".")[:-1]
                base = package[:len(package) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            # `from package import name` imports the submodule package.name when there is one; the
            # package itself then only matters as a parent (below) unless some name is its attribute.
            submodules = {f"{source}.{alias.name}" for alias in node.names} & modules.keys()
            targets.update(submodules)
            if len(submodules) < len(node.names):
                targets.add(source)
        edges = set()
        for target in targets:
            if target not in modules:
                continue
            edges.add(target)
            # Importing a.b.c first runs a and a.b; those that contain M are already loading, so no edge.
            edges.update(p for p in _ancestors(target) if p not in _ancestors(name))
        edges.discard(name)
        graph[name] = edges
    return graph


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm; the components of more than one module, each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(components)


def shortest_cycle(graph: dict[str, set[str]], start: str, within: set[str]) -> list[str]:
    """The shortest path start -> ... -> start inside one component (breadth first)."""
    previous: dict[str, str | None] = {start: None}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for nxt in sorted(graph[node] & within):
            if nxt == start:
                path = [node]
                while path[-1] != start:
                    path.append(previous[path[-1]])
                return path[::-1] + [start]
            if nxt not in previous:
                previous[nxt] = node
                queue.append(nxt)
    raise AssertionError(f"{start} is on no cycle inside its component")


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """For every module on a cycle, the shortest cycle through it; each cycle once."""
    cycles, seen = [], set()
    for component in strongly_connected(graph):
        for start in component:
            cycle = shortest_cycle(graph, start, set(component))
            key = frozenset(zip(cycle, cycle[1:]))
            if key not in seen:
                seen.add(key)
                cycles.append(cycle)
    return cycles


def test_the_graph_reader_finds_cycles():
    """The checks below can fail: a cycle is found, and imports are read where they stand."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert strongly_connected(graph) == [["a", "b", "c"]]
    assert import_cycles(graph) == [["a", "b", "c", "a"]]
    assert import_cycles({"a": {"b"}, "b": set()}) == []
    source = ("import os\nfrom specwise.x.y import z\nif TYPE_CHECKING:\n    import specwise.t\n"
              "class C:\n    import specwise.c\ndef f():\n    import specwise.f\n")
    assert [(ast.unparse(node), deferred) for node, deferred in _imports(ast.parse(source).body)] == [
        ("import os", False), ("from specwise.x.y import z", False), ("import specwise.c", False),
        ("import specwise.f", True)]
    at_import, with_deferred = import_graph(deferred=False), import_graph(deferred=True)
    assert "specwise.config" in at_import["specwise.engine"]
    # A subcommand is imported inside a function of the command line; importing a module also runs
    # its packages' __init__ (unless the importer is inside that package).
    assert "specwise.eagle" in with_deferred["specwise.cli"] and "specwise.eagle" not in at_import["specwise.cli"]
    assert {"specwise.drafters", "specwise.drafters.base"} <= at_import["specwise.engine"]
    assert "specwise.drafters" not in with_deferred["specwise.drafters.draft_model"]


def _describe(cycles: list[list[str]]) -> str:
    return "\n".join(" -> ".join(cycle) for cycle in cycles)


def test_no_import_cycles_at_import_time():
    cycles = import_cycles(import_graph(deferred=False))
    assert not cycles, "import cycles among specwise's modules at import time:\n" + _describe(cycles)


def test_no_import_cycles_through_imports_in_functions():
    cycles = import_cycles(import_graph(deferred=True))
    assert not cycles, "import cycles among specwise's modules, imports in functions included:\n" + _describe(cycles)


# Each module is imported as in a fresh interpreter: the third-party imports that specwise's modules
# make run once, then each specwise module is imported in a forked child that has no specwise module
# loaded yet. Third-party packages never import specwise, so this is the same as a fresh interpreter per
# module, without paying torch's and transformers' import time sixty times.
IMPORT_EACH = r"""
import importlib, json, os, sys, traceback
for statement in json.loads(sys.argv[1]):
    try:
        exec(statement, {})
    except Exception:
        pass  # an optional dependency that is not installed: the module that needs it reports it
assert not any(m == "specwise" or m.startswith("specwise.") for m in sys.modules)
failed = []
for name in sys.argv[2:]:
    pid = os.fork()
    if pid == 0:
        try:
            importlib.import_module(name)
        except BaseException:
            traceback.print_exc()
            os._exit(1)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    if status:
        failed.append(name)
print("FAILED:" + ",".join(failed))
"""


def third_party_imports() -> list[str]:
    """Every absolute import statement in specwise of something outside specwise, as source."""
    statements = set()
    for path in module_names().values():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                names = [node.module]
            else:
                continue
            if not any(n == "specwise" or n.startswith("specwise.") for n in names):
                statements.add(ast.unparse(node))
    return sorted(statements)


@pytest.mark.slow  # torch and transformers are imported first: tens of seconds on a small machine
@pytest.mark.skipif(not hasattr(os, "fork"), reason="imports each module in a forked child")
def test_each_module_imports_alone():
    modules = sorted(module_names())
    done = subprocess.run([sys.executable, "-c", IMPORT_EACH, json.dumps(third_party_imports()), *modules],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    failed = done.stdout.strip().splitlines()[-1].removeprefix("FAILED:")
    assert not failed, f"modules that fail to import alone: {failed}\n{done.stderr}"


# The model rooms (docs/ARCHITECTURE.md): the store finds and prepares models and may use the other two;
# GGUF reading builds a model from a file on the runners' layers; the runners know neither. The kernels
# read only the GGUF type table. Imports in functions count: a deferred import is still a dependency.
ROOMS_NEVER_IMPORT = {
    "specwise.runners": ("specwise.gguf", "specwise.store"),
    "specwise.gguf": ("specwise.store",),
    "specwise.kernels": ("specwise.store", "specwise.runners", "specwise.gguf.model", "specwise.gguf.config",
                         "specwise.gguf.tokenizer", "specwise.gguf.describe"),
}


def room_violations(graph: dict[str, set[str]]) -> list[str]:
    found = []
    for room, forbidden in ROOMS_NEVER_IMPORT.items():
        for module, targets in graph.items():
            if module != room and not module.startswith(room + "."):
                continue
            found += [f"{module} -> {t}" for t in sorted(targets)
                      if any(t == f or t.startswith(f + ".") for f in forbidden)]
    return found


def test_the_model_rooms_depend_one_way():
    assert not room_violations(import_graph(deferred=True))
    # negative control: a runner importing the store is found
    assert room_violations({"specwise.runners.lean": {"specwise.store.loading"}}) == [
        "specwise.runners.lean -> specwise.store.loading"]


def private_imports() -> list[str]:
    """`from specwise.X import _name`: a module reaching into another's private names."""
    found = []
    for name, path in module_names().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("specwise"):
                found += [f"{name}: from {node.module} import {a.name}" for a in node.names
                          if a.name.startswith("_") and not a.name.startswith("__")]
    return found


def test_no_module_imports_another_modules_private_name():
    assert not private_imports(), "\n".join(private_imports())
