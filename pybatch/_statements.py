"""The statement loader: every SQL statement pybatch runs comes from `queries/*.sql`.

pugsql parses the files (names, result modes, `:doc`) and refuses duplicate or
reserved names. SQLAlchemy, which pugsql is built on, compiles each statement once
into psycopg's `%(name)s` form; pybatch then runs it directly on the psycopg
connection its unit of work owns, so transactions, savepoints and COMMIT outcomes
stay under pybatch's control and hot statements are prepared server-side
(docs/architecture.md). This is the only module that imports pugsql or SQLAlchemy.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import psycopg
import pugsql
import pugsql.statement
from psycopg.rows import dict_row
from sqlalchemy.dialects.postgresql import psycopg as sqlalchemy_psycopg

from pybatch._resources import queries_dir

__all__ = ["Statement", "Statements", "load_statements"]

_MODES: Mapping[type, str] = {
    pugsql.statement.One: "one",
    pugsql.statement.Many: "many",
    pugsql.statement.Affected: "affected",
    pugsql.statement.Scalar: "scalar",
}
_ORIGIN_COMMENT = re.compile(r"^-- pugsql function \S+ in file .*? at line \d+\n")


class Statement:
    """One named statement, compiled for psycopg and bound to no connection."""

    __slots__ = ("doc", "filename", "mode", "name", "parameters", "query")

    def __init__(self, source: Any) -> None:
        mode = _MODES.get(type(source.result))
        if mode is None:
            raise ValueError(
                f"statement {source.name} must declare :one, :many, :affected or :scalar"
            )
        self.name: str = source.name
        self.filename: str = Path(source.filename).name
        self.doc: str = source.__doc__ or ""
        self.mode: str = mode
        compiled = source._text.compile(dialect=sqlalchemy_psycopg.dialect())  # type: ignore[no-untyped-call]
        self.parameters: frozenset[str] = frozenset(compiled.params)
        # Replace pugsql's origin comment (it reveals install paths) with one that tells a
        # DBA reading pg_stat_activity which file and statement this is.
        body = _ORIGIN_COMMENT.sub("", str(compiled))
        self.query: bytes = f"-- pybatch {self.filename} {self.name}\n{body}".encode()

    def __repr__(self) -> str:
        return f"<Statement {self.filename}:{self.name} :{self.mode}>"

    def __call__(self, conn: psycopg.Connection[Any], /, **params: Any) -> Any:
        """Run the statement on `conn` and shape the result by its declared mode."""
        return self.run(conn, params)

    def run(
        self,
        conn: psycopg.Connection[Any],
        params: Mapping[str, Any],
        *,
        prepare: bool | None = None,
    ) -> Any:
        """Run with a parameter mapping; `prepare=True` prepares it on first use (hot paths)."""
        self._check(params)
        with conn.cursor(row_factory=dict_row) as cursor:
            cursor.execute(self.query, params, prepare=prepare)
            if self.mode == "affected":
                return cursor.rowcount
            if self.mode == "many":
                return cursor.fetchall()
            row = cursor.fetchone()
            if self.mode == "one":
                return row
            return None if row is None else next(iter(row.values()))

    def _check(self, params: Mapping[str, Any]) -> None:
        if params.keys() != self.parameters:
            missing = sorted(self.parameters - params.keys())
            unknown = sorted(params.keys() - self.parameters)
            raise TypeError(f"{self.name}: missing parameters {missing}, unknown {unknown}")

    def executemany(self, conn: psycopg.Connection[Any], rows: list[dict[str, Any]]) -> None:
        """Run the statement once per parameter mapping, pipelined by psycopg."""
        with conn.cursor() as cursor:
            cursor.executemany(self.query, rows)


class Statements:
    """Every statement of `queries/`, as attributes named like the statements."""

    def __init__(self, statements: Mapping[str, Statement]) -> None:
        self._statements = dict(statements)

    def __getattr__(self, name: str) -> Statement:
        try:
            return self._statements[name]
        except KeyError:
            raise AttributeError(name) from None

    def __iter__(self) -> Iterator[Statement]:
        return iter(self._statements.values())

    def __len__(self) -> int:
        return len(self._statements)


def load_pugsql_module(path: Path | None = None) -> Any:
    """Load the raw pugsql module (used by the guard-rail tests)."""
    return pugsql.module(str(path or queries_dir()))


@functools.cache
def load_statements() -> Statements:
    """Load and compile every statement of the shipped `queries/` folder once per process."""
    module = load_pugsql_module()
    return Statements({name: Statement(source) for name, source in module._statements.items()})
