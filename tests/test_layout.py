"""Facts about the package's layout a newcomer can rely on: no import cycles between its modules."""

from __future__ import annotations

import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "python" / "fastonnx"


def _module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: pathlib.Path, modules: set[str]) -> set[str]:
    """The fastonnx modules ``path`` imports at module level, TYPE_CHECKING blocks included (a cycle
    there is a cycle for the type checker too); imports inside functions are deliberate deferrals."""
    found = set()
    tree = ast.parse(path.read_text())
    for node in tree.body:
        stmts = node.body if isinstance(node, ast.If) else [node]
        for stmt in stmts:
            if isinstance(stmt, ast.Import):
                found.update(a.name for a in stmt.names)
            elif isinstance(stmt, ast.ImportFrom) and stmt.module:
                found.add(stmt.module)
                found.update(f"{stmt.module}.{a.name}" for a in stmt.names)
    return {m for m in found if m in modules}


def test_no_import_cycles() -> None:
    paths = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    modules = set(paths)
    graph = {m: _imports(p, modules) - {m} for m, p in paths.items()}
    # a package imports its own __init__ first: that edge is not a cycle
    for m in graph:
        graph[m] -= {p for p in graph[m] if m.startswith(p + ".")}
    cycles = []
    state: dict[str, int] = {}

    def visit(m: str, stack: list[str]) -> None:
        state[m] = 1
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                cycles.append(stack[stack.index(n) :] + [n] if n in stack else [m, n])
            elif n not in state:
                visit(n, [*stack, n])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    assert not cycles, f"import cycles: {cycles}"
