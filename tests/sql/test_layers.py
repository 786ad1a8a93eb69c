"""Guard rails over the package's structure: layers point one way, and no import cycles.

The layers, bottom to top (docs/architecture.md, "Layers"): a module may import from its
own layer or any layer below it, never from one above, and the imports form no cycle.
Imports under `if TYPE_CHECKING:` are for annotations only and are checked for direction
too: an annotation may name a lower layer's type, never a higher one's.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "pybatch"

#: Layer of each module, by the longest matching dotted prefix.
LAYERS: dict[str, int] = {
    "pybatch.errors": 0,
    "pybatch._clock": 0,
    "pybatch._config": 0,
    "pybatch.values": 1,
    "pybatch._codecs": 2,
    "pybatch._statements": 3,
    "pybatch._sqlstate": 3,
    "pybatch._failure_reasons": 3,  # reads driver errors, as _sqlstate does
    "pybatch._connect": 3,
    "pybatch._telemetry": 3,  # spans and counters; the only opentelemetry import
    "pybatch._transaction": 4,
    "pybatch._repository": 5,
    "pybatch._migrator": 6,
    "pybatch._unit_of_work": 6,
    "pybatch._job_repository": 7,
    "pybatch._chunks": 8,
    "pybatch._fault_state": 8,
    "pybatch._skips": 8,  # skip records: a chunk writes them, the explorer reads them
    "pybatch._lease_keeper": 8,
    "pybatch._services": 8,  # operator, retention, audit and explorer services
    "pybatch._partitioned": 8,
    "pybatch._demo.embedded": 8,
    "pybatch._explorer": 8,
    "pybatch._sql_catalogue": 8,
    "pybatch.etl": 9,
    "pybatch._cli": 10,
    "pybatch._dashboard": 10,  # the web dashboard: the explorer and the audit service
    "pybatch._demo": 10,  # the demo job; its embedded server sits lower
    "pybatch.testing": 10,
    "pybatch.__main__": 10,
    "pybatch": 11,  # the package's __init__: the public surface re-exports every layer
}
NAMES = ["shared", "values", "codecs", "statements", "transaction", "repository",
         "unit of work", "job repository", "chunks", "etl", "cli", "package"]  # fmt: skip


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _layer(module: str) -> int:
    candidates = [
        prefix for prefix in LAYERS if module == prefix or module.startswith(prefix + ".")
    ]
    if not candidates:
        pytest.fail(f"{module} has no layer in LAYERS: add it")
    return LAYERS[max(candidates, key=len)]


def _imports(path: Path) -> set[str]:
    """The pybatch modules `path` imports (a submodule when `from package import module`)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("pybatch"):
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                folder = PACKAGE.parent / submodule.replace(".", "/")
                is_module = folder.with_suffix(".py").exists() or (folder / "__init__.py").exists()
                found.add(submodule if is_module else node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith("pybatch"))
    return found


GRAPH = {_module_name(path): _imports(path) for path in sorted(PACKAGE.rglob("*.py"))}


@pytest.mark.parametrize("module", sorted(GRAPH))
def test_imports_point_down_the_layers(module: str) -> None:
    own = _layer(module)
    upward = sorted(
        f"{target} ({NAMES[_layer(target)]})"
        for target in GRAPH[module]
        if target != module and _layer(target) > own
    )
    assert upward == [], f"{module} ({NAMES[own]}) imports from a layer above it"


def test_no_import_cycles() -> None:
    state: dict[str, str] = {}
    stack: list[str] = []

    def visit(module: str) -> None:
        state[module] = "open"
        stack.append(module)
        for target in sorted(GRAPH.get(module, ())):
            if target == module or target not in GRAPH:
                continue
            if state.get(target) == "open":
                cycle = [*stack[stack.index(target) :], target]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if target not in state:
                visit(target)
        stack.pop()
        state[module] = "done"

    for module in sorted(GRAPH):
        if module not in state:
            visit(module)


def test_values_import_no_other_layer() -> None:
    offenders = {
        module: sorted(t for t in targets if _layer(t) not in (0, 1))
        for module, targets in GRAPH.items()
        if module.startswith("pybatch.values")
    }
    assert {m: t for m, t in offenders.items() if t} == {}


def test_etl_and_cli_never_touch_statements() -> None:
    """They compose repository operations; only the demo runs statements, its own."""
    offenders = []
    for module, targets in GRAPH.items():
        if not (module == "pybatch.etl" or module.startswith("pybatch._cli")):
            continue
        path = PACKAGE.parent / (module.replace(".", "/") + ".py")
        if not path.exists():
            path = PACKAGE.parent / module.replace(".", "/") / "__init__.py"
        source = path.read_text()
        if module != "pybatch._demo.demo" and "pybatch._statements" in targets:
            offenders.append(f"{module} imports the statement loader")
        if module == "pybatch._demo.demo" and "load_statements" in source:
            offenders.append(f"{module} loads the product's statements (the demo has its own)")
        if ".statements" in source or "pybatch._repository" in targets:
            offenders.append(f"{module} reaches statements or capability functions")
    assert offenders == []


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: p.name)
def test_no_assert_for_control_flow(path: Path) -> None:
    """`python -O` strips asserts: a check the product relies on must raise a typed error."""
    asserts = [
        node.lineno
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Assert)
    ]
    assert asserts == [], f"{path.relative_to(ROOT)}: assert on lines {asserts}"
