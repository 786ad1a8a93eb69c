"""Every built-in function pybatch calls is written `pg_catalog.name(...)`.

PostgreSQL resolves an unqualified function name through `search_path`, and a role or
database set to `search_path = other, pg_catalog` runs `other.clock_timestamp()` (the lease
clock) or `other.sha256()` (the audit chain) instead of the built-in. A qualified call cannot
be redirected, and costs nothing at run time. Statements in queries/ run under whatever
search_path the operator's role has; migrations from FIRST_CHECKED_MIGRATION on follow the
same rule (the earlier ones define their functions with `SET search_path = pg_catalog, ...`,
and their defaults, constraints, views and policies were bound to the built-ins when created).

Types and operators resolve through search_path too; this check covers function calls.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: Migrations up to this one shipped before the rule; they are never edited.
FIRST_CHECKED_MIGRATION = 9
QUERY_FILES = sorted((ROOT / "queries").rglob("*.sql"))
CHECKED_MIGRATIONS = sorted(
    path
    for path in (ROOT / "migrations").glob("*.sql")
    if int(path.name.split("_", 1)[0]) >= FIRST_CHECKED_MIGRATION
)

_COMMENT = re.compile(r"--[^\n]*|/\*.*?\*/", re.DOTALL)
_STRING = re.compile(r"(?:[EeBbXxUu]&?)?'(?:[^']|'')*'")
#: A name followed by `(`, not itself qualified (`schema.name(`) or quoted.
_CALL = re.compile(r"(?<![\w.$\"])([A-Za-z_][A-Za-z0-9_]*)\s*\(")
_PREVIOUS_WORD = re.compile(r"(\w+)\s*$")
#: Words followed by `(` that are grammar, not a function looked up by name: keywords,
#: conditional expressions (COALESCE, GREATEST...), and the special forms (EXTRACT, TRIM...)
#: the parser itself rewrites to `pg_catalog.` calls.
_GRAMMAR = frozenset(
    """
    all and any array as between cast check coalesce conflict distinct exists extract filter
    else from greatest grouping in include key lateral least materialized not nullif on or over
    overlay partition position primary recursive references returns row select set
    substring table then trim unique using values when where window with within
    """.split()
)
#: Types whose modifiers are written in parentheses: `NUMERIC(20, 0)`, `VARCHAR(64)`.
_TYPES = frozenset("bit char character decimal interval numeric time timestamp varchar".split())
_NAMING_WORDS = frozenset({"as", "recursive", "using"})


def unqualified_calls(sql: str) -> list[str]:
    """The function names `sql` calls without a schema, in order (comments and strings skipped)."""
    text = _STRING.sub("''", _COMMENT.sub(" ", sql))
    calls: list[str] = []
    for match in _CALL.finditer(text):
        name = match.group(1).lower()
        previous = _PREVIOUS_WORD.search(text, 0, match.start())
        # `AS name(`, `RECURSIVE name(` and `USING btree (` name columns or an index method.
        if previous is not None and previous.group(1).lower() in _NAMING_WORDS:
            continue
        if name not in _GRAMMAR and name not in _TYPES:
            calls.append(name)
    return calls


def _label(path: Path) -> str:
    return str(path.relative_to(ROOT))


@pytest.mark.parametrize("path", QUERY_FILES + CHECKED_MIGRATIONS, ids=_label)
def test_sql_files_call_built_in_functions_through_pg_catalog(path: Path) -> None:
    calls = unqualified_calls(path.read_text())
    assert not calls, (
        f"{_label(path)} calls {sorted(set(calls))} without a schema: write "
        "pg_catalog.NAME(...) so a schema earlier on the search_path cannot replace it"
    )


def test_the_check_finds_unqualified_calls_and_accepts_grammar() -> None:
    sql = """
        -- CLOCK_TIMESTAMP() in a comment is not a call
        WITH picked AS MATERIALIZED (SELECT 1 AS one)
        SELECT
            CLOCK_TIMESTAMP() AS t,
            pg_catalog.SHA256(CAST('now()' AS BYTEA)) AS digest,
            COALESCE(GREATEST(1, 2), 0) AS g,
            EXTRACT(EPOCH FROM pg_catalog.NOW()) AS e,
            CAST(1 AS NUMERIC(20, 0)) AS n,
            count (*) AS c
        FROM picked AS p (one)
        WHERE EXISTS (SELECT 1) AND p.one IN (1, 2) AND pybatch.f(1)
    """
    assert unqualified_calls(sql) == ["clock_timestamp", "count"]


def test_migrations_before_the_rule_are_the_shipped_ones() -> None:
    numbers = [int(p.name.split("_", 1)[0]) for p in (ROOT / "migrations").glob("*.sql")]
    assert 8 in numbers and FIRST_CHECKED_MIGRATION > 8
