"""The shape rules of the code base, checked on its source: short functions, no import cycle,
imports that point down the floors only.

Every import counts, `TYPE_CHECKING` ones included: a type-only cycle still means two modules
that cannot be understood (or moved) one without the other.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "streamer"
MAX_FUNCTION_LINES = 60


def _modules() -> dict[str, ast.Module]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = ast.parse(path.read_text(), str(path))
    return out


def _imports(name: str, tree: ast.Module, known: set[str]) -> set[str]:
    package = name if name in known and _is_package(name) else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names)
    return {m for m in found if m in known and m != name}


def _is_package(name: str) -> bool:
    return (PACKAGE.parent / Path(*name.split(".")) / "__init__.py").exists()


def _third_party(tree: ast.Module) -> set[str]:
    """The top-level names of the modules `tree` imports from outside the standard library
    and streamer (relative imports are streamer's)."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name.partition(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.add(node.module.partition(".")[0])
    return found - set(sys.stdlib_module_names) - {"__future__", "streamer"}


# The floors, bottom up: a module's floor is its package under streamer/ (a loose top-level
# module is the app's: settings, processes, commands). Each floor imports only floors below it
# or itself: the pure core nothing but itself, the backends' and the store's I/O shells the
# core and each other, the turn and its gateway (turns/) those, the servers (frontends/) and
# the commands (tap/) any of those, the app everything.
FLOOR_IMPORTS = {
    "core": {"core"},
    "store": {"core", "store", "upstream"},
    "upstream": {"core", "store", "upstream"},
}
BELOW_APP = ("core", "store", "upstream", "turns", "tap")  # none of them imports frontends
# What core may import beyond the standard library: computations over plain values, no I/O.
CORE_LIBRARIES = {"orjson", "cryptography"}  # cryptography: core/sealing.py's AES-GCM


def _floor(name: str) -> str:
    parts = name.split(".")
    return parts[1] if len(parts) > 2 or (_is_package(name) and len(parts) == 2) else "app"


def layer_violations() -> list[str]:
    """Every import of a streamer module (or, for core, a library) its floor may not use."""
    modules = _modules()
    known = set(modules)
    out = []
    for name, tree in modules.items():
        floor = _floor(name)
        for imported in sorted(_imports(name, tree, known)):
            to = _floor(imported)
            allowed = FLOOR_IMPORTS.get(floor)
            if (allowed is not None and to not in allowed) or (
                floor in BELOW_APP and to == "frontends"
            ):
                out.append(f"{name} ({floor}) imports {imported} ({to})")
        if floor == "core":
            out.extend(
                f"{name} (core) imports {lib}"
                for lib in sorted(_third_party(tree) - CORE_LIBRARIES)
            )
    return out


def long_functions() -> list[str]:
    """Every function or method in streamer/ longer than MAX_FUNCTION_LINES lines."""
    out = []
    for name, tree in _modules().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    out.append(f"{name}.{node.name} ({length} lines)")
    return sorted(out)


def import_cycles() -> list[list[str]]:
    """Cycles in the graph of imports between streamer's modules (package __init__s, which
    only re-export, are left out: importing a submodule imports its package anyway)."""
    modules = _modules()
    known = set(modules)
    graph = {
        n: {m for m in _imports(n, t, known) if not _is_package(m)}
        for n, t in modules.items()
        if not _is_package(n)
    }
    cycles, state, stack = [], dict.fromkeys(graph, 0), []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append([*stack[stack.index(nxt) :], nxt])
            elif state.get(nxt) == 0:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if state[node] == 0:
            visit(node)
    return cycles


def test_no_function_is_longer_than_60_lines() -> None:
    assert long_functions() == []


def test_no_import_cycle_type_only_included() -> None:
    assert import_cycles() == []


def test_imports_point_down_the_floors_type_only_included() -> None:
    assert layer_violations() == []


def test_the_layer_check_sees_a_back_pointing_import() -> None:
    """The rules above find what they forbid (a check that never fires proves nothing)."""
    tree = ast.parse("from streamer.turns.turn import Turn\nimport aiohttp\n")
    known = {"streamer.core.x", "streamer.turns.turn"}
    assert _imports("streamer.core.x", tree, known) == {"streamer.turns.turn"}
    assert _floor("streamer.core.x") == "core" and _floor("streamer.turns.turn") == "turns"
    assert _floor("streamer.app") == "app" and _floor("streamer.core") == "core"
    assert _third_party(tree) == {"aiohttp"}


if __name__ == "__main__":
    for line in long_functions():
        print("long:", line)
    for cycle in import_cycles():
        print("cycle:", " -> ".join(cycle))
    for line in layer_violations():
        print("layer:", line)
