"""Facts about the package's layout a newcomer can rely on: no import cycles between its modules, and
every public name and documented module path importable."""

from __future__ import annotations

import ast
import pathlib
import re

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "python" / "fastonnx"


def _module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: pathlib.Path, modules: set[str]) -> set[str]:
    """The fastonnx modules ``path`` imports anywhere: at module level, under TYPE_CHECKING (a cycle
    there is one for the type checker) and inside functions (a deferred import still makes the two
    modules depend on each other: a cycle hidden in a function is a cycle)."""
    found = set()
    for stmt in ast.walk(ast.parse(path.read_text())):
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


# the names users import: fastonnx.* and the module paths the docs, pyproject and earlier releases name
PUBLIC_PATHS = {
    "fastonnx.capture": ["TRACE_LOCK", "CAPTURES", "register_pytree_types"],
    "fastonnx.compile_backend": [
        "fastonnx_backend",
        "fastonnx_debug_backend",
        "register_by_name",
        "default_backend",
    ],
    "fastonnx.context": ["ConversionContext"],
    "fastonnx.registry": ["Registry"],
    "fastonnx.interrupt": ["sigterm_as_interrupt"],
    "fastonnx.dtypes": ["tensor_bytes"],
    "fastonnx.torch_compat": ["export", "patch_torch_onnx", "ONNXProgram"],
    "fastonnx.stored_weights": ["attach_weights", "DEFERRED_KEY"],
}


def test_public_names_and_module_paths_are_importable() -> None:
    import importlib

    import fastonnx

    for name in fastonnx.__all__:
        assert hasattr(fastonnx, name), name
    for module, names in PUBLIC_PATHS.items():
        loaded = importlib.import_module(module)
        for name in names:
            assert hasattr(loaded, name), f"{module}.{name}"


def test_test_files_have_unique_names() -> None:
    # the test folders are no packages (pytest's rootdir imports): two test files of one name make the
    # second a collection error, and its tests silently absent
    seen: dict[str, pathlib.Path] = {}
    twice = []
    for path in sorted((PACKAGE.parent.parent / "tests").rglob("test_*.py")):
        if path.name in seen:
            twice.append(f"{seen[path.name]} and {path}")
        seen.setdefault(path.name, path)
    assert not twice, twice


def test_the_architecture_page_names_every_module_and_no_gone_one() -> None:
    # docs/architecture.md is the map: every Python module and Rust source file is named there (by
    # its path, or its path's tail in backticks), and every file it names exists
    root = PACKAGE.parent.parent
    doc = (root / "docs" / "architecture.md").read_text(encoding="utf-8")
    named = set(re.findall(r"`([\w./-]+\.(?:py|pyi|rs))`", doc))
    sources = [*PACKAGE.rglob("*.py"), *PACKAGE.rglob("*.pyi"), *root.glob("rust/*/src/**/*.rs")]
    paths = sorted({p.relative_to(root).as_posix() for p in sources})

    def names(path: str) -> bool:
        return any(path == t or path.endswith("/" + t) for t in named)

    missing = [p for p in paths if not names(p)]
    assert not missing, f"docs/architecture.md does not name {missing}"
    tops = ("python", "tests", "benches", "scripts", "examples", "docs", "rust/core", "rust/python")
    every = [
        p.relative_to(root).as_posix()
        for top in tops
        for p in (root / top).rglob("*")
        if p.is_file() and "target" not in p.parts
    ]
    gone = sorted(t for t in named if not any(p == t or p.endswith("/" + t) for p in every))
    assert not gone, f"docs/architecture.md names files that are gone: {gone}"
