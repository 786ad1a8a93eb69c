"""The statement loader: every SQL statement pybatch runs comes from `queries/*.sql`.

pugsql parses the files and SQLAlchemy compiles each statement once for psycopg; pybatch runs
it on the connection its transaction owns, so transactions and COMMIT outcomes stay under its
control. The only module importing pugsql or SQLAlchemy; rows leave it as `Row`.
"""

from __future__ import annotations

import copy
import functools
import itertools
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Literal

import psycopg
import pugsql
import pugsql.statement
from psycopg import sql
from psycopg.rows import RowMaker, no_result
from sqlalchemy.dialects.postgresql import psycopg as sqlalchemy_psycopg

from pybatch._codecs._primitives import Row as Row

#: `pybatch/_sql/` in a wheel, else the repository's top, holds `queries/` and `migrations/`.
_PACKAGE = Path(__file__).resolve().parent


def _shipped(name: str) -> Path:
    for candidate in (_PACKAGE / "_sql" / name, _PACKAGE.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"pybatch is installed without its {name}/ folder")


def queries_dir() -> Path:
    """The folder of named pugsql statements."""
    return _shipped("queries")


def migrations_dir() -> Path:
    """The folder of numbered migration files."""
    return _shipped("migrations")


#: A psycopg connection, whatever its row factory (statements choose their own).
Connection = psycopg.Connection[Any]
#: A statement's declared result mode.
Mode = Literal["one", "many", "affected", "scalar"]

_MODES: Mapping[type, Mode] = {
    pugsql.statement.One: "one",
    pugsql.statement.Many: "many",
    pugsql.statement.Affected: "affected",
    pugsql.statement.Scalar: "scalar",
}
_ORIGIN_COMMENT = re.compile(r"^-- pugsql function \S+ in file .*? at line \d+\n")
#: A parameter in the compiled text, as SQLAlchemy writes it for psycopg.
_PLACEHOLDER = re.compile(r"%\((\w+)\)s")


class StatementModeMismatch(TypeError):
    """A statement was run through a result method its `-- :name` line does not declare."""


