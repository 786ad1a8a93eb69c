"""Guard rails over queries/ and pybatch/: what sqlfluff and pugsql miss."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from pybatch._statements import (
    Statement,
    StatementModeMismatch,
    Statements,
    load_pugsql_module,
    load_statements,
)

ROOT = Path(__file__).resolve().parents[2]
QUERY_FILES = sorted((ROOT / "queries").rglob("*.sql"))
PACKAGE_FILES = sorted((ROOT / "pybatch").rglob("*.py"))
HEADER = re.compile(r"^-- :name (\S+)(?: (\S+))?\s*$")


def _statements_of(path: Path) -> list[tuple[str, list[str]]]:
    """(header line, body lines) for each statement of a file."""
    chunks: list[tuple[str, list[str]]] = []
    for line in path.read_text().splitlines():
        if line.startswith("-- :name"):
            chunks.append((line, []))
        elif chunks:
            chunks[-1][1].append(line)
        elif line.strip() and not line.startswith("--"):
            pytest.fail(f"{path.name}: SQL before the first -- :name header")
    return chunks


ALL_STATEMENTS = [*load_statements(), *load_statements("demo"), *load_statements("testing")]


def test_every_query_file_loads_in_pugsql() -> None:
    module = load_pugsql_module()
    assert len(module._statements) == len(list(load_statements())) > 0
    demo = load_pugsql_module("demo")
    assert len(demo._statements) == len(list(load_statements("demo"))) > 0
    testing = load_pugsql_module("testing")
    assert len(testing._statements) == len(list(load_statements("testing"))) > 0


@pytest.mark.parametrize("path", QUERY_FILES, ids=lambda p: p.name)
def test_headers_name_a_safe_result_mode_and_a_doc(path: Path) -> None:
    for header, body in _statements_of(path):
        match = HEADER.match(header)
        assert match, f"{path.name}: malformed header {header!r}"
        name, mode = match.groups()
        assert mode in {":one", ":many", ":affected", ":scalar"}, (
            f"{path.name}:{name} declares {mode!r}; :insert and :raw (the default) are banned"
        )
        assert len(name) >= 2 and re.fullmatch(r"[a-z][a-z0-9_]*", name)
        assert body and body[0].startswith("-- :doc "), f"{path.name}:{name} has no -- :doc line"


@pytest.mark.parametrize("path", QUERY_FILES, ids=lambda p: p.name)
def test_no_pugsql_traps_in_statement_text(path: Path) -> None:
    for header, body in _statements_of(path):
        for line in body:
            if line.startswith("-- :doc"):
                continue
            code, _, comment = line.partition("--")
            assert not re.search(r":\w+::", code), f"{header}: use CAST, not :param::type"
            for literal in re.findall(r"'[^']*'", code):
                assert not re.search(r"(?<!:):\w", literal), f"{header}: :word in a literal"
            assert not re.search(r"(?<![:\w]):[A-Za-z_]", comment), f"{header}: :word in comment"


def test_statement_names_are_unique_across_files() -> None:
    names = [HEADER.match(h).group(1) for p in QUERY_FILES for h, _ in _statements_of(p)]  # type: ignore[union-attr]
    assert len(names) == len(set(names))


def test_every_statement_is_called_from_the_package() -> None:
    source = "\n".join(path.read_text() for path in PACKAGE_FILES)
    unused = [s.name for s in ALL_STATEMENTS if not re.search(rf"\.{s.name}\b", source)]
    assert unused == []


#: Statement files whose owner module does not share their stem, and why.
OWNER_EXCEPTIONS = {
    "schema.sql": {"_migrator.py", "_job_repository.py"},  # the migrator owns the bookkeeping
    "demo.sql": {"demo.py"},  # pybatch/_demo/demo.py, the demo main job
    "clones.sql": {"_clones.py"},  # pybatch/testing/_clones.py, the test databases
}


def _callers(name: str) -> set[str]:
    pattern = re.compile(rf"\.{name}\b")
    return {path.name for path in PACKAGE_FILES if pattern.search(path.read_text())}


@pytest.mark.parametrize("statement", ALL_STATEMENTS, ids=lambda s: f"{s.filename}:{s.name}")
def test_a_statement_is_run_by_the_module_of_its_file(statement: Statement) -> None:
    """queries/X.sql is run by pybatch/**/X.py or _X.py (others reuse it through its functions)."""
    stem = statement.filename.removesuffix(".sql")
    owners = OWNER_EXCEPTIONS.get(statement.filename, {f"{stem}.py", f"_{stem}.py"})
    assert _callers(statement.name) & owners, (
        f"{statement.filename}:{statement.name} is not run from {sorted(owners)}"
    )


_CALL = re.compile(r"\.(\w+)(?:\.prepared)?\.(one|many|scalar|affected)\(")


@pytest.mark.parametrize("path", PACKAGE_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_call_site_uses_the_declared_result_mode(path: Path) -> None:
    modes = {s.name: s.mode for s in ALL_STATEMENTS}
    wrong = [
        f"{name}.{method}() but it is :{modes[name]}"
        for name, method in _CALL.findall(path.read_text())
        if name in modes and modes[name] != method
    ]
    assert wrong == []


def test_running_a_statement_through_another_mode_is_refused() -> None:
    with pytest.raises(StatementModeMismatch, match="declared :scalar"):
        load_statements().read_schema_version.many(None)  # type: ignore[arg-type]


def test_the_pugsql_internals_the_loader_reads_are_still_there() -> None:
    """The loader reads `Module._statements` and `Statement._text` (pugsql has no public API
    for them). An upgrade that renames either fails here, with this message, not at run time.
    """
    module = load_pugsql_module()
    statements = getattr(module, "_statements", None)
    assert isinstance(statements, dict) and statements, "pugsql Module._statements is gone"
    source = next(iter(statements.values()))
    assert hasattr(source, "_text"), "pugsql Statement._text is gone"
    assert hasattr(source._text, "compile"), "pugsql Statement._text is no SQLAlchemy text()"


_SQL_SHAPES = re.compile(
    r"\b(SELECT\b.+\bFROM|INSERT\s+INTO|UPDATE\s+\w+(\.\w+)?\s+SET|DELETE\s+FROM|"
    r"CREATE\s+(TABLE|INDEX|SCHEMA|ROLE|DATABASE)|ALTER\s+TABLE|DROP\s+(TABLE|SCHEMA)|"
    r"SET_CONFIG\s*\(|PG_ADVISORY|TRUNCATE\s+)",
    re.IGNORECASE | re.DOTALL,
)


def _docstrings(tree: ast.AST) -> set[int]:
    found: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                found.add(id(body[0].value))
    return found


@pytest.mark.parametrize("path", PACKAGE_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_sql_text_in_python_source(path: Path) -> None:
    tree = ast.parse(path.read_text())
    docstrings = _docstrings(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if id(node) in docstrings:
                continue
            assert not _SQL_SHAPES.search(node.value), (
                f"{path.name}:{node.lineno}: SQL belongs in queries/*.sql"
            )


def test_only_the_statement_loader_imports_pugsql_or_sqlalchemy() -> None:
    offenders = [
        str(path.relative_to(ROOT))
        for path in PACKAGE_FILES
        if re.search(r"^\s*(import|from)\s+(pugsql|sqlalchemy)\b", path.read_text(), re.M)
        and path.name != "_statements.py"
    ]
    assert offenders == []


def test_statement_parameters_are_declared_and_checked() -> None:
    statement = load_statements().update_schema_version
    assert statement.parameters == {"version"}
    with pytest.raises(TypeError, match="missing parameters"):
        statement.affected(None)  # type: ignore[arg-type]


def test_only_affected_statements_run_with_identifiers_and_with_all_of_them() -> None:
    clone = load_statements("testing").clone_template
    assert clone.parameters == {"database", "template"}
    with pytest.raises(TypeError, match=r"missing identifiers \['template'\]"):
        clone.run_with_identifiers(None, database="pybatch_test_x")  # type: ignore[arg-type]
    with pytest.raises(StatementModeMismatch, match="only an :affected"):
        load_statements("testing").count_database_sessions.run_with_identifiers(
            None,  # type: ignore[arg-type]
            datname="pybatch_test_x",
        )


def _sqlfluff_samples(folder: Path) -> set[str]:
    """The sample values sqlfluff renders parameters with in `folder` (its .sqlfluff merged
    over the repository's)."""
    import configparser

    parser = configparser.ConfigParser()
    parser.read([ROOT / ".sqlfluff", folder / ".sqlfluff"])  # a missing file is skipped
    return set(parser["sqlfluff:templater:placeholder"])


@pytest.mark.parametrize(
    ("folder", "statements"),
    [
        ("queries", load_statements()),
        ("queries/demo", load_statements("demo")),
        ("queries/testing", load_statements("testing")),
    ],
)
def test_every_parameter_has_a_sqlfluff_sample_value(folder: str, statements: Statements) -> None:
    samples = _sqlfluff_samples(ROOT / folder)
    missing = sorted({p for s in statements for p in s.parameters} - samples)
    assert missing == [], f"run tools/sqlfluff_params.py and update {folder}/.sqlfluff"


def test_every_query_folder_is_checked_for_sample_values() -> None:
    folders = {path.parent.relative_to(ROOT).as_posix() for path in QUERY_FILES}
    assert folders == {"queries", "queries/demo", "queries/testing"}


@pytest.mark.parametrize("path", QUERY_FILES, ids=lambda p: p.name)
def test_a_statement_sqlfluff_cannot_parse_is_the_last_of_its_file(path: Path) -> None:
    """sqlfluff stops parsing a file at its first unparsable statement, so a statement whose
    parse errors are suppressed (`noqa: PRS`, for syntax sqlfluff lacks) must come last, or
    the statements after it would go unlinted."""
    chunks = _statements_of(path)
    suppressed = [
        i for i, (_, body) in enumerate(chunks) if any("noqa: PRS" in line for line in body)
    ]
    assert suppressed in ([], [len(chunks) - 1]), f"{path.name}: noqa: PRS before the end"
