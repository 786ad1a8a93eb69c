"""A text description of the ``pybatch`` schema's catalogue, for migration replay tests.

``describe_catalogue(conn)`` lists the domains, tables, columns, named constraints and indexes
of schema ``pybatch`` as sorted, line-oriented text. A test replays every migration into an
empty database and compares the result with ``reference_catalogue.txt`` (procrastinate's
schema-diff approach, without ``pg_dump``, which the npm server bundles lack).

Format, one fact per line, domains first, then grouped per table (both in name order)::

    domain <domain> <base type> [collate <collation>] <null|not null> [default <expression>]
      constraint <name> <pg_get_constraintdef>
    table <table>
      column <position> <name> <type> [collate <collation>] <null|not null>
          [identity <always|by default>] [default <expression>]
      constraint <name> <kind> <pg_get_constraintdef>
      index <name> <pg_get_indexdef>
      trigger <name> <pg_get_triggerdef>
    function <name>(<arguments>) returns <result> security <definer|invoker> body md5 <md5>
      [set <setting>=<value>; ...] (the settings the function runs with, in catalog order)

Columns are in their ordinal position; constraints and indexes are sorted by name. NOT NULL
constraints (catalogued in ``pg_constraint`` from PostgreSQL 18 on) are left out, because the
column lines already carry nullability; that keeps one reference valid on PostgreSQL 13 to 18.

Regenerate the reference after changing a migration with::

    python -m tests.migrations.catalogue "<conninfo of a freshly migrated database>"
"""

from __future__ import annotations

import sys
from pathlib import Path

import psycopg

SCHEMA = "pybatch"

REFERENCE_PATH = Path(__file__).with_name("reference_catalogue.txt")

_CONSTRAINT_KINDS = {
    "c": "check",
    "f": "foreign key",
    "p": "primary key",
    "u": "unique",
    "t": "trigger",
    "x": "exclusion",
}

_TABLES_SQL = """
SELECT c.relname
FROM pg_catalog.pg_class AS c
INNER JOIN pg_catalog.pg_namespace AS n ON c.relnamespace = n.oid
WHERE n.nspname = %(schema)s AND c.relkind IN ('r', 'p')
ORDER BY c.relname COLLATE "C"
"""

_COLUMNS_SQL = """
SELECT
    c.relname,
    a.attnum,
    a.attname,
    pg_catalog.format_type(a.atttypid, a.atttypmod) AS type,
    CASE
        WHEN a.attcollation <> 0 AND a.attcollation <> t.typcollation THEN co.collname
    END AS collation,
    a.attnotnull,
    a.attidentity,
    pg_catalog.pg_get_expr(d.adbin, d.adrelid) AS default_expr
FROM pg_catalog.pg_attribute AS a
INNER JOIN pg_catalog.pg_class AS c ON a.attrelid = c.oid
INNER JOIN pg_catalog.pg_namespace AS n ON c.relnamespace = n.oid
INNER JOIN pg_catalog.pg_type AS t ON a.atttypid = t.oid
LEFT JOIN pg_catalog.pg_collation AS co ON a.attcollation = co.oid
LEFT JOIN pg_catalog.pg_attrdef AS d ON a.attrelid = d.adrelid AND a.attnum = d.adnum
WHERE
    n.nspname = %(schema)s
    AND c.relkind IN ('r', 'p')
    AND a.attnum > 0
    AND NOT a.attisdropped
ORDER BY c.relname COLLATE "C", a.attnum
"""

_CONSTRAINTS_SQL = """
SELECT
    c.relname,
    k.conname,
    k.contype,
    pg_catalog.pg_get_constraintdef(k.oid, true) AS definition
FROM pg_catalog.pg_constraint AS k
INNER JOIN pg_catalog.pg_class AS c ON k.conrelid = c.oid
INNER JOIN pg_catalog.pg_namespace AS n ON c.relnamespace = n.oid
WHERE n.nspname = %(schema)s AND k.contype <> 'n'
ORDER BY c.relname COLLATE "C", k.conname COLLATE "C"
"""

_DOMAINS_SQL = """
SELECT
    t.typname,
    pg_catalog.format_type(t.typbasetype, t.typtypmod) AS base_type,
    CASE
        WHEN t.typcollation <> 0 AND t.typcollation <> b.typcollation THEN co.collname
    END AS collation,
    t.typnotnull,
    t.typdefault
FROM pg_catalog.pg_type AS t
INNER JOIN pg_catalog.pg_namespace AS n ON t.typnamespace = n.oid
INNER JOIN pg_catalog.pg_type AS b ON t.typbasetype = b.oid
LEFT JOIN pg_catalog.pg_collation AS co ON t.typcollation = co.oid
WHERE n.nspname = %(schema)s AND t.typtype = 'd'
ORDER BY t.typname COLLATE "C"
"""

_DOMAIN_CONSTRAINTS_SQL = """
SELECT t.typname, k.conname, pg_catalog.pg_get_constraintdef(k.oid, true) AS definition
FROM pg_catalog.pg_constraint AS k
INNER JOIN pg_catalog.pg_type AS t ON k.contypid = t.oid
INNER JOIN pg_catalog.pg_namespace AS n ON t.typnamespace = n.oid
WHERE n.nspname = %(schema)s AND k.contype = 'c'
ORDER BY t.typname COLLATE "C", k.conname COLLATE "C"
"""

