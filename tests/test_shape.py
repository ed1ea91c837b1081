"""The shape rules of the code base, checked on its source: short functions, no import cycle.

Every import counts, `TYPE_CHECKING` ones included: a type-only cycle still means two modules
that cannot be understood (or moved) one without the other.
"""

from __future__ import annotations

import ast
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


if __name__ == "__main__":
    for line in long_functions():
        print("long:", line)
    for cycle in import_cycles():
        print("cycle:", " -> ".join(cycle))
