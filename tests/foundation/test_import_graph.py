"""The layering rules, read from the source: the contract floor (tracefleet.contract) imports only the standard
library, pydantic and itself; nothing in the floor's folder (src/tracefleet: the contract and the libraries) imports
a component folder (FOLDER_EXCEPTIONS say why one may); every package imports only packages of its own layer or below (LAYERS, the order
docs/index.md states); no two packages of tracefleet import each other, directly or around a cycle; nor do two
files (a cycle closed by a lazy import is still one: the two files cannot be read apart).

Every import counts, also one inside a function or under TYPE_CHECKING: a lazy import is still a dependency."""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path

from tracefleet.contract.diagnostics import BUILTIN_DIAGNOSTICS
from tracefleet.diagnostics.library import BUILTINS

REPO = Path(__file__).resolve().parents[2]


def _setup_roots() -> dict[str, str]:
    """setup.py's folder mapping, read from it (docs/index.md, "Where things live")."""
    tree = ast.parse((REPO / "setup.py").read_text())
    return next(ast.literal_eval(node.value) for node in tree.body if isinstance(node, ast.Assign)
                and [getattr(t, "id", None) for t in node.targets] == ["ROOTS"])


ROOTS = _setup_roots()
# `python -m tracefleet` runs tracefleet/__main__.py, which Python looks for only in the package's own folder.
FOLDER_EXCEPTIONS = {"tracefleet.__main__"}
FLOOR = "contract"
FLOOR_THIRD_PARTY = {"pydantic", "pydantic_core", "typing_extensions"}
# The layer order, lowest first, stated once: data flows up, imports flow down.
LAYERS = (
    {FLOOR},  # every message that crosses a process
    {"usage", "bucket", "formats", "sockets", "process_group", "cluster_config", "vllm", "harbor", "api",
     "tarballs"},  # libraries
    {"proxy", "engine", "traces"},  # the components a session's model calls and rows go through
    {"runner", "diagnostics", "dashboard"},  # one session end to end, and what reads its rows
    {"operator", "images"},  # the drivers' cluster side and the images they run
    {"trainer", "cli", "__main__", "tracefleet"},  # the top: the trainer's loop over everything, the command line
)


def _modules() -> dict[str, Path]:
    out: dict[str, Path] = {}
    for name, folder in ROOTS.items():
        for path in (REPO / folder).rglob("*.py"):
            parts = [p for p in path.relative_to(REPO / folder).with_suffix("").parts if p != "__init__"]
            if name == "tracefleet" and parts and f"tracefleet.{parts[0]}" in ROOTS:
                continue
            out[".".join([name, *parts])] = path
    return out


def _imports(module: str, path: Path) -> set[str]:
    found: set[str] = set()
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            found.add(source)
            found.update(f"{source}.{a.name}" for a in node.names if f"{source}.{a.name}" in MODULES)  # `from p import m`
    return found


def _package(module: str) -> str:
    """The part of tracefleet a module belongs to: `tracefleet.X` (a subpackage or a top-level module)."""
    return module.split(".")[1] if "." in module else module


MODULES = _modules()
GRAPH = {m: _imports(m, p) for m, p in MODULES.items()}


def test_the_floor_imports_nothing_above_it() -> None:
    wrong = []
    for module, imports in GRAPH.items():
        if _package(module) != FLOOR:
            continue
        for imported in imports:
            top = imported.split(".")[0]
            if top == "tracefleet":
                if _package(imported) != FLOOR:
                    wrong.append(f"{module} imports {imported}")
            elif top not in sys.stdlib_module_names and top not in FLOOR_THIRD_PARTY and top != "__future__":
                wrong.append(f"{module} imports {imported} (third-party: only pydantic on the floor)")
    assert not wrong, "\n".join(wrong)


def _root(module: str) -> str:
    """The ROOTS entry (the folder) a module's file is in: the longest of them that names it or a package above."""
    return max((r for r in ROOTS if module == r or module.startswith(r + ".")), key=len)


def test_the_floor_folder_imports_no_component_folder() -> None:
    """A newcomer reading the folders sees the layers: src/tracefleet holds the floor and the libraries only."""
    wrong = sorted(f"{module} ({MODULES[module].relative_to(REPO)}) imports {imported} ({ROOTS[_root(imported)]}/)"
                   for module, imports in GRAPH.items() if _root(module) == "tracefleet" and module not in FOLDER_EXCEPTIONS
                   for imported in imports if imported.startswith("tracefleet.") and _root(imported) != "tracefleet")
    assert not wrong, "\n".join(wrong)


def test_no_cycle_between_packages() -> None:
    edges: dict[str, set[str]] = defaultdict(set)
    witness: dict[tuple[str, str], str] = {}
    for module, imports in GRAPH.items():
        for imported in imports:
            if imported.startswith("tracefleet.") and _package(imported) != _package(module):
                edges[_package(module)].add(_package(imported))
                witness.setdefault((_package(module), _package(imported)), module)

    def reaches(start: str, goal: str) -> bool:
        seen, todo = set(), [start]
        while todo:
            for nxt in edges.get(todo.pop(), ()):
                if nxt == goal:
                    return True
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return False

    cycles = [f"{a} -> {b} ({witness[a, b]}) and back" for a in sorted(edges) for b in sorted(edges[a]) if reaches(b, a)]
    assert not cycles, "\n".join(cycles)


def _module_of(imported: str) -> str | None:
    """The file an import names: the longest prefix of it that is a module of ours."""
    parts = imported.split(".")
    while parts and ".".join(parts) not in GRAPH:
        parts.pop()
    return ".".join(parts) or None


def test_no_cycle_between_files() -> None:
    """Strongly connected files (Tarjan), each cycle named by its files."""
    edges = {m: sorted({f for i in imports for f in [_module_of(i)] if f and f != m}) for m, imports in GRAPH.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while (w := stack.pop()) != v:
                component.append(w)
            if component:
                cycles.append(sorted([v, *component]))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(edges)))
    for v in sorted(edges):
        if v not in index:
            visit(v)
    assert not cycles, "files that import each other:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def _layer(package: str) -> int:
    found = [i for i, layer in enumerate(LAYERS) if package in layer]
    assert found, f"tracefleet.{package} is in no layer of LAYERS: place it there"
    return found[0]


def test_every_package_imports_only_its_layer_or_below() -> None:
    wrong = sorted({f"{module} ({_package(module)}, layer {_layer(_package(module))}) imports {imported} "
                    f"(layer {_layer(_package(imported))})"
                    for module, imports in GRAPH.items() for imported in imports
                    if imported.startswith("tracefleet.") and _layer(_package(imported)) > _layer(_package(module))})
    assert not wrong, "\n".join(wrong)


def test_every_package_stands_on_the_floor_alone() -> None:
    """Each component reads the messages it exchanges from the floor; the floor is used by all of them."""
    users = {_package(m) for m, imports in GRAPH.items() for i in imports if i.startswith(f"tracefleet.{FLOOR}")}
    assert {"operator", "proxy", "runner", "traces"} <= users


def test_builtin_diagnostic_names_are_the_library() -> None:
    assert tuple(BUILTINS) == BUILTIN_DIAGNOSTICS
