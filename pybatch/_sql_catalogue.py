"""The SQL catalogue for DBAs, generated from the same `queries/` files pybatch runs."""

from __future__ import annotations

import datetime as _dt
import itertools
import re
from collections.abc import Iterable, Mapping
from typing import Any

import attrs
import psycopg

from pybatch import _sqlstate
from pybatch._config import ConnectionConfig
from pybatch._connect import open_connection
from pybatch._statements import Statement, load_statements
from pybatch.errors import UnknownStatement

_TABLE = re.compile(r"\bpybatch\.([a-z_]+)\b")
_WRITE = re.compile(r"^\s*(INSERT\s+INTO|UPDATE|DELETE\s+FROM)\s+pybatch\.([a-z_]+)", re.I | re.M)
# The one keyword pybatch adds to a statement's text: plan only, never ANALYZE (never run).
_EXPLAIN_PREFIX = b"EXPLAIN (VERBOSE, COSTS)\n"

_INSTANT = _dt.datetime(2026, 1, 1, tzinfo=_dt.UTC).isoformat()
_SHA256 = "\\x" + "00" * 32  # the sha256_digest domain's size
#: Representative values by name; others go as the untyped '1', typed by the server.
_REPRESENTATIVE: Mapping[str, object] = {
    **dict.fromkeys(("limit", "row_limit"), "50"),
    **dict.fromkeys(("ceiling", "before_id"), str(2**62)),
    **dict.fromkeys(("status", "prior_status"), "STARTED"),
    **dict.fromkeys(("cutoff", "now"), _INSTANT),
    **{"before_attempt": "2147483647", "after_name": "", "job_name": "job_0001", "ids": (1, 2)},
    **{"result_status": "STOPPING", "action": "STOP", "authorization_class": "LIFECYCLE"},
    "outcome_class": "APPLIED",
    # A jsonb[] of one identifying-parameter fragment, as the explorer's filter sends it.
    "parameter_documents": '{"{\\"business_date\\": {\\"value\\": \\"2026-11-30\\"}}"}',
}
#: Then by suffix. State payloads are jsonb objects: on step_execution a domain refuses anything
#: else, and the planner checks a domain against a constant it can fold.
_BY_SUFFIX = (("_at", _INSTANT), ("_payload", "{}"), ("checksum", _SHA256), ("digest", _SHA256))


@attrs.frozen
class StatementEntry:
    """One catalogue row."""

    name: str
    file: str
    doc: str
    mode: str
    parameters: tuple[str, ...]
    tables_read: tuple[str, ...]
    tables_written: tuple[str, ...]
    text: str

    def as_json(self) -> dict[str, Any]:
        """The documented JSON object of `pybatch sql list --json`."""
        fields = attrs.asdict(self, filter=lambda field, _: field.name != "text")
        return {name: list(v) if isinstance(v, tuple) else v for name, v in fields.items()}


def _entry(statement: Statement) -> StatementEntry:
    text = statement.query.decode()
    # pugsql keeps the first `:doc` line; the comment lines that continue it lead the text.
    continued = itertools.takewhile(lambda line: line.startswith("--"), text.splitlines()[1:])
    doc_lines = [statement.doc, *(line[2:] for line in continued)]
    touched = sorted(set(_TABLE.findall(text)))
    written = sorted({match[1] for match in _WRITE.findall(text)})
    return StatementEntry(
        name=statement.name,
        file=statement.filename,
        doc=" ".join(" ".join(doc_lines).split()),
        mode=statement.mode,
        parameters=tuple(sorted(statement.parameters)),
        tables_read=tuple(t for t in touched if t not in written),
        tables_written=tuple(written),
        text=text,
    )


def catalogue() -> list[StatementEntry]:
    """Every statement, ordered by file and then by name."""
    return sorted(map(_entry, load_statements()), key=lambda e: (e.file, e.name))


def find(name: str) -> StatementEntry:
    """The catalogue entry of `name` (raises UnknownStatement)."""
    for entry in catalogue():
        if entry.name == name:
            return entry
    raise UnknownStatement(name=name)


def representative_parameters(entry: StatementEntry) -> dict[str, object]:
    """Values to plan `entry` with; untyped literals so the server infers each type."""
    return {
        name: _REPRESENTATIVE[name]
        if name in _REPRESENTATIVE
        else next((value for end, value in _BY_SUFFIX if name.endswith(end)), "1")
        for name in entry.parameters
    }


def explain(config: ConnectionConfig, entry: StatementEntry, params: Mapping[str, object]) -> str:
    """The server's plan of `entry` with `params`: EXPLAIN without ANALYZE, rolled back."""
    with open_connection(config, autocommit=False) as conn:
        try:
            rows = conn.execute(_EXPLAIN_PREFIX + entry.text.encode(), params).fetchall()
        except psycopg.Error as error:
            raise _sqlstate.translate(error) from None
        finally:
            if not conn.closed:
                conn.rollback()
    return "\n".join(str(row[0]) for row in rows)


def _cell(values: Iterable[str]) -> str:
    return ", ".join(f"`{v}`" for v in values) or "-"


def render_markdown() -> str:
    """docs/sql-catalogue.md: one section per file, one row per statement."""
    out = [
        "# SQL catalogue",
        "",
        "Every statement pybatch runs, generated from `queries/` by `pybatch sql catalogue`",
        "(a test fails when this file is stale). `pybatch sql show NAME` prints a statement",
        "exactly as it runs; `pybatch sql explain NAME` prints its plan on your server.",
        "",
        "Columns: the result mode (`one` row, `many` rows, a `scalar`, or the `affected` row",
        "count), the bound parameters, and the tables the statement reads and writes.",
    ]
    for file, group in itertools.groupby(catalogue(), key=lambda entry: entry.file):
        out += ["", f"## {file}", "", "| Statement | Mode | Parameters | Reads | Writes | Doc |"]
        out += ["|---|---|---|---|---|---|"]
        for entry in group:
            doc = entry.doc.replace("|", "\\|")
            out.append(
                f"| `{entry.name}` | {entry.mode} | {_cell(entry.parameters)} | "
                f"{_cell(entry.tables_read)} | {_cell(entry.tables_written)} | {doc} |"
            )
    return "\n".join(out) + "\n"