_INDEXES_SQL = """
SELECT
    t.relname AS table_name,
    i.relname AS index_name,
    pg_catalog.pg_get_indexdef(i.oid) AS definition
FROM pg_catalog.pg_index AS x
INNER JOIN pg_catalog.pg_class AS i ON x.indexrelid = i.oid
INNER JOIN pg_catalog.pg_class AS t ON x.indrelid = t.oid
INNER JOIN pg_catalog.pg_namespace AS n ON t.relnamespace = n.oid
WHERE n.nspname = %(schema)s
ORDER BY t.relname COLLATE "C", i.relname COLLATE "C"
"""

_TRIGGERS_SQL = """
SELECT c.relname, g.tgname, pg_catalog.pg_get_triggerdef(g.oid) AS definition
FROM pg_catalog.pg_trigger AS g
INNER JOIN pg_catalog.pg_class AS c ON g.tgrelid = c.oid
INNER JOIN pg_catalog.pg_namespace AS n ON c.relnamespace = n.oid
WHERE n.nspname = %(schema)s AND NOT g.tgisinternal
ORDER BY c.relname COLLATE "C", g.tgname COLLATE "C"
"""

_FUNCTIONS_SQL = """
SELECT
    p.proname,
    pg_catalog.pg_get_function_identity_arguments(p.oid) AS arguments,
    pg_catalog.pg_get_function_result(p.oid) AS result,
    p.prosecdef,
    pg_catalog.md5(p.prosrc) AS body_md5,
    pg_catalog.ARRAY_TO_STRING(p.proconfig, '; ') AS settings
FROM pg_catalog.pg_proc AS p
INNER JOIN pg_catalog.pg_namespace AS n ON p.pronamespace = n.oid
WHERE n.nspname = %(schema)s
ORDER BY p.proname COLLATE "C", 2
"""

_IDENTITY = {"a": "always", "d": "by default"}


def describe_catalogue(conn: psycopg.Connection, schema: str = SCHEMA) -> str:
    """Describe the domains, tables, columns, constraints, indexes, triggers and functions.

    Reads only the system catalogues, so it works in any transaction state that allows a
    query; it neither commits nor rolls back.
    """
    params = {"schema": schema}
    domains: dict[str, list[str]] = {}
    tables: dict[str, list[str]] = {}
    with conn.cursor() as cur:
        for name, base_type, collation, notnull, default in cur.execute(
            _DOMAINS_SQL, params
        ).fetchall():
            parts = [f"domain {name} {base_type}"]
            if collation is not None:
                parts.append(f'collate "{collation}"')
            parts.append("not null" if notnull else "null")
            if default is not None:
                parts.append(f"default {default}")
            domains[name] = [" ".join(parts)]
        for domain, name, definition in cur.execute(_DOMAIN_CONSTRAINTS_SQL, params).fetchall():
            domains[domain].append(f"  constraint {name} {definition}")
        for (table,) in cur.execute(_TABLES_SQL, params).fetchall():
            tables[table] = []
        for table, position, name, type_, collation, notnull, identity, default in cur.execute(
            _COLUMNS_SQL, params
        ).fetchall():
            parts = [f"  column {position} {name} {type_}"]
            if collation is not None:
                parts.append(f'collate "{collation}"')
            parts.append("not null" if notnull else "null")
            if identity:
                parts.append(f"identity {_IDENTITY.get(identity, identity)}")
            if default is not None:
                parts.append(f"default {default}")
            tables[table].append(" ".join(parts))
        for table, name, kind, definition in cur.execute(_CONSTRAINTS_SQL, params).fetchall():
            tables[table].append(
                f"  constraint {name} {_CONSTRAINT_KINDS.get(kind, kind)} {definition}"
            )
        for table, name, definition in cur.execute(_INDEXES_SQL, params).fetchall():
            tables[table].append(f"  index {name} {definition}")
        for table, name, definition in cur.execute(_TRIGGERS_SQL, params).fetchall():
            tables[table].append(f"  trigger {name} {definition}")
        functions = [
            f"function {name}({arguments}) returns {result}"
            f" {'security definer' if definer else 'security invoker'} body md5 {body}"
            + (f" set {settings}" if settings else "")
            for name, arguments, result, definer, body, settings in cur.execute(
                _FUNCTIONS_SQL, params
            ).fetchall()
        ]
    lines: list[str] = []
    for domain in sorted(domains, key=lambda d: d.encode("utf-8")):
        lines.extend(domains[domain])
    for table in sorted(tables, key=lambda t: t.encode("utf-8")):
        lines.append(f"table {table}")
        lines.extend(tables[table])
    lines.extend(functions)
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Print the catalogue of a migrated database (conninfo as the only argument)."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m tests.migrations.catalogue CONNINFO", file=sys.stderr)
        return 2
    with psycopg.connect(args[0]) as conn:
        sys.stdout.write(describe_catalogue(conn))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