class Statement:
    """One named statement compiled for psycopg; run it with its declared mode's method."""

    def __init__(self, source: Any) -> None:
        if (mode := _MODES.get(type(source.result))) is None:
            raise ValueError(
                f"statement {source.name} must declare :one, :many, :affected or :scalar"
            )
        self.name: str = source.name
        self.filename: str = Path(source.filename).name
        self.doc: str = source.__doc__ or ""
        self.mode: Mode = mode
        compiled = source._text.compile(dialect=sqlalchemy_psycopg.dialect())  # type: ignore[no-untyped-call]
        self.parameters: frozenset[str] = frozenset(compiled.params)
        # Replace pugsql's origin comment (it reveals install paths) with one that tells a
        # DBA reading pg_stat_activity which file and statement this is.
        body = _ORIGIN_COMMENT.sub("", str(compiled))
        self.query: bytes = f"-- pybatch {self.filename} {self.name}\n{body}".encode()
        # What runs: the same text with positional placeholders, bound from a list built in
        # `_order`, which spares psycopg mapping a dict of parameters at every execution.
        self._positional, self._order = _positional_form(self.query)
        # The same text numbered ($1, $2, ... one per placeholder) for a RawCursor: psycopg
        # parses `%s` text again on every call of a statement over 4 KiB (its cache's bound).
        self._numbered = _numbered_form(self._positional)
        self._prepare: bool | None = None  # psycopg's choice: prepared after five uses
        #: The names of the result's columns, decoded from its first result (`_dict_rows`).
        self._names: tuple[str, ...] = ()
        #: The same statement prepared server-side on first use per connection (per chunk).
        self.prepared: Statement = copy.copy(self)
        self.prepared._prepare = True

    def __repr__(self) -> str:
        return f"<Statement {self.filename}:{self.name} :{self.mode}>"

    def one(self, conn: Connection, /, **params: object) -> Row | None:
        """The only row, or None (`:one`)."""
        with self._run(conn, "one", params) as cursor:
            return cursor.fetchone()

    def many(self, conn: Connection, /, **params: object) -> list[Row]:
        """Every row (`:many`)."""
        with self._run(conn, "many", params) as cursor:
            return list(cursor.fetchall())

    def scalar(self, conn: Connection, /, **params: object) -> object:
        """The first column of the first row, or None when there is no row (`:scalar`)."""
        with self._run(conn, "scalar", params) as cursor:
            row: dict[str, object] | None = cursor.fetchone()
            return None if row is None else next(iter(row.values()))

    def affected(self, conn: Connection, /, **params: object) -> int:
        """How many rows the statement changed (`:affected`)."""
        with self._run(conn, "affected", params) as cursor:
            return cursor.rowcount

    def send(self, conn: Connection, /, **params: object) -> psycopg.Cursor[dict[str, Any]]:
        """Queue it in the connection's pipeline; its cursor is read after the pipeline syncs."""
        return self._run(conn, self.mode, params)

    def run_with_identifiers(self, conn: Connection, /, **identifiers: str) -> None:
        """Run an `:affected` utility statement whose parameters are all names.

        PostgreSQL binds values, never names (CREATE DATABASE binds nothing), so each
        `:param` becomes its value quoted by `sql.Identifier`, which no name escapes from.
        """
        if self.mode != "affected":
            raise StatementModeMismatch(
                f"{self.name} is declared :{self.mode}; only an :affected statement runs "
                "with identifiers"
            )
        self._check_names("identifiers", identifiers)
        pieces = _PLACEHOLDER.split(self.query.decode())
        # Text and names alternate; the text's percent signs were doubled for psycopg's
        # placeholders, which a statement run without parameters does not use.
        composed = sql.Composed(
            [
                sql.Identifier(identifiers[piece])
                if index % 2
                else sql.SQL(piece.replace("%%", "%"))
                for index, piece in enumerate(pieces)
            ]
        )
        with conn.cursor() as cursor:
            cursor.execute(composed)

    def affected_on(self, cursor: psycopg.Cursor[Any], /, **params: object) -> int:
        """`affected` on a kept cursor (chunk hot path: psycopg's adapter cache stays warm)."""
        cursor.execute(self._positional, self._values("affected", params), prepare=self._prepare)
        return cursor.rowcount

    def _run(
        self, conn: Connection, mode: Mode, params: Mapping[str, object]
    ) -> psycopg.Cursor[dict[str, Any]]:
        values = self._values(mode, params)
        cursor = psycopg.RawCursor(conn, row_factory=self._dict_rows)
        try:
            cursor.execute(self._numbered, values, prepare=self._prepare)
        except BaseException:
            cursor.close()
            raise
        return cursor

    def _dict_rows(self, cursor: psycopg.Cursor[Any]) -> RowMaker[dict[str, Any]]:
        """Rows as dicts like psycopg's `dict_row`, their names decoded once, not per result.

        A statement's text is fixed and lists its columns (tests/contract/test_select_lists.py),
        so every result of it has the same names: decoding them again for each result cost a wide
        row (a partition's claim returns the partition and its worker step) more than building
        the row itself. The count is checked each time.
        """
        result = cursor.pgresult
        if result is None or not result.nfields:
            return no_result
        names = self._names
        if len(names) != result.nfields:
            names = tuple(column.name for column in cursor.description or ())
            self._names = names
        return lambda values: dict(zip(names, values, strict=False))

    def _values(self, mode: Mode, params: Mapping[str, object]) -> list[object]:
        """The positional values to bind, after refusing a wrong mode or parameter set."""
        if mode != self.mode:
            raise StatementModeMismatch(
                f"{self.name} is declared :{self.mode}; run it with .{self.mode}(), not .{mode}()"
            )
        self._check_names("parameters", params)
        return [params[name] for name in self._order]

    def _check_names(self, kind: str, given: Mapping[str, object]) -> None:
        if given.keys() != self.parameters:
            missing = sorted(self.parameters - given.keys())
            unknown = sorted(given.keys() - self.parameters)
            raise TypeError(f"{self.name}: missing {kind} {missing}, unknown {unknown}")


_NAMED_OR_ESCAPED = re.compile(rb"%%|%\((\w+)\)s")


def _positional_form(query: bytes) -> tuple[bytes, tuple[str, ...]]:
    """`query` with each `%(name)s` as `%s`, and the names in order (`%%` is kept)."""
    names = tuple(name.decode() for name in _NAMED_OR_ESCAPED.findall(query) if name)
    return _NAMED_OR_ESCAPED.sub(lambda m: m[0] if m[1] is None else b"%s", query), names


def _numbered_form(positional: bytes) -> bytes:
    """`positional` with its k-th `%s` as `$k` and `%%` as `%` (PostgreSQL's own placeholders)."""
    numbers = itertools.count(1)
    return re.sub(
        rb"%%|%s", lambda m: b"%" if m[0] == b"%%" else b"$%d" % next(numbers), positional
    )


class Statements:
    """Every statement of one folder, as attributes named like the statements."""

    def __init__(self, statements: Mapping[str, Statement]) -> None:
        self._by_name = dict(statements)

    def __getattr__(self, name: str) -> Statement:
        try:
            return self._by_name[name]
        except KeyError:
            raise AttributeError(name) from None

    def __iter__(self) -> Iterator[Statement]:
        return iter(self._by_name.values())


def load_pugsql_module(folder: str | Path = "") -> Any:
    """The raw pugsql module of a folder of `queries/` (the shipped statements by default)."""
    return pugsql.module(str(queries_dir() / folder))


@functools.cache
def load_statements(folder: str | Path = "") -> Statements:
    """Every statement of a folder of `.sql` files, compiled once per process.

    By default the product's `queries/`; `"demo"` and `"testing"` are the demo main job's and
    pybatch.testing's own, kept out of the product's. An absolute path is any folder.
    """
    # pugsql's private `Module._statements` and `Statement._text`, pinned by tests/sql.
    statements: Mapping[str, Any] = load_pugsql_module(folder)._statements
    return Statements({name: Statement(source) for name, source in statements.items()})
